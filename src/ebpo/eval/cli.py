"""``ebpo eval``: Pass@1 over n samples (plus pass@k, maj@k) for one or more models on named benchmarks.

With no MODEL, evaluates the built-in ``arith`` base model (shipped with the package) on the ``arith`` test
split; with models, the default benchmarks are the paper's five (aime24, aime25, amc23, math500,
olympiadbench), loaded from their public Hugging Face hub copies at pinned revisions (cached by ``datasets``),
or from our JSON Lines files with ``--data-dir DIR`` or ``$EBPO_DATA_DIR``.
Writes ``results.md`` (the paper-style table: one row per model, one column per benchmark, plus Average),
``results.csv`` and ``results.json`` to ``--out-dir`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ebpo.console import show_traceback
from ebpo.data.prompts import ChatTemplateSetting
from ebpo.errors import first_line
from ebpo.models.names import BUILTIN
from ebpo.settings import add_command, dataclass_parser

CLIP_WARNING = 0.01  # warn when at least this fraction of a benchmark's responses hit --max-new-tokens


def _reward_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``; VALUE is read as JSON when it parses (numbers, true/false), else kept as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def default_cache_dir() -> Path:
    """``$EBPO_CACHE/eval`` or ``~/.cache/ebpo/eval``: beside the base models, under one cache root."""
    from ebpo.models.build import cache_root

    return cache_root() / "eval"


@dataclass
class EvalCommand:
    """What ``ebpo eval`` evaluates, how it scores, and where results go (its sampling settings are
    ``ebpo.eval.harness.SamplingOptions``; MODEL and ``--reward-option`` are added by :func:`build_parser`)."""

    benchmarks: str | None = field(
        default=None,
        metadata={
            "help": "comma-separated benchmark names: aime24, aime25, amc23, math500, olympiadbench, arith, "
            "gym:<dataset>[,<dataset>...] (the test split of reasoning-gym datasets, scored by their own "
            "score_answer; gym:a,b is one benchmark, gym:a,gym:b two) (default: the task the models were made "
            "for when they share one: a built-in model's (arith for builtin:arith, S2's mixture for builtin:gym) "
            "or the generated data.task of the ebpo train run they come from, with its settings; else the five "
            "paper sets)"
        },
    )
    task_options: str | None = field(
        default=None,
        metadata={
            "metavar": "YAML",
            "help": "settings of the gym benchmarks' generators as a YAML mapping, as `ebpo train`'s "
            "data.task_options: '{chain_sum: {max_terms: 3}}' (each gym benchmark takes its datasets' settings)",
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "metavar": "DIR",
            "help": "read the paper's sets from DIR/<name>.jsonl (one JSON object with problem and answer per "
            "line) instead of the Hugging Face hub (default: $EBPO_DATA_DIR if set, else the hub copies at "
            "pinned revisions, cached by datasets; docs/evaluation.md)",
        },
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={
            "help": "longest response in tokens (default: per benchmark, 4096 for the math sets, 16 for arith, "
            "64 for gym)"
        },
    )
    limit: int | None = field(
        default=None, metadata={"help": "evaluate only the first LIMIT problems of each benchmark"}
    )
    ks: tuple[int, ...] = field(default=(1, 16), metadata={"help": "k values of pass@k, comma-separated"})
    maj_ks: tuple[int, ...] = field(default=(16,), metadata={"help": "k values of maj@k, comma-separated"})
    maj_mode: Literal["subsets", "first"] = field(
        default="subsets",
        metadata={
            "help": "maj@k with n > k: expected vote over random k-subsets (subsets) or vote of the first k (first)"
        },
    )
    chat_template: ChatTemplateSetting = field(
        default="auto",
        metadata={
            "help": "wrap prompts in the tokenizer's chat template: auto = when the tokenizer has one | on | off; "
            "the same prompt ids as ebpo train's data.chat_template"
        },
    )
    reward: str | None = field(
        default=None,
        metadata={"help": "reward name override (default: math for math sets, arith for arith, gym for gym)"},
    )
    device: str | None = field(
        default=None, metadata={"help": "torch device (default: cuda if available, else cpu)"}
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto", metadata={"help": "model dtype (auto: bfloat16 on CUDA, float32 on CPU)"}
    )
    cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "per-problem result cache for resuming (default: $EBPO_CACHE/eval or ~/.cache/ebpo/eval)"
        },
    )
    no_cache: bool = field(default=False, metadata={"help": "do not read or write the result cache"})
    keep_texts: bool = field(default=False, metadata={"help": "store response texts in the cache"})
    out_dir: str = field(default="eval_results", metadata={"help": "where results.md/.csv/.json go"})
    quiet: bool = field(default=False, metadata={"help": "no progress bars"})


SWITCHES = ("no_cache", "keep_texts", "quiet")
"""EvalCommand's booleans: flags without a value, so that a MODEL after them is not read as theirs."""


def build_parser(prog: str = "ebpo eval") -> argparse.ArgumentParser:
    """``ebpo eval``'s parser: one flag per field of :class:`EvalCommand` and
    ``ebpo.eval.harness.SamplingOptions`` (``ebpo.settings``), the positional MODELs and the repeatable
    ``--reward-option KEY=VALUE``, which a dataclass field cannot declare."""
    from ebpo.eval.harness import SamplingOptions

    parser = dataclass_parser(
        prog, __doc__ or "", [EvalCommand, SamplingOptions], switches=SWITCHES, raw_description=True
    )
    parser.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="local Hugging Face model directories, ebpo train run or checkpoint directories, or built-in "
        f"models: {BUILTIN}:arith (S1, also {BUILTIN}), {BUILTIN}:gym (S2) (default: {BUILTIN})",
    )
    parser.add_argument(
        "--reward-option",
        type=_reward_option,
        action="append",
        metavar="KEY=VALUE",
        help="option for the reward factory, repeatable, e.g. timeout_s=10 or num_workers=0 (math: in-process "
        "verification without a time limit)",
    )
    return parser


def add_parser(subparsers: Any) -> None:
    """Register ``ebpo eval`` (its parser is built when it runs: :func:`build_parser`)."""
    add_command(
        subparsers,
        "eval",
        help="evaluate models: Pass@1 (avg over n samples), pass@k, maj@k; paper-style table",
        parser=build_parser,
        run=run,
    )


def _resolve_model(name: str, quiet: bool) -> Path:
    """The model directory MODEL names (``ebpo.models.names.resolve_model``: a built-in model by name, a
    model, a checkpoint or a run directory, the choice said on stderr); a checkpoint's model files are checked
    against its manifest before anything loads them."""
    from ebpo.errors import ConfigError
    from ebpo.models.names import builtin_hint, resolve_model

    try:
        found = resolve_model(name, progress=not quiet)
    except ConfigError as err:
        raise ConfigError(f"{err} ({builtin_hint()})") from None
    if found.checkpoint is not None:
        from ebpo.run_directory import RunDirectory
        from ebpo.trainer.checkpoint import verify_checkpoint

        verify_checkpoint(found.checkpoint, under=RunDirectory.MODEL, use="ebpo eval")
    if found.note:
        print(f"ebpo eval: {found.note}", file=sys.stderr)
    return found.path


def _task_made_for(name: str) -> tuple[str, dict[str, Any]] | None:
    """The benchmark of the task model ``name`` was made for, with its generator settings: a built-in model's
    (``Recipe.task``), or the generated ``data.task`` of the ``ebpo train`` run whose checkpoint it is (its
    ``config.yaml``); None when there is none (a model of its own, a run on files) or it is no benchmark. A
    name that names no model is left to :func:`_resolve_model` to report."""
    from ebpo.errors import ConfigError
    from ebpo.eval.benchmarks import get_benchmark
    from ebpo.models.names import builtin_recipe

    try:
        recipe = builtin_recipe(name)
        if recipe is not None:
            task, options = recipe.task, dict(recipe.task_options)
        else:
            from ebpo.models.paths import find_model
            from ebpo.run_directory import RunDirectory
            from ebpo.settings import read_yaml

            checkpoint = find_model(Path(name).expanduser()).checkpoint
            if checkpoint is None or checkpoint.parent.name != RunDirectory.CHECKPOINTS:
                return None
            config = checkpoint.parent.parent / RunDirectory.CONFIG
            data = read_yaml(config).get("data") if config.is_file() else None
            if not isinstance(data, dict) or data.get("train_file") is not None:
                return None
            task, options = str(data.get("task", "arith")), dict(data.get("task_options") or {})
        get_benchmark(task, **options)
    except (ConfigError, ValueError, TypeError):
        return None
    return task, options


def _json_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def run(args: argparse.Namespace, *, generate_fns: dict[str, Any] | None = None) -> int:
    """Run ``ebpo eval``. ``generate_fns`` (model name -> ``(prompts, n, seeds) -> texts``) replaces model
    loading for those names: used by tests and by callers with their own inference engine.

    Returns the exit code: 0, 2 after a bad flag, file or cache (one line on stderr naming it, no
    traceback), 130 after Ctrl-C (finished chunks stay in the cache; the message says how to resume).
    """
    from ebpo.persist import WriteError

    cache_dir = None if args.no_cache else Path(args.cache_dir or default_cache_dir())
    if cache_dir is None:
        kept = "nothing was kept (--no-cache)"
    else:
        kept = (
            f"the problems finished so far are cached under {cache_dir}: run the same command again to resume"
        )
    try:
        return _run(args, cache_dir, generate_fns or {})
    except KeyboardInterrupt:
        print(f"ebpo eval: interrupted; {kept}", file=sys.stderr)
        return 130
    except WriteError as err:  # the cache or the results: what was finished stays cached
        show_traceback(err)
        print(
            f"ebpo eval: error: cannot write {err.path}: {err.reason}; {kept} once you {err.fix}",
            file=sys.stderr,
        )
        return 1
    except (ValueError, OSError) as err:  # our messages name the flag, file or line and the fix
        show_traceback(err)
        print(f"ebpo eval: error: {err}", file=sys.stderr)
        return 2


def _skipped_metrics(args: argparse.Namespace) -> list[str]:
    """pass@k / maj@k that ``--n`` is too small for (k > n), in the order they were asked for."""
    skipped = [f"pass@{k}" for k in dict.fromkeys(args.ks) if k > args.n]
    return skipped + [f"maj@{k}" for k in dict.fromkeys(args.maj_ks) if k > args.n]


def _data_dir_setting(flag: str | None) -> str | None:
    """Where the paper's sets are read from, for results.json: the folder (flag, else $EBPO_DATA_DIR), or
    None for the hub copies."""
    from ebpo.data.loaders import benchmark_dir

    folder = flag or benchmark_dir()
    return None if folder is None else str(folder)


def _family_datasets(benchmark: str) -> list[str]:
    """The datasets a family benchmark names (``gym:a,b`` -> a, b); none for a fixed benchmark."""
    prefix, sep, argument = benchmark.partition(":")
    return [name.strip() for name in argument.split(",")] if sep else []


def _settings_of(benchmark: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The ``--task-options`` entries of the datasets ``benchmark`` names."""
    return {name: settings[name] for name in _family_datasets(benchmark) if name in settings}


def _run(args: argparse.Namespace, cache_dir: Path | None, generate_fns: dict[str, Any]) -> int:
    from ebpo.data.prompts import PromptFormat
    from ebpo.eval.benchmarks import PAPER_BENCHMARKS, get_benchmark, split_benchmarks
    from ebpo.eval.harness import LazyModel, SamplingConfig, cache_file, evaluate, records_digest
    from ebpo.eval.harness import model_fingerprint as fingerprint
    from ebpo.eval.report import write_outputs
    from ebpo.tasks import task_options

    models = list(args.models) or [BUILTIN]
    if args.quiet:  # transformers' and the hub's own bars too (loading weights, downloads)
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        disable_progress_bars()
    if args.data_dir is not None and not Path(args.data_dir).expanduser().is_dir():
        raise ValueError(
            f"--data-dir {args.data_dir} does not exist; give the folder holding <benchmark>.jsonl"
        )
    settings_given = task_options(args.task_options, "--task-options")
    if args.benchmarks:
        benchmarks = split_benchmarks(args.benchmarks)
    else:
        made_for = {_json_key(_task_made_for(name)) for name in models}
        shared = _task_made_for(models[0]) if len(made_for) == 1 else None
        if shared is None:
            benchmarks = list(PAPER_BENCHMARKS)
        else:
            benchmarks = [shared[0]]
            settings_given = settings_given or shared[1]
    try:  # unknown names and settings fail here, before any model loads
        specs = [get_benchmark(b, **_settings_of(b, settings_given)) for b in benchmarks]
    except ValueError as err:
        raise ValueError(f"--benchmarks: {err}") from None
    unused = sorted(set(settings_given) - {d for b in benchmarks for d in _family_datasets(b)})
    if unused:
        raise ValueError(
            f"--task-options: {unused[0]!r} is not a dataset of any gym benchmark in --benchmarks"
        )
    if args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    for flag, values in (("--ks", args.ks), ("--maj-ks", args.maj_ks)):
        if any(k < 1 for k in values):
            raise ValueError(f"{flag}: every k must be >= 1, got {','.join(map(str, values))}")
    if args.limit is not None and args.limit < 0:
        raise ValueError(f"--limit must be >= 0, got {args.limit}")
    skipped = _skipped_metrics(args)
    if skipped:
        largest = max(int(name.split("@")[1]) for name in skipped)
        print(
            f"ebpo eval: warning: --n {args.n} is below k, so {', '.join(skipped)} are not reported; use "
            f"--n {largest} or more, or drop them from --ks / --maj-ks",
            file=sys.stderr,
        )
    ks = [k for k in args.ks if k <= args.n]
    maj_ks = [k for k in args.maj_ks if k <= args.n]
    settings = {
        "n": args.n,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "limit": args.limit,
        "ks": list(args.ks),
        "maj_ks": list(args.maj_ks),
        "maj_mode": args.maj_mode,
        "chat_template": args.chat_template,
        "reward": args.reward,
        "reward_options": dict(args.reward_option or []),
        "task_options": settings_given,
        "skipped_metrics": skipped,
        "data_dir": _data_dir_setting(args.data_dir),
    }
    # every model is found before any set loads (a hub download takes a while, and retries when offline); a
    # run or checkpoint directory says here which checkpoint it scores
    paths = {name: _resolve_model(name, args.quiet) for name in models if name not in generate_fns}
    records_by_bench = {spec.name: spec.load(data_dir=args.data_dir) for spec in specs}
    reward_options = dict(args.reward_option or [])
    rewards: dict[str, Any] = {}  # one reward object (and worker pool) per name

    results: dict[str, dict[str, dict[str, float]]] = {}
    for name in models:
        scripted = generate_fns.get(name)
        lazy_model = None
        tokenizer = None
        chat_template: ChatTemplateSetting = "off"  # a scripted generate_fn has no tokenizer: raw prompts
        if scripted is None:
            from transformers import AutoTokenizer

            path = paths[name]
            try:
                tokenizer = AutoTokenizer.from_pretrained(path)
            except Exception as err:  # noqa: BLE001 - a damaged or missing tokenizer file: one line
                raise ValueError(f"cannot load the tokenizer of {path}: {first_line(err)}") from err
            tokenizer.padding_side = "left"
            prompt_format = PromptFormat.resolve(
                tokenizer, args.chat_template, option="--chat-template", source=path
            )
            chat_template = prompt_format.setting  # on | off, in the cache key as resolved
            model_key = {"path": str(path.resolve()), "fingerprint": fingerprint(path)}
            lazy_model = LazyModel(path, tokenizer, device=args.device, dtype=args.dtype)
        else:
            model_key = {"generate_fn": name}
        results[name] = {}
        for spec in specs:
            sampling = SamplingConfig(
                n=args.n,
                temperature=args.temperature,
                top_p=args.top_p,
                max_new_tokens=args.max_new_tokens or spec.max_new_tokens,
                seed=args.seed,
                batch_size=args.batch_size,
                chat_template=chat_template,
            )
            reward_name = args.reward or spec.reward
            if reward_name not in rewards:
                from ebpo.rewards import get_reward

                try:
                    rewards[reward_name] = get_reward(reward_name, **reward_options)
                except TypeError as err:
                    show_traceback(err)
                    raise SystemExit(
                        f"ebpo eval: error: --reward-option not accepted by reward {reward_name!r}: {err}"
                    ) from err
            cache = None
            if cache_dir is not None:
                cache = cache_file(
                    cache_dir,
                    name,
                    spec.name,
                    sampling,
                    reward=reward_name,
                    records=records_digest(records_by_bench[spec.name]),
                    **model_key,
                )
            if not args.quiet:
                print(
                    f"[{name}] {spec.name}: {len(records_by_bench[spec.name][: args.limit])} problems x n={args.n}",
                    file=sys.stderr,
                )
            generate_fn = scripted if lazy_model is None else lazy_model.generate_fn(sampling)

            result = evaluate(
                None,
                records_by_bench[spec.name],
                rewards[reward_name],
                sampling,
                tokenizer=tokenizer,
                generate_fn=generate_fn,
                ks=ks,
                maj_ks=maj_ks,
                maj_mode=args.maj_mode,
                limit=args.limit,
                cache_path=cache,
                keep_texts=args.keep_texts,
                progress=not args.quiet,
            )
            results[name][spec.name] = result.summary
            clip = result.summary.get("response/clip_ratio", 0.0)
            if clip >= CLIP_WARNING:
                print(
                    f"ebpo eval: warning: [{name}] {100 * clip:.1f}% of the responses on {spec.name} hit "
                    f"--max-new-tokens {sampling.max_new_tokens} and were cut (response/clip_ratio); a cut "
                    f"response rarely holds a final answer, so raise --max-new-tokens for reasoning models",
                    file=sys.stderr,
                )
        del lazy_model  # free this model before the next one loads
    markdown = write_outputs(Path(args.out_dir), results, benchmarks, settings)
    print(markdown)
    print(f"wrote {Path(args.out_dir) / 'results.md'}, results.csv, results.json", file=sys.stderr)
    return 0
