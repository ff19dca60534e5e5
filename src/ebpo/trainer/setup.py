"""What a run is built from: prompts (records, sampler, reward), policy (model, reference, tokenizer), algorithm
(estimator, policy loss), optimizer.

Everything here fails before training, with one line naming the file, record or key and the fix;
:func:`check_setup` first, before a run directory is claimed or a model loaded: what a config cannot check
alone (the names it gives in their registries, the estimator's options and its groups of one, data files,
the CUDA device).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from ebpo.advantages import ZERO_ADV_TOL, AdvantageEstimator, check_options, get_estimator, list_estimators
from ebpo.data.loaders import get_schema, load_records
from ebpo.data.prompts import PromptFormat
from ebpo.data.records import Record
from ebpo.data.samplers import cluster_key, get_sampler, list_samplers
from ebpo.errors import first_line
from ebpo.generation import in_kernel_gqa
from ebpo.logprobs import SHARED_PROMPT_ATTENTION, attention_of, check_shared_prompt_attention
from ebpo.losses import PolicyLossConfig, get_policy_loss
from ebpo.models.names import builtin_hint, builtin_recipe, resolve_model
from ebpo.registry import unknown_choice
from ebpo.rewards import get_reward, list_rewards
from ebpo.tasks import get_task
from ebpo.trackers import check_trackers
from ebpo.trainer.config import ConfigError, OptimConfig, TrainConfig

logger = logging.getLogger(__name__)


class Prompts(NamedTuple):
    """The records a run trains and validates on, how training prompts are drawn, and how responses score."""

    train_records: list[Record]
    val_records: list[Record]
    sampler: Any
    """``ebpo.data.samplers``: ``next_batch() -> list[int]`` (indices into ``train_records``), state_dict."""
    reward_fn: Any
    """``ebpo.rewards``: ``fn(completion, answer)``, ``fn.batch(...)``, optional ``extract`` and ``metrics``."""
    cluster_of: list[Hashable] | None
    """The cluster key of each training record, by position (record ids need not be unique); None unless
    ``data.cluster_key`` is set."""


class Policy(NamedTuple):
    """The model being trained, the frozen reference for the KL term (None without it), their tokenizer and how
    prompts become its input."""

    model: Any
    ref_model: Any | None
    tokenizer: Any
    base_path: Path
    """The initial weights: ``model.path``, or the built-in base model."""
    pad_id: int
    shared_prompts: bool
    """Whether the log-prob passes run each distinct prompt once (``optim.shared_prompts``, null resolved
    against the loaded model)."""
    prompt_format: PromptFormat
    """Raw prompts or the tokenizer's chat template (``data.chat_template`` resolved against the tokenizer)."""


class Algorithm(NamedTuple):
    """How a step's rewards become a loss: the advantage estimator, the policy loss and the loss's settings."""

    estimator: AdvantageEstimator
    policy_loss: Any
    """``ebpo.losses``: ``(logp, old_logp, adv, mask, loss_cfg) -> (loss, metrics)``."""
    loss_cfg: PolicyLossConfig


def check_setup(cfg: TrainConfig) -> None:
    """What ``cfg`` cannot check alone, each a ``ConfigError`` naming the key: the names it gives are in their
    registries (an unknown one lists the valid ones), the estimator takes its options and, at G = 1, learns
    (:func:`check_groups_of_one`), the data files exist, the trackers' packages are installed and a CUDA
    device asked for is visible."""
    d, a = cfg.data, cfg.algorithm
    look_ups: list[tuple[str, Callable[[str], Any], str | None]] = [
        ("algorithm.estimator", _estimator_class, a.estimator),
        ("algorithm.policy_loss", get_policy_loss, a.policy_loss),
        ("data.sampler", _sampler_name, d.sampler),
        ("data.schema", get_schema, d.schema),
        (
            "data.task",
            lambda name: get_task(name, **d.task_options),
            d.task if d.train_file is None or d.val_file is None or d.reward is None else None,
        ),
        ("data.reward", _reward_name, d.reward),
    ]
    for key, get, name in look_ups:
        try:
            if name is not None:
                get(name)
        except ValueError as err:
            raise ConfigError(f"{key}: {err}") from None
    options = a.estimator_kwargs()
    try:  # each key against the estimator's options, named in the message
        where = "algorithm.ebpo" if a.estimator == "ebpo" else "algorithm.estimator_options"
        check_options(a.estimator, options, where=where)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if d.group_size == 1:
        check_groups_of_one(a.estimator, options)
    try:  # a built-in model's name (the directory itself is looked for when the model loads)
        builtin_recipe(cfg.model.path)
    except ConfigError as err:
        raise ConfigError(f"model.path: {err}") from None
    for key, path in (("data.train_file", d.train_file), ("data.val_file", d.val_file)):
        if path is not None and not path.startswith("hf://") and not Path(path).exists():
            raise ConfigError(f"{key}: file not found: {path}")
    try:  # each name a tracker, its package installed (a missing one names its extra)
        check_trackers(cfg.run.report_to)
    except ConfigError as err:
        raise ConfigError(f"run.report_to: {err}") from None
    resolve_device(cfg.run.device)


def _estimator_class(name: str) -> None:
    if name not in list_estimators():
        raise unknown_choice("advantage estimator", name, list_estimators(), extensible=True)


def _sampler_name(name: str) -> None:
    if name not in list_samplers():  # get_sampler builds one, from records
        raise unknown_choice("prompt sampler", name, list_samplers(), extensible=True)


def _reward_name(name: str) -> None:
    if name not in list_rewards():  # get_reward builds one (math: a worker pool)
        raise unknown_choice("reward", name, list_rewards(), extensible=True)


def check_groups_of_one(name: str, options: dict[str, Any]) -> None:
    """With G = 1 a group-relative baseline (GRPO, Dr. GRPO, RLOO, REINFORCE++) is the sample's own reward, so
    every advantage is 0 and nothing trains: ``ConfigError`` for such an estimator. Fresh estimators are probed
    on four groups of one with distinct rewards, so the rule follows the estimators' code, not a list of names
    kept here."""

    def zero_on_groups_of_one(name: str, options: dict[str, Any]) -> bool:
        adv_N = get_estimator(name, **options)(torch.tensor([0.0, 1.0, 0.25, 0.75]), torch.arange(4))
        return bool(adv_N.abs().max() <= ZERO_ADV_TOL)

    if zero_on_groups_of_one(name, options):
        pooled = [other for other in list_estimators() if not zero_on_groups_of_one(other, {})]
        raise ConfigError(
            f"data.group_size=1 gives estimator {name!r} all-zero advantages (each group's baseline is "
            f"its own reward), so nothing would train; set data.group_size >= 2, or use an estimator whose "
            f"baseline pools groups: algorithm.estimator={' | '.join(pooled)}"
        )


def resolve_device(name: str) -> torch.device:
    """``run.device`` as a torch device (``auto``: CUDA when one is visible); CUDA asked for and not visible
    is a ``ConfigError``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"run.device={name} but no CUDA device is visible; use run.device=cpu")
    return torch.device(name)


def load_prompts(cfg: TrainConfig) -> Prompts:
    """Records from ``data.train_file`` / ``data.val_file`` or generated by ``data.task``; the sampler; the reward."""
    d = cfg.data
    task = (
        get_task(d.task, **d.task_options)
        if d.train_file is None or d.val_file is None or d.reward is None
        else None
    )
    subset = {key: value for key, value in (("levels", d.levels), ("topics", d.topics)) if value is not None}
    if d.train_file is not None:
        train_records = load_records(d.train_file, d.schema)
    else:
        assert task is not None  # loaded above: no train_file
        train_records = list(task.generate("train", d.train_size, cfg.run.seed, **subset))
    if d.val_file is not None:
        val_records = load_records(d.val_file, d.schema)
    else:
        assert task is not None  # loaded above: no val_file
        val_records = list(task.generate("validation", d.val_size, cfg.run.seed, **subset))
    for split, records, source in (
        ("training", train_records, d.train_file or f"task {d.task!r}"),
        ("validation", val_records, d.val_file or f"task {d.task!r}"),
    ):
        if not records:
            raise ConfigError(
                f"the {split} set from {source} is empty; give a file with records or raise the size"
            )
    if len(train_records) < d.batch_size:
        raise ConfigError(
            f"the training set has {len(train_records)} records, fewer than data.batch_size={d.batch_size}; "
            "lower data.batch_size or add records"
        )
    if d.difficulty_source == "level":
        max_level = max((r.level or 0) for r in train_records + val_records)
        for record in train_records + val_records:
            if record.level is None:
                raise ConfigError(f"data.difficulty_source=level but record {record.id!r} has no level")
            record.difficulty = (max_level - record.level + 0.5) / max_level
    cluster_of = None
    if d.cluster_key != "none":
        cluster_of = [
            cluster_key(r, by=d.cluster_key, num_buckets=d.difficulty_buckets) for r in train_records
        ]
    return Prompts(
        train_records=train_records,
        val_records=val_records,
        sampler=get_sampler(d.sampler, train_records, d.batch_size, cfg.run.seed),
        reward_fn=get_reward(d.reward or getattr(task, "reward", None) or d.task),
        cluster_of=cluster_of,
    )


def load_policy(cfg: TrainConfig, checkpoint: Path | None, device: torch.device) -> Policy:
    """The policy from ``model.path`` (a model, checkpoint or run directory, or a built-in model by name:
    ``ebpo.models.names.resolve_model``; null is ``builtin``, S1), its weights from ``checkpoint`` when resuming, and a frozen copy of
    the initial weights when ``algorithm.kl_coef > 0``; in ``model.dtype`` (:func:`mixed_precision`)."""
    hf_logging.disable_progress_bar()  # no per-load / per-save bars in the training log
    m = cfg.model
    try:
        base_path = resolve_model(m.path).path
    except ConfigError as err:
        raise ConfigError(f"model.path: {err} ({builtin_hint()})") from None
    load_from = checkpoint / "model" if checkpoint is not None else base_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(base_path)
        # float32 weights whatever model.dtype: the master copy the optimizer updates (mixed_precision)
        # transformers wraps PreTrainedModel.to in functools.wraps: mypy sees an unbound _Wrapped (self first)
        model = AutoModelForCausalLM.from_pretrained(load_from, dtype=torch.float32).to(device)  # type: ignore[arg-type]
    except Exception as err:  # noqa: BLE001 - OSError, safetensors' and JSON errors of a damaged directory
        raise ConfigError(f"model.path: cannot load a causal LM from {load_from}: {first_line(err)}") from err
    prompt_format = PromptFormat.resolve(
        tokenizer, cfg.data.chat_template, option="data.chat_template", source=base_path
    )
    mixed_precision(model, m.dtype)
    # eval mode: no dropout in RL fine-tuning (gradients still flow). Hugging Face only checkpoints
    # activations in train mode, so that option needs it (dropout is 0 in current causal LMs).
    model.train(m.gradient_checkpointing)
    if m.gradient_checkpointing:  # transformers 5.24 renamed it (the older name warns)
        enable = (
            getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        )
        enable()
    in_kernel_gqa(model)  # sampling and the passes without gradient: same numbers, less copying
    shared_prompts = resolve_shared_prompts(
        cfg.optim.shared_prompts, model, m.gradient_checkpointing, base_path
    )
    ref_model = None
    if cfg.algorithm.kl_coef > 0:
        # never updated, so it needs no float32 copy: held in model.dtype (as verl holds its reference), and
        # run under the same autocast as the policy. The same functools.wraps typing of .to as above.
        dtype = getattr(torch, m.dtype)
        ref_model = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype).to(device)  # type: ignore[arg-type]
        mixed_precision(ref_model, m.dtype)
        # eval mode, and only ever run without gradient (torch.no_grad)
        ref_model.eval()
        in_kernel_gqa(ref_model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return Policy(
        model=model,
        ref_model=ref_model,
        tokenizer=tokenizer,
        base_path=base_path,
        pad_id=pad_id,
        shared_prompts=shared_prompts,
        prompt_format=prompt_format,
    )


def resolve_shared_prompts(
    setting: bool | None, model: Any, gradient_checkpointing: bool, base_path: Path
) -> bool:
    """``optim.shared_prompts`` for ``model``: true is checked against its attention (a ConfigError names the
    fix), false stays off, and null turns it on where the attention takes its mask and the KV cache is on,
    saying so in one line when it stays off."""
    if setting is not None:
        if setting:
            check_shared_prompt_attention(model, str(base_path))
        return setting
    attention = attention_of(model)
    if gradient_checkpointing or attention not in SHARED_PROMPT_ATTENTION:
        why = "model.gradient_checkpointing=true" if gradient_checkpointing else f"{attention!r} attention"
        logger.info(f"optim.shared_prompts: off with {why} (each row runs its own copy of the prompt)")
        return False
    return True


def mixed_precision(model: torch.nn.Module, dtype: str) -> None:
    """``model.dtype`` for a loaded model: ``float32`` leaves it as it is; ``bfloat16`` runs its forward (every
    pass: sampling, log-probs, updates, validation) under ``torch.autocast`` in bfloat16, so the matrix
    products compute in bfloat16 while the weights, their gradients and the optimizer's state stay as loaded,
    in float32. Mixed precision, as verl's FSDP and TRL's ``bf16=True`` train: an update smaller than
    bfloat16's precision (about 1/256 of a weight) still moves the float32 weight. The logits come out in
    bfloat16 and the log-probs are computed from them in float32 (``ebpo.logprobs``)."""
    if dtype == "float32":
        return
    forward = model.forward
    device_type = next(model.parameters()).device.type
    autocast_dtype = getattr(torch, dtype)

    @functools.wraps(forward)
    def forward_in_autocast(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=autocast_dtype):
            return forward(*args, **kwargs)

    model.forward = forward_in_autocast


def build_algorithm(cfg: TrainConfig, generator: torch.Generator) -> Algorithm:
    """The estimator (``algorithm.estimator`` with its options), the policy loss and its config; ``generator``
    is the run's seeded stream (Clip-Cov's choice of tokens draws from it)."""
    a = cfg.algorithm
    loss_cfg = PolicyLossConfig(
        **dataclasses.asdict(a.loss),
        loss_agg_mode=a.loss_agg_mode,
        max_response_len=cfg.rollout.max_new_tokens,
        generator=generator,
    )
    return Algorithm(
        get_estimator(a.estimator, **a.estimator_kwargs()), get_policy_loss(a.policy_loss), loss_cfg
    )


def build_optimizer(model: torch.nn.Module, o: OptimConfig) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable parameters, with a linear warm-up over ``optim.warmup_steps`` steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    beta1, beta2 = o.betas  # two numbers (OptimConfig checks them)
    optimizer = torch.optim.AdamW(
        params, lr=o.lr, betas=(beta1, beta2), eps=o.eps, weight_decay=o.weight_decay
    )
    warmup = o.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    )
    return optimizer, scheduler


def check_prompt_lengths(policy: Policy, prompts: Prompts, max_new_tokens: int) -> None:
    """Every prompt, as the model reads it (``data.chat_template``), plus ``rollout.max_new_tokens`` must fit the
    model's context."""
    context = getattr(policy.model.config, "max_position_embeddings", None)
    if context is None:
        return
    for split, records in (("training", prompts.train_records), ("validation", prompts.val_records)):
        for row, (record, ids) in enumerate(zip(records, policy.prompt_format.ids(records))):
            length = len(ids)
            if length + max_new_tokens > context:
                raise ConfigError(
                    f"{split} record {row} (id {record.id!r}) has a prompt of {length} tokens; with "
                    f"rollout.max_new_tokens={max_new_tokens} that exceeds the model's context of {context} "
                    "tokens. Shorten or drop the prompt, or lower rollout.max_new_tokens."
                )
