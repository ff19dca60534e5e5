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
  ``checkpoint-N`` directory and restored by ``trainer.train(resume_from_checkpoint=...)``. The state saved is
  the prior *as of the start of the current generation block*: a resumed TRL run regenerates the block it
  stopped in (``GRPOTrainer._prepare_inputs`` finds no buffer), so a prior saved after the block's rewards
  would count that block twice. At a block boundary the two are the same.
- Prompt order: ``prompt_sampler="topic"`` / ``"difficulty"`` replaces ``RepeatSampler``'s shuffle with
  ``ebpo.data.samplers``' topic-coherent or easy-to-hard stream, keeping its structure (each prompt repeated
  ``num_generations`` times in a row, each generation batch replayed ``num_iterations * steps_per_generation``
  times).
"""

from __future__ import annotations

import copy
import inspect
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from trl import GRPOConfig, GRPOTrainer

import ebpo
from ebpo.advantages import EBPOEstimator
from ebpo.data.samplers import IndexStream, StreamSampler, get_sampler, list_samplers
from ebpo.integrations import ESTIMATOR_STATE_FILE
from ebpo.registry import check_choice
from ebpo.trainer.checkpoint import save_torch_atomic

__all__ = ["ESTIMATOR_STATE_FILE", "EBPOConfig", "EBPOTrainer"]

EBPO_OPTIONS = ("prior_scope", "cluster_min_groups", "prior_memory", "tau2", "sigma2", "normalize")
"""The EBPOConfig fields that are options of the ``ebpo`` estimator, under the same names; the estimator
validates them (:meth:`EBPOConfig._validate_ebpo_options`) and gives their defaults."""
_ESTIMATOR_DEFAULTS: dict[str, Any] = {
    name: parameter.default
    for name, parameter in inspect.signature(EBPOEstimator.__init__).parameters.items()
    if name in EBPO_OPTIONS
}


@contextmanager
def _blame(where: str) -> Iterator[None]:
    """Re-raise a ValueError or TypeError from the block as one ValueError line starting with ``where``."""
    try:
        yield
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


@dataclass
class EBPOConfig(GRPOConfig):
    """``GRPOConfig`` plus EBPO's options (SPEC sections 1, 2 and 4). All other fields are TRL's.

    The paper's settings map to: ``learning_rate=1e-6``, ``beta=0.001`` (TRL's KL is the k3 estimator),
    ``num_generations=4``, ``loss_type="grpo"``; EBPO-naive / -topic / -diff = ``prompt_sampler`` ``random`` /
    ``topic`` / ``difficulty``.
    """

    advantage_estimator: str = field(
        default="ebpo",
        metadata={
            "help": "Advantage estimator from ebpo's registry (`ebpo.list_estimators()`): `ebpo` (default, "
            "the paper's Empirical Bayes baseline), `grpo`, `dr_grpo`, `rloo`, `reinforce_pp_baseline`, `jspo`. "
            "Replaces GRPOTrainer's advantages during training; `scale_rewards` is then unused."
        },
    )
    prior_scope: str = field(
        default=_ESTIMATOR_DEFAULTS["prior_scope"],
        metadata={
            "help": "EBPO prior: `global` (paper: one Welford prior over all rewards) or `cluster` (one prior per "
            "value of `cluster_column`, falling back to the global one until a cluster has enough groups)."
        },
    )
    cluster_min_groups: int = field(
        default=_ESTIMATOR_DEFAULTS["cluster_min_groups"],
        metadata={
            "help": "With `prior_scope='cluster'`: groups a cluster must have seen before its own prior replaces "
            "the global one (default 16)."
        },
    )
    prior_memory: str = field(
        default=_ESTIMATOR_DEFAULTS["prior_memory"],
        metadata={
            "help": "EBPO prior memory: `all` (paper: every reward ever seen) or a half-life in steps (e.g. `50`) "
            "for exponentially weighted moments that follow the improving policy."
        },
    )
    tau2: str = field(
        default=_ESTIMATOR_DEFAULTS["tau2"],
        metadata={
            "help": "Between-prompt variance: `raw` (paper: Var of group means) or `latent` "
            "(max(Var(means) - sigma2/G, floor), the textbook Empirical Bayes estimate)."
        },
    )
    sigma2: str = field(
        default=_ESTIMATOR_DEFAULTS["sigma2"],
        metadata={
            "help": "Within-prompt variance: `total` (paper: variance of all rewards) or `pooled` (running mean "
            "of per-group sample variances)."
        },
    )
    normalize: str = field(
        default=_ESTIMATOR_DEFAULTS["normalize"],
        metadata={
            "help": "Normalisation of EBPO's raw advantages a = r - V: `batch` (paper: (a - mean)/(std + 1e-6) "
            "over the step's batch), `group` (each group by its shrunk std), `prior` (a/(sqrt(sigma2) + 1e-6), "
            "which keeps the prior mean mu_glob in the training advantage; docs/theory.md) or `none`."
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
        registries and the estimator itself): one line naming the EBPOConfig field and the fix."""
        with _blame("EBPOConfig.advantage_estimator"):
            ebpo.get_estimator(self.advantage_estimator)
        with _blame("EBPOConfig.prompt_sampler"):
            check_choice("sampler", self.prompt_sampler, list_samplers())
        for name in EBPO_OPTIONS:  # one at a time, so that the message names the field at fault
            with _blame(f"EBPOConfig.{name}"):
                ebpo.get_estimator("ebpo", **{name: getattr(self, name)})
        if self.advantage_estimator != "ebpo":
            changed = [n for n in EBPO_OPTIONS if str(getattr(self, n)) != str(_ESTIMATOR_DEFAULTS[n])]
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} set, but they are EBPO's options and advantage_estimator="
                    f"{self.advantage_estimator!r} ignores them: set advantage_estimator='ebpo' or drop them"
                )
        with _blame("EBPOConfig"):  # anything the estimator rejects in the options taken together
            ebpo.get_estimator(self.advantage_estimator, **self.estimator_options())

    def estimator_options(self) -> dict[str, Any]:
        """Keyword options for ``ebpo.get_estimator`` (EBPO's own options only for ``ebpo``)."""
        if self.advantage_estimator != "ebpo":
            return {}
        options = {name: getattr(self, name) for name in EBPO_OPTIONS}
        if isinstance(self.prior_memory, str) and self.prior_memory != "all":
            options["prior_memory"] = float(self.prior_memory)
        return options


class EBPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose training advantages come from ``ebpo``'s estimator registry.

    Same constructor as ``GRPOTrainer``; ``args`` must be an :class:`EBPOConfig`. The estimator is
    ``self.estimator``; see the module docstring for what is overridden and why.
    """

    args: EBPOConfig  # checked in __init__
    model: torch.nn.Module  # GRPOTrainer always has one (its model argument is required)
    num_generations: int  # GRPOConfig.__post_init__ fails on None (GRPO needs at least 2 per prompt)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, EBPOConfig):
            raise TypeError(f"EBPOTrainer needs args=EBPOConfig(...), got {type(self.args).__name__}")
        self.estimator = ebpo.get_estimator(self.args.advantage_estimator, **self.args.estimator_options())
        self._prompt_stream: IndexStream | None = None
        self._scored: tuple[torch.Tensor, list[dict[str, Any]]] | None = None
        # the estimator state before the current generation block's rewards (what a mid-block checkpoint saves)
        self._state_at_block_start: dict[str, Any] = copy.deepcopy(self.estimator.state_dict())

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
        if self.model.training and self._scored is not None:
            rewards_per_func, scored_inputs = self._scored
            self._state_at_block_start = copy.deepcopy(self.estimator.state_dict())
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
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            state = {"estimator": self._estimator_state_to_save()}
            if self._prompt_stream is not None:
                state["prompt_stream"] = self._prompt_stream.state_dict()
            save_torch_atomic(state, Path(folder) / ESTIMATOR_STATE_FILE)  # a kill leaves no half file

    def _at_block_boundary(self) -> bool:
        """True when the next training micro-step generates a new block (``GRPOTrainer._prepare_inputs``)."""
        # typed `int | None` (an optional input); GRPOConfig.__post_init__ sets it
        generate_every = cast(int, self.args.steps_per_generation) * self.num_iterations
        return self._step % generate_every == 0

    def _estimator_state_to_save(self) -> dict[str, Any]:
        """The prior as of the current block's start when saving mid-block (TRL regenerates that block on
        resume, so its rewards must not be in the saved prior), else the current state."""
        return self.estimator.state_dict() if self._at_block_boundary() else self._state_at_block_start

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, ESTIMATOR_STATE_FILE) if checkpoint is not None else None
        if path is None or not os.path.isfile(path):
            return
        state = torch.load(path, weights_only=False)
        self.estimator.load_state_dict(state["estimator"])
        self._state_at_block_start = copy.deepcopy(self.estimator.state_dict())
        if self._prompt_stream is not None and "prompt_stream" in state:
            # transformers re-enters the epoch it stopped in and skips the batches already trained on, so the
            # stream restarts at the start of that epoch (TrainerState.epoch counts the epochs completed).
            self._prompt_stream.load_state_dict(state["prompt_stream"])
            self._prompt_stream.epoch = int(math.floor(self.state.epoch + 1e-9))
            self._prompt_stream.position = 0
