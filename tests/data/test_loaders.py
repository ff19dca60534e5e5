"""Loaders: the five evaluation sets (our files and the hub copies), JSONL / Parquet / hub rows through the schema
registry, chat templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebpo.data import loaders
from ebpo.data.loaders import (
    RowError,
    apply_chat_template,
    get_schema,
    list_schemas,
    load_hub,
    load_jsonl,
    load_parquet,
    load_records,
    read_records,
    records_from_rows,
    write_records,
)
from ebpo.data.records import Record
from ebpo.eval import benchmarks as eval_benchmarks
from ebpo.eval.benchmarks import BENCHMARK_INSTRUCTION, PAPER_BENCHMARKS, load_benchmark

# Row counts of each set (our JSON Lines files and the hub copies at their pinned revisions).
EXPECTED_ROWS = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "olympiadbench": 674}


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- the five evaluation sets: our JSON Lines files ---------------------------------------------------


@pytest.mark.parametrize("name", PAPER_BENCHMARKS)
def test_load_benchmark_reads_every_row(benchmark_dir, name):
    records = load_benchmark(name, data_dir=benchmark_dir)
    assert len(records) == EXPECTED_ROWS[name]
    assert len({r.id for r in records}) == len(records)
    assert records[0].id == f"{name}-0000" and records[-1].id == f"{name}-{len(records) - 1:04d}"
    assert all(r.source == name and r.prompt.strip() and r.answer.strip() for r in records)
    assert all(r.prompt.endswith("\n" + BENCHMARK_INSTRUCTION) for r in records)
    # the first row, read independently of the loader
    first = json.loads((benchmark_dir / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert (records[0].prompt, records[0].answer) == (first["problem"], first["answer"])


def test_data_dir_env_names_the_folder(benchmark_dir, monkeypatch):
    monkeypatch.setenv("EBPO_DATA_DIR", str(benchmark_dir))
    assert loaders.benchmark_dir() == benchmark_dir
    assert len(load_benchmark("aime24")) == 30
    monkeypatch.delenv("EBPO_DATA_DIR")
    assert loaders.benchmark_dir() is None  # no folder: the hub copies


def test_missing_file_in_the_data_dir_and_unknown_name(monkeypatch, tmp_path):
    monkeypatch.setenv("EBPO_DATA_DIR", str(tmp_path))
    with pytest.raises(eval_benchmarks.BenchmarkUnavailableError) as info:
        load_benchmark("aime25")
    assert str(info.value) == (
        f"benchmark aime25: {tmp_path / 'aime25.jsonl'} not found; --data-dir (or $EBPO_DATA_DIR) must name a "
        f"folder holding aime25.jsonl, or leave both unset to load math-ai/aime25 from the Hugging Face hub"
    )
    with pytest.raises(ValueError, match="'gsm8k'.*aime24, aime25, amc23, math500, olympiadbench"):
        load_benchmark("gsm8k")


# -- the five evaluation sets: the hub copies, through the same code ----------------------------------

INSTRUCTION_SUFFIX = "\n" + BENCHMARK_INSTRUCTION


def _olympiad_row(index: int, question: str, answers: list[str]) -> dict:
    """A row of Hothan/OlympiadBench (config OE_TO_maths_en_COMP): every column of the copy."""
    return {
        "id": 1606 + index,
        "question": question,
        "solution": ["A worked solution."],
        "final_answer": answers,
        "context": None,
        **{f"image_{i}": None for i in range(1, 6)},
        "modality": "Text-only",
        "difficulty": "Competition",
        "is_multiple_answer": len(answers) > 1,
        "unit": None,
        "answer_type": "Numerical",
        "error": None,
        "question_type": "Open-ended",
        "subfield": "Combinatorics",
        "subject": "Math",
        "language": "English",
    }


def _hub_rows(name: str, pairs: list[tuple[str, str]]) -> list[dict]:
    """``(problem without the instruction, answer)`` pairs as rows in the column layout and value types of
    the hub copy of ``name`` (``HUB_BENCHMARKS[name].columns``)."""
    if name == "aime24":  # math-ai/aime24: the answer only as \boxed{} in `solution`, integer ids from 60
        return [
            {"id": 60 + i, "problem": p, "solution": f"\\boxed{{{a}}}", "url": f"https://aops/{i}"}
            for i, (p, a) in enumerate(pairs)
        ]
    if name == "aime25":  # math-ai/aime25: three string columns
        return [{"problem": p, "answer": a, "id": str(i)} for i, (p, a) in enumerate(pairs)]
    if name == "amc23":  # math-ai/amc23: `question`, and the answer as a float
        return [
            {"id": i, "question": p, "answer": float(a), "url": f"https://aops/{i}"}
            for i, (p, a) in enumerate(pairs)
        ]
    if name == "math500":  # HuggingFaceH4/MATH-500
        return [
            {
                "problem": p,
                "solution": "A worked solution.",
                "answer": a,
                "subject": "Algebra",
                "level": 1 + i % 5,
                "unique_id": f"test/algebra/{i}.json",
            }
            for i, (p, a) in enumerate(pairs)
        ]
    assert name == "olympiadbench"
    return [_olympiad_row(i, p, [a]) for i, (p, a) in enumerate(pairs)]


def _write_hub_copy(root: Path, name: str, rows: list[dict]) -> Path:
    """A local folder laid out as the hub repository of ``name`` (file names, formats, configs), which
    ``datasets.load_dataset(folder, config, split=...)`` reads the way it reads the repository."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / name
    folder.mkdir(parents=True)
    if name in ("aime25", "math500"):  # test.jsonl at the top of the repository
        (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif name in ("aime24", "amc23"):  # one Parquet shard
        pq.write_table(pa.Table.from_pylist(rows), folder / "test-00000-of-00001.parquet")
    else:  # OlympiadBench: one folder per config, named in the dataset card's YAML header
        config = eval_benchmarks.HUB_BENCHMARKS[name].config
        data = folder / "OlympiadBench" / str(config)
        data.mkdir(parents=True)
        string = pa.string()
        schema = pa.schema(
            [
                ("id", pa.int64()),
                ("question", string),
                ("solution", pa.list_(string)),
                ("final_answer", pa.list_(string)),
                ("context", string),
                *[(f"image_{i}", string) for i in range(1, 6)],
                ("modality", string),
                ("difficulty", string),
                ("is_multiple_answer", pa.bool_()),
                ("unit", string),
                ("answer_type", string),
                ("error", string),
                ("question_type", string),
                ("subfield", string),
                ("subject", string),
                ("language", string),
            ]
        )
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), data / f"{config}.parquet")
        (folder / "README.md").write_text(
            f"---\nconfigs:\n- config_name: {config}\n  data_files:\n  - split: train\n"
            f"    path: OlympiadBench/{config}/{config}.parquet\n---\n"
        )
    return folder


@pytest.fixture
def hub_copies(tmp_path, monkeypatch):
    """``write(name, rows)`` puts a local copy of ``name`` in place of its hub dataset (the rest of its
    ``HUB_BENCHMARKS`` entry, revision included, unchanged) and returns ``load_benchmark(name)``'s records."""
    from dataclasses import replace

    monkeypatch.delenv("EBPO_DATA_DIR", raising=False)

    def write(name: str, rows: list[dict]) -> list[Record]:
        folder = _write_hub_copy(tmp_path / "hub", name, rows)
        monkeypatch.setitem(
            eval_benchmarks.HUB_BENCHMARKS,
            name,
            replace(eval_benchmarks.HUB_BENCHMARKS[name], dataset=str(folder)),
        )
        return load_benchmark(name, cache_dir=tmp_path / "datasets-cache")

    return write


def test_hub_copies_in_their_own_layouts_map_to_our_records(hub_copies):
    aime24 = hub_copies("aime24", _hub_rows("aime24", [("Find $x$.", "204"), ("Find $y$.", "33")]))
    assert [(r.id, r.prompt, r.answer, r.extra) for r in aime24] == [
        ("aime24-0000", "Find $x$." + INSTRUCTION_SUFFIX, "204", {"hub_id": "60"}),
        ("aime24-0001", "Find $y$." + INSTRUCTION_SUFFIX, "33", {"hub_id": "61"}),
    ]
    aime25 = hub_copies("aime25", _hub_rows("aime25", [("Find the sum.", "70")]))
    assert [(r.id, r.prompt, r.answer, r.source) for r in aime25] == [
        ("aime25-0000", "Find the sum." + INSTRUCTION_SUFFIX, "70", "aime25")
    ]
    # a float answer column: 27.0 -> "27", -1.0 -> "-1"
    amc23 = hub_copies("amc23", _hub_rows("amc23", [("How many?", "27"), ("Which?", "-1")]))
    assert [(r.id, r.answer) for r in amc23] == [("amc23-0000", "27"), ("amc23-0001", "-1")]
    math500 = hub_copies(
        "math500", _hub_rows("math500", [("Convert $(0,3)$.", "\\left( 3, \\frac{\\pi}{2} \\right)")])
    )
    (record,) = math500
    assert (record.id, record.answer, record.topic, record.level) == (
        "math500-0000",
        "\\left( 3, \\frac{\\pi}{2} \\right)",
        "Algebra",
        1,
    )
    assert record.extra == {"hub_id": "test/algebra/0.json"}
    # several final answers are joined with "," (as in our JSON Lines copy: "$69$,$84$")
    olympiad = hub_copies(
        "olympiadbench",
        [_olympiad_row(0, "Xenia and Sergey play.", ["$69$", "$84$"]), _olympiad_row(1, "q", ["2"])],
    )
    assert [(r.id, r.prompt, r.answer) for r in olympiad] == [
        ("olympiadbench-0000", "Xenia and Sergey play." + INSTRUCTION_SUFFIX, "$69$,$84$"),
        ("olympiadbench-0001", "q" + INSTRUCTION_SUFFIX, "2"),
    ]
    assert olympiad[0].extra == {"subfield": "Combinatorics", "answer_type": "Numerical", "hub_id": "1606"}


def test_hub_copy_with_a_bad_row_names_the_dataset_row_and_field(hub_copies):
    rows = _hub_rows("aime24", [("Find $x$.", "204"), ("Find $y$.", "33")])
    rows[1]["solution"] = "no boxed answer here"
    with pytest.raises(RowError) as info:
        hub_copies("aime24", rows)
    assert "row 1, field 'solution': no answer column and no \\boxed{...} answer in the solution" in str(
        info.value
    )
    assert "revision 83a7f387baaa" in str(info.value)


@pytest.mark.parametrize("name", PAPER_BENCHMARKS)
def test_hub_copy_of_our_files_gives_the_same_records(benchmark_dir, hub_copies, name):
    """Every problem of our JSON Lines copy, written in the hub copy's layout and value types, loads back
    through the hub path as the same records (ids, prompts, answers): the same cache key in ``ebpo eval``."""
    from ebpo.eval.cli import records_digest

    ours = load_benchmark(name, data_dir=benchmark_dir)
    pairs = [(r.prompt[: -len(INSTRUCTION_SUFFIX)], r.answer) for r in ours]
    from_hub = hub_copies(name, _hub_rows(name, pairs))
    assert [(r.id, r.prompt, r.answer) for r in from_hub] == [(r.id, r.prompt, r.answer) for r in ours]
    assert records_digest(from_hub) == records_digest(ours)


def test_hub_table_pins_every_set_and_the_call_passes_it(monkeypatch, tmp_path):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, *, split=None, revision=None, cache_dir=None):
        calls.append((path, name, split, revision, cache_dir))
        return datasets.Dataset.from_list(_hub_rows(bench, [("p", "1")]))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.delenv("EBPO_DATA_DIR", raising=False)
    assert sorted(eval_benchmarks.HUB_BENCHMARKS) == sorted(PAPER_BENCHMARKS)
    for bench in PAPER_BENCHMARKS:
        hub = eval_benchmarks.HUB_BENCHMARKS[bench]
        assert len(hub.revision) == 40 and int(hub.revision, 16) >= 0  # a full commit hash
        assert hub.rows == EXPECTED_ROWS[bench]
        assert load_benchmark(bench)[0].answer == "1"
        assert calls[-1] == (hub.dataset, hub.config, hub.split, hub.revision, None)
    assert calls[-1][:3] == ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train")


def test_unreachable_hub_is_one_line_naming_benchmark_dataset_and_flag(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError(
            "Couldn't reach 'math-ai/amc23' on the Hub (LocalEntryNotFoundError)\nmore detail"
        )

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.delenv("EBPO_DATA_DIR", raising=False)
    with pytest.raises(eval_benchmarks.BenchmarkUnavailableError) as info:
        load_benchmark("amc23")
    assert str(info.value) == (
        "benchmark amc23: cannot load math-ai/amc23 (split test, revision 80815d37005f) from the Hugging Face "
        "hub (ConnectionError: Couldn't reach 'math-ai/amc23' on the Hub (LocalEntryNotFoundError)); pass "
        "--data-dir DIR (or set $EBPO_DATA_DIR) to a folder holding amc23.jsonl (one JSON object with problem "
        "and answer per line)"
    )


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


def test_schema_registry():
    assert {
        "shared",
        "math500",
        "aime24",
        "aime25",
        "amc23",
        "olympiadbench",
        "dapo_math_17k",
        "records",
    } <= set(list_schemas())
    with pytest.raises(ValueError, match="'gsm8k'.*aime24, aime25, amc23, dapo_math_17k"):
        get_schema("gsm8k")


# -- hub schemas, through the same mapping function ------------------------------------------------


def test_math500_olympiad_aime_rows_from_an_in_memory_dataset():
    import datasets

    math500 = datasets.Dataset.from_list(
        [
            {
                "problem": "p0",
                "answer": "\\frac{1}{2}",
                "subject": "Algebra",
                "level": 3,
                "unique_id": "test/a/1.json",
            },
            {"problem": "p1", "answer": "7", "subject": "Geometry", "level": 5, "unique_id": "test/g/2.json"},
        ]
    )
    records = records_from_rows(math500, "math500", source="math500").records
    assert [(r.id, r.answer, r.topic, r.level) for r in records] == [
        ("test/a/1.json", "\\frac{1}{2}", "Algebra", 3),
        ("test/g/2.json", "7", "Geometry", 5),
    ]

    olympiad = datasets.Dataset.from_list(
        [
            {
                "id": 2231,
                "question": "q",
                "final_answer": ["$69$", "$84$"],
                "subfield": "Combinatorics",
                "unit": None,
            },
            {
                "id": 2232,
                "question": "r",
                "final_answer": ["$2^{1009}$"],
                "subfield": "Algebra",
                "unit": None,
            },
        ]
    )
    records = records_from_rows(olympiad, "olympiadbench", source="ob").records
    assert [(r.id, r.prompt, r.answer) for r in records] == [
        ("2231", "q", "$69$,$84$"),
        ("2232", "r", "$2^{1009}$"),
    ]
    assert records[0].extra == {"subfield": "Combinatorics"}

    aime = datasets.Dataset.from_list([{"ID": "2024-I-1", "problem": "p", "answer": 204}])
    (record,) = records_from_rows(aime, "aime24", source="aime24").records
    assert (record.id, record.answer) == ("2024-I-1", "204")

    bad = [{"question": "q", "final_answer": []}]
    with pytest.raises(RowError, match="hub:ob, row 0, field 'final_answer':"):
        records_from_rows(bad, "olympiadbench", source="ob", file="hub:ob")


def _dapo_rows() -> list[dict]:
    def row(text: str, answer: str) -> dict:
        return {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": text}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": "x"},
        }

    # the hub copy repeats each prompt many times: 3 + 2 rows of two unique prompts, then a third prompt
    return [row("Solve A.", "1")] * 3 + [row("Solve B.", "2")] * 2 + [row("Solve C.", "34")]


def test_dapo_math_17k_dedupes_by_prompt_and_keeps_messages(tmp_path):
    import datasets

    result = records_from_rows(datasets.Dataset.from_list(_dapo_rows()), "dapo_math_17k", source="dapo")
    assert [(r.prompt, r.answer, r.source) for r in result.records] == [
        ("Solve A.", "1", "math_dapo"),
        ("Solve B.", "2", "math_dapo"),
        ("Solve C.", "34", "math_dapo"),
    ]
    assert result.duplicates == 3  # 6 rows, 3 unique prompts
    assert len({r.id for r in result.records}) == 3
    assert result.records[0].extra["messages"] == [{"role": "user", "content": "Solve A."}]

    broken = dict(_dapo_rows()[0], reward_model={"style": "rule"})
    with pytest.raises(RowError, match=r"row 0, field 'reward_model\.ground_truth':"):
        records_from_rows([broken], "dapo_math_17k", source="dapo")

    # the same rows saved with save_to_disk load through load_hub / read_records
    datasets.Dataset.from_list(_dapo_rows()).save_to_disk(str(tmp_path / "dapo"))
    from_disk = read_records(tmp_path / "dapo", "dapo_math_17k")
    assert [r.id for r in from_disk.records] == [r.id for r in result.records]


def test_hub_path_calls_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config=None, split=None, **kwargs):
        calls.append((name, config, split))
        return datasets.Dataset.from_list([{"problem": "p", "answer": "42"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    records = load_records("hf://Maxwell-Jia/AIME_2024", "aime24", split="train")
    assert calls == [("Maxwell-Jia/AIME_2024", None, "train")]
    assert [(r.id, r.answer, r.source) for r in records] == [("AIME_2024-0000", "42", "AIME_2024")]
    assert load_hub("org/x", "shared", split="test").records[0].source == "x"
    assert calls[-1] == ("org/x", None, "test")


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


# -- chat templates -----------------------------------------------------------------------------------

# A minimal ChatML-like template: each turn "<|role|>content\n", then "<|assistant|>" for generation.
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_apply_chat_template_renders_through_the_tokenizer():
    from ebpo.models.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    records = [Record(id="a", prompt="1+1=?", answer="2")]
    with pytest.raises(ValueError, match="no chat_template"):
        apply_chat_template(records, tokenizer)

    tokenizer.chat_template = TEMPLATE
    assert apply_chat_template(records, tokenizer) == ["<|user|>1+1=?\n<|assistant|>"]
    assert apply_chat_template(records, tokenizer, system_prompt="Be brief.") == [
        "<|system|>Be brief.\n<|user|>1+1=?\n<|assistant|>"
    ]
    assert apply_chat_template(records, tokenizer, add_generation_prompt=False) == ["<|user|>1+1=?\n"]
    # DAPO keeps the original conversation, which wins over the flat prompt
    dapo = Record(
        id="d",
        prompt="Q",
        answer="1",
        extra={"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]},
    )
    assert apply_chat_template([dapo], tokenizer, system_prompt="ignored") == [
        "<|system|>S\n<|user|>Q\n<|assistant|>"
    ]


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
