"""The difficulty grid of a model: pass@1, maj@n and greedy accuracy per (topic, level) cell.

``cell_grid`` measures it on any task's records (the gym model's: ``ebpo.models.recipes.gym.evaluate_grid``);
``evaluate_grid`` on ``arith``'s. ``evaluate_grid`` samples ``samples`` responses per problem at ``temperature`` (plain sampling, no top-k /
top-p: what RL samples) and one greedy response, with ``ebpo.generation.sample`` (KV cache, a seeded
generator), and scores them with ``arith.verify``. Per cell:

- ``pass@1``: the fraction of correct samples, averaged over the cell's problems;
- ``maj@n``: 1 when the most frequent extracted answer of the n samples is right (ties go to the answer
  sampled first; ``ebpo.eval.metrics``, the trainer's validation rule), averaged over problems;
- ``greedy``: the fraction of problems whose greedy answer is right;
- ``kinds``: the share of the cell's samples of each ``arith.ANSWER_KINDS`` (right, near miss, run-on, other, no
  number; ``arith.answer_kind``): which wrong answers there are for RL to remove.

A model with latent skill has ``maj@n`` and ``greedy`` well above ``pass@1``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ebpo.tables import markdown_table

GRID_METRICS: tuple[str, ...] = ("pass@1", "maj@n", "greedy")

# {topic: {level: {metric: value}}}
Grid = dict[str, dict[int, dict[str, Any]]]  # metric -> float; "kinds" -> {kind: share}


def evaluate_grid(
    model,
    tokenizer,
    *,
    split: str = "validation",
    per_cell: int = 40,
    samples: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 10,
    batch_size: int = 256,
    progress: bool = False,
) -> Grid:
    """``per_cell`` problems of each (topic, level) cell of ``split`` (``arith.generate(split, 45 * per_cell,
    seed)``), ``samples`` samples each at ``temperature`` plus one greedy answer; returns
    ``{topic: {level: {"pass@1", "maj@n", "greedy", "kinds"}}}`` (:func:`cell_grid`)."""
    from ebpo.tasks import arith

    records = arith.generate(split, per_cell * len(arith.TOPICS) * len(arith.LEVELS), seed=seed)
    return cell_grid(
        model,
        tokenizer,
        records,
        prompts=[r.prompt for r in records],
        verify=arith.verify,
        extract=_arith_answer,
        kinds=arith.answer_kind_shares,
        samples=samples,
        temperature=temperature,
        seed=seed,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        progress=progress,
    )


def _arith_answer(completion: str) -> str | None:
    """arith's extracted answer as text (``12`` for ``12.0``), what maj@n votes on."""
    from ebpo.tasks import arith

    answer = arith.extract_answer(completion)
    return None if answer is None else str(answer)


def cell_grid(
    model,
    tokenizer,
    records: Sequence[Any],
    *,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    verify: Callable[[str, str], float],
    extract: Callable[[str], str | None],
    kinds: Callable[[list[tuple[list[Any], str]]], dict[str, float]],
    samples: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 10,
    batch_size: int = 256,
    progress: bool = False,
) -> Grid:
    """The grid of any task's records, cell = (``record.topic``, ``record.level``): ``samples`` samples of each
    prompt (text, or token ids for a chat template) at ``temperature`` and one greedy answer, from one seeded
    generator chunk by chunk; ``verify(completion, answer)`` scores, ``extract`` gives the answers maj@n
    votes on, ``kinds`` the shares of each kind of answer over a cell's ``(answers, gold answer)`` pairs.
    Topics in the order they first appear, levels sorted."""
    import torch
    from tqdm.auto import tqdm

    from ebpo import generation
    from ebpo.eval.metrics import score_problem, summarize

    generator = torch.Generator().manual_seed(seed)
    by_cell: dict[tuple[str, int], dict[str, list]] = {}
    starts = range(0, len(records), batch_size)
    for start in tqdm(starts, desc="grid", disable=not progress, dynamic_ncols=True):
        chunk = records[start : start + batch_size]
        chunk_prompts = prompts[start : start + batch_size]
        sampled, greedy = (
            generation.sample(
                model,
                tokenizer,
                chunk_prompts,
                n=n,
                temperature=t,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                generator=generator,
            )
            for n, t in ((samples, temperature), (1, 0.0))
        )
        for m, record in enumerate(chunk):
            assert record.topic is not None and record.level is not None  # grid tasks' records carry both
            texts = sampled.texts[m * samples : (m + 1) * samples]
            rewards = [verify(text, record.answer) for text in texts]
            answers = [extract(text) for text in texts]
            problem = score_problem(record.id, rewards, answers, lambda a, b: a == b)
            cell = by_cell.setdefault(
                (record.topic, record.level), {"problems": [], "greedy": [], "answers": []}
            )
            cell["problems"].append(problem)
            cell["answers"].append((answers, record.answer))
            cell["greedy"].append(verify(greedy.texts[m], record.answer))
    grid: Grid = {}
    for (topic, level), cell in by_cell.items():
        summary = summarize(cell["problems"], maj_ks=(samples,), maj_mode="first")
        grid.setdefault(topic, {})[level] = {
            "pass@1": summary["pass@1"],
            "maj@n": summary[f"maj@{samples}"],
            "greedy": sum(cell["greedy"]) / len(cell["greedy"]),
            "kinds": kinds(cell["answers"]),
        }
    return {topic: dict(sorted(row.items())) for topic, row in grid.items()}


def normalize_grid(grid: Mapping) -> Grid:
    """A grid read back from JSON (level keys are strings there) with integer level keys."""
    return {topic: {int(lv): dict(v) for lv, v in row.items()} for topic, row in grid.items()}


def format_grid(grid: Grid, metric: str = "pass@1") -> str:
    """One metric of the grid as a markdown table: a row per topic, a column per level, plus means."""
    levels = sorted({lv for row in grid.values() for lv in row})
    rows = []
    for topic, row in grid.items():
        cells = [row[lv][metric] for lv in levels]
        rows.append([topic, *(f"{c:.2f}" for c in cells), f"{sum(cells) / len(cells):.2f}"])
    means = [sum(row[lv][metric] for row in grid.values()) / len(grid) for lv in levels]
    rows.append(["mean", *(f"{m:.2f}" for m in means), f"{sum(means) / len(means):.2f}"])
    return markdown_table(["topic", *(f"L{lv}" for lv in levels), "mean"], rows)


def grid_means(grid: Grid) -> dict[str, float]:
    """Each metric averaged over all cells (every cell has the same number of problems)."""
    cells = [values for row in grid.values() for values in row.values()]
    return {metric: sum(c[metric] for c in cells) / len(cells) for metric in GRID_METRICS}


def grid_summary(grid: Grid, metric: str = "pass@1") -> dict[str, int]:
    """How many cells have ``metric`` at most 0.1 (most groups of 4 all fail), at least 0.9, and in between."""
    rates = [values[metric] for row in grid.values() for values in row.values()]
    low = sum(rate <= 0.1 for rate in rates)
    high = sum(rate >= 0.9 for rate in rates)
    return {"cells": len(rates), "at_most_0.1": low, "at_least_0.9": high, "between": len(rates) - low - high}


def grid_report(grid: Grid, *, split: str, samples: int, temperature: float) -> str:
    """The three tables and a summary line, as ``ebpo base-model`` prints them."""
    means = grid_means(grid)
    counts = grid_summary(grid)
    how = f"{samples} samples per problem at temperature {temperature:g}"
    parts = [f"{split} problems, {how}; greedy = one greedy answer per problem"]
    for metric in GRID_METRICS:
        title = f"maj@{samples}" if metric == "maj@n" else metric  # the same n as the summary line below
        parts += [f"\n{title}:", format_grid(grid, metric)]
    parts.append(
        f"\nmean over cells: pass@1 {means['pass@1']:.3f}, maj@{samples} {means['maj@n']:.3f}, greedy "
        f"{means['greedy']:.3f}; cells with pass@1 <= 0.1: {counts['at_most_0.1']}, >= 0.9: "
        f"{counts['at_least_0.9']}, in between: {counts['between']}"
    )
    kinds = grid_answer_kinds(grid)
    if kinds:  # grids recorded before the kinds were measured have none
        shares = ", ".join(f"{kind} {share:.1%}" for kind, share in kinds.items())
        parts.append(f"sampled answers: {shares}")
    return "\n".join(parts)


def grid_answer_kinds(grid: Grid) -> dict[str, float]:
    """The share of every sampled answer of the grid of each ``arith.ANSWER_KINDS`` (the mean over cells: every
    cell has as many samples); empty when the grid's cells carry no ``kinds``."""
    cells = [values["kinds"] for row in grid.values() for values in row.values() if "kinds" in values]
    if not cells:
        return {}
    return {kind: sum(c[kind] for c in cells) / len(cells) for kind in cells[0]}
