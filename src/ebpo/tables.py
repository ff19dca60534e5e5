"""Markdown tables: the one writer for every table ebpo renders as text (a tracker's table, a benchmark's
report, ``ebpo eval``'s results, ``ebpo simulate``'s and ``ebpo diagnose``'s tables, a base model's grid)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

__all__ = ["Align", "markdown_table"]

Align = Literal["", "left", "right", "center"]
_RULES: dict[str, str] = {"": "---", "left": ":---", "right": "---:", "center": ":---:"}


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, align: Sequence[Align] | None = None
) -> str:
    """``| a | b |`` lines: the header, the rule, then one line per row (cells as given).

    The rule is ``|---|---|`` unless ``align`` gives each column's alignment: ``""`` (none, ``---``),
    ``"left"`` (``:---``), ``"right"`` (``---:``) or ``"center"`` (``:---:``)."""
    rules = [_RULES[side] for side in align] if align is not None else ["---"] * len(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "".join(f"{rule}|" for rule in rules)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
