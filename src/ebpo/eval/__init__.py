"""Evaluation: metrics (avg@n Pass@1, unbiased pass@k, maj@k, standard errors), the harness, ``ebpo eval``.

See ``docs/evaluation.md``. The trainer's periodic validation (``ebpo.trainer.validation``) scores with
:mod:`ebpo.eval.metrics`; ``ebpo eval`` (:mod:`ebpo.eval.cli`) runs :func:`evaluate` and makes the paper-style
table.
"""

from ebpo.eval.benchmarks import get_benchmark, list_benchmarks
from ebpo.eval.harness import EvalResult, SamplingConfig, evaluate
from ebpo.eval.metrics import (
    ProblemScores,
    avg_at_n,
    cluster_answers,
    maj_at_k,
    majority_cluster,
    pass_at_k,
    score_problem,
    standard_error,
    summarize,
)

__all__ = [
    "EvalResult",
    "ProblemScores",
    "SamplingConfig",
    "avg_at_n",
    "cluster_answers",
    "evaluate",
    "get_benchmark",
    "list_benchmarks",
    "maj_at_k",
    "majority_cluster",
    "pass_at_k",
    "score_problem",
    "standard_error",
    "summarize",
]
