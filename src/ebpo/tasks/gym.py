"""``gym:<dataset>[,<dataset>...]``: reasoning-gym's procedural datasets as a task suite (the ``ebpo[gym]`` extra).

```python
task = get_task("gym:chain_sum,spell_backward", chain_sum={"max_terms": 3})
records = task.generate("train", 900, seed=0)   # topic = the dataset's name; level where the settings give levels
get_reward("gym")("<answer>7</answer>", records[0].answer)   # the dataset's own score_answer
```

A record keeps everything reasoning-gym's ``score_answer(answer, entry)`` needs in its ``answer``: the entry
written as canonical JSON, ``{"dataset", "answer", "metadata"}`` plus ``"config"`` (the generator settings that
differ from the dataset's defaults, for the few datasets whose scoring reads them). Every path that scores a
response hands a reward ``(completion, answer)`` strings (``ebpo train``, ``ebpo eval``, verl's
``reward_model.ground_truth``, TRL's dataset column), so the reward ``gym`` (``ebpo.rewards.gym``) decodes it and
calls the dataset's ``score_answer`` through every engine unchanged (docs/data.md says why this design).

Settings, per dataset (``get_task(name, **options)``: ``data.task_options`` in ``ebpo train``, ``--task-options``
in ``ebpo eval`` and ``ebpo diagnose``): the fields of the dataset's reasoning-gym config (``min_terms``,
``max_digits``, ...; not ``seed`` or ``size``, which the task sets), and ``levels``:

- a list of whole numbers ``[1, 2, 3]``: reasoning-gym's own curriculum levels 0, 1, 2 of the dataset (our levels
  count from 1, as ``arith``'s do), each level's problems only (the curriculum's ``upper_bound`` ranges), with the
  dataset's other settings on top;
- a mapping ``{1: {max_terms: 2}, 2: {max_terms: 3}}``: our own levels, each with its settings on top of the
  dataset's others.

Without ``levels`` a dataset is one cell whose records have no level. Records cycle over the (dataset, level)
cells, so any ``n`` is balanced over them (``topics`` / ``levels`` of ``generate`` pick a subset of the cells).

Splits are disjoint by the hash of the question text (``ebpo.tasks.splits``: ``sft`` / ``train`` /
``validation`` / ``test``, 60/20/10/10): every cell draws entries from reasoning-gym's generator, seeded from
(dataset, level, split, seed), and keeps those whose question hashes into the split asked for. Questions may
repeat inside a split (small settings allow few distinct questions), never across splits.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ebpo.data import Record
from ebpo.errors import ConfigError
from ebpo.tasks.base import Task
from ebpo.tasks.splits import SPLITS, check_split, split_of

INSTALL_HINT = "the gym tasks need reasoning-gym: pip install 'ebpo[gym]'"
LEVELS_KEY = "levels"
CHUNK = 100_000
"""Entries per generator instance: a cell draws indices 0..CHUNK-1 of one seeded instance, then a new seed."""
MAX_MISSES = 20_000
"""Draws in a row without a question of the split asked for before a cell gives up (settings too small)."""
EXCLUDED = {"composite": "its settings are other datasets: name them in gym:<dataset>,<dataset> instead"}


def reasoning_gym() -> Any:
    """The ``reasoning_gym`` module; without it a ``ConfigError`` (a ``ValueError``, which every command prints as
    one line) naming the extra."""
    try:
        import reasoning_gym
    except ImportError as err:
        raise ConfigError(INSTALL_HINT) from err
    return reasoning_gym


def dataset_classes(name: str) -> tuple[type, type]:
    """``(dataset class, config class)`` of the reasoning-gym dataset ``name``; an unknown name lists the valid ones."""
    from ebpo.registry import unknown_choice

    reasoning_gym()
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS or name in EXCLUDED:
        if name in EXCLUDED:
            raise ValueError(f"gym dataset {name!r} is not supported: {EXCLUDED[name]}")
        raise unknown_choice("gym dataset", name, [n for n in DATASETS if n not in EXCLUDED])
    return DATASETS[name]


def dataset_names() -> list[str]:
    """Every reasoning-gym dataset a gym task can name, sorted."""
    reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return sorted(n for n in DATASETS if n not in EXCLUDED)


def settable_fields(config_cls: type) -> list[str]:
    """The settings of a dataset's config a user may give: its dataclass fields but ``seed`` and ``size``."""
    return [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]


def changed_settings(config: Any) -> dict[str, Any]:
    """The fields of a reasoning-gym config that differ from its class's defaults (``seed`` and ``size`` aside),
    as JSON values: what a reward needs to rebuild the generator that scores its entries."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        if f.name in ("seed", "size"):
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        value = getattr(config, f.name)
        if value != default:
            out[f.name] = value
    return json.loads(json.dumps(out, default=_json_value))


def _json_value(value: Any) -> Any:
    """JSON for the values a reasoning-gym config or entry holds beyond JSON's own: enums, sets, tuples."""
    import enum

    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_entry(dataset: str, entry: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The entry as canonical JSON (sorted keys, no spaces): ``{"dataset", "answer", "metadata"}`` and, when
    ``config`` is not empty, ``"config"`` (the generator settings that differ from the defaults)."""
    payload: dict[str, Any] = {"dataset": dataset, "answer": entry["answer"], "metadata": entry["metadata"]}
    if config:
        payload["config"] = dict(config)
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_value)


@dataclass(frozen=True)
class Cell:
    """One (dataset, level) of a gym task and the reasoning-gym config that generates it."""

    dataset: str
    level: int | None
    config: Any
    """The dataset's reasoning-gym config (its ``seed`` and ``size`` set per chunk when drawing)."""

    @property
    def changed(self) -> dict[str, Any]:
        """The settings of its config that differ from the dataset's defaults (:func:`changed_settings`)."""
        return changed_settings(self.config)


def _check_keys(dataset: str, settings: Mapping[str, Any], valid: Sequence[str], where: str) -> None:
    bad = [key for key in settings if key not in valid]
    if bad:
        raise ValueError(
            f"gym dataset {dataset!r}{where}: unknown setting {bad[0]!r}; valid settings: {', '.join(sorted(valid))}"
        )


def _build_config(dataset: str, config_cls: type, settings: Mapping[str, Any], where: str) -> Any:
    """``config_cls(**settings)``, checked by its own ``validate``; a bad value is one ``ValueError`` line."""
    try:
        config = config_cls(**settings)
        if callable(getattr(config, "validate", None)):
            config.validate()
    except (AssertionError, TypeError, ValueError) as err:
        given = ", ".join(f"{k}={v!r}" for k, v in settings.items()) or "the defaults"
        raise ValueError(f"gym dataset {dataset!r}{where}: invalid settings ({given}): {err}") from None
    return config


def _level(value: Any, dataset: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"gym dataset {dataset!r}: levels are whole numbers >= 1, got {value!r}")
    return value


def _curriculum_config(dataset: str, level: int, settings: Mapping[str, Any]) -> Any:
    """The config of reasoning-gym's curriculum at global level ``level - 1`` (that level's ranges only), with
    ``settings`` on top."""
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
    from reasoning_gym.factory import create_curriculum, has_curriculum

    if not has_curriculum(dataset):
        raise ValueError(
            f"gym dataset {dataset!r} has no reasoning-gym curriculum, so levels must be a mapping of level -> "
            "settings ({1: {...}, 2: {...}})"
        )
    curriculum = create_curriculum(dataset)
    top = max(len(attribute.levels) for attribute in curriculum.attributes.values())
    if level > top:
        raise ValueError(f"gym dataset {dataset!r}: its curriculum has levels 1..{top}, got {level}")
    curriculum.set_global_level(level - 1)
    context = DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND)
    try:
        config = curriculum.generate_configuration(context=context)
        return dataclasses.replace(config, **settings)
    except (AssertionError, TypeError, ValueError) as err:
        raise ValueError(
            f"gym dataset {dataset!r}, level {level}: invalid curriculum settings: {err}"
        ) from None


def dataset_cells(dataset: str, settings: Mapping[str, Any] | None) -> list[Cell]:
    """The cells of one dataset under its settings (module docstring); a bad setting is one ``ValueError`` line."""
    _, config_cls = dataset_classes(dataset)
    settings = dict(settings or {})
    if not isinstance(settings, dict):
        raise ValueError(f"gym dataset {dataset!r}: settings must be a mapping, got {settings!r}")
    valid = settable_fields(config_cls)
    levels = settings.pop(LEVELS_KEY, None)
    _check_keys(dataset, settings, [*valid, LEVELS_KEY], "")
    if levels is None:
        return [Cell(dataset, None, _build_config(dataset, config_cls, settings, ""))]
    if isinstance(levels, Mapping) and levels:
        cells = []
        for key, extra in levels.items():
            level = _level(key, dataset)
            where = f", level {level}"
            if not isinstance(extra, Mapping):
                raise ValueError(f"gym dataset {dataset!r}{where}: settings must be a mapping, got {extra!r}")
            _check_keys(dataset, extra, valid, where)
            cells.append(
                Cell(dataset, level, _build_config(dataset, config_cls, {**settings, **extra}, where))
            )
        return sorted(cells, key=lambda cell: cell.level or 0)
    if isinstance(levels, list) and levels:
        chosen = sorted({_level(value, dataset) for value in levels})
        cells = []
        for level in chosen:
            config = _curriculum_config(dataset, level, settings)
            cells.append(
                Cell(dataset, level, _build_config(dataset, config_cls, _fields(config), f", level {level}"))
            )
        return cells
    raise ValueError(
        f"gym dataset {dataset!r}: levels must be a non-empty list of curriculum levels ([1, 2]) or a mapping of "
        f"level -> settings ({{1: {{...}}}}), got {levels!r}"
    )


def _fields(config: Any) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def parse_datasets(names: str) -> list[str]:
    """``"chain_sum,gcd"`` -> ``["chain_sum", "gcd"]``, each a reasoning-gym dataset, none twice."""
    datasets = [name.strip() for name in names.split(",")]
    if not names.strip() or not all(datasets):
        raise ValueError(
            f"gym task {names!r}: name datasets as gym:<dataset>[,<dataset>...], e.g. gym:chain_sum,spell_backward"
        )
    repeated = sorted({name for name in datasets if datasets.count(name) > 1})
    if repeated:
        raise ValueError(f"gym task: dataset {repeated[0]!r} named twice in gym:{names}")
    for name in datasets:
        dataset_classes(name)
    return datasets


class GymSuite:
    """The cells of ``gym:<datasets>`` under their settings, and the generator of their records."""

    def __init__(self, names: str, settings: Mapping[str, Any] | None = None) -> None:
        self.datasets = parse_datasets(names)
        settings = dict(settings or {})
        stray = [key for key in settings if key not in self.datasets]
        if stray:
            raise ValueError(
                f"gym settings name dataset {stray[0]!r}, which gym:{names} does not hold; give settings for "
                f"{', '.join(self.datasets)}"
            )
        self.cells = [cell for name in self.datasets for cell in dataset_cells(name, settings.get(name))]
        self.levels = sorted({cell.level for cell in self.cells if cell.level is not None})

    def select(self, topics: Iterable[str] | None, levels: Iterable[int] | None) -> list[Cell]:
        """The cells of the chosen datasets (``topics``) and levels; an unknown one lists the valid ones."""
        cells = self.cells
        if topics is not None:
            chosen = list(topics)
            bad = [t for t in chosen if t not in self.datasets]
            if bad or not chosen:
                raise ValueError(f"unknown gym topics {bad or chosen!r}; valid: {', '.join(self.datasets)}")
            cells = [cell for cell in cells if cell.dataset in chosen]
        if levels is not None:
            wanted = list(levels)
            missing = [lv for lv in wanted if lv not in self.levels]
            if missing or not wanted:
                valid = ", ".join(map(str, self.levels)) or "none (give a dataset levels in its settings)"
                raise ValueError(f"unknown gym levels {missing or wanted!r}; valid: {valid}")
            cells = [cell for cell in cells if cell.level in wanted]
        if not cells:
            raise ValueError(
                "no gym dataset has the levels asked for; valid: " + ", ".join(map(str, self.levels))
            )
        return cells

    def generate(
        self,
        split: str,
        n: int,
        seed: int = 0,
        *,
        topics: Iterable[str] | None = None,
        levels: Iterable[int] | None = None,
    ) -> list[Record]:
        """``n`` records of ``split``, deterministic in ``seed``: record ``i`` from cell ``i % len(cells)``."""
        split = check_split(split, "gym")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        cells = self.select(topics, levels)
        streams = [_entries(cell, split, seed) for cell in cells]
        changed = [cell.changed for cell in cells]
        records = []
        for i in range(n):
            cell, stream = cells[i % len(cells)], streams[i % len(cells)]
            entry, where = next(stream)
            records.append(
                Record(
                    id=f"gym-{split}-{seed}-{i:06d}",
                    prompt=entry["question"],
                    answer=encode_entry(cell.dataset, entry, changed[i % len(cells)]),
                    topic=cell.dataset,
                    source="gym",
                    level=cell.level,
                    extra={"gym_seed": where[0], "gym_index": where[1]},
                )
            )
        return records


def chunk_seed(cell: Cell, split: str, seed: int, chunk: int) -> int:
    """The reasoning-gym seed of a cell's ``chunk``-th generator instance: 32 bits of SHA-256 over its names, so
    cells, splits and seeds draw unrelated streams (consecutive integer seeds would share entries: reasoning-gym
    seeds entry ``i`` with ``seed + i``)."""
    text = f"gym/{cell.dataset}/{cell.level}/{split}/{seed}/{chunk}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def _entries(cell: Cell, split: str, seed: int) -> Iterator[tuple[dict[str, Any], tuple[int, int]]]:
    """The cell's entries whose question hashes into ``split``, with (generator seed, index) of each."""
    dataset_cls, _ = dataset_classes(cell.dataset)
    misses = 0
    checked = False
    for chunk in itertools.count():
        generator_seed = chunk_seed(cell, split, seed, chunk)
        dataset = dataset_cls(config=dataclasses.replace(cell.config, seed=generator_seed, size=CHUNK))
        for index in range(CHUNK):
            entry = dataset[index]
            if split_of(entry["question"]) != split:
                misses += 1
                if misses >= MAX_MISSES:
                    raise ValueError(
                        f"gym dataset {cell.dataset!r}"
                        + (f", level {cell.level}" if cell.level is not None else "")
                        + f": no {split} question in {MAX_MISSES} draws; its settings allow too few distinct "
                        "questions for the split: widen them"
                    )
                continue
            misses = 0
            if not checked:  # once per cell: the entry scores the same after its JSON round trip
                check_round_trip(cell, dataset, entry)
                checked = True
            yield entry, (generator_seed, index)


def check_round_trip(cell: Cell, dataset: Any, entry: Mapping[str, Any]) -> None:
    """``score_answer`` of the gold answer is the same on the entry and on its JSON (what the reward reads):
    a dataset whose metadata JSON cannot carry (tuples its scorer compares) is refused in one line."""
    decoded = decode_entry(encode_entry(cell.dataset, entry, cell.changed))
    if dataset.score_answer(entry["answer"], decoded) != dataset.score_answer(entry["answer"], entry):
        raise ValueError(
            f"gym dataset {cell.dataset!r} is not supported: its entries do not score the same after a JSON round "
            "trip (the reward reads the entry from the record's answer as JSON)"
        )


# --- verification: the dataset's own score_answer ------------------------------------------------------

FULL_CREDIT = 1.0 - 1e-9
"""A score at or above this is full credit (``score_answer`` returns 1.0 for a right answer)."""


def decode_entry(answer: str) -> dict[str, Any]:
    """The reasoning-gym entry a gym record's ``answer`` holds; anything else is one ``ValueError`` line."""
    try:
        entry = json.loads(answer)
    except (TypeError, json.JSONDecodeError):
        entry = None
    if not isinstance(entry, dict) or not {"dataset", "answer", "metadata"} <= set(entry):
        shown = answer if len(str(answer)) <= 80 else f"{str(answer)[:77]}..."
        raise ValueError(
            f"gym reward: the gold answer {shown!r} is not a gym entry (JSON with dataset, answer, metadata); "
            "score gym:<dataset> records with it (ebpo.tasks.gym)"
        )
    return entry


@functools.lru_cache(maxsize=256)
def scorer(dataset: str, config_json: str) -> Any:
    """The reasoning-gym generator whose ``score_answer`` scores ``dataset``'s entries made with those settings."""
    dataset_cls, config_cls = dataset_classes(dataset)
    try:
        return dataset_cls(config=config_cls(**json.loads(config_json), seed=0, size=1))
    except (AssertionError, TypeError, ValueError) as err:
        raise ValueError(
            f"gym reward: the gold answer's {dataset} settings {config_json} are not valid: {err}"
        ) from None


def extract_answer(completion: str) -> str | None:
    """reasoning-gym's own extraction (``reasoning_gym.utils.extract_answer``): the stripped text of the last
    ``<answer>...</answer>`` pair, else None."""
    reasoning_gym()
    from reasoning_gym.utils import extract_answer as gym_extract

    return gym_extract(completion, tag_name="answer", strip=True)


class Scored(NamedTuple):
    """What the verifier made of one completion."""

    score: float
    """The dataset's ``score_answer`` (in [0, 1]; 0 when it raised)."""
    extracted: str | None
    """The answer it scored (:func:`extract_answer`), None when the completion has no ``<answer>`` pair."""
    scorer_failed: bool
    """``score_answer`` raised on what the completion gave (scored 0)."""


def score(completion: str, answer: str) -> Scored:
    """The dataset's ``score_answer(extracted, entry)`` of the completion's answer, for the entry the gym record's
    ``answer`` holds, from a generator with the entry's settings. A bad gold answer raises ``ValueError``; a
    scorer that raises on what the completion gave scores 0."""
    entry = decode_entry(answer)
    dataset = scorer(entry["dataset"], json.dumps(entry.get("config", {}), sort_keys=True))
    extracted = extract_answer(completion)
    try:
        value = float(dataset.score_answer(extracted, entry))
    except Exception:  # noqa: BLE001 - a scorer that chokes on what a model wrote: that answer is wrong
        return Scored(0.0, extracted, True)
    return Scored(value if math.isfinite(value) else 0.0, extracted, False)


def verify(completion: str, answer: str) -> float:
    """1.0 when the dataset's ``score_answer`` gives the completion's answer full credit, else 0.0."""
    return 1.0 if score(completion, answer).score >= FULL_CREDIT else 0.0


def make_task(names: str, **settings: Any) -> Task:
    """The :class:`ebpo.tasks.Task` ``gym:<names>`` with per-dataset ``settings`` (the ``gym`` task family)."""
    suite = GymSuite(names, settings)
    return Task(
        name=f"gym:{','.join(suite.datasets)}",
        generate=suite.generate,
        verify=verify,
        topics=tuple(suite.datasets),
        levels=tuple(suite.levels),
        splits=tuple(SPLITS),
        reward="gym",
    )
