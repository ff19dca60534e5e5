"""Settings from YAML files and dotted ``key=value`` overrides, as nested mappings
(``ebpo train --config grpo rollout.temperature=0.8``).

:func:`read_yaml` (a key repeated in one mapping is an error), :func:`parse_override` (``a.b=0.8``; the value
is YAML: ``true``, ``null``, ``[1, 2]``, ``{k: v}``), :func:`merge` (mappings, then overrides, the later
winning, keys renamed from earlier spellings first: :func:`rename_keys`). :func:`ebpo.settings.fields.build`
makes the result a dataclass instance. Imports the standard library (PyYAML when it reads).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ebpo.errors import ConfigError


def _unique_key_loader() -> Any:
    """A ``yaml.SafeLoader`` subclass that rejects a mapping holding the same key twice (PyYAML keeps the
    last one silently, so a preset that sets ``optim.lr`` twice would train with whichever came second)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in one mapping (lines {first_line[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); keep one",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line
        return loader.construct_mapping(node)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return UniqueKeyLoader


def parse_yaml(text: str) -> Any:
    """``text`` parsed as YAML with the safe loader, a key repeated within one mapping being an error
    (``yaml.YAMLError``)."""
    import yaml

    return yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file ``path``; a missing file, invalid YAML, a repeated key or a top level
    that is not a mapping raise ``ConfigError`` naming the file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        values = parse_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from err
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    return values


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"a.b=0.8"`` -> (["a", "b"], 0.8); the value is parsed as a YAML scalar or flow collection (an empty
    value is the empty string, which :func:`~ebpo.settings.fields.build` refuses naming the key)."""
    import yaml

    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value (e.g. algorithm.estimator=grpo)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key part (e.g. algorithm.estimator=grpo)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def merge_dicts(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, recursively where both hold a dict at the same key; a new mapping that
    shares nothing with either (neither is changed, now or when the result is)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_dicts(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def rename_keys(values: dict[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """``values`` with each dotted key ``old`` of ``renames`` moved to its new spelling (``{"a.x": "a.y"}``:
    ``{"a": {"x": {...}}}`` -> ``{"a": {"y": {...}}}``). Where one mapping holds both spellings, their
    contents merge; an option given under both is a ``ConfigError`` (it would be ambiguous which wins)."""
    out = copy.deepcopy(values)
    for old, new in renames.items():
        *old_parent, old_leaf = old.split(".")
        parent = _node(out, old_parent)
        if parent is None or old_leaf not in parent:
            continue
        moved = parent.pop(old_leaf)
        *new_parent, new_leaf = new.split(".")
        target = _node(out, new_parent, create=True)
        assert target is not None  # created
        if new_leaf not in target:
            target[new_leaf] = moved
            continue
        present = target[new_leaf]
        both = (
            sorted(set(moved) & set(present))
            if isinstance(moved, dict) and isinstance(present, dict)
            else [""]
        )
        if both:
            where = f".{both[0]}" if both[0] else ""
            raise ConfigError(f"{old}{where} and {new}{where} are one key given twice; keep {new}{where}")
        target[new_leaf] = {**present, **moved}
    return out


def _node(values: dict[str, Any], path: Sequence[str], *, create: bool = False) -> dict[str, Any] | None:
    """The mapping at ``path`` in ``values`` (made, replacing anything that is not a mapping, if ``create``)."""
    node = values
    for part in path:
        child = node.get(part)
        if not isinstance(child, dict):
            if not create:
                return None
            child = {}
            node[part] = child
        node = child
    return node


def apply_overrides(
    values: dict[str, Any], overrides: Sequence[str], renames: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Set each ``key=value`` of ``overrides`` in the nested mapping ``values``, in order (changed in place and
    returned). A key is renamed from its old spelling first (``renames``, as :func:`rename_keys`); a value
    replaces what was at its key, a mapping included (``algorithm.loss={clip_eps_high: 0.28}`` sets that one
    option, the others return to their defaults)."""
    renames = dict(renames or {})
    for item in overrides:
        path, value = parse_override(item)
        dotted = ".".join(path)
        for old, new in renames.items():
            if dotted == old or dotted.startswith(old + "."):
                path = new.split(".") + path[len(old.split(".")) :]
        if isinstance(value, dict):  # a mapping may hold old spellings below its key
            wrapped: dict[str, Any] = {}
            node = _node(wrapped, path[:-1], create=True)
            assert node is not None  # created
            node[path[-1]] = value
            value = _node(rename_keys(wrapped, renames), path[:-1])[path[-1]]  # type: ignore[index]
        node = _node(values, path[:-1], create=True)
        assert node is not None  # created
        node[path[-1]] = value
    return values


def merge(
    layers: Sequence[dict[str, Any]],
    overrides: Sequence[str] = (),
    renames: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The nested mappings of ``layers`` merged in order (a later one wins, mappings merging key by key),
    then ``overrides`` applied (:func:`apply_overrides`); each layer and override has its keys renamed from
    their old spellings (``renames``) before it is merged, so that the later one wins whichever spelling
    each uses."""
    values: dict[str, Any] = {}
    for layer in layers:
        values = merge_dicts(values, rename_keys(layer, renames or {}))  # a copy: the layers stay as they are
    return apply_overrides(values, overrides, renames)
