"""The verl end-to-end runs, started once for the whole session in two lanes (``verl_helpers.Lanes``) as soon as
the session's first test runs; the tests that read them (``e2e`` fixture: ``test_verl_e2e.py`` and one of
``test_verl_plugin.py``) come last, so that every other test runs while the runs do.

Every run is ``python -m ebpo.integrations.verl trainer.device=cpu`` with the quickstart's overrides
(``examples/verl/cpu_quickstart.py``: a tiny ``arith`` model fine-tuned for a second, the ``ebpo_cpu``
rollout, FSDP2 on gloo), then its own; the legacy runs train the shipped S2 instead:

| lane | run | trainer | what it is for |
|---|---|---|---|
| 1 | ``v1_a`` | v1 | the quickstart for 8 steps, checkpoints every 2: learning, prior = replay, topic stream |
| 1 | ``legacy_a``, ``legacy_b`` | legacy | S2 (``builtin:gym``: verl's Qwen3 paths, its chat template) on gym records, 2 ranks, ``balance_batch``, ``filter_groups``, a resume at step 2, with a user's estimator: ``running_mean_baseline`` of ``--plugins my_estimators.py``, and the fixture package (its entry point) installed beside |
| 1 | ``launcher`` | verl's own | ``python -m verl.trainer.main_ppo`` stopped by our checkpoint callback |
| 2 | ``v1_b`` | v1 | ``v1_a``'s command again for 2 steps (reproducible) |
| 2 | ``v1_c`` | v1 | a resume of ``v1_b`` at step 2, to step 4 (= ``v1_a``'s steps 3-4) |
| 2 | ``v1r_a``, ``v1r_b`` | v1 | 2 ranks, ``algorithm.filter_groups`` (DAPO), ``DifficultySampler``, ``prior_scope=cluster``, a resume at step 2 |
| 1 | ``async_a`` | v1 ``colocate_async`` | 1 rank, 4 steps on a small batch (8 x 8), checkpoints every 2: staleness, partial rollout, prior = replay |
| 2 | ``async_b``, ``async_c`` | v1 ``colocate_async`` | ``async_a``'s command on 2 ranks, stopped at step 2, then ``resume_mode=auto`` to step 4 |

A run costs about 100 s of CPU before its first step (a dozen processes, each importing verl): a property
is tested in a run that exists for another where the two do not hide each other's faults.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path

import pytest
from verl_helpers import Lanes, entry_point, fresh_import, quickstart

from ebpo.integrations.verl.cpu.config import legacy_cpu_refusal
from helpers.plugins import MY_ESTIMATORS, STATEFUL_ESTIMATOR

HERE = Path(__file__).resolve().parent
#: responses per prompt in the 2-rank runs, and the positional reward's group size
RANKS_N = 4
#: responses per prompt in the colocate_async runs
ASYNC_N = 8


LEGACY_DATASET = "chain_sum"
"""The reasoning-gym dataset of S2's mixture the legacy runs draw from (level 1: short prompts and answers)."""


def legacy_data(root: Path) -> Path:
    """8 distinct prompts of one dataset of S2's reasoning-gym mixture (one stream batch per epoch) for the legacy
    2-rank runs, which train S2 (``builtin:gym``), written as ``ebpo train`` data with ``data_source=gym``."""
    from ebpo.integrations.verl.data import write_verl_parquet
    from ebpo.models.recipes.gym import MIXTURE
    from ebpo.tasks import get_task

    root.mkdir(parents=True, exist_ok=True)
    task = get_task(f"gym:{LEGACY_DATASET}", **{LEGACY_DATASET: MIXTURE[LEGACY_DATASET]})
    train = task.generate("train", 8, seed=0, levels=[1])
    assert len({r.prompt for r in train}) == 8  # the tests find a dumped row's dataset row by its prompt
    write_verl_parquet(train, root / "train.parquet", data_source="gym", instruction="")
    write_verl_parquet(train[:2], root / "val.parquet", data_source="gym", instruction="")
    return root


def curriculum_data(root: Path) -> Path:
    """16 distinct prompts of two topics (``max`` rows 0-7, ``mod`` rows 8-15), each with a distinct pass rate
    in ``extra_info.difficulty`` (the curriculum's key), for the v1 2-rank runs (their tests find a dumped
    row's dataset row by its prompt)."""
    from ebpo.integrations.verl.data import write_verl_parquet
    from ebpo.tasks import arith

    root.mkdir(parents=True, exist_ok=True)
    quickstart.sft_arith_model(root / "model")
    records = arith.generate("train", 8, seed=0, topics=["max"], levels=[1])
    mod = {r.prompt: r for r in arith.generate("train", 24, seed=1, topics=["mod"], levels=[1])}
    records += list(mod.values())[:8]
    assert len({r.prompt for r in records}) == 16
    for i, record in enumerate(records):
        record.difficulty = ((i * 5) % 16) / 15  # all different: the curriculum's order is fixed
    write_verl_parquet(records, root / "train.parquet", data_source="arith", instruction="")
    write_verl_parquet(records[:2], root / "val.parquet", data_source="arith", instruction="")
    return root


def torn_checkpoint(root: Path) -> Path:
    """A checkpoint folder verl marked complete at step 4 without ebpo's prior, which step 2 has."""
    import torch

    import ebpo.integrations.verl as ev

    holder = ev.EstimatorHolder()
    holder.get("ebpo")(torch.tensor([1.0, 0.0]), ["a", "a"])
    for step in (2, 4):
        (root / "ckpt" / f"global_step_{step}").mkdir(parents=True)
    ev.save_estimator_state(root / "ckpt" / "global_step_2", holder)
    (root / "ckpt" / "latest_checkpointed_iteration.txt").write_text("4")
    return root


def entry_point_installed() -> bool:
    """Whether this environment has ebpo's ``verl.plugins`` entry point (``pip install -e .[verl]``)."""
    return any(ep.name == "ebpo" for ep in metadata.entry_points(group="verl.plugins"))


def launcher_testable() -> bool:
    """verl's launcher with our callback needs the entry point installed and verl >= 0.9.1 (the callback key)."""
    from ebpo.integrations.verl.callback import CALLBACK_AVAILABLE

    return entry_point_installed() and CALLBACK_AVAILABLE


def e2e_lanes(root: Path, plugin_pkg: Path) -> Lanes:
    qs = quickstart.prepare(root / "qs")
    legacy = legacy_data(root / "legacy")
    curriculum = curriculum_data(root / "curriculum")
    launcher = torn_checkpoint(root / "launcher")
    every_2 = ("trainer.save_freq=2",)
    legacy_runs = (
        "trainer.use_v1=false",
        "actor_rollout_ref.model.path=builtin:gym",  # S2, named as every ebpo command names it
        "data.max_prompt_length=32",  # the prompt in S2's chat template: 25 tokens
        "data.max_response_length=8",  # <answer>, the answer, </answer>, <|im_end|>
        "trainer.n_gpus_per_node=2",
        "trainer.balance_batch=True",
        "trainer.save_freq=2",
        "data.train_batch_size=8",
        f"actor_rollout_ref.rollout.n={RANKS_N}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=seq_reward",
        f"reward.custom_reward_function.path={HERE / 'verl_positional_reward.py'}",
        f"+reward.custom_reward_function.reward_kwargs.group_size={RANKS_N}",
        "--plugins",
        str(MY_ESTIMATORS),
        f"algorithm.adv_estimator={STATEFUL_ESTIMATOR}",
    )
    # the installed plugin package: its ebpo.plugins entry point, found in every process of the run
    with_package = {
        "PYTHONPATH": os.pathsep.join([str(plugin_pkg), *filter(None, [os.environ.get("PYTHONPATH")])])
    }
    curriculum_runs = (
        "trainer.n_gpus_per_node=2",
        "trainer.balance_batch=True",
        "trainer.save_freq=2",
        "data.train_batch_size=4",
        f"actor_rollout_ref.rollout.n={RANKS_N}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 2 updates per step, 4 rows per rank each
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "++data.sampler.class_name=DifficultySampler",
        "+algorithm.ebpo.prior_scope=cluster",
        "+algorithm.ebpo.cluster_min_groups=2",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",  # verl's reward managers record the score as acc (0.9.0 and 0.9.1)
        f"reward.custom_reward_function.path={HERE / 'verl_positional_reward.py'}",
        f"+reward.custom_reward_function.reward_kwargs.group_size={RANKS_N}",
    )
    verls_launcher = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "algorithm.adv_estimator=ebpo",
        "trainer.checkpoint_callback_class=ebpo.integrations.verl.EBPOCheckpointCallback",
        f"trainer.default_local_dir={launcher / 'ckpt'}",
        "trainer.resume_mode=auto",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",  # what verl's config checks ask for
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "ray_kwargs.ray_init.num_cpus=4",  # the task runner and TransferQueue's two actors
        "+ray_kwargs.ray_init.include_dashboard=False",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    # colocate_async on a small batch (4 prompts a mini-batch: 2 updates a step), 4 steps; async_b stops at
    # step 2, async_c resumes it
    async_runs = (
        "trainer.v1.trainer_mode=colocate_async",
        "data.train_batch_size=8",
        f"actor_rollout_ref.rollout.n={ASYNC_N}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        *every_2,
    )
    two_ranks = ("trainer.n_gpus_per_node=2", f"trainer.default_local_dir={qs / 'ckpt_async_b'}")
    lanes = [
        [
            (
                "v1_a",
                qs,
                entry_point(qs, "v1_a", 8, *every_2, f"trainer.default_local_dir={qs / 'ckpt_a'}"),
            ),
            *(
                [
                    ("legacy_a", legacy, entry_point(legacy, "legacy_a", 2, *legacy_runs), with_package),
                    (
                        "legacy_b",
                        legacy,
                        entry_point(legacy, "legacy_b", 4, *legacy_runs, "trainer.resume_mode=auto"),
                        with_package,
                    ),
                ]
                if legacy_cpu_refusal() is None
                else []
            ),
            *([("launcher", launcher, verls_launcher)] if launcher_testable() else []),
            (
                "async_a",
                qs,
                entry_point(
                    qs, "async_a", 4, *async_runs, f"trainer.default_local_dir={qs / 'ckpt_async_a'}"
                ),
            ),
        ],
        [
            (
                "v1_b",
                qs,
                entry_point(qs, "v1_b", 2, *every_2, f"trainer.default_local_dir={qs / 'ckpt_b'}"),
            ),
            (
                "v1_c",
                qs,
                entry_point(
                    qs,
                    "v1_c",
                    4,
                    *every_2,
                    f"trainer.default_local_dir={qs / 'ckpt_b'}",
                    "trainer.resume_mode=auto",
                ),
            ),
            ("v1r_a", curriculum, entry_point(curriculum, "v1r_a", 2, *curriculum_runs)),
            (
                "v1r_b",
                curriculum,
                entry_point(curriculum, "v1r_b", 4, *curriculum_runs, "trainer.resume_mode=auto"),
            ),
            ("async_b", qs, entry_point(qs, "async_b", 2, *async_runs, *two_ranks)),
            (
                "async_c",
                qs,
                entry_point(qs, "async_c", 4, *async_runs, *two_ranks, "trainer.resume_mode=auto"),
            ),
        ],
    ]
    return Lanes(lanes)


def verl_side_plugin(root: Path) -> Path:
    """A package that declares its own ``verl.plugins`` entry point (docs/extending.md shows these lines) to
    register its estimator ``verl_side_baseline`` with ebpo and with verl, under verl's own launcher."""
    (root / "verl_side.py").write_text(
        "import ebpo\n"
        "from ebpo.integrations.verl import register_with_verl\n\n\n"
        "@ebpo.register_estimator('verl_side_baseline')\n"
        "class VerlSide(ebpo.AdvantageEstimator):\n"
        "    def _advantages(self, batch):\n"
        "        return batch.rewards_N - batch.stats.mean_M[batch.group_N], {}\n\n\n"
        "register_with_verl()\n"
    )
    info = root / "verl_side-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: verl-side\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[verl.plugins]\nverl_side = verl_side\n")
    return root


@pytest.fixture(scope="session")
def fresh_verl_import(plugin_pkg_dir, tmp_path_factory) -> dict:
    """:func:`fresh_import` with verl's plugin loading as installed, and a user's estimators three ways: the
    fixture package's ``ebpo.plugins`` entry point, a lone file in ``$EBPO_PLUGINS`` and a package with its
    own ``verl.plugins`` entry point (:func:`verl_side_plugin`). One interpreter for the tests of registration
    (an import of verl takes seconds of CPU)."""
    side = verl_side_plugin(tmp_path_factory.mktemp("verl-side"))
    path = os.pathsep.join([str(plugin_pkg_dir), str(side), *filter(None, [os.environ.get("PYTHONPATH")])])
    return fresh_import(PYTHONPATH=path, EBPO_PLUGINS=str(MY_ESTIMATORS))


def pytest_collection_modifyitems(items):
    """The tests that read the end-to-end runs last (in their order): every other one runs while they run."""
    items[:] = sorted(items, key=lambda item: "e2e" in getattr(item, "fixturenames", ()))


@pytest.fixture(autouse=True)
def _fresh_holder():
    """Every test starts and ends with an empty estimator holder (the process's ``HOLDER``)."""
    try:
        import ebpo.integrations.verl as ev
    except ImportError:  # no verl here (or TRL 1.x beside it): this folder's tests skip
        yield
        return
    ev.HOLDER.reset()
    yield
    ev.HOLDER.reset()


@pytest.fixture(scope="session")
def e2e(tmp_path_factory, plugin_pkg_dir):
    """The session's end-to-end runs (module docstring), started on first use and stopped at the end. Each
    run starts its own Ray cluster: verl's TransferQueue is one per cluster, so two runs at once in one
    cluster would read each other's responses."""
    lanes = e2e_lanes(tmp_path_factory.mktemp("verl-e2e"), plugin_pkg_dir).start()
    yield lanes
    lanes.stop()


@pytest.fixture(scope="session", autouse=True)
def _start_e2e_with_the_session(request):
    """Start the runs with the session's first test when any collected test reads them."""
    if any("e2e" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("e2e")
