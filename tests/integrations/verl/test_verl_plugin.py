"""ebpo under verl's own launcher (``python -m verl.trainer.main_ppo algorithm.adv_estimator=ebpo ...``).

The package's ``verl.plugins`` entry point registers our estimators in every process that imports verl; verl's
v1 trainer takes our checkpoint callback and replay buffer through its own keys; one warning names the rest.
The CPU mode cannot run there (verl's trainer builds verl's worker, whose process group torch refuses on the
CPU), so what is tested is registration in a fresh interpreter, verl's own ``_save_checkpoint`` and
``_build_replay_buffer`` with our classes, the restore and the refusals, and verl's real launcher up to the
point where our callback stops a resume.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
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
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402
from verl_helpers import fresh_import, verl_config  # noqa: E402

import ebpo.integrations.verl as ev  # noqa: E402
from ebpo.integrations import ESTIMATOR_STATE_FILE  # noqa: E402
from ebpo.integrations.verl import callback, v1  # noqa: E402

CALLBACK = "trainer.checkpoint_callback_class=ebpo.integrations.verl.EBPOCheckpointCallback"
#: the tests of the checkpoint callback: verl 0.9.1 has trainer.checkpoint_callback_class, 0.9.0 does not
needs_callback = pytest.mark.skipif(
    not callback.CALLBACK_AVAILABLE, reason="this verl has no trainer.checkpoint_callback_class (verl 0.9.0)"
)
BUFFER = (
    "trainer.v1.sampler.custom_sampler.path=pkg://ebpo.integrations.verl.v1",
    "trainer.v1.sampler.custom_sampler.name=EBPOReplayBuffer",
)


OURS_AND_THE_USERS = (
    "dr_grpo",
    "ebpo",
    "jspo",
    "median_baseline",
    "reinforce_pp_baseline",
    "running_mean_baseline",
    "trimmed_mean_baseline",
    "verl_side_baseline",
)
"""verl's registry in a fresh interpreter of ``fresh_verl_import``: the names verl lacks, ours and the user's."""


def entry_point_installed() -> bool:
    return any(ep.name == "ebpo" for ep in metadata.entry_points(group="verl.plugins"))


# ----------------------------------------------------------------------------------------------------------
# registration through the plugin group
# ----------------------------------------------------------------------------------------------------------
def test_importing_verl_registers_our_estimators_through_the_entry_point(fresh_verl_import):
    if not entry_point_installed():
        pytest.skip(
            "ebpo's verl.plugins entry point is not installed here (pip install -e .[verl] installs it)"
        )
    # `import verl` alone: every name verl lacks, nothing heavy imported (no Ray trainer, no workers); a
    # user's estimators too, three ways: an installed package's ebpo.plugins entry point (trimmed_mean_baseline),
    # a lone file in $EBPO_PLUGINS (median_baseline, running_mean_baseline) and a package's own verl.plugins
    # entry point (verl_side_baseline)
    after_verl = fresh_verl_import["after_verl"]
    assert after_verl == {"ours": [*OURS_AND_THE_USERS], "heavy": []}
    off = fresh_import(VERL_USE_EXTERNAL_PLUGINS="none")  # verl's switch: no plugins, so none of ours
    assert off["after_verl"] == {"ours": [], "heavy": []}


# ----------------------------------------------------------------------------------------------------------
# the one warning
# ----------------------------------------------------------------------------------------------------------
def test_the_first_advantage_call_outside_our_trainers_warns_once(capsys):
    from verl.trainer.ppo.ray_trainer import compute_advantage

    rewards_N = torch.tensor([1.0, 0.0, 1.0, 1.0])
    data = ev_batch(rewards_N, ["a", "a", "b", "b"])
    config = OmegaConf.create({"adv_estimator": "ebpo", "gamma": 1.0, "lam": 1.0})
    for _ in range(2):
        compute_advantage(data, adv_estimator="ebpo", config=config)
    lines = [line for line in capsys.readouterr().err.splitlines() if "[ebpo]" in line]
    assert len(lines) == 1
    assert "verl's launcher runs 'ebpo' without: ebpo/* metrics" in lines[0]
    fix = f"add {CALLBACK}" if callback.CALLBACK_AVAILABLE else "this verl has no checkpoint callback"
    assert fix in lines[0] and lines[0].endswith(callback.SWITCH)
    ev.HOLDER.reset()
    ev.HOLDER.managed = True  # what our trainers set: python -m ebpo.integrations.verl
    compute_advantage(data, adv_estimator="ebpo", config=config)
    assert "[ebpo]" not in capsys.readouterr().err


def ev_batch(rewards_N: torch.Tensor, uids: list[str]):
    from verl import DataProto

    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards_N.unsqueeze(1), "response_mask": torch.ones(len(uids), 1)},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )


@needs_callback
def test_the_warning_names_what_this_config_lacks_under_verls_launcher():
    plain = callback.launcher_gaps(verl_config("algorithm.adv_estimator=ebpo", CALLBACK), callback=True)
    assert len(plain) == 2 and plain[0].startswith("ebpo/* metrics") and "before verl marks" in plain[1]
    lacking = callback.launcher_gaps(
        verl_config(
            "algorithm.adv_estimator=ebpo",
            "+algorithm.ebpo.prior_scope=cluster",
            "+data.sampler.class_path=pkg://ebpo.integrations.verl",
            "+data.sampler.class_name=TopicSampler",
            "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.metric=acc",
        ),
        callback=False,
    )
    joined = " | ".join(lacking)
    assert f"add {CALLBACK}" in joined
    assert "data.sampler.class_name=TopicSampler" in joined
    assert "algorithm.ebpo.prior_scope=cluster" in joined
    assert "trainer.v1.sampler.custom_sampler.name=EBPOReplayBuffer" in joined
    # with our buffer named, the evicted groups are covered
    with_buffer = callback.launcher_gaps(
        verl_config("algorithm.adv_estimator=ebpo", "algorithm.filter_groups.enable=True", *BUFFER),
        callback=True,
    )
    assert not any("custom_sampler" in gap for gap in with_buffer)
    # in an async mode the groups' staleness reaches the estimator through our replay buffer only
    async_gaps = callback.launcher_gaps(
        verl_config(CALLBACK, "trainer.v1.trainer_mode=separate_async"), callback=True
    )
    assert any("trainer.v1.trainer_mode=separate_async" in gap and "staleness" in gap for gap in async_gaps)
    with_buffer = callback.launcher_gaps(
        verl_config(CALLBACK, "trainer.v1.trainer_mode=colocate_async", *BUFFER), callback=True
    )
    assert not any("staleness" in gap for gap in with_buffer)
    # verl's legacy trainer calls no checkpoint callback
    legacy = callback.launcher_gaps(verl_config("trainer.use_v1=false", CALLBACK), callback=True)
    assert any("legacy trainer calls no checkpoint callback" in gap for gap in legacy)


@needs_callback
def test_the_callback_refuses_what_cannot_run_under_verls_launcher():
    with pytest.raises(ValueError, match="trainer.device=cpu") as refused:
        ev.EBPOCheckpointCallback(verl_config("algorithm.adv_estimator=ebpo", "trainer.device=cpu"))
    assert callback.SWITCH in str(refused.value)
    with pytest.raises(ValueError, match="bypass_mode=true with rollout_rs=seq_max_k2"):
        ev.EBPOCheckpointCallback(
            verl_config(
                "algorithm.adv_estimator=ebpo",
                "algorithm.rollout_correction.bypass_mode=true",
                "algorithm.rollout_correction.rollout_rs=seq_max_k2",
                "algorithm.rollout_correction.rollout_rs_threshold=2.0",
            )
        )


# ----------------------------------------------------------------------------------------------------------
# the prior in verl's own checkpoints
# ----------------------------------------------------------------------------------------------------------
def verl_trainer(tmp_path: Path, *overrides: str) -> PPOTrainerSync:
    """verl's own ``PPOTrainerSync`` without workers: what its ``_save_checkpoint`` reads, the callback verl's
    ``__init__`` builds from ``trainer.checkpoint_callback_class``."""
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

    config = verl_config(
        "algorithm.adv_estimator=ebpo", CALLBACK, f"trainer.default_local_dir={tmp_path / 'ckpt'}", *overrides
    )

    class Actor:
        def save_checkpoint(self, path, *args, **kwargs):
            Path(path).mkdir(parents=True, exist_ok=True)

    trainer = object.__new__(PPOTrainerSync)
    trainer.config, trainer.trainer_mode, trainer.use_critic = config, "sync", False
    trainer.actor_rollout_wg = Actor()
    trainer.train_dataloader = SimpleNamespace(state_dict=lambda: {"cursor": 3})
    trainer.checkpoint_callback = build_checkpoint_callback(config)
    return trainer


@needs_callback
def test_verls_save_writes_the_prior_and_a_resume_restores_it(tmp_path, capsys):
    trainer = verl_trainer(tmp_path)
    assert isinstance(trainer.checkpoint_callback, ev.EBPOCheckpointCallback)
    ev.HOLDER.get("ebpo")(torch.tensor([1.0, 0.0, 1.0, 1.0]), ["a", "a", "b", "b"])
    expected = ev.HOLDER.state_dict()
    trainer.global_steps = 3
    trainer._save_checkpoint()  # verl's own: actor, data.pt, the mark, then the callback's on_save
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert torch.load(ckpt / "global_step_3" / ESTIMATOR_STATE_FILE, weights_only=False) == expected

    # a resume: verl builds the callback before it loads the checkpoint; the callback restores the prior of
    # the checkpoint resume_mode=auto picks
    ev.HOLDER.reset()
    verl_trainer(tmp_path)
    ev.HOLDER.get("ebpo")
    assert ev.HOLDER.state_dict() == expected
    warnings = [line for line in capsys.readouterr().err.splitlines() if "[ebpo]" in line]
    assert len(warnings) == 2 and all("verl's launcher runs 'ebpo'" in line for line in warnings)  # one each


@needs_callback
def test_a_marked_checkpoint_without_the_prior_stops_the_resume(tmp_path, capsys):
    # verl marks step 4 complete before it calls on_save; a kill in between leaves the mark without the prior
    ckpt = tmp_path / "ckpt"
    for step in (2, 4):
        (ckpt / f"global_step_{step}").mkdir(parents=True)
    ev.HOLDER.get("ebpo")(torch.tensor([1.0, 0.0]), ["a", "a"])
    ev.save_estimator_state(ckpt / "global_step_2")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("4")
    ev.HOLDER.reset()
    with pytest.raises(ValueError) as stopped:
        verl_trainer(tmp_path)
    message = str(stopped.value)
    assert "\n" not in message and f"{ckpt / 'global_step_4'} has no {ESTIMATOR_STATE_FILE}" in message
    assert f"trainer.resume_from_path={ckpt / 'global_step_2'}" in message
    # a checkpoint of another trainer (no prior anywhere): one warning line, an empty prior
    (ckpt / "global_step_2" / ESTIMATOR_STATE_FILE).unlink()
    capsys.readouterr()
    ev.HOLDER.reset()
    verl_trainer(tmp_path)
    lines = [line for line in capsys.readouterr().err.splitlines() if "empty prior" in line]
    assert len(lines) == 1 and str(ckpt / "global_step_4" / ESTIMATOR_STATE_FILE) in lines[0]


# ----------------------------------------------------------------------------------------------------------
# the replay buffer through verl's custom-sampler keys
# ----------------------------------------------------------------------------------------------------------
@needs_callback
def test_verls_custom_sampler_keys_build_our_buffer_with_the_trainers_settings(tmp_path):
    trainer = verl_trainer(
        tmp_path,
        *BUFFER,
        "data.train_batch_size=8",
        "+algorithm.ebpo.prior_memory=50",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",
    )
    buffer = trainer._build_replay_buffer()  # verl's own: custom buffers get its generic arguments only
    assert isinstance(buffer, v1.EBPOReplayBuffer)
    expected = v1.replay_buffer_settings(trainer.config)
    assert buffer.estimator == "ebpo" and buffer.estimator_options == {"prior_memory": 50}
    assert buffer.filter_groups_metric == "acc" == expected["filter_groups_metric"]
    assert buffer.train_batch_size == 8 and buffer.gen_batch_size == expected["gen_batch_size"] == 1
    assert not ev.HOLDER.filter_in_estimator  # v1's buffer filters; the estimator must not filter again


@pytest.mark.slow  # reads a run of the session's end-to-end runs (conftest.py)
@pytest.mark.timeout(1800)  # waits for its run, the fourth of its lane, as test_verl_e2e.py's tests do
@needs_callback
def test_verls_launcher_builds_our_callback_which_stops_a_resume_without_the_prior(e2e):
    # verl's real launcher on this CPU machine (run "launcher" of conftest.py): Hydra, Ray, verl's task runner
    # and trainer; the plugin registered our estimators and callback module there, the callback finds the
    # checkpoint verl marked at step 4 without a prior (step 2 has one) and stops the run, before verl would
    # look for GPUs. The warning names what verl's launcher lacks, once.
    if not entry_point_installed():
        pytest.skip(
            "ebpo's verl.plugins entry point is not installed here (pip install -e .[verl] installs it)"
        )
    code, output = e2e.result("launcher")
    ckpt = e2e.root_of("launcher") / "ckpt"
    assert code != 0
    assert output.count("[ebpo] WARNING: verl's launcher runs 'ebpo' without: ebpo/* metrics") == 1
    assert f"{ckpt / 'global_step_4'} has no {ESTIMATOR_STATE_FILE}" in output
    assert f"trainer.resume_from_path={ckpt / 'global_step_2'}" in output
