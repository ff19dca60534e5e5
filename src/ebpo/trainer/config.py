"""Training configuration: typed nested dataclasses, YAML files, dotted ``key=value`` overrides.

``load_config(path, overrides)`` builds a :class:`TrainConfig` from the defaults, then a YAML file (any
subset of the keys), then command-line overrides such as ``algorithm.estimator=grpo
rollout.temperature=0.8``. Values are parsed as YAML scalars (``0.8``, ``true``, ``null``, ``[1, 2]``)
and checked against the field's type. An unknown key names the valid keys of its section;
:meth:`TrainConfig.validate` rejects bad values and combinations with a message that says the fix.

Every field carries its help text in ``metadata["help"]`` (``ebpo train --help-config`` prints them).
The defaults are the built-in demo: EBPO on the ``arith`` task with the built-in base model, sized to
finish in a few minutes on 2 CPU cores. The paper's settings (Appendix A: lr 1e-6, KL 0.001, global batch
512 prompts, mini-batch 128, G = 4) are scaled down in the presets, ``src/ebpo/configs/*.yaml``, shipped
with the package: ``load_config("grpo")`` (``ebpo train --config grpo``) finds one by name.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebpo.errors import ConfigError
from ebpo.persist import write_text_atomic


def _help(text: str, **kwargs: Any) -> Any:
    """A dataclass field whose help text lives in ``metadata["help"]``."""
    return field(metadata={"help": text}, **kwargs)


@dataclass
class ModelConfig:
    """The policy to train (and the frozen reference for the KL term, a copy of its initial weights)."""

    path: str | None = _help(
        "Directory (or hub id already in the local cache) of any Hugging Face causal LM + tokenizer. "
        "Default null: the built-in arith base model, shipped with the package (`ebpo base-model` prints its "
        "directory).",
        default=None,
    )
    dtype: str = _help(
        "Parameter dtype for training: float32 | bfloat16 | float16. Default float32.", default="float32"
    )
    gradient_checkpointing: bool = _help(
        "Recompute activations in the backward pass (saves memory on large models). Default false.",
        default=False,
    )


@dataclass
class DataConfig:
    """Where prompts come from and how they are grouped into batches."""

    task: str = _help(
        "Built-in task suite (`ebpo.tasks`) that generates train/validation records. Default arith.",
        default="arith",
    )
    train_file: str | None = _help(
        "Optional training records (JSONL, Parquet, a save_to_disk directory or hf://owner/dataset, read by "
        "`ebpo.data.loaders` with data.schema); replaces the task's generated training set.",
        default=None,
    )
    val_file: str | None = _help(
        "Optional validation records (same formats and schema); replaces the task's generated validation set.",
        default=None,
    )
    schema: str = _help(
        "Column mapping of train_file / val_file (`ebpo.data.loaders`): records (our Record rows: id, prompt, "
        "answer, topic, difficulty, level) | shared (problem, answer) | math500 | aime24 | olympiadbench | "
        "dapo_math_17k.",
        default="records",
    )
    train_size: int = _help("Number of generated training problems (when no train_file).", default=2000)
    val_size: int = _help(
        "Number of generated validation problems (when no val_file); arith cycles through its 9 topics x 5 "
        "levels, so a multiple of 45 (of 9 x len(levels)) covers every cell equally. Default 450 (45 cells x "
        "10): the standard error of the built-in model's validation pass@1 is about 0.015 there.",
        default=450,
    )
    levels: list[int] | None = _help(
        "Only generate problems of these task levels (arith: 1..5); null = all levels. Applies to the "
        "generated train and validation sets. Default null: the built-in base model has partial skill at "
        "every arith level (docs/base_model.md).",
        default=None,
    )
    topics: list[str] | None = _help(
        "Only generate problems of these task topics (arith: mod, sequence, area, count, max, dot, word, "
        "units, power); null = all.",
        default=None,
    )
    reward: str | None = _help(
        "Reward function name (`ebpo.rewards`); default null = the task's own reward (arith -> arith).",
        default=None,
    )
    sampler: str = _help(
        "Prompt sampler (`ebpo.data.samplers`): random (the paper's EBPO-naive) | topic (topic-coherent "
        "batches, EBPO-topic) | difficulty (easy-to-hard curriculum, EBPO-diff). Default random.",
        default="random",
    )
    batch_size: int = _help(
        "Prompts per training step (the paper: 512; scaled to 32 for the tiny model).", default=32
    )
    group_size: int = _help("Responses sampled per prompt, G (the paper: 4).", default=8)
    cluster_key: str = _help(
        "Cluster key handed to the advantage estimator: none | topic (record.topic) | difficulty "
        "(record.difficulty bucketed, or record.level when difficulty is missing). Used by "
        "`algorithm.estimator_options.prior_scope: cluster`. Default none.",
        default="none",
    )
    difficulty_source: str = _help(
        "Where a record's difficulty (pass rate) comes from: record (its `difficulty` field, from `ebpo "
        "annotate difficulty`) | level (a proxy from the generator's level L of Lmax: (Lmax - L + 0.5) / Lmax, "
        "easy = high). Used by sampler=difficulty and cluster_key=difficulty.",
        default="record",
    )
    difficulty_buckets: int = _help(
        "Number of equal-width pass-rate buckets on [0, 1] when cluster_key=difficulty.", default=5
    )


@dataclass
class RolloutConfig:
    """How responses are sampled (`ebpo.generation.sample`, KV cache, stops at EOS)."""

    temperature: float = _help(
        "Sampling temperature (also used for the training log-probabilities).", default=1.0
    )
    top_p: float = _help("Nucleus sampling threshold in (0, 1]; 1.0 = off.", default=1.0)
    max_new_tokens: int = _help("Longest response in tokens; longer ones are truncated.", default=24)
    old_logp: str = _help(
        "Where the PPO ratio's old log-probs (and actor/entropy) come from: recompute (default; verl's "
        "recompute_log_prob: a forward pass of the sampling policy over the step's tokens, so the first "
        "ratio is exactly 1; the step's first update supplies its own rows) | sampler (the log-probs the "
        "sampler drew with: no extra pass, about 15% less time per step on the built-in model; they differ "
        "from a full forward's by float rounding, about 1e-5, so runs are not bit-identical to recompute's).",
        default="recompute",
    )


@dataclass
class AlgorithmConfig:
    """Advantage estimator, policy loss and reward shaping (docs/design.md §1-§3)."""

    estimator: str = _help(
        "Advantage estimator (`ebpo.advantages`): ebpo | grpo | dr_grpo | rloo | reinforce_pp_baseline | jspo.",
        default="ebpo",
    )
    estimator_options: dict[str, Any] = _help(
        "Keyword options for the estimator, e.g. {prior_scope: cluster, prior_memory: 50} (docs/design.md §2); "
        "EBPO's are the fields of ebpo.advantages.EBPOOptions, listed below as algorithm.estimator_options.<name>. "
        "Unknown names are rejected with the list of valid ones.",
        default_factory=dict,
    )
    policy_loss: str = _help(
        "Policy loss (`ebpo.losses`): vanilla (PPO clip) | clip_cov | kl_cov (EntropyMech).",
        default="vanilla",
    )
    loss_agg_mode: str = _help(
        "Loss aggregation: token-mean (DAPO) | seq-mean-token-mean (GRPO) | seq-mean-token-sum | "
        "seq-mean-token-sum-norm (Dr. GRPO).",
        default="token-mean",
    )
    loss_options: dict[str, Any] = _help(
        "Further `ebpo.losses.PolicyLossConfig` fields by name: clip_eps_low (0.2), clip_eps_high (0.2; "
        "DAPO 0.28), dual_clip_c (3.0, null = off), clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio, "
        "kl_cov_coef, cov_count (verl | stochastic: ratio x N tokens in expectation). Unknown names are "
        "rejected with the list of valid ones.",
        default_factory=dict,
    )
    kl_coef: float = _help(
        "Coefficient of the KL penalty to the frozen initial policy (the paper: 0.001; 0 disables it and "
        "skips the reference model). Default 0.001, the paper's.",
        default=0.001,
    )
    kl_estimator: str = _help("KL estimator for the penalty: k1 | k2 | k3 (docs/design.md §3).", default="k3")
    dynamic_sampling: bool = _help(
        "DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts until the "
        "batch is full (`ebpo.data.dynamic`).",
        default=False,
    )
    max_gen_rounds: int = _help("Extra generation rounds allowed per step by dynamic sampling.", default=3)
    overlong_shaping: bool = _help(
        "DAPO soft overlong punishment added to the reward (max length = rollout.max_new_tokens).",
        default=False,
    )
    overlong_cache_len: int = _help(
        "DAPO's L_cache: the soft-penalty window before the max length.", default=4
    )
    skip_reward_errors: bool = _help(
        "If a reward function raises on a sample: false (default) = stop with a checkpoint and report the "
        "sample; true = mask the sample out of the loss and count it in reward/errors.",
        default=False,
    )


@dataclass
class OptimConfig:
    """AdamW and the PPO-style update schedule."""

    lr: float = _help(
        "AdamW learning rate (the paper: 1e-6 on 7-8B models). Default 2e-4 for the small built-in base "
        "model with 32 prompts per step (docs/training.md).",
        default=2e-4,
    )
    weight_decay: float = _help("AdamW weight decay.", default=0.0)
    betas: list[float] = _help("AdamW betas.", default_factory=lambda: [0.9, 0.999])
    eps: float = _help("AdamW epsilon.", default=1e-8)
    warmup_steps: int = _help(
        "Linear learning-rate warm-up over this many steps (0 = constant lr).", default=0
    )
    epochs: int = _help("K: passes over each step's rollouts (PPO epochs).", default=1)
    mini_batch_size: int = _help(
        "Prompts per optimizer update (verl's ppo_mini_batch_size); batch_size / mini_batch_size updates "
        "per epoch. The paper: 128 of 512.",
        default=4,
    )
    micro_batch_size: int | None = _help(
        "Sequences per forward/backward pass inside a mini-batch (gradient accumulation, for memory). Each "
        "part's loss is weighted by its share of the mini-batch's tokens (token-mean) or sequences, so with "
        "the vanilla loss the gradient equals the whole mini-batch's; clip_cov and kl_cov pick their tokens "
        "within each part, so with them it changes the loss. Default null = the whole mini-batch at once.",
        default=None,
    )
    grad_clip: float = _help("Clip the global gradient norm to this value (0 = no clipping).", default=1.0)
    shared_prompts: bool = _help(
        "Forward passes of the updates, the old-log-prob recompute and actor/step_kl run each distinct "
        "prompt once, packed with the others with little padding, and its responses on that prompt's cached keys "
        "and values, as the sampler does (default false: every row runs its own copy of the prompt). The same math "
        "with fewer positions (docs/benchmarks.md measures the time), but the sums run in another order: "
        "log-probs differ from the default's by float rounding (about 1e-6), so runs are not bit-identical "
        "to the default's. Needs sdpa or eager attention, and not with model.gradient_checkpointing, which "
        "turns the cache off.",
        default=False,
    )


@dataclass
class RunConfig:
    """Length of the run, evaluation, checkpoints, reproducibility."""

    steps: int = _help("Training steps (one batch of prompts each).", default=150)
    eval_every: int = _help(
        "Validate every N steps (and at step 0 and at the end); 0 = only before/after.", default=50
    )
    eval_n: int = _help(
        "Samples per validation problem; pass@1 is averaged over them (the paper: 32).", default=8
    )
    eval_k: int = _help("maj@k used for best-checkpoint selection (the paper: 16); k <= eval_n.", default=8)
    eval_temperature: float = _help("Sampling temperature for validation.", default=1.0)
    save_every: int = _help(
        "Write a checkpoint every N steps (and at the end); 0 = only at the end.", default=50
    )
    out_dir: str = _help(
        "Parent directory of run directories; a run writes to <out_dir>/<timestamp>-<method>.", default="runs"
    )
    name: str | None = _help("Run directory name (default <timestamp>-<method>).", default=None)
    seed: int = _help(
        "Seed for Python, NumPy, torch and the sampling generator, in [0, 2**32 - 1].", default=0
    )
    device: str = _help("auto (cuda if available) | cpu | cuda | cuda:N.", default="auto")
    threads: int | None = _help(
        "torch CPU threads, set before the base model is built (null = torch's choice). Default 1: the "
        "small built-in model gains little from intra-op threads, and on a busy machine they "
        "spin-wait (measured 3x slower with 2 threads on a loaded 2-core box). Raise it for larger models.",
        default=1,
    )
    step_kl: str = _help(
        "Tokens of actor/step_kl, KL(pi_t || pi_t+1), a forward pass after the updates: all (default; "
        "every token of the step) | subset (every U-th row of the step, U = batch_size / mini_batch_size "
        "updates: an estimate from a mini-batch's worth of rows, at that share of the pass's cost) | none "
        "(not computed or logged). Training is the same under all three, to the bit.",
        default="all",
    )
    progress: bool = _help("Show a tqdm progress bar.", default=True)
    plot: bool = _help("Write training.png into the run directory at the end.", default=True)


@dataclass
class TrainConfig:
    """Everything `ebpo train` needs, in six sections."""

    model: ModelConfig = _help("The policy model.", default_factory=ModelConfig)
    data: DataConfig = _help("Prompts, sampler, batch and group size.", default_factory=DataConfig)
    rollout: RolloutConfig = _help("Sampling of responses.", default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = _help("Estimator, loss, shaping.", default_factory=AlgorithmConfig)
    optim: OptimConfig = _help("Optimizer and update schedule.", default_factory=OptimConfig)
    run: RunConfig = _help("Steps, evaluation, checkpoints, seed, device.", default_factory=RunConfig)

    @property
    def method(self) -> str:
        """Short name for the run directory: the estimator, plus the loss when it is not vanilla."""
        name = self.algorithm.estimator
        if self.algorithm.policy_loss != "vanilla":
            name += "-" + self.algorithm.policy_loss
        return name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> TrainConfig:
        """Check values and combinations; raise :class:`ConfigError` whose message says the fix."""
        _validate(self)
        return self


# ---------------------------------------------------------------------------------------------------
# validation


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _choices(kind: str, key: str, value: str, valid: Iterable[str]) -> None:
    names = sorted(valid)
    _check(value in names, f"unknown {kind} {value!r} for {key}; valid choices: {', '.join(names)}")


CLUSTER_KEYS = ["none", "topic", "difficulty"]
OLD_LOGP_SOURCES = ["recompute", "sampler"]
STEP_KL_SCOPES = ["all", "subset", "none"]
DTYPES = ["float32", "bfloat16", "float16"]
DIFFICULTY_SOURCES = ["record", "level"]
TRAINER_SET_LOSS_FIELDS = {"loss_agg_mode", "max_response_len", "generator"}
"""PolicyLossConfig fields the trainer fills itself (from algorithm.loss_agg_mode, rollout.max_new_tokens and
the run's seeded generator), so they are not accepted in algorithm.loss_options."""
SEED_MAX = 2**32 - 1
"""The largest seed NumPy accepts (``np.random.seed`` takes [0, 2**32 - 1])."""


def _validate(cfg: TrainConfig) -> None:
    # imported here, not at the top, so that `import ebpo.trainer` and `ebpo --help` do not pay for torch
    import ebpo.advantages as advantages
    import ebpo.losses as losses
    from ebpo import rewards, tasks
    from ebpo.data import loaders, samplers

    _check_every_field(cfg)
    d, r, a, o, run = cfg.data, cfg.rollout, cfg.algorithm, cfg.optim, cfg.run
    _choices("estimator", "algorithm.estimator", a.estimator, advantages.list_estimators())
    _choices("policy loss", "algorithm.policy_loss", a.policy_loss, losses.list_policy_losses())
    _choices("aggregation mode", "algorithm.loss_agg_mode", a.loss_agg_mode, losses.AGG_MODES)
    _choices("KL estimator", "algorithm.kl_estimator", a.kl_estimator, losses.KL_ESTIMATORS)
    _choices("sampler", "data.sampler", d.sampler, samplers.list_samplers())
    _choices("cluster key", "data.cluster_key", d.cluster_key, CLUSTER_KEYS)
    _choices("dtype", "model.dtype", cfg.model.dtype, DTYPES)
    _choices("difficulty source", "data.difficulty_source", d.difficulty_source, DIFFICULTY_SOURCES)
    _choices("old log-prob source", "rollout.old_logp", r.old_logp, OLD_LOGP_SOURCES)
    _choices("step KL scope", "run.step_kl", run.step_kl, STEP_KL_SCOPES)
    loss_fields = {f.name for f in dataclasses.fields(losses.PolicyLossConfig)} - TRAINER_SET_LOSS_FIELDS
    unknown = sorted(set(a.loss_options) - loss_fields)
    _check(
        not unknown,
        f"algorithm.loss_options has unknown field(s) {unknown}; valid PolicyLossConfig fields: "
        f"{', '.join(sorted(loss_fields))}",
    )
    try:  # each key against the estimator's options (EBPO: advantages.EBPOOptions), named in the message
        advantages.check_options(a.estimator, a.estimator_options, where="algorithm.estimator_options")
    except ValueError as err:
        raise ConfigError(str(err)) from err
    if d.reward is not None:
        _choices("reward", "data.reward", d.reward, rewards.list_rewards())
    if d.train_file is None:
        _choices("task", "data.task", d.task, tasks.list_tasks())
    for path_key, path in (("data.train_file", d.train_file), ("data.val_file", d.val_file)):
        _check(
            path is None or path.startswith("hf://") or Path(path).exists(),
            f"{path_key}: file not found: {path}",
        )
    _choices("schema", "data.schema", d.schema, loaders.list_schemas())
    positive = {
        "data.batch_size": d.batch_size,
        "data.group_size": d.group_size,
        "data.train_size": d.train_size,
        "data.val_size": d.val_size,
        "data.difficulty_buckets": d.difficulty_buckets,
        "rollout.max_new_tokens": r.max_new_tokens,
        "optim.epochs": o.epochs,
        "optim.mini_batch_size": o.mini_batch_size,
        "run.steps": run.steps,
        "run.eval_n": run.eval_n,
        "run.eval_k": run.eval_k,
    }
    for key, value in positive.items():
        _check(value >= 1, f"{key} must be >= 1, got {value}")
    _check(
        r.temperature > 0,
        f"rollout.temperature must be > 0, got {r.temperature} (use a small value like 0.01)",
    )
    _check(0 < r.top_p <= 1, f"rollout.top_p must be in (0, 1], got {r.top_p}")
    _check(run.eval_temperature > 0, f"run.eval_temperature must be > 0, got {run.eval_temperature}")
    _check(o.lr > 0, f"optim.lr must be > 0, got {o.lr}")
    _check(o.warmup_steps >= 0, f"optim.warmup_steps must be >= 0 (0 = constant lr), got {o.warmup_steps}")
    _check(o.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {o.weight_decay}")
    _check(
        len(o.betas) == 2 and all(0 <= beta < 1 for beta in o.betas),
        f"optim.betas must be two numbers in [0, 1) like [0.9, 0.999], got {o.betas}",
    )
    _check(o.eps > 0, f"optim.eps must be > 0 (AdamW divides by sqrt(v) + eps), got {o.eps}")
    _check(o.grad_clip >= 0, f"optim.grad_clip must be >= 0 (0 = off), got {o.grad_clip}")
    _check(a.kl_coef >= 0, f"algorithm.kl_coef must be >= 0, got {a.kl_coef}")
    _check(
        d.batch_size % o.mini_batch_size == 0,
        f"data.batch_size ({d.batch_size}) must be a multiple of optim.mini_batch_size ({o.mini_batch_size}); "
        f"e.g. set optim.mini_batch_size={largest_divisor(d.batch_size, o.mini_batch_size)}",
    )
    if o.micro_batch_size is not None:
        per_mini = o.mini_batch_size * d.group_size
        _check(
            o.micro_batch_size >= 1 and per_mini % o.micro_batch_size == 0,
            f"optim.micro_batch_size ({o.micro_batch_size}) must divide the sequences per mini-batch "
            f"({o.mini_batch_size} prompts x G={d.group_size} = {per_mini}), or be null",
        )
    _check(
        not (o.shared_prompts and cfg.model.gradient_checkpointing),
        "optim.shared_prompts=true needs the KV cache, which model.gradient_checkpointing=true turns off; "
        "set one of them to false",
    )
    _check(
        run.eval_k <= run.eval_n,
        f"run.eval_k ({run.eval_k}) must be <= run.eval_n ({run.eval_n}); raise run.eval_n or lower run.eval_k",
    )
    _check(
        run.eval_every >= 0 and run.save_every >= 0,
        "run.eval_every and run.save_every must be >= 0 (0 = off)",
    )
    _check(
        run.threads is None or run.threads >= 1,
        f"run.threads must be >= 1 (or null for torch's choice), got {run.threads}",
    )
    _check(0 <= run.seed <= SEED_MAX, f"run.seed must be in [0, {SEED_MAX}], got {run.seed}")
    if a.overlong_shaping:
        _check(
            0 < a.overlong_cache_len < r.max_new_tokens,
            f"algorithm.overlong_cache_len ({a.overlong_cache_len}) must be in (0, rollout.max_new_tokens="
            f"{r.max_new_tokens})",
        )
    _check(a.max_gen_rounds >= 0, f"algorithm.max_gen_rounds must be >= 0, got {a.max_gen_rounds}")
    if a.estimator_options.get("prior_scope") == "cluster":
        _check(
            d.cluster_key != "none",
            "algorithm.estimator_options.prior_scope=cluster needs cluster keys: set data.cluster_key=topic "
            "or data.cluster_key=difficulty",
        )
    if d.group_size == 1:
        _check_groups_of_one(a)
    _check(
        run.device == "auto" or run.device == "cpu" or run.device.startswith("cuda"),
        f"run.device must be auto | cpu | cuda | cuda:N, got {run.device!r}",
    )
    if run.device.startswith("cuda"):
        import torch

        _check(
            torch.cuda.is_available(),
            f"run.device={run.device} but no CUDA device is visible; use run.device=cpu",
        )


def _check_every_field(cfg: TrainConfig) -> None:
    """Rules that hold for every field of a type: numbers are finite (in lists and option dicts too), and a
    string is never empty (``model.path=`` would otherwise mean the current directory)."""
    for key, value, tp, f in _leaves(cfg):
        if value == "":
            optional = type(None) in typing.get_args(tp)
            fix = f", or {key}=null for the default" if optional else f" (default {_default(f)!r})"
            raise ConfigError(f"{key} is empty; set a value{fix}")
        if isinstance(value, list):
            items = [(f"{key}[{i}]", item) for i, item in enumerate(value)]
        elif isinstance(value, dict):
            items = [(f"{key}.{name}", item) for name, item in value.items()]
        else:
            items = [(key, value)]
        for where, item in items:
            _check(
                not isinstance(item, float) or math.isfinite(item),
                f"{where} must be a finite number, got {item}",
            )


def _check_groups_of_one(a: AlgorithmConfig) -> None:
    """With G = 1 a group-relative baseline (GRPO, Dr. GRPO, RLOO, REINFORCE++) is the sample's own reward, so
    every advantage is 0 and nothing trains. The estimator is probed on four groups of one with distinct
    rewards, so the rule follows the estimators' code, not a list of names kept here."""
    import torch

    from ebpo import advantages

    def zero_on_groups_of_one(name: str, options: dict[str, Any]) -> bool:
        adv_N = advantages.get_estimator(name, **options)(
            torch.tensor([0.0, 1.0, 0.25, 0.75]), torch.arange(4)
        )
        return bool(adv_N.abs().max() <= advantages.ZERO_ADV_TOL)

    if zero_on_groups_of_one(a.estimator, a.estimator_options):
        pooled = [name for name in advantages.list_estimators() if not zero_on_groups_of_one(name, {})]
        raise ConfigError(
            f"data.group_size=1 gives estimator {a.estimator!r} all-zero advantages (each group's baseline is "
            f"its own reward), so nothing would train; set data.group_size >= 2, or use an estimator whose "
            f"baseline pools groups: algorithm.estimator={' | '.join(pooled)}"
        )


def largest_divisor(n: int, at_most: int) -> int:
    """The largest k <= ``at_most`` that divides ``n`` (e.g. a mini-batch size that divides the batch)."""
    return max(k for k in range(1, min(n, at_most) + 1) if n % k == 0)


# ---------------------------------------------------------------------------------------------------
# construction from dicts, YAML and key=value overrides


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any, dataclasses.Field]]:
    """(dotted key, value, annotation, field) of every leaf field of a config dataclass instance."""
    hints = _field_types(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if _is_dataclass_type(hints[f.name]):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value, hints[f.name], f


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (ints widen to floats); raise ConfigError otherwise."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(f"{key} must be a mapping like {{name: value}}, got {value!r}")
    if origin is list:
        if isinstance(value, (list, tuple)):
            (item_tp,) = typing.get_args(tp)
            return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        raise ConfigError(f"{key} must be a list like [a, b], got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - all fields are covered above


def _apply(obj: Any, values: dict[str, Any], prefix: str) -> None:
    """Set the fields of dataclass instance ``obj`` from nested ``values``, checking keys and types."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'the config'} must be a mapping of keys, got {values!r}")
    hints = _field_types(type(obj))
    for key, value in values.items():
        full = f"{prefix}{key}"
        if key not in hints:
            valid = ", ".join(f"{prefix}{name}" for name in hints)
            raise ConfigError(f"unknown config key {full!r}; valid keys: {valid}")
        tp = hints[key]
        if _is_dataclass_type(tp):
            _apply(getattr(obj, key), value, f"{full}.")
        else:
            setattr(obj, key, _coerce(value, tp, full))


def from_dict(values: dict[str, Any]) -> TrainConfig:
    """Build a config from a nested dict (the YAML layout); unknown keys raise ConfigError."""
    cfg = TrainConfig()
    _apply(cfg, values or {}, "")
    return cfg


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"a.b=0.8"`` -> (["a", "b"], 0.8); the value is parsed as a YAML scalar/flow value."""
    import yaml

    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value (e.g. algorithm.estimator=grpo)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key part (e.g. algorithm.estimator=grpo)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Merge ``key=value`` overrides into a nested dict. Keys inside a dict field (``estimator_options``)
    nest; everything else is checked when the dict is applied to the dataclasses."""
    for item in overrides:
        path, value = parse_override(item)
        node = values
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value
    return values


def merge_dicts(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, recursively where both hold a dict at the same key (neither is changed)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_dicts(out[key], value)
        else:
            out[key] = value
    return out


def _unique_key_loader():
    """A ``yaml.SafeLoader`` subclass that rejects a mapping holding the same key twice (PyYAML keeps the
    last one silently, so a preset that sets ``optim.lr`` twice would train with whichever came second)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in one mapping (lines {first_line[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); keep one",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line
        return loader.construct_mapping(node)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return UniqueKeyLoader


def parse_yaml(text: str) -> Any:
    """``text`` parsed as YAML with the safe loader, a key repeated within one mapping being an error
    (``yaml.YAMLError``)."""
    import yaml

    return yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file ``path``; a missing file, invalid YAML, a repeated key or a top level
    that is not a mapping raise ``ConfigError`` naming the file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        values = parse_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from err
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model, data, ...)")
    return values


PRESETS_DIR = Path(__file__).resolve().parents[1] / "configs"


def list_presets() -> list[str]:
    """Names of the presets shipped with the package (``src/ebpo/configs/<name>.yaml``), sorted."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def resolve_config(name_or_path: str | Path) -> Path:
    """The YAML file of ``--config``: an existing file as given, else the shipped preset of that name
    (``grpo`` or ``grpo.yaml``); neither raises ``ConfigError`` listing the presets."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    text = str(name_or_path)
    stem = text[: -len(".yaml")] if text.endswith(".yaml") else text
    if "/" not in stem and (PRESETS_DIR / f"{stem}.yaml").is_file():
        return PRESETS_DIR / f"{stem}.yaml"
    raise ConfigError(
        f"--config {text}: no such file and no preset of that name; presets: {', '.join(list_presets())}"
    )


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    validate: bool = True,
    base: dict[str, Any] | None = None,
) -> TrainConfig:
    """Defaults <- ``base`` dict <- YAML file ``path`` (a file, or a preset name: :func:`resolve_config`) <-
    ``overrides``; validated unless ``validate=False``."""
    values: dict[str, Any] = dict(base or {})
    if path is not None:
        path = resolve_config(path)
        values = merge_dicts(values, read_yaml(path))
    values = apply_overrides(values, list(overrides or []))
    try:
        cfg = from_dict(values)
    except ConfigError as err:
        where = f" (in {path})" if path is not None else ""
        raise ConfigError(f"{err}{where}") from err
    return cfg.validate() if validate else cfg


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write ``cfg`` as YAML, atomically (a kill leaves the old file or the new one, never half of one)."""
    import yaml

    write_text_atomic(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def describe() -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every leaf field, for ``ebpo train --help-config``; EBPO's options
    (``ebpo.advantages.EBPOOptions``) follow ``algorithm.estimator_options``."""
    from ebpo.advantages import EBPOOptions

    rows = []
    for key, default, _, f in _leaves(TrainConfig()):
        rows.append((key, repr(default), f.metadata.get("help", "")))
        if key == "algorithm.estimator_options":
            rows += [
                (f"{key}.{option.name}", repr(option.default), f"(estimator ebpo) {option.metadata['help']}")
                for option in dataclasses.fields(EBPOOptions)
            ]
    return rows
