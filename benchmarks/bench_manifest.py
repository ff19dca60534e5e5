"""What a checkpoint's manifest costs: writing it (sizes and SHA-256 of every file) against writing the
checkpoint itself, and checking it against loading the checkpoint for a resume.

    .venv/bin/python benchmarks/bench_manifest.py                   # the shipped arith base model
    .venv/bin/python benchmarks/bench_manifest.py --model DIR --rounds 5

Each round saves a checkpoint of the model with an AdamW state (as ``ebpo train`` does, through
``ebpo.trainer.checkpoint.save_checkpoint`` with the manifest step switched off), then writes its manifest,
then loads the checkpoint (model and trainer state), then checks the manifest; the table gives each part's
median over the rounds and the manifest's parts as a fraction of their peer's, both from the same run. It also
gives SHA-256's throughput on this machine (hashlib, a 256 MB buffer), which scales the cost to a larger
model: a checkpoint of N bytes takes about N / throughput to hash, once to write the manifest and once to
check it.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ebpo.models.recipes.arith import SHIPPED_DIR
from ebpo.persist import verify_manifest, write_manifest
from ebpo.tables import markdown_table
from ebpo.trainer import checkpoint as ckpt


def sha256_throughput(megabytes: int = 256) -> float:
    """Bytes per second of hashlib's SHA-256 over one buffer in memory."""
    data = bytes(megabytes << 20)
    start = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    return len(data) / (time.perf_counter() - start)


def one_round(model, tokenizer, state, work: Path) -> dict[str, float]:
    seconds = {}
    start = time.perf_counter()
    with_manifest = ckpt.write_manifest
    ckpt.write_manifest = lambda *args, **kwargs: None  # the checkpoint alone
    try:
        path = ckpt.save_checkpoint(work, "last", model, tokenizer, state)
    finally:
        ckpt.write_manifest = with_manifest
    seconds["save checkpoint"] = time.perf_counter() - start
    start = time.perf_counter()
    write_manifest(path, step=0)
    seconds["write manifest"] = time.perf_counter() - start
    start = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(path / "model")
    ckpt.load_trainer_state(path)
    seconds["load checkpoint"] = time.perf_counter() - start
    start = time.perf_counter()
    verify_manifest(path)
    seconds["check manifest"] = time.perf_counter() - start
    return seconds


PARTS = (
    ("save checkpoint", None),
    ("write manifest", "save checkpoint"),
    ("load checkpoint", None),
    ("check manifest", "load checkpoint"),
)
"""Each part of a round, and the peer a manifest part is a fraction of."""


def table(median: dict[str, float]) -> str:
    """The markdown table: each part's median seconds, and a manifest part's as a fraction of its peer's."""
    rows = []
    for name, peer in PARTS:
        ratio = f"{median[name] / median[peer]:.3f}" if peer else ""
        rows.append([name, f"{median[name]:.4f}", ratio])
    return markdown_table(["part", "seconds", "manifest / peer"], rows, align=["", "right", "right"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=str(SHIPPED_DIR), help="model directory (default: the shipped one)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the table gives medians")
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    optimizer = torch.optim.AdamW(model.parameters())
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()  # a full AdamW state, as a checkpoint after a step holds
    state = {key: None for key in ckpt.STATE_KEYS} | {"step": 0, "optimizer": optimizer.state_dict()}
    rounds = []
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            rounds.append(one_round(model, tokenizer, state, Path(work)))
        size = sum(p.stat().st_size for p in (Path(work) / "checkpoints" / "last").rglob("*") if p.is_file())
    median = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    print(f"checkpoint of {args.model}: {size / 1e6:.2f} MB; medians over {args.rounds} rounds")
    print(table(median))
    print(f"SHA-256 (hashlib): {sha256_throughput() / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
