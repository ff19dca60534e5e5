"""The recipe of the gym base model S2 (:class:`GymBaseModelConfig`): a small Qwen3 with a byte-level BPE
tokenizer and a ChatML template, fine-tuned on a mixture of reasoning-gym datasets by a noisy teacher.

What it is built from (docs/base_model.md, "S2"):

- **Data**: the ``sft`` split of :data:`TASK` under :data:`MIXTURE` (eight reasoning-gym datasets, three levels
  each, small settings), disjoint from the ``train`` split RL draws from and from validation and test.
- **Tokenizer**: byte-level BPE trained with ``tokenizers`` under Qwen's own pipeline
  (``ebpo.models.chat_tokenizer``) on the templated SFT text, ``vocab_size`` tokens, plus :data:`ANSWER_TOKENS`
  as added tokens (as Qwen3's tokenizer adds ``<think>``): the answer tags cost one token each.
- **Model**: transformers' ``Qwen3ForCausalLM`` (grouped-query attention, q/k RMSNorm, tied embeddings), EOS
  ``<|im_end|>`` and a second EOS id ``<|endoftext|>`` in its ``generation_config``.
- **Sequence**: the prompt through the chat template (``<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n``),
  then ``<answer>LABEL</answer><|im_end|>``; loss on the response only.
- **Teacher**: right labels for the first ``clean_steps`` steps; then the right answer with probability
  ``teacher_accuracy[dataset] x teacher_level_factor[level]``, else a run-on (the answer followed by one or two
  more characters of its kind: digits after a number, letters after a word), drawn uniformly, as S1's teacher.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ebpo.models.recipes.base import MODELS_DIR, RECIPES, Recipe, check_recipe_fields, grid_of

if TYPE_CHECKING:  # pragma: no cover
    from ebpo.data import Record

FORMAT_VERSION = 1
SHIPPED_DIR = MODELS_DIR / "gym_base"
"""S2, the recipe's default build, shipped as package data."""

MIXTURE: dict[str, dict[str, Any]] = {
    "chain_sum": {
        "levels": {
            1: {"max_terms": 2, "max_digits": 1},
            2: {"min_terms": 3, "max_terms": 3, "max_digits": 1},
            3: {"max_terms": 2, "min_digits": 2, "max_digits": 2},
        }
    },
    "basic_arithmetic": {
        "max_digits": 1,
        "allow_parentheses": False,
        "allow_negation": False,
        "levels": {
            1: {"max_terms": 2, "operators": ["+", "-"]},
            2: {"max_terms": 2, "operators": ["*"]},
            3: {"min_terms": 3, "max_terms": 3, "operators": ["+", "-", "*"]},
        },
    },
    "gcd": {"levels": {1: {"max_value": 20}, 2: {"max_value": 50}, 3: {"max_value": 100}}},
    "lcm": {"levels": {1: {"max_value": 10}, 2: {"max_value": 20}, 3: {"max_value": 40}}},
    "count_bits": {
        "levels": {1: {"max_n": 63}, 2: {"min_n": 64, "max_n": 255}, 3: {"min_n": 256, "max_n": 1023}}
    },
    "leg_counting": {
        "min_animals": 1,
        "levels": {
            1: {"max_animals": 1, "max_instances": 5},
            2: {"max_animals": 1, "min_instances": 6, "max_instances": 15},
            3: {"min_animals": 2, "max_animals": 2, "max_instances": 5},
        },
    },
    "spell_backward": {
        "levels": {
            1: {"min_word_len": 3, "max_word_len": 3},
            2: {"min_word_len": 4, "max_word_len": 4},
            3: {"min_word_len": 5, "max_word_len": 5},
        }
    },
    "letter_counting": {
        "levels": {
            1: {"min_words": 1, "max_words": 1},
            2: {"min_words": 2, "max_words": 2},
            3: {"min_words": 3, "max_words": 4},
        }
    },
}
"""The reasoning-gym datasets S2 learns, each at three levels of small settings (``ebpo.tasks.gym``): problems a
few hundred thousand parameters partly learn, with short questions and answers."""
TASK = "gym:" + ",".join(MIXTURE)
"""The gym task of the mixture: ``get_task(TASK, **MIXTURE)``."""
DATASETS: tuple[str, ...] = tuple(MIXTURE)
LEVELS: tuple[int, ...] = (1, 2, 3)
ANSWER_TOKENS: tuple[str, str] = ("<answer>", "</answer>")


def response_text(answer: str) -> str:
    """What the model is taught to write: the answer in reasoning-gym's tags (then EOS)."""
    return f"{ANSWER_TOKENS[0]}{answer}{ANSWER_TOKENS[1]}"


def gold_answer(record: Record) -> str:
    """The gold answer of a gym record (its ``answer`` holds the reasoning-gym entry as JSON)."""
    return str(json.loads(record.answer)["answer"])


@dataclass(frozen=True)
class GymBaseModelConfig:
    """Everything that determines S2 (its hash, :meth:`key`, names the cache directory); each field is a flag of
    ``ebpo base-model --recipe gym``."""

    _argument_group_name = "recipe (GymBaseModelConfig, --recipe gym; defaults = the shipped S2)"

    seed: int = field(
        default=0, metadata={"help": "seed of the initial weights, the SFT data, its order and labels"}
    )
    vocab_size: int = field(
        default=1000,
        metadata={
            "help": "BPE vocabulary (3 special tokens and 256 bytes included; the 2 answer tags come on top)"
        },
    )
    tokenizer_problems: int = field(
        default=20_000,
        metadata={"help": "SFT problems whose templated prompts and responses train the tokenizer"},
    )
    hidden_size: int = field(default=80, metadata={"help": "model width (Qwen3 hidden size)"})
    num_layers: int = field(default=2, metadata={"help": "number of transformer layers"})
    num_heads: int = field(
        default=4, metadata={"help": "attention heads (head_dim = hidden_size / num_heads)"}
    )
    num_kv_heads: int = field(default=2, metadata={"help": "key/value heads (grouped-query attention)"})
    steps: int = field(default=12000, metadata={"help": "SFT optimiser steps"})
    clean_steps: int = field(
        default=8500,
        metadata={
            "help": "the first SFT steps train on right answers only; the noisy teacher labels the rest"
        },
    )
    batch_size: int = field(default=64, metadata={"help": "SFT sequences per step"})
    lr: float = field(
        default=3e-3, metadata={"help": "peak AdamW learning rate (linear warm-up, cosine decay to 10%)"}
    )
    warmup_steps: int = field(default=100, metadata={"help": "linear learning-rate warm-up steps"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient-norm clipping threshold"})
    train_problems: int = field(
        default=40_000,
        metadata={"help": "size of the SFT pool from the mixture's sft split (balanced over its 24 cells)"},
    )
    teacher_accuracy: tuple[float, ...] = field(
        default=(0.6,) * 8,
        metadata={
            "metavar": "V1,V2,...",
            "help": "the teacher's probability of a right label at level 1, per dataset in MIXTURE order ("
            + ", ".join(MIXTURE)
            + ")",
        },
    )
    teacher_level_factor: tuple[float, ...] = field(
        default=(1.0, 0.8, 0.6),
        metadata={
            "metavar": "V1,V2,V3",
            "help": "multiplies the dataset's accuracy at levels 1..3 (clipped to [0, 1])",
        },
    )
    run_on_chars: tuple[int, ...] = field(
        default=(1, 2),
        metadata={
            "metavar": "V1,V2,...",
            "help": "a wrong label is the answer run on by this many characters of its kind (1,2: 42 -> 427, 4271)",
        },
    )
    eval_per_cell: int = field(
        default=30, metadata={"help": "problems per (dataset, level) cell for the grid"}
    )
    eval_samples: int = field(default=8, metadata={"help": "samples per problem of the grid (pass@1, maj@n)"})
    eval_temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the grid"})
    max_new_tokens: int = field(default=16, metadata={"help": "longest response sampled for the grid"})

    def __post_init__(self) -> None:
        positive = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "batch_size", "train_problems")
        check_recipe_fields(self, (*positive, "tokenizer_problems", "eval_samples", "max_new_tokens"))
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads}), and "
                f"num_heads by num_kv_heads ({self.num_kv_heads})"
            )
        if self.vocab_size < 259:
            raise ValueError(
                f"vocab_size must be >= 259 (3 special tokens + 256 bytes), got {self.vocab_size}"
            )
        if len(self.teacher_accuracy) != len(MIXTURE) or not all(0 <= p <= 1 for p in self.teacher_accuracy):
            raise ValueError(
                f"teacher_accuracy needs {len(MIXTURE)} probabilities in [0, 1] ({', '.join(MIXTURE)}), got "
                f"{self.teacher_accuracy}"
            )
        if len(self.teacher_level_factor) != len(LEVELS) or min(self.teacher_level_factor) < 0:
            raise ValueError(
                f"teacher_level_factor needs 3 non-negative factors, got {self.teacher_level_factor}"
            )
        if not self.run_on_chars or any(n < 1 for n in self.run_on_chars):
            raise ValueError(f"run_on_chars needs character counts >= 1, got {self.run_on_chars}")
        if self.lr <= 0 or self.eval_temperature <= 0:
            raise ValueError("lr and eval_temperature must be > 0")

    def key(self) -> str:
        """12 hex digits of SHA-256 over the config, :data:`FORMAT_VERSION` and :func:`data_fingerprint`."""
        payload = json.dumps(
            {"format": FORMAT_VERSION, "data": data_fingerprint(self), **asdict(self)}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def mixture_task() -> Any:
    """The gym task of :data:`MIXTURE` (``ebpo.tasks.gym``; needs the ``ebpo[gym]`` extra)."""
    from ebpo.tasks import get_task

    return get_task(TASK, **MIXTURE)


def data_fingerprint(config: GymBaseModelConfig, per_split: int = 48) -> str:
    """SHA-256 of what the generators and the teacher produce on a fixed sample: ``per_split`` records of every
    split (prompt, answer, topic, level) and the teacher's labels for the first ``per_split`` SFT problems. A
    reasoning-gym release whose generators write other problems changes the recipe's key."""
    from ebpo.tasks.splits import SPLITS

    task = mixture_task()
    rows: list[Any] = []
    for split in SPLITS:
        rows += [(r.prompt, r.answer, r.topic, r.level) for r in task.generate(split, per_split, seed=0)]
    rng = random.Random(f"base-model-teacher/{config.seed}")
    rows += [
        teacher_label(r, config, rng) for r in task.generate("sft", per_split, seed=config.seed * 100 + 1)
    ]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


# --- the teacher ------------------------------------------------------------------------------------------


def teacher_accuracy(config: GymBaseModelConfig, dataset: str, level: int) -> float:
    """Probability that the teacher's label is right: ``teacher_accuracy[dataset] x teacher_level_factor[level]``."""
    value = config.teacher_accuracy[DATASETS.index(dataset)] * config.teacher_level_factor[level - 1]
    return min(1.0, max(0.0, value))


def run_on_alphabet(answer: str) -> str:
    """The characters a run-on adds: digits after a number, lowercase letters after anything else."""
    return "0123456789" if re.fullmatch(r"-?\d+", answer) else "abcdefghijklmnopqrstuvwxyz"


def wrong_labels(answer: str, config: GymBaseModelConfig) -> list[str]:
    """Every run-on the teacher may write for ``answer``: the answer followed by each string of
    ``run_on_chars`` characters of :func:`run_on_alphabet` (``42`` -> ``420`` ... ``4299``: 110), each equally
    likely; none reads as the answer itself."""
    alphabet = run_on_alphabet(answer)
    labels: list[str] = []
    for count in sorted(set(config.run_on_chars)):
        tails = [""]
        for _ in range(count):
            tails = [tail + char for tail in tails for char in alphabet]
        labels += [answer + tail for tail in tails]
    if alphabet[0] == "0":  # a number: "0" run on by "5" is "05", which reads 5, not 0
        labels = [label for label in labels if int(label) != int(answer)]
    return labels


def teacher_label(record: Record, config: GymBaseModelConfig, rng: random.Random) -> str:
    """One draw of the teacher's label for a gym ``record``: its answer with probability :func:`teacher_accuracy`,
    else one of :func:`wrong_labels`, drawn uniformly."""
    answer = gold_answer(record)
    assert record.topic is not None and record.level is not None  # the mixture's records carry both
    if rng.random() < teacher_accuracy(config, record.topic, record.level):
        return answer
    return rng.choice(wrong_labels(answer, config))


# --- the build --------------------------------------------------------------------------------------------


def sft_records(config: GymBaseModelConfig) -> list[Record]:
    """The SFT pool: ``train_problems`` problems of the mixture's ``sft`` split, balanced over its cells."""
    return list(_sft_pool(config.train_problems, config.seed))


@functools.lru_cache(maxsize=2)
def _sft_pool(size: int, seed: int) -> tuple[Record, ...]:
    """Generated once per (size, seed) in a process: a build makes the pool for its tokenizer and its SFT."""
    return tuple(mixture_task().generate("sft", size, seed=seed * 100 + 1))


def build_tokenizer(config: GymBaseModelConfig, records: list[Record]):
    """Byte-level BPE (``ebpo.models.chat_tokenizer``) trained on the templated prompts and the responses of the
    first ``tokenizer_problems`` SFT records, then :data:`ANSWER_TOKENS` added."""
    from transformers import Qwen2Tokenizer

    from ebpo.data.prompts import PromptFormat
    from ebpo.models.chat_tokenizer import CHATML_TEMPLATE, train_bpe_tokenizer

    renderer = Qwen2Tokenizer()  # an empty one: only its template renders the prompts the BPE learns from
    renderer.chat_template = CHATML_TEMPLATE
    sample = records[: config.tokenizer_problems]
    texts = PromptFormat(renderer, chat=True).texts(sample) + [response_text(gold_answer(r)) for r in sample]
    tokenizer = train_bpe_tokenizer(texts, config.vocab_size)
    tokenizer.add_tokens(list(ANSWER_TOKENS))
    return tokenizer


def new_model(config: GymBaseModelConfig):
    """The tokenizer (trained, deterministic) and the randomly initialised (seeded) Qwen3 model."""
    from ebpo.models.chat_tokenizer import new_qwen3_model

    tokenizer = build_tokenizer(config, sft_records(config))
    model = new_qwen3_model(
        tokenizer,
        seed=config.seed,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        max_positions=256,
    )
    return model, tokenizer


def train(
    model, tokenizer, config: GymBaseModelConfig, *, progress: bool = True, stop_after: int | None = None
):
    """SFT (``ebpo.models.sft.run_sft``) on :func:`sft_records` with the teacher's labels; the loss per step.
    Prompts through the chat template (``ebpo.data.prompts.PromptFormat``), loss on the response and EOS."""
    from ebpo.data.prompts import PromptFormat
    from ebpo.models.sft import run_sft

    records = sft_records(config)
    prompt_ids = PromptFormat(tokenizer, chat=True).ids(records)
    eos = tokenizer.eos_token_id
    teacher_rng = random.Random(f"base-model-teacher/{config.seed}")

    def examples(step: int, batch: list[int]) -> list[tuple[list[int], list[int]]]:
        noisy = step >= config.clean_steps
        out = []
        for i in batch:
            label = teacher_label(records[i], config, teacher_rng) if noisy else gold_answer(records[i])
            label_ids = list(tokenizer(response_text(label), add_special_tokens=False)["input_ids"]) + [eos]
            out.append((prompt_ids[i] + label_ids, [-100] * len(prompt_ids[i]) + label_ids))
        return out

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


# --- the grid ---------------------------------------------------------------------------------------------

ANSWER_KINDS: tuple[str, ...] = ("right", "run-on", "other", "no answer")


def answer_kind(extracted: str | None, answer: str) -> str:
    """What a sampled answer is: ``right``, ``run-on`` (the answer followed by more characters: what the
    teacher's wrong labels look like), ``other``, or ``no answer`` (no ``<answer>`` tags)."""
    if extracted is None:
        return "no answer"
    if extracted == answer:
        return "right"
    return "run-on" if extracted.startswith(answer) else "other"


def evaluate_grid(
    model,
    tokenizer,
    *,
    split: str = "validation",
    per_cell: int = 30,
    samples: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 16,
    progress: bool = False,
) -> dict:
    """The (dataset, level) grid of ``model`` on ``per_cell`` problems of each cell of ``split``
    (``ebpo.models.grid.cell_grid``: pass@1, maj@n, greedy, answer kinds), scored by the datasets' own
    ``score_answer`` (``ebpo.tasks.gym.verify``), prompts through the chat template."""
    from ebpo.data.prompts import PromptFormat
    from ebpo.models.grid import cell_grid
    from ebpo.tasks import gym

    records = mixture_task().generate(split, per_cell * len(DATASETS) * len(LEVELS), seed=seed)
    golds = {r.answer: gold_answer(r) for r in records}

    def kinds(problems: list[tuple[list[str | None], str]]) -> dict[str, float]:
        found = [answer_kind(a, golds[gold]) for answers, gold in problems for a in answers]
        return {kind: found.count(kind) / len(found) for kind in ANSWER_KINDS} if found else {}

    return cell_grid(
        model,
        tokenizer,
        records,
        prompts=PromptFormat(tokenizer, chat=True).ids(records),
        verify=gym.verify,
        extract=gym.extract_answer,
        kinds=kinds,
        samples=samples,
        temperature=temperature,
        seed=seed,
        max_new_tokens=max_new_tokens,
        progress=progress,
    )


RECIPES.register(
    "gym",
    Recipe(
        name="gym",
        config_cls=GymBaseModelConfig,
        shipped_dir=SHIPPED_DIR,
        new_model=new_model,
        train=train,
        grid=grid_of(evaluate_grid),
        format_version=FORMAT_VERSION,
        what="gym base model S2",
        task=TASK,
        task_options=MIXTURE,
    ),
)
