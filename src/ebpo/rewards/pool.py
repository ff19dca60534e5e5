"""A pool of worker processes that runs one call per task under a wall-clock limit, killing overruns.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop one running call. A verifier that meets a
pathological answer (``\\boxed{{{{...}}}}`` nested thousands deep, a tower of exponents) can run for minutes
inside SymPy; math-verify's own guard is ``signal.alarm``, which only works on the main thread of the main
interpreter (docs/design.md §6). Here each worker owns a pipe; the parent hands a worker one task at a time,
waits on all pipes with the nearest deadline as its timeout, and on overrun sends the worker SIGKILL, starts
a replacement and records the task as ``TIMEOUT``. One bad answer therefore costs at most ``timeout_s`` of
one worker, never the training step.

Start method: ``exec`` on POSIX, else ``spawn``. An ``exec`` worker is a fresh interpreter that imports the
served function's module and nothing else. ``spawn`` and ``forkserver`` re-import the parent's ``__main__`` in
the worker: a training script's ``import torch`` (and, in a script without an ``if __name__ == "__main__"``
guard, all of its top level) runs again there; ``fork`` copies a process that holds torch, its threads and
perhaps CUDA contexts. Each of them kills a hung call and keeps serving; only ``exec`` keeps torch out of the
workers (measured: docs/benchmarks.md, "The reward pool's start method"). A worker announces itself ready after
its imports, and only then receives tasks, so start-up time never counts against a task's limit.
"""

from __future__ import annotations

import argparse
import atexit
import enum
import importlib
import logging
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext

logger = logging.getLogger(__name__)

__all__ = [
    "Outcome",
    "TaskResult",
    "TimeoutPool",
    "default_start_method",
    "shared_pool",
    "shutdown_all_pools",
]


class Outcome(enum.Enum):
    """How one task ended."""

    OK = "ok"
    TIMEOUT = "timeout"  # ran past the limit; its worker was killed and replaced
    ERROR = "error"  # the function raised, or the worker died (crash, out of memory)


@dataclass(frozen=True)
class TaskResult:
    """The result of one task: ``value`` is the function's return value when ``outcome`` is ``OK``."""

    outcome: Outcome
    value: Any = None
    error: str | None = None
    seconds: float = 0.0


START_METHODS = ("exec", "spawn", "forkserver")


def default_start_method() -> str:
    """``exec`` (a fresh ``python -P .../ebpo/rewards/pool.py`` per worker) on POSIX, else ``spawn``."""
    return "exec" if os.name == "posix" else "spawn"


def _qualified_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a module-level function, importable in a fresh interpreter."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise ValueError(
            f"{fn!r} must be a module-level function of an importable module for start_method='exec' "
            f"(not a lambda, a nested function or a function of __main__); move it into a module, or use "
            f"start_method='spawn'"
        )
    return f"{module}:{qualname}"


def _load_function(name: str) -> Callable[..., Any]:
    """Import ``module:qualname`` in an ``exec`` worker (the module's packages too: for the math reward
    ``ebpo``, ``ebpo.registry`` and ``ebpo.rewards``, none of which imports torch)."""
    module_name, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _ignore_stop_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _worker_main(conn: Connection, fn: Callable[..., Any], init: Callable[[], None] | None) -> None:
    """Worker loop: run ``init``, say ready, then for each chunk ``[(task_id, args), ...]`` run the calls in
    order, sending one ``(kind, task_id, value)`` message per call as it finishes; ``None`` ends the loop.

    Ctrl-C and SIGTERM reach every process of the terminal's or the job's group; a worker ignores them, so
    that the process that owns the pool decides (``ebpo train`` finishes its step first). It still ends
    when that process closes the connection or dies, and :meth:`_Worker.kill` uses SIGKILL."""
    _ignore_stop_signals()
    try:
        if init is not None:
            init()
        conn.send(("ready", None, None))
        while True:
            chunk = conn.recv()
            if chunk is None:
                return
            for task_id, args in chunk:
                try:
                    conn.send(("ok", task_id, fn(*args)))
                except Exception as exc:  # report, keep serving
                    conn.send(("error", task_id, f"{type(exc).__name__}: {exc}"[:2000]))
    except (EOFError, KeyboardInterrupt, BrokenPipeError, ConnectionResetError):
        return


class _Worker:
    """One worker process and the parent's end of its two-way connection.

    ``exec``: ``subprocess.Popen([python, -P, .../ebpo/rewards/pool.py, ...])`` talking over a socket pair.
    The fresh interpreter imports only the function's module (see :func:`_load_function`): no re-import of
    the user's ``__main__`` (scripts without an ``if __name__ == "__main__"`` guard and notebooks work) and
    no torch.
    ``spawn`` / ``forkserver``: a ``multiprocessing`` process of that start method.
    """

    def __init__(self, start_method: str, fn: Callable[..., Any], init: Callable[[], None] | None):
        self.popen: subprocess.Popen[bytes] | None = None
        self.process: Any = None
        if start_method == "exec":
            parent_sock, child_sock = socket.socketpair()
            # -P: do not put this file's folder (ebpo/rewards, which holds math.py) first on sys.path.
            cmd = [sys.executable, "-P", os.path.abspath(__file__), "--fd", str(child_sock.fileno())]
            cmd += [_qualified_name(fn)] + (["--init", _qualified_name(init)] if init is not None else [])
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # what the parent can import
            self.popen = subprocess.Popen(
                cmd, pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL, env=env, close_fds=True
            )
            child_sock.close()
            self.conn = Connection(parent_sock.detach())
        else:
            # "spawn" or "forkserver" (WorkerPool checks the name); typeshed's BaseContext has no Process
            ctx = cast("SpawnContext | ForkServerContext", mp.get_context(start_method))
            self.conn, child_conn = ctx.Pipe(duplex=True)
            self.process = ctx.Process(target=_worker_main, args=(child_conn, fn, init), daemon=True)
            self.process.start()
            child_conn.close()
        self.started_at = time.monotonic()
        self.ready = False
        self.queue: deque[int] = deque()  # tasks sent and not answered yet, in the order the worker runs them
        self.deadline = float("inf")  # when the task at the head of the queue overruns
        self.head_started = 0.0  # when the task at the head of the queue started

    def exitcode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else self.process.exitcode

    def kill(self) -> None:
        """SIGKILL the worker (if alive), reap it, close the connection."""
        if self.popen is not None:
            if self.popen.poll() is None:
                self.popen.kill()
            self.popen.wait(timeout=5)
        else:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        """Ask an idle worker to exit; kill it if it is busy or does not exit within a second."""
        try:
            if not self.queue:
                self.conn.send(None)
        except OSError:
            pass
        try:
            if self.popen is not None:
                self.popen.wait(timeout=1)
            else:
                self.process.join(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


class TimeoutPool:
    """Run ``fn(*args)`` for many argument tuples in ``num_workers`` processes, each call under ``timeout_s``.

    Args:
        fn: a module-level function of an importable module (workers import it by name); its arguments
            and return value must pickle.
        num_workers: worker processes (>= 1).
        timeout_s: wall-clock limit of one call; an overrun kills the worker and yields ``Outcome.TIMEOUT``.
        start_method: ``"exec"`` (default on POSIX), ``"spawn"`` or ``"forkserver"``; never ``fork``.
        init: optional module-level function each worker runs once before it says ready (imports, warm-up).
        start_timeout_s: how long a new worker may take to become ready before the pool gives up.
        max_chunk: most tasks sent to a worker in one message (each still has its own limit).

    Counters (cumulative): ``tasks``, ``timeouts``, ``errors``, ``restarts``. ``map`` is thread-safe
    (one call at a time). The pool starts its workers on the first ``map`` and is closed at interpreter exit.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        start_method: str | None = None,
        init: Callable[[], None] | None = None,
        start_timeout_s: float = 120.0,
        max_chunk: int = 16,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        method = start_method or default_start_method()
        valid = [
            m for m in START_METHODS if m == "exec" and os.name == "posix" or m in mp.get_all_start_methods()
        ]
        if method not in valid:
            raise ValueError(
                f"start_method {method!r} is not available here; valid choices: {', '.join(valid)}"
            )
        if method == "exec":  # fail now, not in the worker
            _qualified_name(fn)
            if init is not None:
                _qualified_name(init)
        self.fn = fn
        self.init = init
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.start_method = method
        self.start_timeout_s = float(start_timeout_s)
        self.max_chunk = max(1, int(max_chunk))
        self.tasks = self.timeouts = self.errors = self.restarts = 0
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._owner_pid = os.getpid()
        _LIVE_POOLS.add(self)

    # -- lifecycle ---------------------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        return _Worker(self.start_method, self.fn, self.init)

    def _ensure_workers(self) -> None:
        if os.getpid() != self._owner_pid:  # a forked copy of the pool: the workers belong to the parent
            self._workers = []
            self._owner_pid = os.getpid()
        while len(self._workers) < self.num_workers:
            self._workers.append(self._spawn())

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        new = self._spawn()
        self._workers[self._workers.index(worker)] = new
        self.restarts += 1
        return new

    def close(self) -> None:
        """Stop every worker (idle ones are asked to exit, busy ones are killed)."""
        if os.getpid() != self._owner_pid:
            self._workers = []
            return
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def __enter__(self) -> TimeoutPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # pickled (e.g. to a Ray worker): workers stay behind
        state = self.__dict__.copy()
        state.update(_workers=[], _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._owner_pid = os.getpid()
        _LIVE_POOLS.add(self)

    # -- work --------------------------------------------------------------------------------------

    def map(self, args_list: Sequence[tuple[Any, ...]]) -> list[TaskResult]:
        """Run ``fn(*args)`` for every tuple; results in input order, one :class:`TaskResult` each."""
        with self._lock:
            try:
                return self._map(list(args_list))
            except BaseException:
                # Interrupted (Ctrl-C, an error): drop the busy workers, whose late answers would otherwise
                # reach the next call; the next call starts replacements.
                for worker in [w for w in self._workers if w.queue]:
                    worker.kill()
                    self._workers.remove(worker)
                raise

    def _map(self, args_list: list[tuple[Any, ...]]) -> list[TaskResult]:
        """Dispatch chunks to ready idle workers; the head task of each worker's chunk runs under the limit.

        A worker runs its chunk in order and answers each task as it finishes, so the head task's clock
        starts when the previous answer arrives (or at dispatch). On overrun the head task is a TIMEOUT,
        the worker is killed and replaced, and the rest of its chunk goes back to the pending queue; a
        crashed worker's head task is an ERROR, the rest likewise go back. Chunks (at most
        ``max_chunk``, smaller near the end so the workers finish together) save one round trip per task.
        """
        results: list[TaskResult | None] = [None] * len(args_list)
        if not args_list:
            return []
        self._ensure_workers()
        pending = deque(range(len(args_list)))
        failed_starts = 0
        while pending or any(w.queue for w in self._workers):
            now = time.monotonic()
            for worker in list(self._workers):  # hand a chunk to each ready, idle worker
                if worker.ready and not worker.queue and pending:
                    size = max(1, min(self.max_chunk, len(pending) // (2 * self.num_workers)))
                    chunk = [pending.popleft() for _ in range(min(size, len(pending)))]
                    try:
                        worker.conn.send([(task_id, args_list[task_id]) for task_id in chunk])
                    except OSError:
                        pending.extendleft(reversed(chunk))
                        self._replace(worker)
                        continue
                    worker.queue.extend(chunk)
                    worker.head_started, worker.deadline = now, now + self.timeout_s
            deadlines = [w.deadline for w in self._workers if w.queue]
            deadlines += [w.started_at + self.start_timeout_s for w in self._workers if not w.ready]
            wait_s = max(0.0, min(deadlines, default=now + 1.0) - now)
            ready_conns = set(wait([w.conn for w in self._workers], timeout=wait_s))
            for worker in list(self._workers):
                if worker.conn in ready_conns:
                    failed_starts += self._receive(worker, results, pending)
                    if failed_starts > 2 * self.num_workers:
                        raise RuntimeError(
                            f"TimeoutPool workers keep dying at start-up (exit code {worker.exitcode()}); check "
                            f"that {self.fn!r} and its imports load in a fresh '{self.start_method}' process"
                        )
                now = time.monotonic()
                if worker in self._workers and worker.queue and now >= worker.deadline:
                    results[worker.queue.popleft()] = TaskResult(
                        Outcome.TIMEOUT, seconds=now - worker.head_started
                    )
                    self.timeouts += 1
                    pending.extendleft(reversed(worker.queue))
                    self._replace(worker)
                elif (
                    worker in self._workers
                    and not worker.ready
                    and now >= worker.started_at + self.start_timeout_s
                ):
                    raise RuntimeError(
                        f"a TimeoutPool worker did not start within {self.start_timeout_s:.0f} s "
                        f"(start method '{self.start_method}')"
                    )
        self.tasks += len(args_list)
        return [r if r is not None else TaskResult(Outcome.ERROR, error="lost") for r in results]

    def _receive(self, worker: _Worker, results: list[TaskResult | None], pending: deque[int]) -> int:
        """Read every message waiting on ``worker``'s connection; returns 1 if it died before ready."""
        while True:
            try:
                if not worker.conn.poll():
                    return 0
                kind, task_id, payload = worker.conn.recv()
            except (EOFError, OSError):  # the worker died (crash, OOM kill, import error)
                now = time.monotonic()
                died_at_start = not worker.ready
                if worker.queue:
                    head = worker.queue.popleft()
                    results[head] = TaskResult(
                        Outcome.ERROR, error="worker process died", seconds=now - worker.head_started
                    )
                    self.errors += 1
                    pending.extendleft(reversed(worker.queue))
                self._replace(worker)
                return int(died_at_start)
            if kind == "ready":
                worker.ready = True
                continue
            now = time.monotonic()
            head = worker.queue.popleft()
            assert head == task_id, f"worker answered task {task_id}, expected {head}"
            ok = kind == "ok"
            self.errors += not ok
            results[task_id] = TaskResult(
                Outcome.OK if ok else Outcome.ERROR,
                value=payload if ok else None,
                error=None if ok else payload,
                seconds=now - worker.head_started,
            )
            worker.head_started, worker.deadline = now, now + self.timeout_s if worker.queue else float("inf")

    def stats(self) -> dict[str, int]:
        """Cumulative counters: tasks run, timeouts (killed workers), errors, worker restarts."""
        return {
            "tasks": self.tasks,
            "timeouts": self.timeouts,
            "errors": self.errors,
            "restarts": self.restarts,
        }


# -- shared pools, closed at exit -------------------------------------------------------------------

_LIVE_POOLS: weakref.WeakSet[TimeoutPool] = weakref.WeakSet()
_SHARED: dict[tuple[Any, ...], TimeoutPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(
    fn: Callable[..., Any],
    *,
    num_workers: int,
    timeout_s: float,
    start_method: str | None = None,
    init: Callable[[], None] | None = None,
) -> TimeoutPool:
    """One pool per (function, settings) per process, so every reward object of the same kind shares workers."""
    key = (fn, num_workers, float(timeout_s), start_method or default_start_method(), init, os.getpid())
    with _SHARED_LOCK:
        pool = _SHARED.get(key)
        if pool is None:
            pool = TimeoutPool(
                fn, num_workers=num_workers, timeout_s=timeout_s, start_method=start_method, init=init
            )
            _SHARED[key] = pool
        return pool


def shutdown_all_pools() -> None:
    """Close every pool of this process (registered with ``atexit``)."""
    for pool in list(_LIVE_POOLS):
        try:
            pool.close()
        except Exception:  # at exit, best effort
            logger.debug("closing a TimeoutPool failed", exc_info=True)
    _SHARED.clear()


atexit.register(shutdown_all_pools)


def _main(argv: list[str] | None = None) -> None:
    """Entry of an ``exec`` worker: ``python -P pool.py --fd N [--init module:fn] module:fn``."""
    _ignore_stop_signals()  # before the function's imports, which may take seconds (_worker_main)
    parser = argparse.ArgumentParser(description="TimeoutPool worker (started by the pool, not by hand)")
    parser.add_argument("function", help="module:qualname of the function to serve")
    parser.add_argument("--fd", type=int, required=True, help="file descriptor of the socket to the parent")
    parser.add_argument("--init", default=None, help="module:qualname of a function to run at start")
    args = parser.parse_args(argv)
    conn = Connection(args.fd)
    init = _load_function(args.init) if args.init else None
    _worker_main(conn, _load_function(args.function), init)


if __name__ == "__main__":
    _main()
