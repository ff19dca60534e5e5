"""EBPO through verl's own Ray trainer (its default v1 trainer) on a laptop CPU, in a few minutes (no GPU, no
download).

    python examples/verl/cpu_quickstart.py --out runs/verl-cpu            # prepare + train 16 steps
    python examples/verl/cpu_quickstart.py --out runs/verl-cpu --dry-run  # print the verl command only
    VERBOSE=1 python examples/verl/cpu_quickstart.py ...                  # verl's whole output on the console

Run it in the ``ebpo[verl]`` environment (``make verl-env``; ``.venv-verl/bin/python``). It builds a tiny
``arith`` model fine-tuned for a few seconds on ``max`` problems (it answers about a third of them right, so RL
has something to improve), writes 16 training prompts in verl's parquet format, and runs

    python -m ebpo.integrations.verl trainer.device=cpu algorithm.adv_estimator=ebpo ...

(:func:`verl_overrides` lists every override), on verl's v1 trainer in ``trainer.v1.trainer_mode=sync``
(add ``trainer.use_v1=false`` for verl's legacy trainer). The console shows one line per training step (mean
reward, EBPO's prior mean and shrinkage, seconds) and ebpo's own messages; verl's whole output goes to
``<out>/train.log`` (``--verbose`` or ``VERBOSE=1``: to the console as well, every framework message included).
At the end it prints the mean training reward of the first and the last step and the checkpoint directory.
Two runs of the same command train alike: the same rewards at every step, the same final weights. The same command trains on a cluster without
``trainer.device=cpu`` and with a real model and data (``examples/verl/run_paper.sh``).
``tests/integrations/verl/test_verl_e2e.py`` runs it (v1 and the legacy trainer), with resumes.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
from pathlib import Path

PROMPTS, N = 16, 16  # prompts per step (the whole training set: the same prompts every step), responses each
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # the bare prompt, as SFT saw it


def sft_arith_model(out_dir: Path, *, steps: int = 40, seed: int = 0) -> Path:
    """A tiny Llama fine-tuned for ``steps`` AdamW steps (batch 32, lr 3e-3) on ``max`` level-1 problems of the
    ``sft`` split (RL draws from ``train``): about 1 s of CPU; it then answers about a third of them right at
    temperature 1."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from ebpo.models.sft import encode_sft_example
    from ebpo.models.tiny import build_char_tokenizer, tiny_config
    from ebpo.tasks import arith

    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(len(tokenizer), max_positions=64))
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, name, getattr(tokenizer, name))
    examples = [
        encode_sft_example(tokenizer, r.prompt, r.answer)
        for r in arith.generate("sft", 2000, seed=seed + 1, topics=["max"], levels=[1])
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    for _ in range(steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(32)]
        width = max(len(ids) for ids, _ in batch)
        ids_BT = torch.zeros(len(batch), width, dtype=torch.long)
        labels_BT = torch.full_like(ids_BT, -100)
        for row, (ids, labels) in enumerate(batch):
            ids_BT[row, : len(ids)] = torch.tensor(ids)
            labels_BT[row, : len(labels)] = torch.tensor(labels)
        loss = model(input_ids=ids_BT, attention_mask=(ids_BT != 0).long(), labels=labels_BT).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hf_logging.disable_progress_bar()  # one tiny shard: no bar on the console
    model.save_pretrained(out_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return out_dir


def prepare(root: Path) -> Path:
    """The model (``root/model``) and verl parquet data (``root/train.parquet``, ``root/val.parquet``)."""
    from ebpo.integrations.verl.data import write_verl_parquet
    from ebpo.tasks import arith

    root.mkdir(parents=True, exist_ok=True)
    sft_arith_model(root / "model")
    train = arith.generate("train", PROMPTS, seed=0, topics=["max"], levels=[1])
    write_verl_parquet(train, root / "train.parquet", data_source="arith", instruction="")
    val = arith.generate("validation", 8, seed=0, topics=["max"], levels=[1])
    write_verl_parquet(val, root / "val.parquet", data_source="arith", instruction="")
    return root


def verl_overrides(
    root: Path,
    *,
    steps: int = 16,
    save_freq: int = 4,
    experiment: str = "quickstart",
    rollouts: str = "rollouts",
) -> list[str]:
    """verl Hydra overrides of the quickstart run (``root`` as made by :func:`prepare`); each step's scored
    rollouts are dumped to ``root/<rollouts>/<step>.jsonl`` and checkpoints go to ``root/ckpt``."""
    return [
        "trainer.device=cpu",  # ebpo's opt-in CPU mode: gloo, FSDP2 on cpu, the ebpo_cpu rollout
        "algorithm.adv_estimator=ebpo",
        f"data.train_files={root / 'train.parquet'}",
        f"data.val_files={root / 'val.parquet'}",
        f"data.train_batch_size={PROMPTS}",
        "data.max_prompt_length=16",
        "data.max_response_length=4",
        "data.shuffle=False",
        "data.seed=0",
        "+data.sampler.class_path=pkg://ebpo.integrations.verl",
        "+data.sampler.class_name=TopicSampler",
        f"actor_rollout_ref.model.path={root / 'model'}",
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.rollout.seed=0",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # 4 updates per step
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128",
        "actor_rollout_ref.actor.optim.lr=5e-4",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "reward.custom_reward_function.path=pkg://ebpo.integrations.verl.rewards",
        "reward.custom_reward_function.name=compute_score",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=100",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.balance_batch=False",
        f"trainer.save_freq={save_freq}",
        f"trainer.default_local_dir={root / 'ckpt'}",
        f"trainer.rollout_data_dir={root / rollouts}",
        "trainer.project_name=ebpo-verl-cpu",
        f"trainer.experiment_name={experiment}",
    ]


def step_rewards(folder: Path) -> dict[int, list[float]]:
    """Rewards of every sample verl dumped (``trainer.rollout_data_dir``): {step: [score, ...]}."""
    import json

    out = {}
    for path in folder.glob("*.jsonl"):
        lines = path.read_text().splitlines()
        out[int(path.stem)] = [float(json.loads(line)["score"]) for line in lines if line.strip()]
    return out


def summary(root: Path) -> str:
    """Mean training reward at the first and last steps, and the latest checkpoint (what ``main`` prints)."""
    rewards = step_rewards(root / "rollouts")
    ckpt = root / "ckpt"
    latest = ckpt / "latest_checkpointed_iteration.txt"
    lines = []
    if rewards:
        first, last = min(rewards), max(rewards)
        for step in (first, last):
            values = rewards[step]
            lines.append(
                f"training reward at step {step}: {sum(values) / len(values):.3f} (mean of {len(values)} samples)"
            )
    if latest.is_file():
        lines.append(f"checkpoint: {ckpt / ('global_step_' + latest.read_text().strip())}")
    return "\n".join(lines) or f"no rollouts or checkpoint under {root}"


STEP_LINE = re.compile(r"step:(\d+) - (.*)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def progress_line(line: str, steps: int) -> str | None:
    """The console line for one line of verl's output, or None to keep it for the log only: verl's per-step
    metrics line (``step:N - key:value - ...``) becomes ``step N/steps: ...``; ebpo's own lines
    (``[ebpo] ...``, ``ebpo.integrations.verl: ...``) and Python's error lines are shown as they are."""
    text = ANSI.sub("", line).rstrip()
    text = re.sub(r"^\((?:[^)]*pid=\d+[^)]*)\) ", "", text)  # Ray's "(Actor pid=N) " prefix
    match = STEP_LINE.match(text)
    if match:
        values = {}
        for item in match.group(2).split(" - "):
            key, _, value = item.partition(":")
            values[key] = value
        shown = [
            f"reward {float(values.get('critic/score/mean', 'nan')):.3f}",
            f"prior mean {float(values.get('ebpo/mu_glob', 'nan')):.3f}",
            f"shrinkage {float(values.get('ebpo/shrinkage', 'nan')):.3f}",
            f"{float(values.get('timing_s/step', 'nan')):.1f} s",
        ]
        return f"step {match.group(1)}/{steps}: " + ", ".join(shown)
    if (
        "[ebpo]" in text
        or text.startswith("ebpo.integrations.verl")
        or re.match(r"\w*(Error|Exception):", text)
    ):
        return text
    return None


def train(command: list[str], root: Path, steps: int, verbose: bool) -> int:
    """Run the verl command in ``root``; its whole output goes to ``root/train.log``, the console gets
    :func:`progress_line` of it (everything with ``verbose``). On failure, the end of the log."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
    log_path = root / "train.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            shown = line.rstrip("\n") if verbose else progress_line(line, steps)
            if shown is not None:
                print(shown, flush=True)
        code = process.wait()
    if code != 0 and not verbose:
        tail = log_path.read_text().splitlines()[-30:]
        print(f"verl exited with status {code}; the end of {log_path}:", *tail, sep="\n")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/verl-cpu"), help="working directory")
    parser.add_argument("--steps", type=int, default=16, help="training steps (default 16)")
    parser.add_argument("--dry-run", action="store_true", help="print the verl command and stop")
    parser.add_argument(
        "--verbose", action="store_true", help="verl's whole output on the console (also: VERBOSE=1)"
    )
    parser.add_argument("overrides", nargs="*", help="extra verl Hydra overrides (key=value)")
    args = parser.parse_args(argv)
    verbose = args.verbose or os.environ.get("VERBOSE", "").strip().lower() in ("1", "true", "yes")
    root = args.out.resolve()
    command = [sys.executable, "-m", "ebpo.integrations.verl", *verl_overrides(root, steps=args.steps)]
    command += args.overrides
    if args.dry_run or verbose:
        print(" \\\n    ".join([" ".join(command[:3]), *command[3:]]))
        if args.dry_run:
            return 0
    print(f"preparing {root}: a tiny arith model fine-tuned for a second, {PROMPTS} prompts in verl's format")
    prepare(root)
    print(
        f"training {args.steps} steps: python -m ebpo.integrations.verl trainer.device=cpu "
        f"algorithm.adv_estimator=ebpo ... (--dry-run prints the whole command; verl's output: {root / 'train.log'})",
        flush=True,
    )
    if verbose:
        os.environ["VERBOSE"] = "1"
    code = train(command, root, args.steps, verbose)
    print(summary(root))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
