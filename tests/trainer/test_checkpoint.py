"""Damaged checkpoints: each checkpoint's ``manifest.json`` (sizes and SHA-256 of its files, written last) is
checked before anything is loaded, so a file cut short or changed is one line naming it, with the command
that continues from the newest intact checkpoint; no traceback from safetensors, torch or pickle reaches the
user on ``--resume`` or ``ebpo eval``. Checkpoints written without a manifest still load.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal

import pytest
import torch

from ebpo.cli import main
from ebpo.errors import ConfigError
from ebpo.persist import MANIFEST, DamagedFile, read_manifest, verify_manifest, write_manifest
from ebpo.settings import read_yaml
from ebpo.trainer import checkpoint as checkpoint_module
from ebpo.trainer.config_files import load_config
from ebpo.trainer.interrupt import Interrupted
from ebpo.trainer.trainer import Trainer
from helpers.trainer import final_params, tiny_config, training_rows

STEPS = 4


@pytest.fixture(scope="module")
def straight(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("straight") / "run"
    Trainer(tiny_config(tiny_model_dir, f"run.steps={STEPS}"), run_dir=run).train()
    return run


@pytest.fixture
def halfway(tiny_model_dir, tmp_path, monkeypatch):
    """A run directory ``run`` (in the current directory, ``tmp_path``) stopped by Ctrl-C in step 2 of
    STEPS: ``checkpoints/best`` at step 0 (the validation before training), ``checkpoints/last`` at step 2."""
    monkeypatch.chdir(tmp_path)
    trainer = Trainer(tiny_config(tiny_model_dir, f"run.steps={STEPS}"), run_dir="run")
    forward, sent = trainer.model.forward, []

    @functools.wraps(forward)  # keeps forward's signature, which the sampler reads (logits_to_keep)
    def forward_then_ctrl_c(*args, **kwargs):
        if trainer.step == 1 and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        return forward(*args, **kwargs)

    trainer.model.forward = forward_then_ctrl_c
    with pytest.raises(Interrupted, match="after step 2"):
        trainer.train()
    return tmp_path / "run"


def _truncate(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _one_line(capsys, prefix: str) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    (line,) = [line for line in err.splitlines() if line.startswith(prefix)]
    return line


def test_the_manifest_lists_every_file_with_its_size_and_hash(halfway):
    last = halfway / "checkpoints" / "last"
    manifest = read_manifest(last)
    assert manifest is not None and manifest["step"] == 2 and manifest["format"] == 1
    on_disk = sorted(p.relative_to(last).as_posix() for p in last.rglob("*") if p.is_file())
    assert sorted(manifest["files"]) == sorted(set(on_disk) - {MANIFEST})
    assert "model/model.safetensors" in manifest["files"] and "trainer_state.pt" in manifest["files"]
    import hashlib

    state = last / "trainer_state.pt"
    assert manifest["files"]["trainer_state.pt"] == {
        "size": state.stat().st_size,
        "sha256": hashlib.sha256(state.read_bytes()).hexdigest(),
    }
    assert verify_manifest(last) == manifest
    assert read_manifest(halfway / "checkpoints" / "best")["step"] == 0


@pytest.mark.parametrize(
    ("file", "damage", "problem"),
    [
        (
            "model/model.safetensors",
            "truncate",
            r"is damaged: 260232 bytes where run/checkpoints/last/manifest.json says 520464",
        ),
        (
            "trainer_state.pt",
            "flip",
            r"is damaged: its SHA-256 differs from the one in run/checkpoints/last/manifest.json",
        ),
        ("model/tokenizer.json", "delete", r"is missing \(listed in run/checkpoints/last/manifest.json\)"),
    ],
    ids=["weights-cut-short", "state-changed", "tokenizer-missing"],
)
def test_a_damaged_last_checkpoint_names_the_file_and_resumes_from_best(
    halfway, straight, capsys, damage, problem, file
):
    path = halfway / "checkpoints" / "last" / file
    if damage == "truncate":
        _truncate(path)
    elif damage == "flip":  # same size, other bytes: only the hash can tell
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.unlink()
    capsys.readouterr()
    assert main(["train", "--resume", "run"]) == 2
    line = _one_line(capsys, "ebpo train")
    expected = (
        rf"ebpo train: error: run/checkpoints/last/{re.escape(file)} {problem}; the newest intact checkpoint "
        r"is run/checkpoints/best \(step 0\): `ebpo train --resume run/checkpoints/best`"
    )
    assert re.fullmatch(expected, line), line
    # the command it gives continues exactly: from step 0, to the same end as a run never damaged
    assert main(["train", "--resume", "run/checkpoints/best"]) == 0
    assert training_rows(halfway) == training_rows(straight)
    expected_params, resumed = final_params(straight), final_params(halfway)
    assert all(torch.equal(expected_params[name], resumed[name]) for name in expected_params)


def test_with_every_checkpoint_damaged_the_line_says_how_to_start_over(halfway, capsys):
    _truncate(halfway / "checkpoints" / "last" / "model" / "model.safetensors")
    _truncate(halfway / "checkpoints" / "best" / "trainer_state.pt")
    capsys.readouterr()
    assert main(["train", "--resume", "run"]) == 2
    assert _one_line(capsys, "ebpo train").endswith(
        "; run holds no intact checkpoint: start over with "
        "`ebpo train --config run/config.yaml --run-dir run --overwrite`"
    )
    assert main(["train", "--config", "run/config.yaml", "--run-dir", "run", "--overwrite"]) == 0


def test_a_manifest_that_does_not_parse_is_one_line(halfway, capsys):
    (halfway / "checkpoints" / "last" / MANIFEST).write_text('{"files": {"mod')
    capsys.readouterr()
    assert main(["train", "--resume", "run"]) == 2
    assert re.fullmatch(
        r"ebpo train: error: run/checkpoints/last/manifest.json is damaged \(.*\); the newest intact "
        r"checkpoint is run/checkpoints/best \(step 0\): `ebpo train --resume run/checkpoints/best`",
        _one_line(capsys, "ebpo train"),
    )


def test_ebpo_eval_checks_the_checkpoint_and_names_the_intact_one(halfway, capsys):
    _truncate(halfway / "checkpoints" / "best" / "model" / "model.safetensors")
    capsys.readouterr()
    args = ["eval", "--benchmarks", "arith", "--limit", "2", "--n", "1", "--ks", "1", "--maj-ks", "1"]
    args += ["--no-cache", "--out-dir", "out", "--quiet"]
    assert main([*args, "run/checkpoints/best"]) == 2
    assert _one_line(capsys, "ebpo eval") == (
        "ebpo eval: error: run/checkpoints/best/model/model.safetensors is damaged: 260232 bytes where "
        "run/checkpoints/best/manifest.json says 520464; the newest intact checkpoint is run/checkpoints/last "
        "(step 2): `ebpo eval run/checkpoints/last`"
    )
    assert main([*args, "run/checkpoints/last"]) == 0
    # a damaged trainer state does not keep a checkpoint's model from being evaluated
    _truncate(halfway / "checkpoints" / "last" / "trainer_state.pt")
    assert main([*args, "run/checkpoints/last/model"]) == 0


def test_a_damaged_checkpoint_copied_out_of_its_run_says_to_restore_it(halfway, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(halfway / "checkpoints" / "last", copy)
    _truncate(copy / "trainer_state.pt")
    with pytest.raises(DamagedFile, match=r"copy/trainer_state.pt is damaged: .*; restore it from a copy$"):
        checkpoint_module.verify_checkpoint(copy)


# ---------------------------------------------------------------------------------------------------
# checkpoints written without a manifest


def test_a_checkpoint_without_a_manifest_still_loads(halfway, straight):
    for name in ("last", "best"):  # as checkpoints written before they had manifests
        (halfway / "checkpoints" / name / MANIFEST).unlink()
    assert checkpoint_module.newest_intact(halfway) == (halfway / "checkpoints" / "last", 2)
    assert main(["train", "--resume", "run"]) == 0
    assert training_rows(halfway) == training_rows(straight)
    assert read_manifest(halfway / "checkpoints" / "last")["step"] == STEPS  # the new ones have one


def test_a_damaged_checkpoint_without_a_manifest_is_still_one_line(halfway, capsys):
    last = halfway / "checkpoints" / "last"
    (last / MANIFEST).unlink()
    _truncate(last / "model" / "model.safetensors")
    capsys.readouterr()
    assert main(["train", "--resume", "run"]) == 2
    line = _one_line(capsys, "ebpo train")
    assert line.startswith(
        "ebpo train: error: model.path: cannot load a causal LM from run/checkpoints/last/model: "
    ), line
    shutil.copy(halfway / "checkpoints" / "best" / "model" / "model.safetensors", last / "model")
    _truncate(last / "trainer_state.pt")
    assert main(["train", "--resume", "run"]) == 2
    assert re.fullmatch(
        r"ebpo train: error: run/checkpoints/last/trainer_state.pt is damaged and cannot be read \(.*\); "
        r"restore the checkpoint from a copy, or start over with --overwrite",
        _one_line(capsys, "ebpo train"),
    )


def test_write_and_verify_a_manifest_of_any_directory(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"abc")
    (tmp_path / "y.txt").write_text("hello")
    write_manifest(tmp_path, step=7)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    # sha256("abc"), the FIPS 180-2 test vector
    assert manifest["files"]["a/x.bin"] == {
        "size": 3,
        "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    }
    assert manifest["step"] == 7 and set(manifest["files"]) == {"a/x.bin", "y.txt"}
    (tmp_path / "y.txt").write_text("jello")  # same size
    verify_manifest(tmp_path, under="a")  # only a/ is checked
    with pytest.raises(DamagedFile, match=r"y.txt is damaged: its SHA-256 differs"):
        verify_manifest(tmp_path)
    assert verify_manifest(tmp_path / "a") is None  # no manifest there: nothing to check
    with pytest.raises(ConfigError):  # DamagedFile is a ConfigError: the commands' one-line errors
        verify_manifest(tmp_path)


# ---------------------------------------------------------------------------------------------------
# a trainer state that would run code when unpickled


def _forge(checkpoint, marker, *, shell: bool = False) -> None:
    """Replace ``checkpoint``'s trainer state by a pickle that would create ``marker``, and write its manifest
    again (as whoever forged it would: the manifest is a check against damage, not a signature)."""
    from helpers.payloads import write_payload

    write_payload(checkpoint / "trainer_state.pt", marker, shell=shell)
    if (checkpoint / MANIFEST).is_file():
        write_manifest(checkpoint, step=read_manifest(checkpoint)["step"])


@pytest.mark.parametrize("shell", [False, True], ids=["open", "os.system"])
def test_resume_refuses_a_trainer_state_that_would_run_code(halfway, capsys, shell):
    marker = halfway.parent / "created-by-the-pickle"
    _forge(halfway / "checkpoints" / "last", marker, shell=shell)
    capsys.readouterr()
    assert main(["train", "--resume", "run", "run.steps=5"]) == 2
    assert not marker.exists()
    named = "posix.system" if shell else "io.open"
    assert _one_line(capsys, "ebpo train") == (
        f"ebpo train: error: run/checkpoints/last/trainer_state.pt holds a pickle that would run code to load "
        f"({named}), and ebpo loads only tensors, numbers, strings, lists and dicts from a state file: it was "
        "left unread; restore the checkpoint from a copy, or start over with --overwrite"
    )
    # the Python API and the learning benchmark resume through the same loader
    with pytest.raises(DamagedFile, match=r"trainer_state\.pt holds a pickle that would run code"):
        Trainer(load_config(None, ["run.steps=5"], base=read_yaml("run/config.yaml")), resume="run")
    assert not marker.exists()


def test_eval_and_diagnose_never_run_the_trainer_state_they_look_at(halfway, capsys):
    # last's model is damaged; best (written without a manifest) holds a pickle: the search for the newest
    # intact checkpoint loads best's trainer state for its step, which must run nothing
    marker = halfway.parent / "created-by-the-pickle"
    _truncate(halfway / "checkpoints" / "last" / "model" / "model.safetensors")
    (halfway / "checkpoints" / "best" / MANIFEST).unlink()
    _forge(halfway / "checkpoints" / "best", marker)
    capsys.readouterr()
    args = ["eval", "--benchmarks", "arith", "--limit", "2", "--n", "1", "--ks", "1", "--maj-ks", "1"]
    assert main([*args, "--no-cache", "--out-dir", "out", "--quiet", "run/checkpoints/last"]) == 2
    assert _one_line(capsys, "ebpo eval").endswith("; run holds no intact checkpoint")
    assert main(["diagnose", "--model", "run/checkpoints/last", "--quiet"]) == 2
    assert _one_line(capsys, "ebpo diagnose").endswith("; run holds no intact checkpoint")
    assert main(["train", "--resume", "run/checkpoints/best"]) == 2
    assert "best/trainer_state.pt holds a pickle that would run code" in _one_line(capsys, "ebpo train")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------
# checkpoints of ebpo 0.1.0


def _as_written_by_0_1_0(checkpoint) -> None:
    """Rewrite ``checkpoint``'s trainer state as ebpo 0.1.0 wrote it: Python's RNG state as the tuple
    ``random.getstate()`` returns, NumPy's as ``np.random.get_state()`` (a uint32 array), no config."""
    import numpy as np

    path = checkpoint / "trainer_state.pt"
    state = torch.load(path, weights_only=True)
    version, internal, gauss = state["rng"]["python"]
    name, key, pos, has_gauss, cached = state["rng"]["numpy"]
    state["rng"]["python"] = (version, tuple(internal), gauss)
    state["rng"]["numpy"] = (name, key.numpy().astype(np.uint32), pos, has_gauss, cached)
    del state["config"]
    torch.save(state, path)
    write_manifest(checkpoint, step=state["step"])


def test_a_checkpoint_of_0_1_0_resumes_exactly(halfway, straight):
    # the format a real 0.1.0 checkpoint has (`ebpo train` of a51be93: NumPy's state needs numpy globals)
    last = halfway / "checkpoints" / "last"
    _as_written_by_0_1_0(last)
    with pytest.raises(Exception, match=r"numpy\._core\.multiarray\._reconstruct"):
        torch.load(last / "trainer_state.pt", weights_only=True)
    assert main(["train", "--resume", "run"]) == 0
    assert training_rows(halfway) == training_rows(straight)
    expected_params, resumed = final_params(straight), final_params(halfway)
    assert all(torch.equal(expected_params[name], resumed[name]) for name in expected_params)
    # what this release writes loads with torch's own weights_only=True, nothing allowed on top
    state = torch.load(last / "trainer_state.pt", weights_only=True)
    assert state["step"] == STEPS and isinstance(state["rng"]["numpy"][1], torch.Tensor)
