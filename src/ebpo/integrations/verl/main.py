"""Entry point: verl's PPO recipe with :class:`EBPORayPPOTrainer` and ``data.sampler`` support.

    python -m ebpo.integrations.verl algorithm.adv_estimator=ebpo +algorithm.ebpo.prior_scope=global ...
    python -m ebpo.integrations.verl trainer.device=cpu ...        # the opt-in CPU mode (tests, laptops)

Takes the same Hydra overrides as ``python -m verl.trainer.main_ppo`` (verl's ``ppo_trainer.yaml``). It runs
verl's synchronous single-controller trainer (``RayPPOTrainer``, verl's ``trainer.use_v1=false`` path) with
these additions: the EBPO estimator state in every checkpoint, the estimator's metrics in the logs,
``+data.sampler.class_path`` / ``class_name`` honoured (``ebpo.integrations.verl.TopicSampler`` /
``DifficultySampler``), ``algorithm.filter_groups`` with the dropped groups folded into the prior, and
``trainer.device=cpu`` (:mod:`ebpo.integrations.verl.cpu`). The task runner composes verl's own worker
setup (``BaseTaskRunner`` methods). Ray is shut down when the run ends, also on failure.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any


def _task_runner_class():
    from verl.trainer.main_ppo_v0 import BaseTaskRunner

    class EBPOTaskRunner(BaseTaskRunner):
        """verl's task runner building :class:`ebpo.integrations.verl.EBPORayPPOTrainer` and our actor worker
        (:mod:`ebpo.integrations.verl.worker`, or its CPU variant)."""

        def cpu_mode(self, config: Any) -> bool:
            return str(config.trainer.device) == "cpu"

        def add_actor_rollout_worker(self, config: Any):
            import ray

            actor_rollout_cls, worker_group_cls = super().add_actor_rollout_worker(config)
            if self.cpu_mode(config):
                from ebpo.integrations.verl.cpu.worker import CPUActorRolloutRefWorker as ours
            else:
                from ebpo.integrations.verl.worker import EBPOActorRolloutRefWorker as ours
            for role, remote_cls in list(self.role_worker_mapping.items()):
                if getattr(remote_cls, "__ray_actor_class__", None) is actor_rollout_cls:
                    self.role_worker_mapping[role] = ray.remote(ours)
            return ours, worker_group_cls

        def init_resource_pool_mgr(self, config: Any):
            manager = super().init_resource_pool_mgr(config)
            if self.cpu_mode(config):
                from ebpo.integrations.verl.cpu.worker import CPUResourcePoolManager

                manager = CPUResourcePoolManager(
                    resource_pool_spec=manager.resource_pool_spec, mapping=manager.mapping
                )
            return manager

        def run(self, config: Any) -> None:
            from omegaconf import OmegaConf
            from verl.trainer.ppo.utils import create_rl_dataset, need_critic, need_reference_policy
            from verl.utils.config import omega_conf_to_dataclass, validate_config
            from verl.utils.dataset.rl_dataset import collate_fn

            from ebpo.integrations.verl import REGISTERED
            from ebpo.integrations.verl.samplers import create_sampler
            from ebpo.integrations.verl.trainer import EBPORayPPOTrainer

            print(
                f"[ebpo] task runner on {socket.gethostname()} pid {os.getpid()}; our estimators: {REGISTERED}"
            )
            OmegaConf.resolve(config)
            _, worker_group_cls = self.add_actor_rollout_worker(config)
            self.add_critic_worker(config)
            self.add_reward_model_resource_pool(config)
            self.add_teacher_model_resource_pool(config)
            validate_config(
                config=config,
                use_reference_policy=need_reference_policy(config),
                use_critic=need_critic(config),
            )
            model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
            tokenizer, processor = model_config.tokenizer, model_config.processor
            datasets = {
                split: create_rl_dataset(
                    files,
                    config.data,
                    tokenizer,
                    processor,
                    is_train=split == "train",
                    max_samples=config.data.get(f"{split}_max_samples", -1),
                )
                for split, files in (("train", config.data.train_files), ("val", config.data.val_files))
            }
            trainer = EBPORayPPOTrainer(
                config=config,
                tokenizer=tokenizer,
                processor=processor,
                role_worker_mapping=self.role_worker_mapping,
                resource_pool_manager=self.init_resource_pool_mgr(config),
                ray_worker_group_cls=worker_group_cls,
                train_dataset=datasets["train"],
                val_dataset=datasets["val"],
                collate_fn=collate_fn,
                train_sampler=create_sampler(config.data, datasets["train"]),
            )
            trainer.init_workers()
            trainer.fit()

    return EBPOTaskRunner


def _config_dir() -> str:
    import verl.trainer

    return os.path.join(os.path.dirname(verl.trainer.__file__), "config")


def _user_override_keys() -> set[str]:
    from hydra.core.hydra_config import HydraConfig

    from ebpo.integrations.verl.cpu.config import overridden_keys

    try:
        return overridden_keys(HydraConfig.get().overrides.task)
    except ValueError:  # not under Hydra's main (a direct call of run)
        return set()


def run(config: Any) -> None:
    """Start Ray (verl's ``run_ppo``) with our task runner on verl's ``trainer.use_v1=false`` path; shut Ray
    down afterwards. ``trainer.device=cpu`` switches the CPU mode on before Ray starts."""
    import ray
    from omegaconf import open_dict
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    if str(config.trainer.device) == "cpu":
        from ebpo.integrations.verl.cpu.config import apply_cpu_mode

        apply_cpu_mode(config, _user_override_keys())
    else:
        auto_set_device(config)
    with open_dict(config):
        config.trainer.use_v1 = False
    started_ray = not ray.is_initialized()
    try:
        run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(_task_runner_class()))
    finally:
        if started_ray and ray.is_initialized():
            ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    """Hydra CLI over verl's ``ppo_trainer.yaml`` (same overrides as ``verl.trainer.main_ppo``)."""
    # importing this module already ran the package's environment check and registrations
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    import hydra

    hydra.main(config_path=_config_dir(), config_name="ppo_trainer", version_base=None)(run)()


if __name__ == "__main__":
    main()
