"""ebpo on verl's v1 trainer, piece by piece, against verl 0.9.1's own classes (no Ray): the replay buffer's
observation of cleared groups, checkpoint ordering and restore, cluster keys, the async-mode refusal, the
settings handed to the buffer. The end-to-end runs are in ``test_verl_e2e.py``."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
from ebpo.integrations.compat import trl_conflict  # noqa: E402

if trl_conflict():
    pytest.skip(trl_conflict(), allow_module_level=True)

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.v1 import replay_buffer as verl_buffer  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync  # noqa: E402
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402
from verl_helpers import LoopEBPO, loop_advantages, random_uneven_step, verl_config  # noqa: E402

import ebpo  # noqa: E402
import ebpo.integrations.verl as ev  # noqa: E402
from ebpo.integrations import ESTIMATOR_STATE_FILE  # noqa: E402
from ebpo.integrations.verl import v1  # noqa: E402


# ----------------------------------------------------------------------------------------------------------
# modes: sync and colocate_async everywhere, separate_async not on the CPU (verl needs a GPU checkpoint engine)
# ----------------------------------------------------------------------------------------------------------
def test_modes_that_run_are_accepted_and_separate_async_on_the_cpu_is_refused_by_name():
    for mode in ("sync", "colocate_async"):
        assert (
            v1.unsupported_mode(verl_config(f"trainer.v1.trainer_mode={mode}", "trainer.device=cpu")) is None
        )
    assert v1.unsupported_mode(verl_config("trainer.v1.trainer_mode=separate_async")) is None  # on GPUs
    line = v1.unsupported_mode(verl_config("trainer.v1.trainer_mode=separate_async", "trainer.device=cpu"))
    assert line is not None and "\n" not in line
    assert (
        "trainer.v1.trainer_mode=separate_async" in line and "trainer.v1.trainer_mode=colocate_async" in line
    )
    assert (
        v1.trainer_class(verl_config("trainer.v1.trainer_mode=colocate_async")) is v1.EBPOTrainerColocateAsync
    )
    assert v1.trainer_class(verl_config()) is v1.EBPOTrainerSync
    with pytest.raises(ValueError, match="not one of verl's v1 modes"):
        v1.trainer_class(verl_config("trainer.v1.trainer_mode=fully_async"))


def test_the_buffer_named_in_an_async_mode_is_the_async_one():
    # verl's launcher builds the class it is named (EBPOReplayBuffer) in every mode
    buffer = v1.EBPOReplayBuffer(
        trainer_mode="colocate_async",
        trainer_config={},
        max_off_policy_threshold=8,
        max_off_policy_strategy="drop",
        sampler_kwargs={"ebpo": {"estimator": "ebpo", "estimator_options": {}, "train_batch_size": 2}},
    )
    assert type(buffer) is v1.EBPOReplayBufferAsync
    assert isinstance(buffer, ReplayBufferAsync) and buffer.max_off_policy_threshold == 8


def test_a_group_lag_counts_from_its_oldest_response():
    # step 5 trains version 4; group a: responses from versions 4 and 2 (partial rollout: 2..4) -> lag 2
    tags = [{"min_global_steps": 4}, {"min_global_steps": 2}, {"min_global_steps": 4}]
    assert v1.group_lags(5, ["a", "a", "b"], tags) == {"a": 2, "b": 0}
    assert v1.group_lags(5, ["a"], [{"status": "success"}]) is None  # a rollout that records no version


def test_entry_point_refuses_separate_async_on_the_cpu_before_ray_starts(tmp_path):
    # the whole command: one line on stderr, exit status 1, no Ray (it would print "Started a local Ray")
    overrides = ["trainer.v1.trainer_mode=separate_async", "trainer.device=cpu"]
    result = subprocess.run(
        [sys.executable, "-m", "ebpo.integrations.verl", *overrides],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,  # an import of verl: seconds, minutes on a loaded machine,
    )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if "trainer_mode" in line]
    assert lines == ["ebpo.integrations.verl: " + v1.unsupported_mode(verl_config(*overrides))]
    assert "Ray" not in result.stdout + result.stderr.replace(lines[0], "")


# ----------------------------------------------------------------------------------------------------------
# what the entry point hands the replay buffer
# ----------------------------------------------------------------------------------------------------------
def test_replay_buffer_settings_mirror_verls_own_buffer(tmp_path):
    plain = v1.replay_buffer_settings(verl_config("data.train_batch_size=8", "algorithm.adv_estimator=ebpo"))
    assert plain["filter_groups_metric"] is None and plain["gen_batch_size"] == 8
    assert plain["estimator"] == "ebpo" and plain["estimator_options"] == {}
    assert "poll_interval" not in plain and plain["observed_dir"] is None
    dapo = v1.replay_buffer_settings(
        verl_config(
            "data.train_batch_size=8",
            "algorithm.adv_estimator=ebpo",
            "+algorithm.ebpo.prior_memory=50",
            "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.metric=acc",
            "trainer.device=cpu",
            f"trainer.rollout_data_dir={tmp_path}",
        )
    )
    # verl's _build_replay_buffer: DAPO fetches prompts one at a time (exact refills)
    assert dapo["filter_groups_metric"] == "acc" and dapo["gen_batch_size"] == 1
    assert dapo["train_batch_size"] == 8 and dapo["max_inflight_gen_batches"] == 1
    assert dapo["estimator_options"] == {"prior_memory": 50} and dapo["poll_interval"] == 0.2
    assert dapo["observed_dir"] == str(tmp_path / "observed")
    with pytest.raises(ValueError, match="filter_groups.metric"):
        v1.replay_buffer_settings(
            verl_config("algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=''")
        )


# ----------------------------------------------------------------------------------------------------------
# the replay buffer: cleared groups feed the prior once
# ----------------------------------------------------------------------------------------------------------
class FakeTransferQueue:
    """The TransferQueue calls verl's replay buffer makes, in memory: prompt tags, trajectories' rm_scores and
    extra_fields (the rollout's draw number of each response)."""

    def __init__(self) -> None:
        self.tags: dict[str, dict] = {}
        self.scores: dict[str, torch.Tensor] = {}
        self.extra: dict[str, dict] = {}

    def add_group(
        self,
        uid: str,
        rewards: list[float],
        status: str = "finished",
        step: int = 1,
        draws: list | None = None,
    ) -> None:
        self.tags[uid] = {"is_prompt": True, "status": status, "global_steps": step}
        for session, reward in enumerate(rewards):
            key = f"{uid}_{session}_0"
            self.tags[key] = {"status": "success", "global_steps": step}
            self.scores[key] = torch.tensor([0.0, reward])  # verl puts the score on the last token
            self.extra[key] = {"global_steps": step - 1, "reward_extra_info": {"acc": reward}} | (
                {"ebpo_draw": draws[session]} if draws else {}
            )

    def kv_list(self, partition_id: str | None = None):
        return {"train": dict(self.tags)}

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        rows = {
            key: {"index": ord(key[0])} for key in self.scores
        }  # extra_info.index: the uid's first letter
        columns = {"rm_scores": self.scores, "extra_fields": self.extra, "extra_info": rows}
        return {field: [columns[field][key] for key in keys] for field in select_fields}

    def kv_clear(self, keys, partition_id):
        for key in keys:
            self.tags.pop(key, None)
            self.scores.pop(key, None)
            self.extra.pop(key, None)


def make_buffer(monkeypatch, fake: FakeTransferQueue, observed_dir=None, **settings) -> v1.EBPOReplayBuffer:
    monkeypatch.setattr(verl_buffer, "tq", fake)
    monkeypatch.setattr(v1, "tq", fake)
    ebpo_settings = {
        "estimator": "ebpo",
        "estimator_options": {},
        "observed_dir": observed_dir,
        "poll_interval": 0.0,
        **settings,
    }
    return v1.EBPOReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=8,  # verl's default (sync mode never reaches it)
        max_off_policy_strategy="drop",
        sampler_kwargs={"ebpo": ebpo_settings},
        refill_fn=lambda count: pytest.fail(f"no refill expected, asked for {count}"),
    )


def test_dapo_evicted_and_surplus_groups_reach_the_prior_once(monkeypatch, tmp_path):
    # four finished groups of 4: "a" all pass (DAPO evicts it), "b", "c", "d" mixed; a batch of 2 groups.
    # verl's sync DAPO takes 2 of b/c/d and discards the third as surplus
    fake = FakeTransferQueue()
    groups = {
        "a": [1.0, 1.0, 1.0, 1.0],
        "b": [1.0, 0.0, 0.0, 0.0],
        "c": [0.0, 1.0, 1.0, 0.0],
        "d": [1, 1, 1, 0.0],
    }
    for uid, rewards in groups.items():
        fake.add_group(uid, rewards)
    buffer = make_buffer(
        monkeypatch,
        fake,
        observed_dir=str(tmp_path),
        filter_groups_metric="acc",  # what verl's reward managers record per response (the score: 0 or 1)
        train_batch_size=2,
        gen_batch_size=1,
    )
    batch, metrics = buffer.sample(global_steps=3, partition_id="train", batch_size=2)
    trained = {key.split("_")[0] for key in batch.keys}
    assert len(trained) == 2 and trained < {"b", "c", "d"} and len(batch.keys) == 8
    (surplus,) = {"b", "c", "d"} - trained
    # verl's own counts, and ours: the evicted group and the surplus one were observed, nothing else
    assert metrics["training/filter_groups/evicted_samples"] == 1
    assert metrics["training/filter_groups/discarded_surplus_samples"] == 1
    assert metrics["ebpo/observed_groups"] == 2
    assert metrics["ebpo/observed_reward_sum"] == sum(groups["a"]) + sum(groups[surplus])
    lines = (tmp_path / "3.jsonl").read_text().splitlines()
    assert sorted(lines) == sorted(
        f'{{"uid": "{uid}", "rewards": {[float(r) for r in groups[uid]]}, "index": {ord(uid)}}}'
        for uid in ("a", surplus)
    )
    # the prior holds exactly those 8 rewards: the core estimator observing the same two groups
    est = ev.HOLDER.get("ebpo")
    expected = ebpo.get_estimator("ebpo")
    rewards = torch.tensor(groups["a"] + groups[surplus], dtype=torch.float64)
    expected.observe(rewards, ["a"] * 4 + [surplus] * 4)
    assert est.state_dict()["prior"]["W_glob"] == pytest.approx(expected.state_dict()["prior"]["W_glob"])
    assert int(est.state_dict()["prior"]["W_glob"]["count"]) == 8
    # cleared groups are gone from TransferQueue: a second sample cannot observe them again
    assert "a" not in fake.tags and surplus not in fake.tags
    fake.add_group("f", [0.0, 1.0, 0.0, 1.0], step=4)
    fake.add_group("g", [1.0, 1.0, 0.0, 1.0], step=4)
    _, metrics = buffer.sample(global_steps=4, partition_id="train", batch_size=2)
    assert "ebpo/observed_groups" not in metrics
    assert int(est.state_dict()["prior"]["W_glob"]["count"]) == 8


def test_a_batch_lists_each_groups_rows_in_the_order_they_were_drawn(monkeypatch):
    # verl lists finished trajectories as they finished and numbers a group's sessions as its requests were
    # tokenized (in a thread pool): both vary from run to run. Our buffer lists groups by uid and a group's
    # rows by the rollout's draw number (the seed each response was sampled from), so a repeated run trains
    # on the same rows in the same order
    fake = FakeTransferQueue()
    fake.add_group("s2-r1", [1.0, 0.0, 1.0], draws=[2, 0, 1])
    fake.add_group("s2-r0", [0.0, 1.0, 1.0], draws=[1, 2, 0])
    fake.add_group("s2-r2", [0.0, 1.0], draws=None)  # a rollout without draw numbers (vLLM): by session
    buffer = make_buffer(monkeypatch, fake)
    batch, _ = buffer.sample(global_steps=2, partition_id="train", batch_size=3)
    assert batch.keys == [
        "s2-r0_2_0",  # draw 0
        "s2-r0_0_0",  # draw 1
        "s2-r0_1_0",  # draw 2
        "s2-r1_1_0",
        "s2-r1_2_0",
        "s2-r1_0_0",
        "s2-r2_0_0",
        "s2-r2_1_0",
    ]
    assert len(batch.tags) == 8 and all(tag["status"] == "success" for tag in batch.tags)


@pytest.mark.parametrize("seed", range(6))
def test_uneven_groups_after_rejection_equal_a_loop_reference(seed):
    # v1's advantage call (compute_advantage_for_multi_trajectories, keys {uid}_{session}_{index}) on steps
    # whose responses were rejected at random (0..G rows of a group left, some partly masked), with the
    # all-zero padding rows v1 adds to divide the batch over the ranks, against EBPO written as loops
    from verl import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    gen = torch.Generator().manual_seed(seed)
    reference = LoopEBPO()
    for step in range(4):
        rewards_N, mask_BT, uids, token_BT = random_uneven_step(gen, step)
        pad = 2
        token_BT = torch.cat([token_BT, torch.zeros(pad, token_BT.shape[1])])
        mask_BT = torch.cat([mask_BT, torch.zeros(pad, mask_BT.shape[1])])
        keys = [f"{uid}_{i}_0" for i, uid in enumerate(uids)] + [f"pad{i}_0_0" for i in range(pad)]
        all_uids = uids + [f"pad{i}" for i in range(pad)]
        data = DataProto.from_dict(
            tensors={"token_level_rewards": token_BT, "response_mask": mask_BT},
            non_tensors={"uid": np.array(all_uids, dtype=object)},
        )
        algorithm = OmegaConf.create({"adv_estimator": "ebpo", "gamma": 1.0, "lam": 1.0})
        out = compute_advantage_for_multi_trajectories(
            data, batch_keys=keys, adv_estimator="ebpo", num_repeat=4, config=algorithm
        )
        expected_N = loop_advantages(reference, torch.cat([rewards_N, torch.zeros(pad)]), mask_BT, all_uids)
        torch.testing.assert_close(
            out.batch["advantages"], (expected_N.unsqueeze(1) * mask_BT).float(), rtol=1e-5, atol=1e-5
        )
    if reference.rewards:
        prior = ev.HOLDER.get("ebpo").state_dict()["prior"]
        assert int(prior["W_glob"]["count"]) == len(reference.rewards)


def test_validation_and_failed_groups_never_reach_the_prior(monkeypatch):
    # validation groups are not training data; a failed group (a session errored) is incomplete
    fake = FakeTransferQueue()
    fake.add_group("v", [1.0, 1.0])
    fake.add_group("e", [1.0, 0.0], status="failure")
    buffer = make_buffer(monkeypatch, fake)
    buffer._sync_metadata_from_transfer_queue()
    assert buffer.failure_keys["train"] == {"e"}
    buffer.finished_keys["val"] = {"v"}
    buffer._clear_groups("val", {"v"})
    buffer._clear_groups("train", {"e"})
    assert "ebpo" not in ev.HOLDER.state_dict() and "e" not in fake.tags


# ----------------------------------------------------------------------------------------------------------
# the trainer subclass: checkpoint order and restore, cluster keys, metrics
# ----------------------------------------------------------------------------------------------------------
def bare_trainer(tmp_path, **trainer_keys) -> v1.EBPOTrainerSync:
    """An ``EBPOTrainerSync`` without workers (its checkpoint methods need only config and counters)."""
    trainer = object.__new__(v1.EBPOTrainerSync)
    trainer.config = OmegaConf.create(
        {
            "trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto", "resume_from_path": None}
            | trainer_keys,
            "algorithm": {"adv_estimator": "ebpo"},
        }
    )
    trainer.train_dataloader = SimpleNamespace(sampler=None)
    trainer.steps_per_epoch = 4
    return trainer


def test_state_is_written_before_verl_marks_the_checkpoint_complete(monkeypatch, tmp_path):
    ev.HOLDER.get("ebpo")(torch.tensor([1.0, 0.0, 1.0, 1.0]), ["u", "u", "w", "w"])
    seen = {}

    def verl_save(self):  # what verl's _save_checkpoint ends with: the "latest" mark, then on_save
        seen["state_before_mark"] = (tmp_path / "global_step_3" / ESTIMATOR_STATE_FILE).is_file()
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(str(self.global_steps))

    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", verl_save)
    trainer = bare_trainer(tmp_path)
    trainer.global_steps = 3
    trainer._save_checkpoint()
    assert seen == {"state_before_mark": True}
    saved = torch.load(tmp_path / "global_step_3" / ESTIMATOR_STATE_FILE, weights_only=False)
    assert int(saved["ebpo"]["state"]["prior"]["W_glob"]["count"]) == 4

    # resume_mode=auto: verl's latest mark picks global_step_3; the prior comes back with it
    ev.HOLDER.reset()

    def verl_load(self):
        self.global_steps = 3

    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", verl_load)
    bare_trainer(tmp_path)._load_checkpoint()
    assert int(ev.HOLDER.get("ebpo").state_dict()["prior"]["W_glob"]["count"]) == 4


def test_a_checkpoint_without_the_state_file_warns_in_one_line(monkeypatch, tmp_path, capsys):
    (tmp_path / "global_step_2").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", lambda self: setattr(self, "global_steps", 2))
    bare_trainer(tmp_path)._load_checkpoint()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and ESTIMATOR_STATE_FILE in err[0] and "global_step_2" in err[0]


def test_cluster_keys_are_recorded_when_prompts_are_fetched(monkeypatch, tmp_path):
    from verl.utils import tensordict_utils as tu

    def verl_fetch(self):  # a dataloader chunk as verl's _fetch_one_gen_batch returns it
        return tu.get_tensordict(
            {
                "input_ids": torch.zeros(3, 2, dtype=torch.long),
                "uid": np.array(["p", "q", "r"], dtype=object),
                "extra_info": np.array([{"topic": "max"}, {"topic": "mod"}, {"topic": "max"}], dtype=object),
            }
        )

    monkeypatch.setattr(PPOTrainerSync, "_fetch_one_gen_batch", verl_fetch)
    trainer = bare_trainer(tmp_path)
    trainer.global_steps = 5
    batch = trainer._fetch_one_gen_batch()
    # verl's random uuid4 uids are replaced by the prompts' places in the run: step 5, first fetch, rows 0-2
    p, q, r = (v1.prompt_uid(5, 0, row) for row in range(3))
    assert list(batch["uid"]) == [p, q, r] and p < q < r
    assert ev.HOLDER.clusters_for([r, p, q]) == ["max", "max", "mod"]
    assert [trainer._fetch_one_gen_batch()["uid"][0] for _ in range(2)] == [
        v1.prompt_uid(5, f, 0) for f in (1, 2)
    ]
    trainer.global_steps = 6
    assert trainer._fetch_one_gen_batch()["uid"][0] == v1.prompt_uid(6, 0, 0) > v1.prompt_uid(5, 2, 0)
    assert "_" not in p  # verl splits its keys {uid}_{session}_{index} at "_"
    # a padding row (all-zero mask, uid unknown) does not hide the others' clusters
    assert ev.HOLDER.clusters_for([p, "pad0"], [True, False]) == ["max", None]
    assert ev.HOLDER.clusters_for([p, "pad0"]) is None


def test_estimator_does_not_filter_again_when_the_buffer_does():
    # v1: the replay buffer filtered already (on any metric, here acc); a saturated group among the kept
    # rows (rejection left only equal rewards) is trained on, not dropped a second time
    from verl.trainer.ppo import core_algos

    fn = core_algos.get_adv_estimator_fn("ebpo")
    algorithm = OmegaConf.create(
        {"adv_estimator": "ebpo", "filter_groups": {"enable": True, "metric": "acc"}}
    )
    rewards_BT = torch.tensor([[1.0], [1.0], [0.0], [1.0]])
    mask_BT = torch.ones(4, 1)
    ev.HOLDER.managed = True
    ev.HOLDER.filter_in_estimator = False
    adv_BT, _ = fn(rewards_BT, mask_BT, index=np.array(["s", "s", "m", "m"], dtype=object), config=algorithm)
    assert ev.HOLDER.filtered_uids == set()
    assert int(ev.HOLDER.get("ebpo").state_dict()["prior"]["W_glob"]["count"]) == 4
    assert adv_BT[2, 0] < 0 < adv_BT[3, 0]


class MyReplayBuffer(v1.EBPOReplayBuffer):
    """A user's buffer built on ours (the entry point keeps it)."""


def test_entry_point_routes_the_replay_buffer_and_names_bad_settings():
    from ebpo.integrations.verl.main import _configure_v1

    cfg = verl_config("algorithm.adv_estimator=ebpo", "data.train_batch_size=8")
    _configure_v1(cfg)
    assert dict(cfg.trainer.v1.sampler.custom_sampler) == {
        "path": "pkg://ebpo.integrations.verl.v1",
        "name": "EBPOReplayBuffer",
    }
    assert cfg.trainer.v1.sampler.sampler_kwargs.ebpo.estimator == "ebpo"
    own = verl_config(
        "trainer.v1.sampler.custom_sampler.path=pkg://test_verl_v1",
        "trainer.v1.sampler.custom_sampler.name=MyReplayBuffer",
    )
    _configure_v1(own)
    assert own.trainer.v1.sampler.custom_sampler.name == "MyReplayBuffer"
    foreign = verl_config(
        "trainer.v1.sampler.custom_sampler.path=pkg://verl.trainer.ppo.v1.replay_buffer",
        "trainer.v1.sampler.custom_sampler.name=ReplayBuffer",
    )
    with pytest.raises(SystemExit, match="subclass of ebpo.integrations.verl.v1.EBPOReplayBuffer"):
        _configure_v1(foreign)
    with pytest.raises(
        SystemExit, match="^ebpo.integrations.verl: algorithm.filter_groups.metric must be set"
    ):
        _configure_v1(verl_config("algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=''"))
