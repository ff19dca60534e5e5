"""The ``math`` and ``math_dapo`` rewards: final-answer extraction, then math-verify in a killable pool.

A completion is scored in two stages.

1. Extraction, in the calling process, linear in the completion length (:func:`extract_final_answer`):
   the content of the last ``\\boxed{...}`` or ``\\fbox{...}`` with balanced braces (escaped ``\\{``,
   ``\\}`` do not count); failing that, the text after the last "answer is" / "Answer:" (the rest of that
   line, with a trailing period and ``$`` delimiters removed). No extractable answer scores as wrong,
   without calling the verifier.
2. Comparison with math-verify, gold first (``verify(parse(gold), parse(pred))``: the function is not
   symmetric, docs/design.md §6). Both sides are parsed from ``\\boxed{...}`` around the normalised answer
   (:func:`normalize_answer` strips ``$`` delimiters, as in OlympiadBench's ``$2^{1009}$``). math-verify's
   own SIGALRM timeouts are off (``parsing_timeout=None``, ``timeout_seconds=None``: math-verify 0.9 API);
   the wall-clock limit is enforced by :class:`ebpo.rewards.pool.TimeoutPool`, whose workers are killed
   and replaced on overrun. An overrun scores as wrong and is counted (``reward/timeouts``).

``math`` scores 1 / 0. ``math_dapo`` scores +1 / -1 as in DAPO (Yu et al. 2025, verl's ``math_dapo``
reward); it uses the same extraction and math-verify comparison as ``math`` rather than DAPO's
string-normalising "Answer:" matcher, so the two rewards agree on which answers are correct.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ebpo.rewards.pool import TimeoutPool

# The verifier workers import this module: its top level imports only the standard library, so a worker
# holds math-verify and little else; ``ebpo.rewards.pool`` is imported where used.

__all__ = [
    "MathReward",
    "extract_final_answer",
    "last_boxed",
    "normalize_answer",
    "verify_answer",
    "verify_answer_safe",
]

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"(?<!\\)[{}]")
_PHRASE_RE = re.compile(r"(?:answer\s+is|answer\s*:)", re.IGNORECASE)
_DOLLAR_RE = re.compile(r"(?<!\\)\$")
_TEXT_MODE_PREFIX_RE = re.compile(r"^(?:\\\(|\\\[)|(?:\\\)|\\\])$")


def _matching_braces(text: str) -> dict[int, int]:
    """Map the position of every unescaped ``{`` that is closed to the position of its ``}``. O(len)."""
    match: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_RE.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            match[stack.pop()] = m.start()
    return match


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` whose braces balance, or ``None``."""
    starts = [m.end() - 1 for m in _BOX_RE.finditer(text)]  # positions of the opening braces
    if not starts:
        return None
    match = _matching_braces(text)
    for open_pos in reversed(starts):
        close_pos = match.get(open_pos)
        if close_pos is not None:
            return text[open_pos + 1 : close_pos]
    return None


def _after_phrase(text: str) -> str | None:
    """The answer after the last "answer is" / "Answer:": rest of that line, trailing period dropped."""
    last = None
    for last in _PHRASE_RE.finditer(text):  # noqa: B007 (we want the last match)
        pass
    if last is None:
        return None
    line = text[last.end() :].split("\n", 1)[0].strip()
    inline = re.search(r"(?<!\\)\$(.+?)(?<!\\)\$", line)  # "... is $\frac{1}{2}$." -> \frac{1}{2}
    if inline:
        line = inline.group(1)
    line = line.strip().rstrip(".").strip()
    return line or None


def extract_final_answer(completion: str) -> str | None:
    """The final answer of a completion, or ``None`` (see the module docstring for the rules).

    >>> extract_final_answer("so x = 2, and the answer is \\\\boxed{\\\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    >>> extract_final_answer("Answer: 42")
    '42'
    """
    boxed = last_boxed(completion)
    if boxed is not None:
        return normalize_answer(boxed) or None
    phrase = _after_phrase(completion)
    return normalize_answer(phrase) if phrase else None


def normalize_answer(answer: str) -> str:
    """Strip whitespace, unescaped ``$`` delimiters and ``\\( \\)`` / ``\\[ \\]`` wrappers from an answer."""
    text = _DOLLAR_RE.sub("", str(answer)).strip()
    return _TEXT_MODE_PREFIX_RE.sub("", text).strip()


# -- math-verify, run inside the workers ------------------------------------------------------------


def _quiet_math_verify() -> None:
    """Worker start-up: import math-verify and silence its "timeout is disabled" warnings (we time it)."""
    import math_verify  # noqa: F401

    for name in ("math_verify", "math_verify.parser", "math_verify.grader", "math_verify.utils"):
        logging.getLogger(name).setLevel(logging.ERROR)


_CACHE_MAX_CHARS = 1000  # longer answers are parsed every time (and never pinned in the cache)


@functools.lru_cache(maxsize=4096)
def _parse_cached(answer: str) -> Any:
    """math-verify's parse of ``\\boxed{answer}``, SIGALRM timeout off; cached (a gold repeats G times and
    a group's samples often give the same answer)."""
    return _parse(answer)


def _parse(answer: str) -> Any:
    from math_verify import parse

    return parse("\\boxed{" + answer + "}", parsing_timeout=None)


def verify_answer(gold: str, pred: str) -> bool:
    """math-verify equivalence, gold first: ``verify(parse(gold), parse(pred))``, no time limit of its own.

    Both strings are final answers (already extracted); call it in a :class:`TimeoutPool` worker, or
    in-process only on trusted input.
    """
    from math_verify import verify

    gold, pred = normalize_answer(gold), normalize_answer(pred)
    gold_parsed = _parse_cached(gold) if len(gold) <= _CACHE_MAX_CHARS else _parse(gold)
    pred_parsed = _parse_cached(pred) if len(pred) <= _CACHE_MAX_CHARS else _parse(pred)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def verify_answer_safe(gold: str, pred: str) -> bool:
    """:func:`verify_answer` that returns ``False`` instead of raising (for the in-process path)."""
    try:
        return verify_answer(gold, pred)
    except Exception:
        return False


# -- the reward objects -----------------------------------------------------------------------------


class MathReward:
    """Binary math reward: ``correct`` if math-verify says the extracted answer equals the gold, else ``wrong``.

    Args:
        correct: reward of a verified answer (``math``: 1.0, ``math_dapo``: +1.0).
        wrong: reward of a wrong, missing, unparsable or timed-out answer (``math``: 0.0, ``math_dapo``: -1.0).
        num_workers: verifier processes; ``0`` verifies in-process with NO time limit (trusted input only,
            e.g. the gold-vs-gold benchmark).
        timeout_s: wall-clock limit per verified answer; an overrun kills the worker and scores ``wrong``.
        start_method: ``"exec"`` (default on POSIX: fresh interpreters), ``"spawn"`` or ``"forkserver"``.

    Call ``reward(completion, answer)`` for one sample or ``reward.batch(completions, answers)`` for many
    (one pool round trip, answers verified in parallel). ``metrics()`` returns cumulative counts:
    ``reward/verified``, ``reward/no_answer``, ``reward/timeouts``, ``reward/verifier_errors``.
    The worker pool is shared by all rewards with the same settings, created on first use and shut down at
    interpreter exit; pickling a reward (e.g. to a Ray worker) leaves the pool behind.
    """

    def __init__(
        self,
        *,
        correct: float = 1.0,
        wrong: float = 0.0,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        start_method: str | None = None,
    ):
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 (0 = in-process, no time limit), got {num_workers}")
        self.correct = float(correct)
        self.wrong = float(wrong)
        self.num_workers = int(num_workers)
        self.timeout_s = float(timeout_s)
        self.start_method = start_method
        self._counts = {"verified": 0, "no_answer": 0, "timeouts": 0, "verifier_errors": 0}

    def pool(self) -> TimeoutPool:
        """The shared worker pool for these settings (started lazily on first use)."""
        from ebpo.rewards.pool import shared_pool

        return shared_pool(
            verify_answer,
            num_workers=self.num_workers,
            timeout_s=self.timeout_s,
            start_method=self.start_method,
            init=_quiet_math_verify,
        )

    def extract(self, completion: str) -> str | None:
        """The completion's final answer (:func:`extract_final_answer`)."""
        return extract_final_answer(completion)

    def equivalent_batch(self, golds: Sequence[str], preds: Sequence[str]) -> list[bool]:
        """math-verify equivalence of already-extracted answer pairs, gold first, under the time limit.

        A timeout or verifier error counts as not equivalent. Used by the reward and by maj@k clustering.
        """
        if len(golds) != len(preds):
            raise ValueError(f"got {len(golds)} gold answers but {len(preds)} predicted answers")
        pairs = [(str(g), str(p)) for g, p in zip(golds, preds)]
        if self.num_workers == 0:
            return [verify_answer_safe(g, p) for g, p in pairs]
        from ebpo.rewards.pool import Outcome

        out: list[bool] = []
        for result in self.pool().map(pairs):
            if result.outcome is Outcome.TIMEOUT:
                self._counts["timeouts"] += 1
            elif result.outcome is Outcome.ERROR:
                self._counts["verifier_errors"] += 1
            out.append(result.outcome is Outcome.OK and bool(result.value))
        return out

    def equivalent(self, gold: str, pred: str) -> bool:
        """One pair of :meth:`equivalent_batch`."""
        return self.equivalent_batch([gold], [pred])[0]

    def batch(self, completions: Sequence[str], answers: Sequence[str]) -> list[float]:
        """Rewards of many completions against their gold answers (same length), in order."""
        if len(completions) != len(answers):
            raise ValueError(f"got {len(completions)} completions but {len(answers)} answers")
        extracted = [extract_final_answer(str(c)) for c in completions]
        todo = {i: pred for i, pred in enumerate(extracted) if pred is not None}  # row -> its answer
        self._counts["no_answer"] += len(completions) - len(todo)
        ok = self.equivalent_batch([answers[i] for i in todo], list(todo.values()))
        self._counts["verified"] += len(todo)
        rewards = [self.wrong] * len(completions)
        for i, good in zip(todo, ok):
            rewards[i] = self.correct if good else self.wrong
        return rewards

    def __call__(self, completion: str, answer: str) -> float:
        return self.batch([completion], [answer])[0]

    def metrics(self) -> dict[str, float]:
        """Cumulative counters under the ``reward/`` namespace."""
        return {f"reward/{k}": float(v) for k, v in self._counts.items()}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(correct={self.correct}, wrong={self.wrong}, "
            f"num_workers={self.num_workers}, timeout_s={self.timeout_s})"
        )
