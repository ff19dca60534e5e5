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

The schemas themselves are in :mod:`ebpo.data.schemas`; the five evaluation sets (``load_benchmark``, their hub
copies at pinned revisions) in :mod:`ebpo.eval.benchmarks`, which reads our JSON Lines files of them from the
folder :func:`benchmark_dir` names.

Heavy imports (``pyarrow``, ``datasets``) happen inside the functions that need them.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebpo.data.prompts import apply_chat_template  # re-exported: where the chat template is applied
from ebpo.data.records import Record
from ebpo.data.schemas import RowError, Schema, _FieldError, get_schema, list_schemas, register_schema
from ebpo.persist import write_bytes_atomic, write_text_atomic

logger = logging.getLogger(__name__)

__all__ = [
    "DATA_DIR_ENV",
    "LoadResult",
    "RowError",
    "Schema",
    "apply_chat_template",
    "benchmark_dir",
    "get_schema",
    "list_schemas",
    "load_hub",
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


# -- where our files of the evaluation sets are (the sets themselves: ebpo.eval.benchmarks) -------------

DATA_DIR_ENV = "EBPO_DATA_DIR"


def benchmark_dir() -> Path | None:
    """The folder of our benchmark JSON Lines files named by ``$EBPO_DATA_DIR``, or ``None`` (load from the
    hub)."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else None


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
