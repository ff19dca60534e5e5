"""``ebpo.persist``: atomic writes that a kill or a second writer cannot tear, the journal's one policy for a
torn last line, a directory written whole, one process per directory, and state files that load without
running code."""

from __future__ import annotations

import errno
import multiprocessing
import os
import re
import warnings
from pathlib import Path

import pytest
import torch

from ebpo import persist
from ebpo.persist import (
    DirectoryInUse,
    DirectoryLock,
    Journal,
    WriteError,
    replace_dir,
    save_torch_atomic,
)

# ---------------------------------------------------------------------------------------------------
# atomic files


def _save_repeatedly(path: str, writer: int, times: int, failures) -> None:
    """Child process: save ``times`` states of ``writer`` to ``path``, counting the saves that raise."""
    torch.set_num_threads(1)
    for _ in range(times):
        try:
            save_torch_atomic({"writer": writer, "x": torch.full((64,), writer)}, Path(path))
        except Exception:  # noqa: BLE001 - any failure of a save is what the test counts
            with failures.get_lock():
                failures.value += 1


def test_two_processes_saving_to_one_path_never_collide(tmp_path):
    # two processes on a shared filesystem saving the same checkpoint file (TRL's save_on_each_node=True). A
    # temporary name shared by both lets one's rename take the file the other is about to rename
    # (FileNotFoundError in tens of the 400 saves); with one temporary file per save the last rename wins whole.
    path = tmp_path / "ebpo_estimator.pt"
    context = multiprocessing.get_context("fork")
    failures = context.Value("i", 0)
    writers = [
        context.Process(target=_save_repeatedly, args=(str(path), writer, 200, failures)) for writer in (1, 2)
    ]
    for process in writers:
        process.start()
    for process in writers:
        process.join(timeout=120)
    assert [process.exitcode for process in writers] == [0, 0]
    assert failures.value == 0
    state = torch.load(path, weights_only=False)
    assert state["writer"] in (1, 2) and torch.equal(state["x"], torch.full((64,), state["writer"]))
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_a_failed_save_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    save_torch_atomic({"step": 1}, path)

    def broken_save(state, handle):  # dies half-way through writing
        handle.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(WriteError) as err:
        save_torch_atomic({"step": 2}, path)
    assert str(err.value) == f"cannot write {path}: no space left on device; {path} is as it was"
    assert torch.load(path, weights_only=False) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_text_and_bytes_are_replaced_whole_and_parents_created(tmp_path):
    path = tmp_path / "a" / "b" / "config.yaml"
    assert persist.write_text_atomic(path, "x: 1\n") == path
    persist.write_bytes_atomic(path, b"x: 2\n")
    assert path.read_text() == "x: 2\n"
    assert [p.name for p in path.parent.iterdir()] == ["config.yaml"]


# ---------------------------------------------------------------------------------------------------
# a directory written whole


def _fill(files: dict[str, str]):
    def fill(staging: Path) -> None:
        for name, text in files.items():
            (staging / name).write_text(text)

    return fill


def test_replace_dir_swaps_in_a_complete_copy_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "model"
    replace_dir(target, _fill({"weights": "old", "extra": "x"}))
    replace_dir(target, _fill({"weights": "new"}))
    assert sorted(p.name for p in target.iterdir()) == ["weights"]  # the new copy whole, not merged
    assert (target / "weights").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_replace_dir_that_fails_while_filling_keeps_the_old_copy(tmp_path):
    target = tmp_path / "model"
    replace_dir(target, _fill({"weights": "old"}))

    def broken(staging: Path) -> None:
        (staging / "weights").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_dir(target, broken)
    assert (target / "weights").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # the unfinished staging copy is gone


def test_replace_dir_with_fixed_spares_uses_those_names(tmp_path, monkeypatch):
    target = tmp_path / "last"
    spares = (tmp_path / ".last.tmp", tmp_path / ".last.old")
    replace_dir(target, _fill({"state": "1"}), spares=spares)
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renames.append((src, dst)), real_replace(src, dst)))
    replace_dir(target, _fill({"state": "2"}), spares=spares)
    assert renames == [(target, spares[1]), (spares[0], target)]  # old aside, new in place
    assert (target / "state").read_text() == "2" and not spares[0].exists() and not spares[1].exists()


# ---------------------------------------------------------------------------------------------------
# the journal


def test_journal_appends_whole_lines_and_reads_them_back(tmp_path):
    journal = Journal(tmp_path / "sub" / "j.jsonl")
    assert journal.read() == [] and not journal.exists()
    journal.append([{"b": 1, "a": 2}, {"step": 3}])
    journal.append([])
    assert (tmp_path / "sub" / "j.jsonl").read_text() == '{"b": 1, "a": 2}\n{"step": 3}\n'  # as given
    assert journal.read() == [{"a": 2, "b": 1}, {"step": 3}]
    Journal(tmp_path / "sorted.jsonl", sort_keys=True).append([{"b": 1, "a": 2}])
    assert (tmp_path / "sorted.jsonl").read_text() == '{"a": 2, "b": 1}\n'  # metrics.jsonl's form
    with pytest.raises(ValueError, match="Out of range float"):  # NaN is never stored
        journal.append([{"x": float("nan")}])
    assert journal.read() == [{"a": 2, "b": 1}, {"step": 3}]


def test_a_torn_last_line_is_dropped_with_a_warning_and_cut_only_by_its_writer(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text('{"id": 1}\n{"id": 2}')  # killed before the second line's newline: torn, though it parses
    journal = Journal(path)
    with pytest.warns(RuntimeWarning, match=r"j.jsonl, line 2: dropped a torn last line \(9 bytes"):
        assert journal.read() == [{"id": 1}]
    assert path.read_text() == '{"id": 1}\n{"id": 2}'  # a reader changes nothing
    with pytest.warns(RuntimeWarning, match="torn"):
        assert journal.read(repair=True) == [{"id": 1}]
    assert path.read_text() == '{"id": 1}\n'  # the writer cuts it before appending
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        journal.append([{"id": 3}])
        assert journal.read() == [{"id": 1}, {"id": 3}]


def test_an_append_after_a_torn_tail_starts_a_line_of_its_own(tmp_path):
    # another writer was killed mid-line after this one read the file: the torn bytes stay (a bad line of
    # their own, which a reader names or skips), the new row is whole
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": "to')
    Journal(path).append([{"id": 2}])
    assert path.read_bytes() == b'{"id": 1}\n{"id": "to\n{"id": 2}\n'
    kind, fix = "a finished prompt", "delete it to restart"
    journal = Journal(path, kind=kind, fix=fix)
    with pytest.raises(ValueError, match=rf"j\.jsonl, line 2: .*{kind}.*{fix}$"):
        journal.read()
    assert journal.read(skip_bad=True) == [{"id": 1}, {"id": 2}] and journal.skipped == [2]


def test_parse_refusals_and_non_objects_are_bad_lines_named_by_line(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"key": "a"}\n[1, 2]\n\n\xff\xfe\n{"nokey": 1}\n')
    kind = "a cached label"
    journal = Journal(path, kind=kind, fix="delete the file")

    def parse(row):
        return row["key"]

    assert journal.read(parse, skip_bad=True) == ["a"] and journal.skipped == [
        2,
        4,
        5,
    ]  # the blank line 3 is skipped
    with pytest.raises(ValueError, match=rf"j\.jsonl, line 2: .*{kind}") as err:
        journal.read(parse)
    assert "\n" not in str(err.value)


def test_retain_keeps_the_accepted_lines_as_written(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "x": 1.50}\n{"step": 1}\n{"step": 2}\n{"step": 3, "x"')
    with pytest.warns(RuntimeWarning, match="line 4: dropped a torn last line"):
        assert Journal(path).retain(lambda row: row["step"] <= 1) == 1  # step 2 (the torn line is not a row)
    assert path.read_text() == '{"step": 0, "x": 1.50}\n{"step": 1}\n'  # bytes kept, not re-serialised
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


# ---------------------------------------------------------------------------------------------------
# one process per directory


def test_a_lock_file_removed_under_a_waiting_process_is_not_shared(tmp_path, monkeypatch):
    """B opens .lock while A holds it; A removes it and lets go; C creates and locks a new one. B's flock on
    the removed file then succeeds, but B sees that the file it locked is no longer there and tries again:
    C holds the directory, so B is refused. Without that check B and C would both hold it."""
    lock = DirectoryLock
    a = lock(tmp_path, what="d", hint="h").acquire()
    stale = open(tmp_path / DirectoryLock.FILE, "a+", encoding="utf-8")  # B, mid-acquire
    a.release()
    c = lock(tmp_path, what="d", hint="h").acquire()
    real_open, opened = open, []

    def b_open(*args, **kwargs):
        opened.append(args[0])
        return stale if len(opened) == 1 else real_open(*args, **kwargs)

    monkeypatch.setattr("builtins.open", b_open)
    with pytest.raises(DirectoryInUse, match=rf"^d {re.escape(str(tmp_path))} .*pid {os.getpid()}\b.*; h$"):
        lock(tmp_path, what="d", hint="h").acquire()
    monkeypatch.undo()
    assert len(opened) == 2  # the removed file, then the one C holds
    c.release()


# ---------------------------------------------------------------------------------------------------
# state files load without running code


@pytest.mark.parametrize("shell", [False, True], ids=["open", "os.system"])
def test_load_torch_refuses_a_pickle_that_would_run_code_and_runs_nothing(tmp_path, shell):
    from helpers.payloads import write_payload

    marker = tmp_path / "created-by-the-pickle"
    path = write_payload(tmp_path / "trainer_state.pt", marker, shell=shell)
    with pytest.raises(persist.UnsafeFile) as err:
        persist.load_torch(path, fix="start over")
    assert not marker.exists()
    message = str(err.value)
    assert "\n" not in message
    named = "posix.system" if shell else "io.open"
    assert message == (
        f"{path} holds a pickle that would run code to load ({named}), and ebpo loads only tensors, numbers, "
        "strings, lists and dicts from a state file: it was left unread; start over"
    )


def test_load_torch_reads_plain_state_and_numpy_arrays_only(tmp_path):
    import numpy as np

    plain = {"step": 3, "x": torch.arange(4), "rng": [3, [1, 2], None], "t": (1, 2.5), "s": "a"}
    save_torch_atomic(plain, tmp_path / "plain.pt")
    loaded = persist.load_torch(tmp_path / "plain.pt", fix="")
    assert loaded["step"] == 3 and torch.equal(loaded["x"], torch.arange(4)) and loaded["t"] == (1, 2.5)
    # ebpo 0.1.0 wrote NumPy's RNG state as a uint32 array: it loads, as that array
    key = np.arange(624, dtype=np.uint32) * 7
    torch.save({"numpy": ("MT19937", key, 624, 0, 0.0)}, tmp_path / "old.pt")
    old = persist.load_torch(tmp_path / "old.pt", fix="")["numpy"]
    assert old[1].dtype == np.uint32 and np.array_equal(old[1], key)
    # an array subclass, or any other NumPy object that calls code, is refused like any other object
    torch.save({"m": np.random.default_rng(0)}, tmp_path / "generator.pt")
    with pytest.raises(persist.UnsafeFile, match=r"generator\.pt holds a pickle .*\(numpy\.random\."):
        persist.load_torch(tmp_path / "generator.pt", fix="")


def test_load_torch_names_a_damaged_file_apart_from_an_unsafe_one(tmp_path):
    path = tmp_path / "state.pt"
    path.write_bytes(b"not a torch file at all")
    with pytest.raises(persist.DamagedFile) as err:
        persist.load_torch(path, fix="restore it")
    assert not isinstance(err.value, persist.UnsafeFile)
    reason = r" is damaged or not a state file, and cannot be read as plain data \(.+\); restore it"
    assert re.fullmatch(re.escape(str(path)) + reason, str(err.value))
