"""Training throughput: our trainer (``ebpo.trainer.Trainer``) against TRL's ``GRPOTrainer`` through our
adapter (``ebpo.integrations.trl.EBPOTrainer``), same model, batch, G, lengths and number of updates.

    .venv/bin/python benchmarks/throughput.py                       # base model, 16 prompts x G=8, 6 steps
    .venv/bin/python benchmarks/throughput.py --steps 10 --prompts 16 --group-size 8 --updates 4
    .venv/bin/python benchmarks/throughput.py --model PATH --append docs/results/README.md

One "step" is one generation round: ``--prompts`` prompts x G responses of at most ``--max-new-tokens``
tokens at temperature 1 (top-p 1, no top-k), scored with the ``arith`` reward, EBPO advantages (paper
options), then ``--updates`` optimizer updates on equal slices of the round (ours: ``optim.mini_batch_size =
prompts / updates``; TRL: ``per_device_train_batch_size = prompts x G / updates``, ``steps_per_generation =
updates``, so TRL's ``max_steps`` is ``steps x updates``), AdamW at the same learning rate, no KL term (no
reference model on either side), no evaluation and no checkpoints inside the timed steps, one process,
the same torch thread count.

Timing: ours = ``timing_s/step`` of each step from ``metrics.jsonl`` (sampling, scoring, advantages, the
log-prob passes and updates, and the per-step KL metric; validation before and after is outside it);
TRL = wall time from ``on_step_begin`` to ``on_step_end`` of its optimizer steps (its generation happens
inside the first of every ``updates`` steps), summed per generation round. Reported: median seconds per
round after dropping the first round of each (warm-up), rollouts/s = prompts x G / that median, and the
ratio ours/TRL in rollouts/s from this one run. Both sides run in this one process one after the other, so
the machine's load is shared alike only as far as it stays constant: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Setting:
    """What both trainers share."""

    model: str
    prompts: int = 16
    group_size: int = 8
    max_new_tokens: int = 12
    updates: int = 4
    steps: int = 6
    lr: float = 1e-4
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.prompts % self.updates:
            raise ValueError(f"--prompts ({self.prompts}) must be a multiple of --updates ({self.updates})")
        if self.steps < 2:
            raise ValueError("--steps must be >= 2 (the first round of each trainer is dropped as warm-up)")

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts * self.group_size


@dataclass(frozen=True)
class Timing:
    """Seconds per generation round (all rounds, in order) and the summary the table reports."""

    name: str
    round_s: list[float]
    total_s: float
    rollouts_per_step: int
    train_cpu_s: float = float("nan")
    steps: int = 1

    @property
    def cpu_s_per_step(self) -> float:
        """CPU seconds of this process in ``train()`` per generation round (load-robust beside wall time;
        ours includes its two validations of 9 problems x 1 sample)."""
        return self.train_cpu_s / self.steps

    @property
    def median_s(self) -> float:
        """Median seconds per round without the first (warm-up) round."""
        return statistics.median(self.round_s[1:])

    @property
    def rollouts_per_s(self) -> float:
        return self.rollouts_per_step / self.median_s


def rounds_from_update_times(update_s: Sequence[float], updates: int) -> list[float]:
    """Sum consecutive blocks of ``updates`` optimizer-step times into one time per generation round."""
    if len(update_s) % updates:
        raise ValueError(f"{len(update_s)} optimizer steps is not a multiple of {updates} updates per round")
    return [sum(update_s[i : i + updates]) for i in range(0, len(update_s), updates)]


def time_ours(setting: Setting, work_dir: Path) -> Timing:
    """Our trainer through its public API (``load_config`` + ``Trainer``) with the EBPO preset."""
    from ebpo.trainer import Trainer, load_config
    from ebpo.trainer.trainer import read_metrics

    s = setting
    overrides = [
        f"model.path={s.model}",
        f"data.batch_size={s.prompts}",
        f"data.group_size={s.group_size}",
        f"data.train_size={max(s.prompts * s.steps, 64)}",
        "data.val_size=9",
        f"optim.mini_batch_size={s.prompts // s.updates}",
        f"optim.lr={s.lr}",
        "optim.epochs=1",
        f"rollout.max_new_tokens={s.max_new_tokens}",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        "algorithm.kl_coef=0.0",
        f"run.steps={s.steps}",
        "run.eval_every=0",
        "run.save_every=0",
        "run.eval_n=1",
        "run.eval_k=1",
        f"run.seed={s.seed}",
        f"run.threads={s.threads}",
        "run.device=cpu",
        "run.progress=false",
        "run.plot=false",
    ]
    cfg = load_config("ebpo", overrides)
    start = time.perf_counter()
    trainer = Trainer(cfg, run_dir=work_dir / "ours")
    cpu_start = time.process_time()
    trainer.train()
    cpu = time.process_time() - cpu_start
    total = time.perf_counter() - start
    rows = [row for row in read_metrics(work_dir / "ours") if row["step"] >= 1]
    return Timing(
        "ebpo Trainer", [row["timing_s/step"] for row in rows], total, s.rollouts_per_step, cpu, s.steps
    )


def time_trl(setting: Setting, work_dir: Path) -> Timing:
    """TRL's GRPOTrainer via ``EBPOTrainer`` (EBPO advantages from our registry, TRL's loop for the rest)."""
    import datasets
    import torch
    from transformers import TrainerCallback

    from ebpo.integrations.trl import EBPOConfig, EBPOTrainer
    from ebpo.rewards import get_reward
    from ebpo.tasks.arith import generate

    s = setting
    torch.set_num_threads(s.threads)
    records = generate("train", max(s.prompts * s.steps, 64), s.seed)
    dataset = datasets.Dataset.from_dict(
        {"prompt": [r.prompt for r in records], "answer": [str(r.answer) for r in records]}
    )
    scorer = get_reward("arith")

    def arith_reward(completions, answer, **kwargs):
        return scorer.batch(completions, answer)

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.update_s: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.update_s.append(time.perf_counter() - self._start)

    args = EBPOConfig(
        output_dir=str(work_dir / "trl"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=s.rollouts_per_step // s.updates,
        steps_per_generation=s.updates,
        gradient_accumulation_steps=1,
        num_iterations=1,
        num_generations=s.group_size,
        max_completion_length=s.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_steps=s.steps * s.updates,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",  # token-level normalisation, as src/ebpo/configs/ebpo.yaml's token-mean
        logging_steps=10_000,
        save_strategy="no",
        seed=s.seed,
        dataloader_num_workers=0,
        advantage_estimator="ebpo",
    )
    timer = StepTimer()
    start = time.perf_counter()
    trainer = EBPOTrainer(
        model=s.model, reward_funcs=arith_reward, args=args, train_dataset=dataset, callbacks=[timer]
    )
    cpu_start = time.process_time()
    trainer.train()
    cpu = time.process_time() - cpu_start
    total = time.perf_counter() - start
    return Timing(
        "TRL GRPOTrainer (EBPOTrainer)",
        rounds_from_update_times(timer.update_s, s.updates),
        total,
        s.rollouts_per_step,
        cpu,
        s.steps,
    )


def format_table(setting: Setting, ours: Timing, trl: Timing) -> str:
    """The markdown table and the ratio line."""
    s = setting
    lines = [
        f"Setting: {s.prompts} prompts x G={s.group_size} = {s.rollouts_per_step} rollouts per step, "
        f"<= {s.max_new_tokens} new tokens, {s.updates} updates per step, {s.steps} steps (first dropped), "
        f"{s.threads} torch thread(s), CPU, model `{s.model}`.",
        "",
        "| trainer | median s / step | rollouts / s | CPU s / step (train()) | whole run s (incl. setup) |",
        "|---|---|---|---|---|",
    ]
    for t in (ours, trl):
        lines.append(
            f"| {t.name} | {t.median_s:.2f} | {t.rollouts_per_s:.1f} | {t.cpu_s_per_step:.2f} | {t.total_s:.1f} |"
        )
    ratio = ours.rollouts_per_s / trl.rollouts_per_s
    cpu_ratio = trl.cpu_s_per_step / ours.cpu_s_per_step
    verdict = "holds" if ratio >= 1.5 else "does NOT hold"
    lines += [
        "",
        f"Ratio ours / TRL (rollouts/s, same run): **{ratio:.2f}x**; the 1.5x goal {verdict}. "
        f"CPU seconds per step, TRL / ours: {cpu_ratio:.2f}x.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=None, help="model directory (default: the built-in arith base model)"
    )
    parser.add_argument(
        "--prompts", type=int, default=16, help="prompts per step (default 16, as src/ebpo/configs/ebpo.yaml)"
    )
    parser.add_argument("--group-size", type=int, default=8, help="G, responses per prompt (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=12, help="longest response (default 12)")
    parser.add_argument("--updates", type=int, default=4, help="optimizer updates per step (default 4)")
    parser.add_argument("--steps", type=int, default=6, help="generation rounds per trainer (default 6)")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate of both (default 1e-4)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for both (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of both (default 0)")
    parser.add_argument(
        "--order",
        choices=["ours-first", "trl-first"],
        default="ours-first",
        help="which trainer runs first (default ours-first)",
    )
    parser.add_argument(
        "--append", default=None, help="markdown file to append the table to (e.g. docs/results/README.md)"
    )
    parser.add_argument("--json", default=None, help="write the raw per-round times to this JSON file")
    args = parser.parse_args(argv)

    model = args.model
    if model is None:
        from ebpo.models.base_model import build_base_model

        model = str(build_base_model())
    setting = Setting(
        model,
        args.prompts,
        args.group_size,
        args.max_new_tokens,
        args.updates,
        args.steps,
        args.lr,
        args.threads,
        args.seed,
    )
    with tempfile.TemporaryDirectory(prefix="ebpo-throughput-") as tmp:
        work = Path(tmp)
        runners = [time_ours, time_trl] if args.order == "ours-first" else [time_trl, time_ours]
        timings = {fn.__name__: fn(setting, work) for fn in runners}
    ours, trl = timings["time_ours"], timings["time_trl"]
    table = format_table(setting, ours, trl)
    print(table)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "setting": setting.__dict__,
                    "ours_round_s": ours.round_s,
                    "trl_round_s": trl.round_s,
                    "ours_total_s": ours.total_s,
                    "trl_total_s": trl.total_s,
                    "ours_cpu_s": ours.train_cpu_s,
                    "trl_cpu_s": trl.train_cpu_s,
                },
                indent=1,
            )
        )
    if args.append:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        command = "python benchmarks/throughput.py " + " ".join(sys.argv[1:] if argv is None else argv)
        with open(args.append, "a", encoding="utf-8") as handle:
            handle.write(f"\n### Throughput run {stamp}\n\n`{command}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
