"""Training throughput: our trainer (``ebpo.trainer.Trainer``) against TRL's ``GRPOTrainer`` through our
adapter (``ebpo.integrations.trl.EBPOTrainer``), same model, batch, G, lengths and number of updates.

    .venv/bin/python benchmarks/throughput.py                       # base model, 16 prompts x G=8, 3 x 8 steps
    .venv/bin/python benchmarks/throughput.py --model random --hidden-size 128 --layers 4 --max-new-tokens 48
    .venv/bin/python benchmarks/throughput.py --ours run.step_kl=subset --ours rollout.old_logp=sampler
    .venv/bin/python benchmarks/throughput.py --model PATH --append docs/results/README.md

One "step" is one generation round: ``--prompts`` prompts x G responses of at most ``--max-new-tokens``
tokens at temperature 1 (top-p 1, no top-k), scored with the task's reward, EBPO advantages (paper
options), then ``--updates`` optimizer updates on equal slices of the round (ours: ``optim.mini_batch_size =
prompts / updates``; TRL: ``per_device_train_batch_size = prompts x G / updates``, ``steps_per_generation =
updates``, so TRL's ``max_steps`` is ``steps x updates``), AdamW at the same learning rate, no KL term (no
reference model on either side), no evaluation and no checkpoints inside the timed steps, one process,
the same torch thread count, the same training problems (every topic and level; the trainer does not
inherit a level selection from the ``ebpo`` preset). The task is the one the model was made for: ``arith`` for
the built-in ``arith`` model and any other, the reasoning-gym mixture (``ebpo.models.recipes.gym``, scored by each
dataset's own ``score_answer``) for ``builtin:gym``. A tokenizer with a chat template gets its prompts through it
on both sides (ours: ``data.chat_template=auto``; TRL: conversational prompts, which it renders with the same
template). ``--model random`` is a randomly initialised Llama of ``--hidden-size`` and
``--layers`` with our character tokenizer: it seldom emits EOS, so nearly every response runs to
``--max-new-tokens`` on both sides. ``--ours KEY=VALUE`` adds a trainer config override (e.g.
``run.step_kl=subset``); the table names them.

Timing: ours = each ``Trainer._train_step`` (sampling, scoring, advantages, the log-prob passes and
updates, the per-step KL metric; validation before and after is outside it); TRL = from ``on_step_begin``
to ``on_step_end`` of its optimizer steps (its generation and old log-prob pass happen inside the first of
every ``updates`` steps), summed per generation round. Both wall seconds and this process's CPU seconds
are taken per round. The two trainers run ``--repeats`` times each, alternately (ours, TRL, TRL, ours,
...), in this one process, so that a change of the machine's load falls on both; the first round of every
run is dropped (warm-up). Reported: median seconds per round over the kept rounds, rollouts/s = prompts x
G / that median, and the ratio ours / TRL in rollouts/s, from wall time and from CPU time (CPU time is the
steadier of the two on a machine that other jobs share).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: the repository root, for benchmarks.pages
    sys.path.append(str(REPO))

from benchmarks.pages import portable_command, portable_path  # noqa: E402
from ebpo.tables import markdown_table  # noqa: E402


@dataclass(frozen=True)
class Setting:
    """What both trainers share."""

    model: str
    prompts: int = 16
    group_size: int = 8
    max_new_tokens: int = 12
    updates: int = 4
    steps: int = 8
    lr: float = 1e-4
    threads: int = 1
    seed: int = 0
    device: str = "cpu"
    task: str = "arith"
    task_options: str = (
        "{}"  # a YAML flow mapping (data.task_options), kept as text so the setting stays hashable
    )

    def __post_init__(self) -> None:
        if self.prompts % self.updates:
            raise ValueError(f"--prompts ({self.prompts}) must be a multiple of --updates ({self.updates})")
        if self.steps < 2:
            raise ValueError("--steps must be >= 2 (the first round of each run is dropped as warm-up)")

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts * self.group_size


@dataclass
class Timing:
    """Wall and CPU seconds of every kept generation round of one trainer, over all its runs."""

    name: str
    rollouts_per_step: int
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    run_s: list[float] = field(default_factory=list)

    def add_run(self, wall_s: Sequence[float], cpu_s: Sequence[float], run_s: float) -> None:
        """One run's per-round times; its first round (warm-up) is dropped."""
        if len(wall_s) != len(cpu_s) or len(wall_s) < 2:
            raise ValueError(
                f"{self.name}: {len(wall_s)} wall and {len(cpu_s)} CPU rounds; need >= 2 of each"
            )
        self.wall_s += list(wall_s[1:])
        self.cpu_s += list(cpu_s[1:])
        self.run_s.append(run_s)

    @property
    def median_wall_s(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def median_cpu_s(self) -> float:
        return statistics.median(self.cpu_s)

    @property
    def rollouts_per_s(self) -> float:
        return self.rollouts_per_step / self.median_wall_s

    @property
    def rollouts_per_cpu_s(self) -> float:
        return self.rollouts_per_step / self.median_cpu_s


def rounds_from_update_times(update_s: Sequence[float], updates: int) -> list[float]:
    """Sum consecutive blocks of ``updates`` optimizer-step times into one time per generation round."""
    if len(update_s) % updates:
        raise ValueError(f"{len(update_s)} optimizer steps is not a multiple of {updates} updates per round")
    return [sum(update_s[i : i + updates]) for i in range(0, len(update_s), updates)]


def run_order(repeats: int) -> list[str]:
    """``ours`` and ``trl`` ``repeats`` times each, in ABBA order (ours, trl, trl, ours, ...), so that a
    steady drift of the machine's load favours neither side."""
    order: list[str] = []
    for r in range(repeats):
        order += ["ours", "trl"] if r % 2 == 0 else ["trl", "ours"]
    return order


def ours_overrides(setting: Setting, extra: Sequence[str] = ()) -> list[str]:
    """The trainer config overrides that put the ``ebpo`` preset at the shared setting, then ``extra``."""
    s = setting
    return [
        f"model.path={s.model}",
        f"data.task={s.task}",
        f"data.task_options={s.task_options}",
        f"data.batch_size={s.prompts}",
        f"data.group_size={s.group_size}",
        f"data.train_size={max(s.prompts * s.steps, 64)}",
        "data.levels=null",  # every level and topic, as TRL's dataset below (not whatever ebpo.yaml selects)
        "data.topics=null",
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
        f"run.device={s.device}",
        "run.progress=false",
        "run.plot=false",
        *extra,
    ]


def time_ours(setting: Setting, work_dir: Path, extra: Sequence[str] = ()) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each step of our trainer (public API: ``load_config`` + ``Trainer``)."""
    from ebpo.trainer import Trainer, load_config

    wall: list[float] = []
    cpu: list[float] = []

    class StepTimed(Trainer):
        def _train_step(self) -> dict[str, float]:
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            try:
                return super()._train_step()
            finally:
                cpu.append(time.process_time() - cpu_start)
                wall.append(time.perf_counter() - wall_start)

    cfg = load_config("ebpo", ours_overrides(setting, extra))
    StepTimed(cfg, run_dir=work_dir).train()
    return wall, cpu


def time_trl(setting: Setting, work_dir: Path) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds per generation round of TRL's GRPOTrainer via ``EBPOTrainer`` (EBPO advantages
    from our registry, TRL's loop for the rest)."""
    import datasets
    import torch
    from transformers import AutoTokenizer, TrainerCallback

    from ebpo.data.prompts import PromptFormat, conversation, prompt_text
    from ebpo.integrations.trl import EBPOConfig, EBPOTrainer, reward_function
    from ebpo.tasks import get_task, task_options

    s = setting
    torch.set_num_threads(s.threads)
    task = get_task(s.task, **task_options(s.task_options, "task_options"))
    records = task.generate("train", max(s.prompts * s.steps, 64), s.seed)
    chat = PromptFormat.resolve(AutoTokenizer.from_pretrained(s.model), "auto").chat
    dataset = datasets.Dataset.from_dict(
        {
            "prompt": [conversation(r) if chat else prompt_text(r) for r in records],
            "answer": [str(r.answer) for r in records],
        }
    )

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.wall_s: list[float] = []
            self.cpu_s: list[float] = []
            self._start = (0.0, 0.0)

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = (time.perf_counter(), time.process_time())

        def on_step_end(self, args, state, control, **kwargs):
            self.wall_s.append(time.perf_counter() - self._start[0])
            self.cpu_s.append(time.process_time() - self._start[1])

    args = EBPOConfig(
        output_dir=str(work_dir),
        use_cpu=s.device == "cpu",
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
    trainer = EBPOTrainer(
        model=s.model,
        reward_funcs=reward_function(task.reward or task.name),
        args=args,
        train_dataset=dataset,
        callbacks=[timer],
    )
    trainer.train()
    return rounds_from_update_times(timer.wall_s, s.updates), rounds_from_update_times(timer.cpu_s, s.updates)


def measure(
    setting: Setting,
    repeats: int,
    extra: Sequence[str] = (),
    runners: dict[str, Callable[[Path], tuple[list[float], list[float]]]] | None = None,
) -> tuple[Timing, Timing]:
    """Both trainers ``repeats`` times each in :func:`run_order`; returns (ours, TRL)."""
    name = "ebpo Trainer" + (f" ({', '.join(extra)})" if extra else "")
    timings = {
        "ours": Timing(name, setting.rollouts_per_step),
        "trl": Timing("TRL GRPOTrainer (EBPOTrainer)", setting.rollouts_per_step),
    }
    runners = runners or {
        "ours": lambda work: time_ours(setting, work, extra),
        "trl": lambda work: time_trl(setting, work),
    }
    with tempfile.TemporaryDirectory(prefix="ebpo-throughput-") as tmp:
        for i, side in enumerate(run_order(repeats)):
            start = time.perf_counter()
            wall, cpu = runners[side](Path(tmp) / f"{side}-{i}")
            timings[side].add_run(wall, cpu, time.perf_counter() - start)
    return timings["ours"], timings["trl"]


def format_table(setting: Setting, ours: Timing, trl: Timing, repeats: int, model_label: str) -> str:
    """The markdown table and the ratio line."""
    s = setting
    lines = [
        f"Setting: {s.prompts} prompts x G={s.group_size} = {s.rollouts_per_step} rollouts per step, "
        f"<= {s.max_new_tokens} new tokens, {s.updates} updates per step, {repeats} runs of {s.steps} steps "
        f"per trainer, alternated (first step of each run dropped), {s.threads} torch thread(s), "
        f"{s.device.upper() if s.device == 'cpu' else s.device}, model {model_label}, task "
        f"{s.task.split(':')[0] if s.task.startswith('gym:') else s.task}"
        f"{' (the ' + str(s.task.count(',') + 1) + '-dataset mixture)' if s.task.startswith('gym:') else ''}.",
        "",
        markdown_table(
            [
                "trainer",
                "median wall s / step",
                "rollouts / s",
                "median CPU s / step",
                "rollouts / CPU s",
                "whole runs s",
            ],
            [
                [
                    t.name,
                    f"{t.median_wall_s:.3f}",
                    f"{t.rollouts_per_s:.1f}",
                    f"{t.median_cpu_s:.3f}",
                    f"{t.rollouts_per_cpu_s:.1f}",
                    ", ".join(f"{x:.1f}" for x in t.run_s),
                ]
                for t in (ours, trl)
            ],
        ),
    ]
    wall_ratio = ours.rollouts_per_s / trl.rollouts_per_s
    cpu_ratio = ours.rollouts_per_cpu_s / trl.rollouts_per_cpu_s
    lines += [
        "",
        f"Ratio ours / TRL (rollouts per second, this run): **{wall_ratio:.2f}x** from wall time, "
        f"**{cpu_ratio:.2f}x** from CPU time.",
    ]
    return "\n".join(lines)


def model_task(model: str | None) -> tuple[str, str]:
    """(task, its options as a YAML flow mapping) that ``--model`` was made for: a built-in model's recipe's,
    else ``arith``."""
    from ebpo.models.names import builtin_recipe
    from ebpo.tasks import task_options_text

    recipe = builtin_recipe(model)  # None for random and for a path
    if recipe is None:
        return "arith", "{}"
    return recipe.task, task_options_text(recipe.task_options)


def resolve_model(args: argparse.Namespace, tmp: Path) -> tuple[str, str]:
    """(model directory, label for the table) of ``--model``."""
    from ebpo.models.names import builtin_recipe, resolve_model

    recipe = builtin_recipe(args.model)  # None (the default), builtin, builtin:<recipe>
    if recipe is not None:
        path = str(resolve_model(args.model, progress=True).path)
        return path, f"the built-in {recipe.what} (`{portable_path(path, 'model')}`)"
    if args.model == "random":
        from ebpo.models.tiny import build_tiny_model

        path = str(
            build_tiny_model(
                tmp / "random-model", seed=0, hidden_size=args.hidden_size, num_layers=args.layers
            )
        )
        return path, f"a random Llama, {args.hidden_size} wide, {args.layers} layers, character tokenizer"
    return args.model, f"`{portable_path(args.model, 'model')}`"


def main(argv: Sequence[str] | None = None) -> int:
    from ebpo import console

    console.setup()  # the library's messages (a built-in model's build) as the ebpo commands show them
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default=None,
        help="builtin:<recipe> (a built-in model: builtin:arith, the default, or builtin:gym), random (a random "
        "Llama of --hidden-size and --layers), or a model directory",
    )
    parser.add_argument("--hidden-size", type=int, default=128, help="width of --model random (default 128)")
    parser.add_argument("--layers", type=int, default=4, help="layers of --model random (default 4)")
    parser.add_argument(
        "--prompts", type=int, default=16, help="prompts per step (default 16, as src/ebpo/configs/ebpo.yaml)"
    )
    parser.add_argument("--group-size", type=int, default=8, help="G, responses per prompt (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=12, help="longest response (default 12)")
    parser.add_argument("--updates", type=int, default=4, help="optimizer updates per step (default 4)")
    parser.add_argument("--steps", type=int, default=8, help="generation rounds per run (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per trainer, alternated (default 3)")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate of both (default 1e-4)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for both (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of both (default 0)")
    parser.add_argument(
        "--ours",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for our trainer only (repeatable), e.g. run.step_kl=subset",
    )
    parser.add_argument(
        "--append", default=None, help="markdown file to append the table to (e.g. docs/results/README.md)"
    )
    parser.add_argument("--json", default=None, help="write the raw per-round times to this JSON file")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    with tempfile.TemporaryDirectory(prefix="ebpo-throughput-model-") as tmp:
        model, label = resolve_model(args, Path(tmp))
        task, options = model_task(args.model)
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
            task=task,
            task_options=options,
        )
        ours, trl = measure(setting, args.repeats, args.ours)
    table = format_table(setting, ours, trl, args.repeats, label)
    print(table)
    if args.json:
        payload = {"setting": setting.__dict__, "ours_overrides": args.ours}
        for side, t in (("ours", ours), ("trl", trl)):
            payload[side] = {"wall_s": t.wall_s, "cpu_s": t.cpu_s, "run_s": t.run_s}
        Path(args.json).write_text(json.dumps(payload, indent=1))
    if args.append:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        words = list(sys.argv[1:] if argv is None else argv)
        command = portable_command(shlex.join(["python", "benchmarks/throughput.py", *words]))
        with open(args.append, "a", encoding="utf-8") as handle:
            handle.write(f"\n### Throughput run {stamp}\n\n`{command}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
