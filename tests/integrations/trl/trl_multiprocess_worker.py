"""One EBPOTrainer run for tests/integrations/trl/test_trl_multiprocess.py, launched once per process by
``torchrun --nproc_per_node N`` (or called in-process for a 1-process run).

Each process writes ``<out>/states-rank<R>.pt``: the estimator state after every training generation block
(with the global step it was taken at and the block's prompts) and at the end.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import torch

G = 4  # num_generations
TOPICS = ("alg", "geo")
NUM_PROMPTS = 12


def make_dataset():
    import datasets

    return datasets.Dataset.from_dict(
        {
            "prompt": [f"{i}+{i % 5}=" for i in range(NUM_PROMPTS)],
            "topic": [TOPICS[i % 2] for i in range(NUM_PROMPTS)],
        }
    )


def position_reward(prompts, completions, **kwargs):
    """A reward that depends only on the prompt and the completion's position in its group, never on the
    sampled text, so runs with any number of processes score the same rows alike.

    Row i of this process is row ``process_index * len(prompts) + i`` of the gathered batch (TRL's layout),
    and its position in the group is that row mod G. Values lie in {0, 0.25, ..., 1}; groups are not constant.
    """
    from accelerate import PartialState

    first = PartialState().process_index * len(prompts)
    return [
        ((7 * sum(map(ord, prompt)) + 3 * ((first + i) % G) ** 2) % 5) / 4 for i, prompt in enumerate(prompts)
    ]


def make_config(out_dir: str | Path, *, processes: int, **overrides: Any):
    """EBPO with every structure that spreads a generation block over processes and steps. With 2 processes:
    1 completion per process and micro-step, 6 micro-steps per block (``steps_per_generation``), so each
    process holds 6 rows of a block of 3 prompts x G = 12 and the middle group straddles the two processes;
    2 gradient-accumulation micro-steps per optimizer step and 2 passes over each block (``num_iterations``),
    so a block serves 6 optimizer steps. The 1-process run takes 2 completions per micro-step: the same
    block of 12 completions, the same optimizer steps."""
    from ebpo.integrations.trl import EBPOConfig

    params: dict[str, Any] = dict(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=2 // processes,
        gradient_accumulation_steps=2,
        steps_per_generation=6,
        num_iterations=2,
        num_generations=G,
        max_completion_length=4,
        max_steps=18,
        learning_rate=1e-2,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
        prompt_sampler="topic",
        prior_scope="cluster",
        cluster_min_groups=1,
    )
    params.update(overrides)
    return EBPOConfig(**params)


def run(model_dir: str, out_dir: str | Path, *, processes: int, resume: str | None = None, **overrides: Any):
    """Train, recording the estimator state after each generation block; returns the trainer."""
    from ebpo.integrations.trl import EBPOTrainer

    class RecordingTrainer(EBPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.blocks: list[dict[str, Any]] = []

        def _load_optimizer_and_scheduler(self, checkpoint):
            # Upstream, not EBPO: with several processes transformers' Trainer._load_optimizer_and_scheduler
            # loads optimizer.pt with map_location=args.device (to land on each process's GPU), and for a
            # multi-process CPU run accelerate's PartialState.set_device makes that device torch.device("cpu", 0),
            # whose tag torch.load cannot restore ("don't know how to restore data location of
            # torch.storage.UntypedStorage (tagged with cpu:0)"). Map such a CPU device to plain "cpu".
            if self.args.device.type != "cpu" or self.args.world_size == 1:
                return super()._load_optimizer_and_scheduler(checkpoint)
            real_load = torch.load

            def load(*args, map_location=None, **kwargs):
                if isinstance(map_location, torch.device) and map_location.type == "cpu":
                    map_location = "cpu"
                return real_load(*args, map_location=map_location, **kwargs)

            with mock.patch.object(torch, "load", load):
                return super()._load_optimizer_and_scheduler(checkpoint)

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if self.model.training:
                self.blocks.append(
                    {
                        "global_step": self.state.global_step,
                        "prompts": sorted({row["prompt"] for row in inputs}),
                        "state": copy.deepcopy(self.estimator.state_dict()),
                    }
                )
            return output

    trainer = RecordingTrainer(
        model=model_dir,
        reward_funcs=position_reward,
        args=make_config(out_dir, processes=processes, **overrides),
        train_dataset=make_dataset(),
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--record", required=True, help="directory for states-rank<R>.pt")
    parser.add_argument("--max_steps", type=int, default=18)
    parser.add_argument("--save_steps", type=int, default=0, help="0: no checkpoints")
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    overrides: dict[str, Any] = {"max_steps": args.max_steps}
    if args.save_steps:
        overrides.update(save_strategy="steps", save_steps=args.save_steps)
    # torchrun's variables: accelerate's PartialState() reads 1 process on CPU until TrainingArguments has
    # set it up with use_cpu
    processes, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    trainer = run(args.model, args.out, processes=processes, resume=args.resume, **overrides)
    record = Path(args.record)
    record.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"blocks": trainer.blocks, "final": trainer.estimator.state_dict()}, record / f"states-rank{rank}.pt"
    )
    # Leave without the interpreter's teardown. torch's gloo process group cannot be torn down reliably on
    # the way out: left open it can abort the process ("terminate called without an active exception") when
    # the other rank has already exited, and destroyed (accelerate's end_training) it can deadlock, its
    # worker thread waiting for the GIL that the thread freeing DDP's reducer holds. Everything this run
    # writes is on disk and closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
