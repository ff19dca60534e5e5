"""What ebpo writes to disk, written one way: atomic files and directories, journals, run directories.

Everything that persists goes through here (the trainer, the evaluation and annotation caches, the base-model
build, the TRL and verl adapters), so a kill at any moment has one set of consequences:

- **Atomic writes** (:func:`write_text_atomic`, :func:`write_bytes_atomic`, :func:`save_torch_atomic`,
  :func:`replace_dir`): the content goes to a temporary name beside the target, unique to the process and
  the call, then one rename puts it in place. A kill leaves the old content or the new, never part of it,
  and writers that save to one path at once (several processes on a shared filesystem) never share a
  temporary file: the last rename wins whole.
- **Journals** (:class:`Journal`): append-only JSON Lines, one object a line, each append written whole and
  flushed. One policy for a torn last line: a final line without its newline is what a kill mid-append leaves;
  readers drop it with a warning, the journal's writer cuts it off before appending (:meth:`Journal.read`
  with ``repair=True``), and an append always starts on a line of its own. Any other line that does not
  parse is an error naming the file and line (or, where the reader can redo its work, skipped and counted).
  Appends are flushed, not fsync'd: a killed process loses nothing written, an OS crash at most the last
  lines, which every journal's reader redoes or rewinds.
- **Run directories** (:class:`RunDirectory`): one training run's folder: its layout and name, one process
  at a time (:class:`DirectoryLock`), fresh / resumed / overwritten, its metrics journal rewound to a
  checkpoint, its summary.

The standard library and :mod:`ebpo.errors` only (torch is imported by :func:`save_torch_atomic` when it
runs): this module sits at the bottom of the package, below everything that writes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
import warnings
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, overload

from ebpo.errors import ConfigError

__all__ = [
    "DirectoryInUse",
    "DirectoryLock",
    "Journal",
    "RunDirectory",
    "replace_dir",
    "save_torch_atomic",
    "write_bytes_atomic",
    "write_text_atomic",
]

T = TypeVar("T")
StrPath = str | os.PathLike[str]

# ---------------------------------------------------------------------------------------------------
# atomic writes


def _temporary_beside(path: Path, suffix: str = "tmp") -> Path:
    """A fresh name in ``path``'s directory (so that the final rename stays on one filesystem), unique to
    this process and call."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}")


def _replace_from_temporary(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` to a temporary file beside ``path`` (its directory created if needed), then rename it
    onto ``path``; the temporary file is removed if either step fails. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_beside(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: StrPath, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` so that a kill leaves the old content or the new, never part of it."""
    return _replace_from_temporary(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_bytes_atomic(path: StrPath, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that a kill leaves the old content or the new, never part of it."""
    return _replace_from_temporary(Path(path), lambda tmp: tmp.write_bytes(data))


def save_torch_atomic(state: Any, path: StrPath) -> Path:
    """``torch.save(state, path)`` so that a kill leaves the old file or the new one, never part of it.
    Safe when several processes save to the same path at once: each writes its own temporary file, and
    ``path`` is always one whole file."""
    import torch

    return _replace_from_temporary(Path(path), lambda tmp: torch.save(state, tmp))


def replace_dir(
    path: StrPath, fill: Callable[[Path], Any], *, spares: tuple[Path, Path] | None = None
) -> Path:
    """Write the directory ``path`` whole: ``fill(staging)`` writes a fresh staging directory beside it, then
    ``path`` (if it exists) is renamed to a retired copy, the staging directory to ``path``, and the retired
    copy is removed. A kill leaves ``path`` as it was or as ``fill`` wrote it, except between the two renames,
    where ``path`` is missing and the complete new copy (staging) and the old one (retired) lie beside it.

    ``spares``: the (staging, retired) names. Default: unique to this process and call, so that concurrent
    writers never share one. A single writer that must find an interrupted swap again passes fixed names
    (the trainer's checkpoints: ``.last.tmp`` / ``.last.old``, recovered by ``find_checkpoint``). A staging
    directory that ``fill`` did not finish is removed. Returns ``path``."""
    path = Path(path)
    staging, retired = spares or (_temporary_beside(path), _temporary_beside(path, "old"))
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        fill(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(path, retired)
    os.replace(staging, path)
    shutil.rmtree(retired, ignore_errors=True)
    return path


# ---------------------------------------------------------------------------------------------------
# journals


class Journal:
    """An append-only JSON Lines file: one JSON object a line (the module docstring gives the policy).

    ``kind`` and ``fix`` word the error for a line that does not parse: ``<path>, line <n>: not <kind>
    (<reason>); <fix>`` (``not a cached problem (...); delete the file to redo``). ``sort_keys``: write each
    row's keys sorted (``metrics.jsonl``) rather than in the row's own order.
    """

    def __init__(
        self,
        path: StrPath,
        *,
        kind: str = "valid JSON",
        fix: str = "repair or delete that line",
        sort_keys: bool = False,
    ) -> None:
        self.path, self.kind, self.fix, self.sort_keys = Path(path), kind, fix, sort_keys

    def exists(self) -> bool:
        return self.path.is_file()

    def _lines(self, *, repair: bool) -> list[tuple[int, bytes]]:
        """(line number, bytes) of every whole line; a torn last line is dropped with a warning, and with
        ``repair`` cut off the file."""
        if not self.path.is_file():
            return []
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        torn = lines.pop()  # b"" when the file ends with its newline
        if torn:
            warnings.warn(
                f"{self.path}, line {len(lines) + 1}: dropped a torn last line ({len(torn)} bytes without a "
                "newline: a write cut short)",
                RuntimeWarning,
                stacklevel=4,
            )
            if repair:
                with open(self.path, "r+b") as handle:
                    handle.truncate(len(raw) - len(torn))
        return [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]

    def _parse(self, number: int, line: bytes, parse: Callable[[dict[str, Any]], Any] | None) -> Any:
        try:
            row = json.loads(line.decode("utf-8"))
            if not isinstance(row, dict):
                raise TypeError(f"a JSON {type(row).__name__}, not an object")
            return parse(row) if parse is not None else row
        except (UnicodeDecodeError, ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{self.path}, line {number}: not {self.kind} ({err}); {self.fix}") from None

    @overload
    def read(
        self, parse: None = None, *, skip_bad: bool = False, repair: bool = False
    ) -> list[dict[str, Any]]: ...

    @overload
    def read(
        self, parse: Callable[[dict[str, Any]], T], *, skip_bad: bool = False, repair: bool = False
    ) -> list[T]: ...

    def read(
        self,
        parse: Callable[[dict[str, Any]], Any] | None = None,
        *,
        skip_bad: bool = False,
        repair: bool = False,
    ) -> list[Any]:
        """The rows in order, each through ``parse`` (which may raise ``ValueError``, ``TypeError`` or
        ``KeyError`` for a row it refuses); empty when the file does not exist.

        A torn last line is left out with a ``RuntimeWarning``; ``repair=True`` also cuts it off the file
        (only the journal's one writer may, before it appends). Any other bad line raises ``ValueError``
        naming the file and line, or with ``skip_bad`` is left out, its number in :attr:`skipped`."""
        self.skipped: list[int] = []
        rows = []
        for number, line in self._lines(repair=repair):
            try:
                rows.append(self._parse(number, line, parse))
            except ValueError:
                if not skip_bad:
                    raise
                self.skipped.append(number)
        return rows

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        """Append ``rows``, one line each, in one write; a NaN or inf raises ``ValueError`` before anything is
        written. If the file does not end with a newline (another writer was killed mid-line), a newline is
        written first, so the new lines stand on their own."""
        data = "".join(
            json.dumps(row, sort_keys=self.sort_keys, allow_nan=False) + "\n" for row in rows
        ).encode()
        if not data:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as handle:
            if handle.seek(0, os.SEEK_END) > 0:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    data = b"\n" + data
            handle.write(data)
            handle.flush()

    def retain(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        """Rewrite the journal (atomically) with the lines whose rows ``keep`` accepts, as they were written;
        a torn last line goes, a bad line elsewhere raises as in :meth:`read`."""
        if not self.path.is_file():
            return
        kept = [line for number, line in self._lines(repair=False) if keep(self._parse(number, line, None))]
        write_bytes_atomic(self.path, b"".join(line + b"\n" for line in kept))


# ---------------------------------------------------------------------------------------------------
# one process per directory


class DirectoryInUse(ConfigError):
    """Another process holds the directory's lock."""


class DirectoryLock:
    """One process at a time in a directory: an exclusive ``fcntl.flock`` on ``<directory>/.lock``, which
    records the holder's pid. The kernel drops the lock when the holder closes it or ends, however it ends,
    so a killed process leaves no stale lock (only the file, which the next holder reuses). :meth:`release`
    removes the file while still holding it; :meth:`acquire` retries when the file it locked was removed
    meanwhile, so two processes never both hold it. Without ``fcntl`` (Windows) it does nothing.

    ``what`` names the directory in the error (``run directory``) and ``hint`` says what to do instead. Keep
    the object: the lock lasts as long as it does (or until :meth:`release`)."""

    FILE = ".lock"

    def __init__(self, directory: StrPath, *, what: str, hint: str) -> None:
        self.directory, self.what, self.hint = Path(directory), what, hint
        self._handle: Any = None

    def acquire(self) -> DirectoryLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return self
        if self._handle is not None:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / self.FILE
        while True:
            handle = open(path, "a+", encoding="utf-8")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                handle.close()
                raise DirectoryInUse(
                    f"{self.what} {self.directory} is in use by {holder}; {self.hint}"
                ) from None
            try:
                current = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            handle.close()  # its holder removed the file as we opened it: lock the one there now
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            try:
                os.unlink(self.directory / self.FILE)  # still held: nobody can have locked it since
            except FileNotFoundError:
                pass
            self._handle.close()  # closing the descriptor drops the flock
            self._handle = None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


# ---------------------------------------------------------------------------------------------------
# run directories


class RunDirectory:
    """The directory of one ``ebpo train`` run::

        config.yaml          the resolved config (the base of ``--resume``)
        metrics.jsonl        one JSON line per step (a :class:`Journal`)
        tensorboard/         the same scalars for TensorBoard
        checkpoints/last/    model/ (from_pretrained) + trainer_state.pt (``ebpo.trainer.checkpoint``)
        checkpoints/best/    the same at the best validation maj@k, + best.json
        summary.json         written at the end
        training.png         written at the end
        .lock                while a process trains in it (:class:`DirectoryLock`)

    Its life: :meth:`claim` takes the lock; :meth:`check` refuses a fresh run where a run already is (and
    ``--resume`` with ``--overwrite`` of the same run); :meth:`start`, once the checkpoint is loaded, rewinds
    the metrics journal to the checkpoint's step (a resume in place) or removes the previous run's outputs
    (``--overwrite``); :meth:`write_summary` at the end; :meth:`release`. A run refused before it started
    (:meth:`abandon`) leaves no lock and no empty directory behind.
    """

    CONFIG = "config.yaml"
    METRICS = "metrics.jsonl"
    TENSORBOARD = "tensorboard"
    CHECKPOINTS = "checkpoints"
    SUMMARY = "summary.json"
    PLOT = "training.png"
    OUTPUTS = (METRICS, CHECKPOINTS, SUMMARY, TENSORBOARD, PLOT, CONFIG)
    """What a run writes; ``--overwrite`` removes exactly these (and nothing else in the directory)."""

    def __init__(self, path: StrPath) -> None:
        self.path = Path(path)
        self._lock = DirectoryLock(
            self.path, what="run directory", hint="wait for that run to finish, or choose another directory"
        )
        self._created = False

    @staticmethod
    def timestamped(method: str) -> str:
        """A run directory name for a run started now: ``<UTC yyyymmdd-hhmmss>-<method>``."""
        return f"{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{method}"

    @property
    def metrics(self) -> Journal:
        """The metrics journal, ``metrics.jsonl``."""
        return Journal(
            self.path / self.METRICS, fix="the file is damaged: repair or delete that line", sort_keys=True
        )

    def holds(self, checkpoint: Path) -> bool:
        """Whether ``checkpoint`` (``<run>/checkpoints/<name>``) is one of this run's."""
        return self.path.resolve() == checkpoint.parent.parent.resolve()

    def claim(self) -> RunDirectory:
        """Take the directory for this process (created if missing): a second process, training or resuming
        here, gets one line (:class:`DirectoryInUse`) instead of two processes writing the same files."""
        self._created = not self.path.exists()
        self._lock.acquire()
        return self

    def check(self, *, resuming: bool, overwrite: bool) -> None:
        """Refuse what would mix two runs: ``--resume`` and ``--overwrite`` of this same run, or a fresh run
        into a directory that already holds one (its history would mix with the new one's and its checkpoints
        be overwritten); ``--resume`` continues it, ``--overwrite`` replaces it. ``resuming``: from one of
        this run's own checkpoints."""
        if resuming and overwrite:
            raise ConfigError(
                f"--resume and --overwrite of the same run directory {self.path} contradict each other: "
                "drop --overwrite to continue the run, or --resume to start it over"
            )
        if resuming or overwrite:
            return
        found = [
            name for name in (self.METRICS, self.CHECKPOINTS, self.SUMMARY) if (self.path / name).exists()
        ]
        if found:
            raise ConfigError(
                f"run directory {self.path} already holds a run ({', '.join(found)}); continue it with "
                f"`ebpo train --resume {self.path}`, or pass --overwrite (Trainer(..., overwrite=True)) to "
                "replace it"
            )

    def start(self, *, rewind_to: int | None, overwrite: bool) -> None:
        """Make the directory ready for the run: a resume in place keeps the metrics up to ``rewind_to`` (the
        checkpoint's step; later lines and a torn last line go), ``overwrite`` removes a previous run's
        outputs (:data:`OUTPUTS`; other files stay)."""
        if rewind_to is not None:
            self.metrics.retain(lambda row: row["step"] <= rewind_to)
        elif overwrite:
            for name in self.OUTPUTS:
                path = self.path / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        self.path.mkdir(parents=True, exist_ok=True)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """``summary.json``, atomically."""
        write_text_atomic(self.path / self.SUMMARY, json.dumps(summary, indent=2, sort_keys=True))

    def release(self) -> None:
        self._lock.release()

    def abandon(self) -> None:
        """Give the directory back after a refused start: the lock goes, and a directory this run created
        goes too if nothing was written into it."""
        self.release()
        if self._created and self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()
