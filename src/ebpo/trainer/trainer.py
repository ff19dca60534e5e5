"""The reference RLVR trainer: one loop that reads top to bottom (CleanRL style).

One step (``Trainer.train`` -> ``Trainer._train_step``):

1. draw ``data.batch_size`` prompts from the sampler (``ebpo.data.samplers``);
2. sample G = ``data.group_size`` responses each (``ebpo.generation.sample``, a seeded generator);
3. score them with the reward (``ebpo.rewards``); DAPO overlong shaping and dynamic sampling when set; a
   reward function that raises stops the run with a checkpoint (or, with ``algorithm.skip_reward_errors``,
   the sample is masked out and counted in ``reward/errors``);
4. one advantage per response from the estimator (``ebpo.advantages``), broadcast over its tokens
   (docs/design.md §1, step 6); a response's group id is its prompt's position in the step's batch, never the record id;
5. the old log-probs, those of the sampling policy at the rollout temperature (``ebpo.logprobs.OldLogprobs``:
   recomputed as verl's ``recompute_log_prob`` does, so the first ratio is exactly 1, or the sampler's,
   ``rollout.old_logp``) and the frozen initial policy's; then K = ``optim.epochs`` passes of shuffled
   mini-batch updates: policy loss and aggregation (``ebpo.losses``) plus ``kl_coef * agg(kl(logp,
   ref_logp))``, AdamW. Every log-prob comes from ``ebpo.logprobs.logprobs``, which picks its fast paths;
6. ``actor/step_kl`` = KL(pi_t || pi_{t+1}) (k3 on the step's tokens, ``run.step_kl``) and the step's
   metrics, logged;
7. validation every ``run.eval_every`` steps, keeping the best checkpoint by maj@k (the paper's rule for
   its topic runs, Appendix A) beside the last one.

Exact resume: a checkpoint holds the model, optimizer, scheduler, estimator, sampler and every RNG state,
so N steps, a kill, a resume and N more steps equal 2N steps in one run, bit for bit on CPU. Around the
loop: ``setup.py`` (prompts, policy, estimator and loss, optimizer), ``rollout.py`` (scored groups, the typed
batch, its advantages), ``update.py`` (the mini-batch updates), ``resume.py`` (what a resume changes),
``ebpo.logprobs`` (every log-prob pass, and why its fast paths are exact), ``checkpoint.py``,
``interrupt.py`` (Ctrl-C and SIGTERM), ``clock.py`` (the step's wall time), ``ebpo.trackers`` (``metrics.jsonl``
and the trackers), ``validation.py``,
``report.py``, ``plots.py``, and the run directory, an ``ebpo.run_directory.RunDirectory``.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ebpo.data.dynamic import Group
from ebpo.logprobs import LogprobOptions, OldLogprobs, logprobs, step_kl
from ebpo.losses import masked_mean
from ebpo.plugins import load_plugins
from ebpo.run_directory import RunDirectory
from ebpo.trackers import MetricsLogger, Status
from ebpo.trainer import checkpoint as ckpt
from ebpo.trainer import resume
from ebpo.trainer.clock import StepClock
from ebpo.trainer.config import TrainConfig
from ebpo.trainer.interrupt import StopRequest, stop_at_step_boundary
from ebpo.trainer.report import TrainResult, write_outputs
from ebpo.trainer.rollout import (
    GroupCollector,
    RewardError,
    RewardFailed,
    RewardFailure,
    RolloutBatch,
    batch_advantages,
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
from ebpo.trainer.update import minibatches, update
from ebpo.trainer.validation import validate


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
        cfg.run.plugins = load_plugins(cfg.run.plugins)  # before any name is looked up; saved resolved
        check_setup(cfg)  # names, options, files, device: before a run directory is claimed
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        self.device = resolve_device(cfg.run.device)
        if run_dir is None:
            run_dir = ckpt.resume_run_dir(resume, need_config=False) if resume is not None else None
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
        # the checkpoint's state and the keys this resume changes: other settings refused before anything loads
        state, self.changes = (
            resume.read_checkpoint(checkpoint, cfg) if checkpoint is not None else (None, {})
        )
        ckpt.seed_everything(cfg.run.seed)

        prompts = load_prompts(cfg)
        policy = load_policy(cfg, checkpoint, self.device)
        check_prompt_lengths(policy, prompts, cfg.rollout.max_new_tokens)
        self.train_records, self.val_records, self.sampler, self.reward_fn, self.cluster_of = prompts
        self.model, self.ref_model, self.tokenizer, self.base_path, self.pad_id = policy[:5]
        shared_prompts, self.prompt_format = policy.shared_prompts, policy.prompt_format
        # one seeded stream for the rollouts, the mini-batch shuffles and Clip-Cov's choice of tokens
        self.generator = torch.Generator(device="cpu").manual_seed(cfg.run.seed)
        self.estimator, self.policy_loss, self.loss_cfg = build_algorithm(cfg, self.generator)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim)
        self.rollouts = GroupCollector(
            cfg,
            self.model,
            self.tokenizer,
            prompt_format=self.prompt_format,
            records=self.train_records,
            clusters=self.cluster_of,
            sampler=self.sampler,
            reward_fn=self.reward_fn,
            generator=self.generator,
            estimator=self.estimator,
        )
        # how every log-prob pass runs (ebpo.logprobs: the fast paths by default, the exact ones as options)
        self.logprob_options = LogprobOptions(
            temperature=cfg.rollout.temperature,
            part_size=cfg.optim.micro_batch_size,
            shared_prompts=shared_prompts,
            old_logp=cfg.rollout.old_logp,
            step_kl=cfg.run.step_kl,
        )

        # progress, saved in every checkpoint beside the components' own state
        self.step = 0
        self.best_score: float | None = None
        self.best_step: int | None = None
        self.eval_before: dict[str, float] = {}
        self.eval_after: dict[str, float] = {}  # the latest validation
        self.resumed_from: Path | None = checkpoint
        self._stop: StopRequest | None = (
            None  # while train() runs: a second signal waits for a checkpoint write
        )
        if checkpoint is not None and state is not None:
            self._load_state(checkpoint, state)
        # resumed in place: its history ends where the checkpoint does; --overwrite: the old run's outputs go
        dropped = self.run.start(rewind_to=self.step if in_place else None, overwrite=overwrite)
        self.rewound = dropped > 0  # steps logged after the checkpoint: the trackers hold them too
        resume.save_run_config(self.run.path, cfg, self.step, checkpoint, self.changes)

    # -- the loop ----------------------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Run until ``run.steps``; returns the run's summary (also written to ``summary.json``). Ctrl-C or
        SIGTERM stops at the next step boundary with a checkpoint (``interrupt.Interrupted``)."""
        with stop_at_step_boundary() as stop:
            self._stop = stop
            try:
                return self._train(stop)
            finally:
                self._stop = None

    def _train(self, stop: StopRequest) -> TrainResult:
        run = self.cfg.run
        try:
            logger = MetricsLogger(
                self.run_dir,
                run.report_to,
                config=self.cfg.to_dict(),
                resumed_at=self.step if self.resumed_from else None,
                rewound=self.rewound,
            )
        except BaseException:
            self.run.release()
            raise
        status: Status = "failed"
        bar = tqdm(
            total=run.steps,
            initial=self.step,
            desc=self.cfg.method,
            disable=not run.progress,
            dynamic_ncols=True,
        )
        history = []
        try:
            if self.resumed_from is None:  # step 0: validation before training
                self.eval_before = self.eval_after = self.evaluate()
                logger.log(0, self.eval_before)  # before the best checkpoint, which a resume may start from
                self._keep_if_best(self.eval_before)
            while self.step < run.steps:
                if stop.requested:  # Ctrl-C or SIGTERM meanwhile: a checkpoint here, then stop
                    raise stop.interrupted(self.step, self.save_checkpoint(ckpt.LAST))
                metrics = self._train_step()  # 1-6: rollouts, rewards, advantages, updates
                self.step += 1
                # 7. validation (keeping the best checkpoint by maj@k), the metrics line, the periodic checkpoint
                final = self.step == run.steps
                evaluated = final or bool(run.eval_every and self.step % run.eval_every == 0)
                if evaluated:
                    self.eval_after = self.evaluate()
                    metrics.update(self.eval_after)
                # the step's line first: a run stopped after the best checkpoint below resumes from it with
                # every line up to its step
                logger.log(self.step, metrics)
                if evaluated:
                    self._keep_if_best(self.eval_after)
                history.append({"step": self.step, **metrics})
                if final or (run.save_every and self.step % run.save_every == 0):
                    self.save_checkpoint(ckpt.LAST)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", maj=f"{self.best_score or 0:.3f}")
                bar.update(1)
            bar.close()
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
            write_outputs(self.run, result, self.cfg, logger)
            status = "finished"
        except KeyboardInterrupt:
            status = "killed"
            raise
        finally:
            bar.close()
            logger.close(status)
            self.run.release()
        return result

    def _train_step(self) -> dict[str, float]:
        """Steps 1-6 of the module docstring; returns the step's metrics."""
        options, clock = self.logprob_options, StepClock()
        with clock("rollout"):  # 1-3. prompts -> G responses each -> rewards
            groups, rollout_metrics = self._collect()
            batch = RolloutBatch.concat([g.data for g in groups], self.pad_id)
        with clock("advantage"):  # 4. one advantage per response
            G, clustered = self.cfg.data.group_size, self.cluster_of is not None
            adv_B = batch_advantages(self.estimator, batch, groups, G, clustered=clustered)
        with clock("update"):  # 5. old and reference log-probs, then K epochs of mini-batch updates
            rows_per_update = self.cfg.optim.mini_batch_size * self.cfg.data.group_size
            order_B = torch.randperm(batch.num_rows, generator=self.generator)  # the first epoch's order
            first, others = order_B[:rows_per_update], order_B[rows_per_update:]
            old = OldLogprobs.at_sampling(
                self.model, batch.tokens, options, first_update=first, others=others, sampled=batch.sampled
            )
            ref_logp_BT = self._reference_logprobs(batch)
            update_metrics: dict[str, list[float]] = defaultdict(list)
            policy = (self.model, self.optimizer, self.policy_loss, self.loss_cfg)
            for rows in minibatches(order_B, rows_per_update, self.cfg.optim.epochs, self.generator):
                step = update(*policy, batch, rows, adv_B, old, ref_logp_BT, self.cfg, options, self.device)
                for name, values in step.items():
                    update_metrics[name].extend(values)
            self.scheduler.step()
            # 6. KL(pi_t || pi_t+1) on the step's tokens, and the step's metrics
            kl = step_kl(self.model, batch.tokens, old.logp_BT, options, batch.num_rows // rows_per_update)
        metrics = {
            **rollout_metrics,
            **batch.metrics(shaped=self.cfg.algorithm.overlong_shaping),
            "actor/entropy": float(masked_mean(old.entropy_BT, batch.response_mask_BT)),
            "actor/lr": float(self.scheduler.get_last_lr()[0]),
            **({} if kl is None else {"actor/step_kl": kl}),
            **{name: sum(values) / len(values) for name, values in update_metrics.items()},
            **{name: float(value) for name, value in self.estimator.metrics().items()},
        }
        tokens = int(batch.prompt_mask_BP.sum() + batch.response_mask_BT.sum())
        return {**metrics, **clock.metrics(tokens)}

    def _collect(self) -> tuple[list[Group], dict[str, float]]:
        """Steps 1-3 (``rollout.GroupCollector``). A failed reward stops the run with a checkpoint of the state
        before this step (``RewardError``), unless ``algorithm.skip_reward_errors``."""
        at_start = (ckpt.rng_state(self.generator), copy.deepcopy(self.sampler.state_dict()))
        try:
            return self.rollouts.collect()
        except RewardFailed as failed:
            raise self._reward_error(failed.failures, *at_start) from None

    def _reward_error(self, failures: list[RewardFailure], rng: dict, sampler: dict) -> RewardError:
        path = self.save_checkpoint(ckpt.LAST, state=self._state(rng=rng, sampler=sampler))
        reward = self.cfg.data.reward or self.cfg.data.task
        return RewardError.stopped(
            failures, reward=reward, step=self.step + 1, checkpoint=path, run_dir=self.run_dir
        )

    def _reference_logprobs(self, batch: RolloutBatch) -> Tensor | None:
        """The frozen initial policy's log-probs, for the KL penalty; None without one (``kl_coef`` 0)."""
        if self.ref_model is None:
            return None
        with torch.no_grad():
            return logprobs(self.ref_model, batch.tokens, self.logprob_options).logp_BT

    # -- validation and checkpoints ----------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """Validation metrics of the current policy (``ebpo.trainer.validation.validate``)."""
        return validate(
            self.model,
            self.tokenizer,
            self.val_records,
            self.reward_fn,
            self.cfg,
            prompt_format=self.prompt_format,
        )

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
        """Write ``checkpoints/<name>`` so that a kill at any moment leaves a complete one; returns its path.
        During :meth:`train` a second Ctrl-C or SIGTERM waits for the write to finish (``StopRequest.deferred``)."""
        state = state if state is not None else self._state()
        with self._stop.deferred() if self._stop is not None else contextlib.nullcontext():
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
            "config": resume.as_saved(self.cfg).to_dict(),  # what a resume compares its settings with
        }

    def _load_state(self, checkpoint: Path, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        components = (self.optimizer, self.scheduler, self.estimator, self.sampler)
        resume.load_components(state, checkpoint, self.changes, self.cfg, *components)
        ckpt.load_rng_state(state["rng"], self.generator)
        self.best_score, self.best_step = state["best_score"], state["best_step"]
        self.eval_before = state.get("eval_before", {})
        self.eval_after = state.get("eval_after", {})  # absent from checkpoints written before it was saved
