"""Adapters that run ``ebpo``'s estimators and samplers inside other RL frameworks.

- :mod:`ebpo.integrations.verl`: registers our advantage estimators with verl's ``register_adv_est``,
  a ``RayPPOTrainer`` subclass that checkpoints the estimator state and logs its metrics, clustered
  samplers for ``data.sampler``, an opt-in CPU mode (``trainer.device=cpu``) and a Hydra entry point
  (``python -m ebpo.integrations.verl``).
- :mod:`ebpo.integrations.trl`: ``EBPOConfig`` / ``EBPOTrainer`` (``GRPOTrainer`` with the registry's
  advantages, the estimator state in TRL checkpoints, topic / difficulty ``RepeatSampler``).

verl 0.9 and TRL 1.x cannot share one environment (verl's FSDP workers import a class TRL 1.x removed), so
each adapter has its own: ``pip install "ebpo[verl]"`` and ``pip install "ebpo[trl]"`` in separate venvs.
Nothing here is imported by the core package: import the submodule you need (each imports its framework).
"""

#: File name of the estimator state inside a framework checkpoint directory (verl's ``global_step_N/``,
#: TRL's ``checkpoint-N/``). One name for both adapters.
ESTIMATOR_STATE_FILE = "ebpo_estimator.pt"
