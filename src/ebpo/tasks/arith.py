"""``arith``: synthetic verifiable arithmetic in nine topics x five levels, small enough for a CPU model.

Each topic is one distinct skill and stands for one of the paper's nine topic labels (docs/design.md §4), so that
topic-clustered sampling (EBPO-topic) has real clusters to work with:

| topic      | skill                                   | example prompt -> answer      | paper label                          |
|------------|-----------------------------------------|-------------------------------|--------------------------------------|
| `mod`      | remainder of a division                 | `17 mod 5=` -> `2`            | Algebra & Number Theory              |
| `sequence` | next term of an arithmetic sequence     | `3,7,11,next=` -> `15`        | Calculus & Analysis                  |
| `area`     | area of a rectangle (multiplication)    | `area 3x4=` -> `12`           | Geometry & Trigonometry              |
| `count`    | multiples of k in 1..n (floor division) | `multiples of 3 in 1..20=` -> `6` | Discrete Mathematics             |
| `max`      | largest of a list (order statistic)     | `max(31,9,47)=` -> `47`       | Probability & Statistics             |
| `dot`      | dot product of two integer vectors      | `(1,2).(3,4)=` -> `11`        | Linear Algebra                       |
| `word`     | one fixed word-problem template         | `Ann had 5 pens, got 3, gave 2. Pens now=` -> `6` | Applied Mathematics & Word Problems |
| `units`    | unit conversion                         | `3 m 45 cm in cm=` -> `345`   | Physics & Chemistry                  |
| `power`    | integer powers                          | `(-3)^3=` -> `-27`            | Advanced Mathematics                 |

Levels 1..5 grow the numbers and the number of operands, within what a tiny character-level model learns
to compute on a CPU (``ebpo base-model``): level 1 is one-digit work (tables of about a hundred facts),
level 5 two-digit work (``area 7x86=``, ``(-3,8).(5,-2)=``, ``37 km 45 m in m=``) that it gets right only
part of the time. Negative numbers come in at level 5 of ``sequence``, ``max`` and ``dot`` and in every
``power`` level. The response the model is trained to give is the bare final answer followed by EOS;
``verify`` reads the last number of a completion (or the number after the last ``Answer:``), so longer
completions are scored the same way.

Splits are disjoint by construction (``ebpo.tasks.splits``): a problem's split is decided by a SHA-256 hash of
its prompt text, and ``generate`` only emits prompts that hash into the requested split, so the same prompt never
appears in two splits, whatever the seeds. Four splits: ``sft`` (60%: the base model's supervised fine-tuning
pool), ``train`` (20%: the prompts RL trains on, never seen in SFT), ``validation`` (10%) and ``test``
(10%).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction

from ebpo.data import Record
from ebpo.data.topics import TOPICS as PAPER_TOPIC_LABELS
from ebpo.tasks.splits import SPLITS as SPLITS  # arith.SPLITS, arith.split_of: the shared splits, re-exported
from ebpo.tasks.splits import check_split
from ebpo.tasks.splits import split_of as split_of

TOPICS: tuple[str, ...] = ("mod", "sequence", "area", "count", "max", "dot", "word", "units", "power")
LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)

# arith topic -> the paper's topic label (docs/design.md §4): the i-th arith topic stands for the i-th paper label, so
# each of the nine labels has exactly one arith topic (see the table in the module docstring).
PAPER_TOPICS: dict[str, str] = dict(zip(TOPICS, PAPER_TOPIC_LABELS, strict=True))


# A problem: (prompt, integer answer, operands kept in Record.extra for independent re-computation).
Problem = tuple[str, int, dict]
ProblemMaker = Callable[[random.Random, int], Problem]


def _span(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi)


def _nonzero(rng: random.Random, bound: int) -> int:
    """Uniform over [-bound, bound] without 0."""
    value = rng.randint(1, bound)
    return value if rng.random() < 0.5 else -value


# --- the nine topics ------------------------------------------------------------------------------------

_MOD_RANGES = {
    1: ((1, 30), (2, 5)),
    2: ((10, 60), (2, 9)),
    3: ((10, 99), (2, 12)),
    4: ((100, 999), (2, 12)),
    5: ((100, 999), (13, 30)),
}  # level: (a range, b range)


def _make_mod(rng: random.Random, level: int) -> Problem:
    (a_lo, a_hi), (b_lo, b_hi) = _MOD_RANGES[level]
    a, b = _span(rng, a_lo, a_hi), _span(rng, b_lo, b_hi)
    return f"{a} mod {b}=", a % b, {"a": a, "b": b}


_SEQUENCE_RANGES = {
    1: (0, 40, 1, 3, False),
    2: (0, 50, 1, 6, False),
    3: (0, 50, 1, 9, False),
    4: (0, 99, 1, 9, False),
    5: (-50, 99, 1, 20, True),
}  # start lo/hi, |d| lo/hi, signed


def _make_sequence(rng: random.Random, level: int) -> Problem:
    s_lo, s_hi, d_lo, d_hi, signed = _SEQUENCE_RANGES[level]
    start = _span(rng, s_lo, s_hi)
    step = _nonzero(rng, d_hi) if signed else _span(rng, d_lo, d_hi)
    terms = [start + k * step for k in range(3)]
    return ",".join(map(str, terms)) + ",next=", start + 3 * step, {"start": start, "step": step}


_AREA_RANGES = {
    1: ((1, 10), (1, 10)),
    2: ((2, 9), (10, 20)),
    3: ((2, 9), (10, 30)),
    4: ((2, 9), (10, 60)),
    5: ((2, 9), (10, 99)),
}


def _make_area(rng: random.Random, level: int) -> Problem:
    (a_lo, a_hi), (b_lo, b_hi) = _AREA_RANGES[level]
    width, height = _span(rng, a_lo, a_hi), _span(rng, b_lo, b_hi)
    if rng.random() < 0.5:
        width, height = height, width
    return f"area {width}x{height}=", width * height, {"width": width, "height": height}


_COUNT_RANGES = {
    1: ((2, 4), (1, 40)),
    2: ((2, 9), (10, 60)),
    3: ((2, 9), (10, 99)),
    4: ((2, 12), (100, 199)),
    5: ((2, 19), (100, 999)),
}  # level: (k range, n range)


def _make_count(rng: random.Random, level: int) -> Problem:
    (k_lo, k_hi), (n_lo, n_hi) = _COUNT_RANGES[level]
    k, n = _span(rng, k_lo, k_hi), _span(rng, n_lo, n_hi)
    return f"multiples of {k} in 1..{n}=", n // k, {"k": k, "n": n}


_MAX_RANGES = {1: (3, 0, 9), 2: (3, 0, 99), 3: (4, 0, 99), 4: (5, 0, 99), 5: (4, -99, 99)}


def _make_max(rng: random.Random, level: int) -> Problem:
    length, lo, hi = _MAX_RANGES[level]
    values = [_span(rng, lo, hi) for _ in range(length)]
    return "max(" + ",".join(map(str, values)) + ")=", max(values), {"values": values}


_DOT_RANGES = {1: (2, 0, 3), 2: (2, 0, 4), 3: (2, 0, 5), 4: (2, 0, 7), 5: (2, -5, 9)}


def _make_dot(rng: random.Random, level: int) -> Problem:
    length, lo, hi = _DOT_RANGES[level]
    u = [_span(rng, lo, hi) for _ in range(length)]
    v = [_span(rng, lo, hi) for _ in range(length)]

    def vec(xs: list[int]) -> str:
        return "(" + ",".join(map(str, xs)) + ")"

    return f"{vec(u)}.{vec(v)}=", sum(a * b for a, b in zip(u, v)), {"u": u, "v": v}


_WORD_RANGES = {
    1: (1, 9, 1, 9),
    2: (1, 20, 1, 9),
    3: (1, 20, 2, 9),
    4: (10, 50, 2, 9),
    5: (10, 99, 2, 20),
}  # start lo/hi, number of events, largest amount


def _make_word(rng: random.Random, level: int) -> Problem:
    s_lo, s_hi, n_events, amount_hi = _WORD_RANGES[level]
    start = _span(rng, s_lo, s_hi)
    total, events = start, []
    for _ in range(n_events):
        amount = _span(rng, 1, amount_hi)
        if amount <= total and rng.random() < 0.5:  # "gave" never makes the count negative
            events.append(("gave", amount))
            total -= amount
        else:
            events.append(("got", amount))
            total += amount
    text = f"Ann had {start} pens" + "".join(f", {verb} {amount}" for verb, amount in events) + ". Pens now="
    return text, total, {"start": start, "events": [[verb, amount] for verb, amount in events]}


# level -> choices of (big unit, small unit, factor, largest amount); "compound" levels ask for
# "a BIG b SMALL in SMALL" (= a * factor + b, with b < factor), the others for "a BIG in SMALL" (= a * factor).
_UNITS_LEVELS = {
    1: (False, [("cm", "mm", 10, 150)]),
    2: (False, [("cm", "mm", 10, 999), ("m", "cm", 100, 99)]),
    3: (
        False,
        [("m", "cm", 100, 999), ("km", "m", 1000, 999), ("kg", "g", 1000, 999), ("L", "mL", 1000, 999)],
    ),
    4: (True, [("m", "cm", 100, 99)]),
    5: (True, [("km", "m", 1000, 99), ("kg", "g", 1000, 99), ("L", "mL", 1000, 99)]),
}


def _make_units(rng: random.Random, level: int) -> Problem:
    compound, choices = _UNITS_LEVELS[level]
    big, small, factor, amount_hi = rng.choice(choices)
    amount = _span(rng, 1, amount_hi)
    if not compound:
        return f"{amount} {big} in {small}=", amount * factor, {"amount": amount, "factor": factor}
    rest = _span(rng, 0, factor - 1)
    return (
        f"{amount} {big} {rest} {small} in {small}=",
        amount * factor + rest,
        {"amount": amount, "factor": factor, "rest": rest},
    )


# level -> list of (weight, base bound or (lo, hi) magnitude, exponent range)
_POWER_CHOICES = {
    1: [(1.0, (0, 20), (0, 2))],
    2: [(0.7, (0, 30), (2, 2)), (0.3, (0, 6), (3, 3))],
    3: [(0.7, (0, 40), (2, 2)), (0.3, (0, 9), (3, 3))],
    4: [(0.7, (10, 60), (2, 2)), (0.3, (0, 9), (3, 3))],
    5: [(0.6, (10, 99), (2, 2)), (0.3, (0, 20), (3, 3)), (0.1, (2, 5), (4, 4))],
}


def _make_power(rng: random.Random, level: int) -> Problem:
    choices = _POWER_CHOICES[level]
    _, (m_lo, m_hi), (e_lo, e_hi) = rng.choices(choices, weights=[w for w, _, _ in choices])[0]
    magnitude, exponent = _span(rng, m_lo, m_hi), _span(rng, e_lo, e_hi)
    base = -magnitude if magnitude and rng.random() < 0.5 else magnitude
    shown = f"({base})" if base < 0 else str(base)
    return f"{shown}^{exponent}=", base**exponent, {"base": base, "exponent": exponent}


PROBLEM_MAKERS: dict[str, ProblemMaker] = {
    "mod": _make_mod,
    "sequence": _make_sequence,
    "area": _make_area,
    "count": _make_count,
    "max": _make_max,
    "dot": _make_dot,
    "word": _make_word,
    "units": _make_units,
    "power": _make_power,
}
assert tuple(PROBLEM_MAKERS) == TOPICS and set(PAPER_TOPICS) == set(TOPICS)


# --- splits and generation ------------------------------------------------------------------------------


def _check_choices(name: str, given: Iterable | None, valid: Sequence) -> list:
    if given is None:
        return list(valid)
    chosen = list(given)
    bad = [g for g in chosen if g not in valid]
    if bad or not chosen:
        raise ValueError(f"unknown arith {name} {bad or chosen!r}; valid: {', '.join(map(str, valid))}")
    return chosen


def generate(
    split: str,
    n: int,
    seed: int = 0,
    *,
    topics: Iterable[str] | None = None,
    levels: Iterable[int] | None = None,
    max_tries: int = 10_000,
) -> list[Record]:
    """Generate ``n`` problems of ``split`` (``train`` / ``validation`` / ``test``), deterministic in ``seed``.

    Record ``i`` comes from cell ``cells[i % len(cells)]`` of the (topic, level) grid (topic-major order),
    so every cell gets ``n // 45`` or one more problem; within a cell problems are drawn at random from the
    level's ranges until one whose prompt hashes into ``split`` comes up (see ``split_of``). Records carry
    ``topic`` (the arith topic; ``PAPER_TOPICS`` maps it to the paper's label, also kept in
    ``extra["paper_topic"]``), ``level``, ``source="arith"``, and the operands in ``extra["operands"]``.
    Problems may repeat inside one split (small cells have a few hundred prompts); never across splits.
    """
    split = check_split(split, "arith")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    chosen_topics = _check_choices("topics", topics, TOPICS)
    chosen_levels = _check_choices("levels", levels, LEVELS)
    cells = [(topic, level) for topic in chosen_topics for level in chosen_levels]
    rng = random.Random(f"arith/{split}/{seed}")
    records: list[Record] = []
    for i in range(n):
        topic, level = cells[i % len(cells)]
        for _ in range(max_tries):
            prompt, answer, operands = PROBLEM_MAKERS[topic](rng, level)
            if split_of(prompt) == split:
                break
        else:  # pragma: no cover - every cell has hundreds of prompts in every split (tested)
            raise RuntimeError(
                f"arith: no {split} problem for topic {topic!r} level {level} in {max_tries} tries"
            )
        records.append(
            Record(
                id=f"arith-{split}-{seed}-{i:06d}",
                prompt=prompt,
                answer=str(answer),
                topic=topic,
                source="arith",
                level=level,
                extra={"operands": operands, "paper_topic": PAPER_TOPICS[topic]},
            )
        )
    return records


# --- verification ---------------------------------------------------------------------------------------

# A number not glued to a preceding letter or digit: "7-3" reads as 7 and 3, "x=-4" as -4.
_NUMBER = re.compile(r"(?<![0-9A-Za-z.])-?\d+(?:\.\d+)?")
_ANSWER_TAG = re.compile(r"\banswer\s*(?::|is\b)", re.IGNORECASE)


def extract_answer(completion: str) -> Fraction | None:
    """The final answer of a completion: the first number after the last ``Answer:``, else the last number.

    Numbers are integers or decimals with an optional minus sign (``-4``, ``12.0``); ``None`` when there is
    no number. Returned as an exact ``Fraction`` so ``12.0`` equals ``12``.
    """
    tags = list(_ANSWER_TAG.finditer(completion))
    if tags:
        after = _NUMBER.search(completion, tags[-1].end())
        if after is not None:
            return Fraction(after.group())
    numbers = _NUMBER.findall(completion)
    return Fraction(numbers[-1]) if numbers else None


def verify(completion: str, answer: str) -> float:
    """1.0 if the completion's final answer (``extract_answer``) equals the integer ``answer``, else 0.0."""
    try:
        gold = Fraction(answer.strip())
    except (ValueError, AttributeError) as err:
        raise ValueError(f"arith gold answer must be a number, got {answer!r}") from err
    predicted = extract_answer(completion)
    return 1.0 if predicted is not None and predicted == gold else 0.0


ANSWER_KINDS: tuple[str, ...] = ("right", "near miss", "run-on", "other", "no number")
"""What :func:`answer_kind` calls a sampled answer, in the order reports list them."""


def answer_kind(predicted: Fraction | str | None, answer: str) -> str:
    """What kind of answer ``predicted`` (an :func:`extract_answer` value, or its text) is for the integer
    ``answer``: one of :data:`ANSWER_KINDS`.

    - ``right``: equal to the answer;
    - ``run-on``: the answer's digits followed by more digits, same sign (``42`` -> ``427``, ``4271``): the
      base model's run-on teacher writes these (``ebpo.models.recipes.arith.run_ons``);
    - ``near miss``: off by one or two, or, with as many digits and the same sign, one digit different
      (``42`` -> ``41``, ``44``, ``47``, ``92``; for a one-digit answer any other digit): what the near-miss
      teacher writes (``ebpo.models.recipes.arith.near_misses``) and what arithmetic slips look like;
    - ``other``: any other number (a decimal included); ``no number``: nothing to extract.

    Which errors RL removes tells sharpening a computation (near misses, others) from learning one shared
    habit (run-ons: where to stop), docs/results/sensitivity_rechecks/README.md.
    """
    if predicted is None or predicted == "":
        return "no number"
    guess, gold = Fraction(predicted), Fraction(answer.strip())
    if guess == gold:
        return "right"
    if guess.denominator != 1 or gold.denominator != 1:
        return "other"
    g, a = int(guess), int(gold)
    same_sign = (g < 0) == (a < 0)
    digits_g, digits_a = str(abs(g)), str(abs(a))
    if same_sign and len(digits_g) > len(digits_a) and digits_g.startswith(digits_a):
        return "run-on"
    if abs(g - a) <= 2:
        return "near miss"
    if same_sign and len(digits_g) == len(digits_a) and sum(x != y for x, y in zip(digits_g, digits_a)) == 1:
        return "near miss"
    return "other"


def answer_kind_shares(problems: Iterable[tuple[Sequence[Fraction | str | None], str]]) -> dict[str, float]:
    """The share of the sampled answers of each :data:`ANSWER_KINDS` over ``(answers, gold answer)`` pairs
    (:func:`answer_kind` of each answer): which errors a policy still makes. Empty when there are no answers."""
    kinds = [answer_kind(a, gold) for answers, gold in problems for a in answers]
    return {kind: kinds.count(kind) / len(kinds) for kind in ANSWER_KINDS} if kinds else {}
