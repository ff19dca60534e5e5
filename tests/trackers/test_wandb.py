"""The ``wandb`` tracker (``ebpo.trackers.wandb``): a run that cannot start is one line, and its files go to the
run directory. wandb runs offline in ``tmp_path``; no test contacts a server."""

from __future__ import annotations

import pytest

from ebpo.trackers import MetricsLogger, TrackerError
from helpers.trackers import offline_trackers

pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'ebpo[wandb]')")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    yield from offline_trackers(monkeypatch, tmp_path)


def test_a_tracker_that_cannot_start_is_one_line(tmp_path, monkeypatch, offline):
    import wandb

    def no_login(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")

    monkeypatch.setattr(wandb, "init", no_login)
    with pytest.raises(TrackerError) as err:
        MetricsLogger(tmp_path / "run", ["tensorboard", "wandb"])
    assert str(err.value) == (
        "wandb: cannot start a run: UsageError: api_key not configured (no-tty). call "
        "wandb.login(key=[your_api_key]); log in with `wandb login`, or set WANDB_MODE=offline to log locally "
        "(`wandb sync` uploads it later)"
    )


def test_wandbs_files_go_to_the_run_directory_without_wandb_dir(tmp_path, monkeypatch, offline):
    monkeypatch.delenv("WANDB_DIR")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    logger = MetricsLogger(tmp_path / "run", ["wandb"], config={"run": {"steps": 1}})
    logger.log(0, {"eval/pass@1": 0.25})
    logger.close()
    assert list((tmp_path / "cwd").iterdir()) == []  # not ./wandb
    assert len(list((tmp_path / "run" / "wandb").glob("offline-run-*"))) == 1
