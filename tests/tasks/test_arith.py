"""The arith task suite: determinism, disjoint splits, answers re-computed independently, the verifier."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from fractions import Fraction

import pytest

from ebpo.data import Record
from ebpo.tasks import Task, arith, get_task, list_tasks

PAPER_LABELS = {  # docs/design.md §4, verbatim
    "Algebra & Number Theory",
    "Calculus & Analysis",
    "Geometry & Trigonometry",
    "Discrete Mathematics",
    "Probability & Statistics",
    "Linear Algebra",
    "Applied Mathematics & Word Problems",
    "Physics & Chemistry",
    "Advanced Mathematics",
}
N_CELLS = 9 * 5


# --- registry ---------------------------------------------------------------------------------------------


def test_registry_returns_arith_and_lists_valid_names_on_error():
    task = get_task("arith")
    assert isinstance(task, Task)
    assert list(task.topics) == list(arith.TOPICS) and len(task.topics) == 9
    assert list(task.levels) == [1, 2, 3, 4, 5]
    assert task.verify("so 12", "12") == 1.0
    assert [r.to_dict() for r in task.generate("test", 3, 1)] == [
        r.to_dict() for r in arith.generate("test", 3, 1)
    ]
    assert "arith" in list_tasks()
    with pytest.raises(
        ValueError, match=r"'arithm'; valid choices: arith, gym:<dataset>\[,<dataset>\.\.\.\]; .*--plugins"
    ):
        get_task("arithm")


def test_each_topic_maps_to_a_distinct_paper_label():
    assert set(arith.PAPER_TOPICS) == set(arith.TOPICS)
    assert set(arith.PAPER_TOPICS.values()) == PAPER_LABELS  # nine topics onto nine labels: a bijection
    record = arith.generate("train", 1, 0)[0]
    assert record.extra["paper_topic"] == arith.PAPER_TOPICS[record.topic]


def test_the_nine_labels_are_defined_once_for_arith_and_the_annotators():
    from ebpo.annotate import topic as annotate_topic
    from ebpo.data.topics import TOPICS

    assert set(TOPICS) == PAPER_LABELS and len(TOPICS) == 9
    assert annotate_topic.TOPICS is TOPICS  # imported, not a copy
    assert tuple(arith.PAPER_TOPICS.values()) == TOPICS  # arith topic i stands for label i


# --- generation ---------------------------------------------------------------------------------------------


def test_same_seed_same_records_different_seed_different():
    first = [r.to_dict() for r in arith.generate("train", 200, seed=7)]
    again = [r.to_dict() for r in arith.generate("train", 200, seed=7)]
    other = [r.to_dict() for r in arith.generate("train", 200, seed=8)]
    assert first == again
    prompts, other_prompts = [r["prompt"] for r in first], [r["prompt"] for r in other]
    # Same cells in the same order, but different problems (a coincidence in at most the tiny cells).
    assert [(r["topic"], r["level"]) for r in first] == [(r["topic"], r["level"]) for r in other]
    assert sum(a != b for a, b in zip(prompts, other_prompts)) > 180


def test_records_are_complete_and_cells_balanced():
    records = arith.generate("validation", 2 * N_CELLS + 3, seed=0)
    assert all(isinstance(r, Record) for r in records)
    assert len({r.id for r in records}) == len(records)  # ids unique
    assert {r.source for r in records} == {"arith"}
    cells = Counter((r.topic, r.level) for r in records)
    # 93 = 2 * 45 + 3: every cell twice, the first three cells (mod L1..L3) three times.
    assert len(cells) == N_CELLS
    assert cells[("mod", 1)] == cells[("mod", 2)] == cells[("mod", 3)] == 3
    assert sorted(cells.values()) == [2] * 42 + [3] * 3
    assert all(r.answer == str(int(r.answer)) for r in records)  # canonical integer strings


def test_topic_and_level_filters_and_bad_arguments():
    records = arith.generate("train", 20, seed=0, topics=["dot", "units"], levels=[5])
    assert {(r.topic, r.level) for r in records} == {("dot", 5), ("units", 5)}
    with pytest.raises(ValueError, match=r"'dev'.*sft, train, validation, test"):
        arith.generate("dev", 1)
    with pytest.raises(ValueError, match=r"\['calculus'\].*mod, sequence"):
        arith.generate("train", 1, topics=["calculus"])
    with pytest.raises(ValueError, match=r"levels \[6\]"):
        arith.generate("train", 1, levels=[6])
    with pytest.raises(ValueError, match=r"^n .*-1$"):
        arith.generate("train", -1)
    assert (
        arith.generate("val", 2, seed=3)[0].to_dict() == arith.generate("validation", 2, seed=3)[0].to_dict()
    )


def test_splits_are_disjoint_over_a_large_sample():
    prompts = {split: set() for split in arith.SPLITS}
    for split in arith.SPLITS:
        for seed in range(3):
            for record in arith.generate(split, 20 * N_CELLS, seed=seed):
                assert arith.split_of(record.prompt) == split  # membership by construction
                prompts[split].add(record.prompt)
    # 2700 draws per split; level-1 cells hold about a hundred facts each, so repeats across seeds are
    # expected (measured: 1467 distinct in the smallest split). Still a large sample of distinct prompts:
    assert min(len(p) for p in prompts.values()) > 1000
    for a, b in itertools.combinations(arith.SPLITS, 2):  # sft / train (RL) / validation / test
        assert not prompts[a] & prompts[b], (a, b)


def test_split_partition_is_60_20_10_10():
    # split_of only hashes the text, so arbitrary strings test the bucket proportions.
    counts = Counter(arith.split_of(f"probe {i}") for i in range(20_000))
    expected = {"sft": 0.6, "train": 0.2, "validation": 0.1, "test": 0.1}
    for split, share in expected.items():  # binomial sd at most sqrt(0.24 / 20000) = 0.0035
        assert abs(counts[split] / 20_000 - share) < 0.015, (split, counts)


def test_every_cell_has_many_distinct_problems_in_every_split():
    # The smallest cells (area level 1: 1..10 x 1..10; power level 2) have about 100 prompts, so 10% of
    # them is about ten; a cell with too few prompts per split would repeat the same problems endlessly.
    for split in ("validation", "test"):
        records = arith.generate(split, 60 * N_CELLS, seed=0)
        distinct = Counter()
        for cell in {(r.topic, r.level, r.prompt) for r in records}:
            distinct[cell[:2]] += 1
        assert len(distinct) == N_CELLS
        assert min(distinct.values()) >= 5, min(distinct.items(), key=lambda kv: kv[1])


# --- answers, re-computed from the prompt text alone ------------------------------------------------------

UNIT_FACTORS = {
    ("cm", "mm"): 10,
    ("m", "cm"): 100,
    ("km", "m"): 1000,
    ("kg", "g"): 1000,
    ("L", "mL"): 1000,
    ("h", "min"): 60,
    ("min", "s"): 60,
    ("h", "s"): 3600,
}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _solve_from_prompt(topic: str, prompt: str) -> int:
    """An independent solver: parse the numbers back from the prompt and compute in plain Python."""
    if topic == "mod":
        a, b = map(int, re.fullmatch(r"(\d+) mod (\d+)=", prompt).groups())
        return a - b * int(a / b)  # a, b > 0: remainder by truncated division
    if topic == "sequence":
        t0, t1, t2 = map(int, re.fullmatch(r"(-?\d+),(-?\d+),(-?\d+),next=", prompt).groups())
        assert t1 - t0 == t2 - t1 != 0, prompt  # really an arithmetic sequence
        return t2 + (t2 - t1)
    if topic == "area":
        w, h = map(int, re.fullmatch(r"area (\d+)x(\d+)=", prompt).groups())
        return sum(w for _ in range(h))
    if topic == "count":
        k, n = map(int, re.fullmatch(r"multiples of (\d+) in 1\.\.(\d+)=", prompt).groups())
        return len(range(k, n + 1, k))
    if topic == "max":
        values = _ints(re.fullmatch(r"max\(([-\d,]+)\)=", prompt).group(1))
        return sorted(values)[-1]
    if topic == "dot":
        u, v = (_ints(g) for g in re.fullmatch(r"\(([-\d,]+)\)\.\(([-\d,]+)\)=", prompt).groups())
        assert len(u) == len(v)
        return sum(a * b for a, b in zip(u, v))
    if topic == "word":
        match = re.fullmatch(r"Ann had (\d+) pens((?:, (?:got|gave) \d+)+)\. Pens now=", prompt)
        total = int(match.group(1))
        for verb, amount in re.findall(r"(got|gave) (\d+)", match.group(2)):
            total += int(amount) if verb == "got" else -int(amount)
            assert total >= 0, prompt  # Ann never gives away pens she does not have
        return total
    if topic == "units":
        simple = re.fullmatch(r"(\d+) (\w+) in (\w+)=", prompt)
        if simple:
            amount, unit, target = simple.groups()
            return int(amount) * UNIT_FACTORS[unit, target]
        amount, unit, rest, rest_unit, target = re.fullmatch(
            r"(\d+) (\w+) (\d+) (\w+) in (\w+)=", prompt
        ).groups()
        rest_factor = 1 if rest_unit == target else UNIT_FACTORS[rest_unit, target]
        assert int(rest) < UNIT_FACTORS[unit, rest_unit], prompt  # "3 m 145 cm" would not be a clean quantity
        return int(amount) * UNIT_FACTORS[unit, target] + int(rest) * rest_factor
    if topic == "power":
        base, exponent = re.fullmatch(r"(\d+|\(-\d+\))\^(\d+)=", prompt).groups()
        result = 1
        for _ in range(int(exponent)):
            result *= int(base.strip("()"))
        return result
    raise AssertionError(f"no solver for {topic}")


@pytest.mark.parametrize("split", ["sft", "train", "validation", "test"])
def test_every_answer_matches_an_independent_computation(split):
    records = arith.generate(split, 30 * N_CELLS, seed=11)
    for record in records:
        assert int(record.answer) == _solve_from_prompt(record.topic, record.prompt), record
        assert arith.verify(record.answer, record.answer) == 1.0


def test_operands_kept_in_extra_agree_with_the_prompt():
    for record in arith.generate("train", 4 * N_CELLS, seed=2):
        ops = record.extra["operands"]
        if record.topic == "mod":
            assert record.prompt == f"{ops['a']} mod {ops['b']}="
        elif record.topic == "dot":
            assert int(record.answer) == sum(a * b for a, b in zip(ops["u"], ops["v"]))
        elif record.topic == "power":
            assert int(record.answer) == ops["base"] ** ops["exponent"]
        elif record.topic == "max":
            assert int(record.answer) == max(ops["values"]) and len(ops["values"]) >= 3


def test_levels_get_harder():
    # Harder levels have longer answers or more operands: the mean prompt+answer length rises with level.
    records = arith.generate("train", 40 * N_CELLS, seed=0)
    for topic in arith.TOPICS:
        size = [
            sum(len(r.prompt) + len(r.answer) for r in records if r.topic == topic and r.level == lv)
            for lv in arith.LEVELS
        ]
        assert size[0] < size[-1], (topic, size)


# --- verifier -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("42", "42", 1.0),  # the bare answer, as the base model writes it
        ("41", "42", 0.0),  # wrong
        ("40 + 2 = 42", "42", 1.0),  # work, then the answer: the last number counts
        ("42, no wait: 43", "42", 0.0),  # the last number is 43
        ("Answer: 42. Check: 40+2", "42", 1.0),  # after "Answer:" the first number counts, not the last
        ("answer: 7\nanswer: 42 (6*7)", "42", 1.0),  # the LAST "Answer:" tag
        ("the answer is 42 since 6*7", "42", 1.0),
        ("I do not know", "42", 0.0),  # no number -> 0
        ("", "42", 0.0),
        ("-4", "-4", 1.0),  # negative numbers
        ("4", "-4", 0.0),
        ("-4", "4", 0.0),
        ("x=-4", "-4", 1.0),
        ("7-3", "3", 1.0),  # a minus glued to a digit is subtraction: the last number is 3, not -3
        ("7-3", "-3", 0.0),
        ("12.0", "12", 1.0),  # decimals compared exactly
        ("12.5", "12", 0.0),
        ("= 12.", "12", 1.0),  # sentence full stop is not a decimal point
        ("42</s>", "42", 1.0),  # a decoded EOS left in the text
        ("abc42", "42", 0.0),  # glued to a word: not a number
        ("Answer: -15", "-15", 1.0),
        (" 42 ", " 42 ", 1.0),  # whitespace around the gold answer
    ],
)
def test_verify(completion, answer, expected):
    assert arith.verify(completion, answer) == expected


def test_verify_rejects_non_numeric_gold():
    with pytest.raises(ValueError, match="'x'"):
        arith.verify("1", "x")


@pytest.mark.parametrize(
    ("predicted", "answer", "kind"),
    [
        ("42", "42", "right"),
        (Fraction(12), "12", "right"),  # extract_answer's value, not only its text
        ("12.0", "12", "right"),
        ("427", "42", "run-on"),  # the answer's digits, then more
        ("4271", "42", "run-on"),
        ("-427", "-42", "run-on"),
        ("100", "10", "run-on"),
        ("41", "42", "near miss"),  # off by one or two
        ("40", "42", "near miss"),
        ("0", "-1", "near miss"),  # off by one across zero
        ("47", "42", "near miss"),  # one digit slipped, as many digits
        ("92", "42", "near miss"),
        ("5", "0", "near miss"),  # a one-digit answer: any other digit is one slipped digit
        ("07", "0", "near miss"),  # 0 run on reads as the number 7: by value, a slipped digit
        ("-42", "42", "other"),  # the sign, not a digit
        ("57", "42", "other"),  # two digits differ
        ("142", "42", "other"),  # a digit in front is not a run-on
        ("7/2", "3", "other"),
        ("3.5", "3", "other"),
        (None, "3", "no number"),
        ("", "3", "no number"),
    ],
)
def test_answer_kind(predicted, answer, kind):
    assert arith.answer_kind(predicted, answer) == kind
    assert kind in arith.ANSWER_KINDS


def test_answer_kind_shares_by_hand():
    # answer 42: "42" right, "427" run-on, "41" near miss, "57" other, None no number; answer 5: "5", "5" right
    shares = arith.answer_kind_shares([(["42", "427", "41", "57", None], "42"), (["5", "5"], "5")])
    assert shares == pytest.approx(
        {"right": 3 / 7, "near miss": 1 / 7, "run-on": 1 / 7, "other": 1 / 7, "no number": 1 / 7}
    )
    assert arith.answer_kind_shares([]) == {}
