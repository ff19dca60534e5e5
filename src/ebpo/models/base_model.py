"""The ``arith`` base model that ``ebpo train`` starts from: its recipe, the shipped weights, the cache.

A small Llama (``ebpo.models.tiny``: character tokenizer, tied embeddings) fine-tuned from random weights
on the arith ``sft`` split by a noisy teacher (``ebpo.models.sft``): it learns to compute the answers but
to write them down right only part of the time, so its majority answer is right far more often than one
sample. RL then has headroom that carries over to problems it never saw: it sharpens what the model knows.

The default recipe (``BaseModelConfig()``) is built once and shipped with the package
(``ebpo/models/arith_base/``, a few MB): ``build_base_model()`` returns that directory when its recorded
recipe key equals the current recipe's key, so nothing is trained at run time. Any other recipe is built
into the cache ``$EBPO_CACHE/base_models/arith-<key>`` (default ``~/.cache/ebpo``) and reused from there.
A build always runs on one torch thread: the weights depend on the thread count. ``check_base_model()``
(``ebpo base-model --check``) rebuilds the default recipe and compares every tensor with the shipped one.

The recipe key hashes the config, :data:`FORMAT_VERSION`, and what the generator and the teacher produce
on a fixed sample (:func:`data_fingerprint`): a change to the problem generator or the teacher that
changes the training data changes the key; an edit that does not (a comment, a refactor) does not.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Bump when the training loop or the model layout changes in a way the data fingerprint does not see
# (an optimizer setting, the initialisation): old caches are then ignored, and the shipped model's key
# test fails until it is rebuilt.
FORMAT_VERSION = 2
BUILD_INFO = "build_info.json"
SHIPPED_DIR = Path(__file__).resolve().parent / "arith_base"
"""The built default recipe, shipped as package data (rebuilt with ``ebpo base-model --out`` on it)."""
PREFIX_STEPS = 25
"""The build records a hash of the weights after this many SFT steps: the guard test retrains that prefix."""
BUILD_THREADS = 1
ADDED_FIELDS: dict[str, Any] = {"run_on_digits": ()}
"""Recipe fields added after format 2, with the value that leaves a build as it was before them."""


@dataclass(frozen=True)
class BaseModelConfig:
    """Everything that determines the built model (its hash, :meth:`key`, names the cache directory)."""

    seed: int = field(
        default=0, metadata={"help": "seed of the initial weights, the SFT data, its order and labels"}
    )
    hidden_size: int = field(default=64, metadata={"help": "model width (Llama hidden size)"})
    num_layers: int = field(default=2, metadata={"help": "number of transformer layers"})
    num_heads: int = field(default=4, metadata={"help": "attention heads (key/value heads: half of them)"})
    steps: int = field(default=18000, metadata={"help": "SFT optimiser steps"})
    clean_steps: int = field(
        default=13000,
        metadata={
            "help": "the first SFT steps train on right answers only (learning to compute); the noisy teacher "
            "labels the remaining steps - clean_steps (learning to write the answer down unreliably)"
        },
    )
    batch_size: int = field(default=64, metadata={"help": "SFT sequences per step"})
    lr: float = field(
        default=4e-3, metadata={"help": "peak AdamW learning rate (linear warm-up, cosine decay to 10%)"}
    )
    warmup_steps: int = field(default=100, metadata={"help": "linear learning-rate warm-up steps"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient-norm clipping threshold"})
    train_problems: int = field(
        default=40_000,
        metadata={
            "help": "size of the SFT pool from the arith sft split (disjoint from the train split RL draws "
            "from; split over levels by level_weights, balanced over topics)"
        },
    )
    level_weights: tuple[float, ...] = field(
        default=(0.6, 0.8, 1.0, 1.2, 1.4),
        metadata={"help": "share of the SFT pool per level 1..5 (normalised); harder levels get more"},
    )
    teacher_topic_accuracy: tuple[float, ...] = field(
        default=(0.5, 0.5, 0.5, 0.5, 1.0, 0.5, 0.5, 1.0, 0.5),
        metadata={
            "help": "the teacher's probability of a right label at level 1, per topic in arith.TOPICS order "
            "(mod, sequence, area, count, max, dot, word, units, power)"
        },
    )
    teacher_level_factor: tuple[float, ...] = field(
        default=(1.0, 0.85, 0.7, 0.55, 0.4),
        metadata={
            "help": "multiplies the topic's accuracy at levels 1..5: p(topic, level) = topic accuracy x "
            "level factor (clipped to [0, 1])"
        },
    )
    near_miss_offsets: tuple[int, ...] = field(
        default=(),
        metadata={"help": "a wrong label may be the answer plus one of these offsets"},
    )
    near_miss_digit_slips: bool = field(
        default=False,
        metadata={"help": "a wrong label may also be the answer with one digit replaced (42 -> 47, 92)"},
    )
    run_on_digits: tuple[int, ...] = field(
        default=(1, 2),
        metadata={
            "help": "a wrong label may also be the answer run on by this many random digits (1,2: 42 -> 427, "
            "4271); empty for none"
        },
    )
    eval_per_cell: int = field(
        default=40, metadata={"help": "problems per (topic, level) cell for the grid printed after the build"}
    )
    eval_samples: int = field(default=8, metadata={"help": "samples per problem of the grid (pass@1, maj@n)"})
    eval_temperature: float = field(
        default=1.0, metadata={"help": "sampling temperature of the grid; 1.0 is what RL samples at"}
    )
    max_new_tokens: int = field(default=10, metadata={"help": "longest response sampled for the grid"})

    def __post_init__(self) -> None:
        # One recipe, one key: ``lr=1`` and ``lr=1.0``, ``(1, 0.9)`` and ``[1.0, 0.9]`` are the same recipe, but
        # their JSON (what :meth:`key` hashes) differs. Coerce every field to its annotated type first.
        for name, hint in typing.get_type_hints(type(self)).items():
            value = getattr(self, name)
            if hint is float and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
            elif typing.get_origin(hint) is tuple and isinstance(value, (tuple, list)):
                kind = typing.get_args(hint)[0]
                if kind is int and not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                    raise ValueError(f"BaseModelConfig.{name} needs whole numbers, got {value}")
                object.__setattr__(self, name, tuple(float(v) if kind is float else v for v in value))
        positive = ("hidden_size", "num_layers", "num_heads", "batch_size", "train_problems")
        for name in positive + ("eval_samples", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"BaseModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("steps", "clean_steps", "warmup_steps", "eval_per_cell"):
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
        if len(self.teacher_topic_accuracy) != 9 or not all(0 <= p <= 1 for p in self.teacher_topic_accuracy):
            raise ValueError(
                "teacher_topic_accuracy needs 9 probabilities in [0, 1] (arith.TOPICS order), got "
                f"{self.teacher_topic_accuracy}"
            )
        if len(self.teacher_level_factor) != 5 or min(self.teacher_level_factor) < 0:
            raise ValueError(
                f"teacher_level_factor needs 5 non-negative factors (levels 1..5), got {self.teacher_level_factor}"
            )
        if 0 in self.near_miss_offsets:
            raise ValueError(f"near_miss_offsets needs non-zero offsets, got {self.near_miss_offsets}")
        if any(n < 1 for n in self.run_on_digits):
            raise ValueError(f"run_on_digits needs digit counts >= 1, got {self.run_on_digits}")
        if not (self.near_miss_offsets or self.near_miss_digit_slips or self.run_on_digits):
            raise ValueError(
                "the teacher needs wrong labels: give near_miss_offsets, near_miss_digit_slips or run_on_digits"
            )
        if self.lr <= 0 or self.eval_temperature <= 0:
            raise ValueError("lr and eval_temperature must be > 0")

    def key(self) -> str:
        """12 hex digits of SHA-256 over the config, :data:`FORMAT_VERSION` and :func:`data_fingerprint`.

        A field added after a recipe was built enters the key only away from its neutral value
        (:data:`ADDED_FIELDS`), so the recipes built before it keep their keys (and the shipped model its)."""
        fields_ = {k: v for k, v in asdict(self).items() if ADDED_FIELDS.get(k, object()) != v}
        payload = json.dumps(
            {"format": FORMAT_VERSION, "data": data_fingerprint(self), **fields_}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def data_fingerprint(config: BaseModelConfig, per_split: int = 90) -> str:
    """SHA-256 of what the generator and the teacher produce on a fixed sample: ``per_split`` problems of
    every arith split (prompt, answer, topic, level), and the teacher's labels for the first ``per_split``
    problems of the SFT pool's first level. Any change to the problem generator, the splits or the teacher
    that alters these changes the recipe key."""
    from ebpo.models.sft import teacher_label
    from ebpo.tasks import arith

    rows: list[Any] = []
    for split in arith.SPLITS:
        rows += [(r.prompt, r.answer, r.topic, r.level) for r in arith.generate(split, per_split, seed=0)]
    rng = random.Random(f"base-model-teacher/{config.seed}")
    sft_sample = arith.generate("sft", per_split, seed=config.seed * 100 + 1, levels=[1])
    rows += [teacher_label(r, config, rng) for r in sft_sample]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def state_dict_sha256(model) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of every tensor of ``model.state_dict()``."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        array = tensor.detach().cpu().contiguous().numpy()
        digest.update(f"{name}|{array.dtype}|{tuple(array.shape)}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


# --- where models live --------------------------------------------------------------------------------


def cache_root() -> Path:
    """``$EBPO_CACHE`` or ``~/.cache/ebpo``."""
    return Path(os.environ.get("EBPO_CACHE", "~/.cache/ebpo")).expanduser()


def base_model_path(config: BaseModelConfig | None = None, cache_dir: str | Path | None = None) -> Path:
    """Where the cached build of ``config`` lives (built or not): ``<cache>/base_models/arith-<key>``."""
    config = config or BaseModelConfig()
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    return root / "base_models" / f"arith-{config.key()}"


def is_built(path: Path) -> bool:
    """A finished build: ``build_info.json`` is written last, so its presence means the rest is there."""
    return (Path(path) / BUILD_INFO).is_file()


def load_build_info(path: str | Path) -> dict[str, Any]:
    """The ``build_info.json`` of a built model directory."""
    info_file = Path(path) / BUILD_INFO
    if not info_file.is_file():
        raise FileNotFoundError(
            f"{info_file} not found: not a finished base-model build (run `ebpo base-model`)"
        )
    return json.loads(info_file.read_text())


def shipped_model_path(config: BaseModelConfig | None = None) -> Path | None:
    """The shipped model directory if it holds a build of ``config`` (default recipe), else ``None``."""
    config = config or BaseModelConfig()
    if not is_built(SHIPPED_DIR):
        return None
    return SHIPPED_DIR if load_build_info(SHIPPED_DIR).get("key") == config.key() else None


def default_base_model_path() -> Path:
    """Path of the default base model: the shipped one when current, else its cache location."""
    return shipped_model_path() or base_model_path(BaseModelConfig())


# --- build --------------------------------------------------------------------------------------------


def _new_model(config: BaseModelConfig):
    """The randomly initialised model (seeded) and the character tokenizer."""
    import torch
    from transformers import LlamaForCausalLM

    from ebpo.models.tiny import build_char_tokenizer, tiny_config

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
    return model, tokenizer


class _OneThread:
    """Run a block on :data:`BUILD_THREADS` torch threads, then restore the previous count."""

    def __enter__(self):
        import torch

        self.previous = torch.get_num_threads()
        torch.set_num_threads(BUILD_THREADS)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.previous)


def platform_info() -> dict[str, str]:
    """What bit-for-bit reproduction of a build depends on besides the recipe: torch and its CPU kernels."""
    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def train_prefix_sha256(config: BaseModelConfig | None = None, steps: int = PREFIX_STEPS) -> str:
    """Hash of the weights after the first ``steps`` SFT steps of ``config``'s build (same schedule)."""
    from ebpo.models.sft import train_sft

    config = config or BaseModelConfig()
    with _OneThread():
        model, tokenizer = _new_model(config)
        train_sft(model, tokenizer, config, progress=False, stop_after=steps)
    return state_dict_sha256(model)


def _train(config: BaseModelConfig, progress: bool, describe_target: str):
    """The build proper: fresh model, prefix hash, full SFT. Returns (model, tokenizer, info)."""

    from ebpo.models.sft import train_sft

    started, cpu_started = time.perf_counter(), time.process_time()
    with _OneThread():
        model, tokenizer = _new_model(config)
        n_params = sum(p.numel() for p in model.parameters())
        if progress:
            print(
                f"building the arith base model ({n_params / 1e6:.2f}M parameters, {config.steps} SFT steps, "
                f"one thread) into {describe_target}",
                flush=True,
            )
        prefix = min(PREFIX_STEPS, config.steps)
        prefix_sha = train_prefix_sha256(config, prefix)  # what the guard test retrains
        model, tokenizer = _new_model(config)  # the full run starts from the same initial weights
        losses = train_sft(model, tokenizer, config, progress=progress)
        weights_sha = state_dict_sha256(model)
    info = {
        "config": asdict(config),
        "key": config.key(),
        "format_version": FORMAT_VERSION,
        "num_parameters": n_params,
        "threads": BUILD_THREADS,
        **platform_info(),
        "prefix_steps": prefix,
        "prefix_sha256": prefix_sha,
        "weights_sha256": weights_sha,
        "loss_every_100_steps": losses[::100],
        "final_loss": losses[-1] if losses else None,
        "train_seconds": time.perf_counter() - started,
        "train_cpu_seconds": time.process_time() - cpu_started,
    }
    return model, tokenizer, info


def _save(model, tokenizer, info: dict[str, Any], path: Path) -> None:
    """Write the model, tokenizer and ``build_info.json`` (last) into a staging directory, then rename it
    into place: an interrupted build leaves no half-written model, and concurrent builds do not clash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / BUILD_INFO).write_text(json.dumps(info, indent=1) + "\n")
    if path.exists():  # --force, or another process finished the same build meanwhile
        shutil.rmtree(path)
    os.replace(staging, path)


def build_base_model(
    config: BaseModelConfig | None = None,
    *,
    force: bool = False,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
) -> Path:
    """The directory of the base model of ``config`` (default recipe: the shipped one); builds it if needed.

    Order: the shipped model if it holds ``config``'s recipe (unless ``force`` or ``out_dir``); else a
    finished build in ``out_dir`` or the cache with the same key (unless ``force``); else a new build
    there. The directory loads with ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``; its
    ``build_info.json`` holds the recipe, key, hashes, loss curve and the validation grid.
    """
    config = config or BaseModelConfig()
    if not force and out_dir is None:
        shipped = shipped_model_path(config)
        if shipped is not None:
            return shipped
    path = Path(out_dir) if out_dir is not None else base_model_path(config, cache_dir)
    if is_built(path) and not force and load_build_info(path).get("key") == config.key():
        if progress:
            print(f"reusing the base model built in {path} (--force rebuilds)")
        return path

    started = time.perf_counter()
    model, tokenizer, info = _train(config, progress, str(path))
    grid = measure_grid(model, tokenizer, config, split="validation", progress=progress)
    info["grid_validation"] = grid
    info["build_seconds"] = time.perf_counter() - started
    _save(model, tokenizer, info, path)
    if progress:
        print(f"built in {info['build_seconds']:.0f} s, final loss {info['final_loss']:.3f}: {path}")
    return path


def measure_grid(model, tokenizer, config: BaseModelConfig, *, split: str, progress: bool) -> dict[str, Any]:
    """The recipe's pass@1 / maj@n / greedy grid of ``model`` on ``split`` (``eval_per_cell`` problems per
    cell, ``eval_samples`` samples each at ``eval_temperature``, seeded by ``config.seed``); printed as tables
    when ``progress``. Empty when ``eval_per_cell`` is 0."""
    if config.eval_per_cell <= 0:
        return {}
    from ebpo.models.grid import evaluate_grid, grid_report

    grid = evaluate_grid(
        model,
        tokenizer,
        split=split,
        per_cell=config.eval_per_cell,
        samples=config.eval_samples,
        temperature=config.eval_temperature,
        seed=config.seed,
        max_new_tokens=config.max_new_tokens,
        progress=progress,
    )
    if progress:
        print(
            grid_report(grid, split=split, samples=config.eval_samples, temperature=config.eval_temperature)
        )
    return grid


def check_base_model(config: BaseModelConfig | None = None, *, progress: bool = True) -> list[str]:
    """Rebuild ``config`` (default recipe) in full and compare it with the shipped build, tensor by tensor.

    Returns the differences found (empty: the shipped weights are exactly what the recipe builds here).
    A different torch version or CPU kernel set can change the last bits of a build; the message says so.
    """
    import torch
    from safetensors.torch import load_file

    config = config or BaseModelConfig()
    problems: list[str] = []
    if not is_built(SHIPPED_DIR):
        return [f"no shipped model in {SHIPPED_DIR}"]
    shipped_info = load_build_info(SHIPPED_DIR)
    if shipped_info.get("key") != config.key():
        problems.append(
            f"the shipped model's recipe key {shipped_info.get('key')} is not the current recipe's "
            f"{config.key()}: the recipe or the data changed since it was built"
        )
    here = platform_info()
    differs = {k: (shipped_info.get(k), v) for k, v in here.items() if shipped_info.get(k) != v}
    model, _, info = _train(config, progress, "memory (check)")
    rebuilt = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    saved = load_file(str(SHIPPED_DIR / "model.safetensors"))
    for name, tensor in saved.items():
        if name not in rebuilt:
            problems.append(f"tensor {name} is in the shipped model but not in the rebuild")
        elif rebuilt[name].shape != tensor.shape or not torch.equal(rebuilt[name], tensor):
            problems.append(f"tensor {name} differs")
    if info["weights_sha256"] != shipped_info.get("weights_sha256"):
        problems.append("the hash of the rebuilt weights differs from the recorded weights_sha256")
    if info["prefix_sha256"] != shipped_info.get("prefix_sha256"):
        problems.append(f"the hash after the first {PREFIX_STEPS} SFT steps differs from the recorded one")
    if problems and differs:
        problems.append(
            "note: this machine differs from the build machine in "
            + ", ".join(f"{k} (built with {old}, here {new})" for k, (old, new) in differs.items())
        )
    return problems
