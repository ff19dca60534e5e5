"""EBPO through verl's own trainers on the CPU, end to end: the runs of ``conftest.py`` (``python -m
ebpo.integrations.verl trainer.device=cpu`` with the quickstart's overrides), read back from what verl wrote:
its file logger's metrics, its rollout dumps (``trainer.rollout_data_dir``) and the checkpoints.

v1 dumps each step's rows sorted by key ``{uid}_{session}_{index}``: a group's rows together, groups in uid
order, which is the order the prompts were fetched (``ebpo.integrations.verl.v1.prompt_uid``). The legacy
trainer dumps the batch in the order it was trained (``balance_batch`` reorders it across ranks).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
from ebpo.integrations.compat import trl_conflict  # noqa: E402

if trl_conflict():
    pytest.skip(trl_conflict(), allow_module_level=True)

from verl_helpers import (  # noqa: E402
    CHATML_TURN,
    CPU_SECONDS,
    WALL_SECONDS,
    actor_weights,
    assert_prior_equal,
    dumped_prompt,
    dumped_rows,
    quickstart,
    replay,
    replay_estimator,
    saved_prior,
    saved_state,
    slope,
    step_groups,
    step_metrics,
    step_prompts,
    step_rewards,
    stream_prompts,
)
from verl_positional_reward import successes  # noqa: E402

import ebpo  # noqa: E402
from ebpo.integrations import ESTIMATOR_STATE_FILE  # noqa: E402
from ebpo.integrations.verl.checkpoint import SAMPLER_STATE_FILE  # noqa: E402
from ebpo.integrations.verl.cpu.config import legacy_cpu_refusal  # noqa: E402
from ebpo.integrations.verl.rewards import compute_score  # noqa: E402
from ebpo.plugins import load_plugins  # noqa: E402
from helpers.plugins import FILE_ESTIMATOR, MY_ESTIMATORS, PKG_ESTIMATOR, STATEFUL_ESTIMATOR  # noqa: E402

# the runs start with the session (conftest.py); a test waits for the ones it reads
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

N = 16  # the quickstart's responses per prompt
RANKS_N = 4


def timing(*names: str) -> str:
    return ", ".join(
        f"{name} {WALL_SECONDS[name]:.0f} s wall / {CPU_SECONDS[name]:.0f} s CPU" for name in names
    )


def prompt_info(root: Path) -> dict[str, dict]:
    """Prompt text -> its ``extra_info`` (``index``, ``topic``, ``difficulty``, ...) in ``root/train.parquet``."""
    import pandas as pd

    frame = pd.read_parquet(root / "train.parquet")
    return {row[0]["content"].strip(): dict(info) for row, info in zip(frame["prompt"], frame["extra_info"])}


def train_rows(root: Path) -> dict[str, dict]:
    """Prompt text -> its row of ``root/train.parquet`` (``prompt``, ``reward_model``, ``extra_info``, ...)."""
    import pandas as pd

    frame = pd.read_parquet(root / "train.parquet")
    return {row["prompt"][0]["content"].strip(): row for row in frame.to_dict("records")}


def prompt_index(root: Path) -> dict[str, int]:
    """Prompt text -> its ``extra_info.index`` in ``root/train.parquet``."""
    return {text: int(info["index"]) for text, info in prompt_info(root).items()}


# ----------------------------------------------------------------------------------------------------------
# v1: the quickstart
# ----------------------------------------------------------------------------------------------------------
def test_v1_learns_and_its_prior_is_a_replay_of_every_reward(e2e):
    e2e.succeeded("v1_a")
    qs = e2e.root_of("v1_a")
    metrics = step_metrics(qs / "v1_a.metrics.jsonl")
    rewards = step_rewards(qs / "v1_a-rollouts")
    assert sorted(metrics) == sorted(rewards) == list(range(1, 9))
    assert all(len(rewards[s]) == 16 * N for s in rewards)

    # each step's prompts, in the order they were fetched, are a batch of ebpo's topic stream (the 16 prompts
    # reshuffled every epoch): data.sampler = TopicSampler
    prompts = step_prompts(qs / "v1_a-rollouts", N)
    expected = stream_prompts(qs, "topic", 16, 8)
    assert [prompts[s] for s in range(1, 9)] == expected and expected[1] != expected[0]

    # ebpo/* metrics every step; the rollout samples with the actor's current weights (its log-probs equal
    # the actor's recomputation; stale weights would differ by far more)
    for step, values in metrics.items():
        assert {"ebpo/mu_glob", "ebpo/shrinkage", "ebpo/tau2", "groups/all_fail"} <= set(values), step
        assert values["training/rollout_probs_diff_max"] < 1e-4, (
            step,
            values["training/rollout_probs_diff_max"],
        )

    # the prior holds exactly the rewards of the steps run: the core estimator fed the same steps
    for step in (4, 8):
        prior = saved_prior(qs, step, "ckpt_a")
        assert_prior_equal(prior, replay([([], rewards[s], None) for s in range(1, step + 1)], N))
        assert int(prior["W_glob"]["count"]) == step * 16 * N
    seen = torch.cat([rewards[s] for s in range(1, 9)]).double()
    assert metrics[8]["ebpo/mu_glob"] == pytest.approx(seen.mean().item(), abs=1e-6)

    # the training reward rises (the same 16 prompts every step: the change is the policy's). Per-step noise:
    # 256 samples, std <= 0.031, so the slope over 8 steps has std <= 0.005; the quickstart rose 0.43 -> 0.79
    # over 16 steps (0.022 per step); a policy that did not learn has slope 0
    per_step = [rewards[s].mean().item() for s in range(1, 9)]
    print(
        f"\n[verl v1] reward per step {' '.join(f'{r:.3f}' for r in per_step)}, slope {slope(per_step):.4f}; {timing('v1_a')}"
    )
    assert slope(per_step) >= 0.008, per_step


#: verl's agent loop warns once per request for a model family it has no token builder for (Llama): 256 per
#: quickstart step without the quiet log
REPEATED_WARNING = "No model-specific Continuous Token builder"
RAY_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)*\(([^)]*pid=\d+[^)]*)\)")


def test_the_quickstart_log_is_short(e2e):
    # v1_a is the quickstart's command for 8 steps: what the quickstart would print of its output (its
    # progress_line) is one line per step and ebpo's own lines, far under 100; verl's repeated warning comes
    # at most once from each process (2048 times over 8 steps unfiltered)
    e2e.succeeded("v1_a")
    _, log = e2e.result("v1_a")
    lines = log.splitlines()
    shown = [line for line in map(lambda raw: quickstart.progress_line(raw, 8), lines) if line is not None]
    steps = [int(m.group(1)) for m in (re.match(r"step (\d+)/8: reward \d", line) for line in shown) if m]
    assert steps == list(range(1, 9)), shown
    assert len(shown) <= 100, shown
    per_process: dict[str, int] = defaultdict(int)
    for line in lines:
        if REPEATED_WARNING in line:
            match = RAY_PREFIX.match(line)
            per_process[match.group(1) if match else "driver"] += 1
    assert all(count == 1 for count in per_process.values()), dict(per_process)
    print(f"\n[verl v1 log] {len(lines)} lines, {len(shown)} shown by the quickstart; {dict(per_process)}")


def test_the_same_command_gives_the_same_rewards_and_weights(e2e):
    # v1_b runs v1_a's command (its own checkpoint folder) for 2 steps: the same responses and rewards in every
    # group, the same weights, the same prior. The rollout seeds each request from the run's seed, the weights'
    # version, the prompt and its draw; prompts are named by their place in the run, a group's rows ordered by
    # draw: nothing depends on which request arrived first
    e2e.succeeded("v1_a", "v1_b")
    qs = e2e.root_of("v1_a")
    a, b = step_groups(qs / "v1_a-rollouts"), step_groups(qs / "v1_b-rollouts")
    assert sorted(b) == [1, 2] and all(b[s] == a[s] for s in (1, 2))
    assert len({reward for _, members in a[1] for _, reward in members}) > 1  # not one constant reward
    weights_a, weights_b = actor_weights(qs, 2, "ckpt_a"), actor_weights(qs, 2, "ckpt_b")
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[name], weights_b[name]) for name in weights_a)
    later = actor_weights(qs, 4, "ckpt_a")
    assert any(not torch.equal(later[name], weights_a[name]) for name in weights_a)  # the weights do move
    prior_a, prior_b = (
        torch.load(qs / c / "global_step_2" / ESTIMATOR_STATE_FILE, weights_only=False)
        for c in ("ckpt_a", "ckpt_b")
    )
    assert prior_a == prior_b
    print(f"\n[verl v1 twice] {timing('v1_b')}")


def test_a_resumed_run_goes_on_exactly_as_the_uninterrupted_one(e2e):
    # v1_c resumes v1_b's step-2 checkpoint and runs steps 3-4: v1_a's steps 3-4 exactly (the weights, the
    # optimizer, the prior, the topic stream's cursor and the rollout seeds all come back)
    e2e.succeeded("v1_a", "v1_c")
    qs = e2e.root_of("v1_a")
    code, log = e2e.result("v1_c")
    assert "setting global step to 2" in log
    a, c = step_groups(qs / "v1_a-rollouts"), step_groups(qs / "v1_c-rollouts")
    assert sorted(c) == [3, 4] and all(c[s] == a[s] for s in (3, 4))
    weights_a, weights_c = actor_weights(qs, 4, "ckpt_a"), actor_weights(qs, 4, "ckpt_b")
    assert all(torch.equal(weights_a[name], weights_c[name]) for name in weights_a)
    for name in (ESTIMATOR_STATE_FILE, SAMPLER_STATE_FILE):
        state_a, state_c = (
            torch.load(qs / c / "global_step_4" / name, weights_only=False) for c in ("ckpt_a", "ckpt_b")
        )
        assert state_a == state_c, name
    metrics_a, metrics_c = step_metrics(qs / "v1_a.metrics.jsonl"), step_metrics(qs / "v1_c.metrics.jsonl")
    for step in (3, 4):
        for key in ("ebpo/mu_glob", "ebpo/tau2", "ebpo/shrinkage"):
            assert metrics_c[step][key] == metrics_a[step][key], (step, key)
    print(f"\n[verl v1 resumed] {timing('v1_c')}")


# ----------------------------------------------------------------------------------------------------------
# v1 on 2 ranks: DAPO's filter with the curriculum and a cluster prior, across a resume
# ----------------------------------------------------------------------------------------------------------
def dapo_runs(e2e) -> tuple[Path, dict[int, list[dict]], dict[int, list[dict]], dict[int, dict]]:
    """Runs ``v1r_a`` (steps 1-2) and ``v1r_b`` (resumed at step 2, steps 3-4) read back: their folder and, by
    step, the trained rows (verl's dump), the groups cleared untrained (our buffer's dump) and the metrics."""
    e2e.succeeded("v1r_a", "v1r_b")
    root = e2e.root_of("v1r_a")
    rows, observed, metrics = {}, {}, {}
    for name in ("v1r_a", "v1r_b"):
        rows |= dumped_rows(root / f"{name}-rollouts")
        metrics |= step_metrics(root / f"{name}.metrics.jsonl")
        for path in (root / f"{name}-rollouts" / "observed").glob("*.jsonl"):
            observed[int(path.stem)] = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(rows) == sorted(metrics) == [1, 2, 3, 4]
    return root, rows, observed, metrics


def trained_groups(step_rows: list[dict]) -> dict[str, list[dict]]:
    """A step's trained rows by prompt uid (the key ``{uid}_{session}_{index}`` without its last two parts)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in step_rows:
        groups[row["uid"].rsplit("_", 2)[0]].append(row)
    return groups


def test_v1_dapo_on_two_ranks_goes_on_with_the_curriculum_across_a_resume(e2e):
    # 2 FSDP ranks, balance_batch, algorithm.filter_groups (verl's v1 replay buffer evicts the finished groups
    # whose rewards are all equal and refills the batch with fresh prompts, fetched one at a time),
    # DifficultySampler (easiest first). The positional reward (verl_positional_reward.py) gives prompt i
    # i mod 5 successes of 4 in each of its groups whatever was sampled: prompts 0, 4, 5, 9, 10, 14, 15 are
    # evicted every time, the others kept. Steps 1-2, then a resume at step 2 for steps 3-4: the prompts
    # handed out and the sampler's state are the uninterrupted run's, which the data, the curriculum and the
    # reward fix
    root, rows, observed, metrics = dapo_runs(e2e)
    _, log = e2e.result("v1r_b")
    assert "setting global step to 2" in log
    shards = sorted(p.name for p in (root / "ckpt" / "global_step_4" / "actor").glob("model_world_size_*"))
    assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    index = prompt_index(root)
    text_of = {i: text for text, i in index.items()}

    # every step trains a full batch of kept groups (4 prompts x 4 rows) scored by the positional reward;
    # every group cleared untrained has its prompt's rewards too (evicted: all equal; surplus of a refill)
    fetched = {}
    for step in range(1, 5):
        groups = trained_groups(rows[step])
        assert len(groups) == 4 and all(len(members) == RANKS_N for members in groups.values()), step
        for uid, members in groups.items():
            prompt = members[0]["input"].strip()
            assert {row["input"].strip() for row in members} == {prompt}
            wins = successes(index[prompt], RANKS_N)
            assert 0 < wins < RANKS_N and sum(row["score"] for row in members) == wins, (step, prompt)
            fetched[uid] = prompt
        for group in observed.get(step, []):
            assert len(group["rewards"]) == RANKS_N
            assert sum(group["rewards"]) == successes(group["index"], RANKS_N), (step, group)
            fetched[group["uid"]] = text_of[group["index"]]

    # the prompts were handed out one at a time in the curriculum's order, none skipped or repeated, also
    # across the resume and into the second epoch: trained and cleared groups, in the order their uids say
    # they were fetched, are the stream's start
    order = [fetched[uid] for uid in sorted(fetched)]
    stream = stream_prompts(root, "difficulty", 4, 1 + len(order) // 4)
    assert order == [text for batch in stream for text in batch][: len(order)]
    assert len(order) > 16 and any(uid.startswith("s00000003") for uid in fetched)
    difficulty = {text: info["difficulty"] for text, info in prompt_info(root).items()}
    first_epoch = [difficulty[text] for text in order[:16]]
    assert first_epoch == sorted(first_epoch, reverse=True) and len(set(first_epoch)) == 16  # easiest first
    # the cursor saved at step 4 is that of a sampler that handed out exactly these prompts
    import pandas as pd
    from omegaconf import OmegaConf

    from ebpo.integrations.verl.samplers import DifficultySampler

    frame = pd.read_parquet(root / "train.parquet")
    sampler = DifficultySampler(
        [{"extra_info": info} for info in frame["extra_info"]],
        OmegaConf.create({"train_batch_size": 4, "seed": 0}),
    )
    handed_out = 0
    while handed_out < len(order):  # the dataloader starts a new pass at the end of each epoch
        for _ in zip(range(len(order) - handed_out), sampler):
            handed_out += 1
    saved = torch.load(root / "ckpt" / "global_step_4" / SAMPLER_STATE_FILE, weights_only=False)
    # past the first epoch (16 prompts); how far past depends on how many prompts the refills fetched, which
    # the order the groups finish in decides: 33 over the four steps (epoch 2, position 1) is one outcome
    assert saved == sampler.state_dict() and saved["epoch"] >= 1
    evicted = sum(int(metrics[s].get("training/filter_groups/evicted_samples", 0)) for s in metrics)
    print(
        f"\n[verl v1 dapo 2 ranks] fetched {len(order)}, groups evicted {evicted}; {timing('v1r_a', 'v1r_b')}"
    )


def test_v1_dapo_cleared_groups_reach_the_cluster_prior_once_across_a_resume(e2e):
    # the same runs: every group verl cleared untrained (evicted, or surplus of a refill) reached the prior
    # exactly once, in its topic's prior (prior_scope=cluster over max / mod), also across the resume (the
    # prior of step 2 came back): our buffer's dump of the cleared groups holds as many as verl counted, and
    # the prior saved at step 4 = the core estimator fed, step by step, those groups and then the batch
    root, rows, observed, metrics = dapo_runs(e2e)
    info = prompt_info(root)
    topic = {int(extra["index"]): extra["topic"] for extra in info.values()}
    steps, evicted_total = [], 0
    for step in range(1, 5):
        evicted = int(metrics[step].get("training/filter_groups/evicted_samples", 0))
        surplus = int(metrics[step].get("training/filter_groups/discarded_surplus_samples", 0))
        cleared = observed.get(step, [])
        assert len(cleared) == evicted + surplus == int(metrics[step].get("ebpo/observed_groups", 0)), step
        assert sum(len(set(group["rewards"])) == 1 for group in cleared) >= evicted, step
        assert len({group["uid"] for group in cleared} | set(trained_groups(rows[step]))) == len(cleared) + 4
        evicted_total += evicted
        rewards = torch.tensor([row["score"] for row in rows[step]])
        steps.append(
            (
                [(torch.tensor(group["rewards"]), topic[group["index"]]) for group in cleared],
                rewards,
                [info[row["input"].strip()]["topic"] for row in rows[step]],
            )
        )
        assert "ebpo/cluster_prior_frac" in metrics[step]
    assert evicted_total > 0, "no group was evicted: the test did not exercise the filter"
    assert {cluster for _, _, clusters in steps for cluster in clusters} == {"max", "mod"}
    # the global prior and each topic's: equal structure and numbers (clusters compared by name)
    saved = saved_state(root, 4)
    expected = replay_estimator(steps, RANKS_N, prior_scope="cluster", cluster_min_groups=2).state_dict()
    assert_prior_equal(saved["prior"], expected["prior"])
    assert sorted(dict(saved["cluster_priors"])) == ["max", "mod"]
    assert_prior_equal(dict(saved["cluster_priors"]), dict(expected["cluster_priors"]), "cluster_priors")
    groups_seen = sum(len(cleared) for cleared, _, _ in steps) + 4 * 4
    assert int(saved["prior"]["W_glob"]["count"]) == groups_seen * RANKS_N


# ----------------------------------------------------------------------------------------------------------
# v1 colocate_async: 1 rank, and 2 ranks stopped at step 2 and resumed
# ----------------------------------------------------------------------------------------------------------
ASYNC_N = 8  # responses per prompt in the colocate_async runs (conftest.py)
ASYNC_PROMPTS = 8
STALENESS_WORST = "training/off_policy/trajectory_staleness_worst"
STALENESS_NEWEST = "training/off_policy/trajectory_staleness"


def assert_staleness_logged(metrics: dict[int, dict[str, float]]) -> None:
    """``ebpo/staleness_*`` every step, equal to verl's own count of the versions behind a response's oldest
    token: the mean over groups = verl's mean over rows (every group has ``ASYNC_N`` rows)."""
    for step, values in metrics.items():
        assert {"ebpo/staleness_mean", "ebpo/staleness_max", "ebpo/mu_glob", "ebpo/shrinkage"} <= set(
            values
        ), step
        assert values["ebpo/staleness_mean"] == pytest.approx(values[f"{STALENESS_WORST}/mean"], abs=1e-9), (
            step
        )
        assert values["ebpo/staleness_max"] == values[f"{STALENESS_WORST}/max"], step


def async_replay(*folders: Path, last: int = 4) -> tuple[dict, int]:
    """The core estimator fed steps 1..``last`` dumped in ``folders`` (a group's rows together: verl dumps them
    in key order): its prior and the number of rewards; asserts every step's groups are new ones."""
    rows = {}
    for folder in folders:
        rows |= dumped_rows(folder)
    steps = list(range(1, last + 1))
    uids = [uid for s in steps for uid in {row["uid"].rsplit("_", 2)[0] for row in rows[s]}]
    assert len(uids) == len(set(uids)) == ASYNC_PROMPTS * len(steps), "a group trained twice, or one missing"
    rewards = [torch.tensor([row["score"] for row in rows[s]]) for s in steps]
    return replay([([], r, None) for r in rewards], ASYNC_N), sum(len(r) for r in rewards)


def test_colocate_async_on_one_rank_logs_staleness_and_its_prior_is_a_replay(e2e):
    # trainer.v1.trainer_mode=colocate_async on 1 rank, 4 steps of 8 prompts x 8: verl's async trainer (the
    # rollout runs ahead: a warm-up batch is generated before step 1, so later steps train groups sampled by
    # older weights); ebpo/staleness_* every step, as verl counts it; the prior saved at steps 2 and 4 holds
    # exactly the rewards of the groups trained so far (our async buffer handed out each group once)
    e2e.succeeded("async_a")
    qs = e2e.root_of("async_a")
    metrics = step_metrics(qs / "async_a.metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3, 4]
    assert_staleness_logged(metrics)
    assert max(values["ebpo/staleness_max"] for values in metrics.values()) >= 1, "no stale group: not async"
    for step in (2, 4):
        folder = qs / "ckpt_async_a" / f"global_step_{step}"
        assert (folder / ESTIMATOR_STATE_FILE).is_file() and (folder / "transfer_queue").is_dir()
        expected, count = async_replay(qs / "async_a-rollouts", last=step)
        prior = saved_prior(qs, step, "ckpt_async_a")
        assert_prior_equal(prior, expected)
        assert int(prior["W_glob"]["count"]) == count == step * ASYNC_PROMPTS * ASYNC_N
    lags = [values["ebpo/staleness_mean"] for _, values in sorted(metrics.items())]
    rewards = [values["critic/score/mean"] for _, values in sorted(metrics.items())]
    print(f"\n[verl colocate_async] staleness {lags}, reward {rewards}; {timing('async_a')}")


def test_colocate_async_on_two_ranks_resumes_with_each_group_in_the_prior_once(e2e):
    # async_b: async_a's command on 2 ranks, stopped at step 2 (its last: checkpoint, TransferQueue saved with
    # the groups finished but not trained and the prompts still pending); async_c: resume_mode=auto, steps 3-4.
    # The prior saved at step 4 = the core estimator fed every group trained in steps 1-4, each once (a group
    # restored or reissued after the resume enters the prior when it is trained, not before the stop): the
    # prior a run that never stopped holds after training those groups
    e2e.succeeded("async_b", "async_c")
    qs = e2e.root_of("async_b")
    _, log_c = e2e.result("async_c")
    assert "setting global step to 2" in log_c
    shards = sorted(
        p.name for p in (qs / "ckpt_async_b" / "global_step_4" / "actor").glob("model_world_size_*")
    )
    assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    metrics = step_metrics(qs / "async_b.metrics.jsonl") | step_metrics(qs / "async_c.metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3, 4]
    assert_staleness_logged(metrics)
    # groups fetched at step 2, finished or pending at the stop, came back with TransferQueue (the pending ones
    # reissued) and were trained after the resume
    restored = re.search(r"Restored (\d+) training prompt groups from TransferQueue", log_c)
    assert restored and int(restored.group(1)) > 0, "TransferQueue restored nothing"
    after = {
        row["uid"].rsplit("_", 2)[0] for rows in dumped_rows(qs / "async_c-rollouts").values() for row in rows
    }
    assert any(uid.startswith("s00000002-") for uid in after), sorted(after)
    expected, count = async_replay(qs / "async_b-rollouts", qs / "async_c-rollouts")
    resumed = saved_prior(qs, 4, "ckpt_async_b")
    assert_prior_equal(resumed, expected)
    assert int(resumed["W_glob"]["count"]) == count == 4 * ASYNC_PROMPTS * ASYNC_N
    # against async_a, which never stopped (1 rank; an async run's responses depend on timing, so the two
    # differ by sampling): the same number of rewards and groups, and global means within 0.15 (the
    # difference of two means of 256 rewards in [0, 1] has std <= 0.044: 3.4 std)
    e2e.succeeded("async_a")
    never_stopped = saved_prior(qs, 4, "ckpt_async_a")
    for key in ("W_glob", "W_means"):
        assert int(resumed[key]["count"]) == int(never_stopped[key]["count"]), key
    gap = abs(float(resumed["W_glob"]["mean"]) - float(never_stopped["W_glob"]["mean"]))
    assert gap <= 0.15, gap
    print(
        f"\n[verl colocate_async 2 ranks, resumed] mu_glob gap to async_a {gap:.4f}; {timing('async_b', 'async_c')}"
    )


# ----------------------------------------------------------------------------------------------------------
# the legacy trainer on 2 ranks: filter_groups, balance_batch, a resume
# ----------------------------------------------------------------------------------------------------------
def unreordered(rows: list[dict]) -> list[dict]:
    """The step's batch as generated, before ``balance_batch``: groups contiguous, in order of first
    appearance (the estimator's output per row depends on the row's reward, its group and the batch only)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["uid"]].append(row)
    return [row for members in groups.values() for row in members]


def replay_filtered(steps: list[list[dict]], name: str = "ebpo"):
    """The core estimator ``name`` fed each step as the adapter feeds it: saturated groups to ``observe``, the
    rest to ``est``; returns (estimator, per step the advantage of every row of the un-reordered batch)."""
    est = ebpo.get_estimator(name)
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


def test_legacy_two_ranks_with_filter_groups_and_a_resume(e2e, plugin_sandbox):
    # verl's legacy trainer (trainer.use_v1=false): 2 ranks, balance_batch, algorithm.filter_groups with the
    # positional reward (verl_positional_reward.py: each prompt's group has a fixed number of successes every
    # step, prompts 0 and 4 saturated, so filtered), steps 1-2 then a resume at step 2 for steps 3-4; the
    # estimator is a user's, running_mean_baseline of `--plugins my_estimators.py` (stateful), with the
    # fixture package installed beside it (its entry point). The policy is S2 (actor_rollout_ref.model.path=
    # builtin:gym, resolved by our launcher): verl's Qwen3 model and token builder, its chat-template rendering
    # of the messages our writer wrote, on chain_sum records of S2's gym mixture
    if legacy_cpu_refusal():
        pytest.skip(legacy_cpu_refusal())
    e2e.succeeded("legacy_a", "legacy_b")
    root = e2e.root_of("legacy_a")
    code, log = e2e.result("legacy_b")
    assert "Setting global step to 2" in log
    # both plugins are registered in the task runner's Ray process: the file through $EBPO_PLUGINS, which
    # our launcher set from --plugins, the package through its entry point
    for run in ("legacy_a", "legacy_b"):
        (line,) = [x for x in e2e.result(run)[1].splitlines() if "[ebpo] task runner on" in x]
        assert all(name in line for name in (FILE_ESTIMATOR, STATEFUL_ESTIMATOR, PKG_ESTIMATOR)), line
    rows = {**dumped_rows(root / "legacy_a-rollouts"), **dumped_rows(root / "legacy_b-rollouts")}
    assert sorted(rows) == [1, 2, 3, 4]
    index = prompt_index(root)

    # S2 trained: verl rendered every prompt with its ChatML template (the dump decodes the prompt without its
    # special tokens: "user\n<message>\nassistant"), the checkpoint is a qwen3, and the responses are S2's,
    # reasoning-gym's answer tags kept by verl's decode (they are not special tokens)
    every = [row for step_rows in rows.values() for row in step_rows]
    assert all(CHATML_TURN.fullmatch(row["input"].strip()) for row in every)
    config = json.loads(
        (root / "ckpt" / "global_step_4" / "actor" / "huggingface" / "config.json").read_text()
    )
    assert config["model_type"] == "qwen3"
    # verl's agent loop took its Qwen3 token builder (for the quickstart's Llama it has none, and says so)
    assert all(REPEATED_WARNING not in e2e.result(run)[1] for run in ("legacy_a", "legacy_b"))
    # the ground truth verl's reward call got is the row's gym entry, which the gym reward scores (the
    # positional reward trains; ebpo's gym reward reads S2's answers here, about a third of them right)
    truth = {text: row["reward_model"]["ground_truth"] for text, row in train_rows(root).items()}
    assert all(row["gts"] == truth[dumped_prompt(row["input"])] for row in every)
    gym = [compute_score("gym", row["output"], row["gts"]) for row in every]
    assert set(gym) <= {0.0, 1.0} and 0 < sum(gym) < len(gym)
    assert sum("<answer>" in row["output"] for row in every) >= len(every) // 2

    # every group's rewards are the positional reward's: index mod (N + 1) successes out of N
    for step_rows in rows.values():
        assert len(step_rows) == 8 * RANKS_N
        groups = defaultdict(list)
        for row in step_rows:
            groups[row["uid"]].append((dumped_prompt(row["input"]), row["score"]))
        assert len(groups) == 8
        for members in groups.values():
            assert len({prompt for prompt, _ in members}) == 1 and len(members) == RANKS_N
            assert sum(score for _, score in members) == successes(index[members[0][0]], RANKS_N)

    # each step's prompts are one epoch of the topic stream (8 prompts, reshuffled every epoch), also across
    # the resume, which falls on an epoch boundary (verl skips data.pt there; ebpo_sampler.pt carries on)
    expected = stream_prompts(root, "topic", 8, 4)
    for step in range(1, 5):
        firsts = [dumped_prompt(row["input"]) for row in unreordered(rows[step])][::RANKS_N]
        assert sorted(firsts) == sorted(expected[step - 1])
    assert expected[2] != expected[0]
    uid_order = {step: list(dict.fromkeys(row["uid"] for row in rows[step])) for step in rows}
    assert all(len(uids) == 8 for uids in uid_order.values())

    # balance_batch reordered the batches: some group's rows are not contiguous
    def contiguous(step_rows):
        uids = [row["uid"] for row in step_rows]
        return all(uids[i] == uids[i + 1] or uids[i] not in uids[i + 1 :] for i in range(len(uids) - 1))

    assert not all(contiguous(rows[s]) for s in rows)

    # every row's advantage = the estimator's on the un-reordered batch (its state carried over the steps, also
    # across the resume); its state after the run, in verl's checkpoint as EBPO's prior is: a replay of every
    # reward the driver saw
    load_plugins([str(MY_ESTIMATORS)])
    replayed, expected_adv = replay_filtered([unreordered(rows[s]) for s in range(1, 5)], STATEFUL_ESTIMATOR)
    for step in range(1, 5):
        got = torch.tensor([row["advantage"] for row in unreordered(rows[step])], dtype=torch.float64)
        torch.testing.assert_close(got, expected_adv[step - 1], rtol=1e-5, atol=1e-6)
    state = saved_state(root, 4, name=STATEFUL_ESTIMATOR)
    assert int(state["count"]) == 4 * 8 * RANKS_N  # filtered groups counted once
    assert_prior_equal(state, replayed.state_dict())

    # the filtered steps trained: finite losses; the estimator's metrics; the rollout used the current weights
    metrics = {
        **step_metrics(root / "legacy_a.metrics.jsonl"),
        **step_metrics(root / "legacy_b.metrics.jsonl"),
    }
    for step, values in metrics.items():
        assert torch.isfinite(torch.tensor(values["actor/pg_loss"])), step
        assert {"running_mean/baseline", "groups/all_fail"} <= set(values), step
        assert values["training/rollout_probs_diff_max"] < 1e-4, step
    print(f"\n[verl legacy 2 ranks] {timing('legacy_a', 'legacy_b')}")
