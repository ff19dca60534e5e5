"""GPU check: what a lent CUDA machine should confirm about ebpo, in one run that writes one markdown table.

    python3 benchmarks/gpu_check.py --out docs/results/gpu.md   # on the GPU machine (make gpu-check)
    python3 benchmarks/gpu_check.py --quick --out /tmp/gpu.md    # tiny sizes (the test suite runs this on CPU)

Where CUDA is available every check runs on it; where it is not, the same checks run on the CPU (the
fallback the test suite exercises) and the table says so. The checks:

1. **Advantage estimators** (``benchmarks/bench_advantages.py``): our GRPO and EBPO against verl's
   vectorised GRPO at 512 x 4, 512 x 16, 8192 x 16, T = 256, when ``verl.trainer.ppo.core_algos`` imports;
   else ours alone.
2. **``ebpo train``** on each built-in model (:data:`TRAIN_PRESETS`): the ``ebpo`` preset on S1 and the ``gym``
   preset on S2 (the Qwen3 chat model: its grouped-query attention in the model's own attention implementation,
   sdpa, and its chat template), 30 steps in float32 and in bfloat16 (``model.dtype``), with a CPU float32 run
   of the first 3 steps as the reference. The same seed gives
   the same prompts, and the responses are drawn by the trainer's CPU generator from probabilities that
   agree between devices to float rounding, so in float32 the first steps' metrics agree within
   :data:`TOLERANCE` ``float32`` (relative 1e-3, absolute 1e-4; a draw that flips on a probability at the
   edge can move a step's metrics more, and the table names the metric and step). bfloat16 (autocast,
   with float32 weights and optimizer state) rounds logits to about 3 significant digits, which can change
   draws: on the CPU, 2 steps of the quick sizes in bfloat16 gave float32's rewards and a step KL of
   0.0072 and 0.033 against its 0.0065 and 0.032 (with bfloat16 weights, before the float32 master copy:
   a tenth of it, and no clipped token). Its bound (relative 0.25, absolute 0.05) covers only what the
   responses decide (reward, length,
   entropy, all-fail groups, EBPO's shrinkage): a sanity check that the run samples the same problem at
   the same scale; the update's metrics are reported beside it, not bounded.
3. **``ebpo.generation.sample`` against ``model.generate``** (``benchmarks/bench_eval.py``): the same model,
   prompts, lengths and sampling settings, float32 and bfloat16; responses per second of each.
4. **TRL**: 5 steps of ``EBPOTrainer`` (TRL's ``GRPOTrainer`` with our advantages), beside 5 steps of our
   trainer at the same settings (``benchmarks/throughput.py``).
5. **``ebpo diagnose``** with its defaults on the shipped model (docs/diagnose.md), on the device: its wall time
   and, per G, EBPO's baseline error and gradient cosine against GRPO's in the table's row; its whole table is
   appended below the check's table. Bound: every per-batch mean (baseline errors, cosine, norm) finite.

What it needs beyond torch, transformers and accelerate (which the machine has): ``trl``, ``datasets`` and
the packages they import that the machine lacks, carried as wheels (``make gpu-wheels`` here, then ``make
gpu-check`` there; docs/benchmarks.md, "GPU check").
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO)]

import bench_advantages  # noqa: E402
import bench_eval  # noqa: E402
import throughput  # noqa: E402

from benchmarks.pages import portable_command  # noqa: E402
from ebpo.tables import markdown_table  # noqa: E402

TOLERANCE = {"float32": (1e-3, 1e-4), "bfloat16": (0.25, 0.05)}
"""(relative, absolute) bound on |device - CPU| for the first steps' metrics, per ``model.dtype``: a metric
passes where |x - ref| <= absolute + relative * |ref|."""

SAMPLED = ("reward/mean", "response_length/mean", "actor/entropy", "groups/all_fail", "ebpo/shrinkage")
"""Metrics the sampled responses decide (before the step's updates)."""
UPDATED = ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "actor/kl_ref", "actor/step_kl")
"""Metrics of the step's updates."""
BOUNDED = {"float32": SAMPLED + UPDATED, "bfloat16": SAMPLED}
"""The metrics held to :data:`TOLERANCE` at each of the first steps, per ``model.dtype``."""
TRAIN_PRESETS = (("ebpo", "S1"), ("gym", "S2"))
"""The ``ebpo train`` presets the train check runs, and the built-in model each trains."""


@dataclass(frozen=True)
class Sizes:
    """How big each check is: the full check, or ``--quick`` (the test suite's CPU run)."""

    shapes: tuple[tuple[int, int], ...]
    estimator_repeats: int
    train_steps: int
    compared_steps: int
    train_overrides: tuple[str, ...]
    sampler: tuple[int, int, int, int]
    """(prompts, n, max_new_tokens, repeats)"""
    trl_steps: int
    trl_prompts: int
    diagnose: tuple[tuple[str, Any], ...] = ()
    """``ebpo.diagnose`` settings beside its defaults."""


FULL = Sizes(
    shapes=((512, 4), (512, 16), (8192, 16)),
    estimator_repeats=15,
    train_steps=30,
    compared_steps=3,
    train_overrides=(),
    sampler=(32, 8, 24, 5),
    trl_steps=5,
    trl_prompts=16,
)
QUICK = Sizes(
    shapes=((64, 4),),
    estimator_repeats=3,
    train_steps=2,
    compared_steps=2,
    train_overrides=(
        "data.batch_size=4",
        "data.group_size=4",
        "optim.mini_batch_size=2",
        "data.val_size=9",
        "run.eval_n=2",
        "run.eval_k=2",
    ),
    sampler=(4, 2, 8, 1),
    trl_steps=2,
    trl_prompts=4,
    diagnose=(
        ("prompts", 4),
        ("batches", 3),
        ("warmup_batches", 1),
        ("group_sizes", [2, 4]),
        ("reference_samples", 4),
        ("estimators", ["grpo", "ebpo"]),
        ("projection_dim", 256),
    ),
)


@dataclass
class Row:
    check: str
    setting: str
    measured: str
    bound: str = ""
    verdict: str = ""


def within(value: float, reference: float, dtype: str) -> bool:
    relative, absolute = TOLERANCE[dtype]
    return abs(value - reference) <= absolute + relative * abs(reference)


def compare_metrics(
    rows: Sequence[dict[str, Any]], reference: Sequence[dict[str, Any]], steps: int, dtype: str
) -> tuple[bool, str]:
    """Whether every :data:`BOUNDED` metric of steps 1..``steps`` is within :data:`TOLERANCE` of the
    reference run's, and a line giving the largest relative difference of the bounded metrics and of the
    others, and every metric out of bounds."""
    by_step = {row["step"]: row for row in rows}
    ref_by_step = {row["step"]: row for row in reference}
    worst = {"bounded": (0.0, "all equal"), "reported": (0.0, "all equal")}
    failures = []
    for step in range(1, steps + 1):
        if step not in by_step or step not in ref_by_step:
            return False, f"step {step} missing"
        for name in SAMPLED + UPDATED:
            if name not in ref_by_step[step]:
                continue
            value, ref = by_step[step].get(name, math.nan), ref_by_step[step][name]
            diff = abs(value - ref) / max(abs(ref), 1e-12)
            kind = "bounded" if name in BOUNDED[dtype] else "reported"
            if not diff <= worst[kind][0]:  # NaN counts as the worst
                worst[kind] = (diff, f"{name} at step {step}")
            if kind == "bounded" and not within(value, ref, dtype):
                failures.append(f"{name}@{step}: {value:.6g} vs {ref:.6g}")
    line = "largest relative difference {:.2g} ({})".format(*worst["bounded"])
    if len(BOUNDED[dtype]) < len(SAMPLED + UPDATED):
        line += "; of the update's metrics (not bounded) {:.2g} ({})".format(*worst["reported"])
    if failures:
        line += "; out of bounds: " + ", ".join(failures)
    return not failures, line


def estimator_rows(device: str, sizes: Sizes) -> list[Row]:
    args = argparse.Namespace(
        device=device, threads=1, length=256, repeats=sizes.estimator_repeats, loop_repeats=1, seed=0
    )
    peer = "verl imports" if bench_advantages.verl_grpo() is not None else "verl does not import: ours alone"
    rows = []
    for line in bench_advantages.table(list(sizes.shapes), args)[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        shape, times, ratio = cells[0], cells[1:6], cells[6]
        measured = ", ".join(f"{name} {t}" for name, t in zip(bench_advantages.COLUMNS, times) if t != "n/a")
        verdict = "n/a" if ratio == "n/a" else ("PASS" if float(ratio.rstrip("x")) <= 0.6 else "FAIL")
        rows.append(
            Row(
                "estimator (bench_advantages)",
                f"{shape}, T = 256; {peer}",
                measured + (f"; EBPO / verl vectorised {ratio}" if ratio != "n/a" else ""),
                "EBPO <= 0.6x verl vectorised" if ratio != "n/a" else "",
                verdict,
            )
        )
    return rows


def train(
    work: Path, name: str, device: str, dtype: str, steps: int, extra: Sequence[str], preset: str = "ebpo"
) -> tuple[float, Any]:
    """``ebpo train`` (its command line, in this process) with ``preset``; (seconds, metrics rows)."""
    from ebpo.cli import main as ebpo_main
    from ebpo.trackers import read_metrics

    run_dir = work / name
    argv = [
        "train",
        "--config",
        preset,
        "--run-dir",
        str(run_dir),
        f"run.steps={steps}",
        f"run.device={device}",
        f"model.dtype={dtype}",
        "run.progress=false",
        "run.plot=false",
        *extra,
    ]
    start = time.perf_counter()
    code = ebpo_main(argv)
    seconds = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"ebpo train {' '.join(argv[1:])} exited with {code}")
    return seconds, read_metrics(run_dir)


def attention_of(preset: str, device: str) -> str:
    """The attention implementation transformers gives the preset's model on ``device``, loaded as ``ebpo
    train`` loads it (``sdpa`` where torch has it, the default)."""
    from transformers import AutoModelForCausalLM

    from ebpo.models.names import resolve_model
    from ebpo.trainer import load_config

    model = AutoModelForCausalLM.from_pretrained(resolve_model(load_config(preset).model.path).path).to(
        device
    )
    return str(model.config._attn_implementation)


def train_rows(device: str, sizes: Sizes, work: Path, preset: str = "ebpo", model: str = "S1") -> list[Row]:
    k = sizes.compared_steps
    # the reference: the first k steps on the CPU in float32 (a small validation: it draws from its own
    # generator, so the training steps do not depend on it)
    small_validation = ("data.val_size=9", "run.eval_n=2", "run.eval_k=2")
    _, reference = train(
        work,
        f"{preset}-cpu-reference",
        "cpu",
        "float32",
        k,
        (*sizes.train_overrides, *small_validation),
        preset,
    )
    attention = attention_of(preset, device)
    rows = []
    for dtype in ("float32", "bfloat16"):
        seconds, metrics = train(
            work,
            f"{preset}-{device}-{dtype}",
            device,
            dtype,
            sizes.train_steps,
            sizes.train_overrides,
            preset,
        )
        ok, line = compare_metrics(metrics, reference, k, dtype)
        before, after = metrics[0].get("eval/pass@1", math.nan), metrics[-1].get("eval/pass@1", math.nan)
        relative, absolute = TOLERANCE[dtype]
        rows.append(
            Row(
                f"ebpo train (the {preset} preset, {model})",
                f"{device}, {dtype}, {attention} attention, {sizes.train_steps} steps",
                f"{seconds:.1f} s ({seconds / sizes.train_steps:.2f} s / step, validations included); validation "
                f"pass@1 {before:.3f} -> {after:.3f}; first {k} steps vs CPU float32: {line}",
                f"|x - cpu| <= {absolute:g} + {relative:g} |cpu|"
                + ("" if dtype == "float32" else " for the metrics the responses decide"),
                "PASS" if ok else "FAIL",
            )
        )
    return rows


def sampler_rows(device: str, sizes: Sizes) -> list[Row]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.models.build import build_base_model
    from ebpo.tasks import get_task

    prompts_n, n, max_new_tokens, repeats = sizes.sampler
    path = build_base_model(progress=False)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [rec.prompt for rec in get_task("arith").generate("test", prompts_n, seed=0)]
    rows = []
    for dtype in ("float32", "bfloat16"):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
        result = bench_eval.compare_samplers(model, tokenizer, prompts, n, max_new_tokens, 1.0, 0.95, repeats)
        samples = prompts_n * n
        ours, hf = samples / result["ours"][0], samples / result["hf"][0]
        rows.append(
            Row(
                "sample vs model.generate (bench_eval)",
                f"{device}, {dtype}, shipped model, {prompts_n} prompts x {n}, <= {max_new_tokens} tokens, "
                f"T 1, top-p 0.95, median of {repeats}",
                f"ours {ours:.1f} samples/s, HF generate {hf:.1f} samples/s: {ours / hf:.2f}x",
                "ran",
                "PASS",
            )
        )
    return rows


def trl_rows(device: str, sizes: Sizes) -> list[Row]:
    from ebpo.models.build import build_base_model

    setting = throughput.Setting(
        str(build_base_model(progress=False)),
        prompts=sizes.trl_prompts,
        group_size=4,
        updates=2,
        steps=sizes.trl_steps,
        device=device,
    )
    ours, trl = throughput.measure(setting, repeats=1)
    return [
        Row(
            "EBPOTrainer (TRL GRPOTrainer + our EBPO)",
            f"{device}, float32, {setting.prompts} prompts x G=4, <= 12 tokens, 2 updates, {setting.steps} steps",
            f"ran: {trl.median_wall_s:.3f} s / step after the first; our trainer at the same settings "
            f"{ours.median_wall_s:.3f} s / step ({ours.rollouts_per_s / trl.rollouts_per_s:.2f}x TRL's rollouts/s)",
            "runs",
            "PASS",
        )
    ]


def diagnose_rows(device: str, sizes: Sizes, sections: list[str]) -> list[Row]:
    """``ebpo diagnose`` on the shipped model on ``device``; its table goes to ``sections``. Every per-batch mean
    (baseline errors, cosine, norm, counts) and its difference must be finite; the two ratio statistics may be
    NaN by definition when the batches show no common direction (docs/diagnose.md), as at the quick sizes."""
    import ebpo
    from ebpo.diagnostics.report import COUNT_METRICS, MEAN_METRICS, format_table, summarize

    settings = dict(sizes.diagnose)
    result = ebpo.diagnose(device=device, quiet=True, **settings)
    summary = summarize(result)
    sections.append(format_table(result, summary).replace("# ebpo diagnose", "## ebpo diagnose", 1))
    estimates = [
        row[name]
        for row in summary.rows
        for metric in (*MEAN_METRICS, *COUNT_METRICS)
        for name in (metric, f"{metric}_diff")
        if name in row
    ]
    by = {(row["estimator"], row["G"]): row for row in summary.rows}
    gains = [
        f"G={G}: baseline MSE {by[('ebpo', G)]['baseline_error_diff']:+.4f}, cosine {by[('ebpo', G)]['cosine_diff']:+.3f}"
        for G in sorted(set(result.config.group_sizes))
    ]
    changed = ", ".join(f"{key}={value}" for key, value in settings.items()) or "defaults"
    return [
        Row(
            "ebpo diagnose (shipped model)",
            f"{device}, {changed}",
            f"{result.seconds:.1f} s; EBPO - GRPO on the same batches: "
            + "; ".join(gains)
            + " (table below)",
            "every per-batch mean finite",
            "PASS" if all(math.isfinite(value) for value in estimates) else "FAIL",
        )
    ]


def environment(device: str, argv: Sequence[str]) -> list[str]:
    import torch

    versions = []
    for name in ("torch", "transformers", "accelerate", "trl", "datasets"):
        try:
            module = __import__(name)
            versions.append(f"{name} {module.__version__}")
        except Exception as err:  # noqa: BLE001 - reported in the header
            versions.append(f"{name} missing ({type(err).__name__})")
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or 'unknown'})"
    lines = [
        f"Device: {where}; CUDA {'available' if device == 'cuda' else 'NOT available: every check ran on the CPU'}.",
        f"Python {platform.python_version()}; {', '.join(versions)}.",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"`{portable_command(shlex.join(['python3', 'benchmarks/gpu_check.py', *argv]))}`.",
    ]
    return lines


def render(header: Sequence[str], rows: Sequence[Row]) -> str:
    """The page: its title, the ``header`` lines, then the table of ``rows`` (a ``|`` in a cell escaped)."""
    cells = [
        [cell.replace("|", "\\|") for cell in (row.check, row.setting, row.measured, row.bound, row.verdict)]
        for row in rows
    ]
    table = markdown_table(["check", "setting", "measured", "bound", "verdict"], cells)
    return "\n".join(["# GPU check", "", *header, "", table]) + "\n"


def run_checks(device: str, sizes: Sizes, work: Path, sections: list[str] | None = None) -> list[Row]:
    """Every check in turn; one that raises becomes a FAIL row naming the error, and the others still run.
    Checks that print more than a row (``ebpo diagnose``'s table) add it to ``sections``."""
    sections = [] if sections is None else sections
    checks: list[tuple[str, Callable[[], list[Row]]]] = [
        ("estimator", lambda: estimator_rows(device, sizes)),
        *(
            (f"ebpo train --config {preset}", lambda p=preset, m=model: train_rows(device, sizes, work, p, m))
            for preset, model in TRAIN_PRESETS
        ),
        ("sample vs generate", lambda: sampler_rows(device, sizes)),
        ("EBPOTrainer", lambda: trl_rows(device, sizes)),
        ("ebpo diagnose", lambda: diagnose_rows(device, sizes, sections)),
    ]
    rows: list[Row] = []
    for name, check in checks:
        print(f"gpu_check: {name} ...", flush=True)
        try:
            rows += check()
        except Exception as err:  # noqa: BLE001 - reported as a row; the other checks still run
            traceback.print_exc()
            first = str(err).splitlines()[0] if str(err) else ""
            rows.append(Row(name, device, f"raised {type(err).__name__}: {first}", "", "FAIL"))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_check.md", help="markdown file to write (default gpu_check.md)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the test suite's CPU run)")
    parser.add_argument(
        "--device", choices=["auto", "cuda", "cpu"], default="auto", help="default: cuda if present"
    )
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)

    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA device")
    if device == "cpu":
        torch.set_num_threads(1)
    sizes = QUICK if args.quick else FULL
    sections: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ebpo-gpu-check-") as tmp:
        rows = run_checks(device, sizes, Path(tmp), sections)
    words = list(sys.argv[1:] if argv is None else argv)
    text = "\n".join([render(environment(device, words), rows), *sections])
    Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps([row.__dict__ for row in rows], indent=1))
    print(text)
    return 0 if all(row.verdict != "FAIL" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
