"""The package stands on its own: ``python -m build`` makes a wheel that, installed (not editable) into a fresh
virtual environment, finds its presets and base model, trains and evaluates from an empty directory; and a
plugin package installed beside it (``tests/fixtures/plugin_pkg``) reaches both commands by its entry point.

Nothing here reads the repository once the wheel and the plugin package are installed: the commands run with
the working directory, HOME and the ebpo cache in empty temporary folders, and the environment has no
``PYTHONPATH``. The fresh environment installs torch the way ``make`` does (``torch==$TORCH_VERSION``,
default 2.13.0, from ``$TORCH_INDEX`` when set), then the wheel and its dependencies from the package index
(pip's cache and configuration apply), and checks that the wheel kept that torch; so this test needs the index
but nothing else. It takes a few minutes, most of them pip installing torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ebpo
from ebpo.trainer.config_files import list_presets
from helpers.plugins import PKG_ESTIMATOR, install_plugin_pkg

REPO = Path(__file__).resolve().parents[1]
# the Makefile's TORCH_VERSION, which `make` exports: `make test TORCH_VERSION=2.15.0` tests the wheel on it
TORCH_VERSION = os.environ.get("TORCH_VERSION") or "2.13.0"


def _run(argv: list[str | Path], *, cwd: Path, env: dict[str, str], timeout: int = 600) -> str:
    """Run a command; its output is the failure message when it exits non-zero."""
    proc = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_trains_and_evaluates_from_an_empty_directory(tmp_path):
    # a user's shell: no PYTHONPATH or virtual environment of ours; bytecode may be written (the fresh
    # environment is installed with --no-compile, and `ebpo eval` then reuses what `ebpo train` compiled)
    unset = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
    base_env = {k: v for k, v in os.environ.items() if k not in unset}

    # 1. build: an sdist, then a wheel from the sdist (what `python -m build` does by default)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", dist, REPO], cwd=tmp_path, env=base_env)
    (wheel,) = dist.glob("ebpo-*.whl")
    assert wheel.name.startswith(f"ebpo-{ebpo.__version__}-py3-none-any")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"ebpo/configs/{name}.yaml" for name in list_presets()} <= names  # the presets
    for shipped in ("arith_base", "gym_base"):  # S1 and S2
        assert {f"ebpo/models/{shipped}/model.safetensors", f"ebpo/models/{shipped}/tokenizer.json"} <= names
    assert "ebpo/py.typed" in names and not any(
        n.startswith(("tests/", "benchmarks/", "docs/")) for n in names
    )

    # 2. a fresh virtual environment (no system site-packages), torch as `make` installs it, then the wheel
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path, env=base_env)
    python, ebpo_cmd = venv / "bin" / "python", venv / "bin" / "ebpo"
    index = os.environ.get("TORCH_INDEX") or ""
    pip = [python, "-m", "pip", "install", "-q", "--no-compile"]
    _run(
        [*pip, f"torch=={TORCH_VERSION}", *(["--index-url", index] if index else [])],
        cwd=tmp_path,
        env=base_env,
    )
    _run([*pip, wheel], cwd=tmp_path, env=base_env)
    torch_here = _run([python, "-c", "import torch; print(torch.__version__)"], cwd=tmp_path, env=base_env)
    assert torch_here.strip().split("+")[0] == TORCH_VERSION  # the wheel's requirements kept it
    # a user's plugin package, installed as users install one: its estimator and reward by entry point
    install_plugin_pkg(tmp_path / "plugin", python=python, env=base_env)

    # 3. from an empty directory, with an empty HOME and ebpo cache
    empty, home = tmp_path / "empty", tmp_path / "home"
    empty.mkdir()
    home.mkdir()
    env = {**base_env, "HOME": str(home), "EBPO_CACHE": str(tmp_path / "ebpo-cache"), "MPLBACKEND": "Agg"}
    assert _run([ebpo_cmd, "--version"], cwd=empty, env=env).strip() == f"ebpo {ebpo.__version__}"
    where = _run([python, "-c", "import ebpo; print(ebpo.__file__)"], cwd=empty, env=env).strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(REPO / "src")  # not editable
    preset = "from ebpo.trainer import load_config; print(load_config('grpo').algorithm.estimator)"
    assert _run([python, "-c", preset], cwd=empty, env=env).strip() == "grpo"  # a preset by name

    estimator = [f"algorithm.estimator={PKG_ESTIMATOR}", "algorithm.estimator_options.trim=1"]
    out = _run([ebpo_cmd, "train", "run.steps=2", *estimator], cwd=empty, env=env)
    run_dir = empty / out.splitlines()[0].removeprefix("run directory: ")
    assert run_dir.parent == empty / "runs" and run_dir.name.endswith(f"-{PKG_ESTIMATOR}")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 2 and 0 <= summary["eval_after"]["eval/pass@1"] <= 1
    assert (run_dir / "checkpoints" / "last").is_dir() and (run_dir / "training.png").is_file()

    arith = ["--benchmarks", "arith", "--limit", "2", "--quiet"]
    out = _run([ebpo_cmd, "eval", *arith, "--reward", "answer_anywhere"], cwd=empty, env=env)
    results = json.loads((empty / "eval_results" / "results.json").read_text())
    assert results["benchmarks"] == ["arith"] and results["settings"]["limit"] == 2
    assert results["settings"]["reward"] == "answer_anywhere"
    assert 0 <= results["results"]["builtin"]["arith"]["pass@1"] <= 1
    assert "| builtin |" in out
    assert sorted(p.name for p in empty.iterdir()) == ["eval_results", "runs"]  # nothing else written here
    # the shipped base model was used as it is: the cache holds eval's per-problem results and no built model
    assert sorted(p.name for p in (tmp_path / "ebpo-cache").iterdir()) == ["eval"]


def test_version_is_one_number_everywhere(capsys):
    """``ebpo --version``, ``ebpo.__version__`` and the installed distribution's metadata agree (pyproject
    takes the version from ``ebpo.__version__``)."""
    from importlib.metadata import version

    from ebpo.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"ebpo {ebpo.__version__}\n"
    assert version("ebpo") == ebpo.__version__
