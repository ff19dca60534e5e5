"""EBPO with TRL: ``EBPOTrainer`` on the built-in ``arith`` task or any records file.

    # a laptop run: the shipped arith base model on generated arithmetic, `ebpo train`'s demo through TRL
    # (32 prompts x G = 8 per generation block, 4 prompts per update, lr 1e-4, KL 0.001, 150 blocks), with
    # validation pass@1 before and after training, measured as `ebpo train` measures it
    python examples/trl/train_ebpo.py --output_dir runs/trl-ebpo --use_cpu

    # the same on S2, the built-in Qwen3 chat model, on its reasoning-gym mixture (`ebpo train --config gym`):
    # conversational prompts, the gym reward (each dataset's own score_answer)
    python examples/trl/train_ebpo.py --model builtin:gym --output_dir runs/trl-ebpo-gym --use_cpu

    # the paper's settings on 8 GPUs (one node): Qwen3-8B on annotated DAPO-Math-17k, EBPO-topic
    accelerate launch --num_processes 8 examples/trl/train_ebpo.py --model Qwen/Qwen3-8B \
        --records data/dapo17k_annotated.jsonl --reward math_dapo --output_dir runs/qwen3-8b-ebpo-topic \
        --prompt_sampler topic --loss_type grpo --learning_rate 1e-6 --beta 0.001 --num_generations 4 \
        --per_device_train_batch_size 4 --gradient_accumulation_steps 16 --steps_per_generation 64 \
        --num_iterations 1 --lr_scheduler_type constant --weight_decay 0.01 --max_grad_norm 1.0 \
        --max_completion_length 8192 --max_steps 4000 --save_steps 200 --bf16 true

The paper's settings, flag by flag (docs/integrations.md): GRPO's loss (``--loss_type grpo``: token mean per
sequence, then mean over sequences; TRL's default ``dapo`` is token-level), clip 0.2 (TRL's default
``epsilon``), KL 0.001 (TRL's KL is k3), lr 1e-6, G = 4; 512 prompts x G = 2048 completions per generation
(``per_device_train_batch_size * processes * steps_per_generation`` = 4 x 8 x 64) and 128 prompts x G = 512
per optimizer update (``per_device_train_batch_size * processes * gradient_accumulation_steps`` = 4 x 8 x 16),
so each generation serves 4 updates; one pass over it (``--num_iterations 1``). Constant lr, weight decay 0.01
and gradient clipping 1.0 are verl's defaults in our verl recipe (examples/verl/run_paper.sh). 1000 generation
rounds (the topic and shuffled runs) are 4000 optimizer steps; the curriculum (``--prompt_sampler
difficulty``) trains one epoch: ``--num_train_epochs 1`` instead of ``--max_steps``. With another number of
processes, keep the two products: ``per_device_train_batch_size * processes * gradient_accumulation_steps`` =
512 and ``steps_per_generation = 4 * gradient_accumulation_steps``.

Every ``EBPOConfig`` / ``GRPOConfig`` field is a flag (``--help`` lists them with their help text); the flags of
``ScriptArguments`` below choose the model, the data, the reward and the validation. Without ``--model``, or with a
built-in model (``builtin:arith``, ``builtin:gym``), the laptop settings (``laptop_defaults``: ``LAPTOP_DEFAULTS``
and the data sizes of the ``ebpo train`` preset the model's demo is) are the defaults, each still overridable by
its flag, and the problems come from the task the model was made for.

Prompts: a model whose tokenizer has a chat template (a Qwen instruct model) gets conversational prompts, a
``prompt`` column of chat messages that TRL renders with the template, as ``ebpo train`` and ``ebpo eval``
render them (``ebpo.data.prompts``; ``--chat_template auto|on|off``, auto: when the tokenizer has one); a base
model without one (the shipped arith model) gets the plain prompt text.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAPTOP_DEFAULTS: dict[str, Any] = dict(
    # the ebpo preset (the `ebpo train` demo) in TRL's terms: one generation block = one training step there
    num_generations=8,  # data.group_size
    per_device_train_batch_size=32,  # 4 prompts x G per update (optim.mini_batch_size)
    steps_per_generation=8,  # 32 prompts x G per generation block (data.batch_size), 8 updates each
    gradient_accumulation_steps=1,
    num_iterations=1,  # optim.epochs
    max_steps=1200,  # 150 blocks (run.steps) x 8 updates
    learning_rate=1e-4,
    lr_scheduler_type="constant",
    max_grad_norm=1.0,
    beta=0.001,  # algorithm.kl_coef, k3
    loss_type="dapo",  # token-level, as algorithm.loss_agg_mode=token-mean
    max_completion_length=24,  # rollout.max_new_tokens
    temperature=1.0,
    top_p=1.0,
    bf16=False,
    logging_steps=8,  # one log line per generation block
    save_strategy="no",
    report_to="none",
    seed=0,  # run.seed: the same training and validation problems and validation samples as `ebpo train`
)


LAPTOP_PRESETS: dict[str, str] = {"arith": "ebpo", "gym": "gym"}
"""The ``ebpo train`` preset whose run each built-in model's laptop run is, by recipe: the TRL settings of
``LAPTOP_DEFAULTS`` (which both presets share) and the preset's problem counts and validation."""


def laptop_defaults(recipe: str) -> dict[str, Any]:
    """The laptop settings of the built-in model of ``recipe``: ``LAPTOP_DEFAULTS`` and its preset's sizes."""
    from ebpo.trainer import load_config

    preset = load_config(LAPTOP_PRESETS[recipe])
    sizes = {
        "num_problems": preset.data.train_size,
        "val_size": preset.data.val_size,
        "eval_n": preset.run.eval_n,
    }
    return {**LAPTOP_DEFAULTS, **sizes}


@dataclass
class ScriptArguments:
    model: str | None = field(
        default=None,
        metadata={
            "help": "Model directory (an ebpo train run or checkpoint directory too), hub id, or a built-in model: "
            "builtin:arith (S1, also `builtin`), builtin:gym (S2); default: builtin:arith, with the laptop "
            "settings as defaults."
        },
    )
    records: str | None = field(
        default=None,
        metadata={
            "help": "Training records (ebpo.data.loaders, schema `records`); default: problems generated by --task."
        },
    )
    val_records: str | None = field(
        default=None,
        metadata={
            "help": "Validation records (same format); default: validation problems generated by --task without "
            "--records, none (no validation) with it."
        },
    )
    task: str | None = field(
        default=None,
        metadata={
            "help": "Task (ebpo.tasks) that generates the problems without --records: arith, gym:<dataset>[,...]; "
            "default: the task of the built-in --model (S2's reasoning-gym mixture for builtin:gym), else arith."
        },
    )
    task_options: str | None = field(
        default=None,
        metadata={
            "help": "The task's generator settings as a YAML mapping (as `ebpo train`'s data.task_options); "
            "default: the built-in --model's, else none."
        },
    )
    num_problems: int = field(
        default=2000, metadata={"help": "Number of generated training problems (no --records)."}
    )
    val_size: int = field(
        default=450,
        metadata={"help": "Number of generated validation problems (no --records); 0: no validation."},
    )
    eval_n: int = field(
        default=8,
        metadata={"help": "Samples per validation problem (pass@1 averages them); 0: no validation."},
    )
    reward: str | None = field(
        default=None,
        metadata={
            "help": "Reward from ebpo.rewards: `arith`, `gym`, `math`, `math_dapo`; default: the task's own."
        },
    )
    chat_template: str = field(
        default="auto",
        metadata={
            "help": "Prompts as chat messages rendered with the tokenizer's chat template: auto (when the tokenizer "
            "has one) | on | off (plain text), as `ebpo train`'s data.chat_template."
        },
    )


def the_task(script: ScriptArguments):
    """``--task`` with ``--task-options``, else the task the built-in ``--model`` was made for (``arith`` for a
    model of another kind)."""
    from ebpo.models.names import builtin_recipe
    from ebpo.tasks import get_task, task_options

    recipe = builtin_recipe(script.model) if script.task is None else None
    name = script.task or (recipe.task if recipe is not None else "arith")
    options = task_options(script.task_options, "--task_options")
    if script.task_options is None and recipe is not None:
        options = dict(recipe.task_options)
    return get_task(name, **options)


def load_datasets(script: ScriptArguments, seed: int):
    """(training records, validation records): from files, or generated by :func:`the_task` as ``ebpo train``
    generates them (the same records for the same seed and sizes)."""
    from ebpo.data.loaders import load_records

    if script.records:
        train = load_records(script.records, "records")
        val = load_records(script.val_records, "records") if script.val_records else []
    else:
        task = the_task(script)
        train = task.generate("train", script.num_problems, seed)
        val = (
            load_records(script.val_records, "records")
            if script.val_records
            else task.generate("validation", script.val_size, seed)
        )
    return train, val


def reward_name(script: ScriptArguments) -> str:
    """``--reward``, else the task's own (``gym`` for a gym task)."""
    if script.reward is not None:
        return script.reward
    task = the_task(script)
    return task.reward or task.name


def to_dataset(records, prompt_format):
    """TRL's dataset: ``prompt`` is each record's conversation (chat messages, which TRL renders with the
    template) when ``prompt_format`` is chat, else its text."""
    import datasets

    from ebpo.data.prompts import conversation, prompt_text

    return datasets.Dataset.from_dict(
        {
            "prompt": [conversation(r) if prompt_format.chat else prompt_text(r) for r in records],
            "answer": [str(r.answer) for r in records],
            "topic": [r.topic or "" for r in records],
            "difficulty": [
                float(r.difficulty) if r.difficulty is not None else float("nan") for r in records
            ],
        }
    )


def make_reward(name: str):
    """TRL's reward function for ebpo's reward ``name`` (``ebpo.integrations.trl.reward_function``: conversational
    completions are scored on the assistant's message)."""
    from ebpo.integrations.trl import reward_function

    return reward_function(name)


def validation(trainer, records, script: ScriptArguments, config) -> dict[str, float]:
    """``ebpo train``'s validation (``ebpo.trainer.validation.validate``: pass@1 over ``eval_n`` samples at
    temperature 1, per topic, maj@k) of the trainer's current model."""
    from ebpo.rewards import get_reward
    from ebpo.trainer import load_config
    from ebpo.trainer.validation import validate

    cfg = load_config(
        overrides=[
            f"run.seed={config.seed}",
            f"run.eval_n={script.eval_n}",
            f"run.eval_k={script.eval_n}",
            f"run.eval_temperature={config.temperature}",
            f"rollout.top_p={config.top_p}",
            f"rollout.max_new_tokens={config.max_completion_length}",
            f"data.chat_template={script.chat_template}",
        ]
    )
    model = trainer.accelerator.unwrap_model(trainer.model)
    training = model.training
    model.eval()
    try:
        return validate(model, trainer.processing_class, records, get_reward(reward_name(script)), cfg)
    finally:
        model.train(training)


def model_path(name: str | None) -> str:
    """What ``--model`` names, as every ebpo command reads a model (``ebpo.models.names.resolve_model``): a
    built-in model (none given, ``builtin``, ``builtin:<recipe>``), a model, checkpoint or run directory; a
    name that is no local path goes to TRL as it is (a hub id)."""
    from ebpo.models.names import builtin_recipe, resolve_model

    if name is not None and builtin_recipe(name) is None and not Path(name).expanduser().exists():
        return name
    return str(resolve_model(name).path)


def given_model(arguments: list[str]) -> str | None:
    """The value of ``--model`` in ``arguments`` (the last one given), None without one."""
    model = None
    for i, word in enumerate(arguments):
        if word == "--model" and i + 1 < len(arguments):
            model = arguments[i + 1]
        elif word.startswith("--model="):
            model = word.split("=", 1)[1]
    return model


def parse_arguments(arguments: list[str]):
    """(ScriptArguments, EBPOConfig) from the command line; without ``--model`` or with a built-in one, the
    laptop settings of that model (:func:`laptop_defaults`) are the defaults (a flag still overrides each). An
    unknown built-in model is a ``ValueError``."""
    from transformers import HfArgumentParser

    from ebpo.integrations.trl import EBPOConfig
    from ebpo.models.names import builtin_recipe

    parser = HfArgumentParser((ScriptArguments, EBPOConfig))
    recipe = builtin_recipe(given_model(arguments))
    if recipe is not None:
        parser.set_defaults(**laptop_defaults(recipe.name))
    return parser.parse_args_into_dataclasses(arguments)


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoTokenizer

    from ebpo import console
    from ebpo.data.prompts import PromptFormat
    from ebpo.integrations.trl import EBPOTrainer
    from ebpo.models.names import builtin_recipe

    console.setup()  # ebpo's messages (its warnings on resume) as the ebpo commands show them
    try:
        script, config = parse_arguments(sys.argv[1:] if argv is None else argv)
        model = model_path(script.model)
        train_records, val_records = load_datasets(script, config.seed)
        reward = make_reward(reward_name(script))
    except ValueError as err:  # an unknown built-in model or task, a directory holding no model: one line
        print(f"train_ebpo.py: {err}", file=sys.stderr)
        return 2
    if builtin_recipe(script.model) is not None:
        torch.set_num_threads(1)  # as `ebpo train` (run.threads): a small model gains nothing from more
    try:
        prompt_format = PromptFormat.resolve(
            AutoTokenizer.from_pretrained(model), script.chat_template, option="--chat_template", source=model
        )
    except ValueError as err:  # an unknown setting, or on without a template: one line
        print(f"train_ebpo.py: {err}", file=sys.stderr)
        return 2
    trainer = EBPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=to_dataset(train_records, prompt_format),
    )
    validating = bool(val_records) and script.eval_n > 0
    main_process = trainer.accelerator.is_main_process
    if validating and main_process:
        print(
            f"validation before training: {len(val_records)} problems x {script.eval_n} samples ...",
            flush=True,
        )
        before = validation(trainer, val_records, script, config)
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    trainer.save_model(config.output_dir)
    if validating and main_process:
        from ebpo.trainer.report import print_eval_table

        after = validation(trainer, val_records, script, config)
        print_eval_table(before, after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
