"""The flags ``ebpo.settings.flags`` generates: ``simulate``, ``diagnose``, ``eval``, ``annotate
difficulty``, ``annotate topic``, ``base-model`` and ``train`` accept the flags they always took, document
each field in ``--help`` with its default, parse into the dataclasses, and read ``--config FILE``, the flags
given winning."""

from __future__ import annotations

import argparse
import dataclasses
import os
from unittest import mock

import pytest

from ebpo.annotate.cli import DifficultyCommand, TopicCommand
from ebpo.annotate.difficulty import DifficultyConfig
from ebpo.annotate.topic import JudgeConfig
from ebpo.cli import main
from ebpo.diagnostics.config import DiagnoseConfig
from ebpo.eval.cli import EvalCommand
from ebpo.eval.cli import build_parser as eval_parser
from ebpo.eval.harness import SamplingOptions
from ebpo.models.cli import BaseModelCommand
from ebpo.models.recipes.arith import BaseModelConfig
from ebpo.settings import comma_tuple, dataclass_parser, from_args
from ebpo.simulate import SimulateConfig
from ebpo.trainer.cli import TrainCommand
from ebpo.trainer.cli import build_parser as train_parser

# Every flag each command documents (the flags it had before its parser was generated, but for
# annotate topic's --benchmarks, replaced by --data-dir): none may go.
FLAGS = {
    "simulate": "--concentration --drift --group-size --half-life --num-topics --out-dir --prompts-per-step "
    "--seeds --steps --theorem2-steps --topic-block --warmup -G -K -M",
    "eval": "--batch-size --benchmarks --cache-dir --chat-template --data-dir --device --dtype --keep-texts --ks "
    "--limit --maj-ks --maj-mode --max-new-tokens --n --no-cache --out-dir --quiet --reward --reward-option --seed "
    "--temperature --top-p",
    "annotate topic": "--api-key --backend --backoff --base-url --cache --concurrency --data-dir --device "
    "--embedding-model --evaluate --input --judge-batch-size --judge-model --max-reasks --max-retries --output "
    "--relabel --schema --timeout",
    "annotate difficulty": "--chat-template --device --dtype --input --k --max-new-tokens --model "
    "--no-chat-template --no-progress --output --prompts-per-call --reward --schema --seed --temperature "
    "--threshold --top-p",
    "base-model": "--batch-size --cache-dir --check --clean-steps --eval-per-cell --eval-samples "
    "--eval-temperature --force --grad-clip --grid --grid-samples --grid-temperature --hidden-size "
    "--level-weights --lr --max-new-tokens --near-miss-digit-slips --near-miss-offsets "
    "--no-near-miss-digit-slips --num-heads --num-layers --out --quiet --run-on-digits --seed --steps "
    "--teacher-level-factor --teacher-topic-accuracy --train-problems --warmup-steps --weight-decay",
    "train": "--config --resume --run-dir --overwrite --help-config",
    "diagnose": "-G -M -R -W",
}
DATACLASSES = {
    "simulate": [SimulateConfig],
    "eval": [EvalCommand, SamplingOptions],
    "annotate topic": [TopicCommand, JudgeConfig],
    "annotate difficulty": [DifficultyCommand, DifficultyConfig],
    "base-model": [BaseModelCommand, BaseModelConfig],
    "train": [TrainCommand],
    "diagnose": [DiagnoseConfig],
}


def _help(command: str, capsys) -> str:
    # a terminal wide enough that argparse wraps no line (it breaks after a hyphen: "built-" / "in")
    with mock.patch.dict(os.environ, {"COLUMNS": "100000"}), pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # one space between words, as the help texts have


@pytest.mark.parametrize("command", list(FLAGS))
def test_help_lists_the_old_flags_and_every_field_with_its_help_and_default(command, capsys):
    text = _help(command, capsys)
    assert text.startswith(f"usage: ebpo {command} ")
    for flag in FLAGS[command].split():
        assert f"{flag} " in text or f"{flag}," in text, flag
    for cls in DATACLASSES[command]:
        for f in dataclasses.fields(cls):
            flag = f"--{f.name.replace('_', '-')}"
            help_text = " ".join(f.metadata["help"].split())
            assert f"{flag} " in text or f"{flag}," in text, flag
            assert help_text in text, f.name
            default = f.default_factory() if callable(f.default_factory) else f.default
            if isinstance(default, tuple):  # shown as the flag takes it: 1,16 (an empty one is not shown)
                default = ",".join(map(str, default)) or None
            if default == []:  # an empty list is not shown either
                default = None
            if not any(default is nothing for nothing in (None, False, dataclasses.MISSING)):
                assert f"{help_text} (default {default})" in text, f.name


def test_simulate_flags_parse_into_the_config():
    parser = dataclass_parser("ebpo simulate", "", [SimulateConfig])
    args = parser.parse_args(["-G", "8", "--seeds", "3", "4", "--theorem2-steps", "50", "--out_dir", "x"])
    assert from_args(SimulateConfig, args) == SimulateConfig(
        group_size=8, seeds=[3, 4], theorem2_steps=50, out_dir="x"
    )
    assert from_args(SimulateConfig, parser.parse_args([])) == SimulateConfig()


def test_judge_flags_keep_their_short_spellings():
    parser = dataclass_parser("ebpo annotate topic", "", [TopicCommand, JudgeConfig])
    argv = ["--judge-model", "m", "--base-url", "http://h/v1", "--backoff", "0.5", "--timeout", "3"]
    args = parser.parse_args([*argv, "--judge-batch-size", "4", "--cache", "c.jsonl", "--relabel"])
    config = from_args(JudgeConfig, args)
    assert (config.model, config.base_url, config.backoff_s, config.timeout_s) == (
        "m",
        "http://h/v1",
        0.5,
        3.0,
    )
    assert config.batch_size == 4 and str(config.cache_path) == "c.jsonl"
    assert (
        from_args(TopicCommand, args).relabel is True and from_args(TopicCommand, args).backend == "keyword"
    )


def test_booleans_with_a_negative_flag():
    parser = dataclass_parser("d", "", [DifficultyCommand, DifficultyConfig], negatable=["chat_template"])
    base = ["--input", "i", "--output", "o", "--model", "m"]
    assert parser.parse_args(base).chat_template == "auto"  # the tokenizer decides
    # a choice with `off`: the flag alone is on, --no-<flag> is off
    assert parser.parse_args([*base, "--chat-template"]).chat_template == "on"
    assert parser.parse_args([*base, "--chat-template", "off"]).chat_template == "off"
    assert parser.parse_args([*base, "--no-chat-template"]).chat_template == "off"
    assert parser.parse_args([*base, "--no-progress"]).no_progress is True


def test_tuple_fields_take_comma_separated_values():
    parser = dataclass_parser(
        "b", "", [BaseModelCommand, BaseModelConfig], negatable=["near_miss_digit_slips"]
    )
    args = parser.parse_args(["--level-weights", "1,2,3,4,5", "--near-miss-offsets=-1,1", "--run-on-digits="])
    config = from_args(BaseModelConfig, args, near_miss_digit_slips=True)
    assert config.level_weights == (1.0, 2.0, 3.0, 4.0, 5.0) and config.near_miss_offsets == (-1, 1)
    assert config.run_on_digits == () and config.near_miss_digit_slips is True
    assert parser.parse_args(["--grid", "test"]).grid == "test"
    with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated ints, got '1,x'"):
        comma_tuple(int)("1,x")


def test_eval_flags_parse_as_before():
    parser = eval_parser()
    args = parser.parse_args(["--quiet", "m1", "m2", "--ks", "1,2", "--reward-option", "timeout_s=10"])
    assert args.models == ["m1", "m2"] and args.quiet is True  # a switch does not take the MODEL after it
    assert args.ks == (1, 2) and args.maj_ks == (16,) and args.reward_option == [("timeout_s", 10)]
    args = parser.parse_args(["--no-cache", "--reward-option", "a=x", "--reward-option", "b=true", "--n=4"])
    assert args.no_cache and args.models == [] and args.reward_option == [("a", "x"), ("b", True)]
    command, sampling = from_args(EvalCommand, args), from_args(SamplingOptions, args)
    assert command.chat_template == "auto" and command.max_new_tokens is None and sampling.n == 4
    assert (sampling.temperature, sampling.top_p, sampling.batch_size) == (0.6, 0.95, 64)


def test_eval_k_below_one_is_one_line(tmp_path, capsys):
    assert main(["eval", "--ks", "1,0", "--out-dir", str(tmp_path), "--no-cache"]) == 2
    assert capsys.readouterr().err == "ebpo eval: error: --ks: every k must be >= 1, got 1,0\n"


def test_a_bad_value_is_a_usage_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--steps", "many"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ebpo simulate") and "argument --steps: invalid int value: 'many'" in err


def test_train_switches_do_not_take_the_override_after_them():
    parser = train_parser()
    args = parser.parse_args(["--config", "grpo", "--overwrite", "run.steps=3", "optim.lr=1e-3"])
    assert (
        args.overwrite is True
        and args.config == "grpo"
        and args.overrides == ["run.steps=3", "optim.lr=1e-3"]
    )
    args = parser.parse_args(["--run-dir", "d", "--help-config"])
    assert (args.run_dir, args.help_config, args.overrides, args.resume) == ("d", True, [], None)


def test_a_command_reads_its_options_from_a_yaml_file_and_its_flags_win(tmp_path, capsys):
    options = tmp_path / "simulate.yaml"
    options.write_text("group-size: 8\nsteps: 50\nseeds: [3, 4]\n")  # a key spelled as the flag or the field
    parser = dataclass_parser("ebpo simulate", "", [SimulateConfig])
    config = from_args(SimulateConfig, parser.parse_args(["--config", str(options), "--steps", "60"]))
    assert config == SimulateConfig(group_size=8, steps=60, seeds=[3, 4])
    assert from_args(SimulateConfig, parser.parse_args([])) == SimulateConfig()  # the file set no default
    sampling = tmp_path / "eval.yaml"
    sampling.write_text("ks: [1, 4]\nn: 4\nquiet: true\n")
    args = eval_parser().parse_args([f"--config={sampling}", "m1"])
    assert (
        args.ks == (1, 4) and args.quiet and args.models == ["m1"] and from_args(SamplingOptions, args).n == 4
    )
    # a key or value at fault: one usage error naming the file and the key
    for text, message in (
        ("stpes: 3\n", "unknown key 'stpes' (did you mean 'steps'?)"),
        (
            "stpes: 3\nzeal: 1\n",
            "2 unknown keys: 'stpes' (did you mean 'steps'?); 'zeal' (valid keys: concentration",
        ),
        ("steps: x\n", "steps must be an integer, got 'x'"),
    ):
        options.write_text(text)
        with pytest.raises(SystemExit) as exit_info:
            main(["simulate", "--config", str(options)])
        assert exit_info.value.code == 2
        assert f"ebpo simulate: error: {options}: {message}" in capsys.readouterr().err
    # ebpo train's --config is its own: a preset or YAML file of TrainConfig keys
    assert train_parser().parse_args(["--config", "grpo"]).config == "grpo"
