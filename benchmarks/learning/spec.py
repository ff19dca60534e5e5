"""The budget every run of a matrix shares, the two budget variants, and one run's spec and key.

A *cell* is one entry of a table: (arm, method, budget variant, G, seed). A *run* is what the trainer
executes: the resolved config, the model and the test settings. Cells whose runs resolve to the same config
share one run (``estimators/grpo`` is ``published/grpo``; the fixed-prompts and equal-responses runs at the
G where P x G = R are one run), so a run's key hashes what determines its result, never the cell's name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from benchmarks.learning.methods import CONFIGS, SHARED_PRESET, Method, model_identity, resolve_values
from ebpo.settings import apply_overrides
from ebpo.trainer.config import TrainConfig, largest_divisor
from ebpo.trainer.config_files import load_config

FIXED_PROMPTS = "fixed-prompts"
EQUAL_RESPONSES = "equal-responses"
VARIANTS = (FIXED_PROMPTS, EQUAL_RESPONSES)
VARIANT_TITLES = {
    FIXED_PROMPTS: "P prompts per step at every G (the paper's Table 2: responses per step grow with G)",
    EQUAL_RESPONSES: "R responses per step at every G (prompts per step = R / G: an equal sampling budget)",
}

RESULT_KEYS_IGNORED = ("out_dir", "name", "progress", "plot", "plugins", "report_to", "resume_overrides")
"""``run`` fields that do not change a run's result, left out of its key (``plugins``: where a method's
estimator is defined, its name and options being keyed; ``report_to``: where the metrics are also sent;
``resume_overrides``: whether a resume may change settings, which a run's own resumes never do)."""

KEYED_ONLY_OFF_DEFAULT = {
    ("rollout", "old_logp"): "recompute",
    ("run", "step_kl"): "all",
    ("optim", "shared_prompts"): False,
    ("data", "chat_template"): "auto",
    ("data", "task_options"): {},
}
"""Config fields added after runs were first keyed, with the value that reproduces those runs (what the trainer
did before the field existed; the trainer's defaults have since moved to the fast paths): at that value a field
is left out of the key, so the earlier runs keep their keys and finished results; any other value, the present
default included, enters it (``--set`` plans the earlier runs). ``data.chat_template``'s default, ``auto``,
renders raw prompts for a tokenizer without a chat template, as every keyed run had, and the model's identity
is in the key, so a chat model's runs never share a key with those."""

KEYED_AS_GIVEN = {"estimator_options": "ebpo", "loss_options": "loss"}
"""The ``algorithm`` sections keyed as the run's values and overrides give them, under the names runs were
first keyed with: EBPO's options (``algorithm.ebpo``, earlier ``algorithm.estimator_options``) and the loss's
(``algorithm.loss``, earlier ``algorithm.loss_options``). The key holds the options given, under either
spelling (not the whole section with its defaults), so the earlier runs keep their keys."""


@dataclass(frozen=True)
class Budget:
    """What every run of a matrix shares. ``None`` takes the value of ``src/ebpo/configs/ebpo.yaml`` (the shared
    preset) when the matrix is planned: :meth:`resolve` freezes it into the specs.

    Attributes:
        steps: training steps per run.
        prompts: P, prompts per step in the fixed-prompts variant (ebpo.yaml: ``data.batch_size``).
        responses: R, responses per step in the equal-responses variant (default P x ebpo.yaml's G).
        updates: optimizer updates per step (ebpo.yaml: ``batch_size / mini_batch_size``); lowered to the
            largest divisor of a run's prompts per step.
        lr, max_new_tokens, eval_every, val_size, eval_n: ebpo.yaml's ``optim.lr``,
            ``rollout.max_new_tokens``, ``run.eval_every``, ``data.val_size``, ``run.eval_n``.
        save_every: checkpoint cadence (default ``eval_every``): a killed run resumes from it.
        test_size: the first N problems of the ``arith`` test set (None = all).
        test_n: test samples per problem (avg@n Pass@1 and maj@n).
        test_temperature: test sampling temperature.
        test_best: also test the paper's checkpoint (best validation maj@k; EBPO-diff the last).
        threads: torch threads per run (1: two single-threaded runs use 2 cores best).
        settings: ``key=value`` trainer overrides every run takes, after the method's and the sizes above
            (e.g. the exact log-prob paths that reproduce runs made before they became optional).
    """

    steps: int | None = None
    prompts: int | None = None
    responses: int | None = None
    updates: int | None = None
    lr: float | None = None
    max_new_tokens: int | None = None
    eval_every: int | None = None
    save_every: int | None = None
    val_size: int | None = None
    eval_n: int | None = None
    test_size: int | None = None
    test_n: int = 8
    test_temperature: float = 1.0
    test_best: bool = False
    threads: int = 1
    settings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in (
            "steps",
            "prompts",
            "responses",
            "updates",
            "max_new_tokens",
            "eval_every",
            "save_every",
            "val_size",
            "eval_n",
            "test_size",
            "test_n",
            "threads",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"budget: {name} must be >= 1, got {value}")

    def resolve(self, configs: Path = CONFIGS) -> Budget:
        """Every ``None`` (except ``test_size``) filled from ``src/ebpo/configs/ebpo.yaml`` (on the trainer's defaults)."""
        shared = load_config(Path(configs) / SHARED_PRESET)
        d, o, run = shared.data, shared.optim, shared.run
        eval_every = self.eval_every or run.eval_every
        if eval_every < 1:
            raise ValueError(
                f"{SHARED_PRESET} has run.eval_every=0; the benchmark needs validations during a run for the "
                "validation curve: pass --eval-every"
            )
        prompts = self.prompts or d.batch_size
        return replace(
            self,
            steps=self.steps or run.steps,
            prompts=prompts,
            responses=self.responses or prompts * d.group_size,
            updates=self.updates or max(1, d.batch_size // o.mini_batch_size),
            lr=self.lr if self.lr is not None else o.lr,
            max_new_tokens=self.max_new_tokens or shared.rollout.max_new_tokens,
            eval_every=eval_every,
            save_every=self.save_every or eval_every,
            val_size=self.val_size or d.val_size,
            eval_n=self.eval_n or run.eval_n,
        )

    @property
    def resolved(self) -> bool:
        """Every size a run needs is set (what :meth:`resolve` fills; ``test_size`` None means all)."""
        sizes = (self.steps, self.prompts, self.responses, self.updates, self.lr, self.max_new_tokens)
        return None not in sizes + (self.eval_every, self.save_every, self.val_size, self.eval_n)

    def prompts_per_step(self, variant: str, group_size: int) -> int:
        """P (fixed prompts) or R / G (equal responses; R must be a multiple of G)."""
        if not self.resolved:
            raise ValueError("resolve the budget first (Budget.resolve)")
        if variant == FIXED_PROMPTS:
            return int(self.prompts)
        if variant == EQUAL_RESPONSES:
            if self.responses % group_size:
                raise ValueError(
                    f"equal-responses: R={self.responses} responses per step is not a multiple of G={group_size}; "
                    f"pass --responses as a multiple of every G (e.g. {group_size * max(1, self.responses // group_size)})"
                )
            return self.responses // group_size
        raise ValueError(f"unknown budget variant {variant!r}; valid: {', '.join(VARIANTS)}")

    def mini_batch_size(self, prompts: int) -> int:
        """Prompts per update: prompts / updates, updates lowered to the largest divisor of the prompts."""
        return prompts // largest_divisor(prompts, int(self.updates))


@dataclass(frozen=True, order=True)
class Cell:
    """One entry of a table: a method of an arm, under a budget variant, at group size G, with one seed."""

    arm: str
    method: str
    variant: str
    group_size: int
    seed: int

    @property
    def label(self) -> str:
        return f"{self.arm}/{self.method}/{self.variant}/G{self.group_size}/seed{self.seed}"


@dataclass(frozen=True)
class RunSpec:
    """One run: the config values (frozen when planned), the overrides, the model and the test settings.

    Attributes:
        values_json: the method's resolved preset (:func:`resolve_values`) as canonical JSON, frozen at
            planning so that a preset edited while a matrix runs does not change its planned runs.
        overrides: the method's ``key=value`` overrides, then the budget's (the budget wins).
        model_path: the initial policy (its directory).
        test: the test settings (``size``, ``n``, ``temperature``, ``best``).
        checkpoint: the paper's checkpoint rule for ``test["best"]``: ``best`` or ``last``.
        label: the first cell that planned it (for logs; not part of the key).
    """

    values_json: str
    overrides: tuple[str, ...]
    model_path: str
    test: tuple[tuple[str, Any], ...]
    checkpoint: str = "best"
    label: str = field(default="", compare=False)

    def load_config(self) -> TrainConfig:
        """The trainer config: defaults <- frozen values <- overrides (validated)."""
        return load_config(None, list(self.overrides), base=json.loads(self.values_json))

    @cached_property
    def config(self) -> dict[str, Any]:
        return self.load_config().to_dict()

    @property
    def test_settings(self) -> dict[str, Any]:
        return dict(self.test)

    @cached_property
    def key(self) -> str:
        """12 hex digits over what determines the result: the resolved config (less ``run`` fields that only
        name or display the run, :data:`KEYED_ONLY_OFF_DEFAULT` fields at their default, and
        :data:`KEYED_AS_GIVEN` sections as given), the model, the test settings and the checkpoint rule.

        The model enters by its identity (``model_identity``: the weights' hash), not its path: a base model
        rebuilt in place (``ebpo base-model --out``) is another model and reruns every cell, and a runs
        directory moved to another checkout still matches its runs."""
        model_id = model_identity(self.model_path)
        config = {
            **self.config,
            "run": {k: v for k, v in self.config["run"].items() if k not in RESULT_KEYS_IGNORED},
            "model": {**self.config["model"], "path": model_id},
        }
        for (section, name), default in KEYED_ONLY_OFF_DEFAULT.items():
            if config[section].get(name) == default:
                config[section] = {k: v for k, v in config[section].items() if k != name}
        given = apply_overrides(json.loads(self.values_json), self.overrides).get("algorithm", {})
        algorithm = {k: v for k, v in config["algorithm"].items() if k not in KEYED_AS_GIVEN.values()}
        for earlier, present in KEYED_AS_GIVEN.items():
            algorithm[earlier] = {**given.get(present, {}), **given.get(earlier, {})}
        config["algorithm"] = algorithm
        payload = {
            "config": config,
            "model": model_id,
            "test": self.test_settings,
            "rule": self.checkpoint,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]

    # the numbers --estimate and the report read
    @property
    def steps(self) -> int:
        return int(self.config["run"]["steps"])

    @property
    def train_responses(self) -> int:
        """Responses sampled for training (dynamic sampling samples more; the cost fit absorbs it)."""
        d = self.config["data"]
        return self.steps * int(d["batch_size"]) * int(d["group_size"])

    @property
    def validations(self) -> int:
        """Validations in a run: step 0, every ``eval_every`` steps, and the last step."""
        every = int(self.config["run"]["eval_every"])
        return 1 + self.steps // every + (1 if self.steps % every else 0)

    @property
    def val_samples(self) -> int:
        return self.validations * int(self.config["data"]["val_size"]) * int(self.config["run"]["eval_n"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "values": json.loads(self.values_json),
            "overrides": list(self.overrides),
            "model_path": self.model_path,
            "test": self.test_settings,
            "checkpoint": self.checkpoint,
            "label": self.label,
        }


def build_spec(
    method: Method,
    variant: str,
    group_size: int,
    seed: int,
    budget: Budget,
    model_path: str,
    values: dict[str, Any] | None = None,
    configs: Path = CONFIGS,
) -> RunSpec:
    """The run of one cell. ``values`` (the method's :func:`resolve_values`) may be passed to read each
    preset once per plan."""
    b = budget if budget.resolved else budget.resolve(configs)
    prompts = b.prompts_per_step(variant, group_size)
    overrides = list(method.overrides) + [
        f"data.group_size={group_size}",
        f"data.batch_size={prompts}",
        f"data.train_size={b.steps * prompts}",  # one epoch over the training set
        f"optim.mini_batch_size={b.mini_batch_size(prompts)}",
        f"optim.lr={b.lr}",
        f"rollout.max_new_tokens={b.max_new_tokens}",
        f"run.steps={b.steps}",
        f"run.eval_every={b.eval_every}",
        f"run.save_every={b.save_every}",
        f"run.eval_n={b.eval_n}",
        f"run.eval_k={b.eval_n}",
        f"data.val_size={b.val_size}",
        f"run.seed={seed}",
        f"run.threads={b.threads}",
        "run.device=cpu",
        "run.progress=false",
        "run.plot=false",
        f"model.path={model_path}",
        *b.settings,
    ]
    test = (
        ("size", b.test_size),
        ("n", b.test_n),
        ("temperature", b.test_temperature),
        ("best", b.test_best),
    )
    label = Cell(method.arm, method.name, variant, group_size, seed).label
    values = values if values is not None else resolve_values(method, configs)
    return RunSpec(
        json.dumps(values, sort_keys=True), tuple(overrides), model_path, test, method.checkpoint, label
    )


def spec_from_dict(row: dict[str, Any]) -> RunSpec:
    """The inverse of :meth:`RunSpec.to_dict`."""
    test = tuple((k, row["test"][k]) for k in ("size", "n", "temperature", "best"))
    return RunSpec(
        json.dumps(row["values"], sort_keys=True),
        tuple(row["overrides"]),
        row["model_path"],
        test,
        row["checkpoint"],
        row.get("label", ""),
    )


def model_path_from(configs: Path = CONFIGS, given: str | None = None) -> str:
    """The initial policy of every run, as an absolute path: ``given`` (``--model-path``), else ``model.path``
    of ``src/ebpo/configs/ebpo.yaml`` (relative to the working directory, as for ``ebpo train``), else the built-in
    base model's directory. Nothing is built here (``--dry-run`` and ``--report-only`` must not build it)."""
    if given is None:
        given = (load_config(Path(configs) / SHARED_PRESET).model.path) or None
    if given is None:
        from ebpo.models.build import default_base_model_path

        return str(default_base_model_path())
    return str(Path(given).expanduser().resolve())
