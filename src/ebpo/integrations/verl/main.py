"""Entry point: verl's PPO trainer with EBPO's state, metrics, clusters and ``data.sampler`` support.

    python -m ebpo.integrations.verl algorithm.adv_estimator=ebpo +algorithm.ebpo.prior_scope=global ...
    python -m ebpo.integrations.verl trainer.device=cpu ...        # the opt-in CPU mode (tests, laptops)
    python -m ebpo.integrations.verl trainer.use_v1=false ...      # verl's legacy trainer
    python -m ebpo.integrations.verl actor_rollout_ref.model.path=builtin:gym ...   # a built-in model (S2)
    python -m ebpo.integrations.verl --plugins my_estimators.py algorithm.adv_estimator=median_baseline ...

Takes the same Hydra overrides as ``python -m verl.trainer.main_ppo`` (verl's ``ppo_trainer.yaml``), and
``actor_rollout_ref.model.path`` may name a built-in model as every ebpo command does (``builtin:gym``). By default
(``trainer.use_v1=true``, verl's own default) it runs verl's v1 trainer in its ``trainer.v1.trainer_mode``
(:func:`ebpo.integrations.verl.v1.trainer_class`: ``EBPOTrainerSync`` for ``sync``, ``EBPOTrainerColocateAsync``,
``EBPOTrainerSeparateAsync``; replay buffer :class:`~ebpo.integrations.verl.v1.EBPOReplayBuffer`); a mode that
cannot run here (``separate_async`` on the CPU) is refused before Ray starts. With
``trainer.use_v1=false`` it runs verl's legacy synchronous trainer (``RayPPOTrainer``) as
:class:`EBPORayPPOTrainer`. Both add: the EBPO estimator state in every checkpoint, the estimator's metrics in
the logs, ``+data.sampler.class_path`` / ``class_name`` honoured (``ebpo.integrations.verl.TopicSampler`` /
``DifficultySampler``), ``algorithm.filter_groups`` with the dropped groups folded into the prior, and
``trainer.device=cpu`` (:mod:`ebpo.integrations.verl.cpu`), a quiet log (:mod:`ebpo.integrations.verl.quiet`;
``VERBOSE=1`` shows every message). Ray is shut down when the run ends, also on failure. ``--plugins NAME``
(before the overrides; repeatable or comma-separated; :mod:`ebpo.plugins`) imports your own estimators before
the config is read, here and in every Ray process of the run (``$EBPO_PLUGINS``); installed ``ebpo.plugins``
entry points are loaded everywhere without it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any

from ebpo import console
from ebpo.integrations.verl.estimators import to_plain
from ebpo.integrations.verl.quiet import QUIET_ENV, verbose_requested
from ebpo.integrations.verl.quiet import install as quiet_log

logger = logging.getLogger(__name__)


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

            console.setup()  # this Ray process's messages, as the launcher's console shows them
            logger.info(
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


def _task_runner_v1_class():
    """Task runner of verl's v1 trainer (verl's ``TaskRunnerV1.run``, composed with our trainer class)."""

    class EBPOTaskRunnerV1:
        """Runs our trainer of ``trainer.v1.trainer_mode`` (:func:`~ebpo.integrations.verl.v1.trainer_class`) with
        verl's TransferQueue agent loop."""

        def run(self, config: Any) -> None:
            import transfer_queue as tq
            from omegaconf import OmegaConf
            from verl.trainer.ppo.utils import need_critic, need_reference_policy
            from verl.trainer.ppo.v1 import AgentLoopManagerTQ
            from verl.utils.config import validate_config
            from verl.utils.import_utils import load_class_from_fqn
            from verl.utils.logging_utils import configure_verl_logging

            from ebpo.integrations.verl import REGISTERED
            from ebpo.integrations.verl.v1 import trainer_class

            configure_verl_logging()
            console.setup()  # this Ray process's messages, as the launcher's console shows them
            logger.info(
                f"[ebpo] v1 task runner on {socket.gethostname()} pid {os.getpid()}; our estimators: {REGISTERED}"
            )
            config.transfer_queue.enable = True
            OmegaConf.resolve(config)
            validate_config(
                config=config,
                use_reference_policy=need_reference_policy(config),
                use_critic=need_critic(config),
            )
            tq.init(config.transfer_queue)
            trainer = None
            succeeded = False
            try:
                trainer = trainer_class(config)(config=config)
                trainer.init()
                manager_fqn = config.actor_rollout_ref.rollout.get("agent", {}).get(
                    "agent_loop_manager_class"
                )
                manager_cls = (
                    load_class_from_fqn(manager_fqn, "AgentLoopManager")
                    if manager_fqn
                    else AgentLoopManagerTQ
                )
                agent_loop_manager = manager_cls.create(
                    config=config,
                    llm_client=trainer.get_llm_client(),
                    teacher_client=trainer.get_teacher_client(),
                    reward_loop_worker_handles=trainer.get_reward_handles(),
                )
                trainer.fit(agent_loop_manager)
                succeeded = True
            finally:
                try:
                    tracking = getattr(trainer, "logger", None)
                    if tracking is not None:
                        tracking.finish(exit_code=0 if succeeded else 1)
                finally:
                    tq.close()

    return EBPOTaskRunnerV1


def _configure_v1(config: Any) -> None:
    """Refuse a mode that cannot run here (one line, before Ray starts) and route the replay buffer to ours."""
    from omegaconf import open_dict

    from ebpo.integrations.verl.v1 import replay_buffer_settings, unsupported_mode

    message = unsupported_mode(config)
    if message is not None:
        raise SystemExit(f"ebpo.integrations.verl: {message}")
    sampler = config.trainer.v1.sampler
    custom = dict(to_plain(sampler.get("custom_sampler", None)) or {})
    ours = {"path": "pkg://ebpo.integrations.verl.v1", "name": "EBPOReplayBuffer"}
    if custom.get("path"):
        from verl.utils.import_utils import load_extern_object

        from ebpo.integrations.verl.v1 import EBPOReplayBuffer

        path, name = str(custom["path"]), str(custom.get("name"))
        cls = load_extern_object(path, name)
        if not (isinstance(cls, type) and issubclass(cls, EBPOReplayBuffer)):
            raise SystemExit(
                f"ebpo.integrations.verl: trainer.v1.sampler.custom_sampler={path}:{name} would "
                "replace ebpo's replay buffer (which feeds the groups algorithm.filter_groups evicts to the "
                "prior); make it a subclass of ebpo.integrations.verl.v1.EBPOReplayBuffer"
            )
        ours = {"path": path, "name": name}
    with open_dict(config):
        sampler.custom_sampler = ours
        kwargs = dict(to_plain(sampler.get("sampler_kwargs", None)) or {})
        try:
            kwargs["ebpo"] = replay_buffer_settings(config)
        except ValueError as error:
            console.show_traceback(error)
            raise SystemExit(f"ebpo.integrations.verl: {error}") from None
        sampler.sampler_kwargs = kwargs


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


def _set_process_env(config: Any, env: dict[str, str]) -> None:
    """``env`` in this process and in every Ray process of the run (``ray_kwargs.ray_init.runtime_env``)."""
    from omegaconf import open_dict

    os.environ.update(env)
    with open_dict(config):
        init = config.ray_kwargs.ray_init
        if init.get("runtime_env", None) is None:
            init.runtime_env = {}
        env_vars = dict(to_plain(init.runtime_env.get("env_vars", None)) or {})
        init.runtime_env.env_vars = {**env, **env_vars}


def _resolve_model_path(config: Any) -> None:
    """``actor_rollout_ref.model.path`` naming a built-in model (``builtin:gym``, ``builtin:arith``,
    ``builtin``) becomes its directory, read as every ebpo command reads it
    (``ebpo.models.names.resolve_model``); any other value is verl's to read."""
    from omegaconf import open_dict

    from ebpo.errors import ConfigError
    from ebpo.models.names import builtin_recipe, resolve_model

    path = config.actor_rollout_ref.model.get("path", None)
    try:
        if path is None or builtin_recipe(str(path)) is None:
            return
        directory = resolve_model(str(path)).path
    except ConfigError as error:
        console.show_traceback(error)
        raise SystemExit(f"ebpo.integrations.verl: actor_rollout_ref.model.path: {error}") from None
    with open_dict(config):
        config.actor_rollout_ref.model.path = str(directory)


def run(config: Any) -> None:
    """Start Ray (verl's ``run_ppo``) with our task runner for ``trainer.use_v1`` (v1 sync by default, the
    legacy trainer with ``false``); shut Ray down afterwards. ``trainer.device=cpu`` switches the CPU mode on
    before Ray starts."""
    import ray
    from omegaconf import open_dict
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    from ebpo.integrations.verl.estimators import refuse_rejection_after_advantage

    try:
        refuse_rejection_after_advantage(config.algorithm)
    except ValueError as error:
        console.show_traceback(error)
        raise SystemExit(f"ebpo.integrations.verl: {error}") from None
    _resolve_model_path(config)
    if not verbose_requested():
        quiet_log()
        _set_process_env(config, {QUIET_ENV: "1"})
    from ebpo.plugins import ENV_VAR

    if os.environ.get(ENV_VAR):  # the plugins of --plugins (main), imported in every Ray process too
        _set_process_env(config, {ENV_VAR: os.environ[ENV_VAR]})
    use_v1 = bool(config.trainer.get("use_v1", True))
    if str(config.trainer.device) == "cpu":
        from ebpo.integrations.verl.cpu.config import apply_cpu_mode, legacy_cpu_refusal

        refusal = None if use_v1 else legacy_cpu_refusal()
        if refusal:
            raise SystemExit(f"ebpo.integrations.verl: {refusal}")
        apply_cpu_mode(config, _user_override_keys())
    else:
        auto_set_device(config)
    if use_v1:
        _configure_v1(config)
    else:
        with open_dict(config):
            config.trainer.use_v1 = False
    runner = _task_runner_v1_class() if use_v1 else _task_runner_class()
    started_ray = not ray.is_initialized()
    try:
        run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(runner))
    finally:
        if started_ray and ray.is_initialized():
            ray.shutdown()


def take_plugins(argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` split into the names of ``--plugins NAME`` / ``--plugins=NAME`` and the rest (Hydra's)."""
    names, rest, words = [], [], iter(argv)
    for word in words:
        if word == "--plugins":
            value = next(words, None)
            if value is None:
                raise SystemExit("ebpo.integrations.verl: --plugins needs a NAME (a .py file or a module)")
            names.append(value)
        elif word.startswith("--plugins="):
            names.append(word.split("=", 1)[1])
        else:
            rest.append(word)
    return names, rest


def main(argv: list[str] | None = None) -> None:
    """Hydra CLI over verl's ``ppo_trainer.yaml`` (same overrides as ``verl.trainer.main_ppo``), after
    ``--plugins``. The console of :mod:`ebpo.console` (``EBPO_DEBUG=1``: the traceback behind a one-line
    error)."""
    console.setup()
    # importing this module already ran the package's environment check and registrations
    from ebpo.integrations.verl.registration import register_plugins
    from ebpo.plugins import ENV_VAR, PluginError

    names, overrides = take_plugins(sys.argv[1:] if argv is None else list(argv))
    if names:
        try:
            resolved = register_plugins(names)
        except PluginError as error:
            console.show_traceback(error)
            raise SystemExit(f"ebpo.integrations.verl: {error}") from None
        os.environ[ENV_VAR] = os.pathsep.join([*filter(None, [os.environ.get(ENV_VAR)]), *resolved])
    sys.argv = [sys.argv[0], *overrides]
    import hydra

    hydra.main(config_path=_config_dir(), config_name="ppo_trainer", version_base=None)(run)()


if __name__ == "__main__":
    main()
