"""The benchmarks ``ebpo eval`` and the trainer's validation score on, once.

- The five evaluation sets of the paper: their names (:data:`PAPER_BENCHMARKS`), their public Hugging Face hub
  copies at pinned revisions (:data:`HUB_BENCHMARKS`), and :func:`load_benchmark`, which reads one from the hub
  or from our JSON Lines files in a folder the user names (``--data-dir``, ``$EBPO_DATA_DIR``).
- The benchmark registry (:class:`BenchmarkSpec`, :func:`get_benchmark`, :func:`register_benchmark`): those
  five sets, the generated ``arith`` test split and the ``gym:<dataset>[,<dataset>...]`` family, each with the
  reward that grades it and its default response budget.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebpo.data.loaders import DATA_DIR_ENV, benchmark_dir, load_jsonl, records_from_rows
from ebpo.data.records import Record
from ebpo.errors import first_line
from ebpo.registry import Registry

__all__ = [
    "ARITH_TEST_SEED",
    "ARITH_TEST_SIZE",
    "BENCHMARK_INSTRUCTION",
    "GYM_MAX_NEW_TOKENS",
    "GYM_TEST_SIZE",
    "HUB_BENCHMARKS",
    "PAPER_BENCHMARKS",
    "BenchmarkSpec",
    "BenchmarkUnavailableError",
    "HubBenchmark",
    "get_benchmark",
    "list_benchmarks",
    "load_benchmark",
    "load_hub_benchmark",
    "register_benchmark",
    "split_benchmarks",
]


PAPER_BENCHMARKS: tuple[str, ...] = ("aime24", "aime25", "amc23", "math500", "olympiadbench")
# The instruction every evaluation prompt ends with, after a newline (the usual one for boxed answers; our
# JSON Lines files carry it already, the hub copies get it appended).
BENCHMARK_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class HubBenchmark:
    """The public Hugging Face hub copy of one evaluation set: ``datasets.load_dataset(dataset, config,
    split=split, revision=revision)``, its rows mapped by loader schema ``schema``."""

    name: str
    dataset: str
    config: str | None
    split: str
    revision: str  # a commit of the dataset repository, so the rows cannot change under a result
    schema: str
    rows: int  # rows at that revision
    columns: str  # the copy's column layout (docs/evaluation.md)


HUB_BENCHMARKS: dict[str, HubBenchmark] = {
    hub.name: hub
    for hub in (
        HubBenchmark(
            "aime24", "math-ai/aime24", None, "test", "83a7f387baaa524a8bda0022eac0541582297103", "aime24", 30,
            "id (int), problem, solution (the bare answer as \\boxed{204}), url",
        ),
        HubBenchmark(
            "aime25", "math-ai/aime25", None, "test", "563bb8404243c5f09de6ec262f2db674fe5bce9b", "aime25", 30,
            "problem, answer, id (strings)",
        ),
        HubBenchmark(
            "amc23", "math-ai/amc23", None, "test", "80815d37005feb82cd7f8fbc6901d5d3eff43057", "amc23", 40,
            "id, question, answer (float), url",
        ),
        HubBenchmark(
            "math500", "HuggingFaceH4/MATH-500", None, "test", "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be",
            "math500", 500, "problem, solution, answer, subject, level (int), unique_id",
        ),
        HubBenchmark(
            "olympiadbench", "Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train",
            "91184b52131e7fc9455fef848035173aea8cc01a", "olympiadbench", 674,
            "id (int), question, final_answer (list), solution (list), subfield, answer_type, unit, ...",
        ),
    )
}  # fmt: skip


class BenchmarkUnavailableError(OSError):
    """Neither the hub copy of a benchmark nor a local file of it could be read; the message says which
    benchmark, which hub dataset, and the flag that names a local copy."""


def load_benchmark(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> list[Record]:
    """One of the five evaluation sets (:data:`PAPER_BENCHMARKS`) as records with ids ``"<name>-0000"``, each
    prompt ending with :data:`BENCHMARK_INSTRUCTION`.

    From ``<data_dir>/<name>.jsonl`` (our format: ``problem``, ``answer`` per line, the instruction
    included) when ``data_dir`` or ``$EBPO_DATA_DIR`` names a folder; else from the hub copy at its pinned
    revision (:func:`load_hub_benchmark`; ``cache_dir`` is ``datasets``' cache, default its own).
    """
    if name not in PAPER_BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; valid choices: {', '.join(PAPER_BENCHMARKS)}")
    folder = Path(data_dir).expanduser() if data_dir is not None else benchmark_dir()
    if folder is None:
        return load_hub_benchmark(name, cache_dir=cache_dir)
    path = folder / f"{name}.jsonl"
    if not path.is_file():
        hub = HUB_BENCHMARKS[name]
        raise BenchmarkUnavailableError(
            f"benchmark {name}: {path} not found; --data-dir (or ${DATA_DIR_ENV}) must name a folder holding "
            f"{name}.jsonl, or leave both unset to load {hub.dataset} from the Hugging Face hub"
        )
    return load_jsonl(path, "shared").records


def load_hub_benchmark(name: str, *, cache_dir: str | os.PathLike[str] | None = None) -> list[Record]:
    """The hub copy of ``name`` (:data:`HUB_BENCHMARKS`) at its pinned revision, cached by ``datasets``, as
    the same records as our JSON Lines file of it: ids ``"<name>-0000"`` by row (the copy's own id kept in
    ``extra["hub_id"]``), prompt = the copy's problem, a newline and :data:`BENCHMARK_INSTRUCTION`.

    Raises :class:`BenchmarkUnavailableError` (one line) when the copy cannot be read: no network and no
    cached copy, or an unreachable hub.
    """
    import datasets

    hub = HUB_BENCHMARKS[name]
    try:
        rows = datasets.load_dataset(
            hub.dataset,
            hub.config,
            split=hub.split,
            revision=hub.revision,
            cache_dir=None if cache_dir is None else str(cache_dir),
        )
    except Exception as err:  # datasets raises connection, HTTP, not-found and offline errors alike
        raise BenchmarkUnavailableError(
            f"benchmark {name}: cannot load {hub.dataset} ({_hub_label(hub)}) from the Hugging Face hub "
            f"({first_line(err)}); pass --data-dir DIR (or set ${DATA_DIR_ENV}) to a folder "
            f"holding {name}.jsonl (one JSON object with problem and answer per line)"
        ) from err
    mapped = records_from_rows(rows, hub.schema, source=name, file=f"{hub.dataset} ({_hub_label(hub)})")
    records = []
    for index, record in enumerate(mapped.records):
        record.extra = {**record.extra, "hub_id": record.id}
        record.id = f"{name}-{index:04d}"
        record.prompt = f"{record.prompt}\n{BENCHMARK_INSTRUCTION}"
        records.append(record)
    return records


def _hub_label(hub: HubBenchmark) -> str:
    config = f"config {hub.config}, " if hub.config else ""
    return f"{config}split {hub.split}, revision {hub.revision[:12]}"


# --- the benchmark registry ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchmarkSpec:
    """A named evaluation set: how to load its records and which reward grades it.

    ``load(data_dir=None)`` returns the records; ``data_dir`` names a folder of our JSON Lines files for
    the sets that have a public copy on the hub (:func:`load_benchmark`), and is ignored by generated sets
    (``arith``, ``gym:<datasets>``).
    """

    name: str
    load: Callable[..., list[Record]]
    reward: str
    max_new_tokens: int  # the CLI's default response budget for this set


_BENCHMARKS: Registry[BenchmarkSpec] = Registry("benchmark")


def register_benchmark(spec: BenchmarkSpec) -> BenchmarkSpec:
    """Add a benchmark to the registry (a second one with the same name raises)."""
    return _BENCHMARKS.register(spec.name, spec)


def list_benchmarks() -> list[str]:
    """Registered benchmark names and families (``gym:<dataset>[,<dataset>...]``), sorted."""
    return _BENCHMARKS.names(families=True)


def get_benchmark(name: str, **options: Any) -> BenchmarkSpec:
    """The benchmark registered as ``name``, or built by its family (``gym:<datasets>``) with ``options`` (the
    task's settings); an unknown name lists the valid ones."""
    return _BENCHMARKS.get(name, **options)


def _paper_loader(name: str) -> Callable[..., list[Record]]:
    def load(data_dir: str | Path | None = None) -> list[Record]:
        return list(load_benchmark(name, data_dir))

    return load


ARITH_TEST_SIZE = 450  # 10 problems per (topic, level) cell of the 9 x 5 grid
ARITH_TEST_SEED = 0

for _name in PAPER_BENCHMARKS:
    register_benchmark(BenchmarkSpec(_name, _paper_loader(_name), reward="math", max_new_tokens=4096))


def _load_arith_test(data_dir: str | Path | None = None) -> list[Record]:
    """The arith test split (generated; ``data_dir`` is not used)."""
    from ebpo.tasks import get_task

    return get_task("arith").generate("test", ARITH_TEST_SIZE, seed=ARITH_TEST_SEED)


register_benchmark(BenchmarkSpec("arith", _load_arith_test, reward="arith", max_new_tokens=16))

GYM_TEST_SIZE = 450
"""Problems of a ``gym:<datasets>`` benchmark: the first of its test split (seed 0), balanced over its cells."""
GYM_MAX_NEW_TOKENS = 64


def _gym_benchmark(datasets: str, **settings: Any) -> BenchmarkSpec:
    """``gym:<datasets>``: the test split of the gym task (``ebpo.tasks.gym``, with its settings), scored by the
    ``gym`` reward (the datasets' own ``score_answer``)."""
    from ebpo.tasks import get_task

    task = get_task(f"gym:{datasets}", **settings)

    def load(data_dir: str | Path | None = None) -> list[Record]:
        return task.generate("test", GYM_TEST_SIZE, seed=0)

    return BenchmarkSpec(task.name, load, reward=task.reward or "gym", max_new_tokens=GYM_MAX_NEW_TOKENS)


_BENCHMARKS.register_family("gym", _gym_benchmark, pattern="<dataset>[,<dataset>...]")


def split_benchmarks(text: str) -> list[str]:
    """The benchmark names of a comma-separated list. A family's argument may hold commas itself: a word that
    is neither a benchmark nor a family name continues the family name before it, so
    ``gym:chain_sum,gcd,arith`` is ``gym:chain_sum,gcd`` and ``arith``, and ``gym:chain_sum,gym:gcd`` two."""
    names: list[str] = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        continues = names and _BENCHMARKS.family_of(names[-1]) and word not in _BENCHMARKS and ":" not in word
        if continues:
            names[-1] = f"{names[-1]},{word}"
        else:
            names.append(word)
    return names
