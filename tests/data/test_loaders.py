"""``ebpo.data.loaders``: JSON Lines, Parquet and hub rows read into records (errors name the file, line and
field), written and read back; duplicate ids, bad bytes and non-text prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebpo.data.loaders import (
    RowError,
    load_jsonl,
    load_parquet,
    load_records,
    read_records,
    records_from_rows,
    write_records,
)
from ebpo.data.records import Record


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- JSONL: errors name file, line and field -------------------------------------------------------


def test_jsonl_bad_row_names_file_line_and_field(tmp_path):
    path = _write_lines(
        tmp_path / "set.jsonl",
        [
            json.dumps({"problem": "1+1?", "answer": "2"}),
            "",  # blank line 2 is skipped but still counted as a line
            json.dumps({"problem": "2+2?"}),  # line 3: no answer
            json.dumps({"problem": "3+3?", "answer": 6}),  # an int answer is fine (AIME copies)
        ],
    )
    with pytest.raises(RowError) as info:
        load_jsonl(path)
    assert str(info.value) == f"{path}, line 3, field 'answer': missing"
    assert (info.value.field, info.value.position) == ("answer", "line 3")

    result = load_jsonl(path, skip_invalid=True)
    assert [r.answer for r in result.records] == ["2", "6"]
    assert [r.id for r in result.records] == ["set-0000", "set-0002"]  # ids count non-blank rows from 0
    assert result.num_skipped == 1 and result.skipped[0].position == "line 3"


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_invalid_json_names_the_column_of_the_fault_in_its_line(tmp_path, ending):
    # 44 characters, cut short after a comma: the next key is missing at column 45, where the line ends (not
    # "line 2, column 1" of the text after the line break)
    cut = '{"problem": "What is 2 + 2?", "answer": "4",'
    assert len(cut) == 44
    # a missing comma: the second key starts at column 30 (after 28 characters and a space), where a "," was due
    joined = '{"problem": "What is 2 + 2?" "answer": "4"}'
    path = tmp_path / "x.jsonl"
    path.write_bytes(f"{cut}{ending}{joined}{ending}".encode())
    result = load_jsonl(path, skip_invalid=True)
    assert [str(e) for e in result.skipped] == [
        f"{path}, line 1: invalid JSON (Expecting property name enclosed in double quotes at column 45)",
        f"{path}, line 2: invalid JSON (Expecting ',' delimiter at column 30)",
    ]
    from ebpo.annotate import read_rows  # ebpo annotate's reader says the same

    with pytest.raises(ValueError) as err:
        read_rows(path)
    assert str(err.value) == (
        f"{path}, line 1: not valid JSON (Expecting property name enclosed in double quotes at column 45)"
    )


def test_jsonl_invalid_json_and_wrong_types(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", ['{"problem": "a", "answer": "1"}', "{not json", "[1, 2]"])
    with pytest.raises(RowError, match=r"x\.jsonl, line 2:"):
        load_jsonl(path)
    result = load_jsonl(path, skip_invalid=True)
    assert len(result.records) == 1
    assert [e.position for e in result.skipped] == ["line 2", "line 3"]
    assert "expected an object, got list" in str(result.skipped[1])

    typed = _write_lines(tmp_path / "t.jsonl", [json.dumps({"problem": ["a"], "answer": "1"})])
    with pytest.raises(RowError, match=r"t\.jsonl, line 1, field 'problem': .*\blist$"):
        load_jsonl(typed)
    empty = _write_lines(tmp_path / "e.jsonl", [json.dumps({"problem": "  ", "answer": "1"})])
    with pytest.raises(RowError, match=r"e\.jsonl, line 1, field 'problem':"):
        load_jsonl(empty)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        load_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "data.csv").write_text("problem,answer\n")
    with pytest.raises(ValueError, match=r"data\.csv: .*'\.csv'.*\.jsonl, \.json, \.parquet"):
        read_records(tmp_path / "data.csv")


# -- writing and round trips ------------------------------------------------------------------------


def _sample_records() -> list[Record]:
    return [
        Record(id="a", prompt="1+1=?", answer="2", topic="Algebra", difficulty=0.25, source="arith", level=1),
        Record(id="b", prompt="Why?\nBecause.", answer="\\frac{1}{2}", extra={"note": [1, 2], "k": "v"}),
        Record(id="c", prompt="ünïcödé", answer="x^2", difficulty=1.0, level=5),
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_write_then_read_round_trip(tmp_path, suffix):
    records = _sample_records()
    path = write_records(tmp_path / "sub" / f"out{suffix}", records)
    assert path.is_file()
    assert load_records(path, "records") == records


def test_parquet_bad_row_names_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"problem": "a", "answer": "1"}, {"problem": "b", "answer": None}]), path
    )
    with pytest.raises(RowError, match=r"bad\.parquet, row 1, field 'answer':"):
        load_parquet(path)
    assert [r.prompt for r in load_parquet(path, skip_invalid=True).records] == ["a"]
    with pytest.raises(ValueError, match=r"x\.csv: .*'\.csv'"):
        write_records(tmp_path / "x.csv", _sample_records())


def test_records_schema_rejects_bad_types(tmp_path):
    path = _write_lines(
        tmp_path / "r.jsonl", [json.dumps({"id": "a", "prompt": "p", "answer": "1", "level": "hard"})]
    )
    with pytest.raises(RowError, match=r"r\.jsonl, line 1, field 'level': .*'hard'"):
        load_jsonl(path, "records")
    path = _write_lines(tmp_path / "s.jsonl", [json.dumps({"id": "a", "answer": "1"})])
    with pytest.raises(RowError, match=r"s\.jsonl, line 1, field 'prompt':"):
        load_jsonl(path, "records")


# -- duplicate ids, bad bytes, non-text prompts: one line naming the file and line -------------------


def test_duplicate_ids_are_rejected_naming_both_lines(tmp_path):
    """The trainer groups responses by record id, so two rows with one id would share a baseline: the
    second is refused, naming both lines."""
    path = _write_lines(
        tmp_path / "train.jsonl",
        [
            json.dumps({"id": "p1", "prompt": "1+1=", "answer": "2"}),
            json.dumps({"id": "p2", "prompt": "2+2=", "answer": "4"}),
            "",
            json.dumps({"id": "p1", "prompt": "3+3=", "answer": "6"}),  # line 4 repeats line 1's id
        ],
    )
    with pytest.raises(RowError) as info:
        load_jsonl(path, "records")
    message = str(info.value)
    assert message.startswith(f"{path}, line 4, field 'id': duplicate id 'p1'")
    assert f"first used at {path}, line 1" in message and "unique" in message
    # skip_invalid keeps the first row and reports the second
    result = load_jsonl(path, "records", skip_invalid=True)
    assert [r.prompt for r in result.records] == ["1+1=", "2+2="]
    assert [e.position for e in result.skipped] == ["line 4"]


def test_duplicate_ids_in_parquet_and_rows_name_both_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"problem": f"q{i}", "answer": "1", "unique_id": uid} for i, uid in enumerate("abca")]
    path = tmp_path / "m.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(RowError, match=r"m\.parquet, row 3, field 'id': .*'a'.*m\.parquet, row 0"):
        load_parquet(path, "math500")
    with pytest.raises(RowError, match=r"hub:x, row 3, field 'id': .*'a'.*hub:x, row 0"):
        records_from_rows(rows, "math500", source="x", file="hub:x")
    # an explicit id equal to another row's default id collides too
    mixed = [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": "2", "id": "set-0000"}]
    with pytest.raises(RowError, match="row 1, field 'id': .*'set-0000'"):
        records_from_rows(mixed, "shared", source="set")


def test_non_utf8_byte_names_file_and_line_and_can_be_skipped(tmp_path):
    """A byte that is not UTF-8 is a RowError for its line like any other bad row (not a UnicodeDecodeError
    with a buffer offset), and skip_invalid=True skips that line."""
    path = tmp_path / "latin1.jsonl"
    good = json.dumps({"problem": "1+1?", "answer": "2"}).encode()
    bad = '{"problem": "caf\u00e9?", "answer": "1"}'.encode("latin-1")  # \xe9 alone is not UTF-8
    path.write_bytes(good + b"\n" + good + b"\n\n" + bad + b"\n" + good + b"\n")
    with pytest.raises(RowError) as info:
        load_jsonl(path)
    # '{"problem": "caf' is 16 bytes, so the \xe9 is byte 17 of line 4 (line 3 is blank)
    assert str(info.value).startswith(f"{path}, line 4: not valid UTF-8 (byte 0xe9 at byte 17)")
    assert "UTF-8" in str(info.value) and "re-save" in str(info.value)
    result = load_jsonl(path, skip_invalid=True)
    assert len(result.records) == 3 and [e.position for e in result.skipped] == ["line 4"]
    # ids still count non-blank rows: the bad row is row 2, the last good one row 3
    assert [r.id for r in result.records] == ["latin1-0000", "latin1-0001", "latin1-0003"]


def test_utf8_bom_and_crlf_are_read(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + b'{"problem": "p", "answer": "1"}\r\n{"problem": "q", "answer": "2"}\r\n'
    )
    assert [r.prompt for r in load_jsonl(path).records] == ["p", "q"]


@pytest.mark.parametrize(
    ("schema", "row"),
    [
        ("records", {"id": "a", "prompt": 7, "answer": "1"}),
        ("shared", {"problem": 3.5, "answer": "1"}),
        ("math500", {"problem": 12, "answer": "1"}),
        ("aime24", {"problem": True, "answer": "1"}),
        ("olympiadbench", {"question": 5, "final_answer": ["1"]}),
    ],
)
def test_numeric_prompt_is_rejected_at_load(tmp_path, schema, row):
    """A number where the prompt belongs is refused at load, naming file, line and field (it would fail
    later inside the tokenizer with no file, line or record). Numbers stay fine as answers (AIME)."""
    path = _write_lines(tmp_path / "n.jsonl", [json.dumps(row)])
    field = {"records": "prompt", "olympiadbench": "question"}.get(schema, "problem")
    with pytest.raises(RowError, match=rf"n\.jsonl, line 1, field '{field}':"):
        load_jsonl(path, schema)


def test_records_schema_checks_text_fields(tmp_path):
    path = _write_lines(
        tmp_path / "r.jsonl", [json.dumps({"id": "a", "prompt": "p", "answer": 3, "topic": 4})]
    )
    with pytest.raises(RowError, match=r"r\.jsonl, line 1, field 'topic': .*\bint$"):
        load_jsonl(path, "records")
    ok = _write_lines(tmp_path / "ok.jsonl", [json.dumps({"id": 5, "prompt": "p", "answer": 3})])
    (record,) = load_records(ok, "records")
    assert (record.id, record.prompt, record.answer) == ("5", "p", "3")
