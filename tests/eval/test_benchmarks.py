"""Tests for ebpo.eval.benchmarks: the five evaluation sets (our files and the hub copies, through the same
code) and the benchmark registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebpo.data import loaders
from ebpo.data.loaders import RowError
from ebpo.data.records import Record
from ebpo.eval import benchmarks as eval_benchmarks
from ebpo.eval.benchmarks import BENCHMARK_INSTRUCTION, PAPER_BENCHMARKS, get_benchmark, load_benchmark

# Row counts of each set (our JSON Lines files and the hub copies at their pinned revisions).
EXPECTED_ROWS = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "olympiadbench": 674}


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
    from ebpo.eval.harness import records_digest

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


# -- the benchmark registry --------------------------------------------------------------------------------


def test_unknown_benchmark_lists_the_valid_names_and_the_plugin_hint():
    with pytest.raises(
        ValueError,
        match=r"'aime2024'.*aime24, aime25, amc23, arith, gym:<dataset>\[,<dataset>\.\.\.\], math500, olympiadbench; .*--plugins",
    ):
        get_benchmark("aime2024")
