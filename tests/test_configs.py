"""The presets in configs/: no key written twice, every file loads, and all share the settings of ebpo.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ebpo.trainer.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PRESETS = sorted(CONFIGS.glob("*.yaml"))
# The sections every preset shares with ebpo.yaml (the paper compares methods under identical conditions);
# a preset changes only the algorithm and, for the clustered / curriculum variants, the sampler.
SHARED = {
    "data": ("task", "levels", "val_size", "train_size", "batch_size", "group_size"),
    "rollout": ("temperature", "top_p", "max_new_tokens"),
    "optim": ("lr", "epochs", "mini_batch_size", "grad_clip", "betas", "weight_decay", "warmup_steps"),
    "run": ("steps", "eval_every", "eval_n", "eval_k", "seed"),
    "model": ("path",),
}


class UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that rejects a mapping holding the same key twice (PyYAML keeps the last silently)."""


def _construct_unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def load_unique(text: str):
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def test_the_loader_rejects_duplicate_keys_at_any_depth():
    assert load_unique("a: 1\nb: {c: 2}\n") == {"a": 1, "b": {"c": 2}}
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'model'"):
        load_unique("model:\n  path: null\ndata: {}\nmodel:\n  path: x\n")
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'lr'"):
        load_unique("optim:\n  lr: 1\n  lr: 2\n")


def test_there_are_presets():
    names = {p.name for p in PRESETS}
    assert {"ebpo.yaml", "grpo.yaml", "dapo.yaml", "dr_grpo.yaml"} <= names, names


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_preset_has_unique_keys_and_loads(path):
    values = load_unique(path.read_text())
    assert isinstance(values, dict) and values, path
    cfg = load_config(path)  # every key known, every value valid
    assert cfg.to_dict()["algorithm"]["estimator"]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_preset_shares_data_batch_optimizer_and_steps_with_ebpo_yaml(path):
    reference = load_config(CONFIGS / "ebpo.yaml").to_dict()
    preset = load_config(path).to_dict()
    for section, keys in SHARED.items():
        for key in keys:
            assert preset[section][key] == reference[section][key], f"{path.name}: {section}.{key}"
