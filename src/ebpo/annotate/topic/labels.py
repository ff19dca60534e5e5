"""The nine topic labels and what every backend shares: the labels' descriptions (the judge's instructions, the
embedding backend's anchors), reading a free-form answer as a label, the benchmarks' instruction line left out,
and the backend protocol."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from ebpo.data.topics import TOPICS  # the paper's nine topics, in its order (docs/design.md §4)

DEFAULT_TOPIC = TOPICS[0]  # the keyword backend's answer when no rule fires (the largest class in math sets)

# What each topic covers: the judge's instructions and the embedding backend's anchors (one sentence each;
# the embedding backend scores a label by its best-matching sentence).
LABEL_DESCRIPTIONS: dict[str, tuple[str, ...]] = {
    "Algebra & Number Theory": (
        "Solve an equation or a system of equations, simplify an algebraic expression, factor a polynomial.",
        "Polynomials, roots, inequalities, functional equations, sequences and logarithms.",
        "Number theory: primes, divisors, divisibility, remainders, modular arithmetic, digits, gcd.",
        "Complex numbers and integer solutions of equations.",
    ),
    "Calculus & Analysis": (
        "Calculus: derivatives, integrals, limits, series convergence and continuity.",
        "Find the maximum or minimum of a function using derivatives; rates of change; area under a curve.",
        "Real analysis: sequences of real numbers, limits, differentiable and continuous functions.",
    ),
    "Geometry & Trigonometry": (
        "Geometry: triangles, circles, polygons, angles, areas, lengths, perimeters and volumes of solids.",
        "Trigonometry: sine, cosine, tangent, trigonometric identities and equations, inverse trig functions.",
        "Coordinate geometry: points, lines, parabolas, circles and distances in the plane.",
    ),
    "Discrete Mathematics": (
        "Combinatorics: count the number of ways, arrangements, permutations, subsets and colorings.",
        "Graph theory, grids, paths, tilings, games and strategies, pigeonhole principle.",
        "Sequences of symbols, binary strings, recursion and combinatorial puzzles.",
    ),
    "Probability & Statistics": (
        "Probability: the chance that an event happens, random choices, dice, coins and cards.",
        "Statistics: mean, median, mode, standard deviation, expected value and distributions of data.",
    ),
    "Linear Algebra": (
        "Linear algebra: vectors, matrices, determinants, eigenvalues, linear transformations, projections.",
        "Dot products, cross products, systems of linear equations written with matrices, vector spaces.",
    ),
    "Applied Mathematics & Word Problems": (
        "A word problem about everyday life: money, prices, interest, ages, work, speed, time and distance.",
        "Percentages, ratios, rates, unit conversions and practical quantities like weights and recipes.",
    ),
    "Physics & Chemistry": (
        "Physics: force, mass, acceleration, velocity, energy, momentum, electric circuits, waves.",
        "Chemistry: molecules, reactions, concentrations, moles and gases.",
    ),
    "Advanced Mathematics": (
        "Abstract algebra: groups, rings, fields; topology, differential equations, measure theory.",
        "Advanced university mathematics: complex analysis, manifolds, category theory, number fields.",
    ),
}

_INSTRUCTION = re.compile(
    r"\s*Please reason step by step, and put your final answer within \\boxed\{\}\.?\s*$"
)


def strip_instruction(problem: str) -> str:
    """The problem without the benchmarks' trailing "Please reason step by step ... \\boxed{}." line."""
    return _INSTRUCTION.sub("", problem).strip()


def _canonical(text: str) -> str:
    return re.sub(r"[^a-z]+", " ", text.lower().replace("&", " and ")).strip()


_CANONICAL_TOPICS = {_canonical(t): t for t in TOPICS}


def normalize_label(answer: str | None) -> str | None:
    """Map a free-form answer to one of :data:`TOPICS`, or ``None``.

    Accepted: the label in any case/spacing/punctuation ("algebra and number theory"), quoted or followed
    by a period, or its number 1..9 in :data:`TOPICS` order. Anything else (a different label, prose
    naming two labels) is ``None``.
    """
    if answer is None:
        return None
    text = answer.strip().strip("\"'`*.").strip()
    if re.fullmatch(r"[1-9]", text):
        return TOPICS[int(text) - 1]
    text = re.sub(r"^(label|topic|answer)\s*:\s*", "", text, flags=re.IGNORECASE)
    return _CANONICAL_TOPICS.get(_canonical(text))


class TopicBackend(Protocol):
    def label(self, texts: Sequence[str]) -> list[str | None]: ...
