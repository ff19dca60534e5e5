"""The killable worker pool: ordering, overruns, crashes, errors, shutdown; adversarial math completions.

Pool tests use the builtin ``eval`` as the worker function, so one pool can sleep, raise, crash or return a
value depending on the expression it is given, and its workers import nothing heavy.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ebpo.rewards import get_reward
from ebpo.rewards.pool import Outcome, TimeoutPool

# Wall-clock allowance on top of a time limit: the kill, the pipe round trip, a loaded 2-core CI machine.
SLACK_S = 3.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def eval_pool():
    with TimeoutPool(eval, num_workers=2, timeout_s=1.5) as pool:
        pool.map([("0",)])  # start the workers outside the timed tests
        yield pool


def test_results_come_back_in_input_order(eval_pool):
    # later items finish first: the sleeps shrink along the list
    exprs = [(f"__import__('time').sleep({0.05 * (5 - i)}) or {i} * {i}",) for i in range(6)]
    results = eval_pool.map(exprs)
    assert [r.value for r in results] == [0, 1, 4, 9, 16, 25]
    assert all(r.outcome is Outcome.OK for r in results)
    assert eval_pool.map([]) == []


def test_overrun_is_killed_counted_and_the_rest_finish(eval_pool):
    before = eval_pool.stats()
    pids_before = {eval_pool.map([("__import__('os').getpid()",)])[0].value for _ in range(4)}
    start = time.monotonic()
    results = eval_pool.map([("__import__('time').sleep(60)",), ("1 + 1",), ("2 + 2",)])
    wall = time.monotonic() - start
    assert [r.outcome for r in results] == [Outcome.TIMEOUT, Outcome.OK, Outcome.OK]
    assert [r.value for r in results[1:]] == [2, 4]
    assert wall < eval_pool.timeout_s + SLACK_S  # a 60 s call cost one limit, not 60 s
    after = eval_pool.stats()
    assert after["timeouts"] - before["timeouts"] == 1 and after["restarts"] - before["restarts"] == 1
    # the killed worker is gone and a new one serves
    assert not all(_alive(pid) for pid in pids_before)
    assert eval_pool.map([("'still here'",)])[0].value == "still here"


def test_exception_and_crash_are_errors_and_the_pool_recovers(eval_pool):
    results = eval_pool.map([("1 / 0",), ("__import__('os')._exit(3)",), ("7",)])
    assert results[0].outcome is Outcome.ERROR and results[0].error.startswith("ZeroDivisionError")
    assert results[1].outcome is Outcome.ERROR and results[1].error == "worker process died"
    assert results[2].outcome is Outcome.OK and results[2].value == 7
    assert [r.value for r in eval_pool.map([("3 * 3",)] * 4)] == [9, 9, 9, 9]


def test_interrupted_map_leaves_no_stale_answers(eval_pool):
    """An exception inside map (here a SIGALRM handler, like Ctrl-C) drops the busy workers, so the slow
    task's late answer cannot be taken for the next call's."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            eval_pool.map([("__import__('time').sleep(1.0) or 'late'",)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert [r.value for r in eval_pool.map([("'fresh'",), ("'fresh'",)])] == ["fresh", "fresh"]


def test_close_stops_the_workers():
    pool = TimeoutPool(eval, num_workers=2, timeout_s=5.0)
    pids = {r.value for r in pool.map([("__import__('os').getpid()",)] * 6)}
    assert pids and all(_alive(pid) for pid in pids) and os.getpid() not in pids
    pool.close()
    assert not any(_alive(pid) for pid in pids)


def test_workers_are_shut_down_at_interpreter_exit(tmp_path):
    script = (
        "from ebpo.rewards.pool import TimeoutPool\n"
        "pool = TimeoutPool(eval, num_workers=2, timeout_s=5.0)\n"
        "print(sorted({r.value for r in pool.map([('__import__(\"os\").getpid()',)] * 6)}))\n"
    )  # no close(), no __main__ guard: atexit must clean up
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    pids = eval(out.stdout.strip().splitlines()[-1])
    assert pids
    assert not any(_alive(pid) for pid in pids)


def test_exec_worker_imports_the_verifier_and_no_torch():
    """An exec worker started from this process (which holds torch) imports the math reward's module and
    math-verify (the reward's worker start-up) and nothing of torch: what it has is what it imported."""
    import torch  # noqa: F401  (the parent holds torch, as a trainer does)

    from ebpo.rewards.math import _quiet_math_verify

    probe = (
        "sorted(m for m in __import__('sys').modules if m.split('.')[0] in ('torch', 'ebpo', 'math_verify'))"
    )
    with TimeoutPool(
        eval, num_workers=1, timeout_s=30.0, start_method="exec", init=_quiet_math_verify
    ) as pool:
        modules = pool.map([(probe,)])[0].value
    assert "torch" not in modules and "math_verify" in modules
    assert [m for m in modules if m.startswith("ebpo")] == [
        "ebpo",
        "ebpo.registry",
        "ebpo.rewards",
        "ebpo.rewards.math",
    ]


def test_pool_starts_lazily():
    reward = get_reward("math", num_workers=1, timeout_s=7.25)  # settings no other test uses
    assert reward.pool()._workers == []  # no process until the first call
    assert reward("\\boxed{2}", "2") == 1.0
    assert len(reward.pool()._workers) == 1


def test_spawn_start_method_works():
    with TimeoutPool(eval, num_workers=1, timeout_s=5.0, start_method="spawn") as pool:
        assert pool.map([("6 * 7",)])[0].value == 42


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match=r"^num_workers .*\b0$"):
        TimeoutPool(eval, num_workers=0)
    with pytest.raises(ValueError, match=r"^timeout_s .*\b0$"):
        TimeoutPool(eval, timeout_s=0)
    with pytest.raises(ValueError, match=r"^start_method 'fork'.*\bexec, spawn, forkserver$"):
        TimeoutPool(eval, start_method="fork")
    with pytest.raises(ValueError, match=r"<lambda>.*start_method='exec'"):
        TimeoutPool(lambda x: x, start_method="exec")
    with pytest.raises(ValueError, match=r"^num_workers .*-1$"):
        get_reward("math", num_workers=-1)


# -- adversarial completions through the math reward ------------------------------------------------

ADVERSARIAL = {
    "power_tower": "so the answer is \\boxed{9^{9^{9^{9^{9}}}}}.",
    "nested_braces": "\\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}",
    "nested_fractions": "\\boxed{" + "\\frac{1}{" * 400 + "2" + "}" * 400 + "}",
    "one_megabyte": "x" * 1_000_000 + " the answer is \\boxed{5}",
    "one_megabyte_unclosed": "\\boxed{" + "{" * 1_000_000,
    "unbalanced_latex": "\\boxed{\\frac{1}{2} \\left( \\right] \\sqrt{ \\begin{matrix} 1 & 2",
    "huge_factorial": "\\boxed{(10^{10^{10}})!}",
}


@pytest.fixture(scope="module")
def fast_math_reward():
    reward = get_reward("math", num_workers=2, timeout_s=2.0)
    assert reward("\\boxed{1}", "1") == 1.0  # starts the pool outside the timed calls
    return reward


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_completion_returns_within_the_limit(fast_math_reward, name):
    start = time.monotonic()
    score = fast_math_reward(ADVERSARIAL[name], "5")
    wall = time.monotonic() - start
    # one_megabyte's last box is \boxed{5}: correct; every other one is wrong or unparsable
    assert score == (1.0 if name == "one_megabyte" else 0.0)
    assert wall < fast_math_reward.timeout_s + SLACK_S, f"{name} took {wall:.1f} s"


def test_adversarial_batch_stalls_nothing(fast_math_reward):
    """All of them in one batch, next to ordinary answers: the ordinary ones are scored correctly, and each
    overrun costs at most one limit plus slack (the kill and a replacement worker's start-up)."""
    names = sorted(ADVERSARIAL)
    completions = [ADVERSARIAL[n] for n in names] + ["\\boxed{5}", "\\boxed{6}"]
    before = fast_math_reward.metrics()["reward/timeouts"]
    start = time.monotonic()
    scores = fast_math_reward.batch(completions, ["5"] * len(completions))
    wall = time.monotonic() - start
    assert scores[-2:] == [1.0, 0.0]
    assert scores == [1.0 if n == "one_megabyte" else 0.0 for n in names] + [1.0, 0.0]
    timeouts = fast_math_reward.metrics()["reward/timeouts"] - before
    assert 1 <= timeouts <= 4  # the power tower and the 3000-deep braces cannot finish in 2 s
    assert wall < timeouts * (fast_math_reward.timeout_s + SLACK_S) + SLACK_S
