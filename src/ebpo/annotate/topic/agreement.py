"""How well a backend agrees with hand labels: the agreement metric and the hand-labelled sample's loader."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebpo.annotate.topic.labels import TOPICS


def agreement(predicted: Sequence[str | None], gold: Sequence[str]) -> dict[str, Any]:
    """Accuracy of ``predicted`` against ``gold`` and the confusion counts.

    Returns ``{"n", "accuracy", "confusion": {gold: {predicted: count}}, "per_label": {gold: (correct, n)}}``;
    a ``None`` prediction counts as wrong (under the key ``"None"``).
    """
    if len(predicted) != len(gold):
        raise ValueError(f"agreement: {len(predicted)} predictions for {len(gold)} gold labels")
    confusion: dict[str, dict[str, int]] = {}
    for p, g in zip(predicted, gold):
        row = confusion.setdefault(g, {})
        row[str(p)] = row.get(str(p), 0) + 1
    correct = sum(p == g for p, g in zip(predicted, gold))
    per_label = {g: (row.get(g, 0), sum(row.values())) for g, row in confusion.items()}
    return {
        "n": len(gold),
        "accuracy": correct / len(gold) if gold else 0.0,
        "confusion": confusion,
        "per_label": per_label,
    }


def load_hand_labels(path: str | Path, data_dir: str | Path | None = None) -> list[dict[str, str]]:
    """Hand-labelled sample: one ``{"id", "problem", "label", "split"}`` dict per row.

    ``path`` is JSONL with ``id``, ``source`` (one of the five evaluation sets), ``line`` (0-based row of
    that set), ``label`` (one of :data:`TOPICS`) and optional ``split`` (``dev``: seen while writing the
    rules and descriptions; ``heldout``: labelled after they were frozen). The problem text is the set's
    prompt, read by :func:`ebpo.eval.benchmarks.load_benchmark`: from ``data_dir`` (our JSON Lines files, else
    ``$EBPO_DATA_DIR``), else from its hub copy.
    """
    from ebpo.eval.benchmarks import load_benchmark

    rows: list[dict[str, str]] = []
    problems: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("label") not in TOPICS:
                raise ValueError(f"{path}, line {line_no}: label {row.get('label')!r} is not one of {TOPICS}")
            source = row["source"]
            if source not in problems:
                problems[source] = [record.prompt for record in load_benchmark(source, data_dir)]
            index = int(row["line"])
            if not 0 <= index < len(problems[source]):
                raise ValueError(
                    f"{path}, line {line_no}: row {index} of {source} does not exist ({len(problems[source])} rows)"
                )
            rows.append(
                {
                    "id": row["id"],
                    "problem": problems[source][index],
                    "label": row["label"],
                    "split": row.get("split", ""),
                }
            )
    return rows
