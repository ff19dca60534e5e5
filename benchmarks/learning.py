"""Learning benchmark: methods x group size G x seeds on ``arith``, at an equal budget of sampled responses.

    .venv/bin/python benchmarks/learning.py --quick              # smoke run: 2 methods, G=8, 1 seed, few steps
    .venv/bin/python benchmarks/learning.py                      # the full matrix (8 methods x 4 G x 3 seeds)
    .venv/bin/python benchmarks/learning.py --methods ebpo-naive grpo --groups 4 8 --seeds 0 1 2
    .venv/bin/python benchmarks/learning.py --select-options     # the small comparison that picks ebpo-best
    .venv/bin/python benchmarks/learning.py --report-only        # tables and plots from the finished runs

What one run is. A method (:data:`METHODS`: a preset of ``configs/`` plus ``key=value`` overrides) is trained
from the built-in ``arith`` base model through the trainer's public API (``load_config`` + ``Trainer``),
then the chosen checkpoint is evaluated on the fixed ``arith`` test set (``ebpo.eval`` benchmark ``arith``:
450 problems, 10 per topic x level cell) with ``--test-n`` samples per problem: avg@n Pass@1 and maj@k,
overall, per topic and per level. Training curves (reward, entropy, gradient norm, per-step KL, shrinkage,
saturated groups) come from the run's ``metrics.jsonl``.

Identical conditions. Every method's config is ``configs/ebpo.yaml`` without its ``algorithm`` section
(data: task, levels, validation set; rollout; optimizer; run), then the method's preset, then the budget
below; the resolved values are frozen into the run's spec when the matrix is planned.

Equal budget. Every run samples the same number of training responses: ``--responses-per-step`` R per
step for ``--steps`` steps, so a step holds R / G prompts (G = 4: 16 prompts, G = 32: 2 prompts with the
default R = 64) and the number of optimizer updates per step is the same for every G (``--updates``,
the paper's 4 = global batch 512 / mini-batch 128). The training set holds exactly steps x R / G prompts,
so every run is one epoch over its training set (the paper's curriculum setting; DAPO's dynamic sampling
draws more prompts and samples more responses, as DAPO does).

Checkpoint. ``--checkpoint paper`` (default) follows the paper (Appendix A): the best validation maj@k
checkpoint for every method except EBPO-diff, which uses the final one; ``best`` / ``last`` force one rule.

Resume. Each run writes ``<runs-dir>/<method>/G<g>/seed<s>/result.json`` last; a restarted matrix skips
runs whose ``result.json`` holds the same spec key, continues a killed run from its ``checkpoints/last``
(the trainer's exact resume) and a killed test evaluation from its cache. A spec that changed (steps,
budget, method options, resolved preset, model) is rerun from scratch.

Sizing the full matrix (2 hours on 2 CPU cores). 8 methods x 4 G x 3 seeds = 96 runs: 75 s of both cores
per run, or 150 s per run with ``--jobs 2`` (two single-threaded runs side by side; one torch thread per
run, as two threads per process on a busy 2-core machine ran 20-50x slower in our measurements). The
defaults (``--steps 60``, R = 64 responses per step, 2 updates per step; the validation set of configs/ebpo.yaml x 8
samples, 3 times per run; 450 test problems x 8 samples) were sized from CPU seconds measured on the base
model: a 6-step run with 2 validations took 11 s of CPU to train and 4 s to test, about 0.6-1 s per step,
so a default run needs roughly 50-80 CPU seconds (DAPO more: dynamic sampling samples up to 4x). Every
result records wall and CPU seconds; ``--estimate`` projects the wall time of the planned matrix on an idle
machine from the CPU seconds of the runs already finished.

Statistics. Per (method, G) the mean over seeds and a 95% confidence interval mean +- t_{0.975, n-1} s /
sqrt(n) (Student t over seeds; no interval with one seed). Outputs in ``--results-dir`` (default
``docs/results``): ``learning_<tag>.md`` (tables in the layout of the paper's Tables 1-3 and the clustering
ablation), ``learning_<tag>_runs.csv`` (one row per run) and PNG plots.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
RESULT_FILE = "result.json"
SPEC_FILE = "spec.json"
BEST_OPTIONS_FILE = "ebpo_best.json"
CURVE_METRICS = (
    "reward/mean",
    "actor/entropy",
    "actor/grad_norm",
    "actor/step_kl",
    "ebpo/shrinkage",
    "groups/all_fail",
    "groups/all_pass",
    "eval/pass@1",
)
"""Per-step metrics kept in a run's result (the curves of the paper's Figures 3-5, plus saturation)."""


# ---------------------------------------------------------------------------------------------------
# methods


@dataclass(frozen=True)
class MethodSpec:
    """One method of the comparison: a ``configs/`` preset plus ``key=value`` overrides.

    Attributes:
        name: the method's name in tables and run directories.
        preset: file name in ``configs/``.
        overrides: ``key=value`` trainer overrides applied after the preset.
        label: what the method is, for the tables.
        checkpoint: the paper's checkpoint rule for it: ``best`` (validation maj@k) or ``last``.
    """

    name: str
    preset: str
    overrides: tuple[str, ...] = ()
    label: str = ""
    checkpoint: str = "best"


METHODS: dict[str, MethodSpec] = {}
"""The method registry (``register_method``); the paper's comparison set plus EBPO option candidates."""

MAIN_METHODS = (
    "ebpo-naive",
    "ebpo-topic",
    "ebpo-diff",
    "ebpo-best",
    "grpo",
    "dr-grpo",
    "dapo",
    "entropymech",
)
"""The eight methods of the full matrix."""

OPTION_CANDIDATES = (
    "ebpo-naive",
    "ebpo-cluster",
    "ebpo-topic-cluster",
    "ebpo-latent",
    "ebpo-pooled",
    "ebpo-ewm",
)
"""EBPO variants compared by ``--select-options`` (SPEC section 2); the winner becomes ``ebpo-best``."""


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add a method; a second one with the same name raises."""
    if spec.name in METHODS:
        raise ValueError(f"method {spec.name!r} is already registered")
    METHODS[spec.name] = spec
    return spec


def get_method(name: str) -> MethodSpec:
    """The method registered as ``name``; an unknown name lists the valid ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; valid: {', '.join(METHODS)}") from None


for _spec in (
    MethodSpec("ebpo-naive", "ebpo.yaml", (), "EBPO, paper prior, random order (EBPO-naive)"),
    MethodSpec("ebpo-topic", "ebpo_topic.yaml", (), "EBPO, paper prior, topic-coherent batches (EBPO-topic)"),
    MethodSpec(
        "ebpo-diff", "ebpo_diff.yaml", (), "EBPO, paper prior, easy-to-hard curriculum (EBPO-diff)", "last"
    ),
    MethodSpec("grpo", "grpo.yaml", (), "GRPO"),
    MethodSpec("dr-grpo", "dr_grpo.yaml", (), "Dr. GRPO"),
    MethodSpec("dapo", "dapo.yaml", (), "DAPO"),
    MethodSpec("entropymech", "entropymech_clip_cov.yaml", (), "EntropyMech (Clip-Cov)"),
    MethodSpec("entropymech-klcov", "entropymech_kl_cov.yaml", (), "EntropyMech (KL-Cov)"),
    # SPEC section 2 option candidates (random order unless named -topic)
    MethodSpec(
        "ebpo-cluster",
        "ebpo.yaml",
        ("algorithm.estimator_options.prior_scope=cluster", "data.cluster_key=topic"),
        "EBPO, one prior per topic, random order",
    ),
    MethodSpec(
        "ebpo-topic-cluster",
        "ebpo_topic.yaml",
        ("algorithm.estimator_options.prior_scope=cluster", "data.cluster_key=topic"),
        "EBPO, one prior per topic, topic-coherent batches",
    ),
    MethodSpec("ebpo-latent", "ebpo.yaml", ("algorithm.estimator_options.tau2=latent",), "EBPO, latent tau2"),
    MethodSpec(
        "ebpo-pooled", "ebpo.yaml", ("algorithm.estimator_options.sigma2=pooled",), "EBPO, pooled sigma2"
    ),
    MethodSpec(
        "ebpo-ewm", "ebpo.yaml", ("algorithm.estimator_options.prior_memory=10",), "EBPO, prior half-life 10"
    ),
):
    register_method(_spec)

DEFAULT_BEST = "ebpo-topic-cluster"
"""``ebpo-best`` until ``--select-options`` has measured a winner: SPEC section 2's topic prior on
topic-coherent batches (its argument, not a measurement; the tables say which one was used)."""


def best_method(results_dir: Path) -> tuple[MethodSpec, str]:
    """``ebpo-best``: the candidate written by ``--select-options`` into ``<results_dir>/ebpo_best.json``,
    else :data:`DEFAULT_BEST`; returns the spec (renamed ``ebpo-best``) and how it was chosen."""
    path = Path(results_dir) / BEST_OPTIONS_FILE
    if path.is_file():
        chosen = json.loads(path.read_text())
        base, how = get_method(chosen["method"]), chosen["chosen_by"]
    else:
        base, how = get_method(DEFAULT_BEST), f"default {DEFAULT_BEST} (no {BEST_OPTIONS_FILE}: not measured)"
    spec = MethodSpec(
        "ebpo-best", base.preset, base.overrides, f"EBPO best options = {base.name}", base.checkpoint
    )
    return spec, how


# ---------------------------------------------------------------------------------------------------
# the budget and one run's spec


@dataclass(frozen=True)
class Budget:
    """What every run of a matrix shares (equal budget of sampled responses; see the module docstring)."""

    steps: int = 60
    responses_per_step: int = 64
    updates: int = 2
    lr: float | None = None
    max_new_tokens: int = 12
    val_size: int | None = None
    eval_n: int = 8
    evals: int = 3
    test_n: int = 8
    test_size: int = 450
    test_temperature: float = 1.0
    checkpoint: str = "paper"

    def __post_init__(self) -> None:
        for name in ("steps", "responses_per_step", "updates", "val_size", "eval_n", "test_n", "test_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"Budget.{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint not in ("paper", "best", "last"):
            raise ValueError(f"Budget.checkpoint must be paper | best | last, got {self.checkpoint!r}")

    def prompts_per_step(self, group_size: int) -> int:
        """R / G prompts per step; R must be a multiple of G (equal budget of responses)."""
        if self.responses_per_step % group_size:
            raise ValueError(
                f"responses_per_step={self.responses_per_step} is not a multiple of G={group_size}; "
                f"the equal budget needs R = prompts x G (e.g. --responses-per-step {group_size * 16})"
            )
        return self.responses_per_step // group_size

    def mini_batch_size(self, group_size: int) -> int:
        """Prompts per update: prompts / updates, with updates lowered to the largest divisor of the prompts."""
        prompts = self.prompts_per_step(group_size)
        updates = max(u for u in range(1, min(self.updates, prompts) + 1) if prompts % u == 0)
        return prompts // updates


SHARED_PRESET = "ebpo.yaml"
"""The preset whose data, rollout, optim, run and model sections every method shares (the presets say
"other settings as configs/ebpo.yaml"; loaded alone they would fall back to the config defaults)."""


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def resolve_preset(method: MethodSpec) -> dict[str, Any]:
    """The method's config values: ``configs/ebpo.yaml`` without its ``algorithm`` section, then the
    method's preset on top. Every method so trains on the same data, rollout, optimizer and run settings."""
    from ebpo.trainer.config import read_yaml

    shared = {k: v for k, v in read_yaml(CONFIGS / SHARED_PRESET).items() if k != "algorithm"}
    return _merge(shared, read_yaml(CONFIGS / method.preset))


@dataclass(frozen=True)
class RunSpec:
    """One cell of the matrix: a method at group size G with one seed, under a budget."""

    method: MethodSpec
    group_size: int
    seed: int
    budget: Budget
    model_path: str | None = None
    preset_values: str = ""

    @property
    def name(self) -> str:
        return f"{self.method.name}/G{self.group_size}/seed{self.seed}"

    def checkpoint_rule(self) -> str:
        return self.method.checkpoint if self.budget.checkpoint == "paper" else self.budget.checkpoint

    def overrides(self) -> list[str]:
        """Trainer overrides: the method's, then the budget's (the budget wins: identical conditions)."""
        b, G = self.budget, self.group_size
        prompts = b.prompts_per_step(G)
        eval_every = max(1, b.steps // b.evals)
        out = list(self.method.overrides) + [
            f"data.group_size={G}",
            f"data.batch_size={prompts}",
            f"data.train_size={b.steps * prompts}",
            f"optim.mini_batch_size={b.mini_batch_size(G)}",
            f"rollout.max_new_tokens={b.max_new_tokens}",
            f"run.steps={b.steps}",
            f"run.eval_every={eval_every}",
            f"run.save_every={eval_every}",
            f"run.eval_n={b.eval_n}",
            f"run.eval_k={b.eval_n}",
            f"run.seed={self.seed}",
            "run.progress=false",
            "run.plot=false",
            "run.device=cpu",
        ]
        out += [f"data.val_size={b.val_size}"] if b.val_size is not None else []
        out += [f"optim.lr={b.lr}"] if b.lr is not None else []
        if self.model_path is not None:
            out.append(f"model.path={self.model_path}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": asdict(self.method),
            "group_size": self.group_size,
            "seed": self.seed,
            "budget": asdict(self.budget),
            "model_path": self.model_path,
            "overrides": self.overrides(),
            "preset_values": json.loads(self.preset_values),
        }

    def key(self) -> str:
        """12 hex digits over everything that determines the run's result (the resolved preset included)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def __post_init__(self) -> None:
        if not self.preset_values:  # frozen at creation: a preset edited mid-matrix does not change this run
            object.__setattr__(self, "preset_values", json.dumps(resolve_preset(self.method), sort_keys=True))

    def load_config(self, threads: int | None = None):
        """The trainer config of this run: defaults <- resolved preset <- method and budget overrides."""
        from ebpo.trainer import load_config

        overrides = self.overrides() + ([f"run.threads={threads}"] if threads else [])
        return load_config(None, overrides, base=json.loads(self.preset_values))

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> RunSpec:
        method = MethodSpec(**{**row["method"], "overrides": tuple(row["method"]["overrides"])})
        return cls(
            method,
            int(row["group_size"]),
            int(row["seed"]),
            Budget(**row["budget"]),
            row.get("model_path"),
            json.dumps(row["preset_values"], sort_keys=True),
        )


def plan(
    methods: Sequence[MethodSpec],
    groups: Sequence[int],
    seeds: Sequence[int],
    budget: Budget,
    model_path: str | None = None,
) -> list[RunSpec]:
    """The matrix in run order: seed-major, so a partial matrix already has one seed of every cell."""
    for G in groups:
        budget.prompts_per_step(G)  # fail before any run if a G does not divide the budget
    return [RunSpec(m, G, s, budget, model_path) for s in seeds for G in groups for m in methods]


def run_dir(root: Path, spec: RunSpec) -> Path:
    return Path(root) / spec.method.name / f"G{spec.group_size}" / f"seed{spec.seed}"


def read_result(root: Path, spec: RunSpec) -> dict[str, Any] | None:
    """The finished result of ``spec`` under ``root``, or None (missing, unreadable or another spec key)."""
    path = run_dir(root, spec) / RESULT_FILE
    if not path.is_file():
        return None
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return result if result.get("key") == spec.key() else None


def write_json_atomic(path: Path, payload: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------
# one run: train (trainer API), test evaluation, result.json


def summarize_by(
    problems: Sequence[Any], records: Sequence[Any], attr: str, k: int
) -> dict[str, dict[str, float]]:
    """Pass@1 (avg@n) and maj@k of the problems grouped by ``record.<attr>`` (topic or level)."""
    from ebpo.eval.metrics import summarize

    by_id = {str(rec.id): rec for rec in records}
    groups: dict[str, list] = defaultdict(list)
    for problem in problems:
        groups[str(getattr(by_id[problem.id], attr))].append(problem)
    out = {}
    for name, members in sorted(groups.items()):
        summary = summarize(members, maj_ks=(k,))
        out[name] = {"pass@1": summary["pass@1"], f"maj@{k}": summary.get(f"maj@{k}", float("nan"))}
    return out


def curves_from_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """``{metric: [[step, value], ...]}`` for :data:`CURVE_METRICS` from a run's ``metrics.jsonl`` rows."""
    curves: dict[str, list[list[float]]] = {}
    for name in CURVE_METRICS:
        points = [[float(row["step"]), float(row[name])] for row in rows if name in row]
        if points:
            curves[name] = points
    return curves


def dynamics_summary(curves: dict[str, list[list[float]]]) -> dict[str, float]:
    """Scalar summaries of the training curves: mean over all steps and over the last quarter, max KL."""
    out: dict[str, float] = {}
    for name in ("reward/mean", "actor/entropy", "actor/grad_norm", "actor/step_kl", "groups/all_fail"):
        values = [v for step, v in curves.get(name, []) if step >= 1]
        if not values:
            continue
        tail = values[-max(1, len(values) // 4) :]
        out[f"{name}/mean"] = sum(values) / len(values)
        out[f"{name}/last_quarter"] = sum(tail) / len(tail)
        if name == "actor/step_kl":
            out[f"{name}/max"] = max(values)
    return out


def code_fingerprint() -> str:
    """12 hex digits over the text of every ``src/ebpo`` Python file: runs with different fingerprints ran
    different library code (the report lists them, so a table never mixes them silently)."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "src" / "ebpo").rglob("*.py")):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def execute(
    spec: RunSpec, root: Path, *, keep_checkpoints: bool = False, threads: int | None = None
) -> dict[str, Any]:
    """Train and evaluate one run (or continue it); write and return its ``result.json``."""
    import torch

    from ebpo.eval import SamplingConfig, evaluate, get_benchmark
    from ebpo.trainer import Trainer
    from ebpo.trainer.trainer import read_metrics

    done = read_result(root, spec)
    if done is not None:
        return done
    if threads:
        torch.set_num_threads(threads)
    directory = run_dir(root, spec)
    key = spec.key()
    spec_path = directory / SPEC_FILE
    if spec_path.is_file() and json.loads(spec_path.read_text()).get("key") != key:
        shutil.rmtree(directory)  # an older spec: start over
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(spec_path, {"key": key, **spec.to_dict()})

    cfg = spec.load_config(threads)
    code = code_fingerprint()
    last = directory / "checkpoints" / "last" / "trainer_state.pt"
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer = Trainer(cfg, run_dir=directory, resume=directory if last.is_file() else None)
    trained = trainer.train()
    train_s, train_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    best_step, best_val = trained.best_step, trained.best_score
    base_model = str(trainer.base_path)
    del trainer

    rule = spec.checkpoint_rule()
    model_dir = directory / "checkpoints" / rule / "model"
    checkpoint_step = best_step if rule == "best" else spec.budget.steps
    b = spec.budget
    benchmark = get_benchmark("arith")
    records = benchmark.load()
    start, cpu_start = time.perf_counter(), time.process_time()
    sampling = SamplingConfig(
        n=b.test_n,
        temperature=b.test_temperature,
        top_p=1.0,
        max_new_tokens=b.max_new_tokens,
        seed=0,
        batch_size=256,
    )
    evaluated = evaluate(
        str(model_dir),
        records,
        benchmark.reward,
        sampling,
        ks=(1, b.test_n),
        maj_ks=(b.test_n,),
        limit=b.test_size,
        cache_path=directory / f"test_{rule}.jsonl",
        device="cpu",
        dtype="float32",
    )
    eval_s, eval_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    k = b.test_n
    test = {
        name: value
        for name, value in evaluated.summary.items()
        if "/" not in name or name.endswith("se_problems")
    }
    test["by_topic"] = summarize_by(evaluated.problems, records, "topic", k)
    test["by_level"] = summarize_by(evaluated.problems, records, "level", k)
    curves = curves_from_metrics(read_metrics(directory))
    result = {
        "key": key,
        "spec": spec.to_dict(),
        "method": spec.method.name,
        "group_size": spec.group_size,
        "seed": spec.seed,
        "base_model": base_model,
        "code_fingerprint": code,
        "checkpoint": rule,
        "checkpoint_step": checkpoint_step,
        "val_best_maj": best_val,
        "val_best_step": best_step,
        "test": test,
        "curves": curves,
        "dynamics": dynamics_summary(curves),
        "train_s": train_s,
        "eval_s": eval_s,
        "train_cpu_s": train_cpu_s,
        "eval_cpu_s": eval_cpu_s,
        "threads": threads or torch.get_num_threads(),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    result = json.loads(json.dumps(result))  # the same types as a result read back from disk
    write_json_atomic(directory / RESULT_FILE, result)
    if not keep_checkpoints:  # a finished run needs only its result; checkpoints are ~10 MB each
        shutil.rmtree(directory / "checkpoints", ignore_errors=True)
        shutil.rmtree(directory / "tensorboard", ignore_errors=True)
    return result


def run_matrix(
    specs: Sequence[RunSpec],
    root: Path,
    *,
    jobs: int = 1,
    keep_checkpoints: bool = False,
    threads: int | None = 1,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run every spec that has no finished result, ``jobs`` at a time (each a single-threaded subprocess
    when ``jobs > 1``); returns the results of all specs that finished."""
    pending = [s for s in specs if read_result(root, s) is None]
    log(f"{len(specs)} runs in the matrix, {len(specs) - len(pending)} finished, {len(pending)} to run")
    if jobs <= 1:
        for i, spec in enumerate(pending, start=1):
            start = time.perf_counter()
            result = execute(spec, root, keep_checkpoints=keep_checkpoints, threads=threads)
            log(
                f"[{i}/{len(pending)}] {spec.name}: test pass@1 {result['test']['pass@1']:.3f} "
                f"({time.perf_counter() - start:.0f} s)"
            )
    else:
        running: list[tuple[RunSpec, subprocess.Popen, float]] = []
        queue, finished = list(pending), 0
        while queue or running:
            while queue and len(running) < jobs:
                spec = queue.pop(0)
                directory = run_dir(root, spec)
                directory.mkdir(parents=True, exist_ok=True)
                command = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--worker",
                    json.dumps(spec.to_dict()),
                    "--runs-dir",
                    str(root),
                    "--threads",
                    str(threads or 1),
                ] + (["--keep-checkpoints"] if keep_checkpoints else [])
                with open(directory / "worker.log", "a") as handle:
                    running.append(
                        (
                            spec,
                            subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT),
                            time.perf_counter(),
                        )
                    )
            time.sleep(1.0)
            for item in list(running):
                spec, process, started = item
                if process.poll() is None:
                    continue
                running.remove(item)
                finished += 1
                result = read_result(root, spec)
                status = (
                    f"test pass@1 {result['test']['pass@1']:.3f}"
                    if result
                    else f"FAILED (exit {process.returncode}; see {run_dir(root, spec) / 'worker.log'})"
                )
                log(
                    f"[{finished}/{len(pending)}] {spec.name}: {status} ({time.perf_counter() - started:.0f} s)"
                )
    return [r for r in (read_result(root, s) for s in specs) if r is not None]


# ---------------------------------------------------------------------------------------------------
# statistics


T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}
"""Student t quantile t_{0.975, df} (two-sided 95%), used when scipy is not installed."""


def t_quantile(df: int, level: float = 0.95) -> float:
    """Two-sided Student t quantile t_{(1+level)/2, df}: scipy when available, else :data:`T_975`
    (level 0.95 only; between tabled df the next smaller df, conservative; 1.96 beyond 30)."""
    if df < 1:
        raise ValueError(f"t_quantile needs df >= 1, got {df}")
    try:
        from scipy import stats

        return float(stats.t.ppf(0.5 + level / 2, df))
    except ImportError:
        if level != 0.95:
            raise ValueError("without scipy only level=0.95 is available") from None
        if df > 30:
            return 1.96
        return T_975[max(d for d in T_975 if d <= df)]


@dataclass(frozen=True)
class MeanCI:
    """Mean over seeds and the half-width of its 95% t interval (nan with one value)."""

    mean: float
    half_width: float
    n: int

    def format(self, scale: float = 100.0, digits: int = 1) -> str:
        if self.n == 0 or math.isnan(self.mean):
            return "-"
        text = f"{self.mean * scale:.{digits}f}"
        if self.n >= 2 and not math.isnan(self.half_width):
            text += f" ± {self.half_width * scale:.{digits}f}"
        return text


def mean_ci(values: Iterable[float], level: float = 0.95) -> MeanCI:
    """mean +- t_{(1+level)/2, n-1} * s / sqrt(n), s the sample standard deviation (ddof 1)."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(xs)
    if n == 0:
        return MeanCI(float("nan"), float("nan"), 0)
    mean = sum(xs) / n
    if n == 1:
        return MeanCI(mean, float("nan"), 1)
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return MeanCI(mean, t_quantile(n - 1, level) * s / math.sqrt(n), n)


def get_path(result: dict[str, Any], path: str) -> float:
    """``result`` value at a ``|``-separated path (``test|by_topic|mod|pass@1``); nan when absent."""
    node: Any = result
    for part in path.split("|"):
        if not isinstance(node, dict) or part not in node:
            return float("nan")
        node = node[part]
    return float(node) if node is not None else float("nan")


def aggregate(results: Sequence[dict[str, Any]], path: str) -> dict[tuple[str, int], MeanCI]:
    """``{(method, G): MeanCI over seeds}`` of the value at ``path`` (parts joined by ``|``)."""
    return aggregate_fn(results, lambda result: get_path(result, path))


def aggregate_fn(
    results: Sequence[dict[str, Any]], value: Callable[[dict[str, Any]], float]
) -> dict[tuple[str, int], MeanCI]:
    """``{(method, G): MeanCI over seeds}`` of ``value(result)``."""
    cells: dict[tuple[str, int], list[float]] = defaultdict(list)
    for result in results:
        cells[(result["method"], int(result["group_size"]))].append(value(result))
    return {cell: mean_ci(values) for cell, values in cells.items()}


def validation_point(result: dict[str, Any], which: str) -> float:
    """Validation pass@1 of a run before training (``first``), at its last step (``last``) or the
    ``change`` between them: whether the policy learned, whatever checkpoint the test used."""
    points = sorted(result.get("curves", {}).get("eval/pass@1", []))
    if not points:
        return float("nan")
    first, last = points[0][1], points[-1][1]
    return {"first": first, "last": last, "change": last - first}[which]


def table_validation(results: Sequence[dict[str, Any]], methods: Sequence[str]) -> str:
    """Methods x G: validation pass@1 before training, at the last step, and the change (paired per run)."""
    groups = _groups_in(results)
    header = ["method"]
    columns = []
    for G in groups:
        for which, label in (("first", "step 0"), ("last", "last step"), ("change", "change")):
            header.append(f"G={G} {label}")
            agg = aggregate_fn(results, lambda r, which=which: validation_point(r, which))
            columns.append(
                {m: agg.get((m, G), MeanCI(float("nan"), float("nan"), 0)).format() for m in methods}
            )
    return markdown_table(header, [[m] + [col[m] for col in columns] for m in methods])


def curve_band(
    results: Sequence[dict[str, Any]], method: str, G: int, metric: str
) -> tuple[list, list, list]:
    """Steps, mean and 95% half-width over seeds of one curve (steps present in every seed)."""
    runs = [
        r for r in results if r["method"] == method and int(r["group_size"]) == G and metric in r["curves"]
    ]
    if not runs:
        return [], [], []
    by_step = [dict((int(s), v) for s, v in r["curves"][metric]) for r in runs]
    steps = sorted(set.intersection(*(set(d) for d in by_step)))
    stats = [mean_ci([d[s] for d in by_step]) for s in steps]
    return steps, [c.mean for c in stats], [0.0 if math.isnan(c.half_width) else c.half_width for c in stats]


def select_best(results: Sequence[dict[str, Any]], candidates: Sequence[str]) -> tuple[str, str]:
    """The candidate with the highest mean validation maj@k (its best checkpoint's, as the paper selects
    checkpoints) over all its runs: never the test set. Returns (method, how it was chosen)."""
    scores = {}
    for name in candidates:
        values = [
            r["val_best_maj"] for r in results if r["method"] == name and r.get("val_best_maj") is not None
        ]
        if values:
            scores[name] = mean_ci(values)
    if not scores:
        raise ValueError(f"no finished runs of the candidates {list(candidates)}")
    top = max(c.mean for c in scores.values())
    tied = sorted(name for name, c in scores.items() if c.mean == top)
    # a tie (e.g. every candidate's best checkpoint is the base model) goes to SPEC section 2's default
    winner = DEFAULT_BEST if DEFAULT_BEST in tied else tied[0]
    table = ", ".join(
        f"{n} {c.mean:.3f} (n={c.n})" for n, c in sorted(scores.items(), key=lambda kv: -kv[1].mean)
    )
    how = f"highest mean validation maj@k over {scores[winner].n} runs: {table}"
    if len(tied) > 1:
        how += f"; a tie between {', '.join(tied)}, broken in favour of {winner}"
    return winner, how


# ---------------------------------------------------------------------------------------------------
# tables


def _methods_in(results: Sequence[dict[str, Any]], order: Sequence[str]) -> list[str]:
    present = {r["method"] for r in results}
    ordered = [m for m in dict.fromkeys(order) if m in present]
    return ordered + sorted(present - set(ordered))


def _groups_in(results: Sequence[dict[str, Any]]) -> list[int]:
    return sorted({int(r["group_size"]) for r in results})


def _bold_best(cells: dict[str, MeanCI], formatted: dict[str, str]) -> dict[str, str]:
    valid = {m: c.mean for m, c in cells.items() if c.n and not math.isnan(c.mean)}
    if len(set(valid.values())) < 2:  # one method, or all tied: nothing stands out
        return formatted
    top = max(valid.values())
    return {m: (f"**{text}**" if m in valid and valid[m] == top else text) for m, text in formatted.items()}


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def table_by_column(
    results: Sequence[dict[str, Any]],
    G: int,
    column_paths: Sequence[tuple[str, str]],
    methods: Sequence[str],
) -> str:
    """Methods x columns at one G (the paper's Table 1 layout), best per column in bold."""
    columns: list[dict[str, str]] = []
    for _, path in column_paths:
        cells = {
            m: aggregate(results, path).get((m, G), MeanCI(float("nan"), float("nan"), 0)) for m in methods
        }
        columns.append(_bold_best(cells, {m: c.format() for m, c in cells.items()}))
    n_seeds = {m: aggregate(results, "test|pass@1").get((m, G), MeanCI(0, 0, 0)).n for m in methods}
    steps = {m: checkpoint_steps(results, m, G) for m in methods}
    rows = [[m, str(n_seeds[m]), steps[m]] + [col[m] for col in columns] for m in methods if n_seeds[m]]
    return markdown_table(["method", "seeds", "tested step"] + [label for label, _ in column_paths], rows)


def checkpoint_steps(results: Sequence[dict[str, Any]], method: str, G: int) -> str:
    """The tested checkpoints' steps over seeds (0 = the base model: no validation gain), e.g. ``0, 40``."""
    runs = sorted(
        (r for r in results if r["method"] == method and int(r["group_size"]) == G), key=lambda r: r["seed"]
    )
    return ", ".join(str(r["checkpoint_step"]) for r in runs)


def table_by_group(results: Sequence[dict[str, Any]], methods: Sequence[str], k: int) -> str:
    """Methods x G: test Pass@1 and maj@k (the paper's Table 2 layout), best per G in bold."""
    groups = _groups_in(results)
    header = ["method"] + [f"G={G} Pass@1" for G in groups] + [f"G={G} maj@{k}" for G in groups]
    columns = []
    for path in ("test|pass@1", f"test|maj@{k}"):
        agg = aggregate(results, path)
        for G in groups:
            cells = {m: agg.get((m, G), MeanCI(float("nan"), float("nan"), 0)) for m in methods}
            columns.append(_bold_best(cells, {m: c.format() for m, c in cells.items()}))
    rows = [[m] + [col[m] for col in columns] for m in methods]
    return markdown_table(header, rows)


def table_margin(results: Sequence[dict[str, Any]], ours: str, baselines: Sequence[str]) -> str:
    """EBPO minus each baseline in test Pass@1 per G (mean over seeds of the paired difference, 95% CI):
    the paper's claim that the margin is largest at small G. Pairs are runs with the same seed."""
    groups = _groups_in(results)
    by_cell = {(r["method"], int(r["group_size"]), int(r["seed"])): r["test"]["pass@1"] for r in results}
    rows = []
    for base in baselines:
        row = [f"{ours} − {base}"]
        for G in groups:
            diffs = [
                by_cell[(ours, G, s)] - by_cell[(base, G, s)]
                for (m, g, s) in by_cell
                if m == ours and g == G and (base, G, s) in by_cell
            ]
            row.append(mean_ci(diffs).format())
        rows.append(row)
    return markdown_table(["difference (Pass@1, points)"] + [f"G={G}" for G in groups], rows)


def table_dynamics(results: Sequence[dict[str, Any]], G: int, methods: Sequence[str]) -> str:
    """Training dynamics at one G: entropy, gradient norm, per-step KL, saturated failure groups."""
    paths = [
        ("entropy (mean)", "dynamics|actor/entropy/mean", 1.0, 3),
        ("entropy (last 25%)", "dynamics|actor/entropy/last_quarter", 1.0, 3),
        ("grad norm (mean)", "dynamics|actor/grad_norm/mean", 1.0, 3),
        ("grad norm (last 25%)", "dynamics|actor/grad_norm/last_quarter", 1.0, 3),
        ("step KL ×1e3 (mean)", "dynamics|actor/step_kl/mean", 1e3, 3),
        ("step KL ×1e3 (max)", "dynamics|actor/step_kl/max", 1e3, 3),
        ("all-fail groups % (mean)", "dynamics|groups/all_fail/mean", 100.0, 1),
        ("train reward % (last 25%)", "dynamics|reward/mean/last_quarter", 100.0, 1),
    ]
    rows = []
    for m in methods:
        row = [m]
        for _, path, scale, digits in paths:
            row.append(
                aggregate(results, path)
                .get((m, G), MeanCI(float("nan"), float("nan"), 0))
                .format(scale, digits)
            )
        rows.append(row)
    return markdown_table(["method"] + [label for label, *_ in paths], rows)


def topic_columns(results: Sequence[dict[str, Any]], k: int) -> list[tuple[str, str]]:
    topics = sorted({t for r in results for t in r["test"].get("by_topic", {})})
    return [(t, f"test|by_topic|{t}|pass@1") for t in topics] + [
        ("all Pass@1", "test|pass@1"),
        (f"all maj@{k}", f"test|maj@{k}"),
    ]


def level_columns(results: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    levels = sorted({lv for r in results for lv in r["test"].get("by_level", {})}, key=int)
    return [(f"level {lv}", f"test|by_level|{lv}|pass@1") for lv in levels] + [("all", "test|pass@1")]


def report_markdown(results: Sequence[dict[str, Any]], *, tag: str, command: str, best_how: str = "") -> str:
    """The generated results page: what ran, then the tables."""
    if not results:
        return f"# Learning benchmark ({tag})\n\nNo finished runs yet. Run `{command}`.\n"
    k = int(results[0]["spec"]["budget"]["test_n"])
    methods = _methods_in(results, MAIN_METHODS + OPTION_CANDIDATES)
    groups = _groups_in(results)
    b = results[0]["spec"]["budget"]
    seeds = sorted({int(r["seed"]) for r in results})
    preset = results[0]["spec"].get("preset_values", {})
    lr = b["lr"] if b["lr"] is not None else preset.get("optim", {}).get("lr", "default")
    val_size = (
        b["val_size"] if b["val_size"] is not None else preset.get("data", {}).get("val_size", "default")
    )
    levels = preset.get("data", {}).get("levels")
    wall = sum(r["train_s"] + r["eval_s"] for r in results)
    lines = [
        f"# Learning benchmark ({tag})",
        "",
        f"Generated by `{command}` from {len(results)} finished runs; methods {', '.join(methods)}; "
        f"G in {groups}; seeds {seeds}. Values are percentages, mean ± 95% t-interval half-width over seeds "
        "(no interval with one seed).",
        "",
        f"Budget per run: {b['steps']} steps x {b['responses_per_step']} sampled responses (R / G prompts per "
        f"step, {b['updates']} updates per step), lr {lr}, responses <= {b['max_new_tokens']} tokens; "
        f"validation {val_size} problems x {b['eval_n']} samples ({b['evals']} times + before); test: the "
        f"first {b['test_size']} problems of the `arith` test set x {b['test_n']} samples at T = "
        f"{b['test_temperature']}; checkpoint rule `{b['checkpoint']}`. Total run time {wall / 60:.1f} min "
        f"({wall / len(results):.0f} s per run). Training levels {levels} (from configs/ebpo.yaml); the test "
        "set has all five levels. `tested step` = the checkpoint's step per seed (0 = no validation gain over the "
        "base model, so the base model is what was tested).",
        "",
    ]
    codes: dict[str, list[str]] = defaultdict(list)
    for r in results:
        codes[r.get("code_fingerprint", "not recorded")].append(
            f"{r['method']}/G{r['group_size']}/s{r['seed']}"
        )
    if len(codes) > 1:
        lines += [
            "**Warning: these runs ran different library code** (`src/ebpo` changed while the matrix ran): "
            + "; ".join(f"`{c}`: {', '.join(sorted(runs))}" for c, runs in sorted(codes.items())),
            "",
        ]
    if best_how and "ebpo-best" in methods:
        lines += [f"`ebpo-best` = {best_how}.", ""]
    G0 = groups[0]
    lines += [
        f"## Test Pass@1 per topic, G = {G0} (layout of the paper's Table 1)",
        "",
        table_by_column(results, G0, topic_columns(results, k), methods),
        "",
    ]
    lines += [
        "## Test Pass@1 and maj@k across G (layout of the paper's Table 2)",
        "",
        table_by_group(results, methods, k),
        "",
    ]
    baselines = [m for m in ("grpo", "dr-grpo", "dapo", "entropymech") if m in methods]
    for ours in ("ebpo-topic", "ebpo-best", "ebpo-naive"):
        if ours in methods and baselines:
            lines += [
                f"## Margin of {ours} over the baselines per G (paired by seed)",
                "",
                table_margin(results, ours, baselines),
                "",
            ]
            break
    lines += [
        f"## Test Pass@1 per level, G = {G0} (the curriculum comparison, paper Figure 5)",
        "",
        table_by_column(results, G0, level_columns(results), methods),
        "",
    ]
    if "ebpo-topic" in methods and "ebpo-naive" in methods:
        lines += [
            f"## Clustering ablation, G = {G0} (paper Table 5)",
            "",
            table_by_column(
                results,
                G0,
                topic_columns(results, k),
                [m for m in ("ebpo-topic", "ebpo-naive") if m in methods],
            ),
            "",
        ]
    lines += [
        "## Did the policy learn? Validation pass@1 before training and at the last step",
        "",
        "Independent of the checkpoint rule (the test above uses the paper's rule). Validation set: "
        f"{val_size} problems x {b['eval_n']} samples, the training levels only.",
        "",
        table_validation(results, methods),
        "",
    ]
    for G in groups:
        lines += [
            f"## Training dynamics, G = {G} (paper Figures 3-5)",
            "",
            table_dynamics(results, G, methods),
            "",
        ]
    return "\n".join(lines)


def write_csv(results: Sequence[dict[str, Any]], path: Path) -> None:
    """One row per run: identity, checkpoint, test metrics overall / per topic / per level, dynamics."""
    rows = []
    for r in sorted(results, key=lambda r: (r["method"], int(r["group_size"]), int(r["seed"]))):
        row: dict[str, Any] = {
            "method": r["method"],
            "G": r["group_size"],
            "seed": r["seed"],
            "checkpoint": r["checkpoint"],
            "checkpoint_step": r["checkpoint_step"],
            "val_best_maj": r["val_best_maj"],
            "train_s": round(r["train_s"], 1),
            "eval_s": round(r["eval_s"], 1),
        }
        for name, value in r["test"].items():
            if isinstance(value, dict):
                for group, metrics in value.items():
                    for metric, v in metrics.items():
                        row[f"test/{name}/{group}/{metric}"] = v
            else:
                row[f"test/{name}"] = value
        row.update({f"dyn/{k}": v for k, v in r["dynamics"].items()})
        rows.append(row)
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


# ---------------------------------------------------------------------------------------------------
# plots


def plot_curves(results: Sequence[dict[str, Any]], G: int, path: Path, methods: Sequence[str]) -> Path:
    """Reward, entropy, gradient norm, per-step KL per step at one G: mean over seeds, 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("reward/mean", "train reward"),
        ("actor/entropy", "policy entropy"),
        ("actor/grad_norm", "gradient norm"),
        ("actor/step_kl", "KL(pi_t || pi_t+1)"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5))
    for ax, (metric, title) in zip(axes.flat, panels):
        for m in methods:
            steps, mean, half = curve_band(results, m, G, metric)
            steps, mean, half = (
                zip(*[(s, v, h) for s, v, h in zip(steps, mean, half) if s >= 1]) if steps else ([],) * 3
            )
            if not steps:
                continue
            line = ax.plot(steps, mean, label=m, linewidth=1.3)[0]
            ax.fill_between(
                steps,
                [v - h for v, h in zip(mean, half)],
                [v + h for v, h in zip(mean, half)],
                color=line.get_color(),
                alpha=0.15,
                linewidth=0,
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"training dynamics, G = {G} (mean over seeds, 95% band)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_vs_group(results: Sequence[dict[str, Any]], path: Path, methods: Sequence[str]) -> Path:
    """Test Pass@1 against G per method with 95% error bars (the paper's Table 2 as a figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate(results, "test|pass@1")
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for m in methods:
        points = sorted((G, c) for (name, G), c in agg.items() if name == m)
        if not points:
            continue
        ax.errorbar(
            [G for G, _ in points],
            [100 * c.mean for _, c in points],
            yerr=[0 if math.isnan(c.half_width) else 100 * c.half_width for _, c in points],
            marker="o",
            capsize=3,
            label=m,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("group size G (equal budget of responses)")
    ax.set_ylabel("test Pass@1 (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_by_level(results: Sequence[dict[str, Any]], G: int, path: Path, methods: Sequence[str]) -> Path:
    """Test Pass@1 per level at one G (the paper's curriculum figure), 95% error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = [c for c in level_columns(results) if c[0] != "all"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        cells = [aggregate(results, p).get((m, G), MeanCI(float("nan"), float("nan"), 0)) for _, p in columns]
        xs = [j + i * width for j in range(len(columns))]
        ax.bar(
            xs,
            [100 * c.mean for c in cells],
            width,
            yerr=[0 if math.isnan(c.half_width) else 100 * c.half_width for c in cells],
            capsize=2,
            label=m,
        )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(columns))], [label for label, _ in columns])
    ax.set_ylabel("test Pass@1 (%)")
    ax.set_title(f"per level, G = {G}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def estimate_seconds(specs: Sequence[RunSpec], finished: Sequence[dict[str, Any]], jobs: int) -> float:
    """Projected wall seconds of ``specs`` on an idle machine with ``jobs`` single-threaded runs at once:
    per run the mean CPU seconds (train + test) of finished runs of the same method scaled by steps, else of
    all finished runs; the sum divided by ``jobs``."""
    per_step: dict[str, list[float]] = defaultdict(list)
    for r in finished:
        if "train_cpu_s" in r:
            steps = int(r["spec"]["budget"]["steps"])
            per_step[r["method"]].append((r["train_cpu_s"] + r["eval_cpu_s"]) / steps)
    if not per_step:
        raise ValueError("no finished runs with CPU seconds to estimate from")
    overall = [v for values in per_step.values() for v in values]
    total = 0.0
    for spec in specs:
        values = per_step.get(spec.method.name) or overall
        total += sum(values) / len(values) * spec.budget.steps
    return total / max(1, jobs)


def estimate_text(specs: Sequence[RunSpec], finished: Sequence[dict[str, Any]], jobs: int) -> str:
    seconds = estimate_seconds(specs, finished, jobs)
    return (
        f"{len(specs)} runs, projected {seconds / 60:.1f} min with --jobs {jobs} on an idle machine "
        f"(from {len(finished)} finished runs' CPU seconds per step)"
    )


def load_results(root: Path) -> list[dict[str, Any]]:
    """Every finished ``result.json`` under ``root`` (any spec)."""
    out = []
    for path in sorted(Path(root).glob(f"*/G*/seed*/{RESULT_FILE}")):
        try:
            out.append(json.loads(path.read_text()))
        except json.JSONDecodeError:
            continue
    return out


def write_report(
    results: Sequence[dict[str, Any]], results_dir: Path, tag: str, command: str, best_how: str = ""
) -> list[Path]:
    """``learning_<tag>.md``, ``learning_<tag>_runs.csv`` and the PNGs; returns the written paths."""
    results_dir.mkdir(parents=True, exist_ok=True)
    written = [results_dir / f"learning_{tag}.md"]
    written[0].write_text(report_markdown(results, tag=tag, command=command, best_how=best_how))
    if not results:
        return written
    methods = _methods_in(results, MAIN_METHODS + OPTION_CANDIDATES)
    groups = _groups_in(results)
    written.append(results_dir / f"learning_{tag}_runs.csv")
    write_csv(results, written[-1])
    for G in groups:
        written.append(plot_curves(results, G, results_dir / f"learning_{tag}_curves_G{G}.png", methods))
    written.append(
        plot_by_level(results, groups[0], results_dir / f"learning_{tag}_levels_G{groups[0]}.png", methods)
    )
    if len(groups) > 1:
        written.append(plot_vs_group(results, results_dir / f"learning_{tag}_vs_G.png", methods))
    return written


# ---------------------------------------------------------------------------------------------------
# command line


QUICK = {
    "methods": ["ebpo-naive", "grpo"],
    "groups": [8],
    "seeds": [0],
    "steps": 8,
    "test_size": 90,
    "test_n": 4,
    "eval_n": 4,
    "evals": 1,
}
"""``--quick``: a smoke run of a few minutes (2 methods, one G, one seed, 8 steps, 90 test problems x 4)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: methods ebpo-naive and grpo, G=8, seed 0, 8 steps, 90 test problems x 4 "
        "samples; explicit flags still override",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help=f"methods to run (default: the eight of the full matrix: {' '.join(MAIN_METHODS)}); "
        f"valid: {', '.join(['ebpo-best', *METHODS])}",
    )
    parser.add_argument(
        "--groups", nargs="+", type=int, default=None, help="group sizes G (default 4 8 16 32)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds (default 0 1 2)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default 60)")
    parser.add_argument(
        "--responses-per-step",
        type=int,
        default=Budget.responses_per_step,
        help="R: sampled responses per step, equal for every G (prompts per step = R / G; default 64)",
    )
    parser.add_argument(
        "--updates",
        type=int,
        default=Budget.updates,
        help="optimizer updates per step (mini-batch = prompts / updates; default 2)",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=Budget.lr,
        help="learning rate of every method (default: configs/ebpo.yaml's)",
    )
    parser.add_argument(
        "--val-size", type=int, default=None, help="validation problems (default: configs/ebpo.yaml's)"
    )
    parser.add_argument(
        "--eval-n",
        type=int,
        default=None,
        help="validation samples per problem; maj@eval_n picks the best checkpoint (default 8)",
    )
    parser.add_argument(
        "--evals", type=int, default=None, help="validations during a run besides step 0 (default 3)"
    )
    parser.add_argument(
        "--test-size",
        type=int,
        default=None,
        help="first N problems of the arith test set (default 450 = all; multiples of 45 keep cells even)",
    )
    parser.add_argument(
        "--test-n", type=int, default=None, help="test samples per problem: avg@n and maj@n (default 8)"
    )
    parser.add_argument(
        "--checkpoint",
        choices=["paper", "best", "last"],
        default="paper",
        help="checkpoint to test: paper (best validation maj@k; EBPO-diff the last), best, last",
    )
    parser.add_argument(
        "--model-path",
        default=None,
        help="policy to start from (default: the built-in arith base model, its directory resolved and frozen "
        "into every run's spec when the matrix is planned)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs side by side, each a single-threaded subprocess (2 on 2 cores; default 1)",
    )
    parser.add_argument(
        "--runs-dir", default=None, help="where run directories go (default runs/bench_learning/<tag>)"
    )
    parser.add_argument(
        "--results-dir",
        default=str(REPO / "docs" / "results"),
        help="where tables, CSV and PNGs go (default docs/results)",
    )
    parser.add_argument(
        "--tag", default=None, help="name of this matrix in file names (default full, or quick)"
    )
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep checkpoints of finished runs")
    parser.add_argument(
        "--select-options",
        action="store_true",
        help=f"run the EBPO option candidates ({', '.join(OPTION_CANDIDATES)}) and write the winner "
        f"by validation maj@k to <results-dir>/{BEST_OPTIONS_FILE}, which ebpo-best then uses",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="only rebuild tables and plots from finished runs"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the planned runs and their status, run nothing"
    )
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="project the planned matrix's wall time on an idle machine from finished runs' CPU seconds",
    )
    parser.add_argument(
        "--configs-dir",
        default=None,
        help="read the presets from this directory instead of configs/ (e.g. a snapshot, so a matrix continued "
        "later uses the presets of its first part)",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads per run (default 1: on a shared or 2-core machine one thread per run wastes "
        "least; CPU seconds per run are recorded beside wall seconds)",
    )
    return parser


def default_model_path() -> str:
    """The built-in base model's directory, built now if needed (once, before any run), so every run of the
    matrix starts from the same weights even if the base model's defaults change while the matrix runs."""
    from ebpo.models.base_model import build_base_model

    return str(build_base_model())


def budget_from_args(args: argparse.Namespace) -> Budget:
    quick = QUICK if args.quick else {}

    def pick(name: str, default: Any) -> Any:
        value = getattr(args, name)
        return value if value is not None else quick.get(name, default)

    return Budget(
        steps=pick("steps", Budget.steps),
        responses_per_step=args.responses_per_step,
        updates=args.updates,
        lr=args.lr,
        val_size=pick("val_size", Budget.val_size),
        eval_n=pick("eval_n", Budget.eval_n),
        evals=pick("evals", Budget.evals),
        test_n=pick("test_n", Budget.test_n),
        test_size=pick("test_size", Budget.test_size),
        checkpoint=args.checkpoint,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker is not None:  # one run in a subprocess (--jobs > 1)
        execute(
            RunSpec.from_dict(json.loads(args.worker)),
            Path(args.runs_dir),
            keep_checkpoints=args.keep_checkpoints,
            threads=args.threads,
        )
        return 0
    if args.configs_dir is not None:
        global CONFIGS
        CONFIGS = Path(args.configs_dir)
    tag = args.tag or ("options" if args.select_options else "quick" if args.quick else "full")
    results_dir = Path(args.results_dir)
    root = Path(args.runs_dir or REPO / "runs" / "bench_learning" / tag)
    budget = budget_from_args(args)
    best_spec, best_how = best_method(results_dir)
    default_methods = list(OPTION_CANDIDATES) if args.select_options else list(MAIN_METHODS)
    names = args.methods or (QUICK["methods"] if args.quick else default_methods)
    methods = [best_spec if name == "ebpo-best" else get_method(name) for name in names]
    groups = args.groups or (QUICK["groups"] if args.quick else [4, 8, 16, 32])
    seeds = args.seeds if args.seeds is not None else (QUICK["seeds"] if args.quick else [0, 1, 2])
    specs = plan(methods, groups, seeds, budget, args.model_path or default_model_path())
    command = "python benchmarks/learning.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        for spec in specs:
            status = "done" if read_result(root, spec) else "to run"
            print(f"{spec.name:<32} {status:<7} {' '.join(spec.overrides())}")
        return 0
    if args.estimate:
        print(estimate_text(specs, load_results(root), args.jobs))
        return 0
    if not args.report_only:
        start = time.perf_counter()
        run_matrix(specs, root, jobs=args.jobs, keep_checkpoints=args.keep_checkpoints, threads=args.threads)
        print(f"matrix wall time {time.perf_counter() - start:.0f} s")
    keys = {spec.key() for spec in specs}
    results = [r for r in load_results(root) if r.get("key") in keys]
    if args.select_options:
        winner, how = select_best(results, [m.name for m in methods])
        write_json_atomic(
            results_dir / BEST_OPTIONS_FILE, {"method": winner, "chosen_by": how, "command": command}
        )
        print(f"ebpo-best = {winner}: {how}")
    for path in write_report(results, results_dir, tag, command, best_how if "ebpo-best" in names else ""):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
