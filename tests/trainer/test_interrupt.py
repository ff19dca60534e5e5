"""Ctrl-C and SIGTERM during ``ebpo train``: the run stops at the next step boundary with a checkpoint, says
in one line where it stopped and how to continue, exits 130 / 143 without a traceback, and the resumed run
equals one that was never interrupted, bit for bit (metrics and final weights). A second signal stops at once;
the resume then continues from the newest checkpoint, still exactly.

Signals are sent at random moments (seeded): in process, at a random forward pass of the model (sampling,
validation, the log-prob passes, the updates); to an ``ebpo train`` process, after a random delay.
"""

from __future__ import annotations

import functools
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ebpo
from ebpo.trainer import checkpoint as checkpoint_module
from ebpo.trainer.interrupt import Interrupted, StoppedAtOnce
from ebpo.trainer.trainer import Trainer
from helpers.trainer import final_params, tiny_config, tiny_overrides, training_rows

STEPS = 6
TESTS = Path(__file__).resolve().parents[1]
SRC = Path(ebpo.__file__).resolve().parents[1]  # the child runs the ebpo this process imported


@pytest.fixture(scope="module")
def straight(tiny_model_dir, tmp_path_factory):
    """A run of STEPS steps that nothing interrupts, and the forward passes of the model it made before its
    last step (a signal during the last step lets the run finish)."""
    run = tmp_path_factory.mktemp("straight") / "run"
    trainer = Trainer(tiny_config(tiny_model_dir, f"run.steps={STEPS}", "run.eval_every=2"), run_dir=run)
    calls = _count_forwards(trainer)
    trainer.train()
    return run, calls[1]


def _count_forwards(trainer: Trainer, at: dict[int, int] | None = None) -> list[int]:
    """Count the policy's forward passes (``[all, before the last step]``); at the k-th (a key of ``at``),
    send this process signal ``at[k]``."""
    calls = [0, 0]
    forward = trainer.model.forward

    # functools.wraps keeps forward's signature, which the sampler reads (logits_to_keep): without it the
    # counted runs would sample through another path, whose log-probs round differently
    @functools.wraps(forward)
    def counting(*args, **kwargs):
        calls[0] += 1
        calls[1] += trainer.step < trainer.cfg.run.steps - 1
        if at and calls[0] in at:
            os.kill(os.getpid(), at[calls[0]])
        return forward(*args, **kwargs)

    trainer.model.forward = counting
    return calls


def _assert_same_as_straight(run: Path, straight_run: Path) -> None:
    assert training_rows(run) == training_rows(straight_run)
    expected, resumed = final_params(straight_run), final_params(run)
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name


def _config(model_dir):
    return tiny_config(model_dir, f"run.steps={STEPS}", "run.eval_every=2")


@pytest.mark.parametrize("seed", range(4))
def test_a_signal_at_a_random_moment_stops_at_the_step_boundary(
    tiny_model_dir, tmp_path, straight, seed, monkeypatch
):
    straight_run, forwards = straight
    rng = random.Random(seed)
    signum = rng.choice([signal.SIGINT, signal.SIGTERM])
    moment = rng.randrange(1, forwards)  # any forward pass before the last step
    run = tmp_path / "run"
    trainer = Trainer(_config(tiny_model_dir), run_dir=run)
    steps_at_signal = []
    calls = _count_forwards(trainer, {moment: signum})
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    kill = os.kill

    def noting_kill(pid, sig):  # note the completed steps when the signal goes out
        steps_at_signal.append(trainer.step)
        kill(pid, sig)

    monkeypatch.setattr(os, "kill", noting_kill)
    with pytest.raises(Interrupted) as err:
        trainer.train()
    monkeypatch.undo()
    assert calls[0] >= moment and len(steps_at_signal) == 1
    stopped = err.value
    # the step in progress finishes (or the validation after it); nothing after that boundary runs
    assert stopped.step in (steps_at_signal[0], steps_at_signal[0] + 1)
    assert stopped.signum == signum and stopped.exit_code == 128 + signum
    assert stopped.checkpoint == run / "checkpoints" / "last"
    assert checkpoint_module.load_trainer_state(stopped.checkpoint)["step"] == stopped.step
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # given back

    Trainer(_config(tiny_model_dir), resume=run).train()
    _assert_same_as_straight(run, straight_run)


@pytest.mark.parametrize("seed", range(2))
def test_a_second_signal_stops_at_once_and_the_newest_checkpoint_resumes_exactly(
    tiny_model_dir, tmp_path, straight, seed
):
    straight_run, forwards = straight
    rng = random.Random(100 + seed)
    first = rng.randrange(1, forwards - 2)
    second = rng.randrange(first + 1, min(forwards, first + 12))  # before the step's boundary, usually
    run = tmp_path / "run"
    trainer = Trainer(_config(tiny_model_dir), run_dir=run)
    _count_forwards(trainer, {first: signal.SIGINT, second: signal.SIGINT})
    with pytest.raises((StoppedAtOnce, Interrupted)):  # Interrupted if a boundary fell between the two
        trainer.train()
    newest = checkpoint_module.newest_intact(run)
    if newest is None:  # stopped before the first checkpoint: nothing to resume, start over
        Trainer(_config(tiny_model_dir), run_dir=run, overwrite=True).train()
    else:
        checkpoint, step = newest
        assert step <= trainer.step
        Trainer(_config(tiny_model_dir), resume=checkpoint).train()
    _assert_same_as_straight(run, straight_run)


@pytest.mark.parametrize("name", ["last", "best"])
def test_a_second_signal_during_a_checkpoint_write_stops_once_the_write_is_complete(
    tiny_model_dir, tmp_path, straight, monkeypatch, name
):
    """Both signals arrive while a checkpoint's trainer state is being serialised (the moment where torch turned
    the interrupt into an error of its own): the write completes, then the run stops at once; the checkpoint
    it was writing is the newest, and resuming from it gives the straight run."""
    straight_run, _ = straight
    run = tmp_path / "run"
    trainer = Trainer(_config(tiny_model_dir), run_dir=run)
    save = checkpoint_module.save_torch_atomic
    sent = []

    def signalled_save(state, path):
        if path.parent.name == f".{name}.tmp" and state["step"] >= 2 and not sent:  # a save after step 2
            sent.append(state["step"])
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # without the deferral this raised here, mid-save
        return save(state, path)

    monkeypatch.setattr(checkpoint_module, "save_torch_atomic", signalled_save)
    with pytest.raises(StoppedAtOnce):
        trainer.train()
    monkeypatch.undo()
    newest = checkpoint_module.newest_intact(run)
    assert newest is not None and newest[0] == run / "checkpoints" / name  # the save in progress completed
    assert newest[1] == sent[0] == trainer.step
    Trainer(_config(tiny_model_dir), resume=newest[0]).train()
    _assert_same_as_straight(run, straight_run)


# ---------------------------------------------------------------------------------------------------
# `ebpo train` as a process: exit code, one line, no traceback, and the command it prints


CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); import helpers.trainer; from ebpo.cli import run; "
    "run(sys.argv[2:])"
)
"""``ebpo train`` in a child process, with the tests' dense reward registered (``helpers.trainer``)."""

PROCESS_STEPS = 10


def _train_process(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(TESTS), "train", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def straight_process_run(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("straight-process") / "run"
    Trainer(tiny_config(tiny_model_dir, f"run.steps={PROCESS_STEPS}", "run.threads=1"), run_dir=run).train()
    return run


@pytest.mark.parametrize(
    ("seed", "signals"),
    [(0, [signal.SIGINT]), (1, [signal.SIGTERM]), (2, [signal.SIGINT, signal.SIGINT])],
    ids=["ctrl-c", "sigterm", "ctrl-c-twice"],
)
def test_ebpo_train_stops_with_one_line_and_the_command_that_continues(
    tiny_model_dir, tmp_path, straight_process_run, seed, signals
):
    rng = random.Random(seed)
    # one thread, as this process runs the straight run and the resume: the same sums in the same order
    overrides = [*tiny_overrides(tiny_model_dir), f"run.steps={PROCESS_STEPS}", "run.threads=1"]
    child = _train_process(["--run-dir", "run", *overrides], tmp_path)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "run directory: run"  # set up: the loop starts now
    metrics, lines = tmp_path / "run" / "metrics.jsonl", rng.randint(1, 4)  # step 0 is the first line
    while child.poll() is None and (not metrics.exists() or metrics.read_text().count("\n") < lines):
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.1))  # then a random moment of the step or the two after it
    for signum in signals:
        child.send_signal(signum)
        time.sleep(rng.uniform(0.0, 0.05))
    out, err = child.communicate(timeout=300)
    # a second Ctrl-C that lands once Python has put the system's handler back, late in the process's exit,
    # ends it by the signal itself: the same status 130 to a shell
    assert child.returncode in {128 + signals[0], *([-signals[0]] if len(signals) > 1 else [])}, err
    assert "Traceback" not in err and "Traceback" not in out
    last = err.strip().splitlines()[-1]
    name = "Ctrl-C (SIGINT)" if signals[0] == signal.SIGINT else "SIGTERM"
    if len(signals) == 1:
        match = re.fullmatch(
            rf"ebpo train: stopped by {re.escape(name)} after step (\d+); checkpoint written to "
            r"run/checkpoints/last; continue with `(ebpo train --resume run)`",
            last,
        )
    else:  # stopped at once in a step, or at a boundary the first signal reached before the second came
        match = re.fullmatch(
            rf"ebpo train: (?:stopped at once by a second {re.escape(name)} before step \d+ finished; "
            r"run/checkpoints/\w+ \(step (\d+)\) is kept; continue with|stopped by .* after step (\d+); "
            r"checkpoint written to run/checkpoints/last; continue with|stopped at once by a second "
            rf"{re.escape(name)} before step 1 finished; no checkpoint was written; start over with) "
            r"`(ebpo train --[^`]+)`",
            last,
        )
    assert match is not None, err
    command = match.groups()[-1]

    from ebpo.cli import main

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(shlex.split(command)[1:]) == 0  # the command as printed, from where the user stands
    finally:
        os.chdir(cwd)
    _assert_same_as_straight(tmp_path / "run", straight_process_run)


def test_ctrl_c_during_the_final_summary_says_the_run_is_complete(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    # training returned and saved; Ctrl-C while the table prints cuts only the summary short: one line, 130
    from ebpo.cli import main
    from ebpo.trainer import report

    def interrupted_table(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "print_eval_table", interrupted_table)
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *tiny_overrides(tiny_model_dir), "run.steps=1"]) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"ebpo train: interrupted; the run is complete in {run}"
    assert (run / "checkpoints" / "last").is_dir()
