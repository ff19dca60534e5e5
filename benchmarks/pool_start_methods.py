"""The start methods of the math reward's worker pool (``ebpo.rewards.pool``) against its guarantee.

    .venv/bin/python benchmarks/pool_start_methods.py                 # exec, spawn, forkserver, fork
    .venv/bin/python benchmarks/pool_start_methods.py --methods exec spawn

The guarantee: a math-verify call that does not return is killed at its limit, the pool goes on (a new worker
scores the next answer), and no worker imports torch. Each method runs in a fresh parent process that behaves
like a user's training script: torch imported at its top and used (intra-op threads started), then the
``math`` reward with one worker and a 2 s limit scores an ordinary answer, a power tower that math-verify
cannot finish (``\\boxed{9^{9^{9^{9^{9}}}}}``), and an ordinary answer again. Two such parents: one with an
``if __name__ == "__main__":`` guard, one without (a notebook, or a script written without one).

Columns: ``scores`` (both ordinary answers right), ``torch in worker`` (libtorch mapped into the worker's
memory, imported or inherited), ``worker PSS`` (its proportional memory, MB, after its first answer),
``hung call`` (scored as a timeout within the limit + 3 s, its worker killed), ``script re-run`` (how many
other processes ran the parent script's top level: its imports, and without a guard all of it), and
``first answer s`` (from
the first call to its answer, the worker's start-up included: a figure for a quiet machine). ``fork`` is not
one of ``TimeoutPool``'s choices; it is measured by setting the pool's ``start_method`` after construction.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ebpo.tables import markdown_table

METHODS = ("exec", "spawn", "forkserver", "fork")
LIMIT_S = 2.0
HUNG = "\\boxed{9^{9^{9^{9^{9}}}}}"  # math-verify evaluates the tower: far beyond any limit

PARENT = """
import json, os, sys, time
import torch  # a training script: torch first, and used

with open(__file__ + ".runs", "a") as runs:  # every process that runs this script's top level
    runs.write(f"{os.getpid()}\\n")

torch.set_num_threads(2)
(torch.ones(256, 256) @ torch.ones(256, 256)).sum().item()
from ebpo.rewards import get_reward


def worker_pid(reward):
    worker = reward.pool()._workers[0]
    return worker.popen.pid if worker.popen is not None else worker.process.pid


def measure(method, limit, hung):
    row = {"method": method}
    try:
        reward = get_reward("math", num_workers=1, timeout_s=limit, start_method="spawn" if method == "fork" else method)
        reward.pool().start_method = method  # fork is not one of TimeoutPool's choices: set it after the checks
        start = time.monotonic()
        first = reward("so the answer is \\\\boxed{\\\\frac{1}{2}}", "0.5")
        row["first_answer_s"] = round(time.monotonic() - start, 2)
        pid = worker_pid(reward)
        row["torch_in_worker"] = "libtorch" in open(f"/proc/{pid}/maps").read()
        pss = [line for line in open(f"/proc/{pid}/smaps_rollup") if line.startswith("Pss:")]
        row["worker_pss_mb"] = round(int(pss[0].split()[1]) / 1024)
        start = time.monotonic()
        hung_score = reward(hung, "5")
        row["hung_s"] = round(time.monotonic() - start, 2)
        row["hung_timeout"] = hung_score == 0.0 and reward.metrics()["reward/timeouts"] == 1
        try:
            os.kill(pid, 0)
            row["hung_worker_killed"] = False
        except ProcessLookupError:
            row["hung_worker_killed"] = True
        row["scores"] = first == 1.0 and reward("\\\\boxed{2}", "2") == 1.0
        with open(__file__ + ".runs") as runs:
            row["script_reruns"] = len({int(line) for line in runs} - {os.getpid()})
    except Exception as err:  # a method that cannot serve here: its first line
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:160]
    print("ROW " + json.dumps(row), flush=True)


{call}
"""


def run_parent(method: str, guard: bool, src: Path) -> dict:
    """One fresh parent process measuring ``method``; its row (or the reason it gave none)."""
    call = f"measure({method!r}, {LIMIT_S}, {HUNG!r})"
    script = PARENT.replace("{call}", f'if __name__ == "__main__":\n    {call}' if guard else call)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.py"
        path.write_text(script)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
        try:
            proc = subprocess.run(
                [sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp
            )
        except subprocess.TimeoutExpired:
            return {"method": method, "error": "no answer within 300 s"}
    rows = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    if not rows:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"method": method, "error": f"exit {proc.returncode}: {last[:160]}"}
    return rows[
        -1
    ]  # without a guard a spawned child may print its own (failed) row first: the parent's is last


HEADER = [
    "method",
    "parent",
    "scores",
    "torch in worker",
    "worker PSS",
    "hung call",
    "script re-run",
    "first answer s",
]


def row_cells(parent: str, row: dict) -> list[str]:
    """One parent's cells; a method that gave no measurement has its error in ``scores`` and the five
    columns after it blank."""
    if "error" in row and "scores" not in row:
        return [row["method"], parent, f"fails: {row['error']}", *[""] * (len(HEADER) - 3)]
    hung = (
        f"timeout in {row['hung_s']} s, worker killed"
        if row.get("hung_timeout") and row.get("hung_worker_killed")
        else f"NOT killed ({row.get('hung_s')} s)"
    )
    return [
        row["method"],
        parent,
        "yes" if row.get("scores") else "no",
        "yes" if row.get("torch_in_worker") else "no",
        f"{row.get('worker_pss_mb')} MB",
        hung,
        f"{row.get('script_reruns')}",
        f"{row.get('first_answer_s')}",
    ]


def table(rows: list[tuple[str, dict]]) -> str:
    """The markdown table: one line per (parent, its row)."""
    return markdown_table(HEADER, [row_cells(parent, row) for parent, row in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    args = parser.parse_args(argv)
    src = Path(__file__).resolve().parents[1] / "src"
    rows = []
    for guard in (True, False):
        for method in args.methods:
            rows.append(("main guard" if guard else "no guard", run_parent(method, guard, src)))
    print(f"python {sys.version.split()[0]}, limit {LIMIT_S:g} s, one worker")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
