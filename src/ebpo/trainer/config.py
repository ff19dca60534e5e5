"""``ebpo train``'s configuration: ``TrainConfig``, six typed sections, every option declared once with its help.

``ebpo.settings`` reads it as it reads every command's options (``ebpo.trainer.config_files.load_config``
layers the defaults, a YAML file or shipped preset and ``key=value`` overrides): each value checked against its
field's type (a fixed choice is a ``Literal``) and bounds, each section's ``__post_init__`` checking how its
options combine and :class:`TrainConfig`'s how sections do, with one line naming the key and the fix. Names
found in registries (estimator, policy loss, sampler, task, reward, schema) and whether the estimator learns
from groups of one are checked at setup (``ebpo.trainer.setup``).

``algorithm.ebpo`` is ``ebpo.advantages.EBPOOptions`` (TRL's ``EBPOConfig``, verl's ``+algorithm.ebpo.<option>``)
and ``algorithm.loss`` is ``ebpo.losses.PolicyLossOptions``; their earlier spellings still read
(``config_files.RENAMED``).
The defaults are the built-in demo (EBPO on ``arith`` with the built-in base model, a few minutes on 2 CPU
cores); the presets scale the paper's settings down.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from ebpo import settings
from ebpo.advantages import EBPOOptions
from ebpo.data.prompts import ChatTemplateSetting
from ebpo.errors import ConfigError
from ebpo.losses import AggMode, KLEstimator, PolicyLossOptions
from ebpo.settings import option
from ebpo.trainer.estimator_options import combine_options

SEED_MAX = 2**32 - 1
"""The largest seed NumPy accepts (``np.random.seed`` takes [0, 2**32 - 1])."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass
class ModelConfig:
    """The policy to train (and the frozen reference for the KL term, a copy of its initial weights)."""

    path: str | None = option(
        "Directory (or hub id already in the local cache) of any Hugging Face causal LM + tokenizer, an ebpo "
        "train run or checkpoint directory, or a built-in base model shipped with the package: builtin:arith "
        "(S1) or builtin:gym (S2, the reasoning-gym Qwen3; train it with --config gym). Default null: "
        "builtin:arith.",
        default=None,
    )
    dtype: Literal["float32", "bfloat16"] = option(
        "Compute dtype: float32 | bfloat16 (mixed precision: bfloat16 forward passes, float32 weights and "
        "optimizer state; docs/training.md, Precision).",
        default="float32",
    )
    gradient_checkpointing: bool = option(
        "Recompute activations in the backward pass (saves memory on large models).",
        default=False,
    )


@dataclass
class DataConfig:
    """Where prompts come from and how they are grouped into batches."""

    task: str = option(
        "Built-in task suite (`ebpo.tasks`) that generates train/validation records: arith, or "
        "gym:<dataset>[,<dataset>...] (reasoning-gym's datasets, the ebpo[gym] extra; docs/data.md).",
        default="arith",
    )
    task_options: dict[str, Any] = option(
        "Settings of the task's generator; gym: per dataset, its reasoning-gym config fields and levels, e.g. "
        "{chain_sum: {max_terms: 3}, gcd: {levels: [1, 2]}} (docs/data.md); an unknown one lists the valid ones.",
        default_factory=dict,
    )
    train_file: str | None = option(
        "Optional training records (JSONL, Parquet, a save_to_disk directory or hf://owner/dataset, read by "
        "`ebpo.data.loaders` with data.schema); replaces the task's generated training set.",
        default=None,
    )
    val_file: str | None = option(
        "Optional validation records (same formats and schema); replaces the task's generated validation set.",
        default=None,
    )
    schema: str = option(
        "Column mapping of train_file / val_file (`ebpo.data.loaders`): records (our Record rows: id, prompt, "
        "answer, topic, difficulty, level) | shared (problem, answer) | math500 | aime24 | olympiadbench | "
        "dapo_math_17k.",
        default="records",
    )
    train_size: int = option(
        "Number of generated training problems (when no train_file).", default=2000, ge=1
    )
    val_size: int = option(
        "Number of generated validation problems (when no val_file); arith cycles through its 9 topics x 5 "
        "levels, so a multiple of 45 (of 9 x len(levels)) covers every cell equally.",
        default=450,
        ge=1,
    )
    levels: list[int] | None = option(
        "Only generate problems of these task levels (arith: 1..5) in the generated train and validation "
        "sets; null = all levels.",
        default=None,
    )
    topics: list[str] | None = option(
        "Only generate problems of these task topics (arith: mod, sequence, area, count, max, dot, word, "
        "units, power); null = all.",
        default=None,
    )
    reward: str | None = option(
        "Reward function name (`ebpo.rewards`); default null = the task's own reward (arith -> arith).",
        default=None,
    )
    sampler: str = option(
        "Prompt sampler (`ebpo.data.samplers`): random (the paper's EBPO-naive) | topic (topic-coherent "
        "batches, EBPO-topic) | difficulty (easy-to-hard curriculum, EBPO-diff).",
        default="random",
    )
    batch_size: int = option(
        "Prompts per training step (the paper: 512; scaled to 32 for the tiny model).", default=32, ge=1
    )
    group_size: int = option("Responses sampled per prompt, G (the paper: 4).", default=8, ge=1)
    cluster_key: Literal["none", "topic", "difficulty"] = option(
        "Cluster key handed to the advantage estimator: none | topic (record.topic) | difficulty "
        "(record.difficulty bucketed, or record.level when difficulty is missing). Used by "
        "`algorithm.ebpo.prior_scope: cluster`.",
        default="none",
    )
    difficulty_source: Literal["record", "level"] = option(
        "Where a record's difficulty (pass rate) comes from: record (its `difficulty` field, from `ebpo "
        "annotate difficulty`) | level (a proxy from the generator's level L of Lmax: (Lmax - L + 0.5) / Lmax, "
        "easy = high). Used by sampler=difficulty and cluster_key=difficulty.",
        default="record",
    )
    difficulty_buckets: int = option(
        "Number of equal-width pass-rate buckets on [0, 1] when cluster_key=difficulty.", default=5, ge=1
    )
    chat_template: ChatTemplateSetting = option(
        "Render prompts with the tokenizer's chat template: auto (when the tokenizer has one, as `ebpo eval`) | "
        "on | off (the raw prompt). Training and validation read the same prompt ids as `ebpo eval` "
        "(`ebpo.data.prompts`).",
        default="auto",
    )


@dataclass
class RolloutConfig:
    """How responses are sampled (`ebpo.generation.sample`, KV cache, stops at EOS)."""

    temperature: float = option(
        "Sampling temperature (also used for the training log-probabilities).",
        default=1.0,
        gt=0,
        note="use a small value like 0.01",
    )
    top_p: float = option("Nucleus sampling threshold in (0, 1]; 1.0 = off.", default=1.0, gt=0, le=1)
    max_new_tokens: int = option("Longest response in tokens; longer ones are truncated.", default=24, ge=1)
    old_logp: Literal["recompute", "sampler"] = option(
        "Where the PPO ratio's old log-probs (and actor/entropy) come from: sampler (the log-probs the sampler "
        "drew with, no extra pass) | recompute (verl's recompute_log_prob: a forward pass over the step's "
        "tokens). They differ by float rounding, so their runs are not bit-identical (docs/training.md, Speed).",
        default="sampler",
    )


@dataclass
class AlgorithmConfig:
    """Advantage estimator, policy loss and reward shaping (docs/design.md §1-§3)."""

    estimator: str = option(
        "Advantage estimator (`ebpo.advantages`): ebpo | grpo | dr_grpo | rloo | reinforce_pp_baseline | jspo, "
        "or the name of one registered with `ebpo.register_estimator`.",
        default="ebpo",
    )
    estimator_options: dict[str, Any] = option(
        "Keyword options of an estimator other than ebpo, e.g. {norm_by_std: false} for grpo (grpo: "
        "norm_by_std, eps; jspo: eps; a registered estimator: its own); an unknown name is rejected with the "
        "list of valid ones. EBPO's options are algorithm.ebpo.<option> (below); with algorithm.estimator=ebpo, "
        "algorithm.estimator_options.<option> is read as algorithm.ebpo.<option>.",
        default_factory=dict,
    )
    ebpo: EBPOOptions = option(
        "EBPO's options (`ebpo.advantages.EBPOOptions`, docs/design.md §2), read with algorithm.estimator=ebpo.",
        default_factory=EBPOOptions,
    )
    policy_loss: str = option(
        "Policy loss (`ebpo.losses`): vanilla (PPO clip) | clip_cov | kl_cov (EntropyMech); its options are "
        "algorithm.loss.<option> (below; algorithm.loss_options.<option> is read as algorithm.loss.<option>).",
        default="vanilla",
    )
    loss_agg_mode: AggMode = option(
        "Loss aggregation: token-mean (DAPO) | seq-mean-token-mean (GRPO) | seq-mean-token-sum | "
        "seq-mean-token-sum-norm (Dr. GRPO).",
        default="token-mean",
    )
    loss: PolicyLossOptions = option(
        "The policy loss's options (`ebpo.losses.PolicyLossOptions`).", default_factory=PolicyLossOptions
    )
    kl_coef: float = option(
        "Coefficient of the KL penalty to the frozen initial policy (the paper: 0.001; 0 disables it and "
        "skips the reference model).",
        default=0.001,
        ge=0,
    )
    kl_estimator: KLEstimator = option(
        "KL estimator for the penalty: k1 | k2 | k3 (docs/design.md §3).", default="k3"
    )
    dynamic_sampling: bool = option(
        "DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts until the "
        "batch is full (`ebpo.data.dynamic`).",
        default=False,
    )
    max_gen_rounds: int = option(
        "Extra generation rounds allowed per step by dynamic sampling.", default=3, ge=0
    )
    overlong_shaping: bool = option(
        "DAPO soft overlong punishment added to the reward (max length = rollout.max_new_tokens).",
        default=False,
    )
    overlong_cache_len: int = option(
        "DAPO's L_cache: the soft-penalty window before the max length.", default=4
    )
    skip_reward_errors: bool = option(
        "If a reward function raises on a sample: false (default) = stop with a checkpoint and report the "
        "sample; true = mask the sample out of the loss and count it in reward/errors.",
        default=False,
    )

    def __post_init__(self) -> None:
        self.ebpo, self.estimator_options = combine_options(self.estimator, self.ebpo, self.estimator_options)

    def estimator_kwargs(self) -> dict[str, Any]:
        """The keyword options ``ebpo.get_estimator(self.estimator, **options)`` takes: EBPO's section for
        ``ebpo``, ``estimator_options`` for any other."""
        return dataclasses.asdict(self.ebpo) if self.estimator == "ebpo" else dict(self.estimator_options)


@dataclass
class OptimConfig:
    """AdamW and the PPO-style update schedule."""

    lr: float = option(
        "AdamW learning rate (the paper: 1e-6 on 7-8B models). Default 1e-4, the rate docs/results/defaults "
        "chose for the built-in base model.",
        default=1e-4,
        gt=0,
    )
    weight_decay: float = option("AdamW weight decay.", default=0.0, ge=0)
    betas: list[float] = option("AdamW betas.", default_factory=lambda: [0.9, 0.999])
    eps: float = option("AdamW epsilon.", default=1e-8, gt=0, note="AdamW divides by sqrt(v) + eps")
    warmup_steps: int = option(
        "Linear learning-rate warm-up over this many steps (0 = constant lr).",
        default=0,
        ge=0,
        note="0 = constant lr",
    )
    epochs: int = option("K: passes over each step's rollouts (PPO epochs).", default=1, ge=1)
    mini_batch_size: int = option(
        "Prompts per optimizer update (verl's ppo_mini_batch_size); batch_size / mini_batch_size updates "
        "per epoch. The paper: 128 of 512.",
        default=4,
        ge=1,
    )
    micro_batch_size: int | None = option(
        "Sequences per forward/backward pass inside a mini-batch (gradient accumulation, for memory): the "
        "vanilla loss's gradient equals the whole mini-batch's; clip_cov and kl_cov pick their tokens within "
        "each part, so with them it changes the loss. Default null = the whole mini-batch at once.",
        default=None,
        ge=1,
    )
    grad_clip: float = option(
        "Clip the global gradient norm to this value (0 = no clipping).", default=1.0, ge=0, note="0 = off"
    )
    shared_prompts: bool | None = option(
        "Run each distinct prompt once per forward pass, its responses on the prompt's cached keys and values "
        "(the same math, summed in another order: docs/training.md, Speed). Needs sdpa or eager attention and "
        "the KV cache. null = on where the model allows it (said at start); true = required; false = every "
        "row runs its own copy of the prompt.",
        default=None,
        note="or null: on where the model allows it",
    )

    def __post_init__(self) -> None:
        _require(
            len(self.betas) == 2 and all(0 <= beta < 1 for beta in self.betas),
            f"optim.betas must be two numbers in [0, 1) like [0.9, 0.999], got {self.betas}",
        )


@dataclass
class RunConfig:
    """Length of the run, evaluation, checkpoints, reproducibility."""

    steps: int = option("Training steps (one batch of prompts each).", default=150, ge=1)
    eval_every: int = option(
        "Validate every N steps (and at step 0 and at the end); 0 = only before/after.",
        default=50,
        ge=0,
        note="0 = off",
    )
    eval_n: int = option(
        "Samples per validation problem; pass@1 is averaged over them (the paper: 32).", default=8, ge=1
    )
    eval_k: int = option(
        "maj@k used for best-checkpoint selection (the paper: 16); k <= eval_n.", default=8, ge=1
    )
    eval_temperature: float = option("Sampling temperature for validation.", default=1.0, gt=0)
    save_every: int = option(
        "Write a checkpoint every N steps (and at the end); 0 = only at the end.",
        default=50,
        ge=0,
        note="0 = off",
    )
    out_dir: str = option(
        "Parent directory of run directories; a run writes to <out_dir>/<timestamp>-<method>.", default="runs"
    )
    name: str | None = option("Run directory name (default <timestamp>-<method>).", default=None)
    seed: int = option(
        "Seed for Python, NumPy, torch and the sampling generator, in [0, 2**32 - 1].",
        default=0,
        ge=0,
        le=SEED_MAX,
    )
    device: str = option("auto (cuda if available) | cpu | cuda | cuda:N.", default="auto")
    threads: int | None = option(
        "torch CPU threads, set before the base model is built (null = torch's choice). Default 1, for the "
        "small built-in model; raise it for larger models.",
        default=1,
        ge=1,
        note="or null for torch's choice",
    )
    step_kl: Literal["all", "subset", "none"] = option(
        "Tokens of actor/step_kl, KL(pi_t || pi_t+1), a forward pass after the updates: subset (every U-th "
        "row, U = updates per step) | all | none (not computed). Training is the same under all three.",
        default="subset",
    )
    plugins: list[str] = option(
        "Your own code to import before the config is checked: .py files or importable modules that register "
        "estimators, policy losses, rewards, tasks, samplers or schemas (`ebpo.plugins`; `ebpo train --plugins` "
        "adds to it). A run saves them with absolute paths, so --resume loads them again.",
        default_factory=list,
    )
    progress: bool = option("Show a tqdm progress bar.", default=True)
    plot: bool = option("Write training.png into the run directory at the end.", default=True)
    report_to: list[str] = option(
        "Experiment trackers that get every metric of metrics.jsonl, the config, the summary and training.png "
        "(TRL's report_to, verl's trainer.logger): tensorboard (in the run directory) | wandb (pip install "
        "'ebpo[wandb]'; WANDB_MODE, WANDB_PROJECT, ... apply) | mlflow (pip install 'ebpo[mlflow]'; "
        "MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME apply); [] for none. --resume continues each tracker's "
        "run (docs/training.md, Trackers).",
        default_factory=lambda: ["tensorboard"],
    )
    resume_overrides: Literal["refuse", "allow"] = option(
        "On --resume, a setting other than the checkpoint's (any key but run.steps, the validation and save "
        "cadence, trackers and output: docs/training.md, Resuming with other settings): refuse (one line "
        "naming each key, saved and requested) | allow (continue the checkpoint's state under the new "
        "settings; each change and its step go to the run's config_history.jsonl). Holds for one resume: the "
        "run's config.yaml saves refuse.",
        default="refuse",
    )

    def __post_init__(self) -> None:
        _require(
            self.eval_k <= self.eval_n,
            f"run.eval_k ({self.eval_k}) must be <= run.eval_n ({self.eval_n}); raise run.eval_n or lower "
            "run.eval_k",
        )
        device = self.device
        _require(
            device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit()),
            f"run.device must be auto | cpu | cuda | cuda:N, got {device!r}",
        )


@dataclass
class TrainConfig:
    """Everything `ebpo train` needs, in six sections."""

    model: ModelConfig = option("The policy model.", default_factory=ModelConfig)
    data: DataConfig = option("Prompts, sampler, batch and group size.", default_factory=DataConfig)
    rollout: RolloutConfig = option("Sampling of responses.", default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = option("Estimator, loss, shaping.", default_factory=AlgorithmConfig)
    optim: OptimConfig = option("Optimizer and update schedule.", default_factory=OptimConfig)
    run: RunConfig = option("Steps, evaluation, checkpoints, seed, device.", default_factory=RunConfig)

    def __post_init__(self) -> None:
        """The rules that join two sections."""
        d, a, o = self.data, self.algorithm, self.optim
        _require(
            d.batch_size % o.mini_batch_size == 0,
            f"data.batch_size ({d.batch_size}) must be a multiple of optim.mini_batch_size "
            f"({o.mini_batch_size}); e.g. set optim.mini_batch_size={largest_divisor(d.batch_size, o.mini_batch_size)}",
        )
        if o.micro_batch_size is not None:
            per_mini = o.mini_batch_size * d.group_size
            _require(
                per_mini % o.micro_batch_size == 0,
                f"optim.micro_batch_size ({o.micro_batch_size}) must divide the sequences per mini-batch "
                f"({o.mini_batch_size} prompts x G={d.group_size} = {per_mini}), or be null",
            )
        _require(
            not (o.shared_prompts is True and self.model.gradient_checkpointing),
            "optim.shared_prompts=true needs the KV cache, which model.gradient_checkpointing=true turns off; "
            "set one of them to false",
        )
        if a.overlong_shaping:
            _require(
                0 < a.overlong_cache_len < self.rollout.max_new_tokens,
                f"algorithm.overlong_cache_len ({a.overlong_cache_len}) must be in (0, rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens})",
            )
        if a.estimator == "ebpo" and a.ebpo.prior_scope == "cluster":
            _require(
                d.cluster_key != "none",
                "algorithm.ebpo.prior_scope=cluster needs cluster keys: set data.cluster_key=topic or "
                "data.cluster_key=difficulty",
            )

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
        """Check every value and combination again (fields may have been set by hand since); raise
        :class:`ConfigError` whose message says the fix."""
        return settings.check(self)


def largest_divisor(n: int, at_most: int) -> int:
    """The largest k <= ``at_most`` that divides ``n`` (e.g. a mini-batch size that divides the batch)."""
    return max(k for k in range(1, min(n, at_most) + 1) if n % k == 0)


def describe() -> list[tuple[str, str, str]]:
    """(dotted key, default, help) of every option, for ``ebpo train --help-config``."""
    return settings.describe(TrainConfig)
