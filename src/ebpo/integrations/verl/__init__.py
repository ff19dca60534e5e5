"""EBPO inside verl (>=0.9,<0.10): estimators, checkpointed state, metrics, clustered samplers.

Importing this module registers, through verl's own ``core_algos.register_adv_est``, every estimator of
``ebpo.advantages`` whose name verl lacks (``ebpo``, ``dr_grpo``, ``jspo``, ``reinforce_pp_baseline``);
verl's own ``grpo`` / ``rloo`` stay verl's. Load it in every process that computes advantages, either with
verl's ``VERL_USE_EXTERNAL_MODULES=ebpo.integrations.verl`` (read by ``import verl``) or by running our entry
point ``python -m ebpo.integrations.verl`` (which uses the classes below).

Registered function (verl's contract, ``core_algos.compute_*_outcome_advantage``)::

    fn(token_level_rewards (bs, T), response_mask (bs, T), index (bs,) uids, config=algorithm config)
      -> (advantages (bs, T), returns (bs, T))

with the sequence reward r_i = sum_t token_level_rewards[i, t] * response_mask[i, t], the sequence advantage
A_i from the stateful ``ebpo`` estimator (SPEC section 1), broadcast over the response tokens (times the mask,
SPEC 1 step 6); returns = advantages, as verl's outcome estimators do.

Options come from the algorithm config: ``+algorithm.<name>.<option>=value`` (e.g.
``+algorithm.ebpo.prior_scope=cluster``) is passed to ``ebpo.get_estimator(name, **options)``, except the
adapter's own key ``cluster_key`` (default ``extra_info.topic``): the ``non_tensor_batch`` column, or
``column.field`` inside a dict column, that holds each prompt's cluster (topic or difficulty bucket).

verl keeps no estimator state and its registered functions do not see ``non_tensor_batch``, so one
:class:`EstimatorHolder` per process (:data:`HOLDER`) keeps the estimator across steps and the uid ->
cluster map that :class:`EBPORayPPOTrainer` fills when a batch is loaded. The trainer also saves the state as
``ebpo_estimator.pt`` in each ``global_step_N`` checkpoint, restores it on resume and merges
``est.metrics()`` into the step's metrics. The clustered samplers (:class:`TopicSampler`,
:class:`DifficultySampler`) follow verl's ``data.sampler`` contract ``cls(data_source, data_config)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import ebpo
from ebpo.data.samplers import StreamSampler, get_sampler

__all__ = [
    "ESTIMATOR_STATE_FILE",
    "DEFAULT_CLUSTER_KEY",
    "EstimatorHolder",
    "HOLDER",
    "make_verl_estimator",
    "register_with_verl",
    "estimator_options",
    "column_values",
    "save_estimator_state",
    "load_estimator_state",
    "resolve_resume_folder",
    "ClusteredSampler",
    "TopicSampler",
    "DifficultySampler",
    "create_sampler",
    "record_to_verl_row",
    "write_verl_parquet",
    "EBPORayPPOTrainer",
]

ESTIMATOR_STATE_FILE = "ebpo_estimator.pt"
DEFAULT_CLUSTER_KEY = "extra_info.topic"
ADAPTER_KEYS = ("cluster_key",)  # options read by this adapter, not passed to get_estimator


# ---------------------------------------------------------------------------------------------------------
# options and columns
# ---------------------------------------------------------------------------------------------------------
def _to_plain(value: Any) -> Any:
    """DictConfig / ListConfig / dataclass configs -> plain Python containers."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, DictConfig | ListConfig):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        pass
    return value


def estimator_options(config: Any, name: str) -> tuple[dict[str, Any], str]:
    """Options of estimator ``name`` from verl's algorithm config, and the cluster column.

    Reads ``config[name]`` (``+algorithm.ebpo.prior_scope=cluster`` -> ``{"prior_scope": "cluster"}``);
    ``config`` may be verl's ``AlgoConfig``, a ``DictConfig``, a dict or None. Returns
    ``(options for get_estimator, cluster_key)``.
    """
    section: Any = None
    if config is not None:
        getter = getattr(config, "get", None)
        section = getter(name, None) if callable(getter) else getattr(config, name, None)
    section = _to_plain(section) or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"algorithm.{name} must be a mapping of estimator options, got {section!r}")
    options = {k: v for k, v in section.items() if k not in ADAPTER_KEYS}
    cluster_key = str(section.get("cluster_key") or DEFAULT_CLUSTER_KEY)
    return options, cluster_key


def column_values(non_tensor_batch: Mapping[str, Any], key: str) -> list[Any] | None:
    """Values of ``key`` per row of a verl ``non_tensor_batch``; ``"col.field"`` reads ``field`` of dict
    column ``col`` (``extra_info.topic``). None if the column (or the field in any row) is missing."""
    column, _, field = key.partition(".")
    if column not in non_tensor_batch:
        return None
    values = list(non_tensor_batch[column])
    if not field:
        return values
    out = []
    for row in values:
        if not isinstance(row, Mapping) or row.get(field) is None:
            return None
        out.append(row[field])
    return out


# ---------------------------------------------------------------------------------------------------------
# the per-process estimator holder
# ---------------------------------------------------------------------------------------------------------
class EstimatorHolder:
    """The stateful estimators of one process (one per estimator name) and the uid -> cluster map.

    ``get(name, options)`` builds ``ebpo.get_estimator(name, **options)`` on first use and returns the same
    object afterwards (a later call with different options raises: the prior would silently mix). State
    loaded before an estimator exists (resume happens before the first step) is kept and applied when the
    estimator is built.
    """

    def __init__(self) -> None:
        self._estimators: dict[str, Any] = {}
        self._options: dict[str, dict[str, Any]] = {}
        self._pending_state: dict[str, Any] = {}
        self._clusters: dict[Any, Any] = {}

    def get(self, name: str, options: Mapping[str, Any] | None = None) -> Any:
        options = dict(options or {})
        if name in self._estimators:
            if options != self._options[name]:
                raise ValueError(
                    f"estimator {name!r} was built with options {self._options[name]} and is now asked for "
                    f"{options}; keep algorithm.{name} fixed during a run"
                )
            return self._estimators[name]
        est = ebpo.get_estimator(name, **options)
        if name in self._pending_state:
            est.load_state_dict(self._pending_state.pop(name))
        self._estimators[name], self._options[name] = est, options
        return est

    # uid -> cluster ------------------------------------------------------------------------------------
    def note_clusters(self, uids: Sequence[Any], keys: Sequence[Any]) -> None:
        """Remember the cluster of each prompt uid (called by the trainer when a batch is loaded)."""
        if len(uids) != len(keys):
            raise ValueError(f"note_clusters: {len(uids)} uids but {len(keys)} cluster keys")
        self._clusters.update(zip(uids, keys))

    def clusters_for(self, index: Sequence[Any]) -> list[Any] | None:
        """Cluster keys of the rows ``index`` (uids), or None unless every uid is known."""
        if not self._clusters:
            return None
        try:
            return [self._clusters[uid] for uid in index]
        except KeyError:
            return None

    def forget_clusters(self) -> None:
        self._clusters.clear()

    # checkpointing and metrics ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{name: {"options": ..., "state": est.state_dict()}}`` for every built estimator."""
        return {
            name: {"options": dict(self._options[name]), "state": est.state_dict()}
            for name, est in self._estimators.items()
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, entry in state.items():
            if name in self._estimators:
                self._estimators[name].load_state_dict(entry["state"])
            else:
                self._pending_state[name] = entry["state"]

    def metrics(self) -> dict[str, float]:
        """``est.metrics()`` of every built estimator, merged (the names are already namespaced)."""
        out: dict[str, float] = {}
        for est in self._estimators.values():
            out.update({k: float(v) for k, v in est.metrics().items()})
        return out

    def reset(self) -> None:
        """Drop every estimator, pending state and cluster (tests; a new run in the same process)."""
        self.__init__()


HOLDER = EstimatorHolder()


# ---------------------------------------------------------------------------------------------------------
# the registered verl functions
# ---------------------------------------------------------------------------------------------------------
def make_verl_estimator(name: str, holder: EstimatorHolder | None = None):
    """verl advantage function for our estimator ``name`` (see the module docstring for the contract)."""

    def compute_outcome_advantage(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray | None = None,
        config: Any = None,
        **unused: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """verl outcome advantage from the ``ebpo`` estimator ``name``: shapes (bs, response_length)."""
        owner = holder if holder is not None else HOLDER
        if index is None:
            raise ValueError(
                f"advantage estimator {name!r} needs the prompt uids (non_tensor_batch['uid']) to form groups"
            )
        options, _ = estimator_options(config, name)
        est = owner.get(name, options)
        mask_BT = response_mask.to(token_level_rewards.dtype)
        with torch.no_grad():
            rewards_B = (token_level_rewards * mask_BT).sum(dim=-1)  # sequence reward r_i
            cluster_B = owner.clusters_for(index)
            if cluster_B is None and options.get("prior_scope") == "cluster":
                raise ValueError(
                    f"algorithm.{name}.prior_scope=cluster needs each prompt's cluster, but no cluster keys "
                    f"were recorded for this batch: train with ebpo.integrations.verl.EBPORayPPOTrainer "
                    f"(python -m ebpo.integrations.verl) and a dataset column named by "
                    f"algorithm.{name}.cluster_key (default {DEFAULT_CLUSTER_KEY!r})"
                )
            adv_B = est(rewards_B.detach().cpu(), index, cluster=cluster_B)
            owner.forget_clusters()
            adv_BT = adv_B.to(device=token_level_rewards.device, dtype=token_level_rewards.dtype)
            adv_BT = adv_BT.unsqueeze(-1) * mask_BT  # broadcast over response tokens (SPEC 1, step 6)
        return adv_BT, adv_BT

    compute_outcome_advantage.__name__ = f"compute_{name}_outcome_advantage"
    compute_outcome_advantage.__qualname__ = compute_outcome_advantage.__name__
    compute_outcome_advantage.__ebpo_estimator__ = name  # type: ignore[attr-defined]
    return compute_outcome_advantage


def register_with_verl() -> list[str]:
    """Register every ``ebpo.list_estimators()`` name verl lacks; returns the names now served by us.

    Idempotent: a name already registered by this module (an earlier import) is left as it is.
    """
    from verl.trainer.ppo import core_algos

    ours = []
    for name in ebpo.list_estimators():
        existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
        if existing is None:
            core_algos.register_adv_est(name)(make_verl_estimator(name))
            ours.append(name)
        elif getattr(existing, "__ebpo_estimator__", None) == name:
            ours.append(name)
    return ours


REGISTERED: list[str] = register_with_verl()


# ---------------------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------------------
def save_estimator_state(folder: str | os.PathLike, holder: EstimatorHolder | None = None) -> Path:
    """Write the holder's state to ``folder/ebpo_estimator.pt`` (beside verl's ``actor/`` and ``data.pt``)."""
    owner = holder if holder is not None else HOLDER
    path = Path(folder) / ESTIMATOR_STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(owner.state_dict(), path)
    return path


def load_estimator_state(folder: str | os.PathLike, holder: EstimatorHolder | None = None) -> bool:
    """Restore ``folder/ebpo_estimator.pt`` into the holder; False if the checkpoint has none."""
    owner = holder if holder is not None else HOLDER
    path = Path(folder) / ESTIMATOR_STATE_FILE
    if not path.is_file():
        return False
    owner.load_state_dict(torch.load(path, weights_only=False))
    return True


def resolve_resume_folder(trainer_config: Any) -> str | None:
    """The ``global_step_N`` folder verl resumes from for ``trainer.resume_mode`` (None: fresh start)."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    mode = trainer_config.resume_mode
    if mode == "disable":
        return None
    if mode == "resume_path":
        folder = str(trainer_config.resume_from_path)
    else:
        base = str(trainer_config.default_local_dir)
        folder = find_latest_ckpt_path(base if os.path.isabs(base) else os.path.join(os.getcwd(), base))
        if folder is None:
            return None
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)


# ---------------------------------------------------------------------------------------------------------
# samplers (verl's data.sampler contract: cls(data_source, data_config))
# ---------------------------------------------------------------------------------------------------------
def _dataset_column(data_source: Any, key: str) -> list[Any]:
    """Per-row values of ``key`` (``col`` or ``col.field``) from a verl ``RLHFDataset`` or any indexable."""
    column, _, field = key.partition(".")
    frame = getattr(data_source, "dataframe", None)
    if frame is not None and column in getattr(frame, "column_names", []):
        rows = list(frame[column])
    else:
        rows = [data_source[i].get(column) for i in range(len(data_source))]
    values = []
    for i, row in enumerate(rows):
        value = row.get(field) if field and isinstance(row, Mapping) else (row if not field else None)
        if value is None:
            raise ValueError(f"sampler: dataset row {i} has no {key!r}; write it in the data (extra_info)")
        values.append(value)
    return values


class ClusteredSampler(StreamSampler):
    """A verl train sampler over one of ``ebpo.data.samplers``' streams (subclasses set ``kind``).

    verl config: ``+data.sampler.class_path=pkg://ebpo.integrations.verl
    +data.sampler.class_name=TopicSampler`` (or ``DifficultySampler``), ``data.shuffle=False`` is implied.
    Read from ``data_config``: batch size ``gen_batch_size or train_batch_size`` (so every dataloader batch
    is one batch of our stream), ``seed`` (default 0), and ``sampler.key`` (the column, default
    ``extra_info.<kind>``), plus ``sampler.options`` (``leftover`` / ``after_epoch``).
    """

    kind: str = ""

    def __init__(self, data_source: Any, data_config: Any) -> None:
        sampler_cfg = _to_plain(data_config.get("sampler", None)) or {}
        key = sampler_cfg.get("key") or f"extra_info.{self.kind}"
        batch_size = int(data_config.get("gen_batch_size", None) or data_config.get("train_batch_size"))
        seed = data_config.get("seed", None)
        stream = get_sampler(
            self.kind,
            _dataset_column(data_source, key),
            batch_size,
            int(seed) if seed is not None else 0,
            **(sampler_cfg.get("options") or {}),
        )
        super().__init__(stream)
        self.data_source = data_source


class TopicSampler(ClusteredSampler):
    """Topic-coherent batches (the paper's EBPO-topic): ``extra_info.topic`` by default."""

    kind = "topic"


class DifficultySampler(ClusteredSampler):
    """Easy-to-hard curriculum (the paper's EBPO-diff): ``extra_info.difficulty`` (pass rate) by default."""

    kind = "difficulty"


def create_sampler(data_config: Any, dataset: Any):
    """verl's ``data.sampler`` option: ``cls(dataset, data_config)`` from ``sampler.class_path`` /
    ``sampler.class_name`` when set (verl 0.9 dropped it from ``create_rl_sampler``), else verl's own."""
    sampler_cfg = data_config.get("sampler", None)
    if sampler_cfg is not None and sampler_cfg.get("class_path", None):
        from verl.utils.import_utils import load_extern_object

        cls = load_extern_object(sampler_cfg.class_path, sampler_cfg.class_name)
        return cls(data_source=dataset, data_config=data_config)
    from verl.trainer.ppo.utils import create_rl_sampler

    return create_rl_sampler(data_config, dataset)


# ---------------------------------------------------------------------------------------------------------
# data: our records -> verl's parquet rows
# ---------------------------------------------------------------------------------------------------------
DEFAULT_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def record_to_verl_row(
    record: Any,
    index: int,
    *,
    data_source: str,
    ability: str = "math",
    instruction: str = DEFAULT_INSTRUCTION,
) -> dict[str, Any]:
    """One ``ebpo.data.records.Record`` as a row of verl's RL parquet format.

    ``{"data_source", "prompt": [{"role": "user", "content": prompt + instruction}], "ability",
    "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"index", "id", "source", "topic",
    "difficulty"}}``. ``data_source`` is what verl's ``default_compute_score`` dispatches on (``math_dapo``:
    its DAPO math verifier), so it is the same for every row and the record's own source goes to
    ``extra_info``; ``topic`` / ``difficulty`` are what :class:`TopicSampler`, :class:`DifficultySampler`
    and ``cluster_key`` read (missing ones are written as None).
    """
    content = record.prompt if not instruction else f"{record.prompt} {instruction}"
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": str(record.answer)},
        "extra_info": {
            "index": int(index),
            "id": str(record.id),
            "source": record.source,
            "topic": record.topic,
            "difficulty": None if record.difficulty is None else float(record.difficulty),
        },
    }


def write_verl_parquet(
    records: Sequence[Any], path: str | os.PathLike, *, data_source: str, **row_options: Any
) -> Path:
    """Write ``records`` to ``path`` in verl's parquet format (:func:`record_to_verl_row`); returns the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not records:
        raise ValueError(f"write_verl_parquet: no records to write to {path}")
    rows = [record_to_verl_row(r, i, data_source=data_source, **row_options) for i, r in enumerate(records)]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out


# ---------------------------------------------------------------------------------------------------------
# the trainer
# ---------------------------------------------------------------------------------------------------------
def _trainer_base():
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    return RayPPOTrainer


class EBPORayPPOTrainer(_trainer_base()):
    """verl's ``RayPPOTrainer`` with EBPO's estimator state checkpointed, its metrics logged, and each
    prompt's cluster passed to the estimator. Everything else is verl's own ``fit``.

    - ``_get_gen_batch``: records uid -> ``algorithm.<estimator>.cluster_key`` for the batch.
    - ``_save_checkpoint`` / ``_load_checkpoint``: ``global_step_N/ebpo_estimator.pt``.
    - ``_update_actor``: adds ``est.metrics()`` (``ebpo/mu_glob``, ``ebpo/shrinkage``, ...) to the actor
      metrics that ``fit`` merges into the step's metrics and sends to verl's logger.
    """

    def _estimator_name(self) -> str:
        return str(self.config.algorithm.adv_estimator)

    def _get_gen_batch(self, batch):
        name = self._estimator_name()
        if name in REGISTERED and "uid" in batch.non_tensor_batch:
            _, cluster_key = estimator_options(self.config.algorithm, name)
            keys = column_values(batch.non_tensor_batch, cluster_key)
            if keys is not None:
                HOLDER.note_clusters(list(batch.non_tensor_batch["uid"]), keys)
        return super()._get_gen_batch(batch)

    def _save_checkpoint(self):
        super()._save_checkpoint()
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        save_estimator_state(folder)

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        folder = resolve_resume_folder(self.config.trainer)
        if folder is not None and not load_estimator_state(folder):
            print(f"[ebpo] no {ESTIMATOR_STATE_FILE} in {folder}: the estimator starts from an empty prior")
        return result

    def _update_actor(self, batch):
        actor_output = super()._update_actor(batch)
        actor_output.meta_info["metrics"].update(HOLDER.metrics())
        return actor_output
