"""Speed of EBPO and our GRPO against verl's GRPO advantage functions on the same batches.

    .venv-verl/bin/python benchmarks/bench_advantages.py         # CPU, 1 thread, the three standard shapes
    .venv-verl/bin/python benchmarks/bench_advantages.py --device cuda

Without verl (``verl.trainer.ppo.core_algos`` does not import) it times our estimators alone.

verl's ``compute_grpo_outcome_advantage`` (a Python loop over samples) and
``compute_grpo_vectorized_outcome_advantage`` take token-level rewards (B, T), a response mask and a
numpy object array of uid strings, and return (B, T) advantages. To compare like with like, each of our
timed calls starts from the same inputs and ends with the same output: it sums the token rewards to
sequence rewards, runs the estimator on the same uid array (so our group-id factorisation is timed too),
and broadcasts the sequence advantage over the tokens times the mask. Our estimator's own cost (sequence
rewards in, sequence advantages out, metrics included) is reported as well. The EBPO estimator is
stateful: one instance is warmed on the first batch and then timed on repeats, as in training.

Medians over repeats, calls interleaved round-robin; every ratio is taken between numbers measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable

import numpy as np
import torch

import ebpo
from ebpo.tables import markdown_table

SHAPES = [(512, 4), (512, 16), (8192, 16)]  # prompts x G


def make_batch(prompts: int, group_size: int, length: int, device: str, seed: int):
    """Token-level binary outcome rewards at each response's last token, a right-padded mask, verl-style
    uid strings repeated G times (contiguous groups, as verl's ``repeat(interleave=True)`` makes them)."""
    gen = torch.Generator().manual_seed(seed)
    batch = prompts * group_size
    lengths_B = torch.randint(1, length + 1, (batch,), generator=gen)
    mask_BT = (torch.arange(length)[None, :] < lengths_B[:, None]).float()
    pass_rate_B = torch.rand(prompts, generator=gen).repeat_interleave(group_size)
    score_B = (torch.rand(batch, generator=gen) < pass_rate_B).float()
    rewards_BT = torch.zeros(batch, length)
    rewards_BT[torch.arange(batch), lengths_B - 1] = score_B
    uids = np.array([str(uuid.UUID(int=int(x))) for x in torch.randint(0, 2**62, (prompts,), generator=gen)])
    index = np.repeat(uids, group_size).astype(object)
    return rewards_BT.to(device), mask_BT.to(device), index


def _seconds(fn: Callable[[], object], device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def interleaved_medians(fns: list[Callable[[], object]], repeats: list[int], device: str) -> list[float]:
    """Median seconds of each fn; the calls are interleaved round-robin (fn0, fn1, ..., fn0, ...) so that
    load from other processes on a shared machine falls on every candidate alike."""
    times: list[list[float]] = [[] for _ in fns]
    for round_ in range(max(repeats)):
        for k, fn in enumerate(fns):
            if round_ < repeats[k]:
                times[k].append(_seconds(fn, device))
    return [statistics.median(t) for t in times]


def ours_token_level(estimator, rewards_BT: torch.Tensor, mask_BT: torch.Tensor, index) -> torch.Tensor:
    """verl's inputs -> verl's output with our estimator: sum tokens, estimate, broadcast over the mask."""
    adv_B = estimator(rewards_BT.sum(dim=-1), index)
    return adv_B.unsqueeze(-1) * mask_BT


COLUMNS = ("verl loop GRPO", "verl vectorised GRPO", "our GRPO", "our EBPO", "EBPO seq-only")


def verl_grpo() -> tuple[Callable, Callable] | None:
    """verl's (loop, vectorised) GRPO advantage functions, or None where verl does not import."""
    try:
        from verl.trainer.ppo.core_algos import (
            compute_grpo_outcome_advantage,
            compute_grpo_vectorized_outcome_advantage,
        )
    except Exception:  # noqa: BLE001 - absent, or present but broken beside this torch: time ours alone
        return None
    return compute_grpo_outcome_advantage, compute_grpo_vectorized_outcome_advantage


def bench_shape(prompts: int, group_size: int, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds of each of :data:`COLUMNS` (verl's two only where verl imports)."""
    rewards_BT, mask_BT, index = make_batch(prompts, group_size, args.length, args.device, args.seed)
    rewards_B = rewards_BT.sum(dim=-1)
    grpo = ebpo.get_estimator("grpo")
    ebpo_est = ebpo.get_estimator("ebpo")
    ours_token_level(ebpo_est, rewards_BT, mask_BT, index)  # warm the prior
    fns = {
        "our GRPO": lambda: ours_token_level(grpo, rewards_BT, mask_BT, index),
        "our EBPO": lambda: ours_token_level(ebpo_est, rewards_BT, mask_BT, index),
        "EBPO seq-only": lambda: ebpo_est(rewards_B, index),
    }
    # small batches take ~1 ms, where one scheduler hiccup moves a median: give them more repeats
    repeats = {name: args.repeats * (8 if prompts * group_size <= 8192 else 1) for name in fns}
    verl = verl_grpo()
    if verl is not None:
        loop, vectorised = verl
        # correctness first: our GRPO equals verl's on these batches (no singleton groups here)
        ref_BT, _ = vectorised(rewards_BT, mask_BT, index)
        ours_BT = ours_token_level(grpo, rewards_BT, mask_BT, index)
        torch.testing.assert_close(ours_BT.cpu(), ref_BT.float().cpu(), atol=1e-4, rtol=1e-4)
        fns = {
            "verl loop GRPO": lambda: loop(rewards_BT, mask_BT, index),
            "verl vectorised GRPO": lambda: vectorised(rewards_BT, mask_BT, index),
            **fns,
        }
        repeats = {
            "verl loop GRPO": args.loop_repeats,
            "verl vectorised GRPO": repeats["our GRPO"],
            **repeats,
        }
    medians = interleaved_medians(list(fns.values()), list(repeats.values()), args.device)
    return dict(zip(fns, medians, strict=True))


def shape_row(prompts: int, group_size: int, times: dict[str, float]) -> list[str]:
    """One shape's cells: the shape, milliseconds per call of each of :data:`COLUMNS` (``n/a`` where not
    timed), then EBPO / verl vectorised and verl loop / EBPO (``n/a`` where verl does not import)."""
    cells = [f"{prompts} x {group_size}"]
    cells += [f"{1e3 * times[name]:.2f} ms" if name in times else "n/a" for name in COLUMNS]
    if "verl vectorised GRPO" not in times:
        return cells + ["n/a", "n/a"]
    ebpo_s = times["our EBPO"]
    return cells + [
        f"{ebpo_s / times['verl vectorised GRPO']:.2f}x",
        f"{times['verl loop GRPO'] / ebpo_s:.1f}x",
    ]


def render(rows: list[list[str]]) -> list[str]:
    """The markdown table's lines, one row of :func:`shape_row` cells per shape."""
    header = ["prompts x G", *COLUMNS, "EBPO / verl vec", "verl loop / EBPO"]
    return markdown_table(header, rows).split("\n")


def table(shapes: list[tuple[int, int]], args: argparse.Namespace) -> list[str]:
    """The markdown table's lines: milliseconds per call and the ratios (those against verl where it imports)."""
    return render([shape_row(p, g, bench_shape(p, g, args)) for p, g in shapes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="torch device for all tensors (default cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU (default 1)")
    parser.add_argument("--length", type=int, default=256, help="response length T in tokens (default 256)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=15,
        help="timed calls per vectorised function (default 15; x8 for batches of <= 8192 sequences)",
    )
    parser.add_argument(
        "--loop-repeats",
        type=int,
        default=3,
        help="timed calls of verl's loop GRPO, which is slow (default 3)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic batches (default 0)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)

    verl = "verl imports" if verl_grpo() is not None else "verl does not import: ours alone"
    print(f"device={args.device} threads={args.threads} T={args.length} torch={torch.__version__}; {verl}")
    print()
    for line in table(SHAPES, args):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
