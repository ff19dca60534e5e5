"""``ebpo base-model``: the warm-started ``arith`` base model that ``make demo`` trains with EBPO.

A small Llama (``ebpo.models.tiny``: character tokenizer, tied embeddings) is trained from random
initialisation by supervised next-token prediction on ``arith`` train problems. The sequence is
``prompt + answer + EOS`` with no BOS (the same token ids a trainer's sampler feeds the model: the char
tokenizer adds no special tokens) and the loss is on the answer and EOS tokens only (prompt tokens are
masked out), so all capacity goes to answering. Training is short (the CPU budget of ``make demo``): the
model partly learns the easy cells of the 9 x 5 (topic x level) grid and fails the hardest, so that RL
sees groups of G samples at temperature 1.0 that are neither all right nor all wrong. The default is a
0.13M-parameter model (width 64, 2 layers): at this budget a small model learns more than a large one,
because the number of optimiser steps, not capacity, limits it (docs/base_model.md has the measurements).

The model is cached under ``$EBPO_CACHE`` (default ``~/.cache/ebpo``) in ``base_models/arith-<key>``,
where ``<key>`` hashes the build config; a later call with the same config reuses it, ``force=True``
rebuilds. The directory loads with ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained``; ``build_info.json`` beside the weights holds the config, the build
time and the pass-rate grid measured on validation problems at the end of the build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# Bump when the training recipe or the model layout changes: old caches are then ignored (changes to the
# arith generator are picked up automatically, see ``BaseModelConfig.key``).
FORMAT_VERSION = 1
BUILD_INFO = "build_info.json"


@dataclass(frozen=True)
class BaseModelConfig:
    """Everything that determines the built model; its hash names the cache directory."""

    seed: int = field(default=0, metadata={"help": "seed of the initial weights, the SFT data and its order"})
    hidden_size: int = field(default=64, metadata={"help": "model width (Llama hidden size)"})
    num_layers: int = field(default=2, metadata={"help": "number of transformer layers"})
    num_heads: int = field(default=4, metadata={"help": "attention heads (key/value heads: half of them)"})
    steps: int = field(default=2000, metadata={"help": "SFT optimiser steps"})
    batch_size: int = field(default=64, metadata={"help": "SFT sequences per step"})
    lr: float = field(
        default=4e-3, metadata={"help": "peak AdamW learning rate (linear warm-up, cosine decay to 10%)"}
    )
    warmup_steps: int = field(default=50, metadata={"help": "linear learning-rate warm-up steps"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient-norm clipping threshold"})
    train_problems: int = field(
        default=20_000,
        metadata={
            "help": "size of the SFT pool from the arith train split (split over levels by level_weights, "
            "balanced over topics)"
        },
    )
    level_weights: tuple[float, ...] = field(
        default=(0.3, 0.25, 0.2, 0.15, 0.1),
        metadata={
            "help": "share of the SFT pool per level 1..5 (normalised); favouring easy levels makes them "
            "learnable in the step budget while hard levels stay mostly unsolved"
        },
    )
    eval_per_cell: int = field(
        default=40, metadata={"help": "validation problems per (topic, level) cell for the pass-rate grid"}
    )
    eval_temperature: float = field(
        default=1.0,
        metadata={"help": "sampling temperature of the grid (0 = greedy); 1.0 is what RL samples at"},
    )
    max_new_tokens: int = field(default=10, metadata={"help": "longest response sampled for the grid"})

    def __post_init__(self) -> None:
        positive = (
            "hidden_size",
            "num_layers",
            "num_heads",
            "batch_size",
            "train_problems",
            "max_new_tokens",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"BaseModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("steps", "warmup_steps", "eval_per_cell"):
            if getattr(self, name) < 0:
                raise ValueError(f"BaseModelConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})"
            )
        if len(self.level_weights) != 5 or min(self.level_weights) < 0 or sum(self.level_weights) <= 0:
            raise ValueError(
                f"level_weights needs 5 non-negative weights (levels 1..5), got {self.level_weights}"
            )
        if self.lr <= 0 or self.eval_temperature < 0:
            raise ValueError("lr must be > 0 and eval_temperature >= 0")

    def key(self) -> str:
        """12 hex digits of SHA-256 over the config, ``FORMAT_VERSION`` and the source of ``ebpo.tasks.arith``
        (a change to the problem generator changes the training data, so it must not reuse old models)."""
        from ebpo.tasks import arith

        task_source = hashlib.sha256(Path(arith.__file__).read_bytes()).hexdigest()
        payload = json.dumps({"format": FORMAT_VERSION, "arith": task_source, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


# --- cache --------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """``$EBPO_CACHE`` or ``~/.cache/ebpo``."""
    return Path(os.environ.get("EBPO_CACHE", "~/.cache/ebpo")).expanduser()


def base_model_path(config: BaseModelConfig | None = None, cache_dir: str | Path | None = None) -> Path:
    """Where the model of ``config`` lives (built or not): ``<cache>/base_models/arith-<key>``."""
    config = config or BaseModelConfig()
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    return root / "base_models" / f"arith-{config.key()}"


def default_base_model_path() -> Path:
    """Path of the default base model (``BaseModelConfig()``); it exists once ``build_base_model()`` ran."""
    return base_model_path(BaseModelConfig())


def is_built(path: Path) -> bool:
    """A finished build: ``build_info.json`` is written last, so its presence means the rest is there."""
    return (path / BUILD_INFO).is_file()


def load_build_info(path: str | Path) -> dict[str, Any]:
    """The ``build_info.json`` of a built model directory."""
    info_file = Path(path) / BUILD_INFO
    if not info_file.is_file():
        raise FileNotFoundError(
            f"{info_file} not found: not a finished base-model build (run `ebpo base-model`)"
        )
    return json.loads(info_file.read_text())


# --- data ---------------------------------------------------------------------------------------------


def encode_sft_example(tokenizer, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """Token ids of ``prompt + answer + EOS`` and labels (-100 on the prompt: loss on answer and EOS only)."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids


def sft_records(config: BaseModelConfig) -> list:
    """The SFT pool: ``train_problems`` arith train problems, split over levels by ``level_weights`` (rounded
    down; the remainder goes to level 1) and balanced over topics within a level."""
    from ebpo.tasks import arith

    total = sum(config.level_weights)
    counts = [int(config.train_problems * w / total) for w in config.level_weights]
    counts[0] += config.train_problems - sum(counts)
    records = []
    for level, count in zip(arith.LEVELS, counts):
        records += arith.generate("train", count, seed=config.seed * 100 + level, levels=[level])
    return records


def _epoch_batches(n: int, batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch of shuffled batches of example indices (popped from the end).

    Plain shuffling on purpose: batches of similar length (length bucketing) are batches of one topic,
    and such topic-homogeneous batches made the 45-cell mixture learn about half as fast.
    """
    order = list(range(n))
    rng.shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def _collate(examples: list[tuple[list[int], list[int]]], pad_id: int):
    """Right-pad a batch: (input_ids_BT, attention_mask_BT, labels_BT)."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids_BT = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention_mask_BT = torch.zeros((len(examples), width), dtype=torch.long)
    labels_BT = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, labels) in enumerate(examples):
        input_ids_BT[row, : len(ids)] = torch.tensor(ids)
        attention_mask_BT[row, : len(ids)] = 1
        labels_BT[row, : len(labels)] = torch.tensor(labels)
    return input_ids_BT, attention_mask_BT, labels_BT


# --- training -----------------------------------------------------------------------------------------


def _lr_at(step: int, config: BaseModelConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``0.1 * lr`` at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_sft(model, tokenizer, config: BaseModelConfig, *, progress: bool = True) -> list[float]:
    """Supervised warm start on ``config.train_problems`` arith train problems; returns the loss per step."""
    import torch
    from tqdm.auto import tqdm

    records = sft_records(config)
    examples = [encode_sft_example(tokenizer, r.prompt, r.answer) for r in records]
    rng = random.Random(f"base-model-sft/{config.seed}")
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.95),
    )
    model.train()
    losses: list[float] = []
    batches: list[list[int]] = []
    bar = tqdm(range(config.steps), desc="base-model SFT", disable=not progress, dynamic_ncols=True)
    for step in bar:
        if not batches:
            batches = _epoch_batches(len(examples), config.batch_size, rng)
        input_ids_BT, attention_mask_BT, labels_BT = _collate(
            [examples[i] for i in batches.pop()], tokenizer.pad_token_id
        )
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, config)
        loss = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT, labels=labels_BT).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == config.steps - 1:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


# --- the pass-rate grid -------------------------------------------------------------------------------


def pass_rate_grid(
    model,
    tokenizer,
    *,
    per_cell: int = 40,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 10,
    batch_size: int = 512,
    split: str = "validation",
    progress: bool = False,
) -> dict[str, dict[int, float]]:
    """Pass rate per (topic, level) on ``per_cell`` ``arith`` problems of ``split``, one sample each.

    Sampling is plain temperature sampling (no top-k / top-p; ``temperature=0`` is greedy), seeded with
    ``seed``; a response is scored by ``arith.verify``. Returns ``{topic: {level: pass_rate}}``.
    """
    import torch
    from tqdm.auto import tqdm

    from ebpo.tasks import arith

    records = arith.generate(split, per_cell * len(arith.TOPICS) * len(arith.LEVELS), seed=seed)
    torch.manual_seed(seed)
    correct: dict[tuple[str, int], list[float]] = {}
    starts = range(0, len(records), batch_size)
    for start in tqdm(starts, desc="pass-rate grid", disable=not progress, dynamic_ncols=True):
        chunk = records[start : start + batch_size]
        texts = sample_answers(
            model,
            tokenizer,
            [r.prompt for r in chunk],
            temperature=temperature,
            max_new_tokens=max_new_tokens,
        )
        for record, text in zip(chunk, texts):
            correct.setdefault((record.topic, record.level), []).append(arith.verify(text, record.answer))
    return {
        t: {lv: sum(correct[t, lv]) / len(correct[t, lv]) for lv in arith.LEVELS if (t, lv) in correct}
        for t in arith.TOPICS
    }


def sample_answers(
    model, tokenizer, prompts: list[str], *, temperature: float, max_new_tokens: int
) -> list[str]:
    """One response per prompt (left-padded batch, KV cache, stop at EOS); decoded without special tokens."""
    import torch

    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    with torch.no_grad():
        out_BT = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **sampling,
        )
    return tokenizer.batch_decode(out_BT[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def format_grid(grid: dict[str, dict[int, float]]) -> str:
    """The grid as a markdown table: one row per topic, one column per level, plus row and column means."""
    levels = sorted({lv for row in grid.values() for lv in row})
    lines = [
        "| topic | " + " | ".join(f"L{lv}" for lv in levels) + " | mean |",
        "|---" * (len(levels) + 2) + "|",
    ]
    for topic, row in grid.items():
        cells = [row[lv] for lv in levels]
        lines.append(
            f"| {topic} | " + " | ".join(f"{c:.2f}" for c in cells) + f" | {sum(cells) / len(cells):.2f} |"
        )
    means = [sum(row[lv] for row in grid.values()) / len(grid) for lv in levels]
    overall = sum(means) / len(means)
    lines.append("| mean | " + " | ".join(f"{m:.2f}" for m in means) + f" | {overall:.2f} |")
    return "\n".join(lines)


def grid_summary(grid: dict[str, dict[int, float]]) -> dict[str, int]:
    """How many cells are near 0 (<= 0.05), near 1 (>= 0.95) and in between."""
    rates = [rate for row in grid.values() for rate in row.values()]
    low = sum(rate <= 0.05 for rate in rates)
    high = sum(rate >= 0.95 for rate in rates)
    return {"cells": len(rates), "near_0": low, "near_1": high, "between": len(rates) - low - high}


# --- build --------------------------------------------------------------------------------------------


def build_base_model(
    config: BaseModelConfig | None = None,
    *,
    force: bool = False,
    progress: bool = True,
    cache_dir: str | Path | None = None,
) -> Path:
    """Build (or reuse) the warm-started ``arith`` base model; returns its directory.

    Deterministic given ``config.seed`` on a given machine and thread count. The model is trained in a
    temporary directory beside the target and renamed into place when complete, so an interrupted build
    leaves no half-written model behind and concurrent builds do not clash.
    """
    import torch
    from transformers import LlamaForCausalLM

    from ebpo.models.tiny import build_char_tokenizer, tiny_config

    config = config or BaseModelConfig()
    path = base_model_path(config, cache_dir)
    if is_built(path) and not force:
        if progress:
            info = load_build_info(path)
            print(
                f"reusing cached base model {path} (built in {info['build_seconds']:.0f} s; --force rebuilds)"
            )
            if info.get("grid"):
                print(_grid_report(info["grid"], info["config"]["eval_temperature"]))
        return path

    started = time.perf_counter()
    tokenizer = build_char_tokenizer()
    torch.manual_seed(config.seed)
    model_config = tiny_config(
        len(tokenizer),
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        max_positions=256,
    )
    model = LlamaForCausalLM(model_config)
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, name, getattr(tokenizer, name))
    n_params = sum(p.numel() for p in model.parameters())
    if progress:
        print(
            f"building arith base model ({n_params / 1e6:.2f}M parameters, {config.steps} SFT steps) into {path}"
        )
    losses = train_sft(model, tokenizer, config, progress=progress)
    train_seconds = time.perf_counter() - started
    grid: dict[str, dict[int, float]] = {}
    if config.eval_per_cell > 0:
        grid = pass_rate_grid(
            model,
            tokenizer,
            per_cell=config.eval_per_cell,
            temperature=config.eval_temperature,
            seed=config.seed,
            max_new_tokens=config.max_new_tokens,
            progress=progress,
        )

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    info = {
        "config": asdict(config),
        "key": config.key(),
        "format_version": FORMAT_VERSION,
        "num_parameters": n_params,
        "loss_every_10_steps": losses[::10],
        "final_loss": losses[-1] if losses else None,
        "train_seconds": train_seconds,
        "build_seconds": time.perf_counter() - started,
        "torch_threads": torch.get_num_threads(),
        "grid": grid,
        "grid_summary": grid_summary(grid) if grid else None,
    }
    (staging / BUILD_INFO).write_text(json.dumps(info, indent=2))
    if path.exists():  # --force, or another process finished the same build meanwhile
        shutil.rmtree(path)
    os.replace(staging, path)
    if progress:
        print(
            f"built in {info['build_seconds']:.1f} s (SFT {train_seconds:.1f} s), final loss {info['final_loss']:.3f}"
        )
        if grid:
            print(_grid_report(grid, config.eval_temperature))
    return path


def _grid_report(grid: dict[str, dict[int, float]], temperature: float) -> str:
    # JSON turns the level keys into strings; normalise back to ints.
    grid = {topic: {int(lv): rate for lv, rate in row.items()} for topic, row in grid.items()}
    how = "greedy" if temperature == 0 else f"temperature {temperature:g}"
    counts = grid_summary(grid)
    return (
        f"pass rate on validation problems, one sample each at {how}:\n{format_grid(grid)}\n"
        f"cells near 0: {counts['near_0']}, near 1: {counts['near_1']}, in between: {counts['between']}"
    )


# --- CLI ----------------------------------------------------------------------------------------------


def add_parser(subparsers) -> None:
    """``ebpo base-model``: one flag per ``BaseModelConfig`` field, plus ``--force`` and ``--cache-dir``."""
    parser = subparsers.add_parser(
        "base-model",
        help="build (or reuse) the warm-started arith base model",
        description=__doc__.split("\n\n")[0] + " Prints the pass-rate grid and, last, the model directory.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for f in fields(BaseModelConfig):
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(f.default, tuple):
            parser.add_argument(
                flag,
                dest=f.name,
                default=f.default,
                metavar="W1,...,W5",
                help=f.metadata["help"].replace("%", "%%"),
                type=lambda text: tuple(float(x) for x in text.split(",")),
            )
        else:
            parser.add_argument(
                flag,
                dest=f.name,
                type=type(f.default),
                default=f.default,
                help=f.metadata["help"].replace("%", "%%"),
            )
    parser.add_argument(
        "--force", action="store_true", help="rebuild even if a cached model with this config exists"
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="cache root (default: $EBPO_CACHE or ~/.cache/ebpo); the model goes in base_models/",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice, one per core); on a CPU that other processes keep busy, "
        "1 can be several times faster. Changes float rounding, so weights may differ in the last bits",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars or grid; print only the path")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = BaseModelConfig(**{f.name: getattr(args, f.name) for f in fields(BaseModelConfig)})
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    path = build_base_model(config, force=args.force, progress=not args.quiet, cache_dir=args.cache_dir)
    print(path)
    return 0
