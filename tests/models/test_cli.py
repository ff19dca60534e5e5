"""``ebpo base-model`` (``ebpo.models.cli``): builds into the cache or a folder, its help, its refusals, and
the grid's measurement settings."""

from __future__ import annotations

import dataclasses

import pytest

from ebpo.models import build as bm
from ebpo.models.recipes import arith as recipe
from helpers.base_model import TINY_COMMAND

# --- CLI ------------------------------------------------------------------------------------------------------


def test_cli_builds_into_cache_dir_and_prints_the_path_last(tmp_path, capsys):
    from ebpo.cli import main

    argv = [
        *TINY_COMMAND,
        "--cache-dir",
        str(tmp_path),
        "--near-miss-offsets=-1,1",  # "=": a value that starts with "-" would read as a flag
        "--quiet",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    expected = bm.base_model_path(
        recipe.BaseModelConfig(
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            steps=3,
            batch_size=8,
            train_problems=45,
            eval_per_cell=0,
            near_miss_offsets=(-1, 1),
        ),
        tmp_path,
    )
    assert printed == [str(expected)] and bm.is_built(expected)
    assert main(argv[:-1]) == 0  # built now: says so, prints the path
    out = capsys.readouterr().out
    assert "reusing the base model" in out and out.strip().endswith(str(expected))


def test_cli_help_documents_every_config_field(capsys):
    from ebpo.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["base-model", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for f in dataclasses.fields(recipe.BaseModelConfig):
        assert f"--{f.name.replace('_', '-')}" in text
    assert "--force" in text and "--check" in text and "--out" in text and "cosine decay to 10%" in text


def test_cli_rejects_a_malformed_tuple(capsys):
    from ebpo.cli import main

    with pytest.raises(SystemExit):
        main(["base-model", "--near-miss-offsets", "1,x"])
    assert "expected comma-separated ints" in capsys.readouterr().err


def test_cli_takes_an_empty_tuple_and_refuses_a_recipe_without_wrong_labels_in_one_line(tmp_path, capsys):
    from ebpo.cli import main

    # "--run-on-digits=" is the empty tuple; with no near misses and no digit slips (the default) nothing is left
    argv = ["base-model", "--cache-dir", str(tmp_path), "--run-on-digits="]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the teacher needs wrong labels" in err and "run_on_digits" in err
    assert not list(tmp_path.iterdir())  # nothing built


def test_cli_grid_samples_and_temperature_change_the_measurement_not_the_recipe(
    tmp_path, capsys, monkeypatch
):
    """``--grid-samples 3`` / ``--grid-temperature 2.5`` measure with 3 samples per problem / at T = 2.5 and
    reuse the build of the recipe as given:
    the recipe (and its key, hence its directory) does not move; 0 is one line on stderr, exit 2."""
    from ebpo.cli import main

    seen = {}

    def fake_grid(model, tokenizer, config, *, split, progress):
        seen.update(samples=config.eval_samples, temperature=config.eval_temperature, split=split)
        return {}

    monkeypatch.setattr(bm, "measure_grid", fake_grid)
    argv = ["base-model", "--cache-dir", str(tmp_path), "--hidden-size", "32", "--num-layers", "1"]
    argv += ["--num-heads", "2", "--steps", "3", "--batch-size", "8", "--train-problems", "45"]
    argv += ["--eval-per-cell", "0"]
    built = recipe.BaseModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, steps=3, batch_size=8, train_problems=45, eval_per_cell=0
    )
    assert main(argv + ["--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(bm.base_model_path(built, tmp_path))
    assert main(argv + ["--grid", "test", "--grid-samples", "3"]) == 0
    out = capsys.readouterr().out
    assert "reusing the base model" in out and out.strip().endswith(str(bm.base_model_path(built, tmp_path)))
    assert seen == {"samples": 3, "temperature": 1.0, "split": "test"}
    assert main(argv + ["--grid", "validation", "--grid-temperature", "2.5"]) == 0
    assert seen == {"samples": 8, "temperature": 2.5, "split": "validation"}
    capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "base_models").iterdir()) == [
        bm.base_model_path(built, tmp_path).name
    ]
    assert main(argv + ["--grid", "test", "--grid-samples", "0"]) == 2
    assert capsys.readouterr().err.strip() == "ebpo base-model: error: --grid-samples must be >= 1, got 0"
    assert main(argv + ["--grid", "test", "--grid-temperature", "0"]) == 2
    assert (
        capsys.readouterr().err.strip() == "ebpo base-model: error: --grid-temperature must be > 0, got 0.0"
    )
