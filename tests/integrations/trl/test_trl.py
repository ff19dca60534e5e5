"""ebpo.integrations.trl: real GRPOTrainer steps on the tiny local model (CPU), checkpoint resume, samplers."""

from __future__ import annotations

import errno
import importlib.util
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import ebpo  # noqa: E402
from ebpo.advantages import EBPO_CHOICES  # noqa: E402
from ebpo.data.samplers import get_sampler  # noqa: E402
from ebpo.integrations.trl import ESTIMATOR_STATE_FILE, EBPOConfig, EBPOTrainer  # noqa: E402
from ebpo.persist import DamagedFile, UnsafeFile, WriteError  # noqa: E402
from ebpo.registry import PLUGINS_HINT  # noqa: E402
from helpers.plugins import MY_ESTIMATORS, PKG_ESTIMATOR, STATEFUL_ESTIMATOR  # noqa: E402

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


def replay(seen, prior_steps=(), name="ebpo", **options) -> list[torch.Tensor]:
    """The core library's advantages (estimator ``name``) on the recorded rewards (group of row i = i // G)."""
    est = ebpo.get_estimator(name, **options)
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
    saved = torch.load(path, weights_only=True)["estimator"]
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
    mid_block = torch.load(out / "checkpoint-1" / ESTIMATOR_STATE_FILE, weights_only=True)["estimator"]
    boundary = torch.load(out / "checkpoint-2" / ESTIMATOR_STATE_FILE, weights_only=True)["estimator"]
    assert mid_block == ebpo.get_estimator("ebpo").state_dict()  # as of the block start: empty
    assert boundary == first.estimator.state_dict() and boundary["prior"]["W_glob"]["count"] == 16

    second = make_trainer(tiny_model_dir, make_config(out, max_steps=2, save_strategy="no", **common))
    second.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert len(second.seen) == 1  # TRL regenerated the block it stopped in
    assert second.estimator.state_dict()["prior"]["W_glob"]["count"] == 16  # 16 belong, not 32
    expected = ebpo.get_estimator("ebpo")
    expected(second.seen[0][0], torch.arange(16) // G)
    assert second.estimator.state_dict() == expected.state_dict()


def test_checkpoint_after_a_mid_block_resume_counts_each_block_once(tiny_model_dir, tmp_path):
    # steps_per_generation=2: an uninterrupted run generates blocks at steps 0 and 2. Resumed at step 1 (mid
    # block), TRL regenerates block 1 there and then generates every 2 steps from there (step 3), so step 2
    # lies inside the resumed run's block, although a run resumed from step 2 starts with block 2 (the
    # dataloader's). The prior saved at step 2 must hold block 1 (16 rewards); the prior from before the
    # resumed run's block (empty) would lose block 1, and the final prior would hold 16 rewards, not 32.
    out = tmp_path / "run"
    common = dict(steps_per_generation=2)
    first = make_trainer(
        tiny_model_dir, make_config(out, max_steps=1, save_strategy="steps", save_steps=1, **common)
    )
    first.train()
    second = make_trainer(
        tiny_model_dir, make_config(out, max_steps=2, save_strategy="steps", save_steps=1, **common)
    )
    second.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert len(second.seen) == 1  # block 1, regenerated at step 1
    at_step_2 = torch.load(out / "checkpoint-2" / ESTIMATOR_STATE_FILE, weights_only=True)["estimator"]
    assert at_step_2 == second.estimator.state_dict() and at_step_2["prior"]["W_glob"]["count"] == 16

    third = make_trainer(tiny_model_dir, make_config(out, max_steps=3, save_strategy="no", **common))
    third.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert len(third.seen) == 1  # block 2, generated at step 2
    expected = ebpo.get_estimator("ebpo")
    for rewards_N, _, _ in second.seen + third.seen:
        expected(rewards_N, torch.arange(16) // G)
    assert third.estimator.state_dict() == expected.state_dict()  # blocks 1 and 2, once each
    assert expected.state_dict()["prior"]["W_glob"]["count"] == 32


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
            f"rloo; {PLUGINS_HINT}",
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


def test_ebpo_options_are_declared_once_and_collide_with_no_grpo_field(tmp_path):
    # EBPOConfig's EBPO fields are EBPOOptions' own (same default, same help), and none shadows a GRPOConfig
    # field: a name TRL declares too would silently take TRL's meaning
    from dataclasses import fields

    from trl import GRPOConfig, TrlParser

    from ebpo.advantages import EBPOOptions

    ours = {f.name: f for f in fields(EBPOOptions)}
    assert not set(ours) & {f.name for f in fields(GRPOConfig)}
    theirs = {f.name: f for f in fields(EBPOConfig)}
    for name, option in ours.items():
        assert (
            theirs[name].default == option.default
            and theirs[name].metadata["help"] == option.metadata["help"]
        )
    # every option is a TRL command-line flag (choices from the Literal types), checked like the others
    (config,) = TrlParser([EBPOConfig]).parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--use_cpu",
            "--prior_memory",
            "50",
            "--tau2",
            "latent",
            "--eps",
            "1e-5",
        ]
    )
    options = config.estimator_options()
    assert (options["prior_memory"], options["tau2"], options["eps"]) == (50.0, "latent", 1e-5)
    with pytest.raises(SystemExit):
        TrlParser([EBPOConfig]).parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--tau2", "lat"])
    for name, value, message in (
        ("tau2_floor", -1.0, "tau2_floor must be >= 0"),
        ("eps", 0.0, "eps must be > 0"),
    ):
        with pytest.raises(ValueError, match=f"^EBPOConfig.{name}: .*{message}"):
            make_config(tmp_path, **{name: value})


def distinct_reward(completions, **kwargs):
    """Number of distinct characters mod 2, in {0, 1}: a second reward function."""
    return [len(set(c)) % 2 for c in completions]


def test_reward_weights_combine_the_reward_functions(tiny_model_dir, tmp_path):
    # r_i = 1.0 * char_sum_reward + 0.5 * distinct_reward: TRL's weighted sum, fed to the estimator
    class TwoRewards(RecordingTrainer):
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards_per_func = EBPOTrainer._calculate_rewards(
                self, inputs, prompts, completions, completion_ids_list
            )
            self._last_rewards = (rewards_per_func.cpu() * torch.tensor([1.0, 0.5])).sum(dim=1)
            self.per_func.append(rewards_per_func.cpu().clone())
            return rewards_per_func

    args = make_config(tmp_path / "run", max_steps=2, reward_weights=[1.0, 0.5])
    trainer = TwoRewards(
        model=str(tiny_model_dir), reward_funcs=[char_sum_reward, distinct_reward], args=args,
        train_dataset=make_dataset(),
    )  # fmt: skip
    trainer.per_func = []
    trainer.train()
    assert len(trainer.seen) == 2
    assert all(
        len(torch.unique(per_func[:, 1])) == 2 for per_func in trainer.per_func
    )  # the second reward varies
    for (_, adv_N, _), expected_N in zip(trainer.seen, replay(trainer.seen)):
        torch.testing.assert_close(adv_N, expected_N)


def test_config_refuses_settings_it_would_ignore(tmp_path):
    # each one line naming the field, why it would change nothing (or the wrong thing), and the fix
    refused = {
        "multi_objective_aggregation": (
            "normalize_then_sum",
            "leaves every group mean at 0 and nothing for the estimator's baseline or prior",
        ),
        "scale_rewards": (
            "batch",
            "GRPO's reward scaling, which the training advantages of advantage_estimator",
        ),
        "cluster_column": ("topic", "only EBPO's prior_scope='cluster' reads cluster keys"),
        "cluster_min_groups": (4, "it applies to cluster priors only; set prior_scope='cluster'"),
        "topic_column": ("subject", "only prompt_sampler='topic' reads it"),
        "difficulty_column": ("pass_rate", "only prompt_sampler='difficulty' reads it"),
    }
    for name, (value, reason) in refused.items():
        with pytest.raises(ValueError, match=rf"^EBPOConfig\.{name}={re.escape(repr(value))}: .*") as error:
            make_config(tmp_path, **{name: value})
        assert reason in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(
        ValueError, match=r"^EBPOConfig\.shuffle_dataset=False: prompt_sampler='topic' shuffles"
    ):
        make_config(tmp_path, prompt_sampler="topic", shuffle_dataset=False)
    with pytest.raises(
        ValueError, match=r"^EBPOConfig\.cluster_column='topic': only EBPO's prior_scope='cluster'"
    ):
        make_config(tmp_path, advantage_estimator="grpo", cluster_column="topic")
    # the same settings where they are read are accepted
    make_config(tmp_path, prior_scope="cluster", cluster_column="topic", cluster_min_groups=4)
    make_config(tmp_path, prompt_sampler="topic", topic_column="subject")
    make_config(tmp_path, prompt_sampler="difficulty", difficulty_column="pass_rate", shuffle_dataset=False)
    make_config(tmp_path, scale_rewards=True)  # TRL's spelling of "group"


def test_clustered_prompt_order_over_a_streaming_dataset_is_refused_before_the_model_loads(tmp_path):
    streaming = make_dataset().to_iterable_dataset()
    args = make_config(tmp_path / "run", prompt_sampler="topic", max_steps=1)
    with pytest.raises(ValueError, match=r"^EBPOConfig.prompt_sampler='topic' orders .* IterableDataset"):
        EBPOTrainer(
            model=str(tmp_path / "no-model-here"),
            reward_funcs=char_sum_reward,
            args=args,
            train_dataset=streaming,
        )
    with pytest.raises(TypeError, match="EBPOTrainer needs args=EBPOConfig"):
        EBPOTrainer(
            model=str(tmp_path / "no-model-here"), reward_funcs=char_sum_reward, train_dataset=streaming
        )


def test_a_streaming_dataset_trains_with_the_random_order(
    tiny_model_dir, tmp_path, plugin_pkg_dir, plugin_sandbox, monkeypatch
):
    # TRL streams an IterableDataset in RepeatSampler's layout (repeat_iterable_dataset): the groups are the
    # same blocks of G rows, so the registry's advantages apply unchanged; here an installed package's
    # estimator, found by its entry point
    monkeypatch.syspath_prepend(str(plugin_pkg_dir))
    args = make_config(tmp_path / "run", max_steps=2, advantage_estimator=PKG_ESTIMATOR)
    trainer = make_trainer(tiny_model_dir, args, dataset=make_dataset().to_iterable_dataset())
    trainer.train()
    assert len(trainer.seen) == 2
    for (_, adv_N, _), expected_N in zip(trainer.seen, replay(trainer.seen, name=PKG_ESTIMATOR)):
        torch.testing.assert_close(adv_N, expected_N)
    assert all(len(set(step)) == 2 for step in trainer.prompts)  # two groups of G rows each


def test_training_fails_when_trl_skips_the_reward_hook(tiny_model_dir, tmp_path):
    # a TRL that scored completions without calling _calculate_rewards would train on GRPO's advantages
    from trl import GRPOTrainer

    class BypassingTrainer(EBPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            return GRPOTrainer._calculate_rewards(self, inputs, prompts, completions, completion_ids_list)

    trainer = make_trainer(tiny_model_dir, make_config(tmp_path / "run", max_steps=1), cls=BypassingTrainer)
    with pytest.raises(
        RuntimeError, match=r"without calling _calculate_rewards.*GRPO's advantages instead of"
    ):
        trainer.train()
    trainer.model.eval()  # evaluation keeps GRPO's advantages: no hook needed there
    trainer._generate_and_score_completions([{"prompt": "1+1=", "topic": "alg"}] * G)


def test_half_life_counts_generation_blocks(tiny_model_dir, tmp_path):
    # 4 optimizer steps, 2 per generation block: the prior ages twice (once per block), as the core estimator
    # fed the two blocks does; 4 agings would leave other weights
    args = make_config(tmp_path / "run", max_steps=4, steps_per_generation=2, prior_memory="1")
    trainer = make_trainer(tiny_model_dir, args)
    trainer.train()
    assert len(trainer.seen) == 2
    expected = ebpo.get_estimator("ebpo", prior_memory=1.0)
    for rewards_N, _, _ in trainer.seen:
        expected(rewards_N, torch.arange(len(rewards_N)) // G)
    assert trainer.estimator.state_dict() == expected.state_dict()


class Killed(Exception):
    pass


def test_estimator_state_is_written_before_the_checkpoint_and_survives_a_kill(
    tiny_model_dir, tmp_path, monkeypatch, plugin_sandbox
):
    # TRL's own save (model, optimizer, trainer_state.json, the hub push of hub_strategy="checkpoint") comes
    # after ours: killed in the middle of it, the checkpoint already holds the estimator's state (here a
    # stateful estimator of a lone file's, EBPOConfig.plugins)
    from trl import GRPOTrainer

    out = tmp_path / "run"
    seen_at_parent_save = []

    def killed_save(self, model, trial):
        seen_at_parent_save.append((out / "checkpoint-1" / ESTIMATOR_STATE_FILE).is_file())
        raise Killed

    monkeypatch.setattr(GRPOTrainer, "_save_checkpoint", killed_save)
    args = make_config(
        out,
        max_steps=1,
        save_strategy="steps",
        save_steps=1,
        plugins=[str(MY_ESTIMATORS)],
        advantage_estimator=STATEFUL_ESTIMATOR,
    )
    trainer = make_trainer(tiny_model_dir, args)
    with pytest.raises(Killed):
        trainer.train()
    assert seen_at_parent_save == [True]
    saved = torch.load(out / "checkpoint-1" / ESTIMATOR_STATE_FILE, weights_only=True)["estimator"]
    assert saved == trainer.estimator.state_dict() and saved["count"] == 2 * G
    (expected_N,) = replay(trainer.seen, name=STATEFUL_ESTIMATOR)
    torch.testing.assert_close(trainer.seen[0][1], expected_N)
    assert [p.name for p in (out / "checkpoint-1").iterdir()] == [ESTIMATOR_STATE_FILE]  # no temporary file


def test_only_the_saving_processes_write_the_estimator_state(tiny_model_dir, tmp_path, monkeypatch):
    # args.should_save is False on the processes that write no checkpoint files (all but the main one, or
    # but each node's first with save_on_each_node=True)
    monkeypatch.setattr(EBPOConfig, "should_save", property(lambda self: False))
    out = tmp_path / "run"
    make_trainer(tiny_model_dir, make_config(out, max_steps=1, save_strategy="steps", save_steps=1)).train()
    assert not (out / "checkpoint-1" / ESTIMATOR_STATE_FILE).exists()


def test_resume_from_a_checkpoint_without_the_estimator_state_warns_once(tiny_model_dir, tmp_path, capfd):
    out = tmp_path / "run"
    make_trainer(tiny_model_dir, make_config(out, max_steps=1, save_strategy="steps", save_steps=1)).train()
    (out / "checkpoint-1" / ESTIMATOR_STATE_FILE).unlink()  # e.g. a checkpoint written by GRPOTrainer
    capfd.readouterr()
    second = make_trainer(tiny_model_dir, make_config(out, max_steps=2))
    second.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    warnings = [line for line in capfd.readouterr().err.splitlines() if "[ebpo]" in line]
    assert warnings == [
        f"[ebpo] WARNING: no {ESTIMATOR_STATE_FILE} in {out / 'checkpoint-1'}: the estimator starts from an "
        "empty prior"
    ]
    assert second.estimator.state_dict()["prior"]["W_glob"]["count"] == 2 * G  # step 2's rewards only


# ---------------------------------------------------------------------------------------------------
# examples/trl/train_ebpo.py

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "trl" / "train_ebpo.py"


@pytest.fixture
def example(monkeypatch):
    spec = importlib.util.spec_from_file_location("train_ebpo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def paper_command(text: str) -> list[str]:
    """The arguments of the ``accelerate launch ... train_ebpo.py ...`` command in ``text`` (after the script)."""
    start = text.index("accelerate launch --num_processes")
    lines = []
    for line in text[start:].splitlines():
        lines.append(line.strip().rstrip("\\"))
        if not line.rstrip().endswith("\\"):
            break
    words = shlex.split(" ".join(lines))
    return words[words.index("examples/trl/train_ebpo.py") + 1 :]


def test_the_paper_command_builds_the_paper_settings(example, tmp_path, monkeypatch):
    # the command in the example's docstring, parsed as the script parses it, on the 8 processes it is for
    arguments = paper_command(example.__doc__)
    assert arguments[arguments.index("--output_dir") + 1] == "runs/qwen3-8b-ebpo-topic"
    arguments[arguments.index("--output_dir") + 1] = str(tmp_path / "run")
    arguments.append("--use_cpu")  # this machine's device; nothing else changes
    monkeypatch.setattr(EBPOConfig, "world_size", property(lambda self: 8))
    script, config = example.parse_arguments(arguments)
    prompts_per_generation = config.generation_batch_size // config.num_generations
    completions_per_update = config.per_device_train_batch_size * 8 * config.gradient_accumulation_steps
    assert (script.model, script.reward) == ("Qwen/Qwen3-8B", "math_dapo")
    assert config.num_generations == 4  # G
    assert prompts_per_generation == 512  # global batch
    assert completions_per_update == 128 * config.num_generations  # PPO mini-batch 128 prompts
    assert config.steps_per_generation == 4 * config.gradient_accumulation_steps  # 4 updates per generation
    assert config.num_iterations == 1  # one pass over each generation
    assert config.max_steps == 1000 * 4  # 1000 generation rounds
    assert config.loss_type == "grpo"  # token mean per sequence, then mean over sequences
    assert (config.epsilon, config.epsilon_high) in ((0.2, None), (0.2, 0.2))  # clip 0.2 both sides
    assert config.learning_rate == 1e-6 and config.lr_scheduler_type == "constant"
    assert config.beta == 0.001  # k3 KL coefficient
    assert (config.weight_decay, config.max_grad_norm) == (0.01, 1.0)  # verl's defaults in our verl recipe
    assert config.max_completion_length == 8192
    assert (config.advantage_estimator, config.prompt_sampler) == ("ebpo", "topic")  # EBPO-topic
    assert config.estimator_options() == {  # the paper's EBPO (docs/design.md §1)
        "prior_scope": "global",
        "cluster_min_groups": 16,
        "prior_memory": "all",
        "tau2": "raw",
        "tau2_floor": 1e-4,  # read only with tau2="latent"
        "sigma2": "total",
        "normalize": "batch",
        "eps": 1e-6,
        "prior_staleness": "all",  # every group alike (docs/theory.md, section 6)
        "staleness_max_lag": 8,
        "staleness_half_life": 4.0,
    }
    assert config.bf16
    # docs/integrations.md gives the same command
    assert paper_command((REPO / "docs" / "integrations.md").read_text()) == paper_command(example.__doc__)


@pytest.mark.parametrize("model, preset", [(None, "ebpo"), ("builtin:gym", "gym")])
def test_the_laptop_defaults_are_the_ebpo_train_demo(example, tmp_path, model, preset):
    # each built-in model's laptop run is its `ebpo train` demo: ebpo.yaml for S1, gym.yaml for S2
    from ebpo.trainer import load_config

    demo = load_config(preset)
    chosen = [] if model is None else ["--model", model]
    script, config = example.parse_arguments(["--output_dir", str(tmp_path), "--use_cpu", *chosen])
    assert (script.num_problems, script.val_size) == (demo.data.train_size, demo.data.val_size)
    assert script.eval_n == demo.run.eval_n
    updates_per_step = demo.data.batch_size // demo.optim.mini_batch_size
    assert config.num_generations == demo.data.group_size
    assert config.generation_batch_size == demo.data.batch_size * demo.data.group_size
    assert config.per_device_train_batch_size == demo.optim.mini_batch_size * demo.data.group_size
    assert config.steps_per_generation == updates_per_step and config.gradient_accumulation_steps == 1
    assert config.num_iterations == demo.optim.epochs
    assert config.max_steps == demo.run.steps * updates_per_step
    assert config.learning_rate == demo.optim.lr and config.lr_scheduler_type == "constant"
    assert config.max_grad_norm == demo.optim.grad_clip
    assert config.beta == demo.algorithm.kl_coef and config.loss_type == "dapo"  # token-level: token-mean
    assert config.max_completion_length == demo.rollout.max_new_tokens
    assert config.temperature == demo.rollout.temperature and config.top_p == demo.rollout.top_p
    assert config.seed == demo.run.seed  # the same problems, and validation samples drawn alike
    # a flag overrides a laptop default; with --model none of them applies
    _, shorter = example.parse_arguments(["--output_dir", str(tmp_path), "--max_steps", "16"])
    assert shorter.max_steps == 16
    _, other = example.parse_arguments(["--output_dir", str(tmp_path), "--model", "m", "--use_cpu"])
    assert other.max_completion_length != demo.rollout.max_new_tokens


def test_the_laptop_run_prints_validation_before_and_after(example, tmp_path, capsys):
    # the shipped base model on generated arith problems, shortened: 2 updates (a quarter of a block)
    argv = ["--output_dir", str(tmp_path / "run"), "--use_cpu", "--max_steps", "2", "--steps_per_generation",
            "2", "--val_size", "9", "--eval_n", "2", "--num_problems", "64"]  # fmt: skip
    assert example.main(argv) == 0
    out = capsys.readouterr().out
    assert "validation before training: 9 problems x 2 samples" in out
    assert re.search(r"^all \(pass@1\)\s+\d\.\d{3}\s+\d\.\d{3}\s+[+-]\d\.\d{3}$", out, re.MULTILINE)
    assert re.search(
        r"^validation pass@1: \d\.\d{3} ± \d\.\d{3} before, \d\.\d{3} ± \d\.\d{3} after", out, re.M
    )
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_s2_gets_conversational_prompts_of_its_gym_mixture_rendered_as_ebpo_renders_them(
    example, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    # --model builtin:gym, S2 (Qwen3, BPE, ChatML) at tiny size: its laptop defaults, problems of its reasoning-gym
    # mixture, the gym reward; TRL tokenizes the conversational prompts to the ids ebpo train and ebpo eval give
    # the model (ebpo.data.prompts), and the validation before and after reads them too
    from transformers import AutoTokenizer

    from ebpo.data.prompts import PromptFormat
    from ebpo.models.recipes.gym import DATASETS, MIXTURE, TASK
    from ebpo.models.recipes.gym import SHIPPED_DIR as GYM_SHIPPED_DIR
    from ebpo.tasks import get_task

    tokenized, rewards = [], []
    tokenize = EBPOTrainer._tokenize_prompts

    def spy(self, prompts):
        assert all(isinstance(p, list) and p[-1]["role"] == "user" for p in prompts)  # conversational
        tokenized.append(tokenize(self, prompts))
        return tokenized[-1]

    monkeypatch.setattr(EBPOTrainer, "_tokenize_prompts", spy)
    make_reward = example.make_reward
    monkeypatch.setattr(example, "make_reward", lambda name: rewards.append(name) or make_reward(name))
    argv = ["--model", "builtin:gym", "--output_dir", str(tmp_path / "run"), "--use_cpu",
            "--max_steps", "1", "--num_generations", "2", "--per_device_train_batch_size", "4",
            "--steps_per_generation", "1", "--num_problems", "8", "--val_size", "24", "--eval_n", "2"]  # fmt: skip
    assert example.main(argv) == 0
    out = capsys.readouterr().out
    assert "validation before training: 24 problems x 2 samples" in out
    assert all(re.search(rf"^{name}\s+\d\.\d{{3}}\s+\d\.\d{{3}}", out, re.M) for name in DATASETS)
    assert rewards == ["gym"]  # the task's own reward, each dataset's score_answer
    ours = PromptFormat.resolve(AutoTokenizer.from_pretrained(GYM_SHIPPED_DIR), "auto")
    assert ours.chat
    expected = {tuple(ids) for ids in ours.ids(get_task(TASK, **MIXTURE).generate("train", 8, 0))}
    drawn = [tuple(row) for prompt_ids, _, _ in tokenized for row in prompt_ids]
    assert drawn and set(drawn) <= expected
    # an unknown built-in model, and on without a template: one line each, before any training
    assert example.main(["--model", "builtin:nope", "--output_dir", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.startswith("train_ebpo.py: unknown built-in model 'builtin:nope'; valid")
    code = example.main(["--model", str(tiny_model_dir), "--output_dir", str(tmp_path / "x"), "--use_cpu",
                         "--chat_template", "on"])  # fmt: skip
    assert code == 2 and "--chat_template=on, but the tokenizer of" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# the estimator state file on a bad day: a disk that refuses the write, a damaged file on resume (one line
# naming the file, never a traceback from torch or pickle; no half-written file left)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["full", "quota"])
def test_a_refused_estimator_state_write_is_one_line(tiny_model_dir, tmp_path, monkeypatch, code):
    def refusing_save(state, handle):
        handle.write(b"PK part of a zip")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(torch, "save", refusing_save)
    out = tmp_path / "run"
    trainer = make_trainer(tiny_model_dir, make_config(out, max_steps=1, save_strategy="steps", save_steps=1))
    with pytest.raises(WriteError) as err:
        trainer.train()
    path = out / "checkpoint-1" / ESTIMATOR_STATE_FILE
    reason = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}[code]
    assert str(err.value) == f"cannot write {path}: {reason}; nothing was written there"
    assert list((out / "checkpoint-1").iterdir()) == []  # no temporary file left


def test_a_damaged_estimator_state_is_one_line_on_resume(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    make_trainer(tiny_model_dir, make_config(out, max_steps=1, save_strategy="steps", save_steps=1)).train()
    path = out / "checkpoint-1" / ESTIMATOR_STATE_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    second = make_trainer(tiny_model_dir, make_config(out, max_steps=2))
    with pytest.raises(DamagedFile) as err:
        second.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    message = str(err.value)
    assert message.startswith(f"{path} is damaged and cannot be read (") and "\n" not in message
    assert message.endswith(
        "; resume from an earlier checkpoint-N folder, or delete the file to start from an empty prior"
    )


@pytest.mark.parametrize("shell", [False, True], ids=["open", "os.system"])
def test_an_estimator_state_that_would_run_code_is_refused_unread_on_resume(tiny_model_dir, tmp_path, shell):
    from helpers.payloads import write_payload

    out = tmp_path / "run"
    make_trainer(tiny_model_dir, make_config(out, max_steps=1, save_strategy="steps", save_steps=1)).train()
    path = out / "checkpoint-1" / ESTIMATOR_STATE_FILE
    marker = tmp_path / "created-by-the-pickle"
    write_payload(path, marker, shell=shell)
    second = make_trainer(tiny_model_dir, make_config(out, max_steps=2))
    with pytest.raises(UnsafeFile) as err:
        second.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert not marker.exists()
    assert str(err.value) == (
        f"{path} holds a pickle that would run code to load ({'posix.system' if shell else 'io.open'}), and ebpo "
        "loads only tensors, numbers, strings, lists and dicts from a state file: it was left unread; resume "
        "from an earlier checkpoint-N folder, or delete the file to start from an empty prior"
    )


def test_a_resume_with_other_ebpo_options_names_each_one(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    make_trainer(tiny_model_dir, make_config(out, max_steps=1, save_strategy="steps", save_steps=1)).train()
    path = out / "checkpoint-1" / ESTIMATOR_STATE_FILE
    assert torch.load(path, weights_only=True)["estimator"]["options"]["tau2"] == "raw"  # plain data
    second = make_trainer(tiny_model_dir, make_config(out, max_steps=2, tau2="latent", sigma2="pooled"))
    with pytest.raises(ValueError) as err:
        second.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert str(err.value) == (
        f"{path}: EBPO checkpoint was written with other options: tau2='raw' (this estimator: 'latent'), "
        "sigma2='total' (this estimator: 'pooled'); build the estimator with the checkpoint's options to "
        "continue its prior, or start without the checkpoint's state"
    )


def test_reward_function_scores_plain_and_conversational_completions_with_our_reward():
    from ebpo.integrations.trl import reward_function

    reward = reward_function("arith")
    assert reward.__name__ == "arith"  # TRL logs rewards/arith/...
    assert reward(["12", "7"], ["12", "8"]) == [1.0, 0.0]
    conversation = [{"role": "user", "content": "5 + 7 = ?"}, {"role": "assistant", "content": "12"}]
    assert reward([conversation, [conversation[0], {"role": "assistant", "content": "5"}]], ["12", "12"]) == [
        1.0,
        0.0,
    ]
    with pytest.raises(ValueError, match="unknown reward 'nope'; valid choices: arith"):
        reward_function("nope")
