"""``--resume`` under other settings than the checkpoint's: one line naming each key that differs, except the
keys a run is extended with; ``run.resume_overrides=allow`` continues the state under the new settings and the
run keeps the history. And a ``--resume`` path that is wrong: one line naming the part that is wrong."""

from __future__ import annotations

import json

import pytest
import torch

from ebpo.cli import main
from ebpo.errors import ConfigError
from ebpo.settings import read_yaml
from ebpo.trainer import resume
from ebpo.trainer.config_files import load_config
from ebpo.trainer.trainer import Trainer
from helpers.trainer import tiny_overrides

ISSUE_COMMAND = [
    "algorithm.ebpo.tau2=latent",
    "algorithm.ebpo.prior_scope=cluster",
    "data.cluster_key=topic",
]


@pytest.fixture
def run(tiny_model_dir, tmp_path, monkeypatch):
    """A 2-step run with the defaults (and the tiny model's settings) in ``tmp_path/run``, the working
    directory ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--run-dir", "run", *tiny_overrides(tiny_model_dir), "run.steps=2"]) == 0
    return tmp_path / "run"


def _err_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    (line,) = [line for line in err.splitlines() if line.startswith("ebpo train")]
    return line


def test_a_resume_under_other_settings_is_one_line_and_touches_nothing(run, capsys):
    config, metrics = (run / "config.yaml").read_bytes(), (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert main(["train", "--resume", "run/checkpoints/last", "run.steps=3", *ISSUE_COMMAND]) == 2
    assert _err_line(capsys) == (
        "ebpo train: error: --resume run/checkpoints/last: the checkpoint was trained with other settings "
        '(data.cluster_key: saved "none", requested "topic"; algorithm.ebpo.prior_scope: saved "global", '
        'requested "cluster"; algorithm.ebpo.tau2: saved "raw", requested "latent"); drop those overrides to '
        "continue it as it was, or add run.resume_overrides=allow to continue its state under the new settings "
        "(recorded in the run's config_history.jsonl)"
    )
    assert (run / "config.yaml").read_bytes() == config and (run / "metrics.jsonl").read_bytes() == metrics
    assert not (run / resume.HISTORY).exists() and not (run / ".lock").exists()
    # the Python API compares the same way
    cfg = load_config(None, ISSUE_COMMAND, base=read_yaml(run / "config.yaml"))
    with pytest.raises(ConfigError, match=r"algorithm\.ebpo\.tau2: saved \"raw\", requested \"latent\""):
        Trainer(cfg, resume=run)


def test_the_keys_a_run_is_extended_with_change_without_a_word_and_are_recorded(run, capsys):
    extending = [
        "run.steps=3",
        "run.eval_every=1",
        "run.save_every=1",
        "run.report_to=[]",
        "run.step_kl=none",
    ]
    assert main(["train", "--resume", "run", *extending]) == 0
    (entry,) = resume.history(run)
    assert entry["step"] == 2 and entry["checkpoint"] == "run/checkpoints/last" and not entry["allowed"]
    assert entry["changed"] == {
        "run.steps": [2, 3],
        "run.eval_every": [0, 1],
        "run.save_every": [2, 1],
        "run.step_kl": ["subset", "none"],
        "run.report_to": [["tensorboard"], []],
    }
    assert read_yaml(run / "config.yaml")["run"]["steps"] == 3
    assert main(["train", "--resume", "run"]) == 0  # the same settings again: nothing to record
    assert len(resume.history(run)) == 1


def test_allow_continues_the_state_under_the_new_settings_and_the_config_keeps_the_history(run):
    assert (
        main(["train", "--resume", "run", "run.steps=3", *ISSUE_COMMAND, "run.resume_overrides=allow"]) == 0
    )
    (entry,) = resume.history(run)
    assert entry["allowed"] and entry["step"] == 2
    assert entry["changed"] == {
        "data.cluster_key": ["none", "topic"],
        "algorithm.ebpo.prior_scope": ["global", "cluster"],
        "algorithm.ebpo.tau2": ["raw", "latent"],
        "run.steps": [2, 3],
    }
    text = (run / "config.yaml").read_text()
    saved = read_yaml(run / "config.yaml")
    assert saved["algorithm"]["ebpo"]["tau2"] == "latent" and saved["data"]["cluster_key"] == "topic"
    assert saved["run"]["resume_overrides"] == "refuse"  # an allow holds for the resume that gave it
    assert text.endswith(  # the keys sorted, as config_history.jsonl holds them
        "# config changes on resume (from config_history.jsonl):\n# step 2 (resumed from run/checkpoints/last): "
        'algorithm.ebpo.prior_scope "global" -> "cluster", algorithm.ebpo.tau2 "raw" -> "latent", '
        'data.cluster_key "none" -> "topic", run.steps 2 -> 3\n'
    )
    state = torch.load(run / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)
    assert state["config"]["algorithm"]["ebpo"]["tau2"] == "latent"
    # the prior went on from the checkpoint's: 3 steps x 2 prompts x G = 4 rewards (a fresh one: 8)
    assert state["estimator"]["prior"]["W_glob"]["count"] == 24
    assert state["estimator"]["options"]["prior_scope"] == "cluster"
    # the run now resumes under its new settings without a word, and back to the old ones only with allow
    assert main(["train", "--resume", "run", "run.steps=4"]) == 0
    assert main(["train", "--resume", "run", "run.steps=5", "algorithm.ebpo.tau2=raw"]) == 2
    assert [e["step"] for e in resume.history(run)] == [2, 3]


def test_allow_puts_the_new_optimizer_settings_over_the_saved_moments(run):
    saved = torch.load(run / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)["optimizer"]
    base = read_yaml(run / "config.yaml")
    cfg = load_config(
        None, ["optim.lr=0.02", "optim.weight_decay=0.1", "run.resume_overrides=allow"], base=base
    )
    trainer = Trainer(cfg, resume=run)
    (group,) = trainer.optimizer.param_groups
    assert (group["lr"], group["initial_lr"], group["weight_decay"]) == (0.02, 0.02, 0.1)
    assert trainer.scheduler.base_lrs == [0.02] and trainer.scheduler.get_last_lr() == [0.02]
    moments = trainer.optimizer.state_dict()["state"]
    assert all(torch.equal(moments[i]["exp_avg"], saved["state"][i]["exp_avg"]) for i in saved["state"])
    trainer.run.release()


def test_allow_with_a_change_the_saved_state_cannot_carry_is_one_line(run, capsys):
    capsys.readouterr()
    assert main(["train", "--resume", "run", "data.batch_size=4", "run.resume_overrides=allow"]) == 2
    line = _err_line(capsys)
    assert line.startswith(
        "ebpo train: error: --resume run/checkpoints/last: the sampler's saved state does not carry over to the "
        "new settings (data.batch_size): random sampler: checkpoint has batch_size=2 but this sampler has "
        "batch_size=4"
    ), line
    assert not (run / resume.HISTORY).exists()


def test_a_checkpoint_without_its_config_is_compared_with_the_runs_config_yaml(run, capsys):
    # ebpo 0.1.0's trainer state holds no config: the run's config.yaml stands for it
    path = run / "checkpoints" / "last" / "trainer_state.pt"
    state = torch.load(path, weights_only=True)
    del state["config"]
    assert resume.saved_config(state, run / "checkpoints" / "last") == read_yaml(run / "config.yaml")
    cfg = load_config(None, ["algorithm.ebpo.sigma2=pooled"], base=read_yaml(run / "config.yaml"))
    assert resume.changed_settings(read_yaml(run / "config.yaml"), cfg) == {
        "algorithm.ebpo.sigma2": ("total", "pooled")
    }
    # an earlier spelling in a saved config is the key it now spells
    old = json.loads(json.dumps(read_yaml(run / "config.yaml")))
    old["algorithm"]["estimator_options"] = old["algorithm"].pop("ebpo")
    assert resume.changed_settings(old, cfg) == {"algorithm.ebpo.sigma2": ("total", "pooled")}


# ---------------------------------------------------------------------------------------------------
# a wrong --resume path


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("does/not/exist", "does/not/exist does not exist (there is no does/)"),
        (
            "runs/20261201-213220-ebp",
            "runs/20261201-213220-ebp does not exist (did you mean runs/20261201-213220-ebpo?)",
        ),
        (
            "runs/20261201-213220-ebpo/checkpoints/lsat",
            "runs/20261201-213220-ebpo/checkpoints/lsat does not exist "
            "(did you mean runs/20261201-213220-ebpo/checkpoints/last?)",
        ),
        (
            "runs",
            "runs is neither a run directory nor a checkpoint; run directories in it: runs/20261201-213220-ebpo",
        ),
        (
            "runs/20261201-213220-ebpo/checkpoints/last/model",
            "runs/20261201-213220-ebpo/checkpoints/last/model is neither a run directory nor a checkpoint",
        ),
    ],
    ids=["missing", "typo", "typo-in-checkpoint", "parent-of-runs", "inside-a-checkpoint"],
)
def test_a_wrong_resume_path_names_what_is_wrong_and_what_was_expected(run, capsys, given, problem):
    (run.parent / "runs").mkdir()
    run.rename(run.parent / "runs" / "20261201-213220-ebpo")
    capsys.readouterr()
    assert main(["train", "--resume", given]) == 2
    assert _err_line(capsys) == (
        f"ebpo train: error: --resume {given}: {problem}; expected a run directory (config.yaml and "
        "checkpoints/last/trainer_state.pt inside) or one checkpoint of it (<run>/checkpoints/<name>, e.g. "
        "<run>/checkpoints/best)"
    )
    assert not (run.parent / "does").exists()
