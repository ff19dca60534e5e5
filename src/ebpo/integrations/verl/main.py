"""Entry point: verl's PPO recipe with :class:`EBPORayPPOTrainer` and ``data.sampler`` support.

    python -m ebpo.integrations.verl algorithm.adv_estimator=ebpo +algorithm.ebpo.prior_scope=global ...

Takes the same Hydra overrides as ``python -m verl.trainer.main_ppo`` (verl's ``ppo_trainer.yaml``). It runs
verl's synchronous single-controller trainer (``RayPPOTrainer``, verl's ``trainer.use_v1=false`` path) with
three additions: the EBPO estimator state in every checkpoint, the estimator's metrics in the logs, and
``+data.sampler.class_path`` / ``class_name`` honoured (``ebpo.integrations.verl.TopicSampler`` /
``DifficultySampler``). The task runner composes verl's own worker setup (``BaseTaskRunner`` methods).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import ray
from verl.trainer.main_ppo_v0 import BaseTaskRunner


class EBPOTaskRunner(BaseTaskRunner):
    """verl's task runner building :class:`ebpo.integrations.verl.EBPORayPPOTrainer`."""

    def run(self, config: Any) -> None:
        from omegaconf import OmegaConf
        from verl.trainer.ppo.utils import create_rl_dataset, need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config
        from verl.utils.dataset.rl_dataset import collate_fn

        from ebpo.integrations.verl import REGISTERED, EBPORayPPOTrainer, create_sampler

        print(f"[ebpo] task runner on {socket.gethostname()} pid {os.getpid()}; our estimators: {REGISTERED}")
        OmegaConf.resolve(config)
        _, worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
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


def _config_dir() -> str:
    import verl.trainer

    return os.path.join(os.path.dirname(verl.trainer.__file__), "config")


def run(config: Any) -> None:
    """Start Ray (verl's ``run_ppo``) with our task runner; forces verl's ``trainer.use_v1=false`` path."""
    from omegaconf import open_dict
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    with open_dict(config):
        config.trainer.use_v1 = False
    run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(EBPOTaskRunner))


def main() -> None:
    """Hydra CLI over verl's ``ppo_trainer.yaml`` (same overrides as ``verl.trainer.main_ppo``)."""
    import hydra

    hydra.main(config_path=_config_dir(), config_name="ppo_trainer", version_base=None)(run)()


if __name__ == "__main__":
    main()
