"""Adapters that run ``ebpo``'s estimators and samplers inside other RL frameworks.

- :mod:`ebpo.integrations.verl`: registers our advantage estimators with verl's ``register_adv_est``,
  a ``RayPPOTrainer`` subclass that checkpoints the estimator state and logs its metrics, clustered
  samplers for ``data.sampler``, and a Hydra entry point (``python -m ebpo.integrations.verl``).
- :mod:`ebpo.integrations.trl`: ``EBPOConfig`` / ``EBPOTrainer`` (``GRPOTrainer`` with the registry's
  advantages, the estimator state in TRL checkpoints, topic / difficulty ``RepeatSampler``).

Nothing here is imported by the core package: import the submodule you need (each imports its framework).
"""
