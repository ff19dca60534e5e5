"""The reference RLVR trainer: one loop that reads top to bottom (CleanRL style).

One step (``Trainer.train`` -> ``Trainer._train_step``):

1. draw ``data.batch_size`` prompts from the sampler (``ebpo.data.samplers``);
2. sample G = ``data.group_size`` responses each (``ebpo.generation.sample``, a seeded generator);
3. score them with the reward (``ebpo.rewards``); DAPO overlong shaping and dynamic sampling when set; a
   reward function that raises stops the run with a checkpoint (or, with ``algorithm.skip_reward_errors``,
   the sample is masked out and counted in ``reward/errors``);
4. one advantage per response from the estimator (``ebpo.advantages``), broadcast over its tokens
   (docs/design.md §1, step 6); a response's group id is its prompt's position in the step's batch, never the record id;
5. old log-probs recomputed at the rollout temperature (verl's ``recompute_log_prob``: the first ratio is
   exactly 1; the first update's own forward serves its rows), or the sampler's (``rollout.old_logp``),
   then K = ``optim.epochs`` passes of shuffled mini-batch updates: policy loss and aggregation
   (``ebpo.losses``) plus ``kl_coef * agg(kl(logp, ref_logp))`` to the frozen initial policy, AdamW;
6. ``actor/step_kl`` = KL(pi_t || pi_{t+1}) (k3 on the step's tokens, ``run.step_kl``) and the step's
   metrics, logged;
7. validation every ``run.eval_every`` steps, keeping the best checkpoint by maj@k (the paper's rule for
   its topic runs, Appendix A) beside the last one.

Exact resume: a checkpoint holds the model, optimizer, scheduler, estimator, sampler and every RNG state,
so N steps, a kill, a resume and N more steps equal 2N steps in one run, bit for bit on CPU. Around the
loop: ``setup.py`` (prompts, policy, estimator and loss, optimizer), ``rollout.py`` (scored groups, the typed
batch, log-probs), ``checkpoint.py``, ``metrics_log.py``, ``validation.py``, ``report.py``, ``plots.py``, and
the run directory, an ``ebpo.persist.RunDirectory``.
"""

from __future__ import annotations

import copy
import json
import time
import warnings
from collections import defaultdict
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ebpo.data.dynamic import DynamicSamplingConfig, Group, collect_groups
from ebpo.losses import agg_loss, kl_penalty, masked_mean
from ebpo.persist import RunDirectory
from ebpo.trainer import checkpoint as ckpt
from ebpo.trainer.config import TrainConfig, save_config
from ebpo.trainer.metrics_log import MetricsLogger
from ebpo.trainer.plots import plot_training
from ebpo.trainer.report import TrainResult, summary
from ebpo.trainer.rollout import (
    RewardFailure,
    RolloutBatch,
    batched_logp,
    forward_logp,
    generate_groups,
    reward_counters,
)
from ebpo.trainer.setup import (
    build_algorithm,
    build_optimizer,
    check_prompt_lengths,
    check_setup,
    load_policy,
    load_prompts,
    resolve_device,
)
from ebpo.trainer.validation import validate

StepStart = tuple[dict[str, Any], dict[str, Any]]
"""The RNG and sampler states at the start of a step: what a checkpoint written on a reward error holds."""


class RewardError(RuntimeError):
    """A reward function raised on a sample; a checkpoint was written before this was raised."""


class Trainer:
    """EBPO / GRPO / Dr. GRPO / DAPO / EntropyMech / RLOO / JSPO training on one device.

    Args:
        cfg: the configuration (validated here again).
        run_dir: where to write; default ``<run.out_dir>/<run.name or timestamp-method>``.
        resume: a run directory (or its ``checkpoints/last``) to continue exactly.
        overwrite: replace the outputs of a run already in ``run_dir`` (otherwise that is refused).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: str | Path | None = None,
        resume: str | Path | None = None,
        *,
        overwrite: bool = False,
    ) -> None:
        self.cfg = cfg.validate()
        check_setup(cfg)  # names, options, files, device: before a run directory is claimed
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        self.device = resolve_device(cfg.run.device)
        if run_dir is None:
            run_dir = ckpt.run_dir_of(resume) if resume is not None else None
        if run_dir is None:
            run_dir = Path(cfg.run.out_dir) / (cfg.run.name or RunDirectory.timestamped(cfg.method))
        # one process per run directory, from here to the end of train(): a second `ebpo train --resume`
        # or `--overwrite` of a running run is one line, not two processes writing the same checkpoints
        self.run = RunDirectory(run_dir).claim()
        self.run_dir = self.run.path
        try:
            self._setup(cfg, ckpt.find_checkpoint(resume) if resume is not None else None, overwrite)
        except BaseException:
            self.run.abandon()  # a run refused at setup leaves no lock and no empty directory behind
            raise

    def _setup(self, cfg: TrainConfig, checkpoint: Path | None, overwrite: bool) -> None:
        in_place = checkpoint is not None and self.run.holds(checkpoint)
        self.run.check(resuming=in_place, overwrite=overwrite)
        ckpt.seed_everything(cfg.run.seed)

        prompts = load_prompts(cfg)
        policy = load_policy(cfg, checkpoint, self.device)
        check_prompt_lengths(policy, prompts, cfg.rollout.max_new_tokens)
        self.train_records, self.val_records, self.sampler, self.reward_fn, self.cluster_of = prompts
        self.model, self.ref_model, self.tokenizer, self.base_path, self.pad_id = policy
        # one seeded stream for the rollouts, the mini-batch shuffles and Clip-Cov's choice of tokens
        self.generator = torch.Generator(device="cpu").manual_seed(cfg.run.seed)
        self.estimator, self.policy_loss, self.loss_cfg = build_algorithm(cfg, self.generator)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim)
        # log-probs without gradient (old, reference and step-KL passes), in parts of optim.micro_batch_size rows
        self._logp = partial(
            batched_logp,
            temperature=cfg.rollout.temperature,
            device=self.device,
            part_size=cfg.optim.micro_batch_size,
            shared_prompts=cfg.optim.shared_prompts,
        )

        # progress, saved in every checkpoint beside the components' own state
        self.step = 0
        self.best_score: float | None = None
        self.best_step: int | None = None
        self.eval_before: dict[str, float] = {}
        self.eval_after: dict[str, float] = {}  # the latest validation
        self.resumed_from: Path | None = checkpoint
        if checkpoint is not None:
            self._load_state(checkpoint)
        # resumed in place: its history ends where the checkpoint does; --overwrite: the old run's outputs go
        self.run.start(rewind_to=self.step if in_place else None, overwrite=overwrite)
        save_config(cfg, self.run.path / RunDirectory.CONFIG)

    # -- the loop ----------------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Run until ``run.steps``; returns the run's summary (also written to ``summary.json``)."""
        run = self.cfg.run
        logger = MetricsLogger(self.run_dir, purge_after=self.step if self.resumed_from else None)
        if self.resumed_from is None:  # step 0: validation before training
            self.eval_before = self.eval_after = self.evaluate()
            self._keep_if_best(self.eval_before)
            logger.log(0, self.eval_before)
        bar = tqdm(
            total=run.steps,
            initial=self.step,
            desc=self.cfg.method,
            disable=not run.progress,
            dynamic_ncols=True,
        )
        history = []
        try:
            while self.step < run.steps:
                metrics = self._train_step()  # 1-6: rollouts, rewards, advantages, updates
                self.step += 1
                # 7. validation (keeping the best checkpoint by maj@k), the metrics line, the periodic checkpoint
                final = self.step == run.steps
                if final or (run.eval_every and self.step % run.eval_every == 0):
                    self.eval_after = self.evaluate()
                    metrics.update(self.eval_after)
                    self._keep_if_best(self.eval_after)
                logger.log(self.step, metrics)
                history.append({"step": self.step, **metrics})
                if final or (run.save_every and self.step % run.save_every == 0):
                    self.save_checkpoint(ckpt.LAST)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", maj=f"{self.best_score or 0:.3f}")
                bar.update(1)
        finally:
            bar.close()
            logger.close()
            self.run.release()
        # also reached by resuming a finished run (or one killed before it wrote these): the summary comes
        # from the checkpoint's progress, not from this call's history
        result = TrainResult(
            run_dir=self.run_dir,
            step=self.step,
            eval_before=self.eval_before,
            eval_after=self.eval_after,
            best_step=self.best_step,
            best_score=self.best_score,
            history=history,
        )
        self.run.write_summary(summary(result, eval_k=run.eval_k))
        if run.plot:
            plot_training(
                self.run.path / RunDirectory.METRICS, self.run.path / RunDirectory.PLOT, title=self.cfg.method
            )
        return result

    def _train_step(self) -> dict[str, float]:
        """Steps 1-6 of the loop; returns the step's metrics."""
        o, G = self.cfg.optim, self.cfg.data.group_size
        step_start = time.perf_counter()
        at_start: StepStart = (ckpt.rng_state(self.generator), copy.deepcopy(self.sampler.state_dict()))

        # 1-3. prompts -> G responses each -> rewards (DAPO overlong shaping and dynamic sampling if set)
        t0 = time.perf_counter()
        counters_before = reward_counters(self.reward_fn)
        groups, rollout_metrics = self._collect(at_start)
        batch = RolloutBatch.concat([g.data for g in groups], self.pad_id)
        rollout_time = time.perf_counter() - t0

        # 4. advantages over the valid samples (a failed reward: advantage 0 and no tokens); group id =
        # the prompt's position in this batch
        t0 = time.perf_counter()
        valid_rows = torch.nonzero(batch.valid_B).flatten()
        group_B = torch.arange(batch.num_rows) // G
        cluster = None
        if self.cluster_of is not None:
            cluster_B = [g.cluster for g in groups for _ in range(G)]
            cluster = [cluster_B[i] for i in valid_rows.tolist()]
        adv_B = torch.zeros(batch.num_rows, dtype=torch.float32)
        adv_B[valid_rows] = self.estimator(
            batch.reward_B[valid_rows], group_B[valid_rows], cluster=cluster
        ).float()
        adv_time = time.perf_counter() - t0

        # 5. old log-probs and entropy (recomputed, or the sampler's), reference log-probs; then K epochs of
        # shuffled mini-batches. Recomputed: the step's first update runs its forward at the sampling
        # policy, so its rows' old log-probs and entropies are taken from that forward (a row's numbers do
        # not depend on the other rows of a forward, and the forward with gradient gives the pass's numbers
        # to the bit on the CPU, docs/training.md "Speed"), and the pass covers the other rows.
        t0 = time.perf_counter()
        rows_per_update = o.mini_batch_size * G
        order_B = torch.randperm(batch.num_rows, generator=self.generator)
        other_rows = order_B[rows_per_update:]  # the first update's rows are order_B[:rows_per_update]
        recompute = self.cfg.rollout.old_logp == "recompute"
        if recompute:
            old_logp_BT = torch.zeros(batch.response_ids_BT.shape, dtype=torch.float32)
            entropy_BT = torch.zeros(batch.response_ids_BT.shape, dtype=torch.float32)
        else:
            assert batch.sampler_logp_BT is not None and batch.sampler_entropy_BT is not None  # sampled so
            old_logp_BT, entropy_BT = batch.sampler_logp_BT, batch.sampler_entropy_BT
        with torch.no_grad():
            if recompute and len(other_rows):
                old_logp_BT[other_rows], entropy_rest_BT = self._logp(
                    self.model, batch.select(other_rows), with_entropy=True
                )
                assert entropy_rest_BT is not None  # asked for with_entropy
                entropy_BT[other_rows] = entropy_rest_BT
            ref_logp_BT = self._logp(self.ref_model, batch)[0] if self.ref_model is not None else None
        update_metrics: dict[str, list[float]] = defaultdict(list)
        for epoch in range(o.epochs):
            if epoch > 0:
                order_B = torch.randperm(batch.num_rows, generator=self.generator)
            for start in range(0, batch.num_rows, rows_per_update):
                rows = order_B[start : start + rows_per_update]
                ref_BT = ref_logp_BT[rows] if ref_logp_BT is not None else None
                first = recompute and epoch == 0 and start == 0
                old_BT = None if first else old_logp_BT[rows]
                part_metrics, sampled = self._update(batch.select(rows), adv_B[rows], old_BT, ref_BT)
                if sampled is not None:  # the first update: its forward gave the old log-probs
                    old_logp_BT[rows], entropy_BT[rows] = sampled
                for name, values in part_metrics.items():
                    update_metrics[name].extend(values)
        self.scheduler.step()

        # 6. KL(pi_t || pi_{t+1}) on the step's tokens (run.step_kl): k3 with samples from pi_t
        # (kl_penalty(p, q) estimates KL(p || q) from samples of p)
        step_kl = self._step_kl(batch, old_logp_BT, batch.num_rows // rows_per_update)
        mask_BT = batch.response_mask_BT
        update_time = time.perf_counter() - t0
        step_time = time.perf_counter() - step_start

        valid_B = batch.valid_B
        counters = reward_counters(self.reward_fn)  # per step: this step's samples only, not validation's
        metrics = {name: value - counters_before.get(name, 0.0) for name, value in counters.items()}
        metrics.update(rollout_metrics)
        metrics.update(
            {
                "reward/mean": float(batch.score_B[valid_B].mean()) if bool(valid_B.any()) else 0.0,
                "actor/entropy": float(masked_mean(entropy_BT, mask_BT)),
                "actor/lr": float(self.scheduler.get_last_lr()[0]),
                "response_length/mean": float(batch.lengths_B.float().mean()),
                "response_length/clip_ratio": float(batch.truncated_B.float().mean()),
                "timing_s/rollout": rollout_time,
                "timing_s/advantage": adv_time,
                "timing_s/update": update_time,
                "timing_s/step": step_time,
                "perf/tokens_per_s": int(batch.prompt_mask_BP.sum() + mask_BT.sum()) / max(step_time, 1e-9),
            }
        )
        if step_kl is not None:
            metrics["actor/step_kl"] = step_kl
        if self.cfg.algorithm.overlong_shaping:
            metrics["reward/shaped_mean"] = (
                float(batch.reward_B[valid_B].mean()) if bool(valid_B.any()) else 0.0
            )
        metrics.update({name: sum(values) / len(values) for name, values in update_metrics.items()})
        metrics.update({name: float(value) for name, value in self.estimator.metrics().items()})
        return metrics

    def _collect(self, at_start: StepStart) -> tuple[list[Group], dict[str, float]]:
        """Steps 1-3: prompts, their G responses each, rewards; returns (groups, metrics).

        Without dynamic sampling: one batch from the sampler. With it (DAPO, docs/design.md §3): groups whose rewards
        are all equal are dropped and more prompts drawn, at most ``1 + algorithm.max_gen_rounds`` rounds
        (``ebpo.data.dynamic.collect_groups``, which hands the dropped groups to ``estimator.observe`` so
        EBPO's prior still sees every sampled group); a shortfall trains on the groups there are.
        """
        a = self.cfg.algorithm
        uids = count()  # unique group ids across the step's rounds (collect_groups checks), not record ids
        num_failed = 0

        def generate(indices: list[int]) -> list[Group]:
            nonlocal num_failed
            records = [self.train_records[i] for i in indices]
            clusters = [self.cluster_of[i] for i in indices] if self.cluster_of is not None else None
            groups, failures = generate_groups(
                self.model,
                self.tokenizer,
                records,
                clusters,
                uids,
                cfg=self.cfg,
                generator=self.generator,
                reward_fn=self.reward_fn,
            )
            if failures and not a.skip_reward_errors:
                self._stop_on_reward_error(failures, at_start)
            num_failed += len(failures)
            return groups

        if a.dynamic_sampling:
            dynamic = DynamicSamplingConfig(
                batch_size=self.cfg.data.batch_size, max_rounds=1 + a.max_gen_rounds, on_shortfall="train"
            )
            with warnings.catch_warnings():  # a shortfall is logged as dynamic/shortfall, not warned about
                warnings.simplefilter("ignore", RuntimeWarning)
                result = collect_groups(self.sampler.next_batch, generate, dynamic, self.estimator)
            groups, metrics = result.groups, result.metrics
        else:
            groups, metrics = generate(self.sampler.next_batch()), {}
        return groups, {**metrics, "reward/errors": float(num_failed)}

    def _stop_on_reward_error(self, failures: list[RewardFailure], at_start: StepStart) -> None:
        rng, sampler = at_start
        path = self.save_checkpoint(ckpt.LAST, state=self._state(rng=rng, sampler=sampler))
        first = failures[0]
        more = f" ({len(failures) - 1} more sample(s) failed too)" if len(failures) > 1 else ""
        raise RewardError(
            f"reward function {self.cfg.data.reward or self.cfg.data.task!r} raised on sample {first.index} of "
            f"step {self.step + 1}: {first.message}{more}\n  prompt: {first.prompt!r}\n  completion: "
            f"{first.completion!r}\nA checkpoint of the state before this step is at {path}; fix the reward and "
            f"continue with `ebpo train --resume {self.run_dir}`, or set algorithm.skip_reward_errors=true to "
            "mask such samples."
        )

    def _step_kl(self, batch: RolloutBatch, old_logp_BT: Tensor, stride: int) -> float | None:
        """``actor/step_kl`` per ``run.step_kl``: the k3 estimate of KL(pi_t || pi_t+1) over every response
        token of the step (``all``), over those of every ``stride``-th row (``subset``: rows fixed by their
        place in the batch, not by the updates' shuffle, so that no update's rows weigh more), or None."""
        scope = self.cfg.run.step_kl
        if scope == "none":
            return None
        if scope == "subset":
            rows = slice(0, batch.num_rows, max(1, stride))
            batch, old_logp_BT = batch.select(rows), old_logp_BT[rows]
        with torch.no_grad():
            new_logp_BT, _ = self._logp(self.model, batch)
        return float(masked_mean(kl_penalty(old_logp_BT, new_logp_BT, "k3"), batch.response_mask_BT))

    def _update(
        self, mini: RolloutBatch, adv_B: Tensor, old_logp_BT: Tensor | None, ref_logp_BT: Tensor | None
    ) -> tuple[dict[str, list[float]], tuple[Tensor, Tensor] | None]:
        """One optimizer step on a mini-batch, in parts of ``optim.micro_batch_size`` rows whose losses are
        weighted by their share of the mini-batch's tokens (token-mean) or sequences, so that for the vanilla
        loss the gradient equals the whole mini-batch's.

        ``old_logp_BT`` None: the policy has not been updated since it sampled these rows (the step's first
        update), so each forward's own log-probs, detached, are the old ones; they are returned with their
        entropies as ``(old_logp_BT, entropy_BT)`` on the CPU (else None). Returns each metric's values, one
        per part, and those log-probs."""
        a, o = self.cfg.algorithm, self.cfg.optim
        total_tokens = float(mini.response_mask_BT.sum().clamp(min=1))
        total_seqs = float((mini.response_mask_BT.sum(1) > 0).sum().clamp(min=1))
        size = o.micro_batch_size or mini.num_rows
        metrics: dict[str, list[float]] = defaultdict(list)
        sampled_logps, sampled_entropies = [], []
        self.optimizer.zero_grad(set_to_none=True)
        for start in range(0, mini.num_rows, size):
            part = slice(start, start + size)
            inputs = mini.select(part).model_inputs(self.device)
            mask_BT = inputs["response_mask"]
            logp_BT, entropy_BT = forward_logp(
                self.model,
                inputs,
                self.cfg.rollout.temperature,
                with_entropy=old_logp_BT is None,
                shared_prompts=o.shared_prompts,
            )
            if old_logp_BT is None:
                assert entropy_BT is not None  # asked for with_entropy
                old_BT = logp_BT.detach()
                sampled_logps.append(old_BT.cpu())
                sampled_entropies.append(entropy_BT.cpu())
            else:
                old_BT = old_logp_BT[part].to(self.device)
            part_adv_B = adv_B[part].to(self.device)
            loss, part_metrics = self.policy_loss(logp_BT, old_BT, part_adv_B, mask_BT, self.loss_cfg)
            if ref_logp_BT is not None:
                kl_BT = kl_penalty(logp_BT, ref_logp_BT[part].to(self.device), a.kl_estimator)
                kl_ref = agg_loss(kl_BT, mask_BT, a.loss_agg_mode, max_len=self.cfg.rollout.max_new_tokens)
                loss = loss + a.kl_coef * kl_ref
                part_metrics["actor/kl_ref"] = float(kl_ref.detach())
            if a.loss_agg_mode == "token-mean":
                weight = float(mask_BT.sum()) / total_tokens
            else:
                weight = float((mask_BT.sum(1) > 0).sum()) / total_seqs
            (loss * weight).backward()
            for name, value in part_metrics.items():
                metrics[name].append(float(value))
        max_norm = o.grad_clip if o.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            metrics["actor/grad_norm"].append(float(grad_norm))
        else:  # skip the update; the step's metrics say so
            metrics["actor/nonfinite_grad"].append(1.0)
            self.optimizer.zero_grad(set_to_none=True)
        sampled = (torch.cat(sampled_logps), torch.cat(sampled_entropies)) if sampled_logps else None
        return metrics, sampled

    # -- validation and checkpoints ----------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Validation metrics of the current policy (``ebpo.trainer.validation.validate``)."""
        return validate(self.model, self.tokenizer, self.val_records, self.reward_fn, self.cfg)

    def _keep_if_best(self, eval_metrics: dict[str, float]) -> None:
        """The paper's rule for its topic runs (Appendix A): keep the checkpoint with the highest validation
        maj@k. (Its curriculum runs report the final checkpoint, ``checkpoints/last``.)"""
        score = eval_metrics.get(f"eval/maj@{self.cfg.run.eval_k}")
        if score is not None and (self.best_score is None or score > self.best_score):
            self.best_score, self.best_step = score, self.step
            info = json.dumps({"step": self.step, **eval_metrics}, indent=2)
            self.save_checkpoint(ckpt.BEST, extra_files={"best.json": info})

    def save_checkpoint(
        self, name: str = ckpt.LAST, state: dict | None = None, extra_files: dict | None = None
    ) -> Path:
        """Write ``checkpoints/<name>`` so that a kill at any moment leaves a complete one; returns its path."""
        state = state if state is not None else self._state()
        return ckpt.save_checkpoint(self.run_dir, name, self.model, self.tokenizer, state, extra_files)

    def _state(self, rng: dict | None = None, sampler: dict | None = None) -> dict[str, Any]:
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "estimator": self.estimator.state_dict(),
            "sampler": sampler if sampler is not None else self.sampler.state_dict(),
            "rng": rng if rng is not None else ckpt.rng_state(self.generator),
            "best_score": self.best_score,
            "best_step": self.best_step,
            "eval_before": self.eval_before,
            "eval_after": self.eval_after,
            "base_path": str(self.base_path),
        }

    def _load_state(self, checkpoint: Path) -> None:
        state = ckpt.load_trainer_state(checkpoint)
        self.step = int(state["step"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.estimator.load_state_dict(state["estimator"])
        self.sampler.load_state_dict(state["sampler"])
        ckpt.load_rng_state(state["rng"], self.generator)
        self.best_score, self.best_step = state["best_score"], state["best_step"]
        self.eval_before = state.get("eval_before", {})
        self.eval_after = state.get("eval_after", {})  # absent from checkpoints written before it was saved
