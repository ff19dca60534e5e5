"""Annotation of training data for clustered sampling: ``ebpo annotate difficulty`` and ``ebpo annotate topic``.

Both read a JSONL or Parquet file row by row, keep every input column, and write a NEW file with one
column added (``difficulty`` or ``topic``); the input is never modified. The row helpers here are shared
by both: :func:`read_rows`, :func:`write_rows`, :func:`row_id`, :func:`row_prompt`, :func:`row_answer`.
Heavy modules (transformers, sentence-transformers) are imported only by the backends that need them.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "load_input",
    "write_output",
    "read_rows",
    "write_rows",
    "row_id",
    "row_prompt",
    "row_answer",
    "PROMPT_FIELDS",
    "ANSWER_FIELDS",
]

# Column names tried in order (our Record, the shared benchmark files, MATH / OlympiadBench / DAPO copies).
PROMPT_FIELDS: tuple[str, ...] = ("prompt", "problem", "question")
ANSWER_FIELDS: tuple[str, ...] = ("answer", "final_answer", "ground_truth", "reward_model.ground_truth")
_PARQUET_SUFFIXES = (".parquet", ".pq")


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in _PARQUET_SUFFIXES


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a JSONL (one object per line) or Parquet file, as dicts; errors name file and line
    (each line is decoded on its own, so a byte that is not UTF-8 names its line too)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file {path} not found")
    if _is_parquet(path):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{path}, line {line_no}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at byte "
                    f"{err.start + 1}); re-save the file as UTF-8"
                ) from None
            try:
                row = json.loads(line.rstrip("\r\n"))  # a row cut short: an error at its own end
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}, line {line_no}: not valid JSON ({err.msg} at column {err.colno})"
                ) from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}, line {line_no}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def write_rows(path: str | Path, rows: Sequence[dict[str, Any]]) -> None:
    """Write rows to JSONL, or to Parquet when the name ends in ``.parquet`` / ``.pq``, atomically."""
    from ebpo.data.loaders import write_jsonl, write_parquet

    (write_parquet if _is_parquet(Path(path)) else write_jsonl)(path, rows)


def load_input(path: str | Path, schema: str | None = None) -> list[dict[str, Any]]:
    """Rows to annotate. Without ``schema``: the file's own rows, every column kept (:func:`read_rows`).
    With a schema name of ``ebpo.data.loaders`` (``shared``, ``math500``, ``olympiadbench``,
    ``dapo_math_17k``, ``records``, ...): the file read into records by that schema, as
    ``Record.to_dict()`` rows, so the output is our record format and the trainer reads it directly."""
    if schema is None:
        return read_rows(path)
    from ebpo.data.loaders import load_records

    return [record.to_dict() for record in load_records(path, schema)]


def write_output(path: str | Path, rows: Sequence[dict[str, Any]], schema: str | None = None) -> None:
    """Write annotated rows: as they are (:func:`write_rows`), or, when the input was read with a
    ``schema``, as records with ``ebpo.data.loaders.write_records`` (read back with schema ``records``)."""
    if schema is None:
        write_rows(path, rows)
        return
    from ebpo.data.loaders import write_records
    from ebpo.data.records import Record

    write_records(path, [Record.from_dict(row) for row in rows])


def row_id(row: dict[str, Any], position: int) -> str:
    """The row's ``id`` column as a string, else ``"row-{position}"`` (0-based position in the file)."""
    value = row.get("id")
    return str(value) if value is not None else f"row-{position}"


def _lookup(row: dict[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def row_prompt(
    row: dict[str, Any], position: int, source: str | Path = "input"
) -> str | list[dict[str, str]]:
    """The problem: the first of :data:`PROMPT_FIELDS` present (a string, or a list of chat messages)."""
    for name in PROMPT_FIELDS:
        value = row.get(name)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
            return value
    raise ValueError(
        f"{source}, row {position}: no prompt; expected one of the columns {', '.join(PROMPT_FIELDS)}"
    )


def row_answer(row: dict[str, Any], position: int, source: str | Path = "input") -> str:
    """The gold answer: the first of :data:`ANSWER_FIELDS` present; a list (OlympiadBench) gives its first item."""
    for name in ANSWER_FIELDS:
        value = _lookup(row, name)
        if isinstance(value, list) and value:
            value = value[0]
        if value is not None and str(value) != "":
            return str(value)
    raise ValueError(
        f"{source}, row {position}: no answer; expected one of the columns {', '.join(ANSWER_FIELDS)}"
    )
