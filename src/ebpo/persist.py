"""What ebpo writes to disk, written one way: atomic files and directories, journals, manifests, locks.

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
- **Refused writes** (:class:`WriteError`): a full disk, a quota, a permission or a read-only filesystem met
  by any of the writes above (or inside :func:`writing`) is one error naming the path, the reason in words
  ("no space left on device") and what was kept; whatever the error, an atomic write leaves the old content.
- **Manifests** (:func:`write_manifest`, :func:`verify_manifest`): a directory's ``manifest.json``, written
  last, lists each file's size and SHA-256; verifying it before anything is loaded turns a truncated or
  damaged file into one line naming it (:class:`DamagedFile`), and :func:`load_torch` does the same for a
  ``torch.save`` file that cannot be read, and reads plain data only (``weights_only=True``): a pickle that
  would run code to load is one :class:`UnsafeFile` line, left unread.
- **Locks** (:class:`DirectoryLock`): one process per directory, no stale lock after a kill.

What is built from these lives with its users: the training run's folder in :mod:`ebpo.run_directory`, the
model a path names in :mod:`ebpo.models.paths`.

The standard library and :mod:`ebpo.errors` only (torch is imported by :func:`save_torch_atomic` and
:func:`load_torch` when they run): this module sits at the bottom of the package, below everything that writes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, overload

from ebpo.errors import ConfigError, first_line

__all__ = [
    "MANIFEST",
    "DamagedFile",
    "DirectoryInUse",
    "DirectoryLock",
    "Journal",
    "UnsafeFile",
    "WriteError",
    "load_torch",
    "read_manifest",
    "replace_dir",
    "save_torch_atomic",
    "verify_manifest",
    "write_bytes_atomic",
    "write_errno",
    "write_manifest",
    "write_text_atomic",
    "writing",
]

T = TypeVar("T")
StrPath = str | os.PathLike[str]

# ---------------------------------------------------------------------------------------------------
# refused writes

WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG, errno.EIO}
)
"""What the filesystem answers a write it refuses: full disk, quota, permissions, read-only, file size
limit, a failing device."""

_ERRNO_IN_TEXT = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")
"""An errno inside another library's message: safetensors' ``... (os error 28)``, Python's ``[Errno 28]``."""


def write_errno(err: BaseException) -> int | None:
    """The errno of a refused write (:data:`WRITE_ERRNOS`) behind ``err``, or None when it is something else.

    Looked for in ``err``, its causes and contexts (torch's ``RuntimeError: ... unexpected pos`` carries the
    ``OSError`` of the file object it wrote to as its context) and their messages (safetensors raises
    ``SafetensorError: ... No space left on device (os error 28)``). A ``KeyboardInterrupt`` is never one."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen and isinstance(cause, Exception):
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in WRITE_ERRNOS:
            return cause.errno
        match = _ERRNO_IN_TEXT.search(str(cause))
        if match is not None and int(match.group(1) or match.group(2)) in WRITE_ERRNOS:
            return int(match.group(1) or match.group(2))
        cause = cause.__cause__ or cause.__context__
    return None


class WriteError(OSError):
    """The filesystem refused a write: ``cannot write <path>: <reason>; <kept>`` in one line.

    ``reason`` is the errno in words (``no space left on device``, ``disk quota exceeded``, ``permission
    denied``, ``read-only file system``); ``kept`` says what is still there (``nothing was written there``,
    or the caller's own words: the checkpoint a resume continues from)."""

    def __init__(self, path: StrPath, code: int, kept: str) -> None:
        super().__init__(code, os.strerror(code), os.fspath(path))
        self.code = code
        self.path = Path(path)
        self.reason = os.strerror(code)[:1].lower() + os.strerror(code)[1:]
        self.kept = kept

    def __str__(self) -> str:
        return f"cannot write {self.path}: {self.reason}; {self.kept}"

    @property
    def fix(self) -> str:
        """What lets the write succeed, in a few words: ``free some space``, ``fix its permissions``, ..."""
        if self.code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return "free some space"
        if self.code in (errno.EACCES, errno.EPERM):
            return "fix the permissions"
        if self.code == errno.EROFS:
            return "make the filesystem writable"
        return "check the disk"


@contextmanager
def writing(path: StrPath, kept: str | None = None) -> Iterator[None]:
    """Turn a write refused inside the block (:func:`write_errno`) into one :class:`WriteError` naming
    ``path``; other errors pass unchanged. ``kept``: what is still there; default ``<path> is as it was``
    when it existed before the block, else ``nothing was written there``."""
    existed = os.path.lexists(path)
    try:
        yield
    except WriteError:
        raise
    except Exception as err:
        code = write_errno(err)
        if code is None:
            raise
        if kept is None:
            kept = f"{path} is as it was" if existed else "nothing was written there"
        raise WriteError(path, code, kept) from err


# ---------------------------------------------------------------------------------------------------
# atomic writes


def _temporary_beside(path: Path, suffix: str = "tmp") -> Path:
    """A fresh name in ``path``'s directory (so that the final rename stays on one filesystem), unique to
    this process and call."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}")


def _replace_from_temporary(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` to a temporary file beside ``path`` (its directory created if needed), then rename it
    onto ``path``; the temporary file is removed if either step fails. Returns ``path``."""
    with writing(path):
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

    def save(tmp: Path) -> None:
        # through a Python file object, whose OSError (a full disk, say) torch keeps as the context of its
        # own RuntimeError; saving to a path, torch's C++ stream loses the reason
        with open(tmp, "wb") as handle:
            torch.save(state, handle)

    return _replace_from_temporary(Path(path), save)


_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
"""The object a pickle names that ``torch.load(weights_only=True)`` refused, in torch's message."""


def _numpy_arrays() -> list[Any]:
    """What a NumPy array needs to unpickle, and nothing else: the array type, its reconstructor and dtypes.
    ebpo 0.1.0 wrote NumPy's RNG state (a uint32 array) into ``trainer_state.pt``; these build an array from
    its bytes and call nothing else (an object array's items are themselves read by the restricted
    unpickler)."""
    import numpy as np

    reconstruct = np.ndarray(0, dtype=np.uint32).__reduce__()[0]  # what NumPy pickles an array with
    return [reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _torch_load_plain(path: Path, allow_arrays: bool) -> Any:
    """``torch.load(weights_only=True)`` onto the CPU, NumPy arrays allowed on top with ``allow_arrays``."""
    import torch

    if not allow_arrays:
        return torch.load(path, map_location="cpu", weights_only=True)
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    if safe_globals is None:  # pragma: no cover - torch 2.4 has only the process-wide list
        torch.serialization.add_safe_globals(_numpy_arrays())
        return torch.load(path, map_location="cpu", weights_only=True)
    with safe_globals(_numpy_arrays()):
        return torch.load(path, map_location="cpu", weights_only=True)


def load_torch(path: StrPath, *, fix: str) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU: tensors, numbers, strings, lists, tuples and dicts,
    and nothing that runs code (a state file from elsewhere may hold a pickle that would). Every state file
    ebpo writes holds only those; NumPy arrays also load (the RNG state of ebpo 0.1.0's checkpoints:
    :func:`_numpy_arrays`). A file that names any other object is one :class:`UnsafeFile`, and one that is
    missing or cannot be read one :class:`DamagedFile`, each naming ``path`` and ending with ``fix`` (what to
    do instead)."""
    path = Path(path)
    if not path.is_file():
        raise DamagedFile(path, "is missing", fix)
    allow_arrays = False
    while True:
        try:
            return _torch_load_plain(path, allow_arrays)
        except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, EOFError, UnpicklingError, ...
            text = str(err)
            refused = _REFUSED_GLOBAL.search(text)
            if refused is not None and refused.group(1).startswith("numpy.") and not allow_arrays:
                allow_arrays = True  # an array (ebpo 0.1.0's NumPy RNG state): again, arrays allowed
                continue
            if refused is not None:
                raise UnsafeFile(
                    path,
                    f"holds a pickle that would run code to load ({refused.group(1)}), and ebpo loads only "
                    "tensors, numbers, strings, lists and dicts from a state file: it was left unread",
                    fix,
                ) from None
            if "WeightsUnpickler error:" in text:  # not plain data: bytes of something else, or other opcodes
                after = text.split("WeightsUnpickler error:", 1)[1].strip().splitlines() or [""]
                reason = f"is damaged or not a state file, and cannot be read as plain data ({after[0]})"
                raise DamagedFile(path, reason, fix) from None
            reason = f"is damaged and cannot be read ({first_line(err)})"
            raise DamagedFile(path, reason, fix) from err


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
    with writing(path):
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
# manifests

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


class DamagedFile(ConfigError):
    """A file that is missing, cut short or changed since its manifest was written, or that cannot be read:
    ``<path> <what is wrong>; <fix>`` in one line. ``path`` is the file."""

    def __init__(self, path: StrPath, problem: str, fix: str = "") -> None:
        self.path, self.problem = Path(path), problem
        super().__init__(f"{self.path} {problem}" + (f"; {fix}" if fix else ""))


class UnsafeFile(DamagedFile):
    """A state file whose pickle would run code to load: it names an object beyond tensors and plain data
    (``torch.load(weights_only=True)`` refuses it). Refused unread, in one line naming the file and what it
    named; no option loads it."""


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_manifest(directory: StrPath, **meta: Any) -> Path:
    """Write ``directory/manifest.json`` (atomically): the size and SHA-256 of every file below
    ``directory`` (by its path relative to it, with ``/``), and ``meta`` (a checkpoint's step, say). Write it
    after everything it lists: a directory whose manifest is there is complete. Returns its path."""
    root = Path(directory)
    files = {
        file.relative_to(root).as_posix(): {"size": file.stat().st_size, "sha256": _sha256(file)}
        for file in sorted(root.rglob("*"))
        if file.is_file() and file != root / MANIFEST
    }
    text = json.dumps({"format": MANIFEST_FORMAT, **meta, "files": files}, indent=1, sort_keys=True)
    return write_text_atomic(root / MANIFEST, text + "\n")


def read_manifest(directory: StrPath) -> dict[str, Any] | None:
    """``directory/manifest.json`` as written by :func:`write_manifest`, or None where there is none (a
    directory written without one); a manifest that does not parse is a :class:`DamagedFile`."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise ValueError("no file list")
    except (UnicodeDecodeError, ValueError) as err:
        raise DamagedFile(path, f"is damaged ({err})") from None
    return manifest


def verify_manifest(directory: StrPath, *, under: str = "") -> dict[str, Any] | None:
    """Check the files ``directory/manifest.json`` lists (those below the subfolder ``under`` only, if given)
    against their sizes, then their SHA-256, before anything reads them; returns the manifest, or None where
    there is none (nothing to check). The first file missing, of another size or with another hash is a
    :class:`DamagedFile` naming it. Files the manifest does not list are not looked at."""
    root = Path(directory)
    manifest = read_manifest(root)
    if manifest is None:
        return None
    prefix = under.strip("/") + "/" if under.strip("/") else ""
    listed = [(name, entry) for name, entry in sorted(manifest["files"].items()) if name.startswith(prefix)]
    for name, entry in listed:  # sizes first: a file cut short shows without reading anything
        path = root / name
        if not path.is_file():
            raise DamagedFile(path, f"is missing (listed in {root / MANIFEST})")
        size = path.stat().st_size
        if size != entry["size"]:
            raise DamagedFile(path, f"is damaged: {size} bytes where {root / MANIFEST} says {entry['size']}")
    for name, entry in listed:
        if _sha256(root / name) != entry["sha256"]:
            raise DamagedFile(
                root / name, f"is damaged: its SHA-256 differs from the one in {root / MANIFEST}"
            )
    return manifest


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
        kept = "the lines before are kept (a line cut short is dropped when the journal is next read)"
        with writing(self.path, kept=kept):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a+b") as handle:
                if handle.seek(0, os.SEEK_END) > 0:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        data = b"\n" + data
                handle.write(data)
                handle.flush()

    def retain(self, keep: Callable[[dict[str, Any]], bool]) -> int:
        """Rewrite the journal (atomically) with the lines whose rows ``keep`` accepts, as they were written;
        a torn last line goes, a bad line elsewhere raises as in :meth:`read`. Returns how many whole lines
        ``keep`` refused."""
        if not self.path.is_file():
            return 0
        lines = self._lines(repair=False)
        kept = [line for number, line in lines if keep(self._parse(number, line, None))]
        write_bytes_atomic(self.path, b"".join(line + b"\n" for line in kept))
        return len(lines) - len(kept)


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
        with writing(self.directory):
            self.directory.mkdir(parents=True, exist_ok=True)
            self._handle = self._lock(self.directory / self.FILE, fcntl)
        return self

    def _lock(self, path: Path, fcntl: Any) -> Any:
        """The open, locked ``path`` holding this process's pid."""
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
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
            handle.flush()
        except BaseException:
            handle.close()
            raise
        return handle

    def release(self) -> None:
        if self._handle is not None:
            try:
                os.unlink(self.directory / self.FILE)  # still held: nobody can have locked it since
            except OSError:  # gone already, or a read-only filesystem: closing drops the lock all the same
                pass
            self._handle.close()  # closing the descriptor drops the flock
            self._handle = None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()
