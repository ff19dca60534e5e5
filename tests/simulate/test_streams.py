"""Tests for ebpo.simulate.streams: the synthetic RLVR streams of both studies."""

from __future__ import annotations

import numpy as np
import pytest

from ebpo.simulate import SimulateConfig, make_stream

SMALL = dict(steps=24, warmup=4, prompts_per_step=8, pool_size=16, topic_block=3, theorem2_steps=30)


def test_make_stream_structure():
    cfg = SimulateConfig(num_topics=3, **SMALL)
    topic = make_stream(cfg, "topic", "stationary", seed=1)
    S, M = cfg.steps, cfg.prompts_per_step
    assert topic.rewards_SMG.shape == (S, M, cfg.group_size)
    assert set(np.unique(topic.rewards_SMG)) <= {0.0, 1.0}
    # topic-coherent: one topic per step, constant over blocks of topic_block steps, each topic used
    assert np.all(topic.topic_SM == topic.topic_SM[:, :1])
    blocks = topic.topic_SM[:, 0].reshape(-1, cfg.topic_block)
    assert np.all(blocks == blocks[:, :1])
    assert set(topic.topic_SM[:, 0]) == {0, 1, 2}
    # the stationary oracle topic means do not move; the improving ones rise (drift 2 in logits)
    topic0_means = topic.oracle_topic_mean_SM[topic.topic_SM == 0]
    assert np.allclose(topic0_means, topic0_means[0])
    improving = make_stream(cfg, "topic", "improving", seed=1)
    assert np.all(improving.oracle_global_mean_SM[-1] > improving.oracle_global_mean_SM[0] + 0.1)
    assert np.all(np.diff(improving.oracle_global_mean_SM[:, 0]) > 0)
    shuffled = make_stream(cfg, "shuffled", "stationary", seed=1)
    assert len(np.unique(shuffled.topic_SM[0])) > 1  # prompts of several topics in one step
    # harder topic (index 0) has the lower mean latent rate
    means = [shuffled.theta_SM[shuffled.topic_SM == k].mean() for k in range(3)]
    assert means[0] < means[1] < means[2]
    with pytest.raises(ValueError, match=r"'sorted', 'stationary'$"):
        make_stream(cfg, "sorted", "stationary", seed=0)


def test_staleness_stream_samples_by_older_weights():
    from ebpo.simulate import StalenessSettings, staleness_stream

    cfg = StalenessSettings(
        lags=[4], drifts=[8.0], memories=["all"], seeds=[0], steps=12, prompts_per_step=16
    )
    stream = staleness_stream(cfg, max_lag=4, drift=8.0, seed=0)
    S, M, G = cfg.steps, cfg.prompts_per_step, cfg.group_size
    assert stream["rewards_SMG"].shape == (S, M, G)
    lag_SM = stream["lag_SM"]
    assert lag_SM.min() == 0 and lag_SM.max() == 4
    assert np.all(lag_SM <= np.arange(S)[:, None])  # never older than the first version
    # an improving policy: a lagged group's sampling rate is below its rate under the current weights
    lagged = lag_SM > 0
    assert np.all(stream["p_sample_SM"][lagged] < stream["p_now_SM"][lagged])
    np.testing.assert_array_equal(stream["p_sample_SM"][~lagged], stream["p_now_SM"][~lagged])
    assert np.all(np.diff(stream["pool_now_S"]) > 0)
    again = staleness_stream(cfg, max_lag=4, drift=8.0, seed=0)
    np.testing.assert_array_equal(again["rewards_SMG"], stream["rewards_SMG"])
