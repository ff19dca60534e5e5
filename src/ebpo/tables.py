"""Markdown tables: the one writer for every table ebpo renders as text (a tracker's table, a benchmark's
report)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["markdown_table"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``| a | b |`` lines: the header, the ``|---|---|`` rule, then one line per row (cells as given)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
