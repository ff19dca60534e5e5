"""EBPO (Han et al. 2026): its options, its prior and its estimator.

EBPO is GRPO whose per-prompt baseline is shrunk toward a running prior (paper Section 3.2, Algorithm 1;
docs/design.md §1-§2). :class:`EBPOOptions` declares every option once with its help; the trainer, the verl
and TRL adapters and the estimator read that one declaration. ``_Prior`` holds the running moments (float64
Welford accumulators, or exponentially weighted ones with a half-life) and saves them in checkpoints;
:class:`EBPOEstimator` folds each batch into the prior, reads it, and calls
:func:`ebpo.advantages.core.ebpo_advantage`.

Metrics added to the common ones (means over the batch's groups of each group's prior): ``ebpo/mu_glob``,
``ebpo/sigma2``, ``ebpo/tau2``, ``ebpo/shrinkage`` (mean S), ``ebpo/baseline_mean`` (mean V_eb),
``ebpo/cluster_prior_frac`` (fraction of groups that used their cluster's own prior); with per-sample lags
(``lag=``, verl's asynchronous modes) ``ebpo/staleness_mean`` and ``ebpo/staleness_max`` (over the call's
groups, a group's lag being its oldest response's), ``ebpo/stale_groups_left_out`` (``prior_staleness=max_lag``)
and ``ebpo/stale_groups_down_weighted`` (``decay``: groups of lag > 0).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ebpo.advantages.base import AdvantageEstimator
from ebpo.advantages.checks import Batch, OptionError, check_eps, group_ids, is_real, prepare, to_hashable
from ebpo.advantages.core import GroupStats, Normalize, ebpo_advantage, group_moments
from ebpo.advantages.registry import register_estimator
from ebpo.registry import check_choice
from ebpo.welford import EWWelford, WeightedWelford, Welford

__all__ = ["EBPO_CHOICES", "EBPOEstimator", "EBPOOptions"]


@dataclass
class EBPOOptions:
    """EBPO's options, each declared once with its help (paper Section 3.2, Algorithm 1; docs/design.md §1-§2).
    The defaults are the paper's.

    Read by the estimator (``get_estimator("ebpo", **options)`` or ``EBPOEstimator(EBPOOptions(...))``),
    ``ebpo train`` (``algorithm.ebpo.<option>``), TRL (``EBPOConfig`` extends this class: these
    are its fields and flags) and verl (``+algorithm.ebpo.<option>``); each checks them here at start, with
    the key at fault named (:func:`check_options`). Not frozen, because TRL's ``GRPOConfig`` is not.
    """

    prior_scope: Literal["global", "cluster"] = field(
        default="global",
        metadata={
            "help": "EBPO prior: `global` (paper: one Welford prior over all rewards) or `cluster` (one prior per "
            "cluster key, the topic or difficulty bucket; a group uses its cluster's prior once that prior "
            "holds `cluster_min_groups` groups, the global one before that; the global prior sees every group)."
        },
    )
    cluster_min_groups: int = field(
        default=16,
        metadata={
            "help": "With `prior_scope=cluster`: groups a cluster must have seen before its own prior replaces "
            "the global one; below it the variance of its group means (tau2) is too noisy to trust. With a "
            "half-life it counts the decayed weight of the cluster's group means."
        },
    )
    prior_memory: str = field(
        default="all",
        metadata={
            "help": "EBPO prior memory: `all` (paper: every reward ever seen) or a half-life (e.g. `50`) for "
            "exponentially weighted moments that follow the improving policy. The half-life counts estimator "
            "steps, one per batch of fresh rewards: a step of `ebpo train` and of verl, a generation block in "
            "TRL (`steps_per_generation * num_iterations / gradient_accumulation_steps` optimizer steps, not "
            "TRL's global_step). A number is accepted as well as its text."
        },
    )
    tau2: Literal["raw", "latent"] = field(
        default="raw",
        metadata={
            "help": "Between-prompt variance: `raw` (paper: Var of group means, which holds the latent "
            "between-prompt variance plus the sampling noise of each mean) or `latent` (max(Var(means) - "
            "sigma2_within E[1/G], tau2_floor), sigma2_within the pooled within-group variance whatever `sigma2` "
            "is: the method-of-moments estimate of the latent variance). With `sigma2=pooled`, `latent` gives the "
            "textbook Empirical Bayes shrinkage; docs/design.md §2 says what each tau2 x sigma2 pair estimates."
        },
    )
    tau2_floor: float = field(
        default=1e-4,
        metadata={"help": "Floor of the latent tau2, so that S < 1 unless sigma2 dwarfs it; >= 0."},
    )
    sigma2: Literal["total", "pooled"] = field(
        default="total",
        metadata={
            "help": "Within-prompt variance: `total` (paper: variance of all rewards) or `pooled` (running mean "
            "of per-group sample variances)."
        },
    )
    normalize: Normalize = field(
        default="batch",
        metadata={
            "help": "Normalisation of EBPO's raw advantages a = r - V: `batch` (paper: (a - mean)/(std + eps) "
            "over the step's batch; with equal group sizes and one prior mu_glob cancels and the prior acts "
            "only through S), `group` (each group by its shrunk std), `prior` (a/(sqrt(sigma2) + eps), which "
            "keeps the prior mean mu_glob in the training advantage; docs/theory.md) or `none`."
        },
    )
    eps: float = field(
        default=1e-6,
        metadata={"help": "Added to the normalising standard deviation of EBPO's advantages; > 0."},
    )
    prior_staleness: Literal["all", "max_lag", "decay"] = field(
        default="all",
        metadata={
            "help": "How a stale group (sampled by weights `lag` versions older than the trainer's: verl's "
            "asynchronous modes) enters the prior: `all` (every group alike, as in a synchronous run), "
            "`max_lag` (only groups with lag <= `staleness_max_lag`) or `decay` (weight "
            "0.5 ** (lag / `staleness_half_life`)). Groups without a lag count as lag 0. Every group still "
            "gets its advantage from the prior; only what enters the prior changes (docs/theory.md, "
            "section 6, measured the choice)."
        },
    )
    staleness_max_lag: int = field(
        default=8,
        metadata={
            "help": "With `prior_staleness=max_lag`: the largest lag (weight versions) of a group that enters "
            "the prior; an integer >= 0 (verl's `max_off_policy_threshold` default is 8)."
        },
    )
    staleness_half_life: float = field(
        default=4.0,
        metadata={
            "help": "With `prior_staleness=decay`: the lag (weight versions) at which a group's weight in the "
            "prior is halved; > 0."
        },
    )

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """:class:`OptionError` naming the first option that cannot be used."""
        for option, choices in EBPO_CHOICES.items():
            try:
                check_choice(f"EBPO {option}", getattr(self, option), choices)
            except ValueError as err:
                raise OptionError(option, str(err)) from None
        count = self.cluster_min_groups
        if not isinstance(count, numbers.Integral) or isinstance(count, bool) or count < 1:
            raise OptionError(
                "cluster_min_groups", f"cluster_min_groups must be an integer >= 1, got {count!r}"
            )
        _half_life(self.prior_memory)
        if not is_real(self.tau2_floor) or not (math.isfinite(self.tau2_floor) and self.tau2_floor >= 0):
            raise OptionError("tau2_floor", f"tau2_floor must be >= 0 and finite, got {self.tau2_floor!r}")
        check_eps("ebpo", self.eps)
        max_lag = self.staleness_max_lag
        if not isinstance(max_lag, numbers.Integral) or isinstance(max_lag, bool) or max_lag < 0:
            raise OptionError(
                "staleness_max_lag", f"staleness_max_lag must be an integer >= 0, got {max_lag!r}"
            )
        half = self.staleness_half_life
        if not is_real(half) or not (math.isfinite(half) and half > 0):
            raise OptionError(
                "staleness_half_life", f"staleness_half_life must be > 0 and finite, got {half!r}"
            )

    @property
    def half_life(self) -> float | None:
        """``prior_memory`` as a half-life in steps; None for ``"all"``."""
        return _half_life(self.prior_memory)


def _half_life(prior_memory: Any) -> float | None:
    """None for ``"all"``, else ``prior_memory`` as a half-life in steps; OptionError unless finite and > 0."""
    if prior_memory == "all":
        return None
    try:
        half_life = float(prior_memory)
    except (TypeError, ValueError):
        half_life = math.nan
    if not (math.isfinite(half_life) and half_life > 0):
        raise OptionError(
            "prior_memory",
            f"prior_memory must be 'all' or a half-life in steps > 0 (e.g. 50), got {prior_memory!r}",
        )
    return half_life


EBPO_CHOICES: dict[str, tuple[str, ...]] = {
    name: typing.get_args(hint)
    for name, hint in typing.get_type_hints(EBPOOptions).items()
    if typing.get_origin(hint) is Literal
}
"""The values each of EBPO's choice options accepts, the paper's default first: the ``Literal`` types of
:class:`EBPOOptions`, against which the options are checked (``normalize``'s is
:data:`ebpo.advantages.core.Normalize`, which :func:`ebpo_advantage` checks too)."""


def _weighted(acc: Welford | WeightedWelford) -> WeightedWelford:
    """An accumulator that takes weights: a prior built with ``weighted`` (or a half-life) has only those."""
    assert isinstance(acc, WeightedWelford), type(acc)
    return acc


class _Prior:
    """One EBPO prior: W_glob (rewards), W_means (group means), W_within (group variances, for
    ``sigma2="pooled"`` and ``tau2="latent"``) and W_inv_size (1/G_m, for ``tau2="latent"``), all with one
    memory policy.

    ``pooled`` / ``latent``: whether W_within / W_inv_size are kept up to date. Only the options named read
    them; otherwise they stay as they are (in the state all the same, so that checkpoints have one format).
    """

    def __init__(
        self, half_life: float | None, *, pooled: bool = True, latent: bool = True, weighted: bool = False
    ) -> None:
        def make() -> Welford | WeightedWelford:
            if half_life is not None:
                return EWWelford(half_life)
            return WeightedWelford() if weighted else Welford()

        self.W_glob = make()
        self.W_means = make()
        self.W_within = make()
        self.W_inv_size = make()
        self.pooled, self.latent = pooled, latent

    def accumulators(self) -> dict[str, Welford | WeightedWelford]:
        return {
            "W_glob": self.W_glob,
            "W_means": self.W_means,
            "W_within": self.W_within,
            "W_inv_size": self.W_inv_size,
        }

    def update(
        self,
        rewards_N: torch.Tensor,
        stats: GroupStats,
        weight_N: torch.Tensor | None = None,
        weight_M: torch.Tensor | None = None,
    ) -> None:
        """Algorithm 1, lines 4-6: every reward into W_glob, every group mean into W_means; with weights
        (``prior_staleness="decay"``) each reward and group mean weighs its group's weight."""
        if weight_M is None:
            self.W_glob.update(rewards_N)
            self.W_means.update(stats.mean_M)
            if self.pooled:
                self.W_within.update(stats.var_M[stats.count_M > 1])
            if self.latent:
                self.W_inv_size.update(1.0 / stats.count_M)
            return
        weighted = {name: _weighted(acc) for name, acc in self.accumulators().items()}
        weighted["W_glob"].update(rewards_N, weight_N)
        weighted["W_means"].update(stats.mean_M, weight_M)
        if self.pooled:
            several_M = stats.count_M > 1
            weighted["W_within"].update(stats.var_M[several_M], weight_M[several_M])
        if self.latent:
            weighted["W_inv_size"].update(1.0 / stats.count_M, weight_M)

    def step(self) -> None:
        for acc in self.accumulators().values():
            if isinstance(acc, EWWelford):
                acc.step()

    @property
    def num_groups(self) -> float:
        return self.W_means.count

    def state_dict(self) -> dict[str, Any]:
        return {name: acc.state_dict() for name, acc in self.accumulators().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, acc in self.accumulators().items():
            acc.load_state_dict(state[name])


def _load_prior(
    half_life: float | None,
    state: dict[str, Any],
    key: str,
    where: str,
    *,
    pooled: bool,
    latent: bool,
    weighted: bool = False,
) -> _Prior:
    """A fresh :class:`_Prior` holding ``state[key]``; ValueError naming ``where`` if it is missing or bad."""
    if key not in state:
        raise ValueError(f"EBPO checkpoint has no {where!r} entry (keys: {sorted(state)})")
    prior = _Prior(half_life, pooled=pooled, latent=latent, weighted=weighted)
    accumulators = prior.accumulators()
    missing = sorted(set(accumulators) - set(state[key]))
    if missing:
        raise ValueError(f"EBPO checkpoint {where} lacks {missing}: it was not written by this estimator")
    for name, acc in accumulators.items():
        try:
            acc.load_state_dict(state[key][name])
        except ValueError as err:
            raise ValueError(f"EBPO checkpoint {where}.{name}: {err}") from None
    return prior


@register_estimator("ebpo")
class EBPOEstimator(AdvantageEstimator):
    """EBPO (paper Section 3.2, Algorithm 1; docs/design.md §1-§2): GRPO's group mean shrunk toward a running prior.

    Per call: (1) the batch's rewards and group means enter the prior (current batch included before the
    prior is read); (2) mu_glob = mean(W_glob), sigma2, tau2 are read; (3) S_m and V_m per group
    (:func:`shrinkage_baseline`); (4) a = r - V_m; (5) normalisation (:func:`ebpo_advantage`). With
    ``prior_memory`` a half-life, the accumulators are aged by one step at the end of each call.

    Options: :class:`EBPOOptions` (``EBPOEstimator(options)``, or its fields by keyword; a bad one raises
    :class:`OptionError`, a ``ValueError``). Call :meth:`observe` for a step's dropped groups before that
    step's ``__call__``.
    """

    options_type = EBPOOptions

    def __init__(self, options: EBPOOptions | None = None, **overrides: Any) -> None:
        super().__init__()
        if options is None:
            options = EBPOOptions(**overrides)
        elif overrides:
            options = dataclasses.replace(options, **overrides)
        self.options = options
        self.half_life: float | None = options.half_life
        self.prior_scope = options.prior_scope
        self.cluster_min_groups = int(options.cluster_min_groups)
        self.prior_memory = options.prior_memory
        self.tau2_mode = options.tau2
        self.tau2_floor = float(options.tau2_floor)
        self.sigma2_mode = options.sigma2
        self.normalize = options.normalize
        self.eps = float(options.eps)
        self.prior_staleness = options.prior_staleness
        self.staleness_max_lag = int(options.staleness_max_lag)
        self.staleness_half_life = float(options.staleness_half_life)
        self._lag: Any = None  # the per-sample lags of the call in progress (``lag=``), else None
        self._staleness_metrics: dict[str, float] = {}  # the staleness metrics of the last prior update
        self.prior = self._new_prior()
        self.cluster_priors: dict[Hashable, _Prior] = {}

    # -- prior bookkeeping -------------------------------------------------------------------------

    def _new_prior(self) -> _Prior:
        """An empty prior that keeps current what these options read."""
        return _Prior(self.half_life, **self._prior_reads())

    def _prior_reads(self) -> dict[str, bool]:
        latent = self.tau2_mode == "latent"
        return {
            "pooled": self.sigma2_mode == "pooled" or latent,
            "latent": latent,
            "weighted": self.prior_staleness == "decay",
        }

    def _read(self, prior: _Prior) -> tuple[float, float, float]:
        """Algorithm 1, lines 8-10: (mu_glob, sigma2, tau2) of one prior.

        sigma2: ``total`` (paper) the variance of every reward seen, within + between prompts; ``pooled``
        (docs/design.md §2) the running mean of per-group sample variances (groups with G >= 2), the hierarchical
        model's within-group variance. tau2: ``raw`` (paper, Remark on between-group variance) the variance
        of group means; ``latent`` (docs/design.md §2) max(Var(means) - sigma2_within * E[1/G], tau2_floor),
        E[1/G] over the same groups as Var(means). Under the hierarchical model (latent rate p_m, rewards
        drawn around it) Var(means) estimates tau2 + E[sigma2_within / G], so the within-group variance is
        what is subtracted, with either ``sigma2``: the total variance holds tau2 itself, and subtracting it
        would estimate tau2 (1 - E[1/G]). While no group of two or more has been seen sigma2_within is 0 and
        the latent tau2 is the raw one.
        """
        mu_glob = prior.W_glob.mean
        sigma2_within = prior.W_within.mean  # pooled within-group variance (groups with G >= 2)
        sigma2 = prior.W_glob.var if self.sigma2_mode == "total" else sigma2_within
        tau2 = prior.W_means.var
        if self.tau2_mode == "latent":
            tau2 = max(tau2 - sigma2_within * prior.W_inv_size.mean, self.tau2_floor)
        return mu_glob, sigma2, tau2

    def _group_clusters(self, batch: Batch) -> tuple[list[Hashable], torch.Tensor]:
        """(cluster keys K, cluster id of each group (M,)); errors if a group spans two clusters."""
        if batch.cluster is None:
            raise ValueError(
                "prior_scope='cluster' needs cluster= keys (topic or difficulty bucket) per sample"
            )
        cluster_N, num_clusters = group_ids(batch.cluster)
        cluster_N = cluster_N.to(batch.group_N.device)
        big = torch.full((batch.num_groups,), num_clusters, dtype=torch.long, device=cluster_N.device)
        low_M = big.scatter_reduce(0, batch.group_N, cluster_N, reduce="amin")
        high_M = torch.full_like(big, -1).scatter_reduce(0, batch.group_N, cluster_N, reduce="amax")
        if bool((low_M != high_M).any()):
            group = int((low_M != high_M).nonzero()[0, 0])
            position = int((batch.group_N == group).nonzero()[0, 0])
            raise ValueError(
                f"cluster keys must be constant within a group; the group of sample {position} has more than one"
            )
        first_N = torch.zeros(num_clusters, dtype=torch.long, device=cluster_N.device)
        order_N = torch.arange(cluster_N.numel(), device=cluster_N.device)
        first_N = first_N.scatter_reduce(0, cluster_N, order_N, reduce="amin", include_self=False)
        keys = [batch.cluster[i] for i in first_N.tolist()]
        return keys, low_M

    def _staleness(self, batch: Batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(groups that enter the prior (M,) bool, or None for all; their weights (M,), or None for 1) from
        the call's per-sample lags, and the staleness metrics of the call.

        A group's lag is the largest of its samples' (its oldest response). ``max_lag`` leaves out groups with
        lag > ``staleness_max_lag``; ``decay`` weighs each group 0.5 ** (lag / ``staleness_half_life``)."""
        self._staleness_metrics = {}
        if self._lag is None:
            return None, None
        lag_N = torch.as_tensor(self._lag, dtype=torch.float64).reshape(-1).to(batch.rewards_N.device)
        if lag_N.numel() != batch.rewards_N.numel():
            raise ValueError(
                f"lag has {lag_N.numel()} entries but rewards has {batch.rewards_N.numel()}; they must match"
            )
        bad_N = ~(torch.isfinite(lag_N) & (lag_N >= 0))
        if bool(bad_N.any()):
            position = int(bad_N.nonzero()[0, 0])
            raise ValueError(
                f"lag of sample {position} is {lag_N[position].item():g}: a lag is the trainer's weight version "
                "minus the version that sampled the response, finite and >= 0"
            )
        lag_M = torch.zeros(batch.num_groups, dtype=torch.float64, device=lag_N.device)
        lag_M = lag_M.scatter_reduce(0, batch.group_N, lag_N, reduce="amax", include_self=False)
        keep_M: torch.Tensor | None = None
        weight_M: torch.Tensor | None = None
        left_out = down_weighted = 0.0
        if self.prior_staleness == "max_lag":
            keep_M = lag_M <= self.staleness_max_lag
            left_out = float((~keep_M).sum())
        elif self.prior_staleness == "decay":
            weight_M = 0.5 ** (lag_M / self.staleness_half_life)  # the group's weight in the prior
            down_weighted = float((lag_M > 0).sum())
        self._staleness_metrics = {
            "ebpo/staleness_mean": float(lag_M.mean()),
            "ebpo/staleness_max": float(lag_M.max()),
            "ebpo/stale_groups_left_out": left_out,
            "ebpo/stale_groups_down_weighted": down_weighted,
        }
        return keep_M, weight_M

    @staticmethod
    def _fold(
        prior: _Prior,
        batch: Batch,
        stats: GroupStats,
        select_M: torch.Tensor | None,
        weight_M: torch.Tensor | None,
    ) -> None:
        """Fold the groups ``select_M`` (None: all) of a batch into ``prior``, with weights ``weight_M``."""
        rewards_N = batch.rewards_N
        weight_N = None if weight_M is None else weight_M[batch.group_N]
        if select_M is not None:
            select_N = select_M[batch.group_N]
            rewards_N = rewards_N[select_N]
            stats = GroupStats(stats.count_M[select_M], stats.mean_M[select_M], stats.var_M[select_M])
            weight_N = None if weight_N is None else weight_N[select_N]
            weight_M = None if weight_M is None else weight_M[select_M]
        prior.update(rewards_N, stats, weight_N, weight_M)

    def _update(self, batch: Batch, stats: GroupStats) -> tuple[list[Hashable], torch.Tensor] | None:
        """Fold a batch into the global prior and, for cluster scope, its clusters' priors (only the groups
        ``prior_staleness`` lets in, with their weights)."""
        keep_M, weight_M = self._staleness(batch)
        self._fold(self.prior, batch, stats, keep_M, weight_M)
        if self.prior_scope != "cluster":
            return None
        keys, cluster_M = self._group_clusters(batch)
        for k, key in enumerate(keys):  # loop over the few clusters present, each update vectorised
            prior = self.cluster_priors.get(key) or self.cluster_priors.setdefault(key, self._new_prior())
            in_cluster_M = cluster_M == k
            self._fold(
                prior, batch, stats, in_cluster_M if keep_M is None else in_cluster_M & keep_M, weight_M
            )
        return keys, cluster_M

    def _step(self) -> None:
        self.prior.step()
        for prior in self.cluster_priors.values():
            prior.step()

    # -- contract ----------------------------------------------------------------------------------

    def __call__(self, rewards: Any, index: Any, cluster: Any = None, *, lag: Any = None) -> torch.Tensor:
        """As :meth:`AdvantageEstimator.__call__`; ``lag``: N per-sample lags (the trainer's weight version
        minus the version that sampled the response), read by ``prior_staleness``; None: every group lag 0."""
        self._lag = lag
        try:
            return super().__call__(rewards, index, cluster)
        finally:
            self._lag = None

    def observe(self, rewards: Any, index: Any, cluster: Any = None, *, lag: Any = None) -> None:
        """Fold a batch into the prior without computing advantages (no ageing: see class doc); ``lag`` as in
        :meth:`__call__`."""
        batch = prepare(rewards, index, cluster)
        if batch.rewards_N.numel() == 0:
            return
        saved = self.state_dict()
        self._lag = lag
        try:
            self._update(batch, group_moments(batch.rewards_N, batch.group_N, batch.num_groups))
        except Exception:
            self.load_state_dict(saved)
            raise
        finally:
            self._lag = None

    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        stats = batch.stats
        if stats is None:
            stats = group_moments(batch.rewards_N, batch.group_N, batch.num_groups)
        clusters = self._update(batch, stats)
        mu_glob, sigma2, tau2 = self._read(self.prior)
        like = batch.rewards_N
        # each group's (mu_glob, sigma2, tau2): the global prior's, then a cluster's where it has one
        prior_3M = like.new_tensor([mu_glob, sigma2, tau2])[:, None].repeat(1, batch.num_groups)
        mu_glob_M, sigma2_M, tau2_M = prior_3M
        cluster_prior_frac: torch.Tensor | float = 0.0  # one global prior: no group used a cluster's
        if clusters is not None:
            cluster_prior_M = torch.zeros(batch.num_groups, dtype=torch.bool, device=like.device)
            keys, cluster_M = clusters
            for k, key in enumerate(keys):
                prior = self.cluster_priors[key]
                if prior.num_groups < self.cluster_min_groups:
                    continue  # too few groups: this cluster keeps the global prior
                in_cluster_M = cluster_M == k
                cluster_mu, cluster_sigma2, cluster_tau2 = self._read(prior)
                mu_glob_M[in_cluster_M] = cluster_mu
                sigma2_M[in_cluster_M] = cluster_sigma2
                tau2_M[in_cluster_M] = cluster_tau2
                cluster_prior_M |= in_cluster_M
            cluster_prior_frac = cluster_prior_M.double().mean()
        adv_N, shrinkage, V_eb = ebpo_advantage(
            batch.rewards_N,
            batch.group_N,
            stats,
            mu_glob_M,
            sigma2_M,
            tau2_M,
            normalize=self.normalize,
            eps=self.eps,
        )
        self._step()
        # the means over the groups, one row each (a row's mean is the 1-D mean of that row, to the bit)
        means = torch.cat([prior_3M, shrinkage[None], V_eb[None]]).mean(dim=1).tolist()
        names = ("ebpo/mu_glob", "ebpo/sigma2", "ebpo/tau2", "ebpo/shrinkage", "ebpo/baseline_mean")
        extra: dict[str, torch.Tensor | float] = dict(zip(names, means, strict=True))
        extra["ebpo/cluster_prior_frac"] = cluster_prior_frac
        extra.update(self._staleness_metrics)
        return adv_N, extra

    def prior_stats(self, cluster: Hashable | None = None) -> dict[str, float]:
        """Current (mu_glob, sigma2, tau2, num_groups) of the global prior or of one cluster's prior."""
        prior = self.prior if cluster is None else self.cluster_priors[to_hashable(cluster)]
        mu_glob, sigma2, tau2 = self._read(prior)
        return {"mu_glob": mu_glob, "sigma2": sigma2, "tau2": tau2, "num_groups": prior.num_groups}

    def state_dict(self) -> dict[str, Any]:
        return {
            "options": self._options(),
            "prior": self.prior.state_dict(),
            "cluster_priors": [[key, prior.state_dict()] for key, prior in self.cluster_priors.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a :meth:`state_dict`. Every option it was written under (``state["options"]``; one missing
        there, from a release before the option existed, counts as its default) must equal this estimator's:
        each shapes what the prior holds or how it is read, so a prior kept under other options would be read
        as if built for these. A difference is one ``ValueError`` naming each option, saved and requested."""
        saved = state.get("options", {})
        current, defaults = self._options(), EBPOEstimator()._options()
        differ = [
            f"{key}={saved.get(key, defaults[key])!r} (this estimator: {value!r})"
            for key, value in current.items()
            if saved.get(key, defaults[key]) != value
        ]
        if differ:
            raise ValueError(
                f"EBPO checkpoint was written with other options: {', '.join(differ)}; build the estimator "
                "with the checkpoint's options to continue its prior, or start without the checkpoint's state"
            )
        prior = _load_prior(self.half_life, state, "prior", "prior", **self._prior_reads())
        cluster_priors = {}
        for key, prior_state in state.get("cluster_priors", []):
            cluster_priors[key] = _load_prior(
                self.half_life, {"p": prior_state}, "p", f"cluster_priors[{key!r}]", **self._prior_reads()
            )
        self.prior, self.cluster_priors = prior, cluster_priors  # only a fully valid state is taken

    def _options(self) -> dict[str, Any]:
        return {
            "prior_scope": self.prior_scope,
            "cluster_min_groups": self.cluster_min_groups,
            "prior_memory": "all" if self.half_life is None else self.half_life,
            "tau2": self.tau2_mode,
            "tau2_floor": self.tau2_floor,
            "sigma2": self.sigma2_mode,
            "normalize": self.normalize,
            "eps": self.eps,
            "prior_staleness": self.prior_staleness,
            "staleness_max_lag": self.staleness_max_lag,
            "staleness_half_life": self.staleness_half_life,
        }

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self._options().items())
        return f"EBPOEstimator({options})"
