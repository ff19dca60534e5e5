"""Our estimators in verl's advantage registry (``core_algos.register_adv_est``), one stateful copy per process.

Registered function (verl's contract, ``core_algos.compute_*_outcome_advantage``)::

    fn(token_level_rewards (bs, T), response_mask (bs, T), index (bs,) uids, config=algorithm config)
      -> (advantages (bs, T), returns (bs, T))

- Sequence reward r_i = sum_t token_level_rewards[i, t], as verl's own outcome estimators read it (verl writes
  the score on the last response token and zeros elsewhere; an in-reward KL penalty is already per token).
- Rows whose ``response_mask`` is all zero carry no trainable token: verl's rollout-correction rejection
  sampling (``algorithm.rollout_correction.rollout_rs``, decoupled mode) zeroes the mask of the sequences it
  rejects before the advantage, and v1 pads its batch with such rows. They are left out of the estimator
  entirely (not in the group statistics, the prior or the batch normalisation; a group keeps its other
  rows, so groups of 1..G rows are normal) and get advantage 0. With ``bypass_mode=true`` verl rejects inside
  the actor's loss, after the advantage, where no estimator can leave the rejected rows out: that
  combination is refused (:func:`refuse_rejection_after_advantage`).
- With ``algorithm.filter_groups.enable=True`` (DAPO, metric ``reward``), groups whose kept rewards are all
  equal are dropped the way DAPO drops them, but the prior still sees them (``est.observe``, as the
  reference trainer's dynamic sampling does); they get advantage 0 and :class:`EBPORayPPOTrainer` trains
  the step exactly as if they had been removed from the batch (:mod:`.filtering`).
- The sequence advantage A_i (docs/design.md §1) is broadcast over the response tokens times the mask (§1
  step 6); returns = advantages, as verl's outcome estimators do.

Options come from the algorithm config: ``+algorithm.<name>.<option>=value`` (e.g.
``+algorithm.ebpo.prior_scope=cluster``) is passed to ``ebpo.get_estimator(name, **options)``, except the
adapter's own key ``cluster_key`` (default ``extra_info.topic``): the ``non_tensor_batch`` column, or
``column.field`` inside a dict column, that holds each prompt's cluster (topic or difficulty bucket).

verl keeps no estimator state and its registered functions do not see ``non_tensor_batch``, so one
:class:`EstimatorHolder` per process (:data:`HOLDER`) keeps the estimator across steps, the uid -> cluster
map that our trainers (``EBPOTrainerSync`` on verl's v1, ``EBPORayPPOTrainer`` on its legacy trainer) fill when
prompts are loaded, and the uids of filtered groups. Outside them (verl's own launcher) the first call prints
the one warning of :func:`ebpo.integrations.verl.callback.warn_about_launcher` unless
:class:`~ebpo.integrations.verl.callback.EBPOCheckpointCallback` printed it when the trainer started.

This module imports verl's ``core_algos`` only: no Ray trainer, no workers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

import ebpo
from ebpo.advantages.registry import check_options

__all__ = [
    "ADAPTER_KEYS",
    "DEFAULT_CLUSTER_KEY",
    "EstimatorHolder",
    "HOLDER",
    "SERVED",
    "column_values",
    "estimator_options",
    "filter_groups_enabled",
    "make_verl_estimator",
    "observe_groups",
    "refuse_rejection_after_advantage",
    "register_with_verl",
    "saturated_rows",
    "to_plain",
]

DEFAULT_CLUSTER_KEY = "extra_info.topic"
ADAPTER_KEYS = ("cluster_key",)  # options read by this adapter, not passed to get_estimator


# ---------------------------------------------------------------------------------------------------------
# options and columns
# ---------------------------------------------------------------------------------------------------------
def to_plain(value: Any) -> Any:
    """DictConfig / ListConfig -> plain Python containers (anything else unchanged)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, DictConfig | ListConfig):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        pass
    return value


def _section(config: Any, name: str) -> Any:
    if config is None:
        return None
    getter = getattr(config, "get", None)
    return getter(name, None) if callable(getter) else getattr(config, name, None)


def estimator_options(config: Any, name: str) -> tuple[dict[str, Any], str]:
    """Options of estimator ``name`` from verl's algorithm config, and the cluster column.

    Reads ``config[name]`` (``+algorithm.ebpo.prior_scope=cluster`` -> ``{"prior_scope": "cluster"}``);
    ``config`` may be verl's ``AlgoConfig``, a ``DictConfig``, a dict or None. Returns
    ``(options for get_estimator, cluster_key)``. A key that is not an option of the estimator (EBPO's:
    ``ebpo.advantages.EBPOOptions``) or a value it rejects raises ``ValueError`` naming
    ``algorithm.<name>.<key>``.
    """
    section = to_plain(_section(config, name)) or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"algorithm.{name} must be a mapping of estimator options, got {section!r}")
    options = {k: v for k, v in section.items() if k not in ADAPTER_KEYS}
    if name in ebpo.list_estimators():  # each key against the estimator's options (EBPO: EBPOOptions)
        check_options(name, options, where=f"algorithm.{name}", also_valid=ADAPTER_KEYS)
    cluster_key = str(section.get("cluster_key") or DEFAULT_CLUSTER_KEY)
    return options, cluster_key


def filter_groups_enabled(config: Any) -> bool:
    """True when verl's ``algorithm.filter_groups.enable`` is set; only the ``reward`` metric is supported."""
    section = to_plain(_section(config, "filter_groups"))
    if section is not None and not isinstance(section, Mapping):  # verl's FilterGroupsConfig dataclass
        section = {"enable": getattr(section, "enable", False), "metric": getattr(section, "metric", None)}
    if not section or not section.get("enable", False):
        return False
    metric = section.get("metric") or "reward"
    if metric not in ("reward", "score", "seq_reward", "seq_final_reward"):
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r}: ebpo's registered estimators filter on the sequence "
            f"reward only; set algorithm.filter_groups.metric=reward"
        )
    return True


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


def refuse_rejection_after_advantage(config: Any) -> None:
    """``ValueError`` (one line) for ``algorithm.rollout_correction.bypass_mode=true`` with ``rollout_rs`` set.

    In bypass mode verl rejects responses inside the actor's policy loss (``compute_policy_loss_bypass_mode``,
    per micro-batch, against the policy being trained), after the advantages exist: the rejected responses
    would have shaped the group statistics, the prior and the batch normalisation. In decoupled mode
    (``bypass_mode=false``) the rejection runs before the advantage and they are left out.
    """
    section = to_plain(_section(config, "rollout_correction"))
    if section is not None and not isinstance(section, Mapping):  # verl's RolloutCorrectionConfig dataclass
        section = {
            "bypass_mode": getattr(section, "bypass_mode", False),
            "rollout_rs": getattr(section, "rollout_rs", None),
        }
    if section and section.get("bypass_mode") and section.get("rollout_rs"):
        raise ValueError(
            f"algorithm.rollout_correction.bypass_mode=true with rollout_rs={section['rollout_rs']}: verl rejects "
            "those responses inside the actor's loss, after the advantage, so they would shape ebpo's group "
            "statistics and prior; set algorithm.rollout_correction.bypass_mode=false (rejection before the "
            "advantage) or drop rollout_rs"
        )


def saturated_rows(rewards_B: torch.Tensor, index: Sequence[Any], keep_B: torch.Tensor) -> torch.Tensor:
    """Rows (among ``keep_B``) of groups with at least two kept members whose kept rewards are all equal.

    DAPO's filter (docs/design.md §3): a group with one member is kept (its variance is undefined, not zero).
    """
    inverse_B = torch.as_tensor(
        np.unique(np.asarray(list(index), dtype=object).astype(str), return_inverse=True)[1], dtype=torch.long
    )
    num_groups = int(inverse_B.max()) + 1 if len(inverse_B) else 0
    kept_f = keep_B.to(torch.float64)
    r_B = rewards_B.to(torch.float64) * kept_f
    count_M = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse_B, kept_f)
    low_M = torch.full((num_groups,), float("inf"), dtype=torch.float64)
    high_M = torch.full((num_groups,), float("-inf"), dtype=torch.float64)
    low_M = low_M.scatter_reduce(0, inverse_B[keep_B], r_B[keep_B], reduce="amin")
    high_M = high_M.scatter_reduce(0, inverse_B[keep_B], r_B[keep_B], reduce="amax")
    saturated_M = (count_M >= 2) & (low_M == high_M)
    return saturated_M[inverse_B] & keep_B


# ---------------------------------------------------------------------------------------------------------
# the per-process estimator holder
# ---------------------------------------------------------------------------------------------------------
class EstimatorHolder:
    """The stateful estimators of one process (one per estimator name), the uid -> cluster map and the uids
    of the groups the last call filtered.

    ``get(name, options)`` builds ``ebpo.get_estimator(name, **options)`` on first use and returns the same
    object afterwards (a later call with different options raises: the prior would silently mix). State
    loaded before an estimator exists (resume happens before the first step) is kept and applied when the
    estimator is built. ``managed`` is set by our trainers (``EBPOTrainerSync``, ``EBPORayPPOTrainer``); elsewhere
    (verl's own launcher) the first advantage call warns once.
    """

    def __init__(self) -> None:
        #: prints the warning about verl's launcher from an ``algorithm`` config (None: nothing printed); set
        #: once per process by :mod:`.registration`, kept by :meth:`reset`
        self.warning: Callable[[Any], None] | None = None
        self.reset()

    def reset(self) -> None:
        """Drop every estimator, pending state and cluster (tests; a new run in the same process)."""
        self._estimators: dict[str, Any] = {}
        self._options: dict[str, dict[str, Any]] = {}
        self._pending_state: dict[str, Any] = {}
        self._pending_source: dict[str, str] = {}  # the file each pending state came from
        self._clusters: dict[Any, Any] = {}
        self._lags: dict[Any, int] = {}
        self.filtered_uids: set[Any] = set()
        self.managed = False
        #: False where the trainer filters groups itself before the advantage (verl's v1 replay buffer)
        self.filter_in_estimator = True
        #: set once the warning about verl's own launcher was printed in this process
        self.warned = False
        #: ``ebpo/staleness_*`` of the last advantage call (:meth:`lag_metrics`)
        self.last_lag_metrics: dict[str, float] = {}

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
            source = self._pending_source.pop(name, "the checkpoint")
            try:
                est.load_state_dict(self._pending_state.pop(name))
            except ValueError as err:  # options other than the checkpoint's: one line naming each
                raise ValueError(f"{source}: {err}") from None
        self._estimators[name], self._options[name] = est, options
        return est

    def warn_if_unmanaged(self, config: Any) -> None:
        """Outside our trainers (verl's own launcher), print the one warning from the algorithm config through
        :attr:`warning` (set by :mod:`.registration`:
        :func:`ebpo.integrations.verl.callback.warn_about_launcher`) unless it was printed already."""
        if self.managed or self.warned or self.warning is None:
            return
        self.warning(config)

    # uid -> cluster ------------------------------------------------------------------------------------
    def note_clusters(self, uids: Sequence[Any], keys: Sequence[Any]) -> None:
        """Remember the cluster of each prompt uid (called by the trainer when a batch is loaded)."""
        if len(uids) != len(keys):
            raise ValueError(f"note_clusters: {len(uids)} uids but {len(keys)} cluster keys")
        self._clusters.update(zip(uids, keys))

    def clusters_for(self, index: Sequence[Any], known: Sequence[bool] | None = None) -> list[Any] | None:
        """Cluster keys of the rows ``index`` (uids), or None unless every uid is known. Rows where
        ``known`` is False (padding, rejected rows: never given to the estimator) may be unknown: None there."""
        if not self._clusters:
            return None
        out = []
        for row, uid in enumerate(index):
            if uid in self._clusters:
                out.append(self._clusters[uid])
            elif known is not None and not known[row]:
                out.append(None)
            else:
                return None
        return out

    def forget_clusters(self) -> None:
        self._clusters.clear()

    # uid -> lag (verl's asynchronous modes) ---------------------------------------------------------------
    def note_lags(self, lags: Mapping[Any, int]) -> None:
        """Remember each group's lag in weight versions by uid (our replay buffer, when it hands out a batch)."""
        self._lags.update(lags)

    def lags_for(self, index: Sequence[Any], known: Sequence[bool] | None = None) -> list[int] | None:
        """Lag of each row ``index`` (uids), or None unless every uid's lag is known. Rows where ``known`` is
        False (padding, rejected rows: never given to the estimator) may be unknown: 0 there."""
        if not self._lags:
            return None
        out = []
        for row, uid in enumerate(index):
            if uid in self._lags:
                out.append(self._lags[uid])
            elif known is not None and not known[row]:
                out.append(0)
            else:
                return None
        return out

    def forget_lags(self) -> None:
        self._lags.clear()

    def lag_metrics(self, index: Sequence[Any]) -> dict[str, float]:
        """``ebpo/staleness_mean`` and ``ebpo/staleness_max`` over the groups of ``index`` (empty without lags)."""
        lags = self.lags_for(index)
        if not lags:
            return {}
        by_group = dict(zip(index, lags))
        return {
            "ebpo/staleness_mean": float(np.mean(list(by_group.values()))),
            "ebpo/staleness_max": float(max(by_group.values())),
        }

    # checkpointing and metrics ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{name: {"options": ..., "state": est.state_dict()}}`` for every built estimator."""
        return {
            name: {"options": dict(self._options[name]), "state": est.state_dict()}
            for name, est in self._estimators.items()
        }

    def load_state_dict(self, state: Mapping[str, Any], source: str | None = None) -> None:
        """Take a :meth:`state_dict`: into each estimator built already, else when it is built (:meth:`get`).
        ``source``: the file it came from, named by the error an estimator raises for a state that is not
        its own (written under other options, say)."""
        for name, entry in state.items():
            if name in self._estimators:
                try:
                    self._estimators[name].load_state_dict(entry["state"])
                except ValueError as err:
                    raise ValueError(f"{source or 'the checkpoint'}: {err}") from None
            else:
                self._pending_state[name] = entry["state"]
                if source is not None:
                    self._pending_source[name] = source

    def metrics(self) -> dict[str, float]:
        """The last call's staleness metrics (any estimator, when lags were recorded), then ``est.metrics()`` of
        every built estimator, merged (the names are already namespaced)."""
        out: dict[str, float] = dict(self.last_lag_metrics)
        for est in self._estimators.values():
            out.update({k: float(v) for k, v in est.metrics().items()})
        return out


HOLDER = EstimatorHolder()


def observe_groups(
    rewards: Any,
    index: Sequence[Any],
    *,
    name: str = "ebpo",
    config: Any = None,
    cluster: Sequence[Any] | None = None,
    holder: EstimatorHolder | None = None,
    lag: Sequence[Any] | None = None,
) -> None:
    """Fold groups that will not be trained on into estimator ``name``'s prior (``est.observe``).

    For group filters of your own (a custom verl replay buffer, a recipe's dynamic sampling): call it with
    the sequence rewards and uids of the groups you drop, in the process that computes advantages, so the
    prior sees every sampled group as in the reference trainer. ``config`` is verl's algorithm config (its
    ``<name>`` section gives the options, which must match the training ones). ``lag``: each row's lag in
    weight versions, for an estimator that reads it (EBPO's ``prior_staleness``).
    """
    owner = holder if holder is not None else HOLDER
    options, _ = estimator_options(config, name)
    est = owner.get(name, options)
    rewards_t = torch.as_tensor(rewards, dtype=torch.float64)
    if lag is not None and _reads_lag(est):
        est.observe(rewards_t, list(index), cluster, lag=list(lag))
    else:
        est.observe(rewards_t, list(index), cluster)


def _reads_lag(est: Any) -> bool:
    """Whether the estimator takes ``lag=`` (EBPO and its subclasses: ``prior_staleness``)."""
    from ebpo.advantages import EBPOEstimator

    return isinstance(est, EBPOEstimator)


# ---------------------------------------------------------------------------------------------------------
# the registered verl functions
# ---------------------------------------------------------------------------------------------------------
def make_verl_estimator(
    name: str, holder: EstimatorHolder | None = None
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
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
        refuse_rejection_after_advantage(config)
        owner.warn_if_unmanaged(config)
        options, _ = estimator_options(config, name)
        est = owner.get(name, options)
        uids = list(index)
        mask_BT = response_mask.to(token_level_rewards.dtype)
        with torch.no_grad():
            rewards_B = token_level_rewards.detach().sum(dim=-1).cpu()  # sequence reward r_i (verl's reading)
            keep_B = (response_mask.detach().sum(dim=-1) > 0).cpu()  # all-zero mask: rejected, no token
            cluster_B = owner.clusters_for(uids, keep_B.tolist())
            if cluster_B is None and options.get("prior_scope") == "cluster":
                raise ValueError(
                    f"algorithm.{name}.prior_scope=cluster needs each prompt's cluster, but no cluster keys "
                    f"were recorded for this batch: train with python -m ebpo.integrations.verl and a dataset "
                    f"column named by "
                    f"algorithm.{name}.cluster_key (default {DEFAULT_CLUSTER_KEY!r})"
                )
            lag_B = owner.lags_for(uids, keep_B.tolist()) if _reads_lag(est) else None
            owner.last_lag_metrics = owner.lag_metrics(
                [uid for uid, keep in zip(uids, keep_B.tolist()) if keep]
            )

            def lag_kwargs(rows: list[int]) -> dict[str, Any]:
                return {} if lag_B is None else {"lag": [lag_B[i] for i in rows]}

            owner.filtered_uids = set()
            if owner.filter_in_estimator and filter_groups_enabled(config):
                drop_B = saturated_rows(rewards_B, uids, keep_B)
                if drop_B.any():
                    rows = drop_B.nonzero().flatten().tolist()
                    est.observe(
                        rewards_B[drop_B],
                        [uids[i] for i in rows],
                        None if cluster_B is None else [cluster_B[i] for i in rows],
                        **lag_kwargs(rows),
                    )
                    owner.filtered_uids = {uids[i] for i in rows}
                    keep_B = keep_B & ~drop_B
            adv_B = torch.zeros(len(uids), dtype=torch.float32)
            if keep_B.any():
                rows = keep_B.nonzero().flatten().tolist()
                adv_B[keep_B] = est(
                    rewards_B[keep_B],
                    [uids[i] for i in rows],
                    cluster=None if cluster_B is None else [cluster_B[i] for i in rows],
                    **lag_kwargs(rows),
                ).float()
            owner.forget_clusters()
            adv_BT = adv_B.to(device=token_level_rewards.device, dtype=token_level_rewards.dtype)
            adv_BT = adv_BT.unsqueeze(-1) * mask_BT  # over response tokens (design.md §1, step 6)
        return adv_BT, adv_BT

    compute_outcome_advantage.__name__ = f"compute_{name}_outcome_advantage"
    compute_outcome_advantage.__qualname__ = compute_outcome_advantage.__name__
    # a marker on the function object (register_with_verl reads it back); functions declare no such attribute
    compute_outcome_advantage.__ebpo_estimator__ = name  # type: ignore[attr-defined]
    return compute_outcome_advantage


def served_by_ebpo(name: str) -> bool:
    """Whether verl's advantage registry serves ``name`` with one of our estimators (:func:`register_with_verl`)."""
    from verl.trainer.ppo import core_algos

    return getattr(core_algos.ADV_ESTIMATOR_REGISTRY.get(name), "__ebpo_estimator__", None) == name


#: the estimator names this process serves in verl's registry, kept by :func:`register_with_verl`
SERVED: list[str] = []


def register_with_verl() -> list[str]:
    """Register every ``ebpo.list_estimators()`` name verl lacks, a plugin's included (call it again after
    registering one); returns :data:`SERVED`, the names now served by us.

    Idempotent: a name already registered by this module (an earlier call) is left as it is.
    """
    from verl.trainer.ppo import core_algos

    ours = []
    for name in ebpo.list_estimators():
        existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
        if existing is None:
            core_algos.register_adv_est(name)(make_verl_estimator(name))
            ours.append(name)
        elif served_by_ebpo(name):
            ours.append(name)
    SERVED[:] = ours
    return SERVED
