"""The estimator registry (``ebpo.advantages.registry``): names, options, plugins, and the errors for
unknown ones."""

from __future__ import annotations

import pytest
import torch

import ebpo
from helpers.advantages import INDEX, REWARDS, close


def test_registry_names_and_errors():
    assert ebpo.list_estimators() == ["dr_grpo", "ebpo", "grpo", "jspo", "reinforce_pp_baseline", "rloo"]
    with pytest.raises(
        ValueError,
        match=r"'gpro'.*dr_grpo, ebpo, grpo, jspo, reinforce_pp_baseline, rloo; a name of your own is registered by its plugin",
    ):
        ebpo.get_estimator("gpro")
    with pytest.raises(TypeError, match=r"\['shrink'\].*prior_scope"):
        ebpo.get_estimator("ebpo", shrink=0.5)
    with pytest.raises(TypeError, match="norm_by_std"):
        ebpo.get_estimator("rloo", norm_by_std=False)
    with pytest.raises(ValueError, match=r"normalize 'token'.*batch, group, none, prior$"):
        ebpo.get_estimator("ebpo", normalize="token")
    with pytest.raises(ValueError, match="prior_memory"):
        ebpo.get_estimator("ebpo", prior_memory="forever")
    with pytest.raises(ValueError, match=r"cluster_min_groups.*2\.5"):
        ebpo.get_estimator("ebpo", cluster_min_groups=2.5)  # refused, not truncated to 2


def test_register_custom_estimator():
    @ebpo.register_estimator("test_constant_one")
    class ConstantOne(ebpo.AdvantageEstimator):
        def _advantages(self, batch):
            return torch.ones_like(batch.rewards_N), {}

    try:
        assert "test_constant_one" in ebpo.list_estimators()
        close(ebpo.get_estimator("test_constant_one")(REWARDS, INDEX), [1.0] * 12)
    finally:
        ebpo.advantages.registry._ESTIMATORS.unregister("test_constant_one")
