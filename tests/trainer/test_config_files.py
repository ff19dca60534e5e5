"""The presets shipped in src/ebpo/configs/: no key written twice, every file loads (by path and by name),
and all share the settings of ebpo.yaml."""

from __future__ import annotations

import pytest
import yaml

from ebpo.errors import ConfigError
from ebpo.settings import parse_yaml
from ebpo.trainer.config_files import PRESETS_DIR, list_presets, load_config, resolve_config

CONFIGS = PRESETS_DIR
PRESETS = sorted(CONFIGS.glob("*.yaml"))
TESTBED_PRESETS = {"gym"}
"""Presets of another testbed (a built-in model and its task): the algorithm of ebpo.yaml on other data."""
METHOD_PRESETS = [p for p in PRESETS if p.stem not in TESTBED_PRESETS]
# The sections every preset shares with ebpo.yaml (the paper compares methods under identical conditions);
# a preset changes only the algorithm and, for the clustered / curriculum variants, the sampler.
SHARED = {
    "data": ("task", "levels", "val_size", "train_size", "batch_size", "group_size"),
    "rollout": ("temperature", "top_p", "max_new_tokens"),
    "optim": ("lr", "epochs", "mini_batch_size", "grad_clip", "betas", "weight_decay", "warmup_steps"),
    "run": ("steps", "eval_every", "eval_n", "eval_k", "seed"),
    "model": ("path",),
}


def test_the_loader_rejects_duplicate_keys_at_any_depth():
    assert parse_yaml("a: 1\nb: {c: 2}\n") == {"a": 1, "b": {"c": 2}}
    # 'model' on lines 1 and 4 of the top-level mapping
    with pytest.raises(yaml.YAMLError, match=r"key 'model' appears twice in one mapping \(lines 1 and 4\)"):
        parse_yaml("model:\n  path: null\ndata: {}\nmodel:\n  path: x\n")
    # 'lr' on lines 2 and 3 inside 'optim'
    with pytest.raises(yaml.YAMLError, match=r"key 'lr' appears twice in one mapping \(lines 2 and 3\)"):
        parse_yaml("optim:\n  lr: 1\n  lr: 2\n")
    # the same key in two different mappings is fine
    assert parse_yaml("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}


def test_a_config_file_with_a_repeated_key_is_one_clear_error_naming_the_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("optim:\n  lr: 1.0e-4\ndata:\n  group_size: 4\noptim:\n  lr: 3.0e-4\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "'optim' appears twice" in message and "lines 1 and 5" in message


def test_there_are_presets():
    names = {p.name for p in PRESETS}
    assert {"ebpo.yaml", "grpo.yaml", "dapo.yaml", "dr_grpo.yaml"} <= names, names


def test_a_preset_is_found_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the names resolve inside the package
    assert list_presets() == sorted(p.stem for p in PRESETS)
    for name in list_presets():
        assert resolve_config(name) == resolve_config(f"{name}.yaml") == CONFIGS / f"{name}.yaml"
        assert load_config(name).to_dict() == load_config(CONFIGS / f"{name}.yaml").to_dict()
    assert load_config("grpo").algorithm.estimator == "grpo"
    (tmp_path / "grpo").write_text("algorithm: {estimator: rloo}\n")  # a file of that name wins
    assert load_config("grpo").algorithm.estimator == "rloo"
    with pytest.raises(ConfigError) as err:
        load_config("grpoo")
    assert (
        str(err.value)
        == f"--config grpoo: no such file and no preset of that name; presets: {', '.join(list_presets())}"
    )


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_preset_has_unique_keys_and_loads(path):
    values = parse_yaml(path.read_text())
    assert isinstance(values, dict) and values, path
    cfg = load_config(path)  # every key known, every value valid
    assert cfg.to_dict()["algorithm"]["estimator"]


@pytest.mark.parametrize("path", METHOD_PRESETS, ids=lambda p: p.name)
def test_every_preset_shares_data_batch_optimizer_and_steps_with_ebpo_yaml(path):
    reference = load_config(CONFIGS / "ebpo.yaml").to_dict()
    preset = load_config(path).to_dict()
    for section, keys in SHARED.items():
        for key in keys:
            assert preset[section][key] == reference[section][key], f"{path.name}: {section}.{key}"


def test_the_gym_preset_is_ebpo_yaml_on_s2_and_its_mixture():
    from ebpo.models.recipes.gym import MIXTURE, TASK

    reference, gym = load_config(CONFIGS / "ebpo.yaml").to_dict(), load_config("gym").to_dict()
    for section in ("algorithm", "optim", "rollout"):  # the paper's EBPO, as the demo runs it
        assert gym[section] == reference[section], section
    for key in ("batch_size", "group_size", "sampler", "levels", "train_size", "chat_template"):
        assert gym["data"][key] == reference["data"][key], key
    assert gym["run"] == reference["run"]
    assert gym["model"]["path"] == "builtin:gym"
    assert (gym["data"]["task"], gym["data"]["task_options"]) == (TASK, MIXTURE)  # S2's, written out
    assert gym["data"]["val_size"] == 480  # 24 cells x 20
