"""``ebpo.models.grid``: the skill grid's table and its scoring of pass@1, the majority answer and greedy."""

from __future__ import annotations

import json

import pytest

from ebpo.models import grid as grid_mod


def test_grid_formatting_and_summary():
    def cell(p):
        return {"pass@1": p, "maj@n": p, "greedy": p}

    grid = {"mod": {1: cell(1.0), 2: cell(0.5)}, "dot": {1: cell(0.0), 2: cell(0.25)}}
    table = grid_mod.format_grid(grid)
    assert table.splitlines()[0] == "| topic | L1 | L2 | mean |"
    assert "| mod | 1.00 | 0.50 | 0.75 |" in table
    assert "| mean | 0.50 | 0.38 | 0.44 |" in table  # level means 0.5 and 0.375, overall 0.4375
    assert grid_mod.grid_summary(grid) == {"cells": 4, "at_most_0.1": 1, "at_least_0.9": 1, "between": 2}
    assert grid_mod.grid_means(grid)["pass@1"] == pytest.approx(0.4375)
    assert (
        grid_mod.normalize_grid(json.loads(json.dumps(grid))) == grid
    )  # JSON's string level keys back to ints
    # the report names the majority table by its n, like its summary line (it said "maj@n:" above "maj@8")
    report = grid_mod.grid_report(grid, split="test", samples=8, temperature=1.0)
    assert "\nmaj@8:\n" in report and "maj@n" not in report and "maj@8 0.438" in report


def test_evaluate_grid_scores_pass_at_1_majority_and_greedy(monkeypatch):
    """A fake sampler with known answers: pass@1, maj@4 and greedy derived by hand."""
    from ebpo import generation
    from ebpo.tasks import arith

    def fake_sample(model, tokenizer, prompts, *, n, temperature, **kwargs):
        answers = {r.prompt: int(r.answer) for r in arith.generate("validation", 45, seed=3)}
        texts = []
        for prompt in prompts:
            right = answers[prompt]
            if temperature == 0:  # greedy: right
                texts.append(str(right))
            else:  # 4 samples: right, wrong (+1), right, run on (a 7 appended): pass@1 1/2, majority right
                texts += [str(right), str(right + 1), str(right), f"{right}7"]
        return type("R", (), {"texts": texts})()

    monkeypatch.setattr(generation, "sample", fake_sample)
    grid = grid_mod.evaluate_grid(None, None, split="validation", per_cell=1, samples=4, seed=3)
    assert len(grid) == 9 and all(len(row) == 5 for row in grid.values())
    # kinds: 2 of 4 right, 1 near miss (+1), 1 run-on (also for a negative answer: "-37" -> "-377"); but the one
    # problem whose answer is 0 (mod, level 2: 25 mod 5 = 0) reads "07" as 7, one slipped digit: 2 near misses there
    kinds = {"right": 0.5, "near miss": 0.25, "run-on": 0.25, "other": 0.0, "no number": 0.0}
    zero = kinds | {"near miss": 0.5, "run-on": 0.0}
    cells = [v for row in grid.values() for v in row.values()]
    assert all(
        v | {"kinds": None} == {"pass@1": 0.5, "maj@n": 1.0, "greedy": 1.0, "kinds": None} for v in cells
    )
    assert [v["kinds"] for v in cells].count(kinds) == 44 and grid["mod"][2]["kinds"] == zero
    # the grid's shares: the mean over its 45 cells, near miss (44 x 0.25 + 0.5) / 45, run-on 44 x 0.25 / 45
    shares = grid_mod.grid_answer_kinds(grid)
    assert shares == pytest.approx(kinds | {"near miss": 11.5 / 45, "run-on": 11 / 45})
    report = grid_mod.grid_report(grid, split="validation", samples=4, temperature=1.0)
    assert report.endswith(
        "sampled answers: right 50.0%, near miss 25.6%, run-on 24.4%, other 0.0%, no number 0.0%"
    )
    # a grid recorded before the kinds were measured (an older build_info.json) reports without the line
    old = {
        t: {lv: {k: x for k, x in v.items() if k != "kinds"} for lv, v in row.items()}
        for t, row in grid.items()
    }
    assert grid_mod.grid_answer_kinds(old) == {} and "sampled answers" not in grid_mod.grid_report(
        old, split="validation", samples=4, temperature=1.0
    )
