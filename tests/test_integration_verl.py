"""ebpo.integrations.verl against verl 0.9's own code: compute_advantage, DataProto, RLHFDataset, dataloader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
omegaconf = pytest.importorskip("omegaconf")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

import ebpo  # noqa: E402
import ebpo.integrations.verl as ev  # noqa: E402
from ebpo.data.records import Record  # noqa: E402
from ebpo.data.samplers import get_sampler  # noqa: E402

OmegaConf = omegaconf.OmegaConf


@pytest.fixture(autouse=True)
def _fresh_holder():
    ev.HOLDER.reset()
    yield
    ev.HOLDER.reset()


def algo_config(name: str, **options) -> omegaconf.DictConfig:
    """verl's algorithm section as Hydra builds it from ``algorithm.adv_estimator=<name> +algorithm.<name>.k=v``."""
    cfg = {"adv_estimator": name, "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True}
    if options:
        cfg[name] = options
    return OmegaConf.create(cfg)


def make_batch(rewards_N, lengths_N, uids, width: int, gen: torch.Generator, junk: bool = True) -> DataProto:
    """A DataProto as verl's fit builds it: the reward on the last response token; ``junk`` puts noise on
    the padded positions, which the sequence reward must ignore."""
    n = len(rewards_N)
    mask_BT = (torch.arange(width).unsqueeze(0) < torch.as_tensor(lengths_N).unsqueeze(1)).float()
    token_BT = torch.zeros(n, width)
    token_BT[torch.arange(n), torch.as_tensor(lengths_N) - 1] = torch.as_tensor(
        rewards_N, dtype=torch.float32
    )
    if junk:
        token_BT = token_BT + (1.0 - mask_BT) * torch.rand(n, width, generator=gen) * 7.0
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
    # spread over each response's tokens (lengths 3, 1, 2, 4) and 0 on padding; junk on padding is ignored
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
    assert path.name == "ebpo_estimator.pt"
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

    script = Path(__file__).resolve().parents[1] / "examples" / "verl" / "run_paper.sh"
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
    for method, (_, cfg) in composed.items():  # the paper's shared settings
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
    assert composed["dapo"][0] == "verl.trainer.main_ppo"
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


def test_prepare_data_script_writes_verl_parquet(tmp_path, benchmark_dir):
    import importlib.util
    from pathlib import Path

    import pyarrow.parquet as pq

    from ebpo.data.loaders import write_records

    script = Path(__file__).resolve().parents[1] / "examples" / "verl" / "prepare_data.py"
    spec = importlib.util.spec_from_file_location("prepare_data", script)
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    records = [
        Record(id=f"t{i}", prompt=f"{i}*2=?", answer=str(2 * i), topic=TOPICS[i % 3], source="x")
        for i in range(6)
    ]
    src = write_records(tmp_path / "train.jsonl", records)
    assert prepare.main(["--train", str(src), "--val", "amc23", "--out", str(tmp_path / "out")]) == 0
    train = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    val = pq.read_table(tmp_path / "out" / "val.parquet").to_pylist()
    assert [row["extra_info"]["topic"] for row in train] == [r.topic for r in records]
    assert {row["data_source"] for row in train + val} == {"math_dapo"}  # verl's DAPO math scorer
    amc = [line for line in (benchmark_dir / "amc23.jsonl").read_text().splitlines() if line.strip()]
    assert len(val) == len(amc)
