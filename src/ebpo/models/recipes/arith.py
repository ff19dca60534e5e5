"""The recipe of the ``arith`` base model (:class:`BaseModelConfig`, its :meth:`~BaseModelConfig.key`) and
the noisy teacher whose labels it trains on.

The teacher knows every answer but writes it down right only with probability ``p(topic, level)``
(:func:`teacher_accuracy`), and otherwise writes one of :func:`wrong_labels`, drawn uniformly. The default
teacher runs on past the answer: it writes the answer, then one or two more digits (``42`` -> ``427``,
``4271``; :func:`run_ons`, 110 of them), so the model computes the answer before it decides to stop, and its
wrong answers rarely collide in a vote. A near-miss teacher (``near_miss_offsets``, ``near_miss_digit_slips``:
off by one or two, or one digit slipped, ``42`` -> ``41``, ``47``, ``92``; :func:`near_misses`, about 20 of
them) writes wrong answers where the model's own slips land, so a vote of eight collides (docs/base_model.md).

The teacher lives beside the recipe because the recipe's key hashes what the teacher writes
(:func:`data_fingerprint`); ``ebpo.models.sft`` trains on its labels, ``ebpo.models.grid`` measures the model,
and ``ebpo.models.build`` builds, caches and checks it. The recipe registers itself in
:data:`ebpo.models.recipes.RECIPES` as ``arith``; its default build ships in :data:`SHIPPED_DIR`.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ebpo.models.recipes.base import MODELS_DIR, RECIPES, Recipe, check_recipe_fields, grid_of

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ebpo.data import Record

# Bump when the training loop or the model layout changes in a way the data fingerprint does not see
# (an optimizer setting, the initialisation): old caches are then ignored, and the shipped model's key
# test fails until it is rebuilt.
FORMAT_VERSION = 2
ADDED_FIELDS: dict[str, Any] = {"run_on_digits": ()}
"""Recipe fields added after format 2, with the value that leaves a build as it was before them."""
SHIPPED_DIR = MODELS_DIR / "arith_base"
"""The built default recipe, shipped as package data (rebuilt with ``ebpo base-model --out`` on it)."""


@dataclass(frozen=True)
class BaseModelConfig:
    """Everything that determines the built model (its hash, :meth:`key`, names the cache directory); each
    field is a flag of ``ebpo base-model``."""

    _argument_group_name = "recipe (BaseModelConfig; defaults = the shipped model)"

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
        metadata={
            "metavar": "V1,V2,...",
            "help": "share of the SFT pool per level 1..5 (normalised); harder levels get more",
        },
    )
    teacher_topic_accuracy: tuple[float, ...] = field(
        default=(0.5, 0.5, 0.5, 0.5, 1.0, 0.5, 0.5, 1.0, 0.5),
        metadata={
            "metavar": "V1,V2,...",
            "help": "the teacher's probability of a right label at level 1, per topic in arith.TOPICS order "
            "(mod, sequence, area, count, max, dot, word, units, power)",
        },
    )
    teacher_level_factor: tuple[float, ...] = field(
        default=(1.0, 0.85, 0.7, 0.55, 0.4),
        metadata={
            "metavar": "V1,V2,...",
            "help": "multiplies the topic's accuracy at levels 1..5: p(topic, level) = topic accuracy x "
            "level factor (clipped to [0, 1])",
        },
    )
    near_miss_offsets: tuple[int, ...] = field(
        default=(),
        metadata={
            "metavar": "V1,V2,...",
            "help": "a wrong label may be the answer plus one of these offsets",
        },
    )
    near_miss_digit_slips: bool = field(
        default=False,
        metadata={"help": "a wrong label may also be the answer with one digit replaced (42 -> 47, 92)"},
    )
    run_on_digits: tuple[int, ...] = field(
        default=(1, 2),
        metadata={
            "metavar": "V1,V2,...",
            "help": "a wrong label may also be the answer run on by this many random digits (1,2: 42 -> 427, "
            "4271); empty for none",
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
        positive = ("hidden_size", "num_layers", "num_heads", "batch_size", "train_problems")
        check_recipe_fields(self, positive + ("eval_samples", "max_new_tokens"))
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
    from ebpo.tasks import arith

    rows: list[Any] = []
    for split in arith.SPLITS:
        rows += [(r.prompt, r.answer, r.topic, r.level) for r in arith.generate(split, per_split, seed=0)]
    rng = random.Random(f"base-model-teacher/{config.seed}")
    sft_sample = arith.generate("sft", per_split, seed=config.seed * 100 + 1, levels=[1])
    rows += [teacher_label(r, config, rng) for r in sft_sample]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def teacher_accuracy(config: BaseModelConfig, topic: str, level: int) -> float:
    """Probability that the teacher's label is right: ``teacher_topic_accuracy[topic] * teacher_level_factor[level]``
    (clipped to [0, 1]), with the topic's entry in ``ebpo.tasks.arith.TOPICS`` order."""
    from ebpo.tasks import arith

    value = config.teacher_topic_accuracy[arith.TOPICS.index(topic)] * config.teacher_level_factor[level - 1]
    return min(1.0, max(0.0, value))


def near_miss(answer: int, offset: int) -> int:
    """``answer + offset``, reflected to ``answer - offset`` when that would turn a non-negative answer negative
    (a remainder, a count or an area is never written as a negative number, even by mistake)."""
    missed = answer + offset
    return answer - offset if answer >= 0 and missed < 0 else missed


def digit_slips(answer: int) -> list[int]:
    """The answer with one digit replaced by another (the sign kept; no leading zero): ``42`` -> 12, 22, ...,
    92, 40, 41, 43, ..., 49."""
    digits, sign = str(abs(answer)), -1 if answer < 0 else 1
    slips = []
    for i, old in enumerate(digits):
        for new in "0123456789":
            if new != old and not (i == 0 and new == "0" and len(digits) > 1):
                slips.append(sign * int(digits[:i] + new + digits[i + 1 :]))
    return slips


def near_misses(answer: int, config: BaseModelConfig) -> list[int]:
    """The teacher's wrong labels for ``answer``, each equally likely: ``answer + offset`` for every offset of
    ``near_miss_offsets`` (:func:`near_miss`) and, with ``near_miss_digit_slips``, every :func:`digit_slips`
    variant; distinct, sorted, never the answer itself."""
    candidates = {near_miss(answer, offset) for offset in config.near_miss_offsets}
    if config.near_miss_digit_slips:
        candidates.update(digit_slips(answer))
    candidates.discard(answer)
    return sorted(candidates)


def run_ons(answer: int, digits: int) -> list[str]:
    """The answer run on by ``digits`` more digits, every choice of them: ``run_ons(42, 1)`` -> ``420``,
    ``421``, ..., ``429``. Written as text (``0`` run on by ``5`` is ``05``); none reads as the answer itself."""
    labels = (f"{answer}{tail:0{digits}d}" for tail in range(10**digits))
    return [label for label in labels if int(label) != answer]


def wrong_labels(answer: int, config: BaseModelConfig) -> list[str]:
    """Every wrong label the teacher may write for ``answer``, each equally likely: the :func:`near_misses`
    and, for each count in ``run_on_digits``, the :func:`run_ons` by that many digits (distinct texts)."""
    labels = [str(miss) for miss in near_misses(answer, config)]
    for digits in sorted(set(config.run_on_digits)):
        labels += run_ons(answer, digits)
    return list(dict.fromkeys(labels))


def teacher_label(record: Record, config: BaseModelConfig, rng: random.Random) -> str:
    """One draw of the teacher's label for ``record``: the answer with probability ``teacher_accuracy``, else
    one of its :func:`wrong_labels`, drawn uniformly."""
    answer = int(record.answer)
    assert record.topic is not None and record.level is not None  # arith records carry both
    if rng.random() < teacher_accuracy(config, record.topic, record.level):
        return str(answer)
    return rng.choice(wrong_labels(answer, config))


# --- the model and its registration --------------------------------------------------------------------


def new_model(config: BaseModelConfig):
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


def _evaluate_grid(*args: Any, **kwargs: Any) -> dict[str, Any]:
    from ebpo.models.grid import evaluate_grid

    return evaluate_grid(*args, **kwargs)


# --- its SFT data ------------------------------------------------------------------------------------------


def sft_records(config: BaseModelConfig) -> list[Record]:
    """The SFT pool: ``train_problems`` problems of the arith ``sft`` split (disjoint from the ``train`` split
    RL draws from, and from validation and test), split over levels by ``level_weights`` (rounded down; the
    remainder goes to level 1) and balanced over topics within a level."""
    from ebpo.tasks import arith

    total = sum(config.level_weights)
    counts = [int(config.train_problems * w / total) for w in config.level_weights]
    counts[0] += config.train_problems - sum(counts)
    records: list[Record] = []
    for level, count in zip(arith.LEVELS, counts):
        records += arith.generate("sft", count, seed=config.seed * 100 + level, levels=[level])
    return records


def train_sft(
    model: torch.nn.Module,
    tokenizer,
    config: BaseModelConfig,
    *,
    progress: bool = True,
    stop_after: int | None = None,
) -> list[float]:
    """Supervised warm start on ``sft_records(config)`` with the teacher's labels; returns the loss per step.

    ``ebpo.models.sft.run_sft``'s loop. Deterministic given ``config.seed`` (batch order from
    ``Random("base-model-sft/<seed>")``, labels from ``Random("base-model-teacher/<seed>")``) on one torch build,
    CPU kind and thread count.
    """
    from ebpo.models.sft import encode_sft_example, run_sft

    records = sft_records(config)
    teacher_rng = random.Random(f"base-model-teacher/{config.seed}")

    def examples(step: int, batch: list[int]) -> list[tuple[list[int], list[int]]]:
        noisy = step >= config.clean_steps
        return [
            encode_sft_example(
                tokenizer,
                records[i].prompt,
                teacher_label(records[i], config, teacher_rng) if noisy else records[i].answer,
            )
            for i in batch
        ]

    return run_sft(
        model,
        config,
        num_examples=len(records),
        examples=examples,
        order_rng=random.Random(f"base-model-sft/{config.seed}"),
        pad_id=tokenizer.pad_token_id,
        progress=progress,
        stop_after=stop_after,
    )


def _train(
    model, tokenizer, config: BaseModelConfig, *, progress: bool = True, stop_after: int | None = None
):
    return train_sft(
        model, tokenizer, config, progress=progress, stop_after=stop_after
    )  # looked up when called


RECIPES.register(
    "arith",
    Recipe(
        name="arith",
        config_cls=BaseModelConfig,
        shipped_dir=SHIPPED_DIR,
        new_model=lambda config: new_model(config),  # looked up when called (tests replace it)
        train=_train,
        grid=grid_of(_evaluate_grid),
        format_version=FORMAT_VERSION,
        what="arith base model",
    ),
)
