"""EBPO on verl's v1 trainer (``trainer.use_v1=true``, verl 0.9's default), in ``trainer.v1.trainer_mode`` ``sync``,
``colocate_async`` or ``separate_async``.

What ``python -m ebpo.integrations.verl`` runs by default. verl's v1 trainer (``verl/trainer/ppo/v1/``) keeps
its data in TransferQueue and samples training groups from a replay buffer; its extension points are the
replay buffer (``trainer.v1.sampler.custom_sampler.{path,name}``), the checkpoint callback
(``trainer.checkpoint_callback_class``, called after a save) and the trainer's lifecycle methods. What we use,
piece by piece:

- :class:`EBPOReplayBuffer`, the replay buffer (extension point ``custom_sampler``): verl's own sync
  :class:`ReplayBuffer`, whose DAPO filter (``algorithm.filter_groups``) evicts finished groups whose rewards
  are all equal and refills the batch with fresh prompts. Before a finished group is cleared without being
  trained on (evicted, or surplus of a refill), its rewards go to the estimator's prior (``observe_groups``),
  once: a cleared group is gone from TransferQueue. The training batch then holds only kept groups, at full
  size (rows removed and refilled, none masked).
- :class:`EBPOReplayBufferAsync`: the same over verl's ``ReplayBufferAsync`` (the async modes); verl's launcher
  names ``EBPOReplayBuffer`` in every mode and gets this one when the mode is async. Both record each sampled
  group's lag for the estimator (:meth:`EBPOReplayBuffer.note_lags`): the trainer's weight version
  (``global_steps - 1`` during step ``global_steps``: the weights updated at the end of the previous step)
  minus the oldest version among the group's responses (the ``min_global_steps`` tag verl's agent loop
  writes; partial rollout mixes versions within a response). verl 0.9 forwards no per-sample metadata to a
  registered estimator, so the lags reach it through :data:`~ebpo.integrations.verl.estimators.HOLDER`, by uid.
- :class:`EBPOTrainerSync`, :class:`EBPOTrainerColocateAsync` and :class:`EBPOTrainerSeparateAsync`,
  subclasses of verl's trainer of each mode (:func:`trainer_class`), for what has no extension point:

  * ``_save_checkpoint``: ``global_step_N/ebpo_estimator.pt`` (and a clustered sampler's cursor,
    ``ebpo_sampler.pt``) written *before* verl's save. verl writes ``latest_checkpointed_iteration.txt``
    (the mark that makes ``resume_mode=auto`` pick the checkpoint) and only then calls the checkpoint
    callback's ``on_save``, so a state file written from the callback could be missing from a checkpoint
    verl already calls complete (a kill between the two); written first, it cannot.
  * ``_load_checkpoint``: restores the state (verl's v1 offers no load hook; same ``resume_mode`` rules).
  * ``_fetch_one_gen_batch``: names each prompt by its place in the run (:func:`prompt_uid`: the step, the
    fetch within it, the row) instead of verl's random ``uuid4``, so that a run and its repetition order the
    batch alike; records each prompt's cluster (``extra_info.topic``) under its uid (the advantage call sees
    only uids).
  * ``_compute_advantage``: adds ``est.metrics()`` (``ebpo/*``) to the step's metrics.
  * ``_init_dataloader``: ``+data.sampler.class_path`` / ``class_name`` (verl 0.9's ``create_rl_sampler``
    ignores them).
  * ``_init_resource_pool_mgr``: the CPU mode's worker and resource pool (``trainer.device=cpu``).

``separate_async`` needs a GPU checkpoint engine (verl asserts ``checkpoint_engine.backend`` is not ``naive``:
nccl, nixl, mooncake...), so with ``trainer.device=cpu`` it is refused at start (:func:`unsupported_mode`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from ebpo.integrations.verl.checkpoint import (
    load_sampler_state,
    resolve_resume_folder,
    restore_estimator_state,
    save_estimator_state,
    save_sampler_state,
)
from ebpo.integrations.verl.estimators import (
    HOLDER,
    column_values,
    estimator_options,
    observe_groups,
    refuse_rejection_after_advantage,
    to_plain,
)
from ebpo.integrations.verl.registration import REGISTERED
from ebpo.persist import Journal

logger = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_MODE",
    "SUPPORTED_MODES",
    "EBPOReplayBuffer",
    "EBPOReplayBufferAsync",
    "EBPOTrainerColocateAsync",
    "EBPOTrainerSeparateAsync",
    "EBPOTrainerSync",
    "group_lags",
    "prompt_uid",
    "replay_buffer_settings",
    "trainer_class",
    "unsupported_mode",
]

SUPPORTED_MODE = "sync"
#: verl's v1 modes ebpo runs in
SUPPORTED_MODES = ("sync", "colocate_async", "separate_async")


def unsupported_mode(config: Any) -> str | None:
    """One line refusing a ``trainer.v1.trainer_mode`` ebpo cannot run (None when it can).

    ``separate_async`` on the CPU (``trainer.device=cpu``) is refused: verl's ``PPOTrainerSeparateAsync``
    asserts a checkpoint engine other than ``naive`` (nccl, nixl, mooncake: each moves weights between GPUs).
    An unknown mode is refused naming the ones there are.
    """
    mode = str(config.trainer.v1.get("trainer_mode", SUPPORTED_MODE))
    if mode not in SUPPORTED_MODES:
        return f"trainer.v1.trainer_mode={mode} is not one of verl's v1 modes {list(SUPPORTED_MODES)}"
    if mode == "separate_async" and str(config.trainer.get("device", "")) == "cpu":
        return (
            "trainer.v1.trainer_mode=separate_async needs a GPU checkpoint engine (verl asserts "
            "actor_rollout_ref.rollout.checkpoint_engine.backend is nccl/nixl/mooncake, not naive), so it cannot "
            "run with trainer.device=cpu; use trainer.v1.trainer_mode=colocate_async on the CPU"
        )
    return None


def group_lags(global_steps: int, uids: Iterable[str], tags: Iterable[Any]) -> dict[str, int] | None:
    """Each group's lag during step ``global_steps``: the weight version the step trains (``global_steps - 1``,
    the weights updated at the end of the previous step) minus the oldest ``min_global_steps`` tag among the
    group's rows (a response generated across versions counts from its first). None when a row has no
    such tag (a rollout that does not record its weights' version)."""
    current = int(global_steps) - 1
    oldest: dict[str, int] = {}
    for uid, tag in zip(uids, tags):
        version = tag.get("min_global_steps") if isinstance(tag, dict) else None
        if version is None:
            return None
        oldest[uid] = min(oldest.get(uid, int(version)), int(version))
    return {uid: max(current - version, 0) for uid, version in oldest.items()}


def prompt_uid(global_steps: int, fetch: int, row: int) -> str:
    """A prompt's uid from its place in the run: step, dataloader fetch within the step, row of the fetch.

    Sorting uids as strings sorts prompts in the order they were fetched. verl keys every response
    ``{uid}_{session}_{index}``, so a uid holds no ``_``.
    """
    return f"s{global_steps:08d}-f{fetch:05d}-r{row:05d}"


def replay_buffer_settings(config: Any) -> dict[str, Any]:
    """What verl's ``_build_replay_buffer`` hands its own sync buffer and withholds from a custom one: the DAPO
    metric, batch sizes, in-flight bound, failed-group refill (and a shorter poll interval in the CPU mode);
    plus the estimator name and options, so the buffer can feed evicted groups to the prior. Goes to
    ``trainer.v1.sampler.sampler_kwargs.ebpo``; a bad ``filter_groups`` setting raises ``ValueError``."""
    sampler = config.trainer.v1.sampler
    filter_groups = config.algorithm.get("filter_groups", None)
    enabled = bool(filter_groups is not None and filter_groups.get("enable", False))
    metric = None
    if enabled:
        metric = filter_groups.get("metric", None)
        if not metric:
            raise ValueError(
                "algorithm.filter_groups.metric must be set when algorithm.filter_groups.enable=True"
            )
        reward_model = config.reward.reward_model
        if reward_model.enable and not reward_model.enable_resource_pool:
            raise ValueError(
                "algorithm.filter_groups needs the reward at sampling time: use a rule-based reward or "
                "reward.reward_model.enable_resource_pool=True"
            )
    refill_failed = bool(sampler.get("sync_refill_failed_groups", False))
    train_batch_size = int(config.data.train_batch_size)
    name = str(config.algorithm.adv_estimator)
    # verl polls TransferQueue every 2 s while a batch finishes; a CPU step takes seconds, not minutes
    poll = {"poll_interval": 0.2} if str(config.trainer.get("device", "")) == "cpu" else {}
    rollout_dir = config.trainer.get("rollout_data_dir", None)
    return {
        **poll,
        "observed_dir": os.path.join(str(rollout_dir), "observed") if rollout_dir else None,
        "filter_groups_metric": None if metric is None else str(metric),
        "train_batch_size": train_batch_size,
        "gen_batch_size": 1
        if enabled or refill_failed
        else int(config.data.get("gen_batch_size", None) or train_batch_size),
        "max_inflight_gen_batches": int(filter_groups.get("max_inflight_gen_batches", 1)) if enabled else 1,
        "sync_refill_failed_groups": refill_failed,
        "estimator": name,
        "estimator_options": to_plain(config.algorithm.get(name, None)) or {},
    }


class EBPOReplayBuffer(ReplayBuffer):
    """verl's sync replay buffer whose discarded groups feed the estimator's prior (module docstring).

    Every finished training group verl clears without training on it goes to ``observe_groups`` just before
    it leaves TransferQueue: the groups the DAPO filter evicts, and the surplus of kept groups a refill round
    produced beyond the batch (sync DAPO drops them), as the reference trainer's dynamic sampling does.
    Failed groups (a session errored: incomplete) are not observed. A cleared group is gone from
    TransferQueue, so each reaches the prior once. Each step's metrics gain ``ebpo/observed_groups`` and
    ``ebpo/observed_reward_sum``; with ``observed_dir`` set (``trainer.rollout_data_dir``/observed) the
    observed groups are written to ``<step>.jsonl`` there, one ``{"uid", "rewards", "index"}`` line per group
    (``index``: the dataset row, its ``extra_info.index``, where the data has one).

    The batch it hands the trainer lists each group's rows in the order the rollout drew them
    (``extra_fields["ebpo_draw"]`` of the CPU rollout, else verl's session number), groups in uid order:
    verl lists them as they finished, which differs from run to run.

    verl constructs a custom buffer with its generic arguments only; the rest comes from
    ``sampler_kwargs["ebpo"]`` (:func:`replay_buffer_settings`, set by ``python -m ebpo.integrations.verl``),
    or, under verl's own launcher, from the config of the trainer that builds it (the owner of ``refill_fn``).
    """

    def __new__(cls, *args: Any, trainer_mode: str = SUPPORTED_MODE, **kwargs: Any) -> EBPOReplayBuffer:
        # verl's launcher builds the class it is named; in an async mode that name gives the async buffer
        if cls is EBPOReplayBuffer and trainer_mode != SUPPORTED_MODE:
            cls = EBPOReplayBufferAsync
        return super().__new__(cls)

    def __init__(self, *, trainer_mode: str, sampler_kwargs: Any = None, **kwargs: Any) -> None:
        if trainer_mode not in SUPPORTED_MODES:
            raise ValueError(
                f"EBPOReplayBuffer: trainer.v1.trainer_mode={trainer_mode} is not one of {list(SUPPORTED_MODES)}"
            )
        extra = dict(to_plain(sampler_kwargs) or {})
        settings = dict(extra.pop("ebpo", None) or {})
        if not settings:  # verl's own launcher: the trainer that passes its refill method holds the config
            trainer_config = getattr(getattr(kwargs.get("refill_fn"), "__self__", None), "config", None)
            if trainer_config is None:
                raise ValueError(
                    "EBPOReplayBuffer: no settings (trainer.v1.sampler.sampler_kwargs.ebpo) and no trainer config; "
                    "build it through verl's trainer.v1.sampler.custom_sampler keys"
                )
            settings = replay_buffer_settings(trainer_config)
            refuse_rejection_after_advantage(trainer_config.algorithm)
            HOLDER.filter_in_estimator = False
            from ebpo.integrations.verl.callback import warn_about_launcher

            warn_about_launcher(
                trainer_config,
                callback=str(trainer_config.trainer.get("checkpoint_callback_class", None) or "").endswith(
                    "EBPOCheckpointCallback"
                ),
            )
        self.estimator = settings.pop("estimator", None)
        self.estimator_options = settings.pop("estimator_options", {})
        self.observed_dir = settings.pop("observed_dir", None)
        super().__init__(trainer_mode=trainer_mode, sampler_kwargs=extra, **settings, **kwargs)
        self._observed: list[tuple[str, list[float]]] = []
        self._observed_rows: dict[str, int] = {}

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        self._observed, self._observed_rows = [], {}
        self._global_steps = int(global_steps)
        batch, metrics = super().sample(
            global_steps=global_steps, partition_id=partition_id, batch_size=batch_size
        )
        if self._observed:
            metrics = {
                **metrics,
                "ebpo/observed_groups": float(len(self._observed)),
                "ebpo/observed_reward_sum": float(sum(sum(rewards) for _, rewards in self._observed)),
            }
            if self.observed_dir:
                self._dump(global_steps)
        return batch, metrics

    def _materialize_batch(
        self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict
    ):
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
        if not batch.keys:
            return batch
        extra = tq.kv_batch_get(keys=batch.keys, partition_id=partition_id, select_fields=["extra_fields"])
        values = extra["extra_fields"]  # one dict per row (a NonTensorStack, or a list-like of dicts)
        draws = [
            fields.get("ebpo_draw") if isinstance(fields, dict) else None
            for fields in (values.tolist() if hasattr(values, "tolist") else list(values))
        ]

        def place(i: int) -> tuple[str, int, int]:
            uid, session, index = batch.keys[i].rsplit("_", 2)
            draw = draws[i]
            return (uid, int(session) if draw is None else int(draw), int(index))

        order = sorted(range(len(batch.keys)), key=place)
        if partition_id != "val":
            self.note_lags(batch.keys, batch.tags)
        return KVBatchMeta(
            partition_id=batch.partition_id,
            keys=[batch.keys[i] for i in order],
            tags=[batch.tags[i] for i in order],
        )

    def note_lags(self, keys: list[str], tags: list[Any]) -> None:
        """Record the lag of each group among the rows ``keys`` (:func:`group_lags`) for the advantage call."""
        lags = group_lags(getattr(self, "_global_steps", 1), [key.split("_")[0] for key in keys], tags)
        if lags is not None:
            HOLDER.note_lags(lags)

    def _clear_groups(self, partition_id: str, uids: set[str]) -> None:
        if partition_id != "val" and self.estimator in REGISTERED:
            finished = set(uids) & self.finished_keys[partition_id]
            if finished:
                self._observe(partition_id, finished)
        super()._clear_groups(partition_id, uids)

    def _observe(self, partition_id: str, uids: Iterable[str]) -> None:
        """Fold the groups' sequence rewards (``rm_scores`` summed, as the advantage reads them) into the
        prior, one ``observe`` call for all of them."""
        wanted = set(uids)
        keys = sorted(key for key in self.partitions[partition_id] if key.split("_")[0] in wanted)
        if not keys:
            return
        fields = ["rm_scores", "extra_info"] if self.observed_dir else ["rm_scores"]
        data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
        rewards = [float(value.sum().item()) for value in data["rm_scores"]]
        index = [key.split("_")[0] for key in keys]
        lags = group_lags(
            getattr(self, "_global_steps", 1), index, [self.partitions[partition_id][key] for key in keys]
        )
        observe_groups(
            rewards,
            index,
            name=self.estimator,
            config={self.estimator: self.estimator_options},
            cluster=HOLDER.clusters_for(index),
            lag=None if lags is None else [lags[uid] for uid in index],
        )
        by_uid: dict[str, list[float]] = {}
        for uid, reward in zip(index, rewards):
            by_uid.setdefault(uid, []).append(reward)
        self._observed.extend(by_uid.items())
        if self.observed_dir:  # the dataset row of each group (its extra_info.index), for the dump
            infos = data["extra_info"]
            for uid, info in zip(index, infos.tolist() if hasattr(infos, "tolist") else list(infos)):
                if isinstance(info, dict) and info.get("index") is not None:
                    self._observed_rows.setdefault(uid, int(info["index"]))

    def _dump(self, global_steps: int) -> None:
        journal = Journal(os.path.join(self.observed_dir, f"{global_steps}.jsonl"))
        journal.append(
            {"uid": uid, "rewards": rewards}
            | ({"index": self._observed_rows[uid]} if uid in self._observed_rows else {})
            for uid, rewards in self._observed
        )


class EBPOReplayBufferAsync(EBPOReplayBuffer, ReplayBufferAsync):
    """:class:`EBPOReplayBuffer` over verl's ``ReplayBufferAsync`` (``colocate_async``, ``separate_async``): the
    groups it evicts (stale beyond ``max_off_policy_threshold`` under ``drop``, DAPO-filtered) reach the prior
    once with their lags; failed groups do not; surplus groups stay in the buffer for a later step, as verl's."""


class _EBPOTrainer:
    """What our trainers add to verl's trainer of each v1 mode: EBPO's state checkpointed, clusters recorded,
    metrics logged, the ``data.sampler`` option and the CPU mode (see the module docstring: each override has
    no verl extension point that could do it). Mixed in before verl's class."""

    config: Any
    global_steps: int
    train_dataset: Any
    role_worker_mapping: Any
    steps_per_epoch: int

    # set by verl's PPOTrainer (declared for type checkers, where verl is not installed)
    train_dataloader: Any
    resource_pool_manager: Any
    #: (global_steps, dataloader fetches in that step so far): the fetch number in :func:`prompt_uid`
    _fetches: tuple[int, int] = (-1, 0)

    def __init__(self, config: Any) -> None:
        message = unsupported_mode(config)
        if message is not None:
            raise ValueError(message)
        refuse_rejection_after_advantage(config.algorithm)
        # before verl's __init__ builds the checkpoint callback and the replay buffer: ours do nothing then
        HOLDER.managed = True
        super().__init__(config)  # type: ignore[call-arg]
        if config.actor_rollout_ref.rollout.get("multi_turn", {}).get("enable", False):
            logger.warning(
                "[ebpo] WARNING: actor_rollout_ref.rollout.multi_turn.enable=True: multi-turn agent loops are not "
                "validated with ebpo's estimators (an agent loop's several outputs would count as several group "
                "members)"
            )
        # DAPO filtering happens in the replay buffer here; the estimator must not filter a second time
        HOLDER.filter_in_estimator = False

    def _cpu_mode(self) -> bool:
        return str(self.config.trainer.device) == "cpu"

    # -- data ------------------------------------------------------------------------------------------
    def _init_dataloader(self) -> None:
        super()._init_dataloader()  # type: ignore[misc]
        sampler_cfg = self.config.data.get("sampler", None)
        if sampler_cfg is None or not sampler_cfg.get("class_path", None):
            return
        from omegaconf import OmegaConf, open_dict
        from torchdata.stateful_dataloader import StatefulDataLoader
        from verl.utils.dataset.rl_dataset import collate_fn

        from ebpo.integrations.verl.samplers import create_sampler

        # one stream batch = one training batch: v1 fetches prompts gen_batch_size at a time (1 under DAPO)
        stream_config = OmegaConf.create(OmegaConf.to_container(self.config.data, resolve=True))
        with open_dict(stream_config):
            stream_config.gen_batch_size = None
        loader = self.train_dataloader
        self.train_dataloader = StatefulDataLoader(
            dataset=self.train_dataset,
            batch_size=loader.batch_size,
            num_workers=loader.num_workers,
            drop_last=loader.drop_last,
            collate_fn=collate_fn,
            sampler=create_sampler(stream_config, self.train_dataset),
        )

    def _fetch_one_gen_batch(self):
        from verl.utils import tensordict_utils as tu

        batch = super()._fetch_one_gen_batch()  # type: ignore[misc]
        step, fetches = self._fetches
        fetch = fetches if step == self.global_steps else 0
        self._fetches = (self.global_steps, fetch + 1)
        tu.assign_non_tensor_stack(
            batch, "uid", [prompt_uid(self.global_steps, fetch, row) for row in range(len(batch))]
        )
        name = str(self.config.algorithm.adv_estimator)
        if name in REGISTERED:
            _, cluster_key = estimator_options(self.config.algorithm, name)
            columns = {
                key: batch[key] for key in (cluster_key.partition(".")[0], "uid") if key in batch.keys()
            }
            if len(columns) == 2:
                plain = {
                    key: list(value.tolist() if hasattr(value, "tolist") else value)
                    for key, value in columns.items()
                }
                keys = column_values(plain, cluster_key)
                if keys is not None:
                    HOLDER.note_clusters(plain["uid"], keys)
        return batch

    # -- workers (CPU mode) ----------------------------------------------------------------------------
    def _init_resource_pool_mgr(self) -> None:
        super()._init_resource_pool_mgr()  # type: ignore[misc]
        if not self._cpu_mode():
            return
        import ray
        from verl.workers.engine_workers import ActorRolloutRefWorker

        from ebpo.integrations.verl.cpu.worker import CPUActorRolloutRefWorker, CPUResourcePoolManager

        for role, remote_cls in list(self.role_worker_mapping.items()):
            if getattr(remote_cls, "__ray_actor_class__", None) is ActorRolloutRefWorker:
                self.role_worker_mapping[role] = ray.remote(CPUActorRolloutRefWorker)
        manager = self.resource_pool_manager
        self.resource_pool_manager = CPUResourcePoolManager(
            resource_pool_spec=manager.resource_pool_spec, mapping=manager.mapping
        )

    # -- advantage metrics -----------------------------------------------------------------------------
    def _compute_advantage(self, batch, metrics: dict):
        batch = super()._compute_advantage(batch, metrics)  # type: ignore[misc]
        metrics.update(HOLDER.metrics())
        HOLDER.forget_lags()
        return batch

    # -- checkpoints -----------------------------------------------------------------------------------
    def _save_checkpoint(self) -> None:
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        os.makedirs(folder, exist_ok=True)
        save_estimator_state(folder)
        save_sampler_state(folder, getattr(self.train_dataloader, "sampler", None))
        super()._save_checkpoint()  # type: ignore[misc]

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()  # type: ignore[misc]
        folder = resolve_resume_folder(self.config.trainer)
        if folder is None:
            return
        if str(self.config.algorithm.adv_estimator) in REGISTERED:
            restore_estimator_state(folder)
        steps_per_epoch = self.steps_per_epoch
        if steps_per_epoch and self.global_steps % steps_per_epoch == 0:
            load_sampler_state(folder, getattr(self.train_dataloader, "sampler", None))


class EBPOTrainerSync(_EBPOTrainer, PPOTrainerSync):
    """verl's v1 ``PPOTrainerSync`` with ebpo's additions (:class:`_EBPOTrainer`)."""


class EBPOTrainerColocateAsync(_EBPOTrainer, PPOTrainerColocateAsync):
    """verl's ``PPOTrainerColocateAsync`` with ebpo's additions: one advantage call, and one prior update, per
    global step, on groups sampled up to ``max_off_policy_threshold`` versions back (their lags reach the
    estimator through the replay buffer)."""


class EBPOTrainerSeparateAsync(_EBPOTrainer, PPOTrainerSeparateAsync):
    """verl's ``PPOTrainerSeparateAsync`` with ebpo's additions: verl computes the advantage once per
    mini-batch (``parameter_sync_step`` calls per global step, ``train_batch_size / parameter_sync_step`` groups
    each), so the prior updates, and ages under a ``prior_memory`` half-life, once per mini-batch."""


_TRAINERS: dict[str, type] = {
    "sync": EBPOTrainerSync,
    "colocate_async": EBPOTrainerColocateAsync,
    "separate_async": EBPOTrainerSeparateAsync,
}


def trainer_class(config: Any) -> type:
    """Our trainer for ``trainer.v1.trainer_mode``; ValueError (one line) for a mode :func:`unsupported_mode`
    refuses."""
    message = unsupported_mode(config)
    if message is not None:
        raise ValueError(message)
    return _TRAINERS[str(config.trainer.v1.get("trainer_mode", SUPPORTED_MODE))]
