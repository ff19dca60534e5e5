"""EBPO with TRL: ``EBPOTrainer`` on the built-in ``arith`` task or any records file.

    # a laptop run: the tiny local model on generated arithmetic (minutes on CPU)
    python examples/trl/train_ebpo.py --output_dir runs/trl-ebpo --use_cpu --max_steps 20

    # the paper's settings on a real model and annotated data (topic-clustered stream, EBPO-topic)
    accelerate launch examples/trl/train_ebpo.py --model Qwen/Qwen3-8B --records data/dapo17k_annotated.jsonl \
        --reward math --output_dir runs/qwen3-8b-ebpo-topic --learning_rate 1e-6 --beta 0.001 \
        --num_generations 4 --prompt_sampler topic --bf16 --max_completion_length 8192

Every ``EBPOConfig`` / ``GRPOConfig`` field is a flag (``--help`` lists them with their help text); the three
flags below choose the model, the data and the reward.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field


@dataclass
class ScriptArguments:
    model: str | None = field(
        default=None,
        metadata={"help": "Model path or hub id; default: a tiny random local model (CPU smoke runs)."},
    )
    records: str | None = field(
        default=None,
        metadata={
            "help": "Training records (ebpo.data.loaders, schema `records`); default: generated `arith` problems."
        },
    )
    num_problems: int = field(
        default=512, metadata={"help": "Number of generated `arith` problems (no --records)."}
    )
    reward: str = field(
        default="arith", metadata={"help": "Reward from ebpo.rewards: `arith`, `math`, `math_dapo`."}
    )


def load_dataset_rows(script: ScriptArguments, seed: int):
    import datasets

    if script.records:
        from ebpo.data.loaders import load_records

        records = load_records(script.records, "records")
    else:
        from ebpo.tasks.arith import generate

        records = generate("train", script.num_problems, seed)
    return datasets.Dataset.from_dict(
        {
            "prompt": [r.prompt for r in records],
            "answer": [str(r.answer) for r in records],
            "topic": [r.topic or "" for r in records],
            "difficulty": [
                float(r.difficulty) if r.difficulty is not None else float("nan") for r in records
            ],
        }
    )


def make_reward(name: str):
    from ebpo.rewards import get_reward

    scorer = get_reward(name)

    def verifiable_reward(completions, answer, **kwargs):
        return scorer.batch(completions, answer)

    verifiable_reward.__name__ = name
    return verifiable_reward


def main(argv: list[str] | None = None) -> int:
    from transformers import HfArgumentParser

    from ebpo.integrations.trl import EBPOConfig, EBPOTrainer

    script, config = HfArgumentParser((ScriptArguments, EBPOConfig)).parse_args_into_dataclasses(argv)
    model = script.model
    if model is None:
        from ebpo.models.tiny import build_tiny_model

        model = str(build_tiny_model(tempfile.mkdtemp(prefix="ebpo-tiny-"), seed=config.seed))
    trainer = EBPOTrainer(
        model=model,
        reward_funcs=make_reward(script.reward),
        args=config,
        train_dataset=load_dataset_rows(script, config.seed),
    )
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    trainer.save_model(config.output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
