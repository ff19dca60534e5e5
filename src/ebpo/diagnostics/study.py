"""The measurement of ``ebpo diagnose``: batches sampled from the policy, every estimator's advantages on the
same samples, and the one-batch policy gradient each gives, against a reference.

One batch, top to bottom (:func:`diagnose`):

1. M prompts drawn by the ``random`` sampler from the pool; ``max(G) + G_ref`` responses sampled per prompt
   in one call of the sampler. The first G responses of each prompt form the batch at group size G (so
   the batch at G = 2 is part of the batch at G = 16); the last G_ref are the reference samples.
2. Reference: p̂ and Var̂(p̂) per prompt from the G_ref rewards; the reference gradient from the same samples,
   as two halves of G_ref/2 with RLOO's leave-one-out advantage r - mean(others) (unbiased: the baseline of
   a response does not depend on it) under ``seq-mean-token-sum`` (every response weighs 1/(M G_ref/2)), so
   each half estimates the gradient of the batch's mean success rate; their mean is the reference, their
   difference its noise (:func:`~ebpo.diagnostics.measures.reference_noise`).
3. For each G and each estimator (one instance per G, as a run with that G would have): the advantages,
   the baseline error and the counts; the gradient of the estimator's policy loss (its preset's loss,
   aggregation and clip options) at ratio 1 (old log-probs = current ones: the first update of a step), as
   training's first update computes it, without the KL term, projected by the run's sketch.

Stateful estimators (EBPO's prior) first see W warm-up batches of the same policy, drawn the same way (their
rewards only: the call training makes, which folds the batch into the prior), then every measured batch in
turn (training folds the current batch in before reading the prior).

Each external piece is called from one function here: the sampler (:func:`_sample`), the log-probs
(:func:`_logp`), the reward (:func:`_score`), the estimators (:func:`_estimator`), the policy loss
(:func:`_preset_loss`, :func:`loss_weights`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ebpo.diagnostics import measures
from ebpo.diagnostics.config import DiagnoseConfig, EstimatorSpec, estimator_specs, replace, with_model_task
from ebpo.errors import ConfigError


@dataclass
class ArmRecord:
    """Per-batch measurements of one estimator at one group size (lists over the R measured batches)."""

    baseline_error: list[float] = field(default_factory=list)
    centred_baseline_error: list[float] = field(default_factory=list)
    zero_responses: list[float] = field(default_factory=list)
    zero_groups: list[float] = field(default_factory=list)
    constant_groups: list[float] = field(default_factory=list)
    gradients: list[torch.Tensor] = field(default_factory=list)
    """The sketched ascent direction -grad(loss) of each batch, (K,) float64."""

    @property
    def gradients_RK(self) -> torch.Tensor:
        return torch.stack(self.gradients)


@dataclass
class DiagnoseResult:
    """Everything :func:`diagnose` measured; :func:`ebpo.diagnostics.report.summarize` turns it into rows."""

    config: DiagnoseConfig
    specs: list[EstimatorSpec]
    arms: dict[tuple[str, int], ArmRecord]
    """(estimator label, G) -> its per-batch measurements."""
    reference_RK: torch.Tensor
    """The reference gradient of each batch (sketched, float64)."""
    reference_noise_R: torch.Tensor
    """Each reference's own noise, an unbiased estimate of its tr Cov."""
    pool: list[measures.PoolStats]
    """Each batch's prompts as the reference samples see them."""
    losses: dict[str, str]
    """Estimator label -> its loss, as ``preset: policy loss, aggregation``."""
    warmup_batches: int
    """Warm-up batches actually fed (0 when no estimator keeps state)."""
    num_parameters: int
    seconds: float


# --------------------------------------------------------------------------------------------------
# the pieces of the library this measurement uses, each called from here only


def _sample(
    model: Any, tokenizer: Any, prompts: list[list[int]], n: int, cfg: DiagnoseConfig, generator: Any
) -> Any:
    """``n`` responses per prompt (token ids: ``PromptFormat.ids``) from the policy (``ebpo.generation.sample``)."""
    from ebpo.generation import sample

    return sample(
        model,
        tokenizer,
        prompts,
        n=n,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        generator=generator,
    )


def _logp(model: Any, inputs: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """Token log-probs (B, T) of the responses, with gradient (``ebpo.logprobs.logprobs``, the trainer's)."""
    from ebpo.logprobs import LogprobOptions, Tokens, logprobs

    names = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
    tokens = Tokens(*(inputs[name] for name in names))
    return logprobs(model, tokens, LogprobOptions(temperature=temperature)).logp_BT


def batch_logp(model: Any, inputs: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """:func:`_logp` of every row, computed once per distinct row (same prompt, response and masks: a group's
    responses often agree) and gathered back to the B rows. A backward pass through the gather adds the
    weights of equal rows before it reaches the model, so each gradient costs a pass over the distinct rows
    only; the gradient is the same up to the order of float sums (``tests/diagnostics/test_study.py`` holds it
    to a pass over every row)."""
    rows_BL = torch.cat(
        [inputs[name].long() for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")], 1
    )
    _, inverse_B = torch.unique(rows_BL, dim=0, return_inverse=True)
    first_U = torch.full((int(inverse_B.max()) + 1,), rows_BL.shape[0], device=rows_BL.device)
    first_U = first_U.scatter_reduce(
        0, inverse_B, torch.arange(rows_BL.shape[0], device=rows_BL.device), "amin"
    )
    logp_UT = _logp(model, {name: tensor[first_U] for name, tensor in inputs.items()}, temperature)
    return logp_UT[inverse_B]


def _score(
    reward_fn: Any, texts: list[str], answers: list[str], prompts: list[str], ids: list[str]
) -> torch.Tensor:
    """Rewards (float64) of every sample; a sample the reward cannot score is an error naming its record."""
    from ebpo.trainer.rollout import score_samples

    rewards_B, _, failures = score_samples(reward_fn, texts, answers, prompts)
    if failures:
        first = failures[0]
        raise ConfigError(
            f"the reward failed on {len(failures)} sample(s), first on record {ids[first.index]!r} "
            f"(response {first.completion!r}: {first.message}); diagnose needs every sample scored: fix the "
            "reward or drop the record"
        )
    return rewards_B


def _estimator(name: str, options: dict[str, Any]) -> Any:
    """A fresh estimator from the registry (``ebpo.advantages.get_estimator``)."""
    from ebpo.advantages import get_estimator

    return get_estimator(name, **options)


class PolicyLoss(NamedTuple):
    """A policy loss and its settings: ``fn(logp, old_logp, adv, mask, cfg) -> (loss, metrics)``."""

    fn: Any
    cfg: Any
    description: str


def _preset_loss(preset: str, max_new_tokens: int, generator: torch.Generator) -> PolicyLoss:
    """The policy loss of a training preset (``ebpo.trainer.load_config``): its ``policy_loss``,
    ``loss_agg_mode`` and ``loss`` options, as ``ebpo train`` builds them; ``max_new_tokens`` is the constant
    ``seq-mean-token-sum-norm`` divides by. The preset's KL term is not part of it."""
    import dataclasses

    from ebpo.losses import PolicyLossConfig, get_policy_loss
    from ebpo.trainer import load_config

    a = load_config(preset).algorithm
    cfg = PolicyLossConfig(
        **dataclasses.asdict(a.loss),
        loss_agg_mode=a.loss_agg_mode,
        max_response_len=max_new_tokens,
        generator=generator,
    )
    return PolicyLoss(get_policy_loss(a.policy_loss), cfg, f"{preset}: {a.policy_loss}, {a.loss_agg_mode}")


def _reference_loss() -> PolicyLoss:
    """The reference's loss: ``vanilla`` under ``seq-mean-token-sum`` (each response weighs the same), whose
    ratio-1 gradient with an unbiased baseline estimates the gradient of the mean success rate."""
    from ebpo.losses import PolicyLossConfig, get_policy_loss

    return PolicyLoss(
        get_policy_loss("vanilla"), PolicyLossConfig(loss_agg_mode="seq-mean-token-sum"), "reference"
    )


# --------------------------------------------------------------------------------------------------
# gradients


def loss_weights(
    loss: PolicyLoss, logp_BT: torch.Tensor, adv_B: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """d loss / d logp (B, T) of the policy loss at ratio 1 (old log-probs = ``logp_BT``): the loss is
    evaluated on a detached copy, so no pass through the model is made. The model gradient of the loss is
    then the vector-Jacobian product of ``logp_BT`` with these weights (chain rule)."""
    leaf_BT = logp_BT.detach().clone().requires_grad_(True)
    value, _ = loss.fn(leaf_BT, logp_BT.detach(), adv_B.to(leaf_BT.dtype), mask_BT, loss.cfg)
    (weights_BT,) = torch.autograd.grad(value, leaf_BT, allow_unused=True)
    return torch.zeros_like(leaf_BT) if weights_BT is None else weights_BT


def ascent_directions(
    logp_BT: torch.Tensor,
    params: Sequence[torch.nn.Parameter],
    weights: Sequence[torch.Tensor],
    sketch: measures.GradientSketch,
) -> list[torch.Tensor]:
    """The sketched ascent direction -d loss / d params of each loss, given its :func:`loss_weights`.

    One backward pass per distinct direction: weights that are a multiple of earlier ones (RLOO, Dr. GRPO and
    REINFORCE++-baseline under one loss; any estimator whose advantages are a multiple of another's on this
    batch) reuse that gradient, scaled; zero weights give a zero direction without a pass. Exact up to float
    rounding, since the gradient is linear in the weights (``tests/diagnostics/test_study.py`` holds it to one
    backward per loss)."""
    computed: list[tuple[torch.Tensor, torch.Tensor]] = []  # (weights, sketched gradient)
    out = []
    for weights_BT in weights:
        norm2 = float((weights_BT * weights_BT).sum())
        if norm2 == 0:
            out.append(torch.zeros(sketch.out_dim, dtype=torch.float64))
            continue
        reused = None
        for known_BT, known_K in computed:
            scale = float((weights_BT * known_BT).sum() / (known_BT * known_BT).sum())
            if float(((weights_BT - scale * known_BT) ** 2).sum()) <= 1e-12 * norm2:
                reused = scale * known_K
                break
        if reused is None:
            grads = torch.autograd.grad(
                logp_BT, list(params), grad_outputs=weights_BT, retain_graph=True, allow_unused=True
            )
            reused = -sketch(grads)
            computed.append((weights_BT, reused))
        out.append(reused)
    return out


# --------------------------------------------------------------------------------------------------
# one estimator at one group size


class _Arm:
    """One estimator at one G: its estimator, the twin its raw advantage comes from, and its record."""

    def __init__(self, spec: EstimatorSpec, group_size: int) -> None:
        self.spec, self.group_size = spec, group_size
        self.estimator = _estimator(spec.name, spec.options)
        read = measures.raw_advantage(spec.name, spec.options)
        self.twin = _estimator(*read.twin) if read.twin is not None else None
        self.centres = read.centres
        self.stateful = bool(self.estimator.state_dict())
        self.record = ArmRecord()

    def warm(self, rewards_N: torch.Tensor, index_N: torch.Tensor, cluster: Any) -> None:
        """Feed a warm-up batch, as a training step would (its advantages are not used)."""
        self.estimator(rewards_N, index_N, cluster)
        if self.twin is not None:
            self.twin(rewards_N, index_N, cluster)

    def advantages(
        self, rewards_N: torch.Tensor, index_N: torch.Tensor, cluster: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A_N, a_N)``: the training advantage and the raw advantage, float64."""
        adv_N = self.estimator(rewards_N, index_N, cluster).double()
        raw_N = adv_N if self.twin is None else self.twin(rewards_N, index_N, cluster).double()
        return adv_N, raw_N


# --------------------------------------------------------------------------------------------------
# the run


def _threads(count: int) -> contextlib.AbstractContextManager[None]:
    """Run with ``count`` torch CPU threads (0: leave torch's setting), restored after."""

    @contextlib.contextmanager
    def scope() -> Iterator[None]:
        previous = torch.get_num_threads()
        if count > 0:
            torch.set_num_threads(count)
        try:
            yield
        finally:
            torch.set_num_threads(previous)

    return scope()


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _load_policy(cfg: DiagnoseConfig, device: torch.device) -> tuple[Any, Any]:
    """Model and tokenizer from ``cfg.model`` as ``ebpo eval`` loads them (without transformers' loading bar:
    the command has its own)."""
    from transformers.utils import logging as hf_logging

    from ebpo.eval.harness import load_model

    hf_logging.disable_progress_bar()
    # a built-in model by name, a model, a checkpoint or a run directory, as ebpo eval takes it (a checkpoint
    # checked against its manifest)
    from ebpo.models.names import builtin_hint, resolve_model
    from ebpo.run_directory import RunDirectory
    from ebpo.trainer.checkpoint import verify_checkpoint

    try:
        found = resolve_model(cfg.model)
    except ConfigError as err:
        raise ConfigError(f"--model: {err} ({builtin_hint()})") from None
    if found.checkpoint is not None:
        verify_checkpoint(found.checkpoint, under=RunDirectory.MODEL, use="ebpo diagnose --model")
    path = found.path
    try:
        return load_model(path, device=str(device), dtype=cfg.dtype)
    except (OSError, ConfigError) as err:
        raise ConfigError(f"--model {cfg.model}: {err}") from err


def _load_records(cfg: DiagnoseConfig) -> list[Any]:
    """The prompt pool: ``--records`` read as ``ebpo train`` reads data.train_file, else generated by the task."""
    if cfg.records is not None:
        from ebpo.data.loaders import load_records

        records = load_records(cfg.records, cfg.schema)
        source = cfg.records
    else:
        subset = {key: value for key, value in (("topics", cfg.topics), ("levels", cfg.levels)) if value}
        try:
            records = list(_task(cfg).generate(cfg.split, cfg.pool_size, cfg.seed, **subset))
        except ValueError as err:
            raise ConfigError(f"--task {cfg.task}: {err}") from None
        source = f"task {cfg.task!r}"
    if len(records) < cfg.prompts:
        raise ConfigError(
            f"the pool from {source} has {len(records)} records, fewer than --prompts {cfg.prompts}; lower "
            "--prompts or add records"
        )
    return records


def _task(cfg: DiagnoseConfig) -> Any:
    """``--task`` with ``--task-options``."""
    from ebpo.tasks import get_task, task_options

    assert cfg.task is not None, "diagnose() fills in the task (with_model_task)"
    return get_task(cfg.task, **task_options(cfg.task_options, "--task-options"))


def _reward(cfg: DiagnoseConfig) -> Any:
    from ebpo.rewards import get_reward

    if cfg.reward is not None:
        return get_reward(cfg.reward)
    task = _task(cfg)
    return get_reward(task.reward or task.name)


@dataclass
class SampledBatch:
    """One batch's samples: ``n`` responses for each of M prompts (rows m*n .. m*n + n - 1 answer prompt m),
    their rewards (M, n) and the prompts' cluster keys (None without ``--cluster-key``)."""

    rollouts: Any
    rewards_Mn: torch.Tensor
    clusters_M: list[Any] | None

    @property
    def num_prompts(self) -> int:
        return self.rewards_Mn.shape[0]

    def rows(self, first: int, count: int) -> torch.Tensor:
        """Row indices of responses ``first .. first + count - 1`` of every prompt, prompt by prompt."""
        M, n = self.rewards_Mn.shape
        return (torch.arange(M)[:, None] * n + first + torch.arange(count)[None, :]).reshape(-1)

    def groups(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor, list[Any] | None]:
        """``(rewards_N, index_N, cluster_N)`` of responses ``first .. first + count - 1`` of every prompt:
        what an estimator takes, one group per prompt."""
        index_N = torch.arange(self.num_prompts).repeat_interleave(count)
        cluster_N = None if self.clusters_M is None else [c for c in self.clusters_M for _ in range(count)]
        return self.rewards_Mn[:, first : first + count].reshape(-1), index_N, cluster_N


class _Study:
    """The measurement's fixed parts (model, pool, estimators, losses, sketch) and what it has measured."""

    def __init__(self, cfg: DiagnoseConfig, model: Any, tokenizer: Any, pool: list[Any], reward: Any) -> None:
        from ebpo.data.prompts import PromptFormat
        from ebpo.data.samplers import cluster_key, get_sampler

        self.cfg, self.model, self.tokenizer, self.pool, self.reward = cfg, model, tokenizer, pool, reward
        # the prompts as `ebpo train` and `ebpo eval` give them to the model
        self.prompt_format = PromptFormat.resolve(
            tokenizer, cfg.chat_template, option="--chat-template", source=cfg.model
        )
        self.device = next(model.parameters()).device
        self.specs = estimator_specs(cfg)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.sketch = measures.GradientSketch([p.numel() for p in self.params], cfg.projection_dim, cfg.seed)
        loss_generator = torch.Generator().manual_seed(cfg.seed)  # Clip-Cov's choice of tokens
        presets = sorted({spec.preset for spec in self.specs})
        self.losses = {preset: _preset_loss(preset, cfg.max_new_tokens, loss_generator) for preset in presets}
        self.reference_loss = _reference_loss()
        self.sizes = sorted(set(cfg.group_sizes))
        self.arms = {(spec.label, G): _Arm(spec, G) for G in self.sizes for spec in self.specs}
        self.warmup = cfg.warmup_batches if any(arm.stateful for arm in self.arms.values()) else 0
        self.sampler = get_sampler("random", pool, cfg.prompts, cfg.seed)
        by = cfg.cluster_key
        self.clusters = [cluster_key(record, by=by) for record in pool] if by != "none" else None
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.references: list[torch.Tensor] = []
        self.noises: list[float] = []
        self.pool_stats: list[measures.PoolStats] = []

    def draw(self, n: int) -> SampledBatch:
        """M prompts from the sampler and ``n`` scored responses to each."""
        indices = self.sampler.next_batch()
        chosen = [self.pool[i] for i in indices]
        rollouts = _sample(
            self.model, self.tokenizer, self.prompt_format.ids(chosen), n, self.cfg, self.generator
        )
        rewards_B = _score(
            self.reward,
            rollouts.texts,
            [r.answer for r in chosen for _ in range(n)],
            [r.prompt for r in chosen for _ in range(n)],
            [str(r.id) for r in chosen for _ in range(n)],
        )
        clusters = None if self.clusters is None else [self.clusters[i] for i in indices]
        return SampledBatch(rollouts, rewards_B.view(len(chosen), n), clusters)

    def warm(self, batch: SampledBatch) -> None:
        """Feed a warm-up batch to every stateful estimator, each its first G responses per prompt."""
        for (_, G), arm in self.arms.items():
            if arm.stateful:
                arm.warm(*batch.groups(0, G))

    def measure_reference(self, batch: SampledBatch, first: int) -> torch.Tensor:
        """The reference's success rates (into ``pool_stats``) and gradient with its noise, from responses
        ``first ..`` of every prompt; returns (p̂_M, Var̂(p̂)_M) stacked (2, M)."""
        count, half = self.cfg.reference_samples, self.cfg.reference_samples // 2
        rewards_MR = batch.rewards_Mn[:, first : first + count]
        self.pool_stats.append(measures.pool_stats(rewards_MR))
        halves = []
        for start in (first, first + half):
            inputs = _inputs(batch.rollouts, batch.rows(start, half), self.device)
            logp_BT = batch_logp(self.model, inputs, self.cfg.temperature)
            rewards_N, index_N, _ = batch.groups(start, half)
            rloo_N = _estimator("rloo", {})(rewards_N, index_N).double().to(self.device)
            weights_BT = loss_weights(self.reference_loss, logp_BT, rloo_N, inputs["response_mask"])
            halves.append(ascent_directions(logp_BT, self.params, [weights_BT], self.sketch)[0])
        reference_K, noise = measures.reference_noise(*halves)
        self.references.append(reference_K)
        self.noises.append(noise)
        return torch.stack(measures.reference_rate(rewards_MR))

    def measure(self, batch: SampledBatch, G: int, reference_2M: torch.Tensor) -> None:
        """Every estimator at group size G on the first G responses of every prompt: baselines and counts,
        then one pass through the model for the gradients of all of them."""
        rewards_N, index_N, cluster_N = batch.groups(0, G)
        inputs = _inputs(batch.rollouts, batch.rows(0, G), self.device)
        logp_BT = batch_logp(self.model, inputs, self.cfg.temperature)
        ref_mean_N, ref_var_N = reference_2M.repeat_interleave(G, dim=1)
        weights = []
        for spec in self.specs:
            arm = self.arms[(spec.label, G)]
            adv_N, raw_N = arm.advantages(rewards_N, index_N, cluster_N)
            baseline_N, centred_N = measures.baselines(rewards_N, raw_N, arm.centres)
            record = arm.record
            record.baseline_error.append(measures.baseline_error(baseline_N, ref_mean_N, ref_var_N))
            record.centred_baseline_error.append(measures.baseline_error(centred_N, ref_mean_N, ref_var_N))
            counts = measures.advantage_counts(adv_N.view(-1, G))
            record.zero_responses.append(counts.zero_responses)
            record.zero_groups.append(counts.zero_groups)
            record.constant_groups.append(counts.constant_groups)
            loss = self.losses[spec.preset]
            weights.append(loss_weights(loss, logp_BT, adv_N.to(self.device), inputs["response_mask"]))
        for spec, direction_K in zip(
            self.specs, ascent_directions(logp_BT, self.params, weights, self.sketch)
        ):
            self.arms[(spec.label, G)].record.gradients.append(direction_K)

    def run(self) -> None:
        """W warm-up batches (when an estimator keeps state), then R measured batches."""
        from tqdm.auto import tqdm

        cfg, largest = self.cfg, max(self.sizes)
        total = self.warmup + cfg.batches
        with tqdm(total=total, desc="diagnose", unit="batch", disable=cfg.quiet, dynamic_ncols=True) as bar:
            for _ in range(self.warmup):
                bar.set_postfix_str("warm-up")
                self.warm(self.draw(largest))
                bar.update()
            for _ in range(cfg.batches):
                bar.set_postfix_str("measure")
                batch = self.draw(largest + cfg.reference_samples)
                reference_2M = self.measure_reference(batch, first=largest)
                for G in self.sizes:
                    self.measure(batch, G, reference_2M)
                bar.update()


def diagnose(
    config: DiagnoseConfig | None = None,
    /,
    *,
    model: Any = None,
    tokenizer: Any = None,
    records: Sequence[Any] | None = None,
    reward_fn: Any = None,
    **overrides: Any,
) -> DiagnoseResult:
    """Measure every estimator's baseline error and gradient (module docstring), deterministic given the
    settings.

    ``config`` (default :class:`DiagnoseConfig`'s defaults) with ``overrides`` by field name
    (``ebpo.diagnose(group_sizes=[4, 8], batches=8)``). ``model`` and ``tokenizer`` replace loading
    ``config.model`` (a Hugging Face causal LM or anything with its call contract; left in its train/eval
    mode), ``records`` the pool (objects with ``id``, ``prompt``, ``answer``, optional ``topic`` and
    ``difficulty``), ``reward_fn`` the reward (``fn(completion, answer)``, optional ``fn.batch``)."""
    cfg = with_model_task(replace(config or DiagnoseConfig(), **overrides))
    estimator_specs(cfg)  # a bad estimator fails before the model loads
    start = time.perf_counter()
    with _threads(cfg.threads):
        if model is None:
            model, tokenizer = _load_policy(cfg, _device(cfg.device))
        elif tokenizer is None:
            raise ConfigError("diagnose: a model was given without its tokenizer")
        pool = list(records) if records is not None else _load_records(cfg)
        study = _Study(cfg, model, tokenizer, pool, reward_fn if reward_fn is not None else _reward(cfg))
        study.run()
    return DiagnoseResult(
        config=cfg,
        specs=study.specs,
        arms={key: arm.record for key, arm in study.arms.items()},
        reference_RK=torch.stack(study.references),
        reference_noise_R=torch.tensor(study.noises, dtype=torch.float64),
        pool=study.pool_stats,
        losses={spec.label: study.losses[spec.preset].description for spec in study.specs},
        warmup_batches=study.warmup,
        num_parameters=study.sketch.total,
        seconds=time.perf_counter() - start,
    )


def _inputs(rollouts: Any, rows_B: torch.Tensor, device: torch.device) -> dict[str, torch.Tensor]:
    """The log-prob pass's token tensors of the rows ``rows_B`` of ``rollouts``, on ``device``; responses
    cut to the longest among these rows."""
    width = int(rollouts.response_mask[rows_B].sum(dim=1).max())
    return {
        "prompt_ids": rollouts.prompt_ids[rows_B].to(device),
        "prompt_mask": rollouts.prompt_mask[rows_B].to(device),
        "response_ids": rollouts.response_ids[rows_B, :width].to(device),
        "response_mask": rollouts.response_mask[rows_B, :width].to(device),
    }
