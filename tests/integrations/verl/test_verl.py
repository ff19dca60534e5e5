"""ebpo.integrations.verl against verl 0.9's own code: compute_advantage, DataProto, RLHFDataset, dataloader,
rollout-correction rejection, group filtering, the CPU mode's pieces. Runs in the ``ebpo[verl]`` environment
(``.venv-verl``); in an environment with TRL 1.x it is skipped with the conflict's message."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
omegaconf = pytest.importorskip("omegaconf")
from ebpo.integrations.compat import trl_conflict  # noqa: E402

if trl_conflict():
    pytest.skip(trl_conflict(), allow_module_level=True)

from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl_helpers import LoopEBPO, loop_advantages, random_uneven_step  # noqa: E402

import ebpo  # noqa: E402
import ebpo.integrations.verl as ev  # noqa: E402
from ebpo.data.records import Record  # noqa: E402
from ebpo.data.samplers import StreamSampler, get_sampler  # noqa: E402

OmegaConf = omegaconf.OmegaConf


def algo_config(name: str, **options) -> omegaconf.DictConfig:
    """verl's algorithm section as Hydra builds it from ``algorithm.adv_estimator=<name> +algorithm.<name>.k=v``."""
    cfg = {"adv_estimator": name, "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True}
    if options:
        cfg[name] = options
    return OmegaConf.create(cfg)


def make_batch(rewards_N, lengths_N, uids, width: int, gen: torch.Generator | None = None) -> DataProto:
    """A DataProto as verl's fit builds it: the reward on the last response token, zeros elsewhere (verl's
    reward managers write it there; its estimators and ours read ``token_level_rewards.sum(-1)``)."""
    n = len(rewards_N)
    mask_BT = (torch.arange(width).unsqueeze(0) < torch.as_tensor(lengths_N).unsqueeze(1)).float()
    token_BT = torch.zeros(n, width)
    token_BT[torch.arange(n), torch.as_tensor(lengths_N) - 1] = torch.as_tensor(
        rewards_N, dtype=torch.float32
    )
    return DataProto.from_dict(
        tensors={"token_level_rewards": token_BT, "response_mask": mask_BT},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


def random_step(gen: torch.Generator, num_prompts: int, group: int, width: int, step: int):
    rewards_N = torch.randint(0, 2, (num_prompts * group,), generator=gen).float()
    lengths_N = torch.randint(1, width + 1, (num_prompts * group,), generator=gen)
    uids = [f"s{step}-p{i % num_prompts}" for i in range(num_prompts * group)]  # groups interleaved
    return rewards_N, lengths_N, uids


def test_registers_only_what_verl_lacks():
    # verl 0.9 ships grpo / rloo / reinforce_plus_plus_baseline itself; ours go under the names it lacks
    assert set(ev.REGISTERED) == set(ebpo.list_estimators()) - {"grpo", "rloo"}
    assert "ebpo" in ev.REGISTERED
    assert core_algos.get_adv_estimator_fn("ebpo").__ebpo_estimator__ == "ebpo"
    assert core_algos.get_adv_estimator_fn("grpo").__module__.startswith("verl.")
    assert ev.register_with_verl() == ev.REGISTERED  # importing twice is harmless


def test_dr_grpo_by_hand_through_compute_advantage():
    # one group, rewards [1, 0, 0, 1]: mean 0.5, so Dr. GRPO's advantage is r - 0.5 = [+.5, -.5, -.5, +.5],
    # spread over each response's tokens (lengths 3, 1, 2, 4) and 0 on padding
    gen = torch.Generator().manual_seed(1)
    data = make_batch([1.0, 0.0, 0.0, 1.0], [3, 1, 2, 4], ["a"] * 4, width=4, gen=gen)
    out = compute_advantage(data, adv_estimator="dr_grpo", config=algo_config("dr_grpo"))
    expected = torch.tensor(
        [[0.5, 0.5, 0.5, 0.0], [-0.5, 0.0, 0.0, 0.0], [-0.5, -0.5, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]]
    )
    torch.testing.assert_close(out.batch["advantages"], expected)
    torch.testing.assert_close(out.batch["returns"], expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ebpo_through_verl_equals_core_over_steps(seed):
    gen = torch.Generator().manual_seed(seed)
    num_prompts, group, width = int(torch.randint(2, 7, (1,), generator=gen)), 4, 9
    options = {"prior_scope": "global", "normalize": "batch"}
    reference = ebpo.get_estimator("ebpo", **options)
    for step in range(3):  # the prior carries over: step 3 depends on steps 1-2
        rewards_N, lengths_N, uids = random_step(gen, num_prompts, group, width, step)
        data = make_batch(rewards_N, lengths_N, uids, width, gen)
        out = compute_advantage(
            data, adv_estimator="ebpo", num_repeat=group, config=algo_config("ebpo", **options)
        )
        expected_N = reference(rewards_N, np.array(uids, dtype=object))
        torch.testing.assert_close(
            out.batch["advantages"], expected_N.unsqueeze(1) * data.batch["response_mask"]
        )
        assert torch.isfinite(out.batch["advantages"]).all()
    assert ev.HOLDER.metrics() == pytest.approx(reference.metrics())
    assert ev.HOLDER.metrics()["ebpo/mu_glob"] == pytest.approx(reference.metrics()["ebpo/mu_glob"])


@pytest.mark.parametrize("name", ["dr_grpo", "jspo", "reinforce_pp_baseline"])
def test_other_registered_estimators_equal_core(name):
    gen = torch.Generator().manual_seed(7)
    rewards_N, lengths_N, uids = random_step(gen, num_prompts=5, group=4, width=6, step=0)
    rewards_N = rewards_N + torch.rand(20, generator=gen)  # shaped rewards
    data = make_batch(rewards_N, lengths_N, uids, 6, gen)
    out = compute_advantage(data, adv_estimator=name, config=algo_config(name))
    expected_N = ebpo.get_estimator(name)(rewards_N, np.array(uids, dtype=object))
    torch.testing.assert_close(out.batch["advantages"], expected_N.unsqueeze(1) * data.batch["response_mask"])


def test_cluster_prior_gets_keys_from_the_trainer_hook():
    # EBPORayPPOTrainer._get_gen_batch records uid -> extra_info.topic from verl's own batch; build the object
    # without workers (the hook only touches the config and the DataProto)
    trainer = object.__new__(ev.EBPORayPPOTrainer)
    trainer.config = OmegaConf.create(
        {
            "algorithm": algo_config(
                "ebpo", prior_scope="cluster", cluster_min_groups=1, cluster_key="extra_info.topic"
            )
        }
    )
    gen = torch.Generator().manual_seed(3)
    topics = ["alg", "geo", "alg"]
    prompt_batch = DataProto.from_dict(
        tensors={"dummy_tensor": torch.zeros(3, 1)},
        non_tensors={
            "uid": np.array(["u0", "u1", "u2"], dtype=object),
            "extra_info": np.array([{"index": i, "topic": t} for i, t in enumerate(topics)], dtype=object),
            "raw_prompt": np.array(["x", "y", "z"], dtype=object),
        },
    )
    gen_batch = trainer._get_gen_batch(prompt_batch)
    assert "raw_prompt" in gen_batch.non_tensor_batch  # verl's own split still happened
    rewards_N = torch.tensor([1.0, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1, 0])
    uids = [f"u{i // 4}" for i in range(12)]
    data = make_batch(rewards_N, [2] * 12, uids, 3, gen)
    options = {"prior_scope": "cluster", "cluster_min_groups": 1}
    out = compute_advantage(data, adv_estimator="ebpo", config=trainer.config.algorithm)
    expected_N = ebpo.get_estimator("ebpo", **options)(
        rewards_N, uids, cluster=[topics[i // 4] for i in range(12)]
    )
    torch.testing.assert_close(out.batch["advantages"][:, 0], expected_N)
    # the next batch has no recorded clusters: a clear error, not a silent global prior
    with pytest.raises(ValueError, match="cluster_key"):
        compute_advantage(
            make_batch(rewards_N, [2] * 12, uids, 3, gen),
            adv_estimator="ebpo",
            config=trainer.config.algorithm,
        )


def test_estimator_state_round_trips_through_checkpoint_dir(tmp_path):
    gen = torch.Generator().manual_seed(11)
    cfg = algo_config("ebpo", prior_memory=20.0)
    steps = [random_step(gen, 3, 4, 5, s) for s in range(4)]
    batches = [make_batch(r, n, u, 5, gen) for r, n, u in steps]
    for data in batches[:2]:
        compute_advantage(data, adv_estimator="ebpo", config=cfg)
    # what EBPORayPPOTrainer._save_checkpoint writes beside verl's actor/ and data.pt, and verl's tracker file
    folder = tmp_path / "ckpts" / "global_step_2"
    path = ev.save_estimator_state(folder)
    assert path.name == ev.ESTIMATOR_STATE_FILE == "ebpo_estimator.pt"
    (tmp_path / "ckpts" / "latest_checkpointed_iteration.txt").write_text("2")
    continued = [
        compute_advantage(d, adv_estimator="ebpo", config=cfg).batch["advantages"] for d in batches[2:]
    ]

    ev.HOLDER.reset()  # a new process
    trainer_cfg = OmegaConf.create({"resume_mode": "auto", "default_local_dir": str(tmp_path / "ckpts")})
    resume_folder = ev.resolve_resume_folder(trainer_cfg)
    assert resume_folder == str(folder)
    assert ev.load_estimator_state(resume_folder)
    resumed = [
        compute_advantage(d, adv_estimator="ebpo", config=cfg).batch["advantages"] for d in batches[2:]
    ]
    for a, b in zip(continued, resumed):
        torch.testing.assert_close(a, b)
    # a fresh prior gives different advantages, so the comparison above can fail
    ev.HOLDER.reset()
    fresh = compute_advantage(batches[2], adv_estimator="ebpo", config=cfg).batch["advantages"]
    assert not torch.allclose(fresh, continued[0])
    assert not ev.load_estimator_state(tmp_path / "nothing-here")
    assert ev.resolve_resume_folder(OmegaConf.create({"resume_mode": "disable"})) is None


def test_estimator_state_file_refused_or_damaged_is_one_line(tmp_path, monkeypatch):
    import errno
    import os

    from ebpo.persist import DamagedFile, WriteError

    folder = tmp_path / "global_step_2"
    path = ev.save_estimator_state(folder)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # cut short
    with pytest.raises(DamagedFile) as err:
        ev.load_estimator_state(folder)
    assert str(err.value).startswith(f"{path} is damaged and cannot be read (") and "\n" not in str(err.value)

    def over_quota(state, handle):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(torch, "save", over_quota)
    with pytest.raises(WriteError, match=rf"^cannot write {path}: disk quota exceeded; {path} is as it was$"):
        ev.save_estimator_state(folder)


@pytest.mark.parametrize("shell", [False, True], ids=["open", "os.system"])
def test_state_files_that_would_run_code_are_refused_unread(tmp_path, shell):
    from ebpo.persist import UnsafeFile
    from helpers.payloads import write_payload

    folder, marker = tmp_path / "global_step_2", tmp_path / "created-by-the-pickle"
    folder.mkdir()
    named = "posix.system" if shell else "io.open"
    for name, load in (
        (ev.ESTIMATOR_STATE_FILE, lambda: ev.load_estimator_state(folder)),
        (
            ev.SAMPLER_STATE_FILE,
            lambda: ev.load_sampler_state(folder, StreamSampler(get_sampler("topic", ["a"], 1))),
        ),
    ):
        path = write_payload(folder / name, marker, shell=shell)
        with pytest.raises(UnsafeFile) as err:
            load()
        assert not marker.exists()
        assert str(err.value) == (
            f"{path} holds a pickle that would run code to load ({named}), and ebpo loads only tensors, "
            "numbers, strings, lists and dicts from a state file: it was left unread; resume from an earlier "
            "global_step_N folder (trainer.resume_from_path), or delete the file"
        )


def test_a_resume_with_other_estimator_options_names_the_file_and_each_option(tmp_path):
    gen = torch.Generator().manual_seed(0)
    r, n, u = random_step(gen, 2, 4, 3, 0)
    compute_advantage(make_batch(r, n, u, 3, gen), adv_estimator="ebpo", config=algo_config("ebpo"))
    folder = tmp_path / "global_step_1"
    path = ev.save_estimator_state(folder)
    assert torch.load(path, weights_only=True)["ebpo"]["state"]["options"]["tau2"] == "raw"  # plain data
    ev.HOLDER.reset()  # a new process, resuming with other options
    assert ev.load_estimator_state(folder)
    with pytest.raises(ValueError) as err:
        compute_advantage(
            make_batch(r, n, u, 3, gen), adv_estimator="ebpo", config=algo_config("ebpo", tau2="latent")
        )
    assert str(err.value) == (
        f"{path}: EBPO checkpoint was written with other options: tau2='raw' (this estimator: 'latent'); "
        "build the estimator with the checkpoint's options to continue its prior, or start without the "
        "checkpoint's state"
    )


def test_changing_options_mid_run_is_refused():
    gen = torch.Generator().manual_seed(0)
    r, n, u = random_step(gen, 2, 4, 3, 0)
    compute_advantage(make_batch(r, n, u, 3, gen), adv_estimator="ebpo", config=algo_config("ebpo"))
    with pytest.raises(ValueError, match="keep algorithm.ebpo fixed"):
        compute_advantage(
            make_batch(r, n, u, 3, gen), adv_estimator="ebpo", config=algo_config("ebpo", tau2="latent")
        )


# ----------------------------------------------------------------------------------------------------------
# samplers through verl's RLHFDataset and StatefulDataLoader
# ----------------------------------------------------------------------------------------------------------
TOPICS = ["alg", "geo", "prob"]


@pytest.fixture(scope="module")
def verl_parquet(tmp_path_factory):
    # 24 prompts, 8 per topic, difficulty a distinct pass rate per prompt
    records = [
        Record(
            id=f"q{i}",
            prompt=f"{i}+{i}=?",
            answer=str(2 * i),
            topic=TOPICS[i % 3],
            difficulty=((i * 7) % 24) / 23,
        )
        for i in range(24)
    ]
    path = ev.write_verl_parquet(
        records, tmp_path_factory.mktemp("verl-data") / "train.parquet", data_source="arith"
    )
    return path, records


def data_config(tmp_path, sampler_class: str, batch_size: int) -> omegaconf.DictConfig:
    return OmegaConf.create(
        {
            "train_batch_size": batch_size,
            "gen_batch_size": None,
            "shuffle": False,
            "seed": 5,
            "prompt_key": "prompt",
            "max_prompt_length": 64,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "cache_dir": str(tmp_path / "cache"),
            "sampler": {"class_path": "pkg://ebpo.integrations.verl", "class_name": sampler_class},
        }
    )


def build_loader(path, cfg, tiny_model_dir):
    from torchdata.stateful_dataloader import StatefulDataLoader
    from transformers import AutoTokenizer
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.dataset.rl_dataset import collate_fn

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = create_rl_dataset(str(path), cfg, tokenizer, None, is_train=True)
    sampler = ev.create_sampler(cfg, dataset)
    loader = StatefulDataLoader(
        dataset,
        batch_size=cfg.train_batch_size,
        sampler=sampler,
        collate_fn=collate_fn,
        drop_last=True,
        num_workers=0,
    )
    return dataset, sampler, loader


def batch_ids(batch) -> list[int]:
    return [int(info["index"]) for info in batch["extra_info"]]


def test_parquet_rows_have_verls_format(verl_parquet):
    import pyarrow.parquet as pq

    path, records = verl_parquet
    row = pq.read_table(path).to_pylist()[3]
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].startswith("3+3=?")
    assert row["reward_model"] == {"style": "rule", "ground_truth": "6"}
    assert row["extra_info"]["topic"] == "alg" and row["extra_info"]["index"] == 3
    assert row["data_source"] == "arith" and row["ability"] == "math"


def test_chat_rows_render_in_verl_to_the_ids_ebpo_gives(chat_model_dir, tmp_path):
    # the tiny Qwen3 chat model: verl's dataset hands the row's messages to its agent loop, whose Qwen3
    # builder renders them with the chat template; the ids are those of ebpo train and ebpo eval
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from ebpo.data.prompts import PromptFormat
    from ebpo.tasks import arith

    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    dapo = Record(
        id="d", prompt="flat", answer="1", extra={"messages": [{"role": "user", "content": "1+0?"}]}
    )
    records = [*arith.generate("train", 4, seed=0), dapo]
    path = ev.write_verl_parquet(records, tmp_path / "train.parquet", data_source="arith", instruction="")
    rows = pq.read_table(path).to_pylist()
    assert rows[0]["prompt"] == [{"role": "user", "content": records[0].prompt}]
    assert rows[-1]["prompt"] == [{"role": "user", "content": "1+0?"}]  # a loader's own conversation
    builder = create_continuous_token_builder(tokenizer, hf_model_type="qwen3")
    ours = PromptFormat.resolve(tokenizer, "auto")
    assert [builder.build_initial_tokens(row["prompt"]) for row in rows] == ours.ids(records)
    from verl.trainer.ppo.utils import create_rl_dataset

    dataset = create_rl_dataset(
        str(path), data_config(tmp_path, "TopicSampler", 1), tokenizer, None, is_train=True
    )
    assert [list(dataset[i]["raw_prompt"]) for i in range(len(rows))] == [row["prompt"] for row in rows]


def test_gym_records_reach_verls_reward_call_as_the_entry(tmp_path, tiny_model_dir):
    """A gym task's records through our writer and verl's own dataset: the ground truth verl hands the reward is
    the record's answer (the reasoning-gym entry), and ``compute_score`` scores it with the dataset's score_answer."""
    pytest.importorskip("reasoning_gym", reason="the gym tasks need the ebpo[gym] extra")
    import json

    from ebpo.integrations.verl.rewards import compute_score
    from ebpo.tasks import get_task

    records = get_task("gym:chain_sum", chain_sum={"max_terms": 2, "max_digits": 1}).generate(
        "train", 4, seed=0
    )
    path = ev.write_verl_parquet(records, tmp_path / "gym.parquet", data_source="gym", instruction="")
    dataset, _, loader = build_loader(path, data_config(tmp_path, "TopicSampler", 2), tiny_model_dir)
    batch = next(iter(loader))
    for position, truth in zip(batch_ids(batch), batch["reward_model"]):
        record = records[position]
        assert truth["ground_truth"] == record.answer and batch["data_source"][0] == "gym"
        right = json.loads(record.answer)["answer"]
        assert compute_score("gym", f"<answer>{right}</answer>", truth["ground_truth"]) == 1.0
        assert compute_score("gym", f"<answer>{right}1</answer>", truth["ground_truth"]) == 0.0


def test_topic_sampler_drives_verl_dataloader(verl_parquet, tmp_path, tiny_model_dir):
    path, records = verl_parquet
    cfg = data_config(tmp_path, "TopicSampler", batch_size=4)
    dataset, sampler, loader = build_loader(path, cfg, tiny_model_dir)
    assert isinstance(sampler, ev.TopicSampler)
    epoch = [batch_ids(b) for b in loader]
    # 8 prompts per topic, batch 4: six single-topic batches, each topic's two batches back to back
    assert len(epoch) == 6
    topics = [{records[i].topic for i in b} for b in epoch]
    assert all(len(t) == 1 for t in topics)
    assert [t.pop() for t in topics[::2]] == [t.pop() for t in topics[1::2]]
    assert sorted(i for b in epoch for i in b) == list(range(24))
    # exactly the core stream's order with the same batch size and seed
    stream = get_sampler("topic", [r.topic for r in records], 4, seed=5)
    assert epoch == [stream.next_batch() for _ in range(6)]
    # the second epoch is the stream's second epoch (a new topic order), not a replay ...
    iterator = iter(loader)
    second = [batch_ids(next(iterator)) for _ in range(2)]
    state = loader.state_dict()  # what verl saves as data.pt, mid-way through epoch 2
    second += [batch_ids(b) for b in iterator]
    assert second == [stream.next_batch() for _ in range(6)]
    assert second != epoch
    # ... and a new process restoring data.pt continues epoch 2 where it stopped (not epoch 1's order)
    _, _, resumed = build_loader(path, cfg, tiny_model_dir)
    resumed.load_state_dict(state)
    assert [batch_ids(b) for b in resumed] == second[2:]


def test_topic_stream_goes_on_after_a_resume_at_an_epoch_boundary(verl_parquet, tmp_path, tiny_model_dir):
    """verl does not restore data.pt when a checkpoint ends an epoch ("next epoch will iterate from scratch"):
    without ebpo_sampler.pt a resumed run would replay the stream's first epoch. EBPORayPPOTrainer saves the
    cursor at every checkpoint and restores it at an epoch boundary (tests/integrations/verl/test_verl_e2e.py sees
    it through verl's own trainer)."""
    path, records = verl_parquet
    cfg = data_config(tmp_path, "TopicSampler", batch_size=4)
    _, sampler, loader = build_loader(path, cfg, tiny_model_dir)
    stream = get_sampler("topic", [r.topic for r in records], 4, seed=5)
    first = [batch_ids(b) for b in loader]  # epoch 1, used up: the checkpoint at its last step
    assert first == [stream.next_batch() for _ in range(6)]
    folder = tmp_path / "ckpt" / "global_step_6"
    saved = ev.save_sampler_state(folder, sampler)
    assert saved is not None and saved.name == ev.SAMPLER_STATE_FILE == "ebpo_sampler.pt"
    expected_second = [stream.next_batch() for _ in range(6)]
    assert expected_second != first

    _, fresh_sampler, fresh = build_loader(path, cfg, tiny_model_dir)  # a new process; data.pt not restored
    assert [batch_ids(b) for b in fresh] == first  # what verl alone would train on: epoch 1 again
    _, resumed_sampler, resumed = build_loader(path, cfg, tiny_model_dir)
    assert ev.load_sampler_state(folder, resumed_sampler)
    assert [batch_ids(b) for b in resumed] == expected_second
    # not a clustered sampler (verl's own RandomSampler): nothing written, nothing loaded
    assert ev.save_sampler_state(tmp_path / "other", object()) is None
    assert not ev.load_sampler_state(folder, object())


@pytest.mark.parametrize("taken", [6, 25])  # in the middle of a stream batch; in the second epoch
def test_a_resume_goes_on_with_the_first_prompt_not_handed_out(verl_parquet, tmp_path, tiny_model_dir, taken):
    """verl's v1 trainer under algorithm.filter_groups fetches prompts one at a time (gen_batch_size=1) and
    stops anywhere in a stream batch; the cursor it saves in data.pt (and ebpo_sampler.pt) is the first prompt
    not handed out, so the resumed run fetches exactly the prompts the uninterrupted one would."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.utils.dataset.rl_dataset import collate_fn

    path, records = verl_parquet
    cfg = data_config(tmp_path, "TopicSampler", batch_size=4)  # stream batches of 4, fetched one by one

    def one_at_a_time():
        dataset, sampler, _ = build_loader(path, cfg, tiny_model_dir)
        loader = StatefulDataLoader(
            dataset, batch_size=1, sampler=sampler, collate_fn=collate_fn, num_workers=0
        )
        return sampler, loader

    def fetch(loader, count: int, iterator=None) -> tuple[list[int], Any]:
        out = []
        while len(out) < count:
            try:
                out += batch_ids(next(iterator))
            except (StopIteration, TypeError):  # an epoch ends (or no iterator yet): verl starts the next
                iterator = iter(loader)
        return out, iterator

    _, loader = one_at_a_time()
    uninterrupted, _ = fetch(loader, taken + 10)
    stream = get_sampler("topic", [r.topic for r in records], 4, seed=5)
    assert uninterrupted == [i for _ in range(9) for i in stream.next_batch()][: taken + 10]

    sampler, loader = one_at_a_time()
    before, iterator = fetch(loader, taken)
    state = loader.state_dict()  # what verl writes to data.pt
    ev.save_sampler_state(tmp_path / "ckpt", sampler)  # and we to ebpo_sampler.pt
    resumed_sampler, resumed = one_at_a_time()
    resumed.load_state_dict(state)
    after, _ = fetch(resumed, 10, iterator=None if taken % 24 == 0 else iter(resumed))
    assert before + after == uninterrupted
    # ebpo_sampler.pt holds the same cursor (verl's v1 restores it at an epoch boundary)
    _, other = one_at_a_time()
    assert torch.load(tmp_path / "ckpt" / ev.SAMPLER_STATE_FILE, weights_only=False) == sampler.state_dict()


def test_sampler_class_name_that_is_no_class_is_named(tmp_path):
    """verl types the loaded object as ``object``; a name that is not callable (here a string constant of the
    package) fails with the config keys named, not ``'str' object is not callable``."""
    cfg = data_config(tmp_path, "ESTIMATOR_STATE_FILE", batch_size=4)
    with pytest.raises(ValueError) as err:
        ev.create_sampler(cfg, dataset=None)
    assert str(err.value) == (
        "data.sampler.class_name='ESTIMATOR_STATE_FILE' in pkg://ebpo.integrations.verl is a str, not a "
        "sampler class"
    )


def test_difficulty_sampler_is_easy_to_hard_and_resumes(verl_parquet, tmp_path, tiny_model_dir):
    path, records = verl_parquet
    cfg = data_config(tmp_path, "DifficultySampler", batch_size=6)
    _, _, loader = build_loader(path, cfg, tiny_model_dir)
    iterator = iter(loader)
    first = [batch_ids(next(iterator)) for _ in range(2)]
    state = loader.state_dict()  # what verl saves as data.pt
    rest = [batch_ids(b) for b in iterator]
    order = [i for b in first + rest for i in b]
    pass_rates = [records[i].difficulty for i in order]
    assert pass_rates == sorted(pass_rates, reverse=True)  # highest pass rate (easiest) first
    _, _, resumed_loader = build_loader(path, cfg, tiny_model_dir)
    resumed_loader.load_state_dict(state)
    assert [batch_ids(b) for b in resumed_loader] == rest


# ----------------------------------------------------------------------------------------------------------
# the paper's launch script composes against verl's own Hydra config
# ----------------------------------------------------------------------------------------------------------
PAPER_METHODS = [
    "ebpo-topic",
    "ebpo-diff",
    "ebpo-naive",
    "grpo",
    "grpo-diff",
    "dr-grpo",
    "dapo",
    "entropymech-clipcov",
    "entropymech-klcov",
]


def test_paper_launch_overrides_compose_with_verls_config(tmp_path):
    import subprocess
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from ebpo.integrations.verl.main import _config_dir

    script = Path(__file__).resolve().parents[3] / "examples" / "verl" / "run_paper.sh"
    env = {"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "DATA": str(tmp_path), "HOME": str(tmp_path)}
    composed = {}
    with initialize_config_dir(config_dir=_config_dir(), version_base=None):
        for method in PAPER_METHODS:
            argv = subprocess.run(
                ["bash", str(script), method], env=env, capture_output=True, text=True, check=True
            )
            words = argv.stdout.splitlines()
            module = words[2]
            composed[method] = (module, compose(config_name="ppo_trainer", overrides=words[3:]))
    for method, (module, cfg) in composed.items():  # the paper's shared settings, data from DATA
        assert module == "ebpo.integrations.verl" and cfg.data.train_files == f"{tmp_path}/train.parquet"
        assert cfg.data.train_batch_size == 512 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 128
        assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6 and cfg.actor_rollout_ref.rollout.n == 4
        if method not in ("dapo", "dr-grpo"):
            assert (
                cfg.actor_rollout_ref.actor.use_kl_loss and cfg.actor_rollout_ref.actor.kl_loss_coef == 0.001
            )
            assert cfg.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"  # verl's name for k3
    module, topic = composed["ebpo-topic"]
    assert module == "ebpo.integrations.verl" and topic.algorithm.adv_estimator == "ebpo"
    assert topic.data.sampler.class_name == "TopicSampler" and topic.trainer.total_training_steps == 1000
    _, diff = composed["ebpo-diff"]
    assert diff.data.sampler.class_name == "DifficultySampler" and diff.trainer.total_epochs == 1
    assert diff.trainer.total_training_steps is None and diff.data.shuffle is False
    assert composed["dr-grpo"][1].algorithm.adv_estimator == "dr_grpo"
    assert composed["dapo"][0] == "ebpo.integrations.verl"  # v1 (the default): its replay buffer filters
    assert composed["dapo"][1].trainer.use_v1 and composed["dapo"][1].algorithm.filter_groups.enable
    assert composed["dapo"][1].actor_rollout_ref.actor.clip_ratio_high == 0.28
    # EBPO's options reach the estimator from `+algorithm.ebpo.*` exactly as Hydra composes them
    with initialize_config_dir(config_dir=_config_dir(), version_base=None):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[
                "algorithm.adv_estimator=ebpo",
                "+algorithm.ebpo.prior_scope=cluster",
                "+algorithm.ebpo.prior_memory=50",
                "+algorithm.ebpo.cluster_key=extra_info.difficulty",
            ],
        )
    options, cluster_key = ev.estimator_options(cfg.algorithm, "ebpo")
    assert options == {"prior_scope": "cluster", "prior_memory": 50}
    assert cluster_key == "extra_info.difficulty"
    assert ebpo.get_estimator("ebpo", **options).half_life == 50.0


def test_ebpo_options_from_verl_are_checked_against_ebpo_options_naming_the_key():
    # +algorithm.ebpo.<key>: a key that is not one of EBPOOptions' fields (nor the adapter's cluster_key), or a
    # value they reject, fails at start naming algorithm.ebpo.<key>
    with pytest.raises(
        ValueError, match=r"^algorithm.ebpo.prior_scop is rejected by 'ebpo': not one of its"
    ) as err:
        ev.estimator_options({"ebpo": {"prior_scop": "cluster"}}, "ebpo")
    assert "algorithm.ebpo.prior_scope, " in str(err.value) and "algorithm.ebpo.cluster_key)" in str(
        err.value
    )
    with pytest.raises(
        ValueError, match=r"^algorithm.ebpo.tau2: unknown EBPO tau2 'lat'; valid choices: latent, raw$"
    ):
        ev.estimator_options({"ebpo": {"tau2": "lat"}}, "ebpo")
    with pytest.raises(ValueError, match=r"^algorithm.grpo.prior_scope is rejected by 'grpo'"):
        ev.estimator_options({"grpo": {"prior_scope": "cluster"}}, "grpo")
    assert ev.estimator_options({"ebpo": {"eps": 1e-5, "cluster_key": "topic"}}, "ebpo") == (
        {"eps": 1e-5},
        "topic",
    )


def test_prepare_data_script_writes_verl_parquet(tmp_path, benchmark_dir, monkeypatch):
    import importlib.util
    from pathlib import Path

    import pyarrow.parquet as pq

    from ebpo.data.loaders import write_records

    script = Path(__file__).resolve().parents[3] / "examples" / "verl" / "prepare_data.py"
    spec = importlib.util.spec_from_file_location("prepare_data", script)
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    records = [
        Record(id=f"t{i}", prompt=f"{i}*2=?", answer=str(2 * i), topic=TOPICS[i % 3], source="x")
        for i in range(6)
    ]
    src = write_records(tmp_path / "train.jsonl", records)
    monkeypatch.setenv("EBPO_DATA_DIR", str(benchmark_dir))  # our copy of amc23, not the hub's
    assert prepare.main(["--train", str(src), "--val", "amc23", "--out", str(tmp_path / "out")]) == 0
    train = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    val = pq.read_table(tmp_path / "out" / "val.parquet").to_pylist()
    assert [row["extra_info"]["topic"] for row in train] == [r.topic for r in records]
    assert {row["data_source"] for row in train + val} == {"math_dapo"}  # verl's DAPO math scorer
    amc = [line for line in (benchmark_dir / "amc23.jsonl").read_text().splitlines() if line.strip()]
    assert len(val) == len(amc)


# ----------------------------------------------------------------------------------------------------------
# rows rejected by rollout correction, filtered groups, trainer paths
# ----------------------------------------------------------------------------------------------------------
def test_rejected_rows_stay_out_of_the_prior_and_get_zero_advantage():
    # two groups of 4; verl's rollout-correction rejection (seq_max_k2 > 0.5) rejects rows 1 and 6, which
    # both scored 1. Kept rewards: a = [1, 0, 1] (rows 0, 2, 3), b = [0, 1, 0] (rows 4, 5, 7): mean 3/6 = 0.5.
    # Reading rejected rows through their zeroed mask would have put them in as 0: mean 3/8 = 0.375.
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask

    rewards_N = torch.tensor([1.0, 1, 0, 1, 0, 1, 1, 0])
    uids = ["a"] * 4 + ["b"] * 4
    data = make_batch(rewards_N, [3] * 8, uids, width=4)
    log_ratio_BT = torch.zeros(8, 4)
    log_ratio_BT[[1, 6]] = 2.0  # k2 = 0.5 * 2^2 = 2 > 0.5 on every token: the whole sequence is rejected
    mask_BT, _ = compute_rollout_rejection_mask(
        log_ratio_BT, data.batch["response_mask"], rollout_rs="seq_max_k2", rollout_rs_threshold=0.5
    )
    assert mask_BT.sum(-1).tolist() == [3, 0, 3, 3, 3, 3, 0, 3]
    data.batch["response_mask"] = mask_BT
    out = compute_advantage(data, adv_estimator="ebpo", config=algo_config("ebpo"))
    adv_BT = out.batch["advantages"]
    assert torch.equal(adv_BT[[1, 6]], torch.zeros(2, 4))
    kept = [0, 2, 3, 4, 5, 7]
    expected_N = ebpo.get_estimator("ebpo")(rewards_N[kept], [uids[i] for i in kept])
    torch.testing.assert_close(adv_BT[kept, 0], expected_N)
    prior = ev.HOLDER.get("ebpo").state_dict()["prior"]
    assert int(prior["W_glob"]["count"]) == 6
    assert float(prior["W_glob"]["mean"]) == pytest.approx(0.5)
    # the batch normalisation ran over the six kept rows: their advantages have mean 0
    assert adv_BT[kept, 0].mean().item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_uneven_groups_after_rejection_equal_a_loop_reference(seed):
    # random steps of interleaved groups with responses rejected at random (whole mask zeroed: 0..G rows of a
    # group left) or partly (some tokens masked: the row keeps its reward), through verl's compute_advantage
    # (the legacy trainer's call), against EBPO written as loops over the rows left; the prior carries over
    gen = torch.Generator().manual_seed(seed)
    reference = LoopEBPO()
    sizes = set()
    for step in range(4):
        rewards_N, mask_BT, uids, token_BT = random_uneven_step(gen, step)
        data = DataProto.from_dict(
            tensors={"token_level_rewards": token_BT, "response_mask": mask_BT},
            non_tensors={"uid": np.array(uids, dtype=object)},
        )
        out = compute_advantage(data, adv_estimator="ebpo", config=algo_config("ebpo"))
        expected_N = loop_advantages(reference, rewards_N, mask_BT, uids)
        torch.testing.assert_close(
            out.batch["advantages"], (expected_N.unsqueeze(1) * mask_BT).float(), rtol=1e-5, atol=1e-5
        )
        valid = (mask_BT.sum(-1) > 0).tolist()
        sizes |= {sum(v for v, u in zip(valid, uids) if u == uid) for uid in set(uids)}
    if reference.rewards:
        prior = ev.HOLDER.get("ebpo").state_dict()["prior"]
        assert int(prior["W_glob"]["count"]) == len(reference.rewards)  # the rejected rows never got in
        assert float(prior["W_glob"]["mean"]) == pytest.approx(
            sum(reference.rewards) / len(reference.rewards)
        )
    assert len(sizes) >= 3  # groups of several sizes (uneven) did occur


def test_rejection_inside_the_loss_is_refused():
    # bypass_mode=true: verl rejects in the actor's loss, after the advantage; decoupled mode is fine
    config = algo_config("ebpo")
    config.rollout_correction = {"bypass_mode": True, "rollout_rs": "seq_max_k2", "rollout_rs_threshold": 2.0}
    data = make_batch([1.0, 0.0], [1, 1], ["a", "a"], width=1)
    with pytest.raises(
        ValueError, match="algorithm.rollout_correction.bypass_mode=true with rollout_rs=seq_max_k2"
    ):
        compute_advantage(data, adv_estimator="ebpo", config=config)
    config.rollout_correction.rollout_rs = None  # bypass with IS weights only: nothing is rejected
    compute_advantage(data, adv_estimator="ebpo", config=config)
    config.rollout_correction = {
        "bypass_mode": False,
        "rollout_rs": "seq_max_k2",
        "rollout_rs_threshold": 2.0,
    }
    compute_advantage(data, adv_estimator="ebpo", config=config)


def test_filter_groups_feed_the_prior_and_leave_the_loss():
    # algorithm.filter_groups (DAPO): groups s (all 1) and f (all 0) are saturated; they go to est.observe,
    # get advantage 0 and are recorded for the trainer, which zeroes their response mask before the update
    rewards_N = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 1])
    uids = ["s"] * 4 + ["f"] * 4 + ["m"] * 4
    config = algo_config("ebpo")
    config.filter_groups = {"enable": True, "metric": "reward"}
    out = compute_advantage(
        make_batch(rewards_N, [2] * 12, uids, width=3), adv_estimator="ebpo", config=config
    )
    reference = ebpo.get_estimator("ebpo")
    reference.observe(rewards_N[:8], uids[:8])
    expected_N = reference(rewards_N[8:], uids[8:])
    torch.testing.assert_close(out.batch["advantages"][8:, 0], expected_N)
    assert torch.equal(out.batch["advantages"][:8], torch.zeros(8, 3))
    assert ev.HOLDER.filtered_uids == {"s", "f"}
    assert int(ev.HOLDER.get("ebpo").state_dict()["prior"]["W_glob"]["count"]) == 12  # the prior saw all
    assert ev.HOLDER.get("ebpo").state_dict() == reference.state_dict()


def test_trainer_sends_the_kept_rows_and_pads_the_last_mini_batch(monkeypatch):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from ebpo.integrations.verl.filtering import TRAINED_KEY

    seen = []

    def fake_update(self, batch):  # verl's _update_actor sends the batch to the workers
        seen.append(batch)
        return DataProto.from_single_dict(data={}, meta_info={"metrics": {"actor/pg_loss": 0.0}})

    monkeypatch.setattr(RayPPOTrainer, "_update_actor", fake_update)
    trainer = object.__new__(ev.EBPORayPPOTrainer)
    # 2 prompts x 2 rows per mini-batch; groups s and t filtered, m and k kept
    trainer.config = OmegaConf.create(
        {"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 2}}}
    )
    ev.HOLDER.filtered_uids = {"s", "t"}
    ev.HOLDER.get("ebpo")(torch.tensor([1.0, 0.0]), ["m", "m"])
    rewards = torch.tensor([1.0, 1, 0, 1, 0, 0, 1, 0])
    batch = make_batch(rewards, [2] * 8, ["s", "s", "m", "m", "t", "t", "k", "k"], width=2)
    batch.meta_info["global_token_num"] = [10, 11, 12, 13, 14, 15, 16, 17]
    output = ev.EBPORayPPOTrainer._update_actor(trainer, batch)
    (sent,) = seen
    # the 4 kept rows fill one mini-batch of 4 rows exactly: nothing else is sent
    assert list(sent.non_tensor_batch["uid"]) == ["m", "m", "k", "k"] and sent.batch[TRAINED_KEY].all()
    assert sent.meta_info["global_token_num"] == [12, 13, 16, 17]
    assert batch.batch["response_mask"].sum().item() == 16  # the trainer's own batch is left as it was
    assert "ebpo/mu_glob" in output.meta_info["metrics"] and "actor/pg_loss" in output.meta_info["metrics"]

    ev.HOLDER.filtered_uids = {"s"}  # 6 kept rows: a full mini-batch, then 2 kept + 2 padding rows
    ev.EBPORayPPOTrainer._update_actor(trainer, batch)
    sent = seen[-1]
    assert list(sent.non_tensor_batch["uid"]) == ["m", "m", "t", "t", "k", "k", "s", "s"]
    assert sent.batch[TRAINED_KEY].tolist() == [True] * 6 + [False] * 2
    assert sent.batch["response_mask"].sum(-1).tolist() == [2] * 6 + [0, 0]

    ev.HOLDER.filtered_uids = {"s", "t", "m", "k"}  # everything filtered: no update at all
    output = ev.EBPORayPPOTrainer._update_actor(trainer, batch)
    assert len(seen) == 2 and "ebpo/mu_glob" in output.meta_info["metrics"]
    ev.HOLDER.filtered_uids = set()  # nothing filtered: verl's batch, untouched
    ev.EBPORayPPOTrainer._update_actor(trainer, batch)
    assert seen[-1] is batch and TRAINED_KEY not in batch.batch.keys()


@pytest.mark.parametrize("seed", range(20))
def test_every_mini_batch_of_a_filtered_step_trains_a_row(seed):
    # verl's dispatch gives rank r the r-th contiguous chunk and each rank cuts its chunk into contiguous
    # mini-batch slices; global mini-batch j = slice j of every rank. Whatever is dropped, each of them
    # holds a trained row (so no 0/0), their number is that of the kept rows alone, and the kept rows are
    # all trained once.
    from ebpo.integrations.verl.filtering import TRAINED_KEY, layout_filtered_update

    gen = torch.Generator().manual_seed(seed)
    group = int(torch.randint(1, 5, (1,), generator=gen))
    dp = [1, 2, 4][int(torch.randint(0, 3, (1,), generator=gen))]
    per_update = dp * int(torch.randint(1, 4, (1,), generator=gen))  # prompts per mini-batch
    updates = int(torch.randint(1, 5, (1,), generator=gen))
    prompts = per_update * updates
    dropped_groups = torch.rand(prompts, generator=gen) < 0.5
    if dropped_groups.all():
        dropped_groups[int(torch.randint(0, prompts, (1,), generator=gen))] = False
    rows, rows_per_update = prompts * group, per_update * group
    uids = [f"p{i // group}" for i in range(rows)]
    dropped_B = dropped_groups.repeat_interleave(group).numpy()
    batch = make_batch(torch.zeros(rows), [2] * rows, uids, width=2)
    sent = layout_filtered_update(batch, dropped_B, rows_per_update)
    kept = [u for u, d in zip(uids, dropped_B) if not d]
    if not dropped_B.any():
        assert sent is batch
        return
    trained_B = sent.batch[TRAINED_KEY]
    assert [u for u, t in zip(sent.non_tensor_batch["uid"], trained_B.tolist()) if t] == kept
    assert len(sent) % rows_per_update == 0 and len(sent) // rows_per_update == -(
        -len(kept) // rows_per_update
    )
    assert torch.equal(sent.batch["response_mask"].sum(-1) > 0, trained_B)
    chunk, piece = len(sent) // dp, rows_per_update // dp
    for j in range(len(sent) // rows_per_update):
        members = [r * chunk + j * piece + i for r in range(dp) for i in range(piece)]
        assert trained_B[members].any(), (seed, j)


def test_filter_groups_on_another_metric_is_refused():
    config = algo_config("ebpo")
    config.filter_groups = {"enable": True, "metric": "acc"}
    r, n, u = random_step(torch.Generator().manual_seed(0), 2, 4, 3, 0)
    with pytest.raises(ValueError, match="filter_groups.metric=reward"):
        compute_advantage(make_batch(r, n, u, 3), adv_estimator="ebpo", config=config)


def test_observe_groups_is_the_hook_for_custom_filters():
    ev.observe_groups(torch.tensor([1.0, 1.0, 0.0, 0.0]), ["x", "x", "y", "y"])
    reference = ebpo.get_estimator("ebpo")
    reference.observe(torch.tensor([1.0, 1.0, 0.0, 0.0]), ["x", "x", "y", "y"])
    assert ev.HOLDER.get("ebpo").state_dict() == reference.state_dict()


def test_ignored_settings_are_named():
    from ebpo.integrations.verl.trainer import ignored_settings

    cfg = OmegaConf.create(
        {
            "trainer": {"v1": {"trainer_mode": "separate_async"}},
            "actor_rollout_ref": {"rollout": {"multi_turn": {"enable": True}}},
            "algorithm": {
                "adv_estimator": "ebpo",
                "filter_groups": {"enable": True, "max_num_gen_batches": 4},
            },
        }
    )
    lines = ignored_settings(cfg)
    assert len(lines) == 3 and "separate_async" in lines[0] and "multi_turn" in lines[1]
    cfg.trainer.v1.trainer_mode = "sync"
    cfg.actor_rollout_ref.rollout.multi_turn.enable = False
    cfg.algorithm.filter_groups.max_num_gen_batches = 0
    assert ignored_settings(cfg) == []
    # verl's own estimators are not filtered by this trainer: one line says so
    cfg.algorithm.adv_estimator = "grpo"
    (line,) = ignored_settings(cfg)
    assert "filter_groups.enable=True does nothing with algorithm.adv_estimator=grpo" in line
    assert "\n" not in line
    cfg.algorithm.filter_groups.enable = False
    assert ignored_settings(cfg) == []


def test_shuffled_mini_batches_with_filter_groups_are_refused():
    from ebpo.integrations.verl.trainer import refuse_unsupported

    cfg = OmegaConf.create(
        {"algorithm": {"filter_groups": {"enable": True}}, "actor_rollout_ref": {"actor": {"shuffle": True}}}
    )
    with pytest.raises(ValueError, match="set actor_rollout_ref.actor.shuffle=False"):
        refuse_unsupported(cfg)
    cfg.actor_rollout_ref.actor.shuffle = False
    refuse_unsupported(cfg)
    cfg.actor_rollout_ref.actor.shuffle, cfg.algorithm.filter_groups.enable = True, False
    refuse_unsupported(cfg)


def verl_trainer_for_checkpoints(tmp_path, wg):
    """An ``EBPORayPPOTrainer`` with just what verl's ``_save_checkpoint`` / ``_load_checkpoint`` read:
    verl's composed config, a worker group ``wg`` and a dataloader."""
    from hydra import compose, initialize_config_dir

    from ebpo.integrations.verl.main import _config_dir

    with initialize_config_dir(config_dir=_config_dir(), version_base=None):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[f"trainer.default_local_dir={tmp_path / 'ckpt'}", "algorithm.adv_estimator=ebpo"],
        )

    class Loader:
        sampler = None

        def state_dict(self):
            return {"cursor": 3}

        def load_state_dict(self, state):
            self.loaded = state

        def __len__(self):
            return 100

    trainer = object.__new__(ev.EBPORayPPOTrainer)
    trainer.config, trainer.actor_rollout_wg, trainer.use_critic = cfg, wg, False
    trainer.train_dataloader, trainer.global_steps = Loader(), 0
    return trainer


def test_prior_is_on_disk_before_verl_marks_the_checkpoint_complete(tmp_path):
    # verl's _save_checkpoint saves the actor, then data.pt, then writes latest_checkpointed_iteration.txt:
    # a kill while the actor saves (here: an exception) must leave step 4 unmarked, its prior already written
    class KilledWhileSaving:
        def save_checkpoint(self, path, *args, **kwargs):
            assert (Path(path).parent / ev.ESTIMATOR_STATE_FILE).is_file()  # ours came first
            raise KeyboardInterrupt

    ev.HOLDER.get("ebpo")(torch.tensor([1.0, 0.0, 1.0, 1.0]), ["a", "a", "b", "b"])
    trainer = verl_trainer_for_checkpoints(tmp_path, KilledWhileSaving())
    trainer.global_steps = 4
    with pytest.raises(KeyboardInterrupt):
        trainer._save_checkpoint()
    tracker = tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    assert not tracker.exists() and (tmp_path / "ckpt" / "global_step_4" / ev.ESTIMATOR_STATE_FILE).is_file()
    assert ev.resolve_resume_folder(trainer.config.trainer) is None  # nothing to resume: a fresh start

    class Saves:
        def save_checkpoint(self, path, *args, **kwargs):
            Path(path).mkdir(parents=True)

    trainer.actor_rollout_wg = Saves()
    trainer._save_checkpoint()
    assert tracker.read_text() == "4"
    saved = torch.load(tmp_path / "ckpt" / "global_step_4" / ev.ESTIMATOR_STATE_FILE, weights_only=False)
    assert saved == ev.HOLDER.state_dict()


def test_resuming_a_checkpoint_without_the_prior_warns_in_one_line(tmp_path, capsys):
    class Loads:
        def load_checkpoint(self, *args, **kwargs):
            pass

    folder = tmp_path / "ckpt" / "global_step_7"
    folder.mkdir(parents=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("7")
    trainer = verl_trainer_for_checkpoints(tmp_path, Loads())
    trainer._load_checkpoint()
    assert trainer.global_steps == 7
    lines = [line for line in capsys.readouterr().err.splitlines() if "[ebpo]" in line]
    assert len(lines) == 1 and str(folder / ev.ESTIMATOR_STATE_FILE) in lines[0] and "empty prior" in lines[0]
    # with the file: restored, nothing said
    ev.HOLDER.get("ebpo")(torch.tensor([1.0, 0.0]), ["a", "a"])
    ev.save_estimator_state(folder)
    expected = ev.HOLDER.state_dict()
    ev.HOLDER.reset()
    trainer._load_checkpoint()
    assert "[ebpo]" not in capsys.readouterr().err
    ev.HOLDER.get("ebpo")
    assert ev.HOLDER.state_dict() == expected


# ----------------------------------------------------------------------------------------------------------
# structure and environment
# ----------------------------------------------------------------------------------------------------------
def _python(code: str, env_extra: dict | None = None, pythonpath: str | None = None):
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env.update(env_extra or {})
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_registration_import_is_cheap(fresh_verl_import):
    # verl's plugin loader (or VERL_USE_EXTERNAL_MODULES) imports the package in every verl process: in a
    # fresh interpreter, importing it registers our names and loads no Ray trainer, no engines
    after = fresh_verl_import["after_ebpo"]
    assert after["registered"] == after["ours"]
    assert {"dr_grpo", "ebpo", "jspo", "reinforce_pp_baseline"} <= set(
        after["ours"]
    )  # and the user's plugins'
    assert not {"grpo", "rloo"} & set(after["ours"])  # verl's own
    assert after["heavy"] == []


def test_our_launcher_takes_plugins_before_hydra_and_stops_at_one_that_fails(tmp_path, plugin_sandbox):
    from ebpo.integrations.verl.main import main, take_plugins

    argv = ["--plugins", "a.py", "trainer.device=cpu", "--plugins=b,c", "+algorithm.ebpo.tau2=latent"]
    assert take_plugins(argv) == (["a.py", "b,c"], ["trainer.device=cpu", "+algorithm.ebpo.tau2=latent"])
    bad = tmp_path / "bad.py"
    bad.write_text("import ebpo\nundefined_name\n")
    with pytest.raises(SystemExit) as stopped:
        main(["--plugins", str(bad), "algorithm.adv_estimator=ebpo"])
    assert re.fullmatch(
        rf"ebpo.integrations.verl: plugin {re.escape(str(bad))}: NameError: .*\({re.escape(str(bad))}, line 2\)",
        str(stopped.value.code),
    )


def test_our_launcher_reads_a_builtin_model_name_as_every_ebpo_command_does():
    # actor_rollout_ref.model.path=builtin:gym becomes S2's directory (the legacy e2e runs train it so); any
    # other value is verl's; an unknown built-in model stops the launcher in one line, before Ray starts
    from omegaconf import OmegaConf

    from ebpo.integrations.verl.main import _resolve_model_path
    from ebpo.models.recipes.gym import SHIPPED_DIR as GYM_SHIPPED_DIR

    for given, expected in (("builtin:gym", str(GYM_SHIPPED_DIR)), ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B")):
        config = OmegaConf.create({"actor_rollout_ref": {"model": {"path": given}}})
        _resolve_model_path(config)
        assert config.actor_rollout_ref.model.path == expected
    with pytest.raises(SystemExit) as stopped:
        _resolve_model_path(OmegaConf.create({"actor_rollout_ref": {"model": {"path": "builtin:nope"}}}))
    assert str(stopped.value.code) == (
        "ebpo.integrations.verl: actor_rollout_ref.model.path: unknown built-in model 'builtin:nope'; valid "
        "choices: builtin, builtin:arith, builtin:gym (builtin = builtin:arith)"
    )


def test_the_quiet_log_shows_a_repeated_message_once_and_verbose_turns_it_off(monkeypatch):
    import logging
    import warnings

    from ebpo.integrations.verl import quiet

    monkeypatch.setenv(quiet.QUIET_ENV, "1")
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    assert quiet.quiet_requested()
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    assert not quiet.quiet_requested()  # VERBOSE=1: every message

    logger = logging.getLogger(quiet.ONCE_LOGGERS[0])
    before = list(logger.filters)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep()
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings():
            quiet.install()
            quiet.install()  # idempotent: one filter
            assert sum(isinstance(f, quiet._Once) for f in logger.filters) == 1
            for _ in range(3):
                logger.warning("No model-specific builder for %s", "llama")
            logger.warning("No model-specific builder for %s", "qwen")  # another message: shown
            assert records == ["No model-specific builder for llama", "No model-specific builder for qwen"]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default")
                quiet.install()
                warnings.warn("megatron engine is not available: no module", UserWarning, stacklevel=1)
                warnings.warn("something else", UserWarning, stacklevel=1)
            assert [str(w.message) for w in caught] == ["something else"]
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = before


def test_trl_1x_is_detected_with_one_line(tmp_path, monkeypatch):
    # a `trl` without AutoModelForCausalLMWithValueHead (what TRL 1.x is to verl): import fails with one line;
    # the CLI prints it and exits 2 (both before verl is imported). A trl that has the class (verl's pinned
    # 0.27) passes the check.
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "__init__.py").write_text("")
    result = _python("import ebpo.integrations.verl", pythonpath=str(tmp_path))
    assert result.returncode != 0 and "ImportError: verl 0.9's FSDP workers import TRL's" in result.stderr
    assert "make verl-env" in result.stderr
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cli = subprocess.run(
        [sys.executable, "-m", "ebpo.integrations.verl", "trainer.device=cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert cli.returncode == 2
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ebpo.integrations.verl: verl 0.9's FSDP workers")

    # the check the import runs first, here, against the same two trl packages (the rest of the import
    # does not read trl): the one without the class is refused, the one with it passes
    from ebpo.integrations import compat

    def trl_modules() -> dict:
        return {name: sys.modules.pop(name) for name in list(sys.modules) if name.partition(".")[0] == "trl"}

    monkeypatch.syspath_prepend(str(tmp_path))
    before = trl_modules()
    try:
        assert "AutoModelForCausalLMWithValueHead" in (compat.trl_conflict() or "")
        trl_modules()
        (tmp_path / "trl" / "__init__.py").write_text("class AutoModelForCausalLMWithValueHead: pass\n")
        assert compat.trl_conflict() is None
    finally:
        trl_modules()
        sys.modules.update(before)


def test_public_names_stay_importable():
    for name in ev.__all__:
        assert getattr(ev, name) is not None, name
    from ebpo.integrations import ESTIMATOR_STATE_FILE
    from ebpo.integrations.verl.checkpoint import ESTIMATOR_STATE_FILE as verl_name

    assert ev.ESTIMATOR_STATE_FILE is ESTIMATOR_STATE_FILE is verl_name


# ----------------------------------------------------------------------------------------------------------
# the CPU mode's pieces (the end-to-end run is tests/integrations/verl/test_verl_e2e.py)
# ----------------------------------------------------------------------------------------------------------
def test_cpu_platform_is_opt_in(monkeypatch):
    from verl.plugin.platform import PlatformRegistry

    from ebpo.integrations.verl.cpu.platform import CPU_SLOT_RESOURCE, PlatformCPU

    assert PlatformRegistry.get("cpu") is PlatformCPU
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    assert not PlatformCPU().is_platform_available(use_smi_check=True)  # never auto-detected
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    platform = PlatformCPU()
    assert platform.is_platform_available(use_smi_check=True)
    assert platform.device_name == "cpu" and platform.communication_backend_name() == "gloo"
    assert torch.zeros(1).to(platform.current_device()).device.type == "cpu"
    assert platform.ray_resource_options(1) == {"resources": {CPU_SLOT_RESOURCE: 1}}
    assert platform.device_module.max_memory_allocated() == 0


def test_cpu_mode_config_respects_user_overrides(monkeypatch):
    from hydra import compose, initialize_config_dir

    from ebpo.integrations.verl.cpu.config import CPU_DEFAULTS, CPU_ENV, apply_cpu_mode, overridden_keys
    from ebpo.integrations.verl.cpu.platform import CPU_SLOT_RESOURCE
    from ebpo.integrations.verl.main import _config_dir

    for key in [*CPU_ENV, "VERL_USE_EXTERNAL_MODULES"]:
        monkeypatch.delenv(key, raising=False)  # restored after the test
    overrides = [
        "trainer.device=cpu",
        "++actor_rollout_ref.rollout.agent.num_workers=2",
        "trainer.n_gpus_per_node=2",
    ]
    with initialize_config_dir(config_dir=_config_dir(), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    applied = apply_cpu_mode(cfg, overridden_keys(overrides))
    assert (
        "actor_rollout_ref.rollout.agent.num_workers" not in applied
        and "trainer.n_gpus_per_node" not in applied
    )
    assert cfg.actor_rollout_ref.rollout.agent.num_workers == 2 and cfg.trainer.n_gpus_per_node == 2
    assert (
        cfg.actor_rollout_ref.rollout.name == "ebpo_cpu" and cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    )
    assert cfg.ray_kwargs.ray_init.resources[CPU_SLOT_RESOURCE] == 2  # one slot per training process
    assert set(applied) <= set(CPU_DEFAULTS)
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env["VERL_PLATFORM"] == "cpu" and env["VERL_USE_EXTERNAL_MODULES"] == "ebpo.integrations.verl"
    import os

    assert os.environ["VERL_PLATFORM"] == "cpu"


def test_the_legacy_cpu_mode_is_refused_where_verl_needs_flash_attn():
    from ebpo.integrations.verl.cpu.config import legacy_cpu_refusal

    message = legacy_cpu_refusal("0.9.0", flash_attn=False)
    assert message is not None and "trainer.use_v1=false" in message and "verl 0.9.1" in message
    assert legacy_cpu_refusal("0.9.0", flash_attn=True) is None
    assert legacy_cpu_refusal("0.9.1", flash_attn=False) is None


def test_cpu_rollout_server_samples_with_the_weights_it_was_sent(tmp_path):
    # greedy decoding from the server = greedy decoding (tokens and log-probs) from the model whose weights
    # were pushed last
    import asyncio

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.generation import sample
    from ebpo.integrations.verl.cpu.rollout import CPURolloutServer
    from ebpo.models.tiny import build_tiny_model

    path_a = build_tiny_model(tmp_path / "a", seed=1)
    path_b = build_tiny_model(tmp_path / "b", seed=2)
    tokenizer = AutoTokenizer.from_pretrained(path_a)
    model_b = AutoModelForCausalLM.from_pretrained(path_b)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in ["1+2=", "max(3,9)=", "7*7="]]
    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    server = CPURolloutServer(str(path_a), response_length=6)

    async def ask():  # the agent loop's concurrent requests; the server decodes them as one batch
        return await asyncio.gather(
            *[server.generate(f"r{i}", prompt_ids=p, sampling_params=greedy) for i, p in enumerate(prompts)]
        )

    before = [o.log_probs for o in asyncio.run(ask())]
    assert server.update_weights(dict(model_b.state_dict()), global_steps=7) == len(model_b.state_dict())
    outputs = asyncio.run(ask())
    expected = sample(model_b, tokenizer, prompts, n=1, temperature=0.0, max_new_tokens=6)
    for row, output in enumerate(outputs):
        length = int(expected.lengths[row])
        assert output.token_ids == expected.response_ids[row, :length].tolist()
        torch.testing.assert_close(torch.tensor(output.log_probs), expected.old_logp[row, :length])
        assert output.extra_fields["global_steps"] == 7
    assert [o.log_probs for o in outputs] != before  # the two models score their answers differently
    with pytest.raises(ValueError, match="top_k"):
        asyncio.run(server.generate("x", prompt_ids=prompts[0], sampling_params={"top_k": 5}))
    with pytest.raises(ValueError, match="does not have"):
        server.update_weights({"no.such.weight": torch.zeros(1)})


def test_cpu_rollout_draws_depend_on_seed_weights_prompt_and_draw_not_on_arrival(tmp_path):
    # a group's requests are identical and arrive in any order, mixed with other prompts' in batches of any
    # size: the k-th request of a prompt for one weight version always gets the same response (its own seed),
    # and says which draw it was
    import asyncio

    from ebpo.integrations.verl.cpu.rollout import CPURolloutServer, request_seed
    from ebpo.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "m", seed=1)
    server = CPURolloutServer(str(path), response_length=5, seed=3)
    settings = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    prompts = {"a": [5, 6, 7], "b": [8, 9], "c": [10, 11, 12, 13]}

    def run(order: list[str], version: int) -> dict[str, list[list[int]]]:
        server.update_weights({}, global_steps=version)  # a new weight version restarts the draw count

        async def ask():
            return await asyncio.gather(
                *[
                    server.generate(str(i), prompt_ids=prompts[p], sampling_params=settings)
                    for i, p in enumerate(order)
                ]
            )

        drawn: dict[str, list[list[int]]] = {p: [[]] * order.count(p) for p in prompts}
        for name, output in zip(order, asyncio.run(ask())):
            assert output.extra_fields["global_steps"] == version
            drawn[name][output.extra_fields["ebpo_draw"]] = output.token_ids
        return drawn

    order = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    first = run(order, version=1)
    shuffled = [order[i] for i in torch.randperm(len(order), generator=torch.Generator().manual_seed(0))]
    assert run(shuffled, version=1) == first  # another arrival order and batch: the same draws
    assert run(order[:6], version=1) == {p: v[: order[:6].count(p)] for p, v in first.items()}
    assert run(order, version=2) != first  # the next weight version samples anew
    assert len({tuple(t) for t in first["a"]}) > 1  # a group's draws differ from each other
    # the seed of a request: a hash of the five, different for each draw
    seeds = {request_seed(3, 1, {"t": 1}, [5, 6], k) for k in range(4)}
    assert len(seeds) == 4 and all(0 <= s < 2**63 for s in seeds)
    assert request_seed(3, 1, {"t": 1}, [5, 6], 0) == request_seed(3, 1, {"t": 1}, [5, 6], 0)


def test_cpu_rollout_server_aborts_and_resumes_as_partial_rollout_needs(tmp_path):
    # verl's colocate_async calls abort_all_requests when the trainer has its batch, and resume_generation after
    # the weight update. A request being decoded then returns "aborted" with the first half of its response
    # (the CPU decodes a batch in one call: half of it counts as generated before the abort), a queued request
    # "aborted" with no tokens, and a request sent between the two waits for resume_generation. The decode is
    # held on an event here so the abort lands while it runs
    import asyncio
    import threading

    from ebpo.integrations.verl.cpu.rollout import CPURolloutServer
    from ebpo.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "m", seed=1)
    server = CPURolloutServer(str(path), response_length=6, seed=3)
    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    other = {**greedy, "top_p": 0.5}  # other settings: decoded in a batch of their own, after the first
    prompt = [5, 6, 7]

    async def full():
        return await server.generate("full", prompt_ids=prompt, sampling_params=greedy)

    whole = asyncio.run(full())
    assert whole.stop_reason == "completed" and len(whole.token_ids) >= 2
    decoding, release = threading.Event(), threading.Event()
    sample = server._sample

    def held(*args):
        decoding.set()
        release.wait(timeout=60)
        return sample(*args)

    server._sample = held

    async def scenario():
        first = asyncio.create_task(server.generate("a", prompt_ids=prompt, sampling_params=greedy))
        while not decoding.is_set():
            await asyncio.sleep(0.01)
        queued = asyncio.create_task(server.generate("b", prompt_ids=prompt, sampling_params=other))
        await asyncio.sleep(0.01)
        await server.abort_all_requests()
        late = asyncio.create_task(server.generate("c", prompt_ids=prompt, sampling_params=greedy))
        waiting_b = (await queued).token_ids
        release.set()
        cut = await first
        await asyncio.sleep(0.2)
        assert not late.done()  # held until resume_generation
        await server.resume_generation()
        return cut, waiting_b, await late

    cut, queued_tokens, late = asyncio.run(scenario())
    assert cut.stop_reason == "aborted" and cut.token_ids == whole.token_ids[: len(whole.token_ids) // 2]
    assert queued_tokens == []
    assert late.stop_reason == "completed" and len(late.token_ids) >= 1
    assert server.info()["aborted_requests"] == 2


@pytest.mark.parametrize("seed", range(5))
def test_saturated_rows_matches_a_loop(seed):
    from ebpo.integrations.verl.estimators import saturated_rows

    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 40, (1,), generator=gen))
    rewards_B = torch.randint(0, 3, (n,), generator=gen).float() / 2
    uids = [f"g{int(i)}" for i in torch.randint(0, 6, (n,), generator=gen)]
    keep_B = torch.rand(n, generator=gen) > 0.2
    expected = []
    for i in range(n):  # a group is saturated when >= 2 kept members share one reward
        kept = [rewards_B[j].item() for j in range(n) if uids[j] == uids[i] and keep_B[j]]
        expected.append(bool(keep_B[i]) and len(kept) >= 2 and len(set(kept)) == 1)
    assert saturated_rows(rewards_B, uids, keep_B).tolist() == expected
