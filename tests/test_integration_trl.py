"""ebpo.integrations.trl: real GRPOTrainer steps on the tiny local model (CPU), checkpoint resume, samplers."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import ebpo  # noqa: E402
from ebpo.advantages import EBPO_CHOICES  # noqa: E402
from ebpo.data.samplers import get_sampler  # noqa: E402
from ebpo.integrations.trl import ESTIMATOR_STATE_FILE, EBPOConfig, EBPOTrainer  # noqa: E402

G = 4  # num_generations
TOPICS = ["alg", "geo"]


def char_sum_reward(completions, **kwargs):
    """(sum of character codes mod 3) / 2, in {0, 0.5, 1}: random tiny-model text gives varied groups."""
    return [(sum(map(ord, c)) % 3) / 2 for c in completions]


class RecordingTrainer(EBPOTrainer):
    """Keeps every training step's gathered rewards (via TRL's own _calculate_rewards) and final advantages."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[torch.Tensor, torch.Tensor, list]] = []
        self.prompts: list[list[str]] = []  # the distinct prompts of each training step

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            rewards_N = self._last_rewards
            self.seen.append(
                (rewards_N, output["advantages"].detach().cpu().clone(), [x["topic"] for x in inputs])
            )
            self.prompts.append(list(dict.fromkeys(x["prompt"] for x in inputs)))
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards = rewards_per_func[:, 0].detach().cpu().clone()
        return rewards_per_func


def make_dataset(n: int = 16):
    return datasets.Dataset.from_dict(
        {
            "prompt": [f"{i}+{i % 5}=" for i in range(n)],
            "topic": [TOPICS[i % 2] for i in range(n)],
            "difficulty": [((i * 5) % n) / n for i in range(n)],
        }
    )


def make_config(out_dir, **overrides) -> EBPOConfig:
    params = dict(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=2 * G,  # two prompt groups per step (one would be undone by batch norm)
        num_generations=G,
        max_completion_length=6,
        max_steps=3,
        learning_rate=1e-2,
        beta=0.001,  # k3 KL to the reference, loaded from the same path
        logging_steps=1,
        save_strategy="no",
        seed=0,
        temperature=1.0,
        dataloader_num_workers=0,
    )
    params.update(overrides)
    return EBPOConfig(**params)


def make_trainer(model_dir, args, cls=RecordingTrainer, dataset=None):
    return cls(
        model=str(model_dir), reward_funcs=char_sum_reward, args=args, train_dataset=dataset or make_dataset()
    )


def replay(seen, prior_steps=(), **options) -> list[torch.Tensor]:
    """The core library's advantages on the recorded rewards (group of row i = i // G)."""
    est = ebpo.get_estimator("ebpo", **options)
    for rewards_N in prior_steps:
        est(rewards_N, torch.arange(len(rewards_N)) // G)
    return [
        est(r, torch.arange(len(r)) // G, cluster=c if options.get("prior_scope") == "cluster" else None)
        for r, _, c in seen
    ]


def test_three_steps_train_and_match_core(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, make_config(tmp_path / "run"))
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[k], after[k].detach()) for k in before), "no parameter moved"
    assert len(trainer.seen) == 3
    for (rewards_N, adv_N, _), expected_N in zip(trainer.seen, replay(trainer.seen)):
        assert rewards_N.shape == adv_N.shape == (2 * G,)
        torch.testing.assert_close(adv_N, expected_N)
    # one estimator carried over the steps: its prior holds 3 x 8 rewards and 3 x 2 group means
    assert trainer.estimator.state_dict()["prior"]["W_glob"]["count"] == 24
    assert trainer.estimator.state_dict()["prior"]["W_means"]["count"] == 6
    logged = [h for h in trainer.state.log_history if "ebpo/mu_glob" in h]
    assert len(logged) == 3
    all_rewards = torch.cat([r for r, _, _ in trainer.seen])
    assert logged[-1]["ebpo/mu_glob"] == pytest.approx(all_rewards.mean().item(), abs=1e-6)
    assert {"ebpo/shrinkage", "ebpo/tau2", "ebpo/sigma2", "groups/all_fail"} <= set(logged[-1])
    assert all(torch.isfinite(torch.as_tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)


def test_eval_keeps_grpo_advantages(tiny_model_dir, tmp_path):
    args = make_config(tmp_path / "run", max_steps=1, per_device_eval_batch_size=G, eval_strategy="no")
    trainer = make_trainer(tiny_model_dir, args)
    trainer.model.eval()
    batch = [{"prompt": "1+1=", "topic": "alg"}] * G
    output = trainer._generate_and_score_completions(batch)
    assert trainer.seen == []  # recorded only in training mode
    rewards_N = trainer._last_rewards
    # GRPOTrainer's own eval advantage: (r - mean) / (std + 1e-4)
    expected_N = (rewards_N - rewards_N.mean()) / (rewards_N.std() + 1e-4)
    torch.testing.assert_close(output["advantages"], expected_N)
    before = trainer.estimator.state_dict()
    assert before == ebpo.get_estimator("ebpo").state_dict()  # eval left the prior untouched


def test_checkpoint_resume_restores_estimator(tiny_model_dir, tmp_path):
    # the easy-to-hard stream: step k trains on the k-th pair of prompts by pass rate, also after a resume
    out = tmp_path / "run"
    common = dict(prompt_sampler="difficulty")
    first = make_trainer(
        tiny_model_dir, make_config(out, max_steps=2, save_strategy="steps", save_steps=2, **common)
    )
    first.train()
    path = out / "checkpoint-2" / ESTIMATOR_STATE_FILE
    assert path.is_file()
    saved = torch.load(path, weights_only=False)["estimator"]
    assert saved == first.estimator.state_dict()

    second = make_trainer(tiny_model_dir, make_config(out, max_steps=3, save_strategy="no", **common))
    second.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert len(second.seen) == 1  # only step 3 ran
    # step 3 continued the prior of steps 1-2: the core library fed all three steps' rewards agrees ...
    expected = replay(second.seen, prior_steps=[r for r, _, _ in first.seen])
    torch.testing.assert_close(second.seen[0][1], expected[0])
    # ... and the prior holds all three steps: 3 x 8 rewards and 3 x 2 group means (a fresh one: 8 and 2)
    assert second.estimator.state_dict()["prior"]["W_glob"]["count"] == 24
    assert second.estimator.state_dict()["prior"]["W_means"]["count"] == 6
    dataset = make_dataset()
    easy_first = sorted(range(16), key=lambda i: -dataset["difficulty"][i])
    by_step = [[dataset["prompt"][i] for i in easy_first[2 * k : 2 * k + 2]] for k in range(3)]
    assert first.prompts + second.prompts == by_step


def test_topic_stream_goes_on_after_a_resume_at_an_epoch_boundary(tiny_model_dir, tmp_path):
    """8 prompts in two topics, 2 prompts per step: an epoch is 4 steps. A checkpoint at step 4 ends epoch 1;
    the resumed run's steps 5-8 are the stream's epoch 2 (a new topic order), the same prompts an
    uninterrupted 8-step run trains on, not a replay of epoch 1."""
    dataset = make_dataset(8)
    common = dict(prompt_sampler="topic", beta=0.0)
    whole = make_trainer(
        tiny_model_dir, make_config(tmp_path / "whole", max_steps=8, **common), dataset=dataset
    )
    whole.train()
    out = tmp_path / "run"
    first = make_trainer(
        tiny_model_dir,
        make_config(out, max_steps=4, save_strategy="steps", save_steps=4, **common),
        dataset=dataset,
    )
    first.train()
    second = make_trainer(tiny_model_dir, make_config(out, max_steps=8, **common), dataset=dataset)
    second.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert len(first.prompts) == len(second.prompts) == 4
    assert first.prompts + second.prompts == whole.prompts
    assert sorted(sum(whole.prompts[4:], [])) == sorted(sum(whole.prompts[:4], []))  # both whole epochs
    assert whole.prompts[4:] != whole.prompts[:4]  # reshuffled: a replay of epoch 1 would be caught
    topics = dict(zip(dataset["prompt"], dataset["topic"]))
    assert all(len({topics[p] for p in step}) == 1 for step in whole.prompts)  # topic-coherent steps


def test_mid_block_resume_counts_each_block_once(tiny_model_dir, tmp_path):
    # steps_per_generation=2: one generation (4 prompts x G = 16 rewards) serves optimizer steps 1 and 2.
    # checkpoint-1 falls mid-block and TRL regenerates that block on resume (no buffered completions), so a
    # prior saved after the block's rewards made the resumed prior hold 32 rewards where 16 belong. The prior
    # is saved as of the block start instead; checkpoint-2 (a block boundary) holds the block.
    out = tmp_path / "run"
    common = dict(steps_per_generation=2, logging_steps=1)
    first = make_trainer(
        tiny_model_dir, make_config(out, max_steps=2, save_strategy="steps", save_steps=1, **common)
    )
    first.train()
    assert len(first.seen) == 1  # one generation for two optimizer steps
    mid_block = torch.load(out / "checkpoint-1" / ESTIMATOR_STATE_FILE, weights_only=False)["estimator"]
    boundary = torch.load(out / "checkpoint-2" / ESTIMATOR_STATE_FILE, weights_only=False)["estimator"]
    assert mid_block == ebpo.get_estimator("ebpo").state_dict()  # as of the block start: empty
    assert boundary == first.estimator.state_dict() and boundary["prior"]["W_glob"]["count"] == 16

    second = make_trainer(tiny_model_dir, make_config(out, max_steps=2, save_strategy="no", **common))
    second.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert len(second.seen) == 1  # TRL regenerated the block it stopped in
    assert second.estimator.state_dict()["prior"]["W_glob"]["count"] == 16  # 16 belong, not 32
    expected = ebpo.get_estimator("ebpo")
    expected(second.seen[0][0], torch.arange(16) // G)
    assert second.estimator.state_dict() == expected.state_dict()


def test_topic_sampler_keeps_repeat_structure(tiny_model_dir, tmp_path):
    args = make_config(
        tmp_path / "run", prompt_sampler="topic", prior_scope="cluster", cluster_min_groups=1, max_steps=2
    )
    trainer = make_trainer(tiny_model_dir, args)
    sampler = trainer._get_train_sampler()
    indices = list(iter(sampler))
    # RepeatSampler's layout: each prompt G times in a row; generation batches of 2 prompts
    assert len(indices) == len(sampler) == 16 * G
    prompts = indices[::G]
    assert all(indices[i : i + G] == [indices[i]] * G for i in range(0, len(indices), G))
    stream = get_sampler("topic", make_dataset()["topic"], 2, seed=0)
    assert prompts == [i for _ in range(8) for i in stream.next_batch()]
    # each generation batch (2 prompts) is one topic
    topics = make_dataset()["topic"]
    assert all(topics[prompts[k]] == topics[prompts[k + 1]] for k in range(0, len(prompts), 2))
    # and the trainer runs on it, passing each prompt's topic as the cluster key
    trainer.train()
    for (_, adv_N, cluster), expected_N in zip(trainer.seen, replay(trainer.seen, prior_scope="cluster")):
        assert len(set(cluster)) == 1
        torch.testing.assert_close(adv_N, expected_N)


def test_config_rejects_unknown_choices(tmp_path):
    # every option is checked in __post_init__, before any model loads, by the estimator or registry that uses
    # it: one line naming the EBPOConfig field, then the one wording of ebpo.registry with the valid choices
    bad = {
        "advantage_estimator": (
            "ppo",
            "unknown advantage estimator 'ppo'; valid choices: dr_grpo, ebpo, grpo, jspo, reinforce_pp_baseline, "
            "rloo",
        ),
        "prompt_sampler": (
            "alphabetical",
            "unknown sampler 'alphabetical'; valid choices: difficulty, random, topic",
        ),
        "prior_scope": ("topic", "unknown EBPO prior_scope 'topic'; valid choices: cluster, global"),
        "tau2": ("latnet", "unknown EBPO tau2 'latnet'; valid choices: latent, raw"),
        "sigma2": ("pool", "unknown EBPO sigma2 'pool'; valid choices: pooled, total"),
        "normalize": (
            "batches",
            "unknown EBPO normalize 'batches'; valid choices: batch, group, none, prior",
        ),
        "prior_memory": (
            "forever",
            "prior_memory must be 'all' or a half-life in steps > 0 (e.g. 50), got 'forever'",
        ),
        "cluster_min_groups": (0, "cluster_min_groups must be an integer >= 1, got 0"),
    }
    for name, (value, message) in bad.items():
        with pytest.raises(ValueError, match=f"^{re.escape(f'EBPOConfig.{name}: {message}')}$"):
            make_config(tmp_path, **{name: value})
    with pytest.raises(ValueError, match=r"^EBPOConfig.prior_memory: .*got '-5'$"):
        make_config(tmp_path, prior_memory="-5")
    with pytest.raises(ValueError, match=r"^EBPOConfig.cluster_min_groups: .*got 2.5$"):
        make_config(tmp_path, cluster_min_groups=2.5)
    with pytest.raises(ValueError, match="set advantage_estimator='ebpo' or drop them"):
        make_config(tmp_path, advantage_estimator="grpo", prior_scope="cluster")
    # every value the estimator accepts is accepted here, from the estimator's own table (normalize="prior" too)
    for name, choices in EBPO_CHOICES.items():
        for value in choices:
            assert make_config(tmp_path, **{name: value}).estimator_options()[name] == value
    assert make_config(tmp_path, normalize="prior").estimator_options()["normalize"] == "prior"
    # the defaults are the estimator's: EBPOConfig() builds the estimator get_estimator("ebpo") builds
    default = make_config(tmp_path)
    assert repr(ebpo.get_estimator("ebpo", **default.estimator_options())) == repr(ebpo.get_estimator("ebpo"))
    assert make_config(tmp_path, advantage_estimator="grpo").estimator_options() == {}
    assert make_config(tmp_path, prior_scope="cluster").cluster_column == "topic"
    assert make_config(tmp_path, prior_memory="50").estimator_options()["prior_memory"] == 50.0
