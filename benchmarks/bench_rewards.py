"""Verified answers per second: math-verify in-process (sequential, no time limit) against our worker pool.

    .venv/bin/python benchmarks/bench_rewards.py                  # 1 and 2 workers, 3 rounds
    .venv/bin/python benchmarks/bench_rewards.py --workers 1 2 4 --rounds 5

Input: every gold answer of the five evaluation sets (1274; ``load_benchmark``: their hub copies, or our JSON
Lines files with ``EBPO_DATA_DIR=DIR``) placed in a typical completion
("... so the answer is \\boxed{GOLD}."), plus the same golds perturbed (first integer + 1), so half the
answers are right and half wrong; 2548 completions in all. Each candidate scores the whole list with
``MathReward.batch`` (same extraction, same math-verify calls): ``in-process`` is ``num_workers=0``;
``pool xK`` runs K worker processes, each answer under a 5 s limit.

Each pass runs in fresh processes (the in-process candidate in a fresh interpreter, each pool started
afresh), so no candidate reuses another's caches. ``--mode warm`` (default) first scores 600 synthetic
answers that share no string with the benchmark (fractions, roots, tuples, intervals, powers), untimed: it
warms every process's lazy imports, ANTLR parser tables and SymPy caches, as a long training run's workers
are warm. ``--mode cold`` times the first batch of a run instead (each worker pays its own warm-up). Candidates are interleaved round-robin, one pass each
per round, so load from other processes falls on all alike; the table gives the median over rounds, and the
ratio is taken between numbers from the same run. The scores of all candidates must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ebpo.eval.benchmarks import PAPER_BENCHMARKS, load_benchmark
from ebpo.rewards.math import MathReward, _parse_cached
from ebpo.rewards.pool import shutdown_all_pools

_DOLLAR = re.compile(r"(?<!\\)\$")
_INT = re.compile(r"\d+")


def completions_and_golds() -> tuple[list[str], list[str]]:
    golds = [r.answer for name in PAPER_BENCHMARKS for r in load_benchmark(name)]
    right = ["... so the answer is \\boxed{" + _DOLLAR.sub("", g) + "}." for g in golds]
    wrong = []
    for gold in golds:
        plain = _DOLLAR.sub("", gold)
        bumped = (
            _INT.sub(lambda m: str(int(m.group()) + 1), plain, count=1)
            if _INT.search(plain)
            else plain + "+1"
        )
        wrong.append("... so the answer is \\boxed{" + bumped + "}.")
    return right + wrong, golds + golds


def warmup_set(n: int = 600) -> tuple[list[str], list[str]]:
    """Synthetic answers with no string in common with the benchmarks (numbers above 10^4 and symbols)."""
    forms = [
        "\\frac{{{a}}}{{{b}}}",
        "{a}\\sqrt{{{b}}}",
        "({a}, {b})",
        "[{a}, {b})",
        "y^{{{a}}} + {b}",
        "\\dfrac{{{a}\\pi}}{{{b}}}",
        "{a}.{b}",
        "\\{{{a}, {b}\\}}",
    ]
    answers = [forms[i % len(forms)].format(a=10007 + 3 * i, b=20011 + 7 * i) for i in range(n)]
    completions = ["so the answer is \\boxed{" + a + "}." for a in answers]
    golds = [a if i % 2 == 0 else answers[(i + 1) % n] for i, a in enumerate(answers)]  # half right
    return completions, golds


def timed_pass(
    workers: int, completions: list[str], golds: list[str], mode: str
) -> tuple[float, list[float], dict]:
    """One pass in fresh processes: returns (seconds, scores, reward metrics)."""
    if workers == 0:
        out = subprocess.run(
            [sys.executable, __file__, "--one-in-process-pass", "--mode", mode],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        return result["seconds"], result["scores"], result["metrics"]
    shutdown_all_pools()
    reward = MathReward(num_workers=workers, timeout_s=5.0)
    reward.batch(["\\boxed{1}"] * 2 * workers, ["1"] * 2 * workers)  # start the workers outside the timing
    if mode == "warm":
        reward.batch(*warmup_set())
    start = time.perf_counter()
    scores = reward.batch(completions, golds)
    return time.perf_counter() - start, scores, reward.metrics()


def one_in_process_pass(mode: str) -> None:
    completions, golds = completions_and_golds()
    reward = MathReward(num_workers=0)
    reward("\\boxed{1}", "1")  # import math-verify outside the timing
    if mode == "warm":
        reward.batch(*warmup_set())
    _parse_cached.cache_clear()
    start = time.perf_counter()
    scores = reward.batch(completions, golds)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "scores": scores, "metrics": reward.metrics()}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2], help="pool sizes to time (default 1 2)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds; the median is reported")
    parser.add_argument(
        "--mode",
        choices=["warm", "cold"],
        default="warm",
        help="warm processes first (default) or time a cold start",
    )
    parser.add_argument("--one-in-process-pass", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_in_process_pass:
        one_in_process_pass(args.mode)
        return

    completions, golds = completions_and_golds()
    candidates = [0, *args.workers]
    seconds: dict[int, list[float]] = {k: [] for k in candidates}
    reference = None
    timeouts = dict.fromkeys(candidates, 0.0)
    for _ in range(args.rounds):
        for workers in candidates:
            wall, scores, metrics = timed_pass(workers, completions, golds, args.mode)
            seconds[workers].append(wall)
            timeouts[workers] += metrics["reward/timeouts"]
            if reference is None:
                reference = scores
            mismatches = sum(a != b for a, b in zip(scores, reference))
            if mismatches:
                print(
                    f"warning: {'in-process' if workers == 0 else f'pool x{workers}'} disagrees on {mismatches} answers"
                )
    shutdown_all_pools()

    n = len(completions)
    base = statistics.median(seconds[0])
    print(
        f"{n} completions ({n // 2} golds + {n // 2} perturbed), {args.mode}, {args.rounds} rounds, cpus={os.cpu_count()}"
    )
    print(
        f"reward sum = {sum(reference):.0f} (golds all right: {n // 2}, plus perturbed answers math-verify still accepts)"
    )
    print(f"{'candidate':<14}{'median s':>10}{'answers/s':>12}{'vs in-process':>15}{'timeouts':>10}")
    for workers in candidates:
        med = statistics.median(seconds[workers])
        label = "in-process" if workers == 0 else f"pool x{workers}"
        print(f"{label:<14}{med:>10.2f}{n / med:>12.0f}{base / med:>14.2f}x{timeouts[workers]:>10.0f}")
    print(
        json.dumps(
            {("in-process" if k == 0 else f"pool_x{k}"): [round(s, 3) for s in v] for k, v in seconds.items()}
        )
    )


if __name__ == "__main__":
    if not (Path(__file__).resolve().parents[1] / "src").is_dir():
        raise SystemExit("run from the repository checkout")
    main()
