"""The TRL adapter's estimator state file (``checkpoint-N/ebpo_estimator.pt``) on a bad day: a disk that
refuses the write, and a damaged file on resume. Each is one line naming the file (``ebpo.persist``), never
a traceback from torch or pickle, and the checkpoint folder holds no half-written file."""

from __future__ import annotations

import errno
import os

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

from ebpo.integrations.trl import ESTIMATOR_STATE_FILE  # noqa: E402
from ebpo.persist import DamagedFile, WriteError  # noqa: E402
from test_integration_trl import make_config, make_trainer  # noqa: E402


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["full", "quota"])
def test_a_refused_estimator_state_write_is_one_line(tiny_model_dir, tmp_path, monkeypatch, code):
    def refusing_save(state, handle):
        handle.write(b"PK part of a zip")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(torch, "save", refusing_save)
    out = tmp_path / "run"
    trainer = make_trainer(tiny_model_dir, make_config(out, max_steps=1, save_strategy="steps", save_steps=1))
    with pytest.raises(WriteError) as err:
        trainer.train()
    path = out / "checkpoint-1" / ESTIMATOR_STATE_FILE
    reason = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}[code]
    assert str(err.value) == f"cannot write {path}: {reason}; nothing was written there"
    assert list((out / "checkpoint-1").iterdir()) == []  # no temporary file left


def test_a_damaged_estimator_state_is_one_line_on_resume(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    make_trainer(tiny_model_dir, make_config(out, max_steps=1, save_strategy="steps", save_steps=1)).train()
    path = out / "checkpoint-1" / ESTIMATOR_STATE_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    second = make_trainer(tiny_model_dir, make_config(out, max_steps=2))
    with pytest.raises(DamagedFile) as err:
        second.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    message = str(err.value)
    assert message.startswith(f"{path} is damaged and cannot be read (") and "\n" not in message
    assert message.endswith(
        "; resume from an earlier checkpoint-N folder, or delete the file to start from an empty prior"
    )
