"""EBPO's share of a verl step in the asynchronous modes, beside verl's own ``grpo``: the advantage call timed alone.

    .venv-verl/bin/python benchmarks/bench_async_share.py --step-seconds 19

What is measured: the function verl's ``compute_advantage`` calls, as registered in verl's advantage registry
(``ebpo`` through :func:`ebpo.integrations.verl.estimators.make_verl_estimator`; ``grpo`` verl's own), on one
batch of 512 prompts x 16 responses (token rewards (B, T = 256), a right-padded mask, verl's uid strings),
with each group's lag recorded the way :class:`ebpo.integrations.verl.v1.EBPOReplayBuffer` records it in
``colocate_async`` (lags Uniform{0..8}), for each ``prior_staleness`` option. In ``separate_async`` verl makes
``parameter_sync_step`` calls of ``512 / parameter_sync_step`` prompts per step; their sum is timed too (4
calls of 128 prompts). The share is that time over ``--step-seconds``, a step time measured elsewhere (a full
verl step at 512 x 16 cannot run on this CPU); nothing here times a step. Medians over repeats, calls
interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from ebpo.integrations.verl.estimators import EstimatorHolder, make_verl_estimator
from ebpo.tables import markdown_table


def make_batch(prompts: int, group_size: int, length: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    batch = prompts * group_size
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    scores = (torch.rand(batch, generator=gen) < 0.4).float()
    rewards = torch.zeros(batch, length)
    rewards[torch.arange(batch), lengths - 1] = scores
    uids = np.array(
        [f"s00000001-f00000-r{p:05d}" for p in range(prompts) for _ in range(group_size)], dtype=object
    )
    lags = {
        f"s00000001-f00000-r{p:05d}": int(v)
        for p, v in enumerate(torch.randint(0, 9, (prompts,), generator=gen))
    }
    return rewards, mask, uids, lags


def table(times: dict[str, list[float]], step_seconds: float) -> str:
    """The markdown table: each call's median over its repeats, and that median's share of a step."""
    rows = []
    for name, values in times.items():
        median = statistics.median(values)
        rows.append([name, f"{median * 1e3:.2f} ms", f"{100 * median / step_seconds:.4f}%"])
    return markdown_table(["call at 512 x 16", "median", f"share of a {step_seconds:g} s step"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--step-seconds", type=float, required=True, help="a verl step's time, measured elsewhere"
    )
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos

    grpo = core_algos.get_adv_estimator_fn("grpo")
    full = make_batch(512, 16, 256, 0)
    parts = [make_batch(128, 16, 256, i + 1) for i in range(4)]
    options = {
        "all": {},
        "max_lag": {"prior_staleness": "max_lag", "staleness_max_lag": 2},
        "decay": {"prior_staleness": "decay", "staleness_half_life": 2.0},
    }
    calls = {}
    for label, opts in options.items():
        holder = EstimatorHolder()
        holder.managed = True
        fn = make_verl_estimator("ebpo", holder)
        config = OmegaConf.create({"ebpo": opts})

        def call(batch, fn=fn, holder=holder, config=config):
            rewards, mask, uids, lags = batch
            holder.note_lags(lags)
            fn(rewards, mask, uids, config=config)

        call(full)  # the stateful estimator is warm, as in training
        calls[f"ebpo {label}, colocate_async (1 call)"] = lambda call=call: call(full)
        calls[f"ebpo {label}, separate_async (4 calls)"] = lambda call=call: [call(p) for p in parts]
    verl_config = OmegaConf.create({"norm_adv_by_std_in_grpo": True})
    calls["verl grpo (1 call)"] = lambda: grpo(full[0], full[1], full[2], config=verl_config)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    print(table(times, args.step_seconds))


if __name__ == "__main__":
    main()
