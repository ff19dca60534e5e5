"""Hostile and unlucky users of ``ebpo train``: kills at any moment, reused run directories, torn files,
duplicate record ids, damaged checkpoints, and the reward's own counters in the metrics.

Each test stages one such event; the tiny random model and the dense digit-fraction reward of
``tests/trainer/test_trainer.py`` keep every run at a few tenths of a second.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence

import pytest
import torch

from ebpo import rewards
from ebpo.data.records import Record
from ebpo.errors import ConfigError
from ebpo.persist import DirectoryInUse, DirectoryLock
from ebpo.trackers import read_metrics
from ebpo.trainer import checkpoint as checkpoint_module
from ebpo.trainer import setup as trainer_setup
from ebpo.trainer.config_files import load_config
from ebpo.trainer.trainer import Trainer
from helpers.trainer import final_params, tiny_config, training_rows


class CountingReward:
    """Reward = 1 if the completion's first character is a digit, else 0; counts its calls and, as a stand-in
    for a verifier that timed out, the completions that start with a letter. ``metrics()`` returns the
    cumulative counters, as the rewards of ``ebpo.rewards`` do."""

    def __init__(self) -> None:
        self._counts = {"calls": 0, "timeouts": 0}

    def __call__(self, completion: str, answer: str) -> float:
        self._counts["calls"] += 1
        self._counts["timeouts"] += completion[:1].isalpha()
        return float(completion[:1].isdigit())

    def batch(self, completions: Sequence[str], answers: Sequence[str]) -> list[float]:
        return [self(c, a) for c, a in zip(completions, answers)]

    def metrics(self) -> dict[str, float]:
        return {f"reward/{name}": float(value) for name, value in self._counts.items()}


if "trainer_test_counting" not in rewards.list_rewards():
    rewards.register_reward("trainer_test_counting")(CountingReward)


class Killed(BaseException):
    """Stands in for SIGKILL: a BaseException, so no ``except Exception`` on the way can swallow it."""


# ---------------------------------------------------------------------------------------------------
# two prompts that share a record id are still two groups


def test_duplicate_record_ids_do_not_merge_groups(tiny_model_dir, tmp_path, monkeypatch):
    # Eight different prompts, all with id "dup". The loaders reject such files, so the records are handed
    # to the trainer directly: its group ids must not depend on them.
    records = [Record(id="dup", prompt=f"{i}+{i}=", answer=str(2 * i)) for i in range(8)]
    monkeypatch.setattr(trainer_setup, "load_records", lambda path, schema: list(records))
    train_file = tmp_path / "train.jsonl"
    train_file.write_text("")  # exists, so the config validates; its content comes from load_records above
    cfg = tiny_config(tiny_model_dir, f"data.train_file={train_file}", "data.batch_size=4", "run.steps=2")
    Trainer(cfg, run_dir=tmp_path / "run").train()
    for row in read_metrics(tmp_path / "run")[1:]:
        # 4 prompts x G = 4 per step: four baselines, not one over the 16 samples (`groups/num` 1)
        assert row["groups/num"] == 4


def test_duplicate_record_ids_with_dynamic_sampling(tiny_model_dir, tmp_path, monkeypatch):
    # dynamic sampling checks that every sampled group has its own id; duplicate record ids must not abort
    # the step
    records = [Record(id="dup", prompt=f"{i}*{i}=", answer=str(i * i)) for i in range(8)]
    monkeypatch.setattr(trainer_setup, "load_records", lambda path, schema: list(records))
    train_file = tmp_path / "train.jsonl"
    train_file.write_text("")
    cfg = tiny_config(
        tiny_model_dir,
        f"data.train_file={train_file}",
        "algorithm.dynamic_sampling=true",
        "algorithm.max_gen_rounds=1",
        "run.steps=1",
    )
    Trainer(cfg, run_dir=tmp_path / "run").train()
    (row,) = read_metrics(tmp_path / "run")[1:]
    assert row["dynamic/rounds"] >= 1


# ---------------------------------------------------------------------------------------------------
# a kill at any moment of a checkpoint save leaves a resumable run


def _kill_at(point: str, monkeypatch) -> None:
    """Make the next checkpoint save of ``checkpoints/last`` die at ``point``:

    - ``state_file``: while the new checkpoint's trainer state is written (the new copy is incomplete);
    - ``move_old``: before the complete old ``last`` is moved aside;
    - ``move_new``: after the old ``last`` is moved aside, before the new one takes its place;
    - ``remove_old``: after the swap, while the old copy is removed.
    """
    real_replace, real_rmtree = os.replace, shutil.rmtree

    def replace(src, dst):
        src, dst = os.fspath(src), os.fspath(dst)
        hit = {
            "state_file": dst.endswith(os.path.join(".last.tmp", "trainer_state.pt")),
            "move_old": src.endswith(os.path.join("checkpoints", "last")),
            "move_new": dst.endswith(os.path.join("checkpoints", "last")),
        }
        if hit.get(point):
            raise Killed(point)
        return real_replace(src, dst)

    def rmtree(path, *args, **kwargs):
        if point == "remove_old" and os.fspath(path).endswith(".last.old") and os.path.exists(path):
            raise Killed(point)
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.os, "replace", replace)
    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", rmtree)


@pytest.mark.parametrize(
    ("point", "resumes_at"), [("state_file", 2), ("move_old", 2), ("move_new", 4), ("remove_old", 4)]
)
def test_kill_during_a_checkpoint_save_leaves_a_resumable_run(
    tiny_model_dir, tmp_path, monkeypatch, point, resumes_at
):
    Trainer(tiny_config(tiny_model_dir, "run.steps=6"), run_dir=tmp_path / "straight").train()

    run = tmp_path / "killed"
    trainer = Trainer(tiny_config(tiny_model_dir, "run.steps=6"), run_dir=run)
    original_save = trainer.save_checkpoint

    def save(name="last", **kwargs):
        if trainer.step == 4 and name == "last":  # the second periodic checkpoint (save_every=2)
            with monkeypatch.context() as patch:
                _kill_at(point, patch)
                return original_save(name, **kwargs)
        return original_save(name, **kwargs)

    trainer.save_checkpoint = save
    with pytest.raises(Killed):
        trainer.train()

    if point == "move_new":  # no checkpoints/last: the complete new copy is moved into place
        with pytest.warns(RuntimeWarning, match=r"checkpoints/last: recovered the checkpoint from .last.tmp"):
            resumed = Trainer(tiny_config(tiny_model_dir, "run.steps=6"), resume=run)
    else:
        resumed = Trainer(tiny_config(tiny_model_dir, "run.steps=6"), resume=run)
    assert resumed.step == resumes_at
    resumed.train()
    assert (
        not (run / "checkpoints" / ".last.tmp").exists() and not (run / "checkpoints" / ".last.old").exists()
    )
    straight, killed = final_params(tmp_path / "straight"), final_params(run)
    for name in straight:  # the kill lost nothing but the steps since the last complete checkpoint
        assert torch.equal(straight[name], killed[name]), name
    assert training_rows(run) == training_rows(tmp_path / "straight")


# ---------------------------------------------------------------------------------------------------
# resuming a finished run keeps its summary


def test_resuming_a_finished_run_keeps_its_summary(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_model_dir, "run.steps=2", "run.plot=true"), run_dir=run).train()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_after"]["eval/pass@1"] >= 0

    result = Trainer(tiny_config(tiny_model_dir, "run.steps=2", "run.plot=true"), resume=run).train()
    assert json.loads((run / "summary.json").read_text()) == summary  # not "after nan"
    assert result.eval_after == summary["eval_after"] and result.step == 2

    # killed after the final checkpoint, before the summary and the plot were written: a resume writes them
    (run / "summary.json").unlink()
    (run / "training.png").unlink()
    Trainer(tiny_config(tiny_model_dir, "run.steps=2", "run.plot=true"), resume=run).train()
    assert json.loads((run / "summary.json").read_text()) == summary
    assert (run / "training.png").stat().st_size > 1000
    assert [row["step"] for row in read_metrics(run)] == [0, 1, 2]


# ---------------------------------------------------------------------------------------------------
# a fresh run into a run directory that holds a run is refused


def test_fresh_run_into_an_existing_run_directory_is_refused(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_model_dir, "run.steps=1"), run_dir=run).train()
    before = (run / "metrics.jsonl").read_text()

    with pytest.raises(
        ConfigError, match=rf"{re.escape(str(run))} .*metrics\.jsonl.*--resume.*--overwrite"
    ) as err:
        Trainer(tiny_config(tiny_model_dir, "run.steps=2"), run_dir=run)
    assert "\n" not in str(err.value)
    assert (run / "metrics.jsonl").read_text() == before  # nothing touched

    from ebpo.cli import main

    config = run / "config.yaml"
    assert main(["train", "--config", str(config), "--run-dir", str(run)]) == 2
    message = capsys.readouterr().err
    assert (
        message.startswith("ebpo train: error:") and "--overwrite" in message and "Traceback" not in message
    )

    Trainer(tiny_config(tiny_model_dir, "run.steps=2"), run_dir=run, overwrite=True).train()
    assert [row["step"] for row in read_metrics(run)] == [0, 1, 2]  # one history, not two


def test_resume_and_overwrite_do_not_mix(tiny_model_dir, tmp_path):
    Trainer(tiny_config(tiny_model_dir, "run.steps=2"), run_dir=tmp_path / "a").train()
    Trainer(tiny_config(tiny_model_dir, "run.steps=1"), run_dir=tmp_path / "b").train()
    with pytest.raises(ConfigError, match=rf"--resume and --overwrite .*{re.escape(str(tmp_path / 'a'))}"):
        Trainer(tiny_config(tiny_model_dir, "run.steps=3"), resume=tmp_path / "a", overwrite=True)
    # continuing run a in directory b, which holds another run: refused like a fresh run there
    with pytest.raises(ConfigError, match=rf"{re.escape(str(tmp_path / 'b'))} .*metrics\.jsonl"):
        Trainer(tiny_config(tiny_model_dir, "run.steps=3"), resume=tmp_path / "a", run_dir=tmp_path / "b")
    Trainer(
        tiny_config(tiny_model_dir, "run.steps=3"),
        resume=tmp_path / "a",
        run_dir=tmp_path / "b",
        overwrite=True,
    ).train()
    assert [row["step"] for row in read_metrics(tmp_path / "b")] == [3]  # b's old history is gone
    assert [row["step"] for row in read_metrics(tmp_path / "a")] == [0, 1, 2]  # a is untouched


def test_an_empty_or_unrelated_directory_is_fine(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    Trainer(tiny_config(tiny_model_dir, "run.steps=1"), run_dir=run).train()
    assert (run / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------------------------------------------
# one process per run directory


def _hold_lock_in_a_child(directory) -> subprocess.Popen[str]:
    """A child process that takes the directory's lock, says so, and sleeps (until killed)."""
    code = (
        "import sys, time; from ebpo.persist import DirectoryLock; "
        "lock = DirectoryLock(sys.argv[1], what='d', hint='h').acquire(); print('held', flush=True); time.sleep(120)"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(directory)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_second_process_in_a_running_run_directory_is_one_line(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(
        tiny_config(tiny_model_dir, "run.steps=1"), run_dir=run
    ).train()  # the lock is released at the end
    before = (run / "metrics.jsonl").read_text()
    child = _hold_lock_in_a_child(run)  # another process training in it
    try:
        for kwargs in ({"resume": run}, {"run_dir": run, "overwrite": True}):
            with pytest.raises(DirectoryInUse, match=rf"{re.escape(str(run))} .*pid {child.pid}\b"):
                Trainer(tiny_config(tiny_model_dir, "run.steps=2"), **kwargs)
        assert (run / "metrics.jsonl").read_text() == before  # --overwrite removed nothing

        from ebpo.cli import main

        assert main(["train", "--resume", str(run)]) == 2
        message = capsys.readouterr().err.strip()
        assert message.startswith("ebpo train: error: run directory") and "\n" not in message
        assert f"in use by pid {child.pid} " in message and "wait for that run to finish" in message
    finally:
        child.kill()
        child.wait()
    # killed holder: the kernel dropped its lock, nothing stale; the run continues
    Trainer(tiny_config(tiny_model_dir, "run.steps=2"), resume=run).train()
    assert [row["step"] for row in read_metrics(run)] == [0, 1, 2]


def test_a_failed_setup_releases_the_run_directory(tiny_model_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_model_dir, "run.steps=1"), run_dir=run).train()
    with pytest.raises(
        ConfigError, match=rf"{re.escape(str(run))} .*metrics\.jsonl"
    ):  # after the lock was taken
        Trainer(tiny_config(tiny_model_dir, "run.steps=2"), run_dir=run)
    trainer = Trainer(tiny_config(tiny_model_dir, "run.steps=2"), resume=run)  # so this one gets it
    with pytest.raises(DirectoryInUse):  # and holds it until train() ends
        DirectoryLock(run, what="run directory", hint="").acquire()
    trainer.train()
    assert not (run / DirectoryLock.FILE).exists()  # removed at the end: nothing left behind
    DirectoryLock(run, what="run directory", hint="").acquire().release()
    # a fresh run refused at setup (no such model) leaves no directory; a mistyped --resume no lock file
    with pytest.raises(ConfigError, match=rf"^model\.path: {re.escape(str(tmp_path / 'nowhere'))} "):
        Trainer(
            tiny_config(tiny_model_dir, "run.steps=1", f"model.path={tmp_path / 'nowhere'}"),
            run_dir=tmp_path / "new",
        )
    assert not (tmp_path / "new").exists()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError,
        match=rf"^--resume {re.escape(str(tmp_path / 'typo'))}: .*checkpoints/last/trainer_state\.pt",
    ):
        Trainer(tiny_config(tiny_model_dir, "run.steps=1"), resume=tmp_path / "typo")
    assert not (tmp_path / DirectoryLock.FILE).exists()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("run", "run"),
        ("run/checkpoints", "run"),
        ("run/checkpoints/last", "run"),
        ("run/checkpoints/best", "run"),
    ],
)
def test_run_dir_of_a_resume_path_matches_the_checkpoint_it_finds(tiny_model_dir, tmp_path, given, expected):
    Trainer(tiny_config(tiny_model_dir, "run.steps=1", "run.eval_every=1"), run_dir=tmp_path / "run").train()
    found = checkpoint_module.find_checkpoint(tmp_path / given)
    assert checkpoint_module.run_dir_of(tmp_path / given) == tmp_path / expected == found.parent.parent


# ---------------------------------------------------------------------------------------------------
# a torn last line of metrics.jsonl


def test_torn_last_metrics_line_is_dropped_with_a_warning_on_resume(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_model_dir, "run.steps=2"), run_dir=run).train()
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"step": 3, "reward/me')  # killed in the middle of a write
    with pytest.warns(RuntimeWarning, match=r"metrics.jsonl, line 4: dropped a torn last line"):
        Trainer(tiny_config(tiny_model_dir, "run.steps=3"), resume=run).train()
    assert [row["step"] for row in read_metrics(run)] == [0, 1, 2, 3]


def test_a_damaged_metrics_line_in_the_middle_is_reported(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_model_dir, "run.steps=2"), run_dir=run).train()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2:") as err:
        Trainer(tiny_config(tiny_model_dir, "run.steps=3"), resume=run)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------------
# a damaged checkpoint, and a config that skipped validation


def test_truncated_trainer_state_is_one_clear_line(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(tiny_config(tiny_model_dir, "run.steps=2"), run_dir=run).train()
    state = run / "checkpoints" / "last" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(state))} ") as err:
        Trainer(tiny_config(tiny_model_dir, "run.steps=3"), resume=run)
    assert "\n" not in str(err.value)

    from ebpo.cli import main

    assert main(["train", "--resume", str(run), "run.steps=3"]) == 2
    message = capsys.readouterr().err
    assert message.startswith("ebpo train: error:") and "damaged" in message and "Traceback" not in message


def test_trainer_validates_the_config_itself(tiny_model_dir, tmp_path):
    cfg = load_config(None, [f"model.path={tiny_model_dir}"])
    cfg.run.threads = -1  # set by hand after the config was checked
    with pytest.raises(ConfigError, match=r"run\.threads\b.*-1\b"):
        Trainer(cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written


# ---------------------------------------------------------------------------------------------------
# the reward's own counters reach metrics.jsonl


def test_reward_counters_reach_the_metrics(tiny_model_dir, tmp_path):
    overrides = ["data.reward=trainer_test_counting", "run.steps=4", "run.eval_every=1"]
    Trainer(tiny_config(tiny_model_dir, *overrides), run_dir=tmp_path / "run").train()
    rows = read_metrics(tmp_path / "run")[1:]
    for row in rows:
        # per step, for the step's own samples (2 prompts x G = 4), not cumulative and not validation's
        assert row["reward/calls"] == 8
        assert 0 <= row["reward/timeouts"] <= 8
    assert (
        sum(row["reward/timeouts"] for row in rows) > 0
    )  # the random model starts some answers with a letter

    # per-step counts survive a resume unchanged (cumulative ones would restart from 0)
    Trainer(
        tiny_config(tiny_model_dir, *overrides[:1], "run.steps=2", "run.eval_every=1"),
        run_dir=tmp_path / "split",
    ).train()
    Trainer(tiny_config(tiny_model_dir, *overrides), resume=tmp_path / "split").train()
    assert training_rows(tmp_path / "split") == training_rows(tmp_path / "run")


def test_non_finite_metric_values_are_never_stored(tmp_path):
    # A NaN loss (say) must not reach metrics.jsonl: the value is left out, a nonfinite/ marker takes its
    # place, and the warning names metric and step. allow_nan=False in json.dumps is the last guard.
    from ebpo.trackers import MetricsLogger

    logger = MetricsLogger(tmp_path)
    with pytest.warns(RuntimeWarning) as warned:
        logger.log(3, {"actor/pg_loss": float("nan"), "actor/grad_norm": float("inf"), "reward/mean": 0.5})
    logger.close()
    messages = [str(w.message) for w in warned]
    assert any(m.startswith("step 3: metric 'actor/pg_loss' is nan") for m in messages), messages
    assert any(m.startswith("step 3: metric 'actor/grad_norm' is inf") for m in messages), messages
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    (row,) = read_metrics(tmp_path)
    assert row == {
        "step": 3,
        "reward/mean": 0.5,
        "nonfinite/actor/pg_loss": 1.0,
        "nonfinite/actor/grad_norm": 1.0,
    }
