"""EBPO through verl's v1 trainer (``trainer.use_v1=true``, ``trainer_mode=sync``) on the CPU, end to end.

``python -m ebpo.integrations.verl trainer.device=cpu`` with the overrides of ``examples/verl/cpu_quickstart.py``
(TransferQueue, verl's TransferQueue agent loop, FSDP2 on gloo, the ``ebpo_cpu`` rollout), on the quickstart's
tiny ``arith`` model, 8 prompts per step (two batches per epoch of the 16 training prompts, so the topic
stream's order is visible) x 16 responses:

- ``test_v1_trains_and_resumes``: run A, steps 1..8 from scratch (checkpoints at 4 and 8); run B,
  ``trainer.resume_mode=auto`` on A's checkpoints, steps 9..16.
- ``test_v1_dapo_filter_feeds_the_prior_once``: ``algorithm.filter_groups`` with 4 responses per prompt, 4
  steps: evicted (and surplus) groups reach the prior once; evicted ones leave the batch (refilled, not
  masked).

verl v1 dumps each step's scored rollouts sorted by their key ``{uid}_{session}_{index}``
(``trainer.rollout_data_dir``): a group's rows are contiguous, which the replays below rely on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
from test_verl_e2e import (  # noqa: E402  (the legacy trainer's end-to-end helpers)
    CPU_SECONDS,
    assert_prior_equal,
    quickstart,
    run_entry_point,
    step_metrics,
    step_prompts,
    step_rewards,
)

import ebpo  # noqa: E402
from ebpo.integrations import ESTIMATOR_STATE_FILE  # noqa: E402

pytestmark = pytest.mark.slow

N = quickstart.N
BATCH, MINI = 8, 2  # prompts per step and per PPO mini-batch: 4 updates per step, as the quickstart
SHAPE = (f"data.train_batch_size={BATCH}", f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return quickstart.prepare(tmp_path_factory.mktemp("verl-v1-e2e"))


def stream_prompts(root: Path, steps: int) -> list[set[str]]:
    """Prompt sets of the first ``steps`` batches of ebpo's topic stream (seed 0, batch BATCH) over the
    training parquet: what verl must draw through ``data.sampler`` = TopicSampler."""
    import pandas as pd

    from ebpo.data.samplers import get_sampler

    frame = pd.read_parquet(root / "train.parquet")
    prompts = [row[0]["content"].strip() for row in frame["prompt"]]
    stream = get_sampler("topic", [info["topic"] for info in frame["extra_info"]], BATCH, seed=0)
    return [{prompts[i] for i in stream.next_batch()} for _ in range(steps)]


def replay(steps: list[tuple[list[torch.Tensor], torch.Tensor]], n: int) -> dict:
    """The core estimator fed, step by step, the groups the replay buffer evicted (``observe``) and then the
    batch (group of row i = i // n): the state the prior must have."""
    est = ebpo.get_estimator("ebpo")
    for evicted, rewards in steps:
        for group in evicted:
            est.observe(group, torch.zeros(len(group), dtype=torch.long))
        est(rewards, torch.arange(len(rewards)) // n)
    return est.state_dict()["prior"]


def saved_prior(root: Path, step: int, ckpt: str = "ckpt") -> dict:
    return torch.load(root / ckpt / f"global_step_{step}" / ESTIMATOR_STATE_FILE, weights_only=False)["ebpo"][
        "state"
    ]["prior"]


def test_v1_trains_and_resumes(workdir):
    started = time.perf_counter()
    code_a, log_a = run_entry_point(workdir, "v1_a", 8, *SHAPE, timeout=400)
    assert code_a == 0, log_a[-4000:]
    assert "EBPOTaskRunnerV1" in log_a  # verl's v1 trainer, not the legacy one
    code_b, log_b = run_entry_point(workdir, "v1_b", 16, *SHAPE, "trainer.resume_mode=auto", timeout=400)
    assert code_b == 0, log_b[-4000:]
    assert "setting global step to 8" in log_b
    metrics = {**step_metrics(workdir / "v1_a.metrics.jsonl"), **step_metrics(workdir / "v1_b.metrics.jsonl")}
    rewards = {**step_rewards(workdir / "v1_a-rollouts"), **step_rewards(workdir / "v1_b-rollouts")}
    assert sorted(metrics) == list(range(1, 17)) and sorted(rewards) == list(range(1, 17))
    assert all(len(rewards[s]) == BATCH * N for s in rewards)

    # each step trains on one batch of ebpo's topic stream, and the resumed run continues the stream: step 9
    # is the stream's 9th batch (epoch 5), not its first (a restarted sampler)
    prompts = {**step_prompts(workdir / "v1_a-rollouts"), **step_prompts(workdir / "v1_b-rollouts")}
    expected = stream_prompts(workdir, 16)
    assert [set(prompts[s]) for s in range(1, 17)] == expected
    assert expected[8] != expected[0]

    # ebpo/* metrics every step; the rollout samples with the actor's current weights
    for step, values in metrics.items():
        assert {"ebpo/mu_glob", "ebpo/shrinkage", "ebpo/tau2", "groups/all_fail"} <= set(values), step
        assert values["training/rollout_probs_diff_max"] < 1e-4, (
            step,
            values["training/rollout_probs_diff_max"],
        )

    # the prior = the core estimator fed every step's rewards: at A's step 8, and at B's step 16 after the
    # resume (a prior restarted empty would hold half as many rewards)
    prior_8 = saved_prior(workdir, 8)
    assert_prior_equal(prior_8, replay([([], rewards[s]) for s in range(1, 9)], N))
    assert int(prior_8["W_glob"]["count"]) == 8 * BATCH * N
    seen_8 = torch.cat([rewards[s] for s in range(1, 9)]).double()
    assert metrics[8]["ebpo/mu_glob"] == pytest.approx(seen_8.mean().item(), abs=1e-6)
    prior_16 = saved_prior(workdir, 16)
    assert_prior_equal(prior_16, replay([([], rewards[s]) for s in range(1, 17)], N))
    assert int(prior_16["W_glob"]["count"]) == 16 * BATCH * N

    # the training reward rises: least-squares slope over the 16 steps (per-step noise: 128 samples,
    # std <= 0.045; a policy that does not learn has slope 0 +- 0.003)
    per_step = [rewards[s].mean().item() for s in range(1, 17)]
    mean_step, mean_reward = 8.5, sum(per_step) / 16
    slope = sum((s - mean_step) * (r - mean_reward) for s, r in zip(range(1, 17), per_step)) / sum(
        (s - mean_step) ** 2 for s in range(1, 17)
    )
    wall = time.perf_counter() - started
    print(
        f"\n[verl v1 e2e] reward per step {' '.join(f'{r:.3f}' for r in per_step)}; slope {slope:.4f}/step; "
        f"wall {wall:.0f} s, CPU of both runs' processes {CPU_SECONDS['v1_a'] + CPU_SECONDS['v1_b']:.0f} s"
    )
    assert slope >= 0.005, per_step


def test_v1_dapo_filter_feeds_the_prior_once(workdir):
    n = 4  # at the model's ~1/3 accuracy about a fifth of the groups fail on all 4 responses
    started = time.perf_counter()
    code, log = run_entry_point(
        workdir,
        "v1_dapo",
        4,
        *SHAPE,
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",  # a mini-batch: 2 prompts x 4
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",  # a step: 8 prompts x 4
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=reward",
        f"trainer.default_local_dir={workdir / 'ckpt-dapo'}",
        timeout=400,
    )
    assert code == 0, log[-4000:]
    metrics = step_metrics(workdir / "v1_dapo.metrics.jsonl")
    rewards = step_rewards(workdir / "v1_dapo-rollouts")
    assert sorted(metrics) == sorted(rewards) == [1, 2, 3, 4]

    # every step trains on a full batch of kept groups: the evicted groups' rows are gone and replaced by
    # fresh prompts (a masked group would still be dumped, with its equal rewards)
    for step, values in rewards.items():
        assert len(values) == BATCH * n, step
        groups = values.view(BATCH, n)
        assert bool((groups.max(dim=1).values > groups.min(dim=1).values).all()), (step, groups)

    # every group verl cleared untrained (DAPO-evicted, or surplus of a refill) reached the prior exactly
    # once: our buffer's dump of the observed groups (observed/<step>.jsonl) holds as many as verl counted,
    # each evicted one with equal rewards, no uid twice; the prior = the core estimator fed, per step, those
    # groups and then the batch
    steps, evicted_total, observed_total, uids = [], 0, 0, []
    for step in range(1, 5):
        evicted = int(metrics[step].get("training/filter_groups/evicted_samples", 0))
        surplus = int(metrics[step].get("training/filter_groups/discarded_surplus_samples", 0))
        path = workdir / "v1_dapo-rollouts" / "observed" / f"{step}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
        assert len(rows) == evicted + surplus == int(metrics[step].get("ebpo/observed_groups", 0)), step
        assert all(len(row["rewards"]) == n for row in rows), step
        assert sum(len(set(row["rewards"])) == 1 for row in rows) >= evicted, step
        steps.append(([torch.tensor(row["rewards"]) for row in rows], rewards[step]))
        evicted_total += evicted
        observed_total += len(rows)
        uids += [row["uid"] for row in rows]
    assert evicted_total > 0, "no group was filtered: the test did not exercise the filter"
    assert len(set(uids)) == len(uids)
    prior = saved_prior(workdir, 4, "ckpt-dapo")
    assert_prior_equal(prior, replay(steps, n))
    assert int(prior["W_glob"]["count"]) == 4 * BATCH * n + observed_total * n
    print(
        f"\n[verl v1 dapo] groups evicted {evicted_total}, observed {observed_total} over 4 steps; "
        f"wall {time.perf_counter() - started:.0f} s"
    )
