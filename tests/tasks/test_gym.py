"""The ``gym:<dataset>`` task family (``ebpo.tasks.gym``): splits, determinism, topics and levels, bad names and
settings; and the commands that cross modules on a gym task (train then eval of its checkpoint, annotate and the
TRL data)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym", reason="the gym tasks need the ebpo[gym] extra")

from ebpo.errors import ConfigError  # noqa: E402
from ebpo.tasks import get_task, list_tasks, task_options, task_options_text  # noqa: E402
from ebpo.tasks.gym import decode_entry  # noqa: E402
from ebpo.tasks.splits import SPLITS, split_of  # noqa: E402
from helpers.gym import SMALL, gold  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl" / "train_ebpo.py"


@pytest.fixture(scope="module")
def task():
    return get_task("gym:chain_sum,spell_backward", **SMALL)


def test_the_family_is_in_the_task_registry():
    assert "gym:<dataset>[,<dataset>...]" in list_tasks() and "arith" in list_tasks()
    assert get_task("gym:gcd").name == "gym:gcd"  # reasoning-gym's default settings


def test_splits_are_disjoint_by_question_text_over_seeds(task):
    questions = {split: set() for split in SPLITS}
    for split, seed in itertools.product(SPLITS, (0, 1, 2)):
        for record in task.generate(split, 60, seed=seed):
            assert split_of(record.prompt) == split  # membership by construction
            questions[split].add(record.prompt)
    for a, b in itertools.combinations(SPLITS, 2):
        assert not questions[a] & questions[b], (a, b)
    assert all(len(q) > 30 for q in questions.values())  # the seeds drew different questions


def test_generation_is_deterministic_in_the_seed(task):
    first = [r.to_dict() for r in task.generate("train", 30, seed=5)]
    again = [
        r.to_dict() for r in get_task("gym:chain_sum,spell_backward", **SMALL).generate("train", 30, seed=5)
    ]
    other = [r.to_dict() for r in task.generate("train", 30, seed=6)]
    assert first == again
    assert [r["prompt"] for r in first] != [r["prompt"] for r in other]
    assert task.generate("train", 10, seed=5)[3].to_dict() == first[3]  # a prefix: n does not change records


def test_topics_levels_and_records(task):
    assert task.topics == ("chain_sum", "spell_backward") and tuple(task.levels) == (1, 2)
    records = task.generate("validation", 30, seed=0)
    # cells cycle: (chain_sum, 1), (chain_sum, 2), (spell_backward, no level)
    assert [(r.topic, r.level) for r in records[:3]] == [
        ("chain_sum", 1),
        ("chain_sum", 2),
        ("spell_backward", None),
    ]
    for record in records:
        entry = decode_entry(record.answer)
        assert record.source == "gym" and entry["dataset"] == record.topic
        assert record.id.startswith("gym-validation-0-")
        if record.topic == "chain_sum":  # 2 terms of one digit at level 1, of two digits at level 2
            terms = record.prompt.rsplit(":", 1)[1].rstrip("=").split()[::2]
            assert len(terms) == 2 and {len(t) for t in terms} == {record.level}
            assert int(entry["answer"]) == eval(record.prompt.rsplit(":", 1)[1].rstrip("="))  # noqa: S307
            assert entry["config"]["max_terms"] == 2  # the settings that differ from the defaults
        else:
            assert gold(record) == record.prompt.rsplit(": ", 1)[1][::-1] and len(gold(record)) <= 5
    # topics / levels pick cells
    only = task.generate("train", 8, seed=0, topics=["chain_sum"], levels=[2])
    assert {(r.topic, r.level) for r in only} == {("chain_sum", 2)}
    with pytest.raises(ValueError, match=r"unknown gym levels \[3\]; valid: 1, 2"):
        task.generate("train", 4, levels=[3])
    with pytest.raises(ValueError, match=r"unknown gym topics \['gcd'\]; valid: chain_sum, spell_backward"):
        task.generate("train", 4, topics=["gcd"])


def test_curriculum_levels_are_reasoning_gyms_own():
    # count_bits' curriculum: n in ranges between 10, 1000, 10^6, ... (an interval at every level), so in the
    # curriculum's upper_bound ranges our level 1 (its level 0) is n in [10, 1000] and level 2 n in [1000, 10^6]
    task = get_task("gym:count_bits", count_bits={"levels": [1, 2]})
    ranges = {1: (10, 1000), 2: (1000, 10**6)}
    records = task.generate("train", 40, seed=0)
    assert [r.level for r in records[:4]] == [1, 2, 1, 2]
    for record in records:
        n = int(record.prompt.rsplit(" ", 1)[1].rstrip("?"))
        low, high = ranges[record.level]
        assert low <= n <= high, (record.level, n)


def test_unknown_names_and_settings_are_one_line_listing_the_valid_ones():
    cases = {
        "gym:chain_summ": r"^unknown gym dataset 'chain_summ'; valid choices: .*\bchain_sum\b.*\bspell_backward\b",
        "gym:": r"^gym task '': name datasets as gym:<dataset>",
        "gym:gcd,gcd": r"named twice",
        "gymm:gcd": r"^unknown task 'gymm:gcd'; valid choices: arith, gym:<dataset>\[,<dataset>\.\.\.\]; .*--plugins",
        "gym:composite": r"not supported",
    }
    for name, message in cases.items():
        with pytest.raises(ValueError, match=message) as error:
            get_task(name)
        assert "\n" not in str(error.value)
    settings_cases = [
        ({"gcd": {"max_vaule": 9}}, r"gym dataset 'gcd': unknown setting 'max_vaule'; valid settings: levels, "
         r"max_numbers, max_value, min_numbers, min_value$"),
        ({"gcd": {"levels": {1: {"seed": 3}}}}, r"gym dataset 'gcd', level 1: unknown setting 'seed'"),
        ({"gcd": {"min_value": 50, "max_value": 10}}, r"gym dataset 'gcd': invalid settings \(min_value=50, "),
        ({"gcd": {"levels": [9]}}, r"gym dataset 'gcd': its curriculum has levels 1\.\.4, got 9"),
        ({"gcd": {"levels": "1"}}, r"levels must be a non-empty list"),
        ({"lcm": {}}, r"gym settings name dataset 'lcm', which gym:gcd does not hold"),
    ]  # fmt: skip
    for settings, message in settings_cases:
        with pytest.raises(ValueError, match=message) as error:
            get_task("gym:gcd", **settings)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"no train question in \d+ draws; its settings allow too few"):
        # four questions (gcd of 1s and 2s), all four of them in the sft split
        get_task("gym:gcd", gcd={"min_value": 1, "max_value": 2}).generate("train", 1)
    with pytest.raises(ValueError, match="arith' takes no options"):
        get_task("arith", mod={"x": 1})
    assert task_options("{gcd: {max_value: 9}}", "--task-options") == {"gcd": {"max_value": 9}}
    with pytest.raises(ValueError, match="--task-options: expected a mapping"):
        task_options("[1, 2]", "--task-options")
    # and back: one line that reads as it was written, the mixture's integer level keys included
    from ebpo.models.recipes.gym import MIXTURE

    text = task_options_text(MIXTURE)
    assert "\n" not in text and task_options(text, "x") == MIXTURE
    assert task_options_text({}) == "{}" and task_options("{}", "x") == {}


def test_a_dataset_whose_entries_do_not_survive_json_is_refused():
    with pytest.raises(ValueError, match=r"gym dataset 'arc_agi' is not supported: its entries do not score"):
        get_task("gym:arc_agi").generate("train", 1)


# ------------------------------------------------------------------------------------------------------
# the commands on a gym task


def test_ebpo_train_config_gym_then_ebpo_eval_of_the_checkpoint_it_prints(tmp_path, capsys, monkeypatch):
    # the gym preset (S2 on its mixture) shrunk to 2 steps, as a user types it; then `ebpo eval` of the last
    # checkpoint it printed, with no flags but the small sizes: the gym test split of the run's own task
    import re

    from ebpo.cli import main
    from ebpo.models.recipes.gym import DATASETS, MIXTURE, TASK
    from ebpo.trackers import read_metrics
    from ebpo.trainer.config_files import load_config
    from ebpo.trainer.trainer import Trainer

    monkeypatch.chdir(tmp_path)
    small = ["data.train_size=24", "data.val_size=24", "data.batch_size=2", "data.group_size=2", "run.steps=2",
             "run.eval_every=2", "run.eval_n=2", "run.eval_k=2", "optim.mini_batch_size=1", "run.plot=false",
             "run.progress=false", "run.report_to=[]", "run.name=gym"]  # fmt: skip
    assert main(["train", "--config", "gym", *small]) == 0
    out = capsys.readouterr().out
    last = Path(re.search(r"^run directory: (\S+)$", out, re.M).group(1)) / "checkpoints" / "last"
    rows = read_metrics(last.parent.parent)
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert {f"eval/pass@1/{name}" for name in DATASETS} | {"reward/verified"} <= set(rows[-1])
    common = ["--n", "2", "--limit", "4", "--ks", "1,2", "--maj-ks", "2", "--quiet", "--no-cache"]
    assert main(["eval", str(last), *common, "--out-dir", "out"]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["benchmarks"] == [TASK]  # the run's task, with its settings, scored by the gym reward
    assert results["settings"]["task_options"] == json.loads(json.dumps(MIXTURE))
    assert results["results"][str(last)][TASK]["num_problems"] == 4
    with pytest.raises(
        ConfigError, match=r"^data\.task: gym dataset 'chain_sum': unknown setting 'max_term'"
    ):
        Trainer(load_config("gym", [*small, "data.task_options={chain_sum: {max_term: 2}}"]), run_dir="b")


def test_annotate_and_the_trl_data_carry_the_entry(tiny_model_dir, tmp_path, monkeypatch):
    from ebpo.annotate.difficulty import DifficultyConfig, annotate_difficulty
    from ebpo.data.loaders import load_records, write_records

    records = get_task("gym:chain_sum", chain_sum={"max_terms": 2}).generate("train", 4, seed=0)
    # ebpo annotate difficulty: a records file of the gym task, scored by the gym reward
    write_records(tmp_path / "gym.jsonl", records)
    annotate_difficulty(
        tmp_path / "gym.jsonl",
        tmp_path / "gym.diff.jsonl",
        DifficultyConfig(model=str(tiny_model_dir), reward="gym", k=2, max_new_tokens=4, device="cpu"),
        schema="records",
        progress=False,
    )
    annotated = load_records(tmp_path / "gym.diff.jsonl", "records")
    assert [r.answer for r in annotated] == [r.answer for r in records]
    assert all(r.difficulty == 0.0 and r.topic == "chain_sum" for r in annotated)
    # TRL: the example's dataset column reaches the reward as it is (the verl writer: tests/integrations/verl)
    spec = importlib.util.spec_from_file_location("train_ebpo_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, example)  # dataclasses resolve their module by name
    spec.loader.exec_module(example)
    from ebpo.data.prompts import PromptFormat

    column = example.to_dataset(records, PromptFormat(None, chat=False))["answer"]
    completions = [f"<answer>{gold(r)}</answer>" for r in records]
    assert example.make_reward("gym")(completions, column) == [1.0] * len(records)
