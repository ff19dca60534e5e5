"""Loader schemas: how a source's row becomes a :class:`~ebpo.data.records.Record` (the table in
:mod:`ebpo.data.loaders`), one registry of named mappings (:func:`register_schema`, :func:`get_schema`), the
built-in ones, and :class:`RowError`, the one error of a row that does not fit."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

from ebpo.data.records import Record
from ebpo.registry import Registry


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
