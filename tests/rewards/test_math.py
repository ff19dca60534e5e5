"""The ``math`` and ``math_dapo`` rewards (``ebpo.rewards.math``): final-answer extraction, math-verify scoring
in process and in its pool, and on every shared benchmark gold."""

from __future__ import annotations

import json
import pickle
import random
import re

import pytest

from ebpo.rewards import get_reward
from ebpo.rewards.math import extract_final_answer, normalize_answer

# -- extraction: hand cases --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("first \\boxed{1}, then corrected: \\boxed{2}", "2"),  # the last box wins
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),  # nested braces balance
        ("\\fbox{7} done", "7"),
        ("\\boxed {x^2}", "x^2"),  # a space before the brace
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces do not count
        ("\\boxed{3} and then \\boxed{\\frac{1}{2", "3"),  # an unclosed last box falls back to the one before
        ("\\boxed{$\\dfrac{3}{4}$}", "\\dfrac{3}{4}"),  # $ delimiters inside a box are dropped
        ("\\boxed{\\$18.90}", "\\$18.90"),  # an escaped dollar sign is kept
        ("Answer: 42", "42"),
        ("Reasoning...\nThe final answer is $\\frac{1}{2}$. I hope", "\\frac{1}{2}"),
        ("the answer is 3.5.\nDone", "3.5"),
        ("I computed it. ANSWER: x = 5", "x = 5"),
        ("no final answer here, 42", None),
        ("\\boxed{}", None),  # empty box, nothing else
        ("\\boxed{" + "{" * 50, None),  # never closed
        ("", None),
    ],
)
def test_extract_final_answer_cases(completion, expected):
    assert extract_final_answer(completion) == expected


def test_normalize_answer():
    assert normalize_answer("  $2^{1009}$ ") == "2^{1009}"
    assert normalize_answer("$69$,$84$") == "69,84"
    assert normalize_answer("\\(x+1\\)") == "x+1"
    assert normalize_answer("\\$36") == "\\$36"


# -- extraction: a quadratic reference against the linear implementation ---------------------------


def _reference_last_boxed(text: str) -> str | None:
    """Slow reference: for every box command from the last one backwards, walk characters counting depth."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text):
            ch = text[i]
            escaped = i > 0 and text[i - 1] == "\\"
            if ch == "{" and not escaped:
                depth += 1
            elif ch == "}" and not escaped:
                depth -= 1
                if depth == 0:
                    return text[start:i]
            i += 1
    return None


def _reference_extract(text: str) -> str | None:
    boxed = _reference_last_boxed(text)
    if boxed is not None:
        return normalize_answer(boxed) or None
    hits = list(re.finditer(r"answer\s+is|answer\s*:", text, re.IGNORECASE))
    if not hits:
        return None
    line = text[hits[-1].end() :].split("\n")[0].strip()
    inline = re.search(r"(?<!\\)\$(.+?)(?<!\\)\$", line)
    line = (inline.group(1) if inline else line).strip().rstrip(".").strip()
    return normalize_answer(line) if line else None


PIECES = [
    "\\boxed{",
    "\\fbox{",
    "{",
    "}",
    "\\{",
    "\\}",
    "x",
    "12",
    " ",
    "\n",
    "$",
    "Answer: ",
    "answer is ",
    ".",
    "\\frac",
]


@pytest.mark.parametrize("seed", range(6))
def test_extract_matches_reference_on_random_strings(seed):
    rng = random.Random(seed)
    for _ in range(400):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 40)))
        assert extract_final_answer(text) == _reference_extract(text), text


# -- scoring: math and math_dapo in process, and through the pool -----------------------------------------


def test_math_and_dapo_values_in_process():
    math_reward = get_reward("math", num_workers=0)
    dapo = get_reward("math_dapo", num_workers=0)
    completions = [
        "so \\boxed{\\frac{1}{2}}",  # equals 0.5
        "so \\boxed{0.5}",
        "so \\boxed{\\dfrac12}",
        "so \\boxed{0.6}",  # wrong
        "I do not know",  # no answer
    ]
    golds = ["0.5", "\\frac{1}{2}", "\\frac{1}{2}", "\\frac{1}{2}", "\\frac{1}{2}"]
    assert math_reward.batch(completions, golds) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert dapo.batch(completions, golds) == [1.0, 1.0, 1.0, -1.0, -1.0]
    assert math_reward("The answer is $x^2+2x+1$.", "(x+1)^2") == 1.0
    assert math_reward.metrics()["reward/no_answer"] == 1.0
    assert math_reward.metrics()["reward/verified"] == 5.0  # 4 boxed + 1 phrase answer went to math-verify
    with pytest.raises(ValueError, match=r"\b2 completions\b.*\b1 answers\b"):
        math_reward.batch(["a", "b"], ["1"])


def test_gold_first_order_is_used():
    """math-verify is not symmetric: with gold ``x=2`` a bare ``2`` is accepted (assignment simplified on the
    prediction side), which is the documented gold-first behaviour; the reverse order is not what we call."""
    from math_verify import parse, verify

    reward = get_reward("math", num_workers=0)
    gold, pred = "x=2", "2"
    expected = verify(parse("\\boxed{" + gold + "}"), parse("\\boxed{" + pred + "}"))
    assert reward(f"\\boxed{{{pred}}}", gold) == float(expected)


def test_reward_pickles_without_its_pool():
    reward = get_reward("math", num_workers=1, timeout_s=5.0)
    clone = pickle.loads(pickle.dumps(reward))
    assert clone("\\boxed{4}", "4") == 1.0


# -- every gold answer of the five shared benchmarks ---------------------------------------------------

_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_FIRST_INTEGER = re.compile(r"\d+")

# Golds math-verify cannot match against themselves when placed in a completion. Empty: all 1274 verify.
EXPECTED_UNVERIFIABLE: set[tuple[str, int]] = set()
# Perturbed golds that math-verify still accepts. One, a math-verify limitation rather than ours:
# OlympiadBench row 121 has gold ``N=n``; math-verify folds symbol case, so the gold parses as Eq(n, n)
# and the perturbed ``N=n+1`` (Eq(n, n + 1)) is judged equal to it (``N=2n`` is rejected).
EXPECTED_PERTURBATION_NOOPS: set[tuple[str, int]] = {("olympiadbench", 121)}


def _as_model_writes(gold: str) -> str:
    """A gold inside a typical completion: ``$`` math delimiters (OlympiadBench) dropped, ``\\$`` kept."""
    return "... so the answer is \\boxed{" + _UNESCAPED_DOLLAR.sub("", gold) + "}."


def _perturb(gold: str) -> str:
    """A really wrong answer: add 1 to the first integer literal (``(3, pi/2)`` -> ``(4, pi/2)``,
    ``52_8`` -> ``53_8``, ``\\frac{14}{3}`` -> ``\\frac{15}{3}``); answers without digits get a different
    text (``\\text{(C)}`` -> ``\\text{(C)x}``) or ``+ 1`` appended to the expression (``p - q`` -> ``p - q + 1``)."""
    gold = _UNESCAPED_DOLLAR.sub("", gold)
    if _FIRST_INTEGER.search(gold):
        return _FIRST_INTEGER.sub(lambda m: str(int(m.group()) + 1), gold, count=1)
    if "\\text{" in gold:
        return gold.replace("}", "x}", 1)
    if "=" in gold:  # f(n)=n -> f(n)=n+1 for each assignment
        return ",".join(part + "+1" for part in gold.split(","))
    return gold + " + 1"


@pytest.fixture(scope="module")
def all_golds(benchmark_dir) -> list[tuple[str, int, str]]:
    golds = []
    for name in ("aime24", "aime25", "amc23", "math500", "olympiadbench"):
        lines = (benchmark_dir / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
        golds += [(name, i, json.loads(line)["answer"]) for i, line in enumerate(lines) if line.strip()]
    return golds


def test_every_benchmark_gold_scores_one_and_its_perturbation_zero(all_golds):
    assert len(all_golds) == 1274
    reward = get_reward("math", num_workers=2, timeout_s=10.0)
    golds = [gold for _, _, gold in all_golds]
    completions = [_as_model_writes(g) for g in golds] + [_as_model_writes(_perturb(g)) for g in golds]
    scores = reward.batch(completions, golds + golds)  # one pool round trip for all 2548
    n = len(golds)
    unverifiable = {(name, i) for (name, i, _), s in zip(all_golds, scores[:n]) if s != 1.0}
    noops = {(name, i) for (name, i, _), s in zip(all_golds, scores[n:]) if s != 0.0}
    assert unverifiable == EXPECTED_UNVERIFIABLE
    assert noops == EXPECTED_PERTURBATION_NOOPS
    assert reward.metrics()["reward/timeouts"] == 0.0


def test_perturbation_is_really_different():
    assert _perturb("\\left( 3, \\frac{\\pi}{2} \\right)") == "\\left( 4, \\frac{\\pi}{2} \\right)"
    assert _perturb("$69$,$84$") == "70,84"
    assert _perturb("\\text{(C)}") == "\\text{(C)x}"
    assert _perturb("f(x)=x,f(x)=-x") == "f(x)=x+1,f(x)=-x+1"
    assert _perturb("p - q") == "p - q + 1"
