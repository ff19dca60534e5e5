"""EBPO through verl's legacy trainer (``trainer.use_v1=false``) with FSDP over 2 CPU ranks, a resume, verl's
``balance_batch`` and ``algorithm.filter_groups``, against the same run on 1 rank.

Three real runs of ``python -m ebpo.integrations.verl trainer.device=cpu`` (the quickstart's overrides, then
the ones below), 8 prompts x 4 samples per step, 2 mini-batches per step:

- ``ranks2_a``: 2 ranks (two ``ebpo_cpu_slot``s, gloo), ``balance_batch=True``, steps 1..2 (checkpoint at 2);
- ``ranks2_b``: the same, resumed from step 2, steps 3..4;
- ``rank1``: 1 rank, ``balance_batch=False``, steps 1..4 in one go.

The rewards come from ``verl_positional_reward.py`` (beside this file): each prompt's group has a fixed number of
successes every step (prompts 0, 4 and 5 saturated, so filtered), whatever the rollout samples, so the three
runs see the same rewards per group and their priors must agree. verl dumps every step's rollouts with each
row's uid, reward and advantage (``trainer.rollout_data_dir``, in the order the batch had when it was
trained: ``balance_batch`` reorders it).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
from ebpo.integrations.compat import trl_conflict  # noqa: E402

if trl_conflict():
    pytest.skip(trl_conflict(), allow_module_level=True)

from test_verl_e2e import (  # noqa: E402  (the end-to-end helpers: one session per run)
    CPU_SECONDS,
    assert_prior_equal,
    quickstart,
    run_entry_point,
    step_metrics,
)
from verl_positional_reward import successes  # noqa: E402

import ebpo  # noqa: E402
from ebpo.integrations import ESTIMATOR_STATE_FILE  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS, N, STEPS = 8, 4, 4
REWARD = Path(__file__).resolve().parent / "verl_positional_reward.py"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    from ebpo.integrations.verl.data import write_verl_parquet
    from ebpo.tasks import arith

    root = tmp_path_factory.mktemp("verl-ranks")
    quickstart.sft_arith_model(root / "model")
    train = arith.generate("train", PROMPTS, seed=0, topics=["max"], levels=[1])
    write_verl_parquet(train, root / "train.parquet", data_source="arith", instruction="")
    write_verl_parquet(train[:2], root / "val.parquet", data_source="arith", instruction="")
    return root


def overrides(root: Path, ranks: int, ckpt: str, *, balance: bool) -> list[str]:
    """Appended to the quickstart's overrides (a later value of a key wins)."""
    return [
        "trainer.use_v1=false",
        f"trainer.n_gpus_per_node={ranks}",
        f"trainer.balance_batch={balance}",
        f"trainer.default_local_dir={root / ckpt}",
        "trainer.save_freq=2",
        f"data.train_files={root / 'train.parquet'}",
        f"data.val_files={root / 'val.parquet'}",
        f"data.train_batch_size={PROMPTS}",
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=seq_reward",
        f"reward.custom_reward_function.path={REWARD}",
        f"+reward.custom_reward_function.reward_kwargs.group_size={N}",
    ]


def dumped_rows(folder: Path) -> dict[int, list[dict]]:
    """verl's rollout dump: {step: rows in the order the step's batch was trained}."""
    import json

    out = {}
    for path in folder.glob("*.jsonl"):
        out[int(path.stem)] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def prompt_index(root: Path) -> dict[str, int]:
    """Prompt text -> its ``extra_info.index`` in the training parquet."""
    import pandas as pd

    frame = pd.read_parquet(root / "train.parquet")
    return {
        row[0]["content"].strip(): int(info["index"])
        for row, info in zip(frame["prompt"], frame["extra_info"])
    }


def unreordered(rows: list[dict]) -> list[dict]:
    """The step's batch as generated, before ``balance_batch``: groups contiguous, in order of first
    appearance (the estimator's output per row depends on the row's reward, its group and the batch only)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["uid"]].append(row)
    return [row for members in groups.values() for row in members]


def replay(steps: list[list[dict]]):
    """The core estimator fed each step as the adapter feeds it: saturated groups to ``observe``, the rest
    to ``est``; returns (estimator, per step the advantage of every row of the un-reordered batch)."""
    est = ebpo.get_estimator("ebpo")
    advantages = []
    for rows in steps:
        rewards = torch.tensor([row["score"] for row in rows], dtype=torch.float64)
        uids = [row["uid"] for row in rows]
        by_group: dict[str, list[float]] = defaultdict(list)
        for uid, r in zip(uids, rewards.tolist()):
            by_group[uid].append(r)
        saturated = torch.tensor([len(set(by_group[uid])) == 1 for uid in uids])
        kept = ~saturated
        est.observe(rewards[saturated], [u for u, s in zip(uids, saturated.tolist()) if s])
        adv = torch.zeros(len(rows), dtype=torch.float64)
        adv[kept] = est(rewards[kept], [u for u, k in zip(uids, kept.tolist()) if k]).double()
        advantages.append(adv)
    return est, advantages


def test_two_ranks_with_a_resume_match_one_rank(workdir):
    started = time.perf_counter()
    runs = {
        "ranks2_a": (2, overrides(workdir, 2, "ckpt2", balance=True)),
        "ranks2_b": (STEPS, [*overrides(workdir, 2, "ckpt2", balance=True), "trainer.resume_mode=auto"]),
        "rank1": (STEPS, overrides(workdir, 1, "ckpt1", balance=False)),
    }
    logs = {}
    for name, (steps, extra) in runs.items():
        code, logs[name] = run_entry_point(workdir, name, steps, *extra, timeout=400)
        assert code == 0, logs[name][-4000:]
    assert "Setting global step to 2" in logs["ranks2_b"]

    two = {**dumped_rows(workdir / "ranks2_a-rollouts"), **dumped_rows(workdir / "ranks2_b-rollouts")}
    one = dumped_rows(workdir / "rank1-rollouts")
    assert sorted(two) == sorted(one) == list(range(1, STEPS + 1))
    index = prompt_index(workdir)

    # every group's rewards are the positional reward's: index mod (N + 1) successes out of N
    for rows in [*two.values(), *one.values()]:
        assert len(rows) == PROMPTS * N
        groups = defaultdict(list)
        for row in rows:
            groups[row["uid"]].append((row["input"].strip(), row["score"]))
        assert len(groups) == PROMPTS
        for members in groups.values():
            assert len({prompt for prompt, _ in members}) == 1 and len(members) == N
            assert sum(score for _, score in members) == successes(index[members[0][0]], N)

    # balance_batch reordered the 2-rank batches: some group's rows are not contiguous
    def contiguous(rows):
        uids = [row["uid"] for row in rows]
        return all(uids[i] == uids[i + 1] or uids[i] not in uids[i + 1 :] for i in range(len(uids) - 1))

    assert not all(contiguous(two[s]) for s in two)

    # every row's advantage = the estimator's on the un-reordered batch (priors carried over the steps)
    for dumps in (two, one):
        _, expected = replay([unreordered(dumps[s]) for s in range(1, STEPS + 1)])
        for step in range(1, STEPS + 1):
            rows = unreordered(dumps[step])
            got = torch.tensor([row["advantage"] for row in rows], dtype=torch.float64)
            torch.testing.assert_close(got, expected[step - 1], rtol=1e-5, atol=1e-6)

    # the prior after the run: a replay of every reward the driver saw, the same on 1 and on 2 ranks
    def saved_prior(ckpt: str) -> dict:
        state = torch.load(workdir / ckpt / f"global_step_{STEPS}" / ESTIMATOR_STATE_FILE, weights_only=False)
        return state["ebpo"]["state"]["prior"]

    replayed, _ = replay([unreordered(two[s]) for s in range(1, STEPS + 1)])
    prior_two, prior_one = saved_prior("ckpt2"), saved_prior("ckpt1")
    assert int(prior_two["W_glob"]["count"]) == STEPS * PROMPTS * N  # filtered groups counted once
    assert_prior_equal(prior_two, replayed.state_dict()["prior"])
    assert_prior_equal(prior_one, prior_two)

    # the filtered steps trained: finite losses, two mini-batches per step
    for name in runs:
        for step, values in step_metrics(workdir / f"{name}.metrics.jsonl").items():
            assert torch.isfinite(torch.tensor(values["actor/pg_loss"])), (name, step)
    wall = time.perf_counter() - started
    cpu = sum(CPU_SECONDS[name] for name in runs)
    print(f"\n[verl ranks] three runs: wall {wall:.0f} s, CPU of their processes {cpu:.0f} s")
