"""Writes the disk refuses: a full disk (ENOSPC), a quota (EDQUOT), permissions (EACCES), a read-only
filesystem (EROFS), where ``ebpo train`` writes (checkpoints, the metrics journal, TensorBoard). Each is one
line naming the path, the reason in words and what was kept; the previous complete checkpoint stays the one a
resume uses, and the resumed run equals one the disk never refused, bit for bit. The evaluation cache's case
is in ``eval/test_cli.py``, the adapters' estimator state's in ``integrations/``.

Two ways: the errors injected where the writing libraries raise them (in the form each raises: safetensors'
message, torch's RuntimeError over the file's OSError, Python's OSError, TensorBoard's writer thread), and a
real small filesystem (a tmpfs filled up, or remounted read-only), skipped where it cannot be mounted.
"""

from __future__ import annotations

import builtins
import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ebpo import persist
from ebpo.cli import main
from ebpo.persist import DirectoryLock, Journal, WriteError, replace_dir, save_torch_atomic, write_text_atomic
from ebpo.trainer import checkpoint as checkpoint_module
from ebpo.trainer.trainer import Trainer
from helpers.trainer import final_params, tiny_config, tiny_overrides, training_rows

STEPS = 6
REFUSED = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EROFS: "read-only file system",
}
FIX = {
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some space",
    errno.EACCES: "fix the permissions",
    errno.EROFS: "make the filesystem writable",
}


def refused(code: int) -> OSError:
    return OSError(code, os.strerror(code))


# ---------------------------------------------------------------------------------------------------
# ebpo.persist: every writer, every refusal


@pytest.mark.parametrize("code", sorted(REFUSED), ids=lambda code: errno.errorcode[code])
def test_each_atomic_writer_names_the_path_the_reason_and_keeps_the_old_content(tmp_path, monkeypatch, code):
    target = tmp_path / "file.txt"
    write_text_atomic(target, "old")
    replace_dir(tmp_path / "d", lambda d: (d / "f").write_text("old"))

    def refusing_open(path, mode="r", *args, **kwargs):  # refuses every write below tmp_path
        if any(flag in mode for flag in "wax+") and str(path).startswith(str(tmp_path)):
            raise refused(code)
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", lambda self, mode="r", *a, **k: refusing_open(self, mode, *a, **k))
    monkeypatch.setattr(persist, "open", refusing_open, raising=False)
    writes = {
        "text": (target, lambda: write_text_atomic(target, "new")),
        "torch": (tmp_path / "state.pt", lambda: save_torch_atomic({"x": 1}, tmp_path / "state.pt")),
        "journal": (tmp_path / "j.jsonl", lambda: Journal(tmp_path / "j.jsonl").append([{"a": 1}])),
        "directory": (
            tmp_path / "d",
            lambda: replace_dir(tmp_path / "d", lambda d: (d / "f").write_text("x")),
        ),
        "lock": (tmp_path / "r", lambda: DirectoryLock(tmp_path / "r", what="", hint="").acquire()),
    }
    for name, (path, write) in writes.items():
        with pytest.raises(WriteError) as err:
            write()
        assert err.value.path == path, name
        assert err.value.reason == REFUSED[code] and err.value.fix == FIX[code]
        assert str(err.value).startswith(f"cannot write {path}: {REFUSED[code]}; ")
        assert "\n" not in str(err.value)
    monkeypatch.undo()
    assert target.read_text() == "old" and (tmp_path / "d" / "f").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "file.txt", "r"]  # no temporary file left
    assert not any((tmp_path / "r").iterdir())


def test_the_reason_is_found_where_each_library_puts_it():
    from safetensors import SafetensorError

    assert persist.write_errno(refused(errno.EDQUOT)) == errno.EDQUOT
    # safetensors keeps the errno in its message only
    text = "Error while serializing: I/O error: No space left on device (os error 28)"
    assert persist.write_errno(SafetensorError(text)) == errno.ENOSPC
    # torch raises its own RuntimeError while the file object's OSError is being handled
    try:
        try:
            raise refused(errno.EROFS)
        except OSError:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
            ) from None
    except RuntimeError as err:
        assert persist.write_errno(err) == errno.EROFS
    assert persist.write_errno(RuntimeError("unexpected pos 576 vs 534")) is None  # nothing to go on
    assert persist.write_errno(refused(errno.ENOENT)) is None  # not a refused write
    assert persist.write_errno(KeyboardInterrupt()) is None


# ---------------------------------------------------------------------------------------------------
# ebpo train: each place it writes, through the command line


@pytest.fixture(scope="module")
def straight(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("straight") / "run"
    Trainer(tiny_config(tiny_model_dir, f"run.steps={STEPS}"), run_dir=run).train()
    return run


def _fail_on_call(calls: int, raise_it):
    """A function that does nothing until its ``calls``-th call, which runs ``raise_it()``."""
    count = [0]

    def maybe_fail(*args, **kwargs) -> bool:
        count[0] += 1
        if count[0] == calls:
            raise_it()
        return False

    return maybe_fail


def _safetensors_full(monkeypatch, calls: int) -> None:
    """The ``calls``-th model save meets a full disk, as safetensors reports it."""
    from safetensors import SafetensorError
    from transformers import modeling_utils

    def full() -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    fail = _fail_on_call(calls, full)
    save = modeling_utils.safe_save_file
    monkeypatch.setattr(modeling_utils, "safe_save_file", lambda *a, **k: fail() or save(*a, **k))


def _torch_quota(monkeypatch, calls: int) -> None:
    """The ``calls``-th trainer state meets a quota, as torch reports it: a RuntimeError raised while the
    file object's OSError is handled, after part of the file was written."""
    save = torch.save

    def over_quota() -> None:
        try:
            raise refused(errno.EDQUOT)
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from None

    fail = _fail_on_call(calls, over_quota)

    def saving(state, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04 part of a zip")
        fail()
        handle.seek(0)
        handle.truncate()
        return save(state, handle, *args, **kwargs)

    monkeypatch.setattr(torch, "save", saving)


def _journal_denied(monkeypatch, calls: int) -> None:
    """The ``calls``-th append to ``metrics.jsonl`` is denied (its permissions changed under the run)."""

    def denied() -> None:
        raise refused(errno.EACCES)

    fail = _fail_on_call(calls, denied)

    def opening(path, mode="r", *args, **kwargs):
        if str(path).endswith("metrics.jsonl") and "a" in mode:
            fail()
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(persist, "open", opening, raising=False)


def _tensorboard_read_only(monkeypatch, calls: int) -> None:
    """The ``calls``-th event TensorBoard's writer thread writes meets a read-only filesystem."""
    from tensorboard.summary.writer import record_writer

    def read_only() -> None:
        raise refused(errno.EROFS)

    fail = _fail_on_call(calls, read_only)
    write = record_writer.RecordWriter.write
    monkeypatch.setattr(record_writer.RecordWriter, "write", lambda self, data: fail() or write(self, data))


@pytest.mark.parametrize(
    ("inject", "code", "calls", "path"),
    [
        (_safetensors_full, errno.ENOSPC, 3, r"run/checkpoints/(?:last|best)"),
        (_torch_quota, errno.EDQUOT, 3, r"run/checkpoints/(?:last|best)"),
        (_journal_denied, errno.EACCES, 4, r"run/metrics\.jsonl"),
        (_tensorboard_read_only, errno.EROFS, 40, r"run/tensorboard"),
    ],
    ids=["model-weights-full", "trainer-state-quota", "metrics-denied", "tensorboard-read-only"],
)
def test_a_refused_write_during_training_is_one_line_and_the_last_checkpoint_resumes(
    tiny_model_dir, tmp_path, straight, capsys, monkeypatch, inject, code, calls, path
):
    overrides = [*tiny_overrides(tiny_model_dir), f"run.steps={STEPS}"]
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        inject(patch, calls)
        assert main(["train", "--run-dir", "run", *overrides]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    (line,) = [line for line in err.splitlines() if line.startswith("ebpo train")]
    match = re.fullmatch(
        rf"ebpo train: error: cannot write ({path}): {REFUSED[code]}; (run/checkpoints/\w+) \(step (\d+)\) is "
        rf"kept; continue with `(ebpo train --resume [^`]+)` once you {FIX[code]}",
        line,
    )
    assert match is not None, line
    kept, step, command = Path(match.group(2)), int(match.group(3)), match.group(4)
    assert checkpoint_module.load_trainer_state(kept)["step"] == step
    checkpoint_module.verify_checkpoint(kept)  # complete and intact
    leftovers = [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
    assert sorted(leftovers) in (["best", "last"], ["best"])  # no half-written staging copy
    assert main(command.split()[1:]) == 0
    assert training_rows(tmp_path / "run") == training_rows(straight)
    expected, resumed = final_params(straight), final_params(tmp_path / "run")
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)


def test_no_traceback_from_tensorboards_writer_thread(tiny_model_dir, tmp_path, monkeypatch, capfd):
    # the thread prints its own traceback unless told not to; the main thread raises the error once
    from ebpo.trackers import MetricsLogger

    logger = MetricsLogger(tmp_path)
    logger.log(0, {"a": 1.0})
    _tensorboard_read_only(monkeypatch, 1)
    with pytest.raises(WriteError, match=rf"cannot write {tmp_path / 'tensorboard'}: read-only file system"):
        logger.log(1, {"a": 2.0})
    logger.close()  # after the failure: quietly
    assert "Traceback" not in capfd.readouterr().err


# ---------------------------------------------------------------------------------------------------
# a real small filesystem: filled up, or remounted read-only


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB tmpfs at ``tmp_path / "disk"`` (mounting needs root; skipped where it cannot be mounted)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True, text=True
        )
    except FileNotFoundError:
        pytest.skip("no mount command here: cannot mount a small tmpfs to fill up")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["mount", "-o", "remount,rw", str(disk)], capture_output=True)
    subprocess.run(["umount", str(disk)], check=True)


def _fill(disk: Path) -> Path:
    """Write a file until the filesystem is full; returns it."""
    filler = disk / "filler"
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * (1 << 16))
                handle.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


def test_a_small_filesystem_that_fills_up_during_a_checkpoint(
    tiny_model_dir, small_disk, straight, capsys, monkeypatch
):
    monkeypatch.chdir(small_disk)
    save = checkpoint_module.save_checkpoint
    saves = [0]

    def save_on_a_filling_disk(run_dir, name, *args, **kwargs):
        saves[0] += 1
        if saves[0] == 3:  # the disk fills up just before the third checkpoint
            _fill(small_disk)
        return save(run_dir, name, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "save_checkpoint", save_on_a_filling_disk)
    overrides = [*tiny_overrides(tiny_model_dir), f"run.steps={STEPS}"]
    assert main(["train", "--run-dir", "run", *overrides]) == 1
    monkeypatch.setattr(checkpoint_module, "save_checkpoint", save)
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    (line,) = [line for line in err.splitlines() if line.startswith("ebpo train")]
    assert line == (
        "ebpo train: error: cannot write run/checkpoints/last: no space left on device; run/checkpoints/last "
        "(step 2) is kept; continue with `ebpo train --resume run` once you free some space"
    )
    checkpoint_module.verify_checkpoint(small_disk / "run" / "checkpoints" / "last")
    assert sorted(p.name for p in (small_disk / "run" / "checkpoints").iterdir()) == ["best", "last"]
    (small_disk / "filler").unlink()
    assert main(["train", "--resume", "run"]) == 0
    assert training_rows(small_disk / "run") == training_rows(straight)
    expected, resumed = final_params(straight), final_params(small_disk / "run")
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)
    shutil.rmtree(small_disk / "run")


def test_a_run_on_a_filesystem_remounted_read_only(tiny_model_dir, small_disk, straight, capsys, monkeypatch):
    # a filesystem turns read-only between two runs (the kernel does so after I/O errors; a file open for
    # writing keeps it from being remounted so by hand while a run is going)
    monkeypatch.chdir(small_disk)
    overrides = [*tiny_overrides(tiny_model_dir), "run.steps=2"]
    assert main(["train", "--run-dir", "run", *overrides]) == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    capsys.readouterr()
    assert main(["train", "--resume", "run", f"run.steps={STEPS}"]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == "ebpo train: error: cannot write run: read-only file system; run is as it was"
    subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert main(["train", "--resume", "run", f"run.steps={STEPS}"]) == 0
    assert training_rows(small_disk / "run") == training_rows(straight)
    shutil.rmtree(small_disk / "run")
