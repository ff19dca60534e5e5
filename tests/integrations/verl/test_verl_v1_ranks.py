"""EBPO on verl's v1 trainer with FSDP over 2 ranks on the CPU (two ``ebpo_cpu_slot``s, gloo), with a resume,
against the same run on 1 rank.

The reward ignores the response (``verl_reward_by_answer.py``: the problem's answer mod 3, halved), and the
topic sampler's seed fixes the prompts of every step, so both world sizes see the same rewards whatever they
sample: their priors must agree, and equal a replay of the rewards. What the comparison guards: the prior is
kept by the driver, which must see each group once however many ranks train (no padding rows, duplicated or
reordered batches leaking into it). verl's ``trainer.balance_batch=True`` (its default; it reorders rows across
the ranks by length) is on in both.

- 2 ranks: steps 1..2 (checkpoint at 2), then ``resume_mode=auto`` to step 4;
- 1 rank: steps 1..4 in one run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
from test_verl_e2e import (  # noqa: E402  (the legacy trainer's end-to-end helpers)
    CPU_SECONDS,
    assert_prior_equal,
    quickstart,
    run_entry_point,
    step_metrics,
    step_rewards,
)
from test_verl_v1_e2e import replay, saved_prior  # noqa: E402

pytestmark = pytest.mark.slow

BATCH, MINI, N = 8, 2, 4  # 32 rows per step, 4 updates of 8 rows (4 per rank on 2 ranks)
REWARD = Path(__file__).resolve().parent / "verl_reward_by_answer.py"
COMMON = (
    f"data.train_batch_size={BATCH}",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
    f"actor_rollout_ref.rollout.n={N}",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    f"reward.custom_reward_function.path={REWARD}",
    "reward.custom_reward_function.name=compute_score",
    "trainer.balance_batch=True",
    "trainer.save_freq=2",
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return quickstart.prepare(tmp_path_factory.mktemp("verl-v1-ranks"))


def test_two_ranks_keep_the_prior_of_one(workdir):
    started = time.perf_counter()
    two = (*COMMON, "trainer.n_gpus_per_node=2", f"trainer.default_local_dir={workdir / 'ckpt2'}")
    code, log = run_entry_point(workdir, "r2_a", 2, *two, timeout=400)
    assert code == 0, log[-4000:]
    code, log = run_entry_point(workdir, "r2_b", 4, *two, "trainer.resume_mode=auto", timeout=400)
    assert code == 0, log[-4000:]
    assert "setting global step to 2" in log
    one = (*COMMON, f"trainer.default_local_dir={workdir / 'ckpt1'}")
    code, log = run_entry_point(workdir, "r1", 4, *one, timeout=400)
    assert code == 0, log[-4000:]

    # FSDP really ran on 2 ranks: each rank wrote its shard of the actor
    shards = sorted(
        p.name for p in (workdir / "ckpt2" / "global_step_4" / "actor").glob("model_world_size_*")
    )
    assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]

    rewards_2 = {**step_rewards(workdir / "r2_a-rollouts"), **step_rewards(workdir / "r2_b-rollouts")}
    rewards_1 = step_rewards(workdir / "r1-rollouts")
    prompts_2 = {**step_prompts_n(workdir / "r2_a-rollouts"), **step_prompts_n(workdir / "r2_b-rollouts")}
    prompts_1 = step_prompts_n(workdir / "r1-rollouts")
    assert sorted(rewards_2) == sorted(rewards_1) == [1, 2, 3, 4]
    for step in range(1, 5):
        assert len(rewards_2[step]) == len(rewards_1[step]) == BATCH * N
        assert sorted(prompts_2[step]) == sorted(prompts_1[step]), (
            step
        )  # the same prompts, so the same rewards
        assert sorted(rewards_2[step].tolist()) == sorted(rewards_1[step].tolist()), step
    assert len({r for s in rewards_1 for r in rewards_1[s].tolist()}) > 1  # not one constant reward

    # the 2-rank prior after the resume = a replay of every reward its driver saw = the 1-rank prior
    prior_2, prior_1 = saved_prior(workdir, 4, "ckpt2"), saved_prior(workdir, 4, "ckpt1")
    assert_prior_equal(prior_2, replay([([], rewards_2[s]) for s in range(1, 5)], N))
    assert_prior_equal(prior_2, prior_1)
    assert int(prior_2["W_glob"]["count"]) == 4 * BATCH * N
    metrics_2 = {
        **step_metrics(workdir / "r2_a.metrics.jsonl"),
        **step_metrics(workdir / "r2_b.metrics.jsonl"),
    }
    metrics_1 = step_metrics(workdir / "r1.metrics.jsonl")
    for step in range(1, 5):
        for key in ("ebpo/mu_glob", "ebpo/tau2", "ebpo/sigma2", "ebpo/shrinkage"):
            assert metrics_2[step][key] == pytest.approx(metrics_1[step][key], rel=1e-9, abs=1e-12), (
                step,
                key,
            )
    cpu = sum(CPU_SECONDS[name] for name in ("r2_a", "r2_b", "r1"))
    print(
        f"\n[verl v1 2 ranks] wall {time.perf_counter() - started:.0f} s, CPU of the three runs {cpu:.0f} s"
    )


def step_prompts_n(folder: Path) -> dict[int, list[str]]:
    """Each step's prompts (one per group of N rows) from verl's rollout dump (the legacy test's
    ``step_prompts`` reads groups of its own N = 16)."""
    prompts = {}
    for path in folder.glob("*.jsonl"):
        inputs = [json.loads(line)["input"].strip() for line in path.read_text().splitlines() if line.strip()]
        assert all(inputs[i] == inputs[i - i % N] for i in range(len(inputs))), path
        prompts[int(path.stem)] = inputs[::N]
    return prompts
