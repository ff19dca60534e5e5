"""``ebpo.data.schemas``: the registry of named schemas, and the built-in hub schemas through the loaders' one
mapping function."""

from __future__ import annotations

import pytest

from ebpo.data.loaders import (
    RowError,
    get_schema,
    list_schemas,
    load_hub,
    load_records,
    read_records,
    records_from_rows,
)


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
