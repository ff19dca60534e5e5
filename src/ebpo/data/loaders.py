"""Read problems into :class:`~ebpo.data.records.Record`: JSON Lines, Parquet and Hugging Face hub datasets.

Every source goes through one mapping function, :func:`records_from_rows`, which applies a named **schema**
(how a row's columns become a record's fields; docs/design.md §6):

| schema | columns read | notes |
|---|---|---|
| ``shared`` | ``problem``, ``answer`` | our benchmark JSON Lines files (``--data-dir``, ``$EBPO_DATA_DIR``) |
| ``math500`` | ``problem``, ``answer``, ``subject``, ``level``, ``unique_id`` | ``subject`` -> ``topic`` |
| ``aime24``, ``aime25`` | ``problem``, ``answer`` (else the ``\\boxed{}`` of ``solution``), ``id`` | numbers become text |
| ``amc23`` | ``question``, ``answer`` (a float in the hub copy), ``id`` | ``27.0`` becomes ``"27"`` |
| ``olympiadbench`` | ``question``, ``final_answer`` (list), ``id`` | several answers joined with ``","`` |
| ``dapo_math_17k`` | ``prompt`` (chat messages), ``reward_model.ground_truth``, ``data_source`` | de-duplicated by prompt text |
| ``records`` | ``Record.to_dict()`` rows | our own format (``write_records``) |

A row that does not fit raises :class:`RowError` naming the file, the line (JSONL, 1-based, as an editor
shows it) or row (Parquet / hub, 0-based) and the field; with ``skip_invalid=True`` such rows are skipped,
counted in :class:`LoadResult` and logged. Bad rows include invalid JSON or UTF-8, a missing or empty field,
a prompt that is not a string, and a repeated record id (named with the position of its first use). Record
ids are taken from the row when it has one (``id``, ``unique_id``), else ``"<source>-<row>"``; DAPO ids are
a hash of the prompt text (stable under de-duplication). Ids are unique within a source: evaluation caches,
annotation resumes and training logs match results to records by id.

The five evaluation sets (:func:`load_benchmark`) come from the Hugging Face hub at pinned revisions
(:data:`HUB_BENCHMARKS`), or from our JSON Lines files in a folder the user names.

Heavy imports (``pyarrow``, ``datasets``) happen inside the functions that need them.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from ebpo.data.prompts import apply_chat_template  # re-exported: where the chat template is applied
from ebpo.data.records import Record
from ebpo.persist import write_bytes_atomic, write_text_atomic
from ebpo.registry import Registry

logger = logging.getLogger(__name__)

__all__ = [
    "BENCHMARKS",
    "BENCHMARK_INSTRUCTION",
    "DATA_DIR_ENV",
    "HUB_BENCHMARKS",
    "BenchmarkUnavailableError",
    "HubBenchmark",
    "LoadResult",
    "RowError",
    "Schema",
    "apply_chat_template",
    "benchmark_dir",
    "get_schema",
    "list_schemas",
    "load_benchmark",
    "load_hub",
    "load_hub_benchmark",
    "load_jsonl",
    "load_parquet",
    "load_records",
    "read_records",
    "records_from_rows",
    "register_schema",
    "write_jsonl",
    "write_parquet",
    "write_records",
]


class RowError(ValueError):
    """A row that does not fit its schema; the message names the file, line or row, and field."""

    def __init__(self, message: str, *, source: str = "", position: str = "", field: str | None = None):
        self.source, self.position, self.field, self.reason = source, position, field, message
        where = ", ".join(p for p in (source, position, f"field {field!r}" if field else "") if p)
        super().__init__(f"{where}: {message}" if where else message)


class _FieldError(ValueError):
    """Raised by a schema's mapping; :func:`records_from_rows` adds the file and position."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"field {field!r}: {message}")


# -- schemas ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schema:
    """How one row becomes a record.

    ``to_record(row, index, source)`` returns a :class:`Record` or raises ``_FieldError``; ``dedupe_by_prompt``
    keeps only the first row of each prompt text.
    """

    name: str
    to_record: Callable[[Mapping[str, Any], int, str], Record]
    description: str
    dedupe_by_prompt: bool = False


_SCHEMAS: Registry[Schema] = Registry("schema")


def register_schema(
    name: str, description: str, *, dedupe_by_prompt: bool = False
) -> Callable[
    [Callable[[Mapping[str, Any], int, str], Record]], Callable[[Mapping[str, Any], int, str], Record]
]:
    """Decorator: register ``to_record(row, index, source) -> Record`` as schema ``name``."""

    def decorate(
        fn: Callable[[Mapping[str, Any], int, str], Record],
    ) -> Callable[[Mapping[str, Any], int, str], Record]:
        _SCHEMAS.register(name, Schema(name, fn, description, dedupe_by_prompt))
        return fn

    return decorate


def list_schemas() -> list[str]:
    """Registered schema names, sorted."""
    return _SCHEMAS.names()


def get_schema(name: str | Schema) -> Schema:
    """A schema by name; unknown names raise ``ValueError`` listing the valid ones."""
    if isinstance(name, Schema):
        return name
    return _SCHEMAS.get(name)


@overload
def _text(
    row: Mapping[str, Any], name: str, *, required: Literal[True] = True, numbers: bool = True
) -> str: ...
@overload
def _text(row: Mapping[str, Any], name: str, *, required: bool, numbers: bool = True) -> str | None: ...
def _text(row: Mapping[str, Any], name: str, *, required: bool = True, numbers: bool = True) -> str | None:
    """A non-empty string column. With ``numbers`` (answers, ids: AIME answers are often ints) a number is
    converted to its text (an integral float without its ``.0``); prompts and labels (``numbers=False``) must be strings, so a shifted column or a
    stray number fails here, naming the row, instead of later inside the tokenizer."""
    if name not in row or row[name] is None:
        if required:
            raise _FieldError(name, "missing")
        return None
    value = row[name]
    allowed = (str, int, float) if numbers else (str,)
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise _FieldError(name, f"expected a string, got {type(value).__name__}")
    if isinstance(value, float) and value.is_integer():  # AMC 2023's hub copy stores 27 as 27.0
        value = int(value)
    text = value if isinstance(value, str) else str(value)
    if required and not text.strip():
        raise _FieldError(name, "empty")
    return text


def _row_id(row: Mapping[str, Any], index: int, source: str, *keys: str) -> str:
    for key in keys:
        if row.get(key) not in (None, ""):
            return str(row[key])
    return f"{source}-{index:04d}"


def _level(row: Mapping[str, Any], name: str = "level") -> int | None:
    value = row.get(name)
    if value in (None, ""):
        return None
    if isinstance(value, str):  # "Level 3" in the original MATH release
        value = value.rsplit(" ", 1)[-1]
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _FieldError(name, f"expected an integer level, got {value!r}") from None


@register_schema("shared", "our benchmark JSON Lines files (--data-dir): problem, answer")
def _shared(row: Mapping[str, Any], index: int, source: str) -> Record:
    return Record(
        id=_row_id(row, index, source, "id"),
        prompt=_text(row, "problem", numbers=False),
        answer=_text(row, "answer"),
        source=source,
    )


@register_schema("math500", "MATH-500 (HuggingFaceH4/MATH-500): problem, answer, subject, level, unique_id")
def _math500(row: Mapping[str, Any], index: int, source: str) -> Record:
    return Record(
        id=_row_id(row, index, source, "unique_id", "id"),
        prompt=_text(row, "problem", numbers=False),
        answer=_text(row, "answer"),
        topic=_text(row, "subject", required=False, numbers=False),
        level=_level(row),
        source=source,
    )


_BOXED_ONLY_RE = re.compile(r"\s*\\boxed\s*\{(.*)\}\s*", re.DOTALL)  # the whole field is one \boxed{...}


def _aime(row: Mapping[str, Any], index: int, source: str) -> Record:
    """``answer`` (int or string), else ``solution`` when it is one ``\\boxed{...}``: math-ai/aime24 has no
    ``answer`` column and stores the bare answer as ``\\boxed{204}`` there (a worked solution is refused)."""
    if row.get("answer") is None and isinstance(row.get("solution"), str):
        boxed = _BOXED_ONLY_RE.fullmatch(row["solution"])
        if boxed is None or not boxed.group(1).strip():
            raise _FieldError("solution", "no answer column and no \\boxed{...} answer in the solution")
        answer = boxed.group(1).strip()
    else:
        answer = _text(row, "answer")
    return Record(
        id=_row_id(row, index, source, "id", "ID"),
        prompt=_text(row, "problem", numbers=False),
        answer=answer,
        source=source,
    )


register_schema(
    "aime24", "AIME hub copies: problem, answer (int or string; else the \\boxed{} of solution), optional id"
)(_aime)
register_schema("aime25", "AIME 2025 (math-ai/aime25): problem, answer, id; the same mapping as aime24")(
    _aime
)


@register_schema("amc23", "AMC 2023 (math-ai/amc23): question, answer (a float: 27.0 -> '27'), optional id")
def _amc23(row: Mapping[str, Any], index: int, source: str) -> Record:
    return Record(
        id=_row_id(row, index, source, "id"),
        prompt=_text(row, "question", numbers=False),
        answer=_text(row, "answer"),
        source=source,
    )


@register_schema("olympiadbench", "OlympiadBench: question, final_answer (list of strings), optional id")
def _olympiadbench(row: Mapping[str, Any], index: int, source: str) -> Record:
    answers = row.get("final_answer")
    if answers is None:
        raise _FieldError("final_answer", "missing")
    if isinstance(answers, str):
        answers = [answers]
    answers = [a for a in list(answers) if isinstance(a, str) and a.strip()]
    if not answers:
        raise _FieldError("final_answer", "expected a non-empty list of strings")
    extra = {k: row[k] for k in ("subfield", "answer_type", "unit") if row.get(k) not in (None, "")}
    return Record(
        id=_row_id(row, index, source, "id"),
        prompt=_text(row, "question", numbers=False),
        answer=",".join(answers),
        source=source,
        extra=extra,
    )


@register_schema(
    "dapo_math_17k",
    "DAPO-Math-17k: prompt (chat messages), reward_model.ground_truth, data_source; de-duplicated by prompt",
    dedupe_by_prompt=True,
)
def _dapo_math_17k(row: Mapping[str, Any], index: int, source: str) -> Record:
    messages = row.get("prompt")
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not isinstance(messages, list | tuple) or not messages:
        raise _FieldError("prompt", "expected a non-empty list of chat messages")
    users = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users or not isinstance(users[-1].get("content"), str) or not users[-1]["content"].strip():
        raise _FieldError("prompt", "no user message with text content")
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, Mapping):
        raise _FieldError("reward_model", "missing or not a mapping")
    try:
        answer = _text(reward_model, "ground_truth")
    except _FieldError as err:
        raise _FieldError("reward_model.ground_truth", err.message) from None
    prompt = users[-1]["content"]
    return Record(
        id=f"dapo-{hashlib.sha1(prompt.encode()).hexdigest()[:12]}",
        prompt=prompt,
        answer=answer,
        source=_text(row, "data_source", required=False) or source,
        extra={"messages": [dict(m) for m in messages]},
    )


@register_schema("records", "our own format: Record.to_dict() rows (id, prompt, answer, topic, ...)")
def _records(row: Mapping[str, Any], index: int, source: str) -> Record:
    record_id, answer = _text(row, "id"), _text(row, "answer")
    _text(row, "prompt", numbers=False)
    for name in ("topic", "source"):
        _text(row, name, required=False, numbers=False)
    record = Record.from_dict({k: v for k, v in row.items() if v is not None or k == "extra"})
    record.id, record.answer = record_id, answer
    if record.difficulty is not None and not isinstance(record.difficulty, int | float):
        raise _FieldError("difficulty", f"expected a number, got {record.difficulty!r}")
    if record.level is not None:
        record.level = _level(row)
    if isinstance(record.extra, str):  # write_records stores ``extra`` as JSON text in Parquet
        try:
            record.extra = json.loads(record.extra)
        except json.JSONDecodeError:
            raise _FieldError("extra", "not valid JSON") from None
    if record.extra is None:
        record.extra = {}
    if not isinstance(record.extra, dict):
        raise _FieldError("extra", f"expected an object, got {type(record.extra).__name__}")
    return record


# -- the one mapping function ------------------------------------------------------------------------


@dataclass
class LoadResult:
    """Records read from one source, and the rows that were skipped (``skip_invalid=True``)."""

    records: list[Record]
    skipped: list[RowError] = field(default_factory=list)
    duplicates: int = 0  # rows dropped by de-duplication (DAPO)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)


def records_from_rows(
    rows: Iterable[Mapping[str, Any]],
    schema: str | Schema,
    *,
    source: str,
    file: str = "",
    skip_invalid: bool = False,
) -> LoadResult:
    """Map rows (dicts) to records with ``schema``: the single path of every reader (JSONL, Parquet, hub).

    Args:
        rows: mappings, e.g. parsed JSON lines, ``pyarrow`` rows or a ``datasets.Dataset``.
        schema: a schema name (:func:`list_schemas`) or :class:`Schema`.
        source: the dataset name written into ``Record.source`` and into default ids.
        file: what to call the input in error messages (a path or a hub name); rows are "row N", 0-based.
        skip_invalid: skip rows that do not fit and count them, instead of raising :class:`RowError`.
    """
    numbered = ((f"row {i}", i, row) for i, row in enumerate(rows))
    return _map_rows(numbered, get_schema(schema), source=source, file=file, skip_invalid=skip_invalid)


def _map_rows(
    numbered: Iterable[tuple[str, int, Any]], spec: Schema, *, source: str, file: str, skip_invalid: bool
) -> LoadResult:
    """``numbered`` yields ``(position for messages, row index for default ids, row or RowError)``.

    Record ids must be unique within a source (two rows sharing one would be merged wherever results are
    matched to records by id, e.g. one group and one baseline for two prompts in training). A repeated id is
    a bad row naming both positions (with ``skip_invalid``, the first is kept and the repeat skipped).
    """
    result = LoadResult(records=[])
    seen_prompts: set[str] = set()
    first_position: dict[str, str] = {}  # record id -> where it was first used
    for where, index, row in numbered:
        try:
            if isinstance(row, RowError):  # the reader could not decode this row
                raise row
            if not isinstance(row, Mapping):
                raise RowError(f"expected an object, got {type(row).__name__}", source=file, position=where)
            record = spec.to_record(row, index, source)
            if spec.dedupe_by_prompt and record.prompt in seen_prompts:
                result.duplicates += 1
                continue
            if record.id in first_position:
                first = ", ".join(p for p in (file, first_position[record.id]) if p)
                raise _FieldError(
                    "id",
                    f"duplicate id {record.id!r}, first used at {first}; ids must be unique (results are "
                    f"matched to records by id): give one of the rows another id, or drop the id column to "
                    f"number the rows",
                )
        except _FieldError as err:
            error = RowError(err.message, source=file, position=where, field=err.field)
            if not skip_invalid:
                raise error from None
            result.skipped.append(error)
            continue
        except RowError as error:
            if not skip_invalid:
                raise
            result.skipped.append(error)
            continue
        if spec.dedupe_by_prompt:
            seen_prompts.add(record.prompt)
        first_position[record.id] = where
        result.records.append(record)
    if result.skipped:
        logger.warning(
            "%s: skipped %d invalid row(s); first: %s", file or source, result.num_skipped, result.skipped[0]
        )
    return result


# -- readers -----------------------------------------------------------------------------------------


def _numbered_jsonl(path: Path) -> Iterator[tuple[str, int, Any]]:
    """``("line N", row index, parsed row or RowError)`` for each non-blank line (N is 1-based).

    The file is read as bytes and each line decoded on its own, so a byte that is not UTF-8 is a bad row
    naming its line (skippable), not an error for the whole file; a leading UTF-8 byte-order mark is dropped.
    """
    index = 0
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            if not raw.strip():
                continue
            where = f"line {line_no}"
            row: Any
            try:
                # without its line break: a row cut short is then an error at its own end, not at
                # "line 2, column 1" of the text after it
                row = json.loads(raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as err:
                row = RowError(
                    f"not valid UTF-8 (byte 0x{raw[err.start]:02x} at byte {err.start + 1}); re-save the "
                    f"file as UTF-8",
                    source=str(path),
                    position=where,
                )
            except json.JSONDecodeError as err:
                row = RowError(
                    f"invalid JSON ({err.msg} at column {err.colno})", source=str(path), position=where
                )
            yield where, index, row
            index += 1


def _source_name(path: Path) -> str:
    return path.name.split(".")[0]


def load_jsonl(
    path: str | os.PathLike[str],
    schema: str | Schema = "shared",
    *,
    source: str | None = None,
    skip_invalid: bool = False,
) -> LoadResult:
    """Read a JSON Lines file (blank lines ignored); errors name the 1-based line number."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such JSONL file: {path}")
    return _map_rows(
        _numbered_jsonl(path),
        get_schema(schema),
        source=source or _source_name(path),
        file=str(path),
        skip_invalid=skip_invalid,
    )


def load_parquet(
    path: str | os.PathLike[str],
    schema: str | Schema = "shared",
    *,
    source: str | None = None,
    skip_invalid: bool = False,
) -> LoadResult:
    """Read a Parquet file with pyarrow; errors name the 0-based row."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such Parquet file: {path}")
    rows = pq.read_table(path).to_pylist()
    return records_from_rows(
        rows, schema, source=source or _source_name(path), file=str(path), skip_invalid=skip_invalid
    )


def load_hub(
    name: str,
    schema: str | Schema,
    *,
    split: str = "train",
    config: str | None = None,
    source: str | None = None,
    skip_invalid: bool = False,
    **load_kwargs: Any,
) -> LoadResult:
    """Load a Hugging Face hub dataset (``datasets.load_dataset(name, config, split=split)``) or a
    directory written by ``Dataset.save_to_disk``; rows go through :func:`records_from_rows`."""
    import datasets

    if Path(name).is_dir():
        dataset = datasets.load_from_disk(name)
        if isinstance(dataset, datasets.DatasetDict):
            dataset = dataset[split]
    else:
        dataset = datasets.load_dataset(name, config, split=split, **load_kwargs)
    label = f"{name}[{split}]"
    return records_from_rows(
        dataset,
        schema,
        source=source or name.rstrip("/").split("/")[-1],
        file=label,
        skip_invalid=skip_invalid,
    )


# format -> reader, chosen by file suffix
_READERS: dict[str, Callable[..., LoadResult]] = {
    ".jsonl": load_jsonl,
    ".json": load_jsonl,
    ".parquet": load_parquet,
}
HUB_PREFIX = "hf://"


def read_records(
    source: str | os.PathLike[str],
    schema: str | Schema = "shared",
    *,
    skip_invalid: bool = False,
    split: str = "train",
    name: str | None = None,
) -> LoadResult:
    """Read records from ``*.jsonl`` / ``*.json`` (JSON Lines), ``*.parquet``, a ``save_to_disk`` directory,
    or ``hf://owner/dataset`` (hub); returns the records and the skipped rows."""
    text = str(source)
    if text.startswith(HUB_PREFIX):
        return load_hub(text[len(HUB_PREFIX) :], schema, split=split, source=name, skip_invalid=skip_invalid)
    path = Path(text)
    if path.is_dir():
        return load_hub(text, schema, split=split, source=name, skip_invalid=skip_invalid)
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(
            f"{path}: unknown file type {path.suffix!r}; valid: {', '.join(_READERS)}, a save_to_disk "
            f"directory, or {HUB_PREFIX}<dataset>"
        )
    return reader(path, schema, source=name, skip_invalid=skip_invalid)


def load_records(
    source: str | os.PathLike[str],
    schema: str | Schema = "shared",
    *,
    skip_invalid: bool = False,
    **kwargs: Any,
) -> list[Record]:
    """:func:`read_records`, returning only the records (skipped rows are logged)."""
    return read_records(source, schema, skip_invalid=skip_invalid, **kwargs).records


# -- the five evaluation sets -------------------------------------------------------------------------

BENCHMARKS: tuple[str, ...] = ("aime24", "aime25", "amc23", "math500", "olympiadbench")
DATA_DIR_ENV = "EBPO_DATA_DIR"
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


def benchmark_dir() -> Path | None:
    """The folder of our benchmark JSON Lines files named by ``$EBPO_DATA_DIR``, or ``None`` (load from the
    hub)."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else None


def load_benchmark(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> list[Record]:
    """One of the five evaluation sets (:data:`BENCHMARKS`) as records with ids ``"<name>-0000"``, each
    prompt ending with :data:`BENCHMARK_INSTRUCTION`.

    From ``<data_dir>/<name>.jsonl`` (our format: ``problem``, ``answer`` per line, the instruction
    included) when ``data_dir`` or ``$EBPO_DATA_DIR`` names a folder; else from the hub copy at its pinned
    revision (:func:`load_hub_benchmark`; ``cache_dir`` is ``datasets``' cache, default its own).
    """
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; valid choices: {', '.join(BENCHMARKS)}")
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
        reason = (str(err).strip().splitlines() or [""])[0]
        raise BenchmarkUnavailableError(
            f"benchmark {name}: cannot load {hub.dataset} ({_hub_label(hub)}) from the Hugging Face hub "
            f"({type(err).__name__}: {reason}); pass --data-dir DIR (or set ${DATA_DIR_ENV}) to a folder "
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


# -- chat templates and writing ------------------------------------------------------------------------


def write_records(path: str | os.PathLike[str], records: Iterable[Record]) -> Path:
    """Write records as ``Record.to_dict()`` rows to ``*.jsonl`` or ``*.parquet`` (read back with schema
    ``records``), atomically; parent folders are created."""
    path = Path(path)
    rows = [r.to_dict() for r in records]
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"{path}: cannot write {suffix!r}; valid: .jsonl, .json, .parquet")
    if suffix == ".parquet":
        # ``extra`` holds arbitrary values: stored as JSON text so that the column type is fixed
        write_parquet(
            path, [{**row, "extra": json.dumps(row.get("extra", {}), ensure_ascii=False)} for row in rows]
        )
    else:
        write_jsonl(path, rows)
    return path


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    """``rows`` as JSON Lines (UTF-8, non-ASCII kept), written atomically (:mod:`ebpo.persist`)."""
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def write_parquet(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]]) -> None:
    """``rows`` as one Parquet table, written atomically (:mod:`ebpo.persist`). Its columns are the union of
    every row's keys (pyarrow would otherwise take them from the first row only), a row's missing ones null."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([{key: row.get(key) for key in columns} for row in rows]), buffer)
    write_bytes_atomic(path, buffer.getvalue())
