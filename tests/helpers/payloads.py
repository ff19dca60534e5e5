"""State files that would run code if unpickled: what every loader of ebpo's ``.pt`` files must refuse unread.

:func:`write_payload` saves, with ``torch.save`` as ebpo's writers do, a state whose unpickling would create
the file ``marker`` (by calling ``open(marker, "w")``, or ``os.system("touch marker")``). A loader that runs
the pickle leaves ``marker`` behind; one that refuses it leaves nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


class OpensAFile:
    """Unpickles as ``open(marker, "w")``: creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


class RunsACommand:
    """Unpickles as ``os.system("touch marker")``: creates ``marker`` through a shell."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def write_payload(
    path: Path, marker: Path, state: dict[str, Any] | None = None, *, shell: bool = False
) -> Path:
    """``torch.save`` ``state`` (default: a trainer state's keys) with the payload under ``"step"`` and
    ``"estimator"`` to ``path``; returns ``path``. Nothing is created by writing it."""
    payload = RunsACommand(marker) if shell else OpensAFile(marker)
    state = dict(state or {})
    state.update(step=payload, estimator={"options": payload})
    torch.save(state, path)
    assert not marker.exists()
    return path
