"""The reference RLVR trainer: one loop that reads top to bottom (CleanRL style).

Per step (``Trainer.train``):

1. draw ``data.batch_size`` prompts from the sampler (``ebpo.data.samplers``);
2. sample G = ``data.group_size`` responses each with ``ebpo.generation.sample`` (temperature, top-p,
   max new tokens, EOS stop, KV cache, a seeded ``torch.Generator``);
3. score them with the reward registry (``ebpo.rewards``); optional DAPO overlong shaping and dynamic
   sampling; a reward function that raises stops the run with a checkpoint (or, with
   ``algorithm.skip_reward_errors``, the sample is masked out and counted in ``reward/errors``);
4. advantages from the estimator registry (``ebpo.advantages``; cluster keys = record topic or
   difficulty bucket when ``data.cluster_key`` is set), broadcast over the response tokens (SPEC 1.6);
5. K = ``optim.epochs`` passes of shuffled mini-batch updates: the chosen policy loss with its
   aggregation (``ebpo.losses``), plus ``kl_coef * agg(k3(logp, ref_logp))`` to the frozen initial
   policy, gradient clipping, AdamW;
6. ``actor/step_kl`` = KL(pi_t || pi_{t+1}) estimated with k3 on the step's own tokens (the log-probs
   are recomputed after the update), plus SPEC section 5's other metrics, to ``metrics.jsonl`` and
   TensorBoard;
7. validation every ``run.eval_every`` steps (pass@1 over ``eval_n`` samples, maj@k), keeping the best
   checkpoint by maj@k (the paper's rule, Appendix A) beside the last one.

Exact resume: a checkpoint holds the model, optimizer, scheduler, estimator, sampler and every RNG
state (Python, NumPy, torch, CUDA, the sampling generator). Validation draws from its own generator,
re-seeded identically at every evaluation, so it never perturbs the training stream: N steps, a kill,
a resume and N more steps give the same parameters as 2N steps in one run, bit for bit on CPU.

Log-probabilities for the PPO ratio are those of ``log_softmax(logits / T)`` at the rollout
temperature T, as in ``ebpo.generation`` and verl; the old log-probs are recomputed with the training
forward pass (verl's ``recompute_log_prob``) so the first ratio is exactly 1.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ebpo.data.dynamic import Group
from ebpo.data.records import Record
from ebpo.trainer.config import ConfigError, TrainConfig, save_config

CHECKPOINT_DIR = "checkpoints"
LAST = "last"
BEST = "best"
STATE_FILE = "trainer_state.pt"
EXCLUDED_FROM_REPRODUCIBILITY = ("timing_s/", "perf/")
"""Metric prefixes that measure wall time and so differ between otherwise identical runs."""


class RewardError(RuntimeError):
    """A reward function raised on a sample; a checkpoint was written before this was raised."""


@dataclass
class TrainResult:
    """What a finished run leaves behind."""

    run_dir: Path
    step: int
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    best_step: int | None = None
    best_score: float | None = None
    history: list[dict[str, float]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------
# small helpers


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every RNG the loop touches: Python, NumPy, torch CPU (+ CUDA), and the sampling generator."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def load_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["generator"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def forward_logp(
    model, batch: dict[str, torch.Tensor], temperature: float, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-probs of the response under ``log_softmax(logits / T)``: returns ``(logp_BT, ent_BT)``.

    ``batch`` holds ``prompt_ids`` / ``prompt_mask`` (B, P) left-padded and ``response_ids`` /
    ``response_mask`` (B, T) right-padded. Position ids skip the left padding, as in generation, so the
    numbers match the sampler's. ``ent_BT`` is the entropy of the same distribution (or None).
    """
    prompt_ids_BP, prompt_mask_BP = batch["prompt_ids"], batch["prompt_mask"]
    response_ids_BT, response_mask_BT = batch["response_ids"], batch["response_mask"]
    num_prompt = prompt_ids_BP.shape[1]
    input_ids_BL = torch.cat([prompt_ids_BP, response_ids_BT], dim=1)
    attention_BL = torch.cat([prompt_mask_BP, response_mask_BT], dim=1)
    position_BL = (attention_BL.cumsum(-1) - 1).clamp(min=0)
    logits_BLV = model(input_ids=input_ids_BL, attention_mask=attention_BL, position_ids=position_BL).logits
    # the token at response position t is predicted by the logits at sequence position P - 1 + t
    logits_BTV = logits_BLV[:, num_prompt - 1 : -1, :].float() / temperature
    # log_softmax at the sampled token without a second (B, T, V) tensor: z_y - logsumexp(z)
    logp_BT = logits_BTV.gather(-1, response_ids_BT[..., None]).squeeze(-1) - torch.logsumexp(
        logits_BTV, dim=-1
    )
    entropy_BT = None
    if with_entropy:
        from ebpo.losses import entropy_from_logits

        entropy_BT = entropy_from_logits(logits_BTV)
    return logp_BT, entropy_BT


def _select(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: value[rows] for name, value in batch.items()}


def _masked_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    mask_BT = mask_BT.float()
    return float((values_BT * mask_BT).sum() / mask_BT.sum().clamp(min=1.0))


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


class MetricsLogger:
    """Writes one JSON line per step to ``metrics.jsonl`` and the same scalars to TensorBoard."""

    def __init__(self, run_dir: Path, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():  # drop lines written after the checkpoint
            kept = [
                line for line in self.path.read_text().splitlines() if json.loads(line)["step"] <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.writer = SummaryWriter(
            str(run_dir / "tensorboard"), purge_step=None if resume_step is None else resume_step + 1
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, **metrics}, sort_keys=True) + "\n")
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """The rows of a run's ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------
# the trainer


class Trainer:
    """EBPO / GRPO / Dr. GRPO / DAPO / EntropyMech / RLOO / JSPO training on one device.

    Args:
        cfg: the validated configuration.
        run_dir: where to write; default ``<run.out_dir>/<run.name or timestamp-method>``.
        resume: a run directory (or its ``checkpoints/last``) to continue exactly.
    """

    def __init__(self, cfg: TrainConfig, run_dir: str | Path | None = None, resume: str | Path | None = None):
        self.cfg = cfg
        self.device = resolve_device(cfg.run.device)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        checkpoint = self._find_checkpoint(resume) if resume is not None else None
        if checkpoint is not None and run_dir is None:
            run_dir = checkpoint.parent.parent
        if run_dir is None:
            stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
            run_dir = Path(cfg.run.out_dir) / (cfg.run.name or f"{stamp}-{cfg.method}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        seed_everything(cfg.run.seed)

        self._setup_data()
        self._setup_model(checkpoint)
        self._check_prompt_lengths()
        self._setup_algorithm()

        self.step = 0
        self.best_score: float | None = None
        self.best_step: int | None = None
        self.eval_before: dict[str, float] = {}
        if checkpoint is not None:
            self._load_state(checkpoint)
        save_config(cfg, self.run_dir / "config.yaml")

    # -- setup -------------------------------------------------------------------------------------

    def _setup_data(self) -> None:
        d = self.cfg.data
        if d.train_file is None or d.val_file is None or d.reward is None:
            from ebpo.tasks import get_task

            self.task = get_task(d.task)
        else:
            self.task = None
        from ebpo.data.loaders import load_records

        subset = {
            key: value for key, value in (("levels", d.levels), ("topics", d.topics)) if value is not None
        }
        if d.train_file is not None:
            self.train_records = load_records(d.train_file, d.schema)
        else:
            self.train_records = list(self.task.generate("train", d.train_size, self.cfg.run.seed, **subset))
        if d.val_file is not None:
            self.val_records = load_records(d.val_file, d.schema)
        else:
            self.val_records = list(self.task.generate("validation", d.val_size, self.cfg.run.seed, **subset))
        for split, records, source in (
            ("training", self.train_records, d.train_file or f"task {d.task!r}"),
            ("validation", self.val_records, d.val_file or f"task {d.task!r}"),
        ):
            if not records:
                raise ConfigError(
                    f"the {split} set from {source} is empty; give a file with records or raise the size"
                )
        if len(self.train_records) < d.batch_size:
            raise ConfigError(
                f"the training set has {len(self.train_records)} records, fewer than data.batch_size="
                f"{d.batch_size}; lower data.batch_size or add records"
            )
        if d.difficulty_source == "level":
            max_level = max((r.level or 0) for r in self.train_records + self.val_records)
            for record in self.train_records + self.val_records:
                if record.level is None:
                    raise ConfigError(f"data.difficulty_source=level but record {record.id!r} has no level")
                record.difficulty = (max_level - record.level + 0.5) / max_level
        from ebpo.data.samplers import get_sampler
        from ebpo.rewards import get_reward

        self.sampler = get_sampler(d.sampler, self.train_records, d.batch_size, self.cfg.run.seed)
        reward_name = d.reward or getattr(self.task, "reward", None) or d.task
        self.reward_fn = get_reward(reward_name)

    def _find_checkpoint(self, resume: str | Path) -> Path:
        path = Path(resume)
        for candidate in (path, path / LAST, path / CHECKPOINT_DIR / LAST):
            if (candidate / STATE_FILE).is_file():
                return candidate
        raise ConfigError(
            f"--resume {resume}: no checkpoint there (looked for {CHECKPOINT_DIR}/{LAST}/{STATE_FILE})"
        )

    def _setup_model(self, checkpoint: Path | None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no per-load / per-save bars in the training log
        m = self.cfg.model
        if m.path is None:
            from ebpo.models.base_model import build_base_model

            self.base_path = Path(build_base_model())
        else:
            self.base_path = Path(m.path)
            if not self.base_path.exists():
                raise ConfigError(
                    f"model.path: {m.path} does not exist; give a model directory or leave it null"
                )
        dtype = getattr(torch, m.dtype)
        load_from = checkpoint / "model" if checkpoint is not None else self.base_path
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.base_path)
            self.model = AutoModelForCausalLM.from_pretrained(load_from, dtype=dtype).to(self.device)
        except OSError as err:
            raise ConfigError(f"model.path: cannot load a causal LM from {load_from}: {err}") from err
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # eval mode: no dropout in RL fine-tuning (gradients still flow). Hugging Face only checkpoints
        # activations in train mode, so that option needs it (dropout is 0 in current causal LMs).
        self.model.train(m.gradient_checkpointing)
        if m.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.ref_model = None
        if self.cfg.algorithm.kl_coef > 0:
            self.ref_model = AutoModelForCausalLM.from_pretrained(self.base_path, dtype=dtype).to(self.device)
            self.ref_model.eval().requires_grad_(False)

    def _check_prompt_lengths(self) -> None:
        context = getattr(self.model.config, "max_position_embeddings", None)
        if context is None:
            return
        budget = self.cfg.rollout.max_new_tokens
        for split, records in (("training", self.train_records), ("validation", self.val_records)):
            for row, record in enumerate(records):
                length = len(self.tokenizer(record.prompt)["input_ids"])
                if length + budget > context:
                    raise ConfigError(
                        f"{split} record {row} (id {record.id!r}) has a prompt of {length} tokens; with "
                        f"rollout.max_new_tokens={budget} that exceeds the model's context of {context} tokens. "
                        "Shorten or drop the prompt, or lower rollout.max_new_tokens."
                    )

    def _setup_algorithm(self) -> None:
        from ebpo.advantages import get_estimator
        from ebpo.losses import PolicyLossConfig, get_policy_loss

        a, o = self.cfg.algorithm, self.cfg.optim
        self.estimator = get_estimator(a.estimator, **a.estimator_options)
        self.policy_loss = get_policy_loss(a.policy_loss)
        self.generator = torch.Generator(device="cpu").manual_seed(self.cfg.run.seed)
        self.loss_cfg = PolicyLossConfig(
            loss_agg_mode=a.loss_agg_mode,
            max_response_len=self.cfg.rollout.max_new_tokens,
            generator=self.generator,
            **a.loss_options,
        )
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
        )
        warmup = o.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        )
        self.cluster_of = None
        if self.cfg.data.cluster_key != "none":
            from ebpo.data.samplers import cluster_key

            by, buckets = self.cfg.data.cluster_key, self.cfg.data.difficulty_buckets
            self.cluster_of = {r.id: cluster_key(r, by=by, num_buckets=buckets) for r in self.train_records}

    # -- checkpoints -------------------------------------------------------------------------------

    def _state(
        self, rng: dict[str, Any] | None = None, sampler: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "estimator": self.estimator.state_dict(),
            "sampler": sampler if sampler is not None else self.sampler.state_dict(),
            "rng": rng if rng is not None else rng_state(self.generator),
            "best_score": self.best_score,
            "best_step": self.best_step,
            "eval_before": self.eval_before,
            "base_path": str(self.base_path),
        }

    def save_checkpoint(self, name: str = LAST, state: dict[str, Any] | None = None) -> Path:
        """Write ``checkpoints/<name>`` (model dir + trainer state) atomically; returns its path."""
        root = self.run_dir / CHECKPOINT_DIR
        final, tmp = root / name, root / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.model.save_pretrained(tmp / "model")
        self.tokenizer.save_pretrained(tmp / "model")
        torch.save(state if state is not None else self._state(), tmp / STATE_FILE)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        return final

    def _load_state(self, checkpoint: Path) -> None:
        state = torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=False)
        self.step = int(state["step"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.estimator.load_state_dict(state["estimator"])
        self.sampler.load_state_dict(state["sampler"])
        load_rng_state(state["rng"], self.generator)
        self.best_score, self.best_step = state["best_score"], state["best_step"]
        self.eval_before = state.get("eval_before", {})
        self.resumed_from = checkpoint

    # -- rollout and reward ------------------------------------------------------------------------

    def _rollout(self, records: list[Record]):
        from ebpo.generation import sample

        r = self.cfg.rollout
        return sample(
            self.model,
            self.tokenizer,
            [rec.prompt for rec in records],
            n=self.cfg.data.group_size,
            temperature=r.temperature,
            top_p=r.top_p,
            max_new_tokens=r.max_new_tokens,
            generator=self.generator,
        )

    def _score(
        self, texts: list[str], answers: list[str], prompts: list[str]
    ) -> tuple[torch.Tensor, torch.Tensor, list]:
        """Rewards (N,) float64, a validity mask (N,) bool, and the errors [(index, prompt, completion, err)].

        The fast ``.batch`` path is tried first; if it raises, every sample is scored alone to find
        the ones that fail. A non-finite reward counts as an error too.
        """
        try:
            scores = list(self.reward_fn.batch(texts, answers))
        except Exception:  # noqa: BLE001 - locate the failing samples below
            scores = None
        errors = []
        if scores is None:
            scores = []
            for i, (text, answer) in enumerate(zip(texts, answers)):
                try:
                    scores.append(float(self.reward_fn(text, answer)))
                except Exception as err:  # noqa: BLE001 - reported with the sample
                    scores.append(math.nan)
                    errors.append((i, prompts[i], text, f"{type(err).__name__}: {err}"))
        rewards_N = torch.tensor([float(s) for s in scores], dtype=torch.float64)
        for i in torch.nonzero(~torch.isfinite(rewards_N)).flatten().tolist():
            if not any(e[0] == i for e in errors):
                errors.append((i, prompts[i], texts[i], f"non-finite reward {scores[i]}"))
        valid_N = torch.isfinite(rewards_N)
        return torch.where(valid_N, rewards_N, torch.zeros_like(rewards_N)), valid_N, errors

    # -- validation --------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation (SPEC 5): pass@1 averaged over ``eval_n`` samples, unbiased pass@k and maj@k with
        ``ebpo.eval.metrics``, overall and pass@1 per topic (``eval/pass@1/<topic>``).

        Answers are extracted with the reward's ``extract`` and clustered with its ``equivalent`` (plain
        string equality when the reward has none). A fresh generator with the same seed at every
        evaluation: common random numbers across checkpoints, and the training RNG stream is untouched.
        """
        from ebpo.eval.metrics import score_problem, summarize
        from ebpo.generation import sample

        run = self.cfg.run
        generator = torch.Generator(device="cpu").manual_seed(run.seed + 1_000_003)
        records = self.val_records
        rollouts = sample(
            self.model,
            self.tokenizer,
            [rec.prompt for rec in records],
            n=run.eval_n,
            temperature=run.eval_temperature,
            top_p=self.cfg.rollout.top_p,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            generator=generator,
        )
        answers = [rec.answer for rec in records for _ in range(run.eval_n)]
        prompts = [rec.prompt for rec in records for _ in range(run.eval_n)]
        rewards_N, valid_N, _ = self._score(rollouts.texts, answers, prompts)
        rewards_N = torch.where(valid_N, rewards_N, torch.zeros_like(rewards_N))
        extract = getattr(self.reward_fn, "extract", None)
        equivalent = getattr(self.reward_fn, "equivalent", None) or (lambda gold, pred: gold == pred)
        by_topic: dict[str, list] = defaultdict(list)
        for m, rec in enumerate(records):
            rows = slice(m * run.eval_n, (m + 1) * run.eval_n)
            texts = rollouts.texts[rows]
            extracted = [extract(t) if extract is not None else t.strip() for t in texts]
            extracted = [None if x is None else str(x) for x in extracted]
            problem = score_problem(rec.id, rewards_N[rows].tolist(), extracted, equivalent)
            by_topic["all"].append(problem)
            by_topic[str(rec.topic)].append(problem)
        k = run.eval_k
        overall = summarize(by_topic.pop("all"), ks=(1, k), maj_ks=(k,), seed=run.seed)
        metrics = {
            f"eval/{name}": overall[name] for name in ("pass@1", f"pass@{k}", f"maj@{k}") if name in overall
        }
        metrics["eval/pass@1_se"] = overall["pass@1/se_problems"]  # standard error over the problems
        if len(by_topic) > 1 or "None" not in by_topic:
            for topic, problems in sorted(by_topic.items()):
                metrics[f"eval/pass@1/{topic}"] = summarize(problems)["pass@1"]
        return metrics

    # -- the loop ----------------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Run until ``run.steps``; returns the run's summary (also written to ``summary.json``)."""
        from tqdm.auto import tqdm

        from ebpo.losses import agg_loss, kl_penalty

        cfg, d, a, o, run = self.cfg, self.cfg.data, self.cfg.algorithm, self.cfg.optim, self.cfg.run
        resumed = getattr(self, "resumed_from", None) is not None
        logger = MetricsLogger(self.run_dir, resume_step=self.step if resumed else None)
        k = run.eval_k
        if not resumed:
            self.eval_before = self.evaluate()
            self._maybe_keep_best(self.eval_before)
            logger.log(0, self.eval_before)
        bar = tqdm(
            total=run.steps, initial=self.step, desc=cfg.method, disable=not run.progress, dynamic_ncols=True
        )
        eval_after = {}
        history = []
        try:
            while self.step < run.steps:
                step_start = time.perf_counter()
                # state at the start of the step: what a checkpoint written on a reward error must hold
                rng_at_start, sampler_at_start = (
                    rng_state(self.generator),
                    copy.deepcopy(self.sampler.state_dict()),
                )

                # 1-3. prompts -> G responses each -> rewards (DAPO dynamic sampling and overlong shaping
                # when configured)
                t0 = time.perf_counter()
                self._num_errors = 0
                groups, dynamic_metrics = self._collect(rng_at_start, sampler_at_start)
                batch = _concat_padded([g.data for g in groups], self.pad_id)
                score_N, reward_N, valid_N = batch.pop("score"), batch.pop("reward"), batch.pop("valid")
                num_rows = reward_N.shape[0]
                rollout_time = time.perf_counter() - t0

                # 4. advantages (estimator registry) over the valid samples; masked-out samples (reward errors
                # with skip_reward_errors) get advantage 0 and no tokens
                t0 = time.perf_counter()
                valid_rows = torch.nonzero(valid_N).flatten()
                uid_N = [g.uid for g in groups for _ in range(d.group_size)]
                index = [uid_N[i] for i in valid_rows.tolist()]
                cluster = None
                if self.cluster_of is not None:
                    cluster_N = [g.cluster for g in groups for _ in range(d.group_size)]
                    cluster = [cluster_N[i] for i in valid_rows.tolist()]
                adv_N = torch.zeros(num_rows, dtype=torch.float32)
                adv_N[valid_rows] = self.estimator(reward_N[valid_rows], index, cluster=cluster).float()
                batch["response_mask"] = batch["response_mask"] * valid_N[:, None].long()
                adv_time = time.perf_counter() - t0

                # 5. old log-probs (recomputed), reference log-probs, entropy; then K epochs of mini-batches
                t0 = time.perf_counter()
                mask_NT = batch["response_mask"]
                with torch.no_grad():
                    old_logp_NT, entropy_NT = self._logp_in_chunks(self.model, batch, with_entropy=True)
                    ref_logp_NT = None
                    if self.ref_model is not None:
                        ref_logp_NT, _ = self._logp_in_chunks(self.ref_model, batch)
                rows_per_mini = o.mini_batch_size * d.group_size
                update_metrics: dict[str, list[float]] = defaultdict(list)
                for _epoch in range(o.epochs):
                    order_N = torch.randperm(num_rows, generator=self.generator)
                    for start in range(0, num_rows, rows_per_mini):
                        rows = order_N[start : start + rows_per_mini]
                        self._update(
                            rows, batch, adv_N, old_logp_NT, ref_logp_NT, update_metrics, agg_loss, kl_penalty
                        )
                self.scheduler.step()
                with torch.no_grad():
                    new_logp_NT, _ = self._logp_in_chunks(self.model, batch)
                # 6. KL(pi_t || pi_{t+1}) on the step's tokens: k3 with samples from pi_t (kl_penalty(p, q)
                # estimates KL(p || q) from samples of p)
                step_kl = _masked_mean(kl_penalty(old_logp_NT, new_logp_NT, "k3"), mask_NT)
                update_time = time.perf_counter() - t0
                self.step += 1

                step_time = time.perf_counter() - step_start
                num_tokens = int(batch["prompt_mask"].sum() + batch["response_mask"].sum())
                metrics = {
                    "reward/mean": float(score_N[valid_N].mean()) if bool(valid_N.any()) else 0.0,
                    "reward/errors": float(self._num_errors),
                    "actor/entropy": _masked_mean(entropy_NT, mask_NT),
                    "actor/step_kl": step_kl,
                    "actor/lr": float(self.scheduler.get_last_lr()[0]),
                    "response_length/mean": float(batch["lengths"].float().mean()),
                    "response_length/clip_ratio": float(batch["truncated"].float().mean()),
                    "timing_s/rollout": rollout_time,
                    "timing_s/advantage": adv_time,
                    "timing_s/update": update_time,
                    "timing_s/step": step_time,
                    "perf/tokens_per_s": num_tokens / max(step_time, 1e-9),
                }
                if a.overlong_shaping:
                    metrics["reward/shaped_mean"] = (
                        float(reward_N[valid_N].mean()) if bool(valid_N.any()) else 0.0
                    )
                metrics.update(dynamic_metrics)
                for name, values in update_metrics.items():
                    metrics[name] = _mean(values)
                for name, value in self.estimator.metrics().items():
                    metrics[name] = float(value)

                # 7. validation, best checkpoint, periodic checkpoint
                final = self.step == run.steps
                if final or (run.eval_every and self.step % run.eval_every == 0):
                    eval_metrics = self.evaluate()
                    metrics.update(eval_metrics)
                    eval_after = eval_metrics
                    self._maybe_keep_best(eval_metrics)
                logger.log(self.step, metrics)
                history.append({"step": self.step, **metrics})
                if final or (run.save_every and self.step % run.save_every == 0):
                    self.save_checkpoint(LAST)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", maj=f"{self.best_score or 0:.3f}")
                bar.update(1)
        finally:
            bar.close()
            logger.close()
        result = TrainResult(
            run_dir=self.run_dir,
            step=self.step,
            eval_before=self.eval_before,
            eval_after=eval_after,
            best_step=self.best_step,
            best_score=self.best_score,
            history=history,
        )
        summary = {
            "run_dir": str(self.run_dir),
            "step": self.step,
            "best_step": self.best_step,
            f"best_maj@{k}": self.best_score,
            "eval_before": self.eval_before,
            "eval_after": eval_after,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
        if run.plot:
            from ebpo.trainer.plots import plot_training

            plot_training(self.run_dir / "metrics.jsonl", self.run_dir / "training.png", title=cfg.method)
        return result

    def _collect(self, rng_at_start, sampler_at_start) -> tuple[list[Group], dict[str, float]]:
        """Steps 1-3 of the loop: prompts, their G responses each, rewards; returns (groups, metrics).

        Without dynamic sampling: one batch from the sampler. With it (DAPO, SPEC 3): groups whose rewards
        are all equal are dropped and more prompts drawn, at most ``1 + algorithm.max_gen_rounds`` rounds
        (``ebpo.data.dynamic.collect_groups``, which hands the dropped groups to ``estimator.observe`` so
        EBPO's prior still sees every sampled group); a shortfall trains on the groups there are.
        """
        from ebpo.data.dynamic import DynamicSamplingConfig, collect_groups

        a = self.cfg.algorithm
        rounds = iter(range(1 << 30))

        def generate(indices: list[int]) -> list[Group]:
            return self._generate_groups(indices, next(rounds), rng_at_start, sampler_at_start)

        if not a.dynamic_sampling:
            return generate(self.sampler.next_batch()), {}
        dyn_cfg = DynamicSamplingConfig(
            batch_size=self.cfg.data.batch_size, max_rounds=1 + a.max_gen_rounds, on_shortfall="train"
        )
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the shortfall is logged as dynamic/shortfall
            result = collect_groups(self.sampler.next_batch, generate, dyn_cfg, self.estimator)
        return result.groups, result.metrics

    def _generate_groups(
        self, indices: list[int], round_number: int, rng_at_start, sampler_at_start
    ) -> list[Group]:
        """One generation round: G responses per prompt, scored (plus overlong shaping); one Group each.

        ``Group.rewards`` holds the training rewards of the group's valid samples; ``Group.data`` the
        rollout tensors, the task score, the validity mask and the record.
        """
        from ebpo.data.dynamic import Group
        from ebpo.losses import overlong_penalty

        a, G = self.cfg.algorithm, self.cfg.data.group_size
        records = [self.train_records[i] for i in indices]
        rollouts = self._rollout(records)
        answers = [rec.answer for rec in records for _ in range(G)]
        prompts = [rec.prompt for rec in records for _ in range(G)]
        score_N, valid_N, errors = self._score(rollouts.texts, answers, prompts)
        if errors and not a.skip_reward_errors:
            self._stop_on_reward_error(errors, rng_at_start, sampler_at_start)
        self._num_errors += len(errors)
        reward_N = score_N.clone()
        if a.overlong_shaping:  # DAPO soft overlong punishment, added to the task reward
            reward_N += overlong_penalty(
                rollouts.lengths, self.cfg.rollout.max_new_tokens, a.overlong_cache_len
            ).double()
        groups = []
        for m, rec in enumerate(records):
            rows = slice(m * G, (m + 1) * G)
            data = {
                "record": rec,
                "prompt_ids": rollouts.prompt_ids[rows],
                "prompt_mask": rollouts.prompt_mask[rows],
                "response_ids": rollouts.response_ids[rows],
                "response_mask": rollouts.response_mask[rows],
                "lengths": rollouts.lengths[rows],
                "truncated": rollouts.truncated[rows],
                "score": score_N[rows],
                "reward": reward_N[rows],
                "valid": valid_N[rows],
            }
            uid = rec.id if round_number == 0 else f"{rec.id}#round{round_number}"
            cluster = self.cluster_of[rec.id] if self.cluster_of is not None else None
            groups.append(Group(uid=uid, rewards=reward_N[rows][valid_N[rows]], cluster=cluster, data=data))
        return groups

    def _stop_on_reward_error(self, errors, rng_at_start, sampler_at_start) -> None:
        state = self._state(rng=rng_at_start, sampler=sampler_at_start)
        path = self.save_checkpoint(LAST, state=state)
        index, prompt, completion, message = errors[0]
        more = f" ({len(errors) - 1} more sample(s) failed too)" if len(errors) > 1 else ""
        raise RewardError(
            f"reward function {self.cfg.data.reward or self.cfg.data.task!r} raised on sample {index} of step "
            f"{self.step + 1}: {message}{more}\n  prompt: {prompt!r}\n  completion: {completion!r}\n"
            f"A checkpoint of the state before this step is at {path}; fix the reward and continue with "
            f"`ebpo train --resume {self.run_dir}`, or set algorithm.skip_reward_errors=true to mask such samples."
        )

    def _logp_in_chunks(self, model, batch, *, with_entropy: bool = False):
        """Log-probs for all rows, in micro-batches of ``optim.micro_batch_size`` rows (memory only)."""
        num_rows = batch["response_ids"].shape[0]
        size = self.cfg.optim.micro_batch_size or num_rows
        logps, ents = [], []
        for start in range(0, num_rows, size):
            rows = torch.arange(start, min(start + size, num_rows))
            logp_BT, ent_BT = forward_logp(
                model,
                self._to_device(_select(batch, rows)),
                self.cfg.rollout.temperature,
                with_entropy=with_entropy,
            )
            logps.append(logp_BT.cpu())
            if ent_BT is not None:
                ents.append(ent_BT.cpu())
        return torch.cat(logps), (torch.cat(ents) if ents else None)

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        keys = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
        return {key: batch[key].to(self.device) for key in keys}

    def _update(
        self, rows, batch, adv_N, old_logp_NT, ref_logp_NT, update_metrics, agg_loss, kl_penalty
    ) -> None:
        """One optimizer step on the mini-batch ``rows`` (split in micro-batches whose losses are weighted
        by their share of the mini-batch's tokens or sequences, so the gradient equals the whole one's)."""
        a, o = self.cfg.algorithm, self.cfg.optim
        mask_all = batch["response_mask"][rows]
        total_tokens = float(mask_all.sum().clamp(min=1))
        total_seqs = float((mask_all.sum(1) > 0).sum().clamp(min=1))
        micro = o.micro_batch_size or len(rows)
        self.optimizer.zero_grad(set_to_none=True)
        for start in range(0, len(rows), micro):
            sub = rows[start : start + micro]
            part = self._to_device(_select(batch, sub))
            mask_BT = part["response_mask"]
            logp_BT, _ = forward_logp(self.model, part, self.cfg.rollout.temperature)
            old_BT = old_logp_NT[sub].to(self.device)
            adv_B = adv_N[sub].to(self.device)
            loss, metrics = self.policy_loss(logp_BT, old_BT, adv_B, mask_BT, self.loss_cfg)
            if self.ref_model is not None:
                kl_BT = kl_penalty(logp_BT, ref_logp_NT[sub].to(self.device), a.kl_estimator)
                kl_ref = agg_loss(kl_BT, mask_BT, a.loss_agg_mode, max_len=self.cfg.rollout.max_new_tokens)
                loss = loss + a.kl_coef * kl_ref
                metrics["actor/kl_ref"] = float(kl_ref.detach())
            if a.loss_agg_mode == "token-mean":
                weight = float(mask_BT.sum()) / total_tokens
            else:
                weight = float((mask_BT.sum(1) > 0).sum()) / total_seqs
            (loss * weight).backward()
            for name, value in metrics.items():
                update_metrics[name].append(float(value))
        max_norm = o.grad_clip if o.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if not torch.isfinite(grad_norm):
            update_metrics["actor/nonfinite_grad"].append(1.0)
            self.optimizer.zero_grad(set_to_none=True)
            return
        self.optimizer.step()
        update_metrics["actor/grad_norm"].append(float(grad_norm))

    def _maybe_keep_best(self, eval_metrics: dict[str, float]) -> None:
        """The paper's rule (Appendix A): keep the checkpoint with the highest validation maj@k."""
        score = eval_metrics.get(f"eval/maj@{self.cfg.run.eval_k}")
        if score is None:
            return
        if self.best_score is None or score > self.best_score:
            self.best_score, self.best_step = score, self.step
            path = self.save_checkpoint(BEST)
            (path / "best.json").write_text(json.dumps({"step": self.step, **eval_metrics}, indent=2))


def _concat_padded(groups: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Stack per-group rollout tensors from different generation rounds (different P and T widths):
    prompts are left-padded, responses right-padded to the widest; per-row vectors are concatenated."""
    width_P = max(g["prompt_ids"].shape[1] for g in groups)
    width_T = max(g["response_ids"].shape[1] for g in groups)
    out: dict[str, list[torch.Tensor]] = defaultdict(list)
    for g in groups:
        pad_P, pad_T = width_P - g["prompt_ids"].shape[1], width_T - g["response_ids"].shape[1]
        out["prompt_ids"].append(torch.nn.functional.pad(g["prompt_ids"], (pad_P, 0), value=pad_id))
        out["prompt_mask"].append(torch.nn.functional.pad(g["prompt_mask"], (pad_P, 0), value=0))
        out["response_ids"].append(torch.nn.functional.pad(g["response_ids"], (0, pad_T), value=pad_id))
        out["response_mask"].append(torch.nn.functional.pad(g["response_mask"], (0, pad_T), value=0))
        for name in ("lengths", "truncated", "score", "reward", "valid"):
            out[name].append(g[name])
    return {name: torch.cat(values) for name, values in out.items()}


def print_eval_table(before: dict[str, float], after: dict[str, float], file=sys.stdout) -> None:
    """The before/after validation pass@1 table, one row per topic, then the overall rows."""
    topics = sorted(key.split("/", 2)[2] for key in after if key.startswith("eval/pass@1/"))
    rows = [(topic, f"eval/pass@1/{topic}") for topic in topics]
    rows += [("all (pass@1)", "eval/pass@1")]
    rows += [
        (name.split("/", 1)[1], name)
        for name in sorted(after)
        if name.startswith(("eval/maj@", "eval/pass@"))
        and name.count("/") == 1
        and name not in ("eval/pass@1", "eval/pass@1_se")
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'validation':<{width}}  {'before':>7}  {'after':>7}  {'change':>7}", file=file)
    for label, key in rows:
        b, a = before.get(key, float("nan")), after.get(key, float("nan"))
        print(f"{label:<{width}}  {b:7.3f}  {a:7.3f}  {a - b:+7.3f}", file=file)
    if "eval/pass@1_se" in before and "eval/pass@1_se" in after:
        b, a = before["eval/pass@1"], after["eval/pass@1"]
        se_b, se_a = before["eval/pass@1_se"], after["eval/pass@1_se"]
        print(
            f"validation pass@1: {b:.3f} ± {se_b:.3f} before, {a:.3f} ± {se_a:.3f} after, change {a - b:+.3f} ± "
            f"{math.hypot(se_b, se_a):.3f} (standard errors over problems; the change's treats the two "
            "evaluations as independent, which overstates it)",
            file=file,
        )
