"""``ebpo.plugins``: a user's code (a lone ``.py`` file, a module, an installed package's ``ebpo.plugins`` entry
point, ``$EBPO_PLUGINS``) imported once by the one loader every command calls; a plugin that fails is one line
naming it, the line of its code and the error, and no command runs."""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ebpo
from ebpo.cli import SUBCOMMANDS, main
from ebpo.plugins import ENV_VAR, PluginError, load_plugins
from ebpo.rewards import list_rewards
from ebpo.testing import EstimatorCheckFailed, check_estimator
from helpers.plugins import FILE_ESTIMATOR, MY_ESTIMATORS, PKG_ESTIMATOR, STATEFUL_ESTIMATOR

pytestmark = pytest.mark.usefixtures("plugin_sandbox")


def test_a_file_plugin_is_imported_once_and_named_by_its_absolute_path(tmp_path, monkeypatch):
    shutil.copy(MY_ESTIMATORS, tmp_path / "my_estimators.py")
    monkeypatch.chdir(tmp_path)
    assert FILE_ESTIMATOR not in ebpo.list_estimators()
    assert load_plugins(["my_estimators.py"]) == [str(tmp_path / "my_estimators.py")]
    assert {FILE_ESTIMATOR, STATEFUL_ESTIMATOR} <= set(ebpo.list_estimators())
    # named again (relative, absolute, comma-separated with itself): imported once, no "already registered"
    assert load_plugins([str(tmp_path / "my_estimators.py"), "my_estimators.py,my_estimators.py"]) == [
        str(tmp_path / "my_estimators.py")
    ]
    assert sys.modules["my_estimators"].__file__ == str(tmp_path / "my_estimators.py")  # pickles by name


def test_the_fixture_estimators_keep_the_contract(tmp_path):
    # the example of docs/extending.md (median_baseline) and its stateful sibling, as an author would check them
    load_plugins([str(MY_ESTIMATORS)])
    assert check_estimator(FILE_ESTIMATOR, q=0.25).ok
    assert check_estimator(STATEFUL_ESTIMATOR).ok
    with pytest.raises(ValueError, match=r"median_baseline: q must be in \[0, 1\], got 2"):
        ebpo.get_estimator(FILE_ESTIMATOR, q=2)


def test_an_installed_package_is_found_by_its_entry_point(plugin_pkg_dir, monkeypatch):
    load_plugins()  # nothing of the package's: it is not installed here
    assert PKG_ESTIMATOR not in ebpo.list_estimators()
    monkeypatch.syspath_prepend(str(plugin_pkg_dir))  # what PYTHONPATH or a pip install does
    assert load_plugins() == []
    assert PKG_ESTIMATOR in ebpo.list_estimators() and "answer_anywhere" in list_rewards()
    load_plugins()  # once per process
    assert check_estimator(PKG_ESTIMATOR, trim=1).ok


def test_the_example_of_docs_extending_is_the_fixture_and_its_check_is_what_the_page_prints():
    page = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    block = page.split("## A 20-line example")[1].split("```python\n")[1].split("```")[0]
    fixture = MY_ESTIMATORS.read_text()
    imports, body = block.split("\n\n\n", 1)
    assert body in fixture and set(imports.split()) <= set(fixture.split())
    assert len(block.strip().splitlines()) <= 25
    load_plugins([str(MY_ESTIMATORS)])
    module = sys.modules["my_estimators"]
    for printed in (check_estimator(FILE_ESTIMATOR), check_estimator(module.MedianBaseline, q=0.25)):
        assert f"\n{printed}\n" in page


def test_the_stateful_example_of_docs_extending_runs_and_passes_check_estimator():
    page = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    block = page.split("A stateful one,")[1].split("```python\n")[1].split("```")[0]
    assert block.split("\n\n\n", 1)[1] in MY_ESTIMATORS.read_text()  # the fixture holds the same class
    assert STATEFUL_ESTIMATOR not in ebpo.list_estimators()  # the sandbox: registered by nothing yet
    namespace: dict = {}
    exec(compile(block, "docs/extending.md", "exec"), namespace)  # the page's code, as printed
    example = namespace["RunningMeanBaseline"]
    assert check_estimator(example).ok
    # the same class with an observe that folds its rewards in unchecked: the property the page names fails
    unchecked = type("Unchecked", (example,), {"observe": _observe_unchecked})
    with pytest.raises(
        EstimatorCheckFailed, match=r"1 fail\nFAILED non_finite_refused .*observe accepted it"
    ):
        check_estimator(unchecked)


def _observe_unchecked(self, rewards, index, cluster=None):
    self._fold(torch.as_tensor(rewards, dtype=torch.float64))


def _dist_info(root, name: str, entry: str) -> None:
    """The metadata pip writes for an installed distribution ``name`` whose ``ebpo.plugins`` entry is ``entry``."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[ebpo.plugins]\n{name} = {entry}\n")


def test_an_entry_point_may_name_a_function_called_once(tmp_path, monkeypatch):
    (tmp_path / "fn_plugin.py").write_text(
        textwrap.dedent(
            """
            from ebpo.rewards import register_reward
            CALLS = []

            def register():
                CALLS.append(1)
                register_reward("fn_plugin_reward")(lambda: None)
            """
        )
    )
    _dist_info(tmp_path, "fn_plugin", "fn_plugin:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    load_plugins()
    load_plugins()
    assert "fn_plugin_reward" in list_rewards() and sys.modules["fn_plugin"].CALLS == [1]
    del sys.modules["fn_plugin"]


def test_plugins_named_in_the_environment_are_loaded_in_any_process(tmp_path, monkeypatch):
    (tmp_path / "env_pkg").mkdir()
    (tmp_path / "env_pkg" / "__init__.py").write_text(
        "from ebpo.rewards import register_reward\nregister_reward('env_reward')(lambda: None)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV_VAR, f"{MY_ESTIMATORS}:env_pkg")  # a file and a module name, os.pathsep apart
    load_plugins()
    assert FILE_ESTIMATOR in ebpo.list_estimators() and "env_reward" in list_rewards()
    del sys.modules["env_pkg"]


FAILING = {
    "bad.py": (
        "import ebpo\nx = 1\nundefined_name\n",
        r"NameError: name 'undefined_name' is not defined \({f}, line 3\)",
    ),
    "clash.py": (
        'import ebpo\n\n\n@ebpo.register_estimator("grpo")\nclass Mine(ebpo.AdvantageEstimator):\n    pass\n',
        r"advantage estimator 'grpo' is already registered \(by ebpo.advantages.baselines\); give yours another "
        r"name \({f}, line 4\)",
    ),
    "my-estimators.py": ("", r"'my-estimators' is not a module name; rename the file \(letters, digits, _\)"),
    "json.py": (
        "",
        r"a module named 'json' is already imported \(from .*json/__init__.py\); rename the file",
    ),
}


@pytest.mark.parametrize("name", [*FAILING, "missing.py", "no_such_module"])
def test_a_failing_plugin_is_one_line_naming_it_and_the_error(tmp_path, name):
    path = tmp_path / name
    if name in FAILING:
        path.write_text(FAILING[name][0])
        expected = FAILING[name][1].format(f=re.escape(str(path)))
    elif name == "missing.py":
        expected = "no such file"
    else:
        expected = r"ModuleNotFoundError: No module named 'no_such_module'"
    given = str(path) if name.endswith(".py") else name
    with pytest.raises(PluginError) as error:
        load_plugins([given])
    assert re.fullmatch(rf"plugin {re.escape(given)}: {expected}", str(error.value)), str(error.value)
    assert "clash" not in sys.modules and "bad" not in sys.modules  # a failed import leaves no module


@pytest.mark.parametrize(
    "command", [*(c for c in SUBCOMMANDS if c != "annotate"), "annotate difficulty", "annotate topic"]
)
def test_every_command_imports_its_plugins_first_and_stops_at_one_that_fails(tmp_path, capsys, command):
    bad = tmp_path / "bad.py"
    bad.write_text(FAILING["bad.py"][0])
    assert main([*command.split(), "--plugins", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ebpo {command}: error: plugin {bad}: NameError") and len(err.splitlines()) == 1


def test_every_command_lists_the_flag_in_its_help(capsys):
    for command in ("train", "diagnose", "annotate difficulty"):
        with pytest.raises(SystemExit):
            main([*command.split(), "--help"])
        assert "--plugins NAME" in capsys.readouterr().out


def test_run_plugins_are_imported_before_the_config_is_checked_and_kept_absolute(
    tmp_path, monkeypatch, capsys
):
    from ebpo.trainer import load_config
    from ebpo.trainer.setup import check_setup

    shutil.copy(MY_ESTIMATORS, tmp_path / "my_estimators.py")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["run.plugins=[my_estimators.py]", f"algorithm.estimator={FILE_ESTIMATOR}"])
    assert cfg.run.plugins == [str(tmp_path / "my_estimators.py")]  # a resume elsewhere finds it
    check_setup(cfg)  # the estimator's name is known
    (tmp_path / "bad.py").write_text(FAILING["bad.py"][0])
    (tmp_path / "cfg.yaml").write_text("run:\n  plugins: [bad.py]\n")
    assert main(["train", "--config", "cfg.yaml"]) == 2
    assert re.fullmatch(
        rf"ebpo train: error: plugin {re.escape(str(tmp_path / 'bad.py'))}: NameError: .* \(in cfg.yaml\)\n",
        capsys.readouterr().err,
    )


def test_ebpo_train_trains_a_file_plugins_estimator_and_a_resume_elsewhere_loads_it_again(
    tiny_model_dir, tmp_path, monkeypatch
):
    import torch

    from ebpo.settings import read_yaml
    from ebpo.trackers import read_metrics
    from helpers.plugins import sandbox
    from helpers.trainer import tiny_overrides

    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(MY_ESTIMATORS, work / "my_estimators.py")
    monkeypatch.chdir(work)
    overrides = [
        *tiny_overrides(tiny_model_dir),
        f"algorithm.estimator={STATEFUL_ESTIMATOR}",
        "run.save_every=1",
    ]
    with sandbox(tmp_path):  # afterwards this process knows the plugin no more than a new one would
        assert (
            main(["train", "--plugins", "my_estimators.py", "--run-dir", "run", *overrides, "run.steps=1"])
            == 0
        )
    run = work / "run"
    assert read_yaml(run / "config.yaml")["run"]["plugins"] == [str(work / "my_estimators.py")]
    saved = torch.load(run / "checkpoints" / "last" / "trainer_state.pt", weights_only=False)["estimator"]
    assert saved["count"] == 2 * 4  # its state is checkpointed: one step's 2 prompts x G = 4 rewards
    assert STATEFUL_ESTIMATOR not in ebpo.list_estimators()
    monkeypatch.chdir(tmp_path)  # another directory: the saved absolute path finds the file
    assert main(["train", "--resume", str(run), "run.steps=2"]) == 0
    rows = read_metrics(run)
    assert [row["step"] for row in rows if "running_mean/baseline" in row] == [1, 2]
    # the resumed step went on from the saved state: the running mean of every reward of both steps
    resumed = torch.load(run / "checkpoints" / "last" / "trainer_state.pt", weights_only=False)["estimator"]
    assert resumed["count"] == 16
    assert resumed["mean"] == pytest.approx(
        sum(row["reward/mean"] for row in rows if "reward/mean" in row) / 2
    )
