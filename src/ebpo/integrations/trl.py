"""EBPO inside TRL (>=1.16,<2): ``EBPOConfig`` and ``EBPOTrainer`` (a ``GRPOTrainer`` subclass).

What changes against ``GRPOTrainer`` (and nothing else does):

- Advantages (training only; evaluation keeps GRPO's): after ``GRPOTrainer._generate_and_score_completions``
  has gathered every process's rewards (``_calculate_rewards``), the sequence reward of completion i is
  r_i = sum_k w_k * reward_k(i) (TRL's weighted sum; a completion no reward function scored gets advantage 0,
  as in TRL), the group of i is its block of ``num_generations`` consecutive rows (TRL's layout), and the
  advantages are the registry's: ``ebpo.get_estimator(advantage_estimator, **options)(r, group, cluster)``.
  Every process feeds the same gathered rewards to its own estimator, so the state stays identical across
  processes without communication. This process's slice replaces ``output["advantages"]``.
- Metrics: ``est.metrics()`` (``ebpo/mu_glob``, ``ebpo/sigma2``, ``ebpo/tau2``, ``ebpo/shrinkage``,
  ``groups/all_fail``, ...) are logged with TRL's training metrics at every logging step.
- Checkpoints: the estimator state (and the prompt stream's cursor) is written as ``ebpo_estimator.pt`` in each
  ``checkpoint-N`` directory, before TRL's own files (so neither a kill nor a hub push can leave a checkpoint
  without it), by the processes that write checkpoints (``args.should_save``), through a temporary file of
  its own; ``trainer.train(resume_from_checkpoint=...)`` restores it, or warns in one line that the prior
  starts empty when the checkpoint has none. A resumed TRL run regenerates the block its dataloader serves at
  the checkpoint (``GRPOTrainer._prepare_inputs`` finds no buffer): if the prior already holds that block's
  rewards, the prior from before them is saved (see ``EBPOTrainer._estimator_state_to_save``).
- Prompt order: ``prompt_sampler="topic"`` / ``"difficulty"`` replaces ``RepeatSampler``'s shuffle with
  ``ebpo.data.samplers``' topic-coherent or easy-to-hard stream, keeping its structure (each prompt repeated
  ``num_generations`` times in a row, each generation batch replayed ``num_iterations * steps_per_generation``
  times). A streaming ``IterableDataset`` takes no sampler, so those two orders refuse it.
- Nothing silently ignored: ``EBPOConfig`` refuses the settings this trainer would not honour (one line each,
  naming the field and the fix), and training stops if TRL scored a batch without calling the reward hook.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

import torch
import trl
from trl import GRPOConfig, GRPOTrainer

import ebpo
from ebpo.advantages import EBPOOptions
from ebpo.advantages.checks import OptionError
from ebpo.data.samplers import IndexStream, StreamSampler, get_sampler, list_samplers
from ebpo.integrations import ESTIMATOR_STATE_FILE
from ebpo.persist import load_torch, save_torch_atomic
from ebpo.plugins import load_plugins
from ebpo.registry import check_choice

logger = logging.getLogger(__name__)

__all__ = ["ESTIMATOR_STATE_FILE", "EBPOConfig", "EBPOTrainer", "reward_function"]


def reward_function(name: str) -> Any:
    """A TRL reward function (``reward_funcs=``) that scores with ebpo's reward ``name`` (``ebpo.rewards``, e.g.
    ``arith``, ``math``, ``gym``) against the dataset's ``answer`` column; a conversational completion (a list of
    messages) is scored on its last message, the assistant's. An unknown name raises ``ValueError``. TRL logs
    it as ``rewards/<name>/...``."""
    from ebpo.rewards import get_reward

    scorer = get_reward(name)

    def reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return scorer.batch(texts, answer)

    reward.__name__ = name
    return reward


@contextmanager
def _blame(where: str) -> Iterator[None]:
    """Re-raise a ValueError or TypeError from the block as one ValueError line starting with ``where``."""
    try:
        yield
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


@dataclass
class EBPOConfig(GRPOConfig, EBPOOptions):
    """``GRPOConfig`` plus EBPO's options (docs/design.md §1, §2 and §4). All other fields are TRL's.

    EBPO's options are the fields of :class:`ebpo.advantages.EBPOOptions` (``prior_scope``, ``prior_memory``,
    ``tau2``, ``sigma2``, ``normalize``, ...), declared there once with their help; none shares a name with a
    ``GRPOConfig`` field. The paper's settings map to: ``learning_rate=1e-6``, ``beta=0.001`` (TRL's KL is the
    k3 estimator), ``num_generations=4``, ``loss_type="grpo"``; EBPO-naive / -topic / -diff =
    ``prompt_sampler`` ``random`` / ``topic`` / ``difficulty``.
    """

    advantage_estimator: str = field(
        default="ebpo",
        metadata={
            "help": "Advantage estimator from ebpo's registry (`ebpo.list_estimators()`): `ebpo` (default, "
            "the paper's Empirical Bayes baseline), `grpo`, `dr_grpo`, `rloo`, `reinforce_pp_baseline`, `jspo`, "
            "or one of yours (`plugins`). Replaces GRPOTrainer's advantages during training; `scale_rewards` is "
            "then unused."
        },
    )
    plugins: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Your own code to import before the options are checked: .py files or importable modules "
            "that register estimators (`ebpo.register_estimator`); installed packages' `ebpo.plugins` entry "
            "points are always loaded (docs/extending.md)."
        },
    )
    cluster_column: str | None = field(
        default=None,
        metadata={
            "help": "Dataset column holding each prompt's cluster key (topic or difficulty bucket), passed to "
            "the estimator as `cluster`. Default: `topic` when `prior_scope='cluster'`, else unused."
        },
    )
    prompt_sampler: str = field(
        default="random",
        metadata={
            "help": "Order of training prompts: `random` (TRL's RepeatSampler, the paper's EBPO-naive), `topic` "
            "(topic-coherent batches, EBPO-topic; needs `topic_column`) or `difficulty` (easy-to-hard "
            "curriculum by base-model pass rate, EBPO-diff; needs `difficulty_column`)."
        },
    )
    topic_column: str = field(
        default="topic", metadata={"help": "Dataset column with the topic label (`prompt_sampler='topic'`)."}
    )
    difficulty_column: str = field(
        default="difficulty",
        metadata={
            "help": "Dataset column with the base-model pass rate in [0, 1] (`prompt_sampler='difficulty'`)."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self._validate_ebpo_options()
        if self.cluster_column is None and self.prior_scope == "cluster":
            self.cluster_column = "topic"

    def _validate_ebpo_options(self) -> None:
        """Reject bad options now, before any model loads, by asking the code that will use them (the
        registries and EBPO's options): one line naming the EBPOConfig field and the fix. The plugins are
        imported first (their names kept resolved: files absolute)."""
        with _blame("EBPOConfig.plugins"):
            self.plugins = load_plugins(self.plugins)
        with _blame("EBPOConfig.advantage_estimator"):
            ebpo.get_estimator(self.advantage_estimator)
        with _blame("EBPOConfig.prompt_sampler"):
            check_choice("sampler", self.prompt_sampler, list_samplers())
        try:  # GRPOConfig.__post_init__ does not chain to EBPOOptions': EBPO's options are checked here
            EBPOOptions.check(self)
        except OptionError as error:
            raise ValueError(f"EBPOConfig.{error.option}: {error}") from None
        if self.advantage_estimator != "ebpo":
            changed = [f.name for f in fields(EBPOOptions) if str(getattr(self, f.name)) != str(f.default)]
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} set, but they are EBPO's options and advantage_estimator="
                    f"{self.advantage_estimator!r} ignores them: set advantage_estimator='ebpo' or drop them"
                )
        self._refuse_ignored_settings()

    def _refuse_ignored_settings(self) -> None:
        """Refuse every setting this trainer would not honour, with one line naming it and the fix (a setting
        that changes nothing without a word is worse than an error)."""
        refused: list[str] = []
        if self.multi_objective_aggregation != "sum_then_normalize":
            refused.append(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r}: it standardises each reward "
                "within its group before summing, which leaves every group mean at 0 and nothing for the "
                "estimator's baseline or prior to learn from; EBPOTrainer scores a completion by the weighted sum "
                "of its raw rewards, so use 'sum_then_normalize' (the default)"
            )
        if self.scale_rewards != "group":
            refused.append(
                f"scale_rewards={self.scale_rewards!r}: GRPO's reward scaling, which the training advantages of "
                "advantage_estimator replace; choose the scaling there (EBPO's `normalize`, or "
                "advantage_estimator='dr_grpo' for unscaled r - mean) and leave scale_rewards at 'group'"
            )
        uses_clusters = self.advantage_estimator == "ebpo" and self.prior_scope == "cluster"
        if self.cluster_column is not None and not uses_clusters:
            refused.append(
                f"cluster_column={self.cluster_column!r}: only EBPO's prior_scope='cluster' reads cluster keys; "
                "set advantage_estimator='ebpo', prior_scope='cluster', or drop cluster_column"
            )
        if self.cluster_min_groups != EBPOOptions.cluster_min_groups and self.prior_scope != "cluster":
            refused.append(
                f"cluster_min_groups={self.cluster_min_groups}: it applies to cluster priors only; set "
                "prior_scope='cluster' or drop it"
            )
        for name, sampler in (("topic_column", "topic"), ("difficulty_column", "difficulty")):
            if getattr(self, name) != name.removesuffix("_column") and self.prompt_sampler != sampler:
                refused.append(
                    f"{name}={getattr(self, name)!r}: only prompt_sampler={sampler!r} reads it; set that "
                    f"sampler or drop {name}"
                )
        if not self.shuffle_dataset and self.prompt_sampler == "topic":
            refused.append(
                "shuffle_dataset=False: prompt_sampler='topic' shuffles the topic order and the prompts within "
                "each topic every epoch (seeded by `seed`); use prompt_sampler='difficulty' for a fixed order "
                "or drop shuffle_dataset=False"
            )
        if refused:
            raise ValueError("EBPOConfig." + "; EBPOConfig.".join(refused))

    def estimator_options(self) -> dict[str, Any]:
        """Keyword options for ``ebpo.get_estimator``: EBPO's (:class:`ebpo.advantages.EBPOOptions`, a
        half-life as a number) for ``ebpo``, none for the other estimators."""
        if self.advantage_estimator != "ebpo":
            return {}
        options = {f.name: getattr(self, f.name) for f in fields(EBPOOptions)}
        if isinstance(self.prior_memory, str) and self.prior_memory != "all":
            options["prior_memory"] = float(self.prior_memory)
        return options


def _check_dataset(config: EBPOConfig, train_dataset: Any) -> None:
    """Refuse a clustered prompt order over a streaming dataset: transformers attaches a sampler only to
    map-style datasets, so the run would train in the stream's own order without a word."""
    import datasets

    if config.prompt_sampler != "random" and isinstance(train_dataset, datasets.IterableDataset):
        raise ValueError(
            f"EBPOConfig.prompt_sampler={config.prompt_sampler!r} orders the prompts of a map-style dataset, but "
            "train_dataset is an IterableDataset (streaming), which transformers reads in its own order: load it "
            "without streaming=True (or Dataset.from_generator), or use prompt_sampler='random'"
        )


class EBPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose training advantages come from ``ebpo``'s estimator registry.

    Same constructor as ``GRPOTrainer``; ``args`` must be an :class:`EBPOConfig`. The estimator is
    ``self.estimator``; see the module docstring for what is overridden and why.
    """

    args: EBPOConfig  # checked in __init__
    model: torch.nn.Module  # GRPOTrainer always has one (its model argument is required)
    num_generations: int  # GRPOConfig.__post_init__ fails on None (GRPO needs at least 2 per prompt)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = inspect.signature(GRPOTrainer.__init__).bind(self, *args, **kwargs).arguments
        config = given.get("args")
        if not isinstance(config, EBPOConfig):
            raise TypeError(f"EBPOTrainer needs args=EBPOConfig(...), got {type(config).__name__}")
        _check_dataset(config, given.get("train_dataset"))
        super().__init__(*args, **kwargs)
        self.estimator = ebpo.get_estimator(self.args.advantage_estimator, **self.args.estimator_options())
        self._prompt_stream: IndexStream | None = None
        self._scored: tuple[torch.Tensor, list[dict[str, Any]]] | None = None
        # the estimator state before the current generation block's rewards (what a mid-block checkpoint saves)
        self._state_at_block_start: dict[str, Any] = copy.deepcopy(self.estimator.state_dict())
        # the dataloader block (_block_of) of the latest training generation; None before the first
        self._generated_block: int | None = None

    # -- prompt order ------------------------------------------------------------------------------------
    def _get_train_sampler(self, dataset=None):
        if self.args.prompt_sampler == "random":
            return super()._get_train_sampler(dataset)
        dataset = self.train_dataset if dataset is None else dataset
        column = (
            self.args.topic_column if self.args.prompt_sampler == "topic" else self.args.difficulty_column
        )
        if column not in dataset.column_names:
            raise ValueError(
                f"prompt_sampler={self.args.prompt_sampler!r} reads column {column!r}, which the training dataset "
                f"lacks (columns: {dataset.column_names})"
            )
        # both typed `int | None` (optional inputs); GRPOConfig.__post_init__ sets them
        generation_batch_size = cast(int, self.args.generation_batch_size)
        steps_per_generation = cast(int, self.args.steps_per_generation)
        if self._prompt_stream is None:
            self._prompt_stream = get_sampler(
                self.args.prompt_sampler,
                list(dataset[column]),
                generation_batch_size // self.num_generations,
                self.args.seed,
            )
        return StreamSampler(
            self._prompt_stream,
            mini_repeat_count=self.num_generations,
            repeat_count=self.num_iterations * steps_per_generation,
        )

    # -- advantages --------------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._scored = (rewards_per_func, inputs)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._scored = None
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            if self._scored is None:
                raise RuntimeError(
                    "EBPOTrainer: GRPOTrainer._generate_and_score_completions scored this batch without calling "
                    "_calculate_rewards, the hook EBPOTrainer reads the rewards from, so the batch would train on "
                    f"GRPO's advantages instead of {self.args.advantage_estimator!r}'s; trl {trl.__version__} "
                    "is not supported: install the tested version (pip install 'trl==1.16.0')"
                )
            rewards_per_func, scored_inputs = self._scored
            self._state_at_block_start = copy.deepcopy(self.estimator.state_dict())
            accumulation = self.args.gradient_accumulation_steps
            # this micro-step's place in the run: TRL's _step restarts at 0 on an optimizer-step boundary
            self._generated_block = self._block_of(
                self.state.global_step * accumulation + self._step % accumulation
            )
            all_adv_N = self._registry_advantages(rewards_per_func, scored_inputs)
            start = self.accelerator.process_index * len(inputs)
            output["advantages"] = all_adv_N[start : start + len(inputs)].to(output["advantages"].device)
            logged = self._logs["advantages"]
            for offset, value in enumerate(all_adv_N.tolist(), start=len(logged) - len(all_adv_N)):
                if offset >= 0:
                    logged[offset] = value
            for name, value in self.estimator.metrics().items():
                self._metrics["train"][name].append(float(value))
        self._scored = None
        return output

    def _registry_advantages(
        self, rewards_per_func: torch.Tensor, inputs: list[dict[str, Any]]
    ) -> torch.Tensor:
        """Advantages of every process's completions (gathered order) from ``self.estimator``.

        r_i = sum_k w_k reward_k(i) over the reward functions that scored i; rows no function scored get 0.
        Group of row i = i // num_generations (TRL's RepeatSampler layout).
        """
        weights_K = self.reward_weights.to(rewards_per_func.device)
        rewards_N = (rewards_per_func * weights_K.unsqueeze(0)).nansum(dim=1)
        scored_N = ~torch.isnan(rewards_per_func).all(dim=1)
        group_N = torch.arange(len(rewards_N)) // self.num_generations
        cluster = self._gathered_column(inputs, self.args.cluster_column)
        keep = scored_N.cpu()
        adv_N = torch.zeros(len(rewards_N), dtype=torch.float32)
        if keep.any():
            kept_cluster = [c for c, k in zip(cluster, keep.tolist()) if k] if cluster is not None else None
            adv_N[keep] = self.estimator(
                rewards_N.detach().cpu()[keep], group_N[keep], cluster=kept_cluster
            ).float()
        return adv_N

    def _gathered_column(self, inputs: list[dict[str, Any]], column: str | None) -> list[Any] | None:
        if column is None:
            return None
        if any(column not in row for row in inputs):
            raise ValueError(f"cluster_column={column!r}: some training rows lack that column")
        from accelerate.utils import gather_object

        return gather_object([row[column] for row in inputs])

    # -- checkpoints -------------------------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        # ours first: neither a kill during the parent's save nor its asynchronous hub push
        # (hub_strategy="checkpoint", from inside the parent's save) can leave a checkpoint without it.
        # should_save: the processes that write checkpoint files (with save_on_each_node, one per node)
        if self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            state = {"estimator": self._estimator_state_to_save()}
            if self._prompt_stream is not None:
                state["prompt_stream"] = self._prompt_stream.state_dict()
            # a kill leaves no half file, and writers sharing one filesystem never share a temporary file
            save_torch_atomic(state, Path(folder) / ESTIMATOR_STATE_FILE)
        super()._save_checkpoint(model, trial)

    def _block_of(self, micro_step: int) -> int:
        """The generation block the training dataloader serves at ``micro_step`` (counted from the run's start):
        the sampler repeats each generation batch for ``steps_per_generation * num_iterations`` micro-steps."""
        # typed `int | None` (an optional input); GRPOConfig.__post_init__ sets it
        return micro_step // (cast(int, self.args.steps_per_generation) * self.num_iterations)

    def _estimator_state_to_save(self) -> dict[str, Any]:
        """The prior that a run resumed from this optimizer step must start from.

        A resumed TRL run has no buffered completions, so it first generates the block its dataloader serves
        at the checkpoint (transformers skips ``global_step * gradient_accumulation_steps`` micro-batches), and
        from then on every ``steps_per_generation * num_iterations`` micro-steps: after a mid-block resume its
        blocks start at other steps than an uninterrupted run's. If that first block is the one whose rewards
        the prior took last, it will be scored again, so the prior from before it is saved (else the block
        would count twice); otherwise the current prior is."""
        resumes_in = self._block_of(self.state.global_step * self.args.gradient_accumulation_steps)
        if self._generated_block is not None and self._generated_block == resumes_in:
            return self._state_at_block_start
        return self.estimator.state_dict()

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, ESTIMATOR_STATE_FILE)
        if not os.path.isfile(path):
            if self.accelerator.is_local_main_process:
                stream = (
                    " and the prompt stream from its first epoch" if self._prompt_stream is not None else ""
                )
                logger.warning(
                    f"[ebpo] WARNING: no {ESTIMATOR_STATE_FILE} in {checkpoint}: the estimator starts from an "
                    f"empty prior{stream}"
                )
            return
        fix = "resume from an earlier checkpoint-N folder, or delete the file to start from an empty prior"
        state = load_torch(path, fix=fix)
        try:
            self.estimator.load_state_dict(state["estimator"])
        except ValueError as err:  # options other than the checkpoint's: one line naming the file and each
            raise ValueError(f"{path}: {err}") from None
        self._state_at_block_start = copy.deepcopy(self.estimator.state_dict())
        if self._prompt_stream is not None and "prompt_stream" in state:
            # transformers re-enters the epoch it stopped in and skips the batches already trained on, so the
            # stream restarts at the start of that epoch (TrainerState.epoch counts the epochs completed).
            self._prompt_stream.load_state_dict(state["prompt_stream"])
            self._prompt_stream.epoch = int(math.floor(self.state.epoch + 1e-9))
            self._prompt_stream.position = 0
