"""The compared methods, in two arms, and the EBPO option candidates behind ``ebpo-best``.

``ebpo-best`` is a row only when a selection (``--select-options``) found a variant whose lead over the paper's
options (``ebpo``) is resolved on the selection's seeds; otherwise arm (a) runs the paper's options under their
own name, ``ebpo``, and no row claims a "best" that nothing measured.

Arm (a), ``estimators``: one loss for every method, only the advantage estimator and its options differ.
The loss is GRPO's as published, the whole ``algorithm`` section of ``src/ebpo/configs/grpo.yaml`` (PPO clip 0.2 /
0.2, dual clip 3, ``seq-mean-token-mean``, its KL to the reference policy, no dynamic sampling, no overlong
shaping), with ``estimator`` and its options replaced. So ``estimators/grpo`` *is* the published
GRPO (the matrix runs it once for both arms) and every other row reads "GRPO with its advantage swapped":
the framing of the paper, where EBPO replaces GRPO's baseline. Data order is ``src/ebpo/configs/ebpo.yaml``'s
(random) for all; ``data.cluster_key`` only feeds the estimator (``prior_scope=cluster``).

Arm (b), ``published``: the presets of ``src/ebpo/configs/`` as written (their loss, KL, data order, dynamic sampling).

Every method shares the ``model``, ``data``, ``rollout``, ``optim`` and ``run`` sections of
``src/ebpo/configs/ebpo.yaml`` (the presets say "other settings as ebpo.yaml").
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.learning.stats import paired_ci
from ebpo.registry import Registry, unknown_choice
from ebpo.settings import merge_dicts, read_yaml
from ebpo.trainer.config_files import PRESETS_DIR

REPO = Path(__file__).resolve().parents[2]
CONFIGS = PRESETS_DIR  # the presets shipped with the package (src/ebpo/configs/)
SHARED_PRESET = "ebpo.yaml"
"""Model, data, rollout, optimizer and run settings of every method (its ``algorithm`` section is not used)."""
LOSS_PRESET = "grpo.yaml"
"""The ``algorithm`` section that arm (a) shares: GRPO's published loss."""

ESTIMATORS = "estimators"
PUBLISHED = "published"
ARMS = (ESTIMATORS, PUBLISHED)
ARM_TITLES = {
    ESTIMATORS: "arm (a): advantage estimators under one loss (GRPO's)",
    PUBLISHED: "arm (b): the methods as published (the presets)",
}
BEST = "ebpo-best"


@dataclass(frozen=True)
class Method:
    """One row of a table.

    Attributes:
        arm: :data:`ESTIMATORS` or :data:`PUBLISHED`.
        name: the row's name within its arm.
        label: what it is, for the tables.
        preset: file in ``src/ebpo/configs/`` (arm (a): :data:`LOSS_PRESET`).
        overrides: ``key=value`` trainer overrides applied after the preset.
        checkpoint: the paper's checkpoint rule for it (Appendix A): ``best`` validation maj@k or ``last``.
    """

    arm: str
    name: str
    label: str
    preset: str
    overrides: tuple[str, ...] = ()
    checkpoint: str = "best"

    @property
    def id(self) -> str:
        return f"{self.arm}/{self.name}"


def _estimator(name: str, estimator: str, label: str, options: dict[str, Any] | None = None) -> Method:
    overrides = [f"algorithm.estimator={estimator}"]
    overrides += [f"algorithm.estimator_options.{key}={value}" for key, value in (options or {}).items()]
    if (options or {}).get("prior_scope") == "cluster":
        overrides.append("data.cluster_key=topic")  # the clusters the per-topic prior is kept over
    return Method(ESTIMATORS, name, label, LOSS_PRESET, tuple(overrides))


def _published(name: str, preset: str, label: str, checkpoint: str = "best") -> Method:
    return Method(PUBLISHED, name, label, preset, (), checkpoint)


_METHODS: Registry[Method] = Registry("method")
"""Every method of both arms, by ``<arm>/<name>``."""

for _method in (
    _estimator("grpo", "grpo", "GRPO: (r - mean_g) / std_g"),
    _estimator("dr_grpo", "dr_grpo", "Dr. GRPO: r - mean_g"),
    _estimator("rloo", "rloo", "RLOO: leave-one-out mean"),
    _estimator("reinforce_pp_baseline", "reinforce_pp_baseline", "REINFORCE++ baseline"),
    _estimator("jspo", "jspo", "JSPO: James-Stein shrinkage"),
    _estimator("ebpo", "ebpo", "EBPO, the paper's options"),
    _estimator("ebpo-prior", "ebpo", "EBPO, normalize=prior", {"normalize": "prior"}),
    # option candidates for ebpo-best (docs/design.md §2), run by --select-options
    _estimator("ebpo-cluster", "ebpo", "EBPO, one prior per topic", {"prior_scope": "cluster"}),
    _estimator("ebpo-latent", "ebpo", "EBPO, latent tau2", {"tau2": "latent"}),
    _estimator("ebpo-pooled", "ebpo", "EBPO, pooled sigma2", {"sigma2": "pooled"}),
    _estimator("ebpo-ewm", "ebpo", "EBPO, prior half-life 10 steps", {"prior_memory": 10}),
    _published("grpo", "grpo.yaml", "GRPO"),
    _published("dr-grpo", "dr_grpo.yaml", "Dr. GRPO"),
    _published("dapo", "dapo.yaml", "DAPO"),
    _published("entropymech-clip-cov", "entropymech_clip_cov.yaml", "EntropyMech Clip-Cov"),
    _published("entropymech-kl-cov", "entropymech_kl_cov.yaml", "EntropyMech KL-Cov"),
    _published("ebpo-naive", "ebpo.yaml", "EBPO-naive: random order"),
    _published("ebpo-topic", "ebpo_topic.yaml", "EBPO-topic: topic-coherent batches"),
    _published("ebpo-diff", "ebpo_diff.yaml", "EBPO-diff: easy-to-hard curriculum", checkpoint="last"),
):
    _METHODS.register(_method.id, _method)

ARM_METHODS = {
    ESTIMATORS: ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "jspo", "ebpo", "ebpo-prior", BEST),
    PUBLISHED: (
        "grpo",
        "dr-grpo",
        "dapo",
        "entropymech-clip-cov",
        "entropymech-kl-cov",
        "ebpo-naive",
        "ebpo-topic",
        "ebpo-diff",
    ),
}
"""Each arm's rows in table order (the default methods of a matrix)."""

OPTION_CANDIDATES = ("ebpo", "ebpo-prior", "ebpo-cluster", "ebpo-latent", "ebpo-pooled", "ebpo-ewm")
"""Arm (a) EBPO variants compared by ``--select-options``; ties go to the first (the paper's options)."""
PAPER_OPTIONS = "ebpo"
"""The candidate every other is measured against: a variant is ``ebpo-best`` only when its lead over these,
paired by seed on the selection's seeds, has a 95% interval above 0."""
SELECTION_SEEDS = (100, 101, 102)
"""Seeds of ``--select-options``: disjoint from the reported seeds (enforced, see :func:`check_disjoint`)."""


def get_method(arm: str, name: str) -> Method:
    """The method ``name`` of ``arm`` (``ebpo-best`` is built by :func:`best_method`, not registered); in arm
    (a) also any registered estimator, :func:`estimator_method`."""
    if f"{arm}/{name}" in _METHODS:
        return _METHODS.get(f"{arm}/{name}")
    if is_estimator_method(arm, name):
        return estimator_method(name)
    error = unknown_choice(f"{arm} method", name, list_methods(arm))
    if arm == ESTIMATORS:
        raise ValueError(f"{error}; or a registered estimator as {ESTIMATOR_SPEC} (yours: --plugins)")
    raise error


ESTIMATOR_SPEC = "NAME or NAME:KEY=VALUE,..."


def is_estimator_method(arm: str, name: str) -> bool:
    """Whether ``name`` of ``arm`` is a row built on a registered estimator (:func:`estimator_method`)."""
    from ebpo.advantages import list_estimators

    return (
        arm == ESTIMATORS and f"{arm}/{name}" not in _METHODS and name.partition(":")[0] in list_estimators()
    )


def estimator_method(text: str) -> Method:
    """Arm (a)'s row for any registered estimator, a plugin's included: ``NAME`` or ``NAME:KEY=VALUE,...``, the
    spelling of ``ebpo diagnose --estimators`` (values read as YAML; the name and options checked by the
    estimator), under GRPO's published loss like every row of the arm."""
    from ebpo.diagnostics.config import parse_estimator

    name, options = parse_estimator(text, where="method")
    given = ", ".join(f"{key}={value}" for key, value in options.items())
    return _estimator(text, name, f"{name}{f' ({given})' if given else ''}: a registered estimator", options)


def list_methods(arm: str) -> list[str]:
    """Every registered name of ``arm`` (the table rows first, then the option candidates)."""
    registered = [_METHODS.get(key) for key in _METHODS.names()]
    extra = [m.name for m in registered if m.arm == arm and m.name not in ARM_METHODS[arm]]
    return list(ARM_METHODS[arm]) + extra


def resolve_values(method: Method, configs: Path = CONFIGS) -> dict[str, Any]:
    """The method's config values before overrides: ``src/ebpo/configs/ebpo.yaml`` without its ``algorithm``
    section, then the preset (arm (a): only the loss preset's ``algorithm`` section, its estimator options
    cleared (``estimator_options`` and ``ebpo``), so that the method's overrides alone set the estimator)."""
    configs = Path(configs)
    shared = {key: value for key, value in read_yaml(configs / SHARED_PRESET).items() if key != "algorithm"}
    preset = read_yaml(configs / method.preset)
    if method.arm == ESTIMATORS:
        algorithm = {k: v for k, v in preset.get("algorithm", {}).items() if k != "ebpo"}
        algorithm["estimator_options"] = {}
        return merge_dicts(shared, {"algorithm": algorithm})
    return merge_dicts(shared, preset)


# ---------------------------------------------------------------------------------------------------
# ebpo-best: the candidate picked by --select-options on disjoint seeds


@dataclass(frozen=True)
class Selection:
    """What ``--select-options`` wrote: the leader (the candidate with the highest mean validation AUC), how
    it led, whether its lead over :data:`PAPER_OPTIONS` is resolved, and on which seeds and model
    (``model_id``, :func:`model_identity`; ``model_path`` is where it was then, for the reader)."""

    method: str
    chosen_by: str
    seeds: tuple[int, ...]
    model_path: str
    command: str
    model_id: str = ""  # absent from files written before it was recorded: the path is compared then
    resolved: bool = False  # the leader's paired 95% interval over the paper's options lies above 0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "seeds": list(self.seeds)}


def model_identity(model_path: str) -> str:
    """The initial policy's identity, the same in any checkout or machine: the weights hash an ``ebpo
    base-model`` build records (``weights:<sha256>``), else SHA-256 over the directory's weight files
    (``files:<sha256>``), else the name itself (a hub id: ``name:<id>``). Computed once per state of the
    directory (a plan asks for it once per run; a file rewritten since is hashed again)."""
    path = Path(model_path)
    stats = [(f.name, f.stat()) for f in sorted(path.iterdir()) if f.is_file()] if path.is_dir() else []
    return _model_identity(model_path, tuple((name, st.st_mtime_ns, st.st_size) for name, st in stats))


@functools.lru_cache(maxsize=64)
def _model_identity(model_path: str, state: tuple) -> str:
    path = Path(model_path)
    info = path / "build_info.json"
    if info.is_file():
        from ebpo.models.build import load_build_info

        return "weights:" + str(load_build_info(path)["weights_sha256"])
    weights = (
        sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin")) if path.is_dir() else []
    )
    if not weights:
        return "name:" + model_path
    digest = hashlib.sha256()
    for file in weights:
        digest.update(file.name.encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return "files:" + digest.hexdigest()


def read_selection(path: Path) -> Selection | None:
    """The selection file, or None when there is none; a file from an older format, one that does not say
    whether its leader's lead is resolved included, is one clear error."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        row = json.loads(path.read_text())
        selection = Selection(
            row["method"],
            row["chosen_by"],
            tuple(int(s) for s in row["seeds"]),
            row["model_path"],
            row["command"],
            str(row.get("model_id", "")),
            row.get("resolved"),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{path}: not a selection written by --select-options ({type(err).__name__}: {err}); rerun "
            "--select-options or remove the file"
        ) from None
    if not isinstance(selection.resolved, bool):
        raise ValueError(
            f"{path}: written before --select-options recorded whether its leader's lead over {PAPER_OPTIONS} "
            "is resolved; rerun --select-options (with --report-only it recomputes that from the finished runs)"
        )
    get_method(ESTIMATORS, selection.method)  # a name that no longer exists is an error, not a fallback
    return selection


def best_method(selection: Selection | None, model_path: str) -> tuple[Method | None, str]:
    """``ebpo-best`` (arm (a)) with the selected candidate's options and how it was chosen; or None and why
    there is no such row: no selection, or a selection whose leader's lead over the paper's options is not
    resolved (arm (a) then runs the paper's options as ``ebpo``, under their own name). A selection made on
    another model is refused."""
    if selection is None:
        return None, "no `ebpo-best` row: no selection was made on this model (run --select-options first)"
    current = model_identity(model_path)  # hashes the weight files of a model without build_info.json
    same = selection.model_id == current if selection.model_id else selection.model_path == model_path
    if not same:
        raise ValueError(
            f"ebpo-best was selected on model {selection.model_path} ({selection.model_id or 'no id'}), "
            f"not on {model_path} ({current}): rerun --select-options on this model (or "
            "pass --model-path to the selection's model)"
        )
    seeds = f"seeds {list(selection.seeds)}"
    if not selection.resolved:
        return None, (
            f"no `ebpo-best` row: the selection found no resolved winner ({selection.chosen_by}; {seeds}), so "
            f"`{PAPER_OPTIONS}` runs the paper's options under their own name"
        )
    base = get_method(ESTIMATORS, selection.method)
    method = Method(ESTIMATORS, BEST, f"EBPO, best options = {base.name}", base.preset, base.overrides)
    return method, f"`ebpo-best` = {selection.method}: {selection.chosen_by} ({seeds})"


def check_disjoint(report_seeds: tuple[int, ...], selection_seeds: tuple[int, ...]) -> None:
    """Refuse reported seeds that the selection of ``ebpo-best`` also used (its validation sets and prompt
    streams would then have picked the winner on the very runs it is reported on)."""
    shared = sorted(set(report_seeds) & set(selection_seeds))
    if shared:
        raise ValueError(
            f"seeds {shared} were used to select ebpo-best (selection seeds {list(selection_seeds)}); report "
            "on disjoint seeds (--seeds) or select again on others (--select-options --seeds)"
        )


def select_best(scores: dict[str, dict[int, float]]) -> tuple[str, bool, str]:
    """The leader, the candidate with the highest mean validation AUC (never the test set; ties go to the
    earliest in :data:`OPTION_CANDIDATES` order), and whether it is a winner: its lead over the paper's
    options (:data:`PAPER_OPTIONS`), paired by seed, has a 95% t-interval above 0. ``scores``: each
    candidate's validation AUC by seed. Returns (leader, resolved, how it was chosen)."""
    means = {name: sum(values.values()) / len(values) for name, values in scores.items() if values}
    if not means:
        raise ValueError(f"no finished runs of the candidates {sorted(scores)}")
    order = {name: i for i, name in enumerate(OPTION_CANDIDATES)}
    leader = min(means, key=lambda name: (-means[name], order.get(name, len(order)), name))
    table = ", ".join(
        f"{name} {means[name]:.4f} (n={len(scores[name])})" for name in sorted(means, key=lambda n: -means[n])
    )
    tied = sorted(name for name, mean in means.items() if mean == means[leader])
    how = f"highest mean validation AUC: {table}"
    if len(tied) > 1:
        how += f"; a tie between {', '.join(tied)}, broken in favour of {leader} (candidate order)"
    if leader == PAPER_OPTIONS:
        return (
            leader,
            False,
            how + f"; the paper's options ({PAPER_OPTIONS}) lead: no variant is ahead of them",
        )
    if PAPER_OPTIONS not in means:
        raise ValueError(
            f"no finished runs of {PAPER_OPTIONS} (the paper's options), which the leader's lead is measured "
            "against; run them with the other candidates"
        )
    lead = paired_ci(scores[leader], scores[PAPER_OPTIONS])
    low, high = lead.mean - lead.half_width, lead.mean + lead.half_width
    resolved = lead.n >= 2 and low > 0
    interval = f"{100 * lead.mean:+.2f} points" + (
        f", 95% interval [{100 * low:+.2f}, {100 * high:+.2f}]" if lead.n >= 2 else " (one seed: no interval)"
    )
    verdict = "resolved: ebpo-best" if resolved else "not resolved: no resolved winner"
    return (
        leader,
        resolved,
        how + f"; {leader} - {PAPER_OPTIONS}, paired over {lead.n} seeds: {interval}, {verdict}",
    )
