"""Settings of ``ebpo diagnose``: one dataclass, whose fields are the command's flags, and the estimator specs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from ebpo.data.prompts import ChatTemplateSetting
from ebpo.errors import ConfigError
from ebpo.models.names import BUILTIN

DEFAULT_ESTIMATORS = [
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp_baseline",
    "jspo",
    "ebpo",
    "ebpo:normalize=prior",
]
OWN_PRESET = "own"
FALLBACK_PRESET = "grpo"
"""The preset whose loss an estimator without a preset of its own gets under ``--preset own``: GRPO's published
loss, which the learning benchmark gives every estimator in its arm (a)."""


@dataclass
class DiagnoseConfig:
    """Settings of ``ebpo diagnose`` (and ``ebpo.diagnose(...)``); every field is a flag (``--group-sizes``, ...)."""

    model: str = field(
        default=BUILTIN,
        metadata={
            "help": "the policy: a Hugging Face causal-LM directory, an ebpo train checkpoint or run directory "
            "(its best checkpoint), as `ebpo eval` takes them, or a built-in model: builtin:arith (S1, also "
            "'builtin'), builtin:gym (S2)"
        },
    )
    task: str | None = field(
        default=None,
        metadata={
            "help": "task suite (`ebpo.tasks`) that generates the prompt pool, unless --records is given: arith, "
            "or gym:<dataset>[,<dataset>...] (reasoning-gym, the ebpo[gym] extra) (default: the task of a "
            "built-in --model, with its settings: arith for builtin:arith, S2's mixture for builtin:gym; else "
            "arith)"
        },
    )
    task_options: str | None = field(
        default=None,
        metadata={
            "metavar": "YAML",
            "help": "settings of the task's generator as a YAML mapping, as `ebpo train`'s data.task_options "
            "(gym: '{chain_sum: {max_terms: 3}}')",
        },
    )
    split: str = field(default="train", metadata={"help": "the task's split the pool is generated from"})
    pool_size: int = field(
        default=2000,
        metadata={
            "help": "problems generated for the pool (as `ebpo train`'s data.train_size); batches draw from it"
        },
    )
    topics: list[str] | None = field(
        default=None,
        metadata={
            "help": "only these task topics in the generated pool (arith: mod, sequence, ...; default all)"
        },
    )
    levels: list[int] | None = field(
        default=None,
        metadata={"help": "only these task levels in the generated pool (arith: 1..5; default all)"},
    )
    records: str | None = field(
        default=None,
        metadata={
            "help": "a records file instead of the task's pool (JSONL, Parquet, ... read by `ebpo.data.loaders`, "
            "as `ebpo train`'s data.train_file)"
        },
    )
    schema: str = field(
        default="records", metadata={"help": "column mapping of --records (`ebpo.data.loaders`)"}
    )
    reward: str | None = field(
        default=None, metadata={"help": "reward function (`ebpo.rewards`); default: the task's own"}
    )
    estimators: list[str] = field(
        default_factory=lambda: list(DEFAULT_ESTIMATORS),
        metadata={
            "help": "advantage estimators to compare, each a registered name with options after a colon "
            "(ebpo:normalize=prior,prior_memory=50; values read as YAML). Every estimator sees the same "
            "samples of each batch: they differ only in the advantage"
        },
    )
    compare_to: str = field(
        default="grpo",
        metadata={
            "help": "the estimator (as written in --estimators) that paired differences are taken against"
        },
    )
    preset: str = field(
        default=OWN_PRESET,
        metadata={
            "help": "whose policy loss (loss, aggregation, clip options) turns advantages into the gradient: a "
            "training preset's name or file (`ebpo train --config`), or 'own': the preset named after the "
            "estimator where one exists (grpo, dr_grpo, ebpo), else grpo's. Its KL term is not applied"
        },
    )
    group_sizes: list[int] = field(
        default_factory=lambda: [2, 4, 8, 16],
        metadata={"help": "group sizes G to measure (responses per prompt)", "aliases": ["-G"]},
    )
    prompts: int = field(default=32, metadata={"help": "M, prompts per batch", "aliases": ["-M"]})
    batches: int = field(
        default=12,
        metadata={"help": "R, independent batches measured (intervals are over them)", "aliases": ["-R"]},
    )
    warmup_batches: int = field(
        default=8,
        metadata={
            "help": "W, batches of the same policy fed to stateful estimators (EBPO's prior) before the R "
            "measured ones, as training feeds every step's rewards; skipped when no estimator keeps state",
            "aliases": ["-W"],
        },
    )
    reference_samples: int = field(
        default=32,
        metadata={
            "help": "G_ref, separate samples per prompt for the reference: the prompt's success rate and the "
            "reference gradient (even: its two halves give the reference's own noise)"
        },
    )
    cluster_key: Literal["none", "topic", "difficulty"] = field(
        default="none",
        metadata={
            "help": "cluster key handed to the estimators (EBPO's prior_scope=cluster), as `ebpo train`"
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (> 0)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass (1: off)"})
    max_new_tokens: int = field(default=24, metadata={"help": "longest response in tokens"})
    chat_template: ChatTemplateSetting = field(
        default="auto",
        metadata={
            "help": "render prompts with the tokenizer's chat template: auto (when it has one) | on | off, as "
            "`ebpo train`'s data.chat_template and `ebpo eval --chat-template`"
        },
    )
    projection_dim: int = field(
        default=8192,
        metadata={
            "help": "K, numbers each gradient is sketched to (seeded CountSketch; a cosine is off by about "
            "sqrt(2/K) at most); 0 keeps whole gradients (exact, D numbers each)"
        },
    )
    seed: int = field(
        default=0, metadata={"help": "seeds the pool, the prompt order, the samples and the sketch"}
    )
    device: str = field(default="auto", metadata={"help": "auto (cuda if available) | cpu | cuda | cuda:N"})
    dtype: Literal["float32", "bfloat16"] = field(
        default="float32",
        metadata={
            "help": "model dtype: bfloat16 halves a large model's memory, and rounds its gradients alike"
        },
    )
    threads: int = field(
        default=1,
        metadata={
            "help": "torch CPU threads (0: torch's choice); 1 as `ebpo train`, for the small shipped model. "
            "Raise it for larger models"
        },
    )
    out_dir: str = field(
        default="runs/diagnose",
        metadata={"help": "folder for diagnose.md, diagnose.csv, batches.csv, diagnose.png"},
    )
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})
    report_to: list[str] = field(
        default_factory=list,
        metadata={
            "help": "experiment trackers that get the table, the files and these settings, one run each: "
            "tensorboard (a folder in the output folder) | wandb | mlflow, as `ebpo train`'s run.report_to "
            "(wandb and mlflow are extras: pip install 'ebpo[wandb]'; their environment variables apply); "
            "default none"
        },
    )

    def __post_init__(self) -> None:
        checks = {
            "prompts >= 2": self.prompts >= 2,
            "batches >= 2": self.batches >= 2,
            "warmup_batches >= 0": self.warmup_batches >= 0,
            "reference_samples even and >= 4": self.reference_samples >= 4
            and self.reference_samples % 2 == 0,
            "group_sizes non-empty, each >= 2": bool(self.group_sizes) and min(self.group_sizes) >= 2,
            "estimators non-empty": bool(self.estimators),
            "temperature > 0": self.temperature > 0,
            "0 < top_p <= 1": 0 < self.top_p <= 1,
            "max_new_tokens >= 1": self.max_new_tokens >= 1,
            "projection_dim >= 0": self.projection_dim >= 0,
            "pool_size >= prompts": self.records is not None or self.pool_size >= self.prompts,
            "threads >= 0": self.threads >= 0,
        }
        failed = [rule for rule, ok in checks.items() if not ok]
        if failed:
            raise ConfigError(f"invalid diagnose settings, need: {'; '.join(failed)}")
        if self.compare_to not in self.estimators:
            raise ConfigError(
                f"--compare-to {self.compare_to}: not one of --estimators ({', '.join(self.estimators)}); name one"
            )
        if len(set(self.estimators)) != len(self.estimators):
            raise ConfigError(f"--estimators lists one twice: {' '.join(self.estimators)}")
        from ebpo.trackers import check_trackers

        try:  # before anything runs: each name a tracker, its package installed
            check_trackers(self.report_to)
        except ConfigError as err:
            raise ConfigError(f"--report-to: {err}") from None


@dataclass(frozen=True)
class EstimatorSpec:
    """One estimator under study: ``label`` as written in ``--estimators``, the registered ``name``, its
    ``options`` and the ``preset`` whose policy loss it is measured under."""

    label: str
    name: str
    options: dict[str, Any]
    preset: str


def parse_estimator(text: str, where: str = "--estimators") -> tuple[str, dict[str, Any]]:
    """``"ebpo:normalize=prior,prior_memory=50"`` -> ``("ebpo", {"normalize": "prior", "prior_memory": 50})``;
    values are read as YAML scalars. The name and options are checked against the registry; an error names
    ``where`` (the flag it came from)."""
    import yaml

    from ebpo.advantages import get_estimator

    name, _, rest = text.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{where} {text}: option {item!r} is not KEY=VALUE")
        try:
            options[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise ConfigError(f"{where} {text}: cannot read the value of {key.strip()}: {err}") from None
    try:
        get_estimator(name.strip(), **options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where} {text}: {err}") from None
    return name.strip(), options


def estimator_specs(cfg: DiagnoseConfig) -> list[EstimatorSpec]:
    """The specs of ``cfg.estimators``, each with the preset its loss comes from (``cfg.preset``)."""
    from ebpo.trainer.config_files import list_presets

    specs = []
    for text in cfg.estimators:
        name, options = parse_estimator(text)
        preset = cfg.preset
        if preset == OWN_PRESET:
            preset = name if name in list_presets() else FALLBACK_PRESET
        specs.append(EstimatorSpec(text, name, options, preset))
    return specs


def with_model_task(cfg: DiagnoseConfig) -> DiagnoseConfig:
    """``cfg`` with ``task`` filled in where it was not given: the task the built-in ``--model`` was made for
    (``ebpo.models.recipes.Recipe.task``), with its settings unless ``--task-options`` gives some; else
    ``arith``. An unknown built-in model is a ``ConfigError`` naming ``--model``."""
    if cfg.task is not None:
        return cfg
    from ebpo.models.names import builtin_recipe

    try:
        recipe = builtin_recipe(cfg.model)
    except ConfigError as err:
        raise ConfigError(f"--model: {err}") from None
    if recipe is None:
        return dataclasses.replace(cfg, task="arith")
    options = cfg.task_options
    if options is None and recipe.task_options:
        from ebpo.tasks import task_options_text

        options = task_options_text(recipe.task_options)
    return dataclasses.replace(cfg, task=recipe.task, task_options=options)


def replace(cfg: DiagnoseConfig, **overrides: Any) -> DiagnoseConfig:
    """``cfg`` with some fields replaced (checked again); an unknown name is a ``ConfigError`` listing them."""
    names = [f.name for f in dataclasses.fields(DiagnoseConfig)]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ConfigError(f"unknown diagnose setting(s) {unknown}; valid: {', '.join(names)}")
    return dataclasses.replace(cfg, **overrides)
