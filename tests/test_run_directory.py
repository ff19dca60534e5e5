"""``ebpo.run_directory``: a run directory claimed by one process, refusing to mix two runs, rewound or cleared for
a new start, its summary, and no directory left behind by an abandoned run."""

from __future__ import annotations

import json
import os
import re

import pytest

from ebpo.errors import ConfigError
from ebpo.persist import DirectoryInUse
from ebpo.run_directory import RunDirectory


def test_run_directory_refuses_mixing_two_runs_and_names_the_fix(tmp_path):
    run = RunDirectory(tmp_path / "run").claim()
    run.check(resuming=False, overwrite=False)  # empty: fine
    run.start(rewind_to=None, overwrite=False)
    run.metrics.append([{"step": 0}])
    with pytest.raises(
        ConfigError, match=rf"{re.escape(str(tmp_path / 'run'))} .*\(metrics\.jsonl\).*--resume"
    ):
        run.check(resuming=False, overwrite=False)
    with pytest.raises(ConfigError, match=rf"--resume and --overwrite .*{re.escape(str(tmp_path / 'run'))}"):
        run.check(resuming=True, overwrite=True)
    run.check(resuming=True, overwrite=False)
    run.check(resuming=False, overwrite=True)
    with pytest.raises(DirectoryInUse, match=rf"{re.escape(str(tmp_path / 'run'))} .*pid {os.getpid()}\b"):
        RunDirectory(tmp_path / "run").claim()
    run.release()


def test_run_directory_rewinds_or_clears_and_writes_its_summary(tmp_path):
    run = RunDirectory(tmp_path / "run").claim()
    (run.path / "notes.txt").write_text("mine")
    run.metrics.append([{"step": s} for s in range(4)])
    run.write_summary({"step": 3, "best_step": None})
    assert json.loads((run.path / "summary.json").read_text()) == {"best_step": None, "step": 3}
    assert run.start(rewind_to=2, overwrite=False) == 1  # step 3 went
    assert [row["step"] for row in run.metrics.read()] == [0, 1, 2]
    (run.path / "checkpoints" / "last").mkdir(parents=True)
    run.start(rewind_to=None, overwrite=True)
    assert sorted(p.name for p in run.path.iterdir()) == [
        ".lock",
        "notes.txt",
    ]  # the outputs go, nothing else
    run.release()
    assert not (run.path / ".lock").exists()


def test_an_abandoned_run_leaves_no_directory_it_created(tmp_path):
    fresh = RunDirectory(tmp_path / "fresh").claim()
    fresh.abandon()
    assert not (tmp_path / "fresh").exists()
    (tmp_path / "kept").mkdir()
    kept = RunDirectory(tmp_path / "kept").claim()
    kept.abandon()
    assert (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / ".lock").exists()
    assert RunDirectory.timestamped("ebpo").endswith("-ebpo") and len(RunDirectory.timestamped("x")) == 17
