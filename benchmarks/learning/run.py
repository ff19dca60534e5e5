"""One run: train through the trainer's public API (``ebpo.trainer.Trainer``), test, write ``result.json``.

A run directory is ``<runs-dir>/<key>/`` (the key of :class:`~benchmarks.learning.spec.RunSpec`). It holds
``spec.json`` (written first), the trainer's files, the test caches and ``result.json`` (written last, then
the checkpoints are removed unless kept). Restarting a run:

- ``result.json`` with this key: done, read back;
- a complete ``checkpoints/last``: resumed exactly (the trainer's bit-exact resume); a kill during testing
  resumes the test from its cache;
- otherwise a previous attempt killed before its first checkpoint (or nothing): started fresh with
  ``overwrite=True``, which the trainer requires to replace an earlier attempt's files.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.learning.methods import REPO
from benchmarks.learning.spec import RunSpec
from benchmarks.learning.testbeds import answer_kinds_of, benchmark_of

RESULT_FILE = "result.json"
TEST_SAMPLES = "test_last.jsonl"
"""The final checkpoint's test samples (the evaluation cache: per problem its rewards and answers)."""
SPEC_FILE = "spec.json"
LOG_FILE = "run.log"
CURVE_METRICS = (
    "eval/pass@1",
    "reward/mean",
    "actor/entropy",
    "actor/grad_norm",
    "actor/step_kl",
    "groups/all_fail",
    "groups/all_pass",
    "ebpo/shrinkage",
    "actor/clip_cov_frac",
    "actor/kl_cov_frac",
)
"""Per-step metrics kept in a result (the paper's Figures 3-5, saturation, EntropyMech's selected fraction)."""


def run_dir(root: Path, spec: RunSpec) -> Path:
    return Path(root) / spec.key


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON so that a kill leaves the old file or the new one, never part of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_result(root: Path, spec: RunSpec) -> dict[str, Any] | None:
    """The finished result of ``spec`` under ``root``, or None (missing, torn, or another key)."""
    path = run_dir(root, spec) / RESULT_FILE
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return result if isinstance(result, dict) and result.get("key") == spec.key else None


def load_results(root: Path) -> dict[str, dict[str, Any]]:
    """Every readable ``result.json`` directly under ``root``, by key."""
    out = {}
    for path in sorted(Path(root).glob(f"*/{RESULT_FILE}")):
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(result, dict) and "key" in result:
            out[result["key"]] = result
    return out


def add_answer_kinds(results: dict[str, dict[str, Any]], root: Path) -> None:
    """Give each ``arith`` result written before the test's answer kinds were recorded its kinds, from its run's
    ``test_last.jsonl`` under ``root`` (:func:`backfill_answer_kinds`), in memory. The report calls it; planning
    and time estimates do not need the kinds."""
    gold: dict[str, str] | None = None
    for key, result in results.items():
        samples = Path(root) / key / TEST_SAMPLES
        test = result.get("test", {})
        if "answer_kinds" not in test and test.get("benchmark", "arith") == "arith" and samples.is_file():
            gold = gold if gold is not None else arith_test_answers()
            backfill_answer_kinds(result, samples, gold)


def arith_test_answers() -> dict[str, str]:
    """The gold answer of every ``arith`` test problem, by id."""
    from ebpo.eval import get_benchmark

    return {str(rec.id): rec.answer for rec in get_benchmark("arith").load()}


def backfill_answer_kinds(result: dict[str, Any], samples: Path, gold: dict[str, str]) -> None:
    """Put the answer kinds of a run's test samples (``samples``: the evaluation cache, one JSON line per
    problem with its ``answers``) into ``result["test"]``, in memory; unreadable lines leave it as it was."""
    try:
        lines = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
        pairs = [(line["answers"], gold[line["id"]]) for line in lines]
    except (OSError, ValueError, KeyError, TypeError):
        return
    from ebpo.tasks.arith import answer_kind_shares

    shares = answer_kind_shares(pairs)
    if shares:
        result["test"]["answer_kinds"] = shares


def _platform_info() -> dict[str, str]:
    from ebpo.models.kernels import platform_info

    return platform_info()


def code_fingerprint() -> str:
    """12 hex digits over every ``src/ebpo`` Python file: results with different fingerprints ran different
    library code (the report says so)."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "src" / "ebpo").rglob("*.py")):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def curves_from_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """``{metric: [[step, value], ...]}`` of :data:`CURVE_METRICS` plus every ``eval/maj@k``."""
    names = list(CURVE_METRICS) + sorted({k for row in rows for k in row if k.startswith("eval/maj@")})
    curves = {}
    for name in names:
        points = [[float(row["step"]), float(row[name])] for row in rows if name in row]
        if points:
            curves[name] = points
    return curves


def _last_checkpoint(directory: Path) -> Path | None:
    """The complete ``checkpoints/last`` of a previous attempt (recovered if a save was interrupted)."""
    from ebpo.trainer.checkpoint import find_checkpoint
    from ebpo.trainer.config import ConfigError

    if not (directory / "checkpoints").exists():
        return None
    try:
        return find_checkpoint(directory)
    except ConfigError:
        return None


def _trainer_class() -> type:
    from ebpo.trainer import Trainer

    class TimedTrainer(Trainer):
        """The trainer, adding up the CPU seconds of its validations (so that ``--estimate`` can tell the
        cost of a training response from that of a sampled answer)."""

        val_cpu_s = 0.0

        def evaluate(self) -> dict[str, float]:
            start = time.process_time()
            try:
                return super().evaluate()
            finally:
                self.val_cpu_s += time.process_time() - start

    return TimedTrainer


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc's allocator to serve tensors of up to 32 MiB from its heap and to keep freed memory for reuse
    (``mallopt``), once per process; returns whether it took the settings (False off glibc).

    By default glibc maps a fresh zeroed region for every large tensor and unmaps it when freed, so each
    training step pays about ten thousand page faults (a tenth of its CPU time on the shipped model). The
    numbers computed are the same: only where tensors live changes, and PyTorch aligns them either way."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's <malloc.h>
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))


def evaluate_checkpoint(spec: RunSpec, model_dir: Path, cache: Path) -> dict[str, Any]:
    """Pass@1 (avg@n) and maj@n of ``model_dir`` on the first ``test["size"]`` problems of the test set of the
    run's task (``testbeds.benchmark_of``: ``arith``'s, or a gym task's test split), overall, per topic and per
    level, and its samples by kind of answer (``testbeds.answer_kinds_of``). Sampling is seeded by the run's seed
    (common random numbers across the methods of a seed)."""
    from ebpo.eval import SamplingConfig, evaluate
    from ebpo.eval.metrics import summarize

    t = spec.test_settings
    seed, max_new_tokens = spec.config["run"]["seed"], spec.config["rollout"]["max_new_tokens"]
    benchmark = benchmark_of(spec.config["data"])
    records = benchmark.load()
    sampling = SamplingConfig(
        n=t["n"],
        temperature=t["temperature"],
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        seed=seed,
        batch_size=256,
    )
    result = evaluate(
        str(model_dir),
        records,
        benchmark.reward,
        sampling,
        ks=(1,),
        maj_ks=(t["n"],),
        limit=t["size"],
        cache_path=cache,
        device="cpu",
        dtype="float32",
    )
    out: dict[str, Any] = {
        name: value
        for name, value in result.summary.items()
        if "/" not in name or name.endswith("se_problems")
    }
    out["benchmark"] = benchmark.name
    by_id = {str(rec.id): rec for rec in records}
    kinds = answer_kinds_of(benchmark.name)
    if kinds is not None:
        out["answer_kinds"] = kinds.shares((p.answers, by_id[p.id]) for p in result.problems)
    for attr in ("topic", "level"):
        groups: dict[str, list] = {}
        for problem in result.problems:
            groups.setdefault(str(getattr(by_id[problem.id], attr)), []).append(problem)
        out[f"by_{attr}"] = {
            name: {k: v for k, v in summarize(members, maj_ks=(t["n"],)).items() if "/" not in k}
            for name, members in sorted(groups.items())
        }
    return out


def execute(
    spec: RunSpec, root: Path, *, keep_checkpoints: bool = False, command: str = ""
) -> dict[str, Any]:
    """Train and test one run (or continue it); write and return its ``result.json``."""
    from ebpo.trackers import read_metrics

    done = read_result(root, spec)
    if done is not None:
        return done
    keep_freed_memory()
    directory = run_dir(root, spec)
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(directory / SPEC_FILE, {"key": spec.key, **spec.to_dict()})
    checkpoint = _last_checkpoint(directory)
    if checkpoint is None:  # nothing to resume: a previous attempt's files (and test caches) go
        for cache in directory.glob("test_*.jsonl"):
            cache.unlink()

    cfg = spec.load_config()
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer = _trainer_class()(cfg, run_dir=directory, resume=checkpoint, overwrite=checkpoint is None)
    resumed_from = trainer.step
    trained = trainer.train()
    train_s, train_cpu_s, val_cpu_s = (
        time.perf_counter() - start,
        time.process_time() - cpu_start,
        trainer.val_cpu_s,
    )
    base_model = str(trainer.base_path)
    del trainer

    start, cpu_start = time.perf_counter(), time.process_time()
    checkpoints = directory / "checkpoints"
    test = evaluate_checkpoint(spec, checkpoints / "last" / "model", directory / TEST_SAMPLES)
    test_best, tests = None, 1
    if spec.test_settings["best"]:  # the paper's rule: best validation maj@k (EBPO-diff: the last)
        rule = spec.checkpoint
        step = trained.best_step if rule == "best" else trained.step
        if step == trained.step:
            scores = test
        else:
            scores, tests = (
                evaluate_checkpoint(spec, checkpoints / rule / "model", directory / "test_best.jsonl"),
                2,
            )
        test_best = {"rule": rule, "step": step, **scores}
    test_s, test_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start

    result = {
        "key": spec.key,
        "spec": spec.to_dict(),
        "label": spec.label,
        "command": command,
        "base_model": base_model,
        "code_fingerprint": code_fingerprint(),
        "platform": _platform_info(),  # a rerun reproduces this result to the bit only on the same platform
        "steps": trained.step,
        "val_best_maj": trained.best_score,
        "val_best_step": trained.best_step,
        "test": test,
        "test_best": test_best,
        "curves": curves_from_metrics(read_metrics(directory)),
        "timing": {
            "train_s": train_s,
            "train_cpu_s": train_cpu_s,
            "val_cpu_s": val_cpu_s,
            "test_s": test_s,
            "test_cpu_s": test_cpu_s,
            "resumed_from_step": resumed_from,
            "threads": cfg.run.threads,
        },
        "counts": {
            "train_responses": spec.train_responses,
            "val_samples": spec.val_samples,
            "test_samples": int(test["num_problems"]) * int(spec.test_settings["n"]) * tests,
        },
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    result = json.loads(json.dumps(result))  # the types a result has when read back from disk
    write_json_atomic(directory / RESULT_FILE, result)
    if not keep_checkpoints:  # a finished run needs only its result
        shutil.rmtree(checkpoints, ignore_errors=True)
        shutil.rmtree(directory / "tensorboard", ignore_errors=True)
    return result


def execute_logged(spec: RunSpec, root: str, keep_checkpoints: bool, command: str) -> tuple[str, str]:
    """:func:`execute` in a worker process, its output appended to the run's ``run.log``. Returns
    (key, "") on success or (key, one line naming the error and the log) on failure, so that one failed run
    never stops the matrix."""
    from ebpo import console

    console.setup()  # a spawned worker: the trainer's messages into run.log, as `ebpo train` shows them
    directory = run_dir(Path(root), spec)
    directory.mkdir(parents=True, exist_ok=True)
    with (
        open(directory / LOG_FILE, "a") as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),
    ):
        try:
            execute(spec, Path(root), keep_checkpoints=keep_checkpoints, command=command)
        except Exception as err:  # noqa: BLE001 - reported per run; the matrix goes on
            import traceback

            traceback.print_exc(file=log)
            first = str(err).splitlines()[0] if str(err) else ""
            return spec.key, f"{type(err).__name__}: {first} (see {directory / LOG_FILE})"
        finally:
            log.flush()
            sys.stdout.flush()
    return spec.key, ""
