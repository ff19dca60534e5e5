"""Tests for ebpo.losses: hand-derived values, loop references, masking invariance, EntropyMech selection."""

from __future__ import annotations

import math

import pytest
import torch

from ebpo.losses import (
    AGG_MODES,
    PolicyLossConfig,
    agg_loss,
    entropy_from_logits,
    get_policy_loss,
    kl_penalty,
    list_policy_losses,
    overlong_penalty,
)

E = math.e


def _cfg(**overrides) -> PolicyLossConfig:
    overrides.setdefault("max_response_len", 8)
    return PolicyLossConfig(**overrides)


# ----------------------------------------------------------------------------------------------
# registry and config


def test_registry_lists_the_three_losses_and_rejects_unknown_names():
    assert list_policy_losses() == ["clip_cov", "kl_cov", "vanilla"]
    with pytest.raises(
        ValueError, match=r"'ppo'.*clip_cov, kl_cov, vanilla; a name of your own is registered by its plugin"
    ):
        get_policy_loss("ppo")


@pytest.mark.parametrize(
    "bad, match",
    [
        (
            {"loss_agg_mode": "mean"},
            "'mean'.*seq-mean-token-mean, ",
        ),
        ({"dual_clip_c": 1.0}, r"^dual_clip_c .*1\.0$"),
        (
            {"loss_agg_mode": "seq-mean-token-sum-norm", "max_response_len": None},
            "^loss_agg_mode='seq-mean-token-sum-norm'.*max_response_len",
        ),
        ({"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}, r"clip_cov_lb < clip_cov_ub, got 5\.0 >= 1\.0"),
        ({"kl_cov_ratio": 0.0}, r"kl_cov_ratio .*\(0, 1\].*, 0\.0$"),
    ],
)
def test_config_rejects_bad_settings(bad, match):
    with pytest.raises(ValueError, match=match):
        PolicyLossConfig(**bad)


def test_bad_shapes_raise():
    loss_fn = get_policy_loss("vanilla")
    logp_BT = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"^adv .*\(2, 3\), got \(3,\)$"):
        loss_fn(logp_BT, logp_BT, torch.zeros(3), torch.ones(2, 3), _cfg())
    with pytest.raises(ValueError, match=r"^logp \(2, 3\), old_logp \(2, 4\) and mask \(2, 3\)"):
        loss_fn(logp_BT, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3), _cfg())


# ----------------------------------------------------------------------------------------------
# vanilla: hand-derived values


def _hand_batch():
    # token (row, col): d = logp - old_logp, A
    # (0,0): d = 1,  A = +1: ratio e clips to 1.2, loss = max(-e, -1.2) = -1.2   (PPO clip active)
    # (0,1): d = 0,  A = +1: ratio 1, loss = -1                                 (nothing active)
    # (1,0): d = 2,  A = -1: ratio e^2 = 7.389, loss = max(7.389, 1.2) = 7.389;
    #                        dual clip min(7.389, 3 * 1) = 3                     (dual clip active)
    # (1,1): d = -1, A = -1: ratio e^-1 = 0.368 clips to 0.8, loss = max(0.368, 0.8) = 0.8 (PPO clip)
    old_logp_BT = torch.tensor([[-2.0, -1.0], [-3.0, -1.0]], dtype=torch.float64)
    d_BT = torch.tensor([[1.0, 0.0], [2.0, -1.0]], dtype=torch.float64)
    adv_BT = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    return old_logp_BT + d_BT, old_logp_BT, adv_BT, torch.ones(2, 2, dtype=torch.bool)


def test_vanilla_hand_values_with_dual_clip():
    logp_BT, old_logp_BT, adv_BT, mask_BT = _hand_batch()
    loss, metrics = get_policy_loss("vanilla")(logp_BT, old_logp_BT, adv_BT, mask_BT, _cfg())
    # token-mean: (-1.2 - 1 + 3 + 0.8) / 4 = 1.6 / 4 = 0.4
    assert loss.item() == pytest.approx(0.4, abs=1e-12)
    assert metrics["actor/pg_loss"] == pytest.approx(0.4, abs=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 4)  # tokens (0,0) and (1,1)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 4)  # token (1,0)
    # ppo_kl = mean(old - logp) = -(1 + 0 + 2 - 1) / 4 = -0.5
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.5)


def test_vanilla_hand_values_without_dual_clip_and_clip_higher():
    logp_BT, old_logp_BT, adv_BT, mask_BT = _hand_batch()
    loss, metrics = get_policy_loss("vanilla")(
        logp_BT, old_logp_BT, adv_BT, mask_BT, _cfg(dual_clip_c=None, clip_eps_high=0.28)
    )
    # (0,0) now clips to 1.28: -1.28; (1,0) keeps e^2; (0,1) = -1; (1,1) = 0.8 (eps_low still 0.2)
    expected = (-1.28 - 1.0 + E**2 + 0.8) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0


def test_vanilla_per_sequence_advantage_broadcasts_over_tokens():
    gen = torch.Generator().manual_seed(3)
    logp_BT = -torch.rand(4, 6, generator=gen, dtype=torch.float64)
    old_logp_BT = logp_BT + 0.3 * torch.randn(4, 6, generator=gen, dtype=torch.float64)
    adv_B = torch.randn(4, generator=gen, dtype=torch.float64)
    mask_BT = torch.rand(4, 6, generator=gen) > 0.3
    loss_fn = get_policy_loss("vanilla")
    loss_seq, _ = loss_fn(logp_BT, old_logp_BT, adv_B, mask_BT, _cfg())
    loss_tok, _ = loss_fn(logp_BT, old_logp_BT, adv_B[:, None].expand(4, 6), mask_BT, _cfg())
    assert loss_seq.item() == pytest.approx(loss_tok.item(), abs=1e-12)


def test_extreme_log_ratio_is_clamped_and_finite():
    # d = 100 would overflow exp in float32; clamped to 20 -> ratio e^20; A = -1 with no dual clip
    # gives loss e^20 (finite), and with the dual clip 3.
    logp_BT = torch.tensor([[50.0]])
    old_logp_BT = torch.tensor([[-50.0]])
    adv_BT = torch.tensor([[-1.0]])
    mask_BT = torch.ones(1, 1)
    loss, _ = get_policy_loss("vanilla")(logp_BT, old_logp_BT, adv_BT, mask_BT, _cfg(dual_clip_c=None))
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-6)
    loss, _ = get_policy_loss("vanilla")(logp_BT, old_logp_BT, adv_BT, mask_BT, _cfg())
    assert loss.item() == pytest.approx(3.0)


# ----------------------------------------------------------------------------------------------
# aggregation


def test_agg_loss_hand_values_every_mode():
    # row 0: three tokens 1, 2, 3; row 1: one token 4 (rest masked, huge values there must not leak);
    # row 2: fully masked, so it is not a sequence of the batch.
    loss_BT = torch.tensor([[1.0, 2.0, 3.0], [4.0, 1e9, float("nan")], [7.0, 7.0, 7.0]])
    mask_BT = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # token-mean: (1 + 2 + 3 + 4) / 4 tokens = 2.5
    assert agg_loss(loss_BT, mask_BT, "token-mean").item() == pytest.approx(2.5)
    # seq-mean-token-sum: (6 + 4) / 2 sequences = 5
    assert agg_loss(loss_BT, mask_BT, "seq-mean-token-sum").item() == pytest.approx(5.0)
    # seq-mean-token-mean: (6/3 + 4/1) / 2 = 3
    assert agg_loss(loss_BT, mask_BT, "seq-mean-token-mean").item() == pytest.approx(3.0)
    # seq-mean-token-sum-norm with max_len 5: 10 / (5 * 2) = 1
    assert agg_loss(loss_BT, mask_BT, "seq-mean-token-sum-norm", max_len=5).item() == pytest.approx(1.0)


def test_agg_loss_errors_and_empty_mask():
    loss_BT = torch.ones(2, 3)
    with pytest.raises(
        ValueError,
        match=r"'sum'; .*seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm, token-mean$",
    ):
        agg_loss(loss_BT, torch.ones(2, 3), "sum")
    with pytest.raises(ValueError, match=r"'seq-mean-token-sum-norm'.*max_len"):
        agg_loss(loss_BT, torch.ones(2, 3), "seq-mean-token-sum-norm")
    for mode in AGG_MODES:
        assert agg_loss(loss_BT, torch.zeros(2, 3), mode, max_len=4).item() == 0.0


def _agg_loop(loss_BT: torch.Tensor, mask_BT: torch.Tensor, mode: str, max_len: int) -> float:
    """Slow reference: explicit loops over sequences and tokens."""
    seq_sums, seq_means, total, count = [], [], 0.0, 0
    for b in range(loss_BT.shape[0]):
        values = [float(loss_BT[b, t]) for t in range(loss_BT.shape[1]) if mask_BT[b, t]]
        if values:
            seq_sums.append(sum(values))
            seq_means.append(sum(values) / len(values))
            total += sum(values)
            count += len(values)
    if count == 0:
        return 0.0
    return {
        "token-mean": total / count,
        "seq-mean-token-sum": sum(seq_sums) / len(seq_sums),
        "seq-mean-token-mean": sum(seq_means) / len(seq_means),
        "seq-mean-token-sum-norm": total / (max_len * len(seq_sums)),
    }[mode]


def _vanilla_token_loop(d: float, a: float, eps_low: float, eps_high: float, c: float | None) -> float:
    d = min(max(d, -20.0), 20.0)
    ratio = math.exp(d)
    loss = max(-a * ratio, -a * min(max(ratio, 1 - eps_low), 1 + eps_high))
    if c is not None and a < 0:
        loss = min(loss, -a * c)
    return loss


def _random_batch(seed: int, dtype=torch.float64, min_size: int = 1):
    gen = torch.Generator().manual_seed(seed)
    B = int(torch.randint(min_size, 7, (1,), generator=gen))
    T = int(torch.randint(min_size, 9, (1,), generator=gen))
    logp_BT = -3 * torch.rand(B, T, generator=gen, dtype=dtype)
    old_logp_BT = logp_BT + 0.4 * torch.randn(B, T, generator=gen, dtype=dtype)
    adv_BT = torch.randn(B, T, generator=gen, dtype=dtype)
    mask_BT = torch.rand(B, T, generator=gen) > 0.3
    return logp_BT, old_logp_BT, adv_BT, mask_BT


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mode", AGG_MODES)
def test_vanilla_matches_loop_reference(seed, mode):
    logp_BT, old_logp_BT, adv_BT, mask_BT = _random_batch(seed)
    cfg = _cfg(loss_agg_mode=mode, clip_eps_high=0.28, dual_clip_c=None if seed % 2 else 3.0)
    loss, metrics = get_policy_loss("vanilla")(logp_BT, old_logp_BT, adv_BT, mask_BT, cfg)
    B, T = logp_BT.shape
    token_loss_BT = torch.tensor(
        [
            [
                _vanilla_token_loop(
                    float(logp_BT[b, t] - old_logp_BT[b, t]),
                    float(adv_BT[b, t]),
                    cfg.clip_eps_low,
                    cfg.clip_eps_high,
                    cfg.dual_clip_c,
                )
                for t in range(T)
            ]
            for b in range(B)
        ],
        dtype=torch.float64,
    )
    assert loss.item() == pytest.approx(
        _agg_loop(token_loss_BT, mask_BT, mode, cfg.max_response_len), abs=1e-10
    )
    valid = [(b, t) for b in range(B) for t in range(T) if mask_BT[b, t]]
    expected_kl = sum(float(old_logp_BT[b, t] - logp_BT[b, t]) for b, t in valid) / max(len(valid), 1)
    assert metrics["actor/ppo_kl"] == pytest.approx(expected_kl, abs=1e-10)


# ----------------------------------------------------------------------------------------------
# masked tokens change nothing


@pytest.mark.parametrize("name", ["vanilla", "clip_cov", "kl_cov"])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_masked_tokens_change_neither_loss_nor_gradient(name, mode):
    logp_BT, old_logp_BT, adv_BT, mask_BT = _random_batch(seed=7)
    mask_BT[0, 0] = False  # at least one masked token
    mask_BT[-1, -1] = True  # at least one valid token
    # loose Clip-Cov bounds so that it actually drops tokens in this batch
    cfg_kwargs = dict(
        loss_agg_mode=mode, clip_cov_lb=-10.0, clip_cov_ub=10.0, clip_cov_ratio=0.3, kl_cov_ratio=0.3
    )
    gen = torch.Generator().manual_seed(99)
    junk_BT = 1e3 * torch.randn(logp_BT.shape, generator=gen, dtype=torch.float64)

    def run(logp, old_logp, adv):
        logp = logp.clone().requires_grad_(True)
        cfg = _cfg(generator=torch.Generator().manual_seed(5), **cfg_kwargs)
        loss, metrics = get_policy_loss(name)(logp, old_logp, adv, mask_BT, cfg)
        loss.backward()
        return loss.detach(), logp.grad, metrics

    loss_a, grad_a, metrics_a = run(logp_BT, old_logp_BT, adv_BT)
    changed = ~mask_BT
    loss_b, grad_b, metrics_b = run(
        torch.where(changed, junk_BT, logp_BT),
        torch.where(changed, -junk_BT, old_logp_BT),
        torch.where(changed, junk_BT, adv_BT),
    )
    assert torch.isfinite(loss_b)
    assert loss_a.item() == pytest.approx(loss_b.item(), abs=1e-12)
    assert torch.allclose(grad_a, grad_b, atol=1e-12)
    assert torch.all(grad_b[changed] == 0)
    assert metrics_a == pytest.approx(metrics_b, abs=1e-12)


# ----------------------------------------------------------------------------------------------
# EntropyMech: Clip-Cov and KL-Cov select the right tokens


def _cov_batch():
    # one sequence, four tokens. A = [3, 1, -1, -3] (mean 0); logp = [-1, -3, -3.5, -4.5] (mean -3),
    # centred logp = [2, 0, -0.5, -1.5]. Cov_t = A_t * centred logp_t = [6, 0, 0.5, 4.5].
    adv_BT = torch.tensor([[3.0, 1.0, -1.0, -3.0]], dtype=torch.float64)
    logp_BT = torch.tensor([[-1.0, -3.0, -3.5, -4.5]], dtype=torch.float64)
    return logp_BT, adv_BT, torch.ones(1, 4, dtype=torch.bool)


def _loss_and_grad(name, logp_BT, old_logp_BT, adv_BT, mask_BT, cfg):
    logp = logp_BT.clone().requires_grad_(True)
    loss, metrics = get_policy_loss(name)(logp, old_logp_BT, adv_BT, mask_BT, cfg)
    loss.backward()
    return loss.item(), logp.grad, metrics


@pytest.mark.parametrize("ratio, selected", [(0.25, [0]), (0.5, [0, 3]), (0.75, [0, 3, 2])])
def test_kl_cov_selects_top_covariance_tokens(ratio, selected):
    logp_BT, adv_BT, mask_BT = _cov_batch()
    old_logp_BT = logp_BT + 0.5  # logp - old = -0.5 everywhere: ratio e^-0.5, |logp - old| = 0.5
    cfg = _cfg(loss_agg_mode="seq-mean-token-sum", kl_cov_ratio=ratio, kl_cov_coef=2.0)
    loss, grad_BT, metrics = _loss_and_grad("kl_cov", logp_BT, old_logp_BT, adv_BT, mask_BT, cfg)
    # k = max(1, floor(ratio * 4)) tokens of largest Cov: Cov = [6, 0, 0.5, 4.5] -> order 0, 3, 2, 1.
    r = math.exp(-0.5)
    is_sel = torch.zeros(1, 4, dtype=torch.float64)
    is_sel[0, selected] = 1.0
    # loss per token: -A r (+ 2 * 0.5 on selected); seq-mean-token-sum of one sequence = plain sum.
    # sum(-A) = 0, so the loss is 1.0 per selected token.
    assert loss == pytest.approx(1.0 * len(selected), abs=1e-12)
    # d/dlogp (-A r) = -A r; d/dlogp 2 |logp - old| = 2 * sign(-0.5) = -2 on selected tokens
    assert torch.allclose(grad_BT, -adv_BT * r - 2.0 * is_sel, atol=1e-12)
    assert metrics["actor/kl_cov_frac"] == pytest.approx(len(selected) / 4)
    assert metrics["actor/pg_clipfrac"] == 0.0  # KL-Cov never clips


def test_clip_cov_drops_the_only_candidate_in_the_band():
    logp_BT, adv_BT, mask_BT = _cov_batch()
    cfg = _cfg(loss_agg_mode="seq-mean-token-sum", clip_cov_ratio=0.25, clip_cov_lb=1.0, clip_cov_ub=5.0)
    # ratio 1 everywhere (old = logp): nothing PPO-clipped. Cov = [6, 0, 0.5, 4.5]: only token 3 lies in
    # (1, 5) (token 0 is above ub); k = max(1, floor(0.25 * 4)) = 1, so token 3 is dropped.
    loss, grad_BT, metrics = _loss_and_grad("clip_cov", logp_BT, logp_BT.clone(), adv_BT, mask_BT, cfg)
    # remaining losses -A: -3 - 1 + 1 = -3
    assert loss == pytest.approx(-3.0, abs=1e-12)
    assert torch.allclose(grad_BT, torch.tensor([[-3.0, -1.0, 1.0, 0.0]], dtype=torch.float64))
    assert metrics["actor/clip_cov_frac"] == pytest.approx(0.25)


@pytest.mark.parametrize(
    "shift, token3_loss",
    [
        # old = logp + 0.5: ratio e^-0.5 = 0.61 < 0.8 with A = -3, the PPO clip is active: -(-3) * 0.8 = 2.4
        (0.5, 2.4),
        # old = logp - 2: ratio e^2 = 7.39, max(3 * 7.39, 3 * 1.2) = 22.2 > dual bound 3 * 3 = 9: dual clip, 9
        (-2.0, 9.0),
    ],
)
def test_clip_cov_skips_tokens_already_clipped(shift, token3_loss):
    logp_BT, adv_BT, mask_BT = _cov_batch()
    old_logp_BT = logp_BT.clone()
    old_logp_BT[0, 3] += shift
    cfg = _cfg(loss_agg_mode="seq-mean-token-sum", clip_cov_ratio=0.25)
    loss, grad_BT, metrics = _loss_and_grad("clip_cov", logp_BT, old_logp_BT, adv_BT, mask_BT, cfg)
    # token 3 (the only one in the band, Cov 4.5) is already clipped, so no candidate: nothing dropped.
    # losses: -3, -1, +1 (ratio 1) and token 3's clipped constant (zero gradient)
    assert metrics["actor/clip_cov_frac"] == 0.0
    assert loss == pytest.approx(-3.0 - 1.0 + 1.0 + token3_loss, abs=1e-12)
    assert torch.allclose(grad_BT, torch.tensor([[-3.0, -1.0, 1.0, 0.0]], dtype=torch.float64))


def _cov_loop(adv_BT, logp_BT, mask_BT):
    valid = [(b, t) for b in range(adv_BT.shape[0]) for t in range(adv_BT.shape[1]) if mask_BT[b, t]]
    mean_a = sum(float(adv_BT[p]) for p in valid) / len(valid)
    mean_l = sum(float(logp_BT[p]) for p in valid) / len(valid)
    return {p: (float(adv_BT[p]) - mean_a) * (float(logp_BT[p]) - mean_l) for p in valid}


@pytest.mark.parametrize("seed", range(8))
def test_kl_cov_matches_loop_reference(seed):
    # at least 3 valid tokens: with 2 the two covariances are always equal (a tie top-k may break either way)
    logp_BT, old_logp_BT, adv_BT, mask_BT = _random_batch(seed + 100, min_size=2)
    mask_BT[0, :2] = True
    mask_BT[1, 0] = True
    cfg = _cfg(loss_agg_mode="token-mean", kl_cov_ratio=0.2, kl_cov_coef=1.0)
    loss, _ = get_policy_loss("kl_cov")(logp_BT, old_logp_BT, adv_BT, mask_BT, cfg)
    cov = _cov_loop(adv_BT, logp_BT, mask_BT)
    k = max(1, math.floor(0.2 * len(cov)))
    chosen = set(sorted(cov, key=lambda p: -cov[p])[:k])
    total = 0.0
    for p in cov:
        d = float(logp_BT[p] - old_logp_BT[p])
        total += -float(adv_BT[p]) * math.exp(d) + (abs(d) if p in chosen else 0.0)
    assert loss.item() == pytest.approx(total / len(cov), abs=1e-10)


@pytest.mark.parametrize("seed", range(8))
def test_clip_cov_drops_k_random_candidates_reproducibly(seed):
    logp_BT, old_logp_BT, adv_BT, mask_BT = _random_batch(seed + 200, min_size=2)
    mask_BT[0, 0] = True
    cfg_kwargs = dict(
        loss_agg_mode="seq-mean-token-sum", clip_cov_ratio=0.1, clip_cov_lb=-0.5, clip_cov_ub=0.5
    )

    def dropped(gen_seed):
        cfg = _cfg(generator=torch.Generator().manual_seed(gen_seed), dual_clip_c=None, **cfg_kwargs)
        _, grad_BT, metrics = _loss_and_grad("clip_cov", logp_BT, old_logp_BT, adv_BT, mask_BT, cfg)
        vanilla = _cfg(dual_clip_c=None, **cfg_kwargs)
        _, grad_ref_BT, _ = _loss_and_grad("vanilla", logp_BT, old_logp_BT, adv_BT, mask_BT, vanilla)
        # a dropped token: vanilla has a gradient there but clip_cov has none
        return {tuple(p) for p in torch.nonzero((grad_BT == 0) & (grad_ref_BT != 0)).tolist()}, metrics

    cov = _cov_loop(adv_BT, logp_BT, mask_BT)
    ratio_BT = torch.exp(logp_BT - old_logp_BT)
    clipped = {
        p
        for p in cov
        if -float(adv_BT[p]) * min(max(float(ratio_BT[p]), 0.8), 1.2) > -float(adv_BT[p]) * float(ratio_BT[p])
    }
    candidates = {p for p, c in cov.items() if -0.5 < c < 0.5 and p not in clipped}
    k = max(1, math.floor(0.1 * len(cov)))
    chosen, metrics = dropped(gen_seed=seed)
    assert chosen <= candidates
    assert len(chosen) == min(k, len(candidates))
    assert metrics["actor/clip_cov_frac"] == pytest.approx(len(chosen) / len(cov))
    assert dropped(gen_seed=seed)[0] == chosen  # same generator seed, same tokens


def test_clip_cov_random_choice_depends_on_the_generator():
    # 64 tokens, all in the band, k = floor(0.25 * 64) = 16: two seeds choose different sets
    gen = torch.Generator().manual_seed(0)
    logp_BT = -torch.rand(4, 16, generator=gen, dtype=torch.float64)
    adv_BT = torch.randn(4, 16, generator=gen, dtype=torch.float64)
    mask_BT = torch.ones(4, 16, dtype=torch.bool)
    sets = []
    for seed in (1, 2):
        cfg = _cfg(
            loss_agg_mode="token-mean",
            clip_cov_ratio=0.25,
            clip_cov_lb=-100.0,
            clip_cov_ub=100.0,
            generator=torch.Generator().manual_seed(seed),
        )
        _, grad_BT, metrics = _loss_and_grad("clip_cov", logp_BT, logp_BT.clone(), adv_BT, mask_BT, cfg)
        assert metrics["actor/clip_cov_frac"] == pytest.approx(16 / 64)
        sets.append(frozenset(map(tuple, torch.nonzero(grad_BT == 0).tolist())))
    assert len(sets[0]) == len(sets[1]) == 16
    assert sets[0] != sets[1]


def _band_batch(num_tokens: int):
    # one sequence of num_tokens (even) tokens: A = +3 with logp -0.5, A = -3 with logp -1.5 (alternating).
    # mean A = 0, mean logp = -1, so Cov_t = (+-3)(+-0.5) = 1.5 for every token: all inside Clip-Cov's
    # band (1, 5); ratio 1 (old = logp) clips nothing, and the dual clip bound 3 * 3 = 9 > loss 3.
    adv_BT = torch.tensor([[3.0, -3.0] * (num_tokens // 2)], dtype=torch.float64)
    logp_BT = torch.tensor([[-0.5, -1.5] * (num_tokens // 2)], dtype=torch.float64)
    return logp_BT, adv_BT, torch.ones_like(logp_BT, dtype=torch.bool)


@pytest.mark.parametrize("name, ratio_key", [("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio")])
@pytest.mark.parametrize("seed", range(6))
def test_stochastic_cov_count_rounds_ratio_times_n_with_one_uniform(name, ratio_key, seed):
    # N = 100 tokens, ratio 0.025: x = 2.5, so 2 tokens plus a third when u < 0.5, u the generator's first
    # uniform (float64). The verl rule gives max(1, floor(2.5)) = 2 whatever the generator.
    logp_BT, adv_BT, mask_BT = _band_batch(100)
    u = float(torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    expected = 2 + int(u < 0.5)
    for rule, count in (("stochastic", expected), ("verl", 2)):
        cfg = _cfg(
            loss_agg_mode="token-mean",
            cov_count=rule,
            generator=torch.Generator().manual_seed(seed),
            **{ratio_key: 0.025},
        )
        _, metrics = get_policy_loss(name)(logp_BT, logp_BT.clone(), adv_BT, mask_BT, cfg)
        frac = metrics["actor/clip_cov_frac" if name == "clip_cov" else "actor/kl_cov_frac"]
        assert frac * 100 == pytest.approx(count), (rule, u)


@pytest.mark.parametrize("name, ratio_key", [("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio")])
def test_stochastic_cov_count_selects_the_ratio_in_expectation_where_verl_selects_one_per_call(
    name, ratio_key
):
    # 100-token calls at ratio 2e-3 (x = 0.2): the verl rule selects max(1, 0) = 1 token per call, a fraction
    # 1 / 100 = 5x the ratio; the stochastic rule selects 1 token with probability 0.2, else none, so over
    # 2000 calls the count is Binomial(2000, 0.2): mean 400, sd sqrt(2000 * 0.2 * 0.8) = 17.9.
    logp_BT, adv_BT, mask_BT = _band_batch(100)
    key = "actor/clip_cov_frac" if name == "clip_cov" else "actor/kl_cov_frac"
    totals = {}
    for rule in ("verl", "stochastic"):
        cfg = _cfg(
            loss_agg_mode="token-mean",
            cov_count=rule,
            generator=torch.Generator().manual_seed(7),
            **{ratio_key: 2e-3},
        )
        counts = [
            round(100 * get_policy_loss(name)(logp_BT, logp_BT.clone(), adv_BT, mask_BT, cfg)[1][key])
            for _ in range(2000)
        ]
        assert set(counts) <= {0, 1}
        totals[rule] = sum(counts)
    assert totals["verl"] == 2000  # one token every call
    assert abs(totals["stochastic"] - 400) < 4 * 17.9  # fraction 2e-3 of the 200000 tokens, +- 4 sd


def test_stochastic_cov_count_with_no_valid_token_selects_none_and_draws_nothing():
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    logp_BT, adv_BT, _ = _band_batch(4)
    mask_BT = torch.zeros_like(logp_BT, dtype=torch.bool)
    for name in ("clip_cov", "kl_cov"):
        cfg = _cfg(cov_count="stochastic", generator=gen, clip_cov_ratio=0.5, kl_cov_ratio=0.5)
        loss, metrics = get_policy_loss(name)(logp_BT, logp_BT.clone(), adv_BT, mask_BT, cfg)
        assert loss.item() == 0.0 and metrics[f"actor/{name}_frac"] == 0.0
    assert torch.equal(gen.get_state(), state)


def test_default_cov_count_is_verls_and_kl_cov_draws_no_randomness():
    # the default keeps verl's rule for every user, and KL-Cov (top-k, deterministic) leaves the generator
    # untouched under it, so runs that existed before the option are bit-identical
    assert PolicyLossConfig().cov_count == "verl"
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    logp_BT, adv_BT, mask_BT = _band_batch(100)
    cfg = _cfg(generator=gen, kl_cov_ratio=2e-3)
    _, metrics = get_policy_loss("kl_cov")(logp_BT, logp_BT.clone(), adv_BT, mask_BT, cfg)
    assert metrics["actor/kl_cov_frac"] == pytest.approx(1 / 100) and torch.equal(gen.get_state(), state)
    with pytest.raises(ValueError, match=r"'floor'.*stochastic, verl$"):
        PolicyLossConfig(cov_count="floor")


# ----------------------------------------------------------------------------------------------
# KL, entropy, overlong penalty


def test_kl_estimators_hand_values():
    logp_BT = torch.tensor([[-1.0, -2.0, -1.5]], dtype=torch.float64)
    ref_BT = torch.tensor([[-2.0, -1.0, -1.5]], dtype=torch.float64)
    # token 0: d = ref - logp = -1; token 1: d = +1; token 2: d = 0
    assert kl_penalty(logp_BT, ref_BT, "k1")[0].tolist() == pytest.approx([1.0, -1.0, 0.0])
    assert kl_penalty(logp_BT, ref_BT, "k2")[0].tolist() == pytest.approx([0.5, 0.5, 0.0])
    # k3 = e^d - d - 1: e^-1 + 1 - 1 = 0.3679; e - 1 - 1 = 0.7183; 0
    assert kl_penalty(logp_BT, ref_BT, "k3")[0].tolist() == pytest.approx([math.exp(-1), E - 2, 0.0])
    # d = 30 is clamped to 20, e^20 - 21 is then clamped to 10; d = -30 -> -20: e^-20 + 19 -> 10
    far_BT = kl_penalty(torch.tensor([[-30.0, 0.0]]), torch.tensor([[0.0, -30.0]]), "k3")
    assert far_BT.tolist() == [[10.0, 10.0]]
    with pytest.raises(ValueError, match=r"'k4'.*k1, k2, k3$"):
        kl_penalty(logp_BT, ref_BT, "k4")


@pytest.mark.parametrize("scale", [1.0, 10.0, 100.0])
def test_entropy_matches_direct_formula(scale):
    gen = torch.Generator().manual_seed(int(scale))
    logits_BTV = scale * torch.randn(3, 5, 11, generator=gen, dtype=torch.float64)
    logp_BTV = torch.log_softmax(logits_BTV, dim=-1)
    direct_BT = -(logp_BTV.exp() * logp_BTV).sum(-1)
    assert torch.allclose(entropy_from_logits(logits_BTV), direct_BT, atol=1e-10)


def test_entropy_hand_values_and_stability():
    # uniform over 4 -> log 4; one-hot-like huge logits stay finite (~0); -inf entries count as p = 0
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1e4, 0.0, 0.0, 0.0], [0.0, 0.0, -math.inf, -math.inf]])
    ent = entropy_from_logits(logits)
    assert ent.tolist() == pytest.approx([math.log(4), 0.0, math.log(2)], abs=1e-6)
    logits.requires_grad_(True)
    entropy_from_logits(logits).sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_overlong_penalty_at_region_edges():
    # L_max = 20, L_c = 5: soft region starts after 15.
    lengths = torch.tensor([0, 15, 16, 18, 20, 21, 100])
    # 0 -> 0; 15 -> 0 (last free length); 16 -> (15 - 16)/5 = -0.2; 18 -> -0.6; 20 -> (15 - 20)/5 = -1;
    # 21 -> -1 (beyond L_max); 100 -> -1
    assert overlong_penalty(lengths, max_len=20, cache_len=5).tolist() == pytest.approx(
        [0.0, 0.0, -0.2, -0.6, -1.0, -1.0, -1.0]
    )
    # no cache: hard cut at L_max
    assert overlong_penalty(torch.tensor([20, 21]), 20, 0).tolist() == [0.0, -1.0]
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(lengths, max_len=20, cache_len=30)


# ----------------------------------------------------------------------------------------------
# tiny model end to end


def test_tiny_model_step_with_each_loss(tiny_model_dir):
    # token log-probs of random responses under the tiny Llama, one optimizer step on each loss from the
    # same start: the loss is finite, every parameter stays finite and the weights move.
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    initial = {key: value.clone() for key, value in model.state_dict().items()}
    vocab = model.config.vocab_size
    B, T = 4, 10
    ids_BT = torch.randint(3, vocab, (B, T + 1))
    mask_BT = torch.ones(B, T, dtype=torch.bool)
    mask_BT[1, 6:] = False  # a shorter response
    adv_B = torch.tensor([1.0, -1.0, 0.5, -0.5])
    noise_BT = 0.1 * torch.randn(B, T)
    for name in ["vanilla", "clip_cov", "kl_cov"]:
        model.load_state_dict(initial)
        logits_BTV = model(ids_BT).logits[:, :-1]
        logp_BT = torch.log_softmax(logits_BTV.float(), dim=-1).gather(-1, ids_BT[:, 1:, None]).squeeze(-1)
        cfg = PolicyLossConfig(
            loss_agg_mode="seq-mean-token-mean", kl_cov_ratio=0.1, clip_cov_lb=-1e3, clip_cov_ub=1e3
        )
        cfg.generator = torch.Generator().manual_seed(0)
        loss, metrics = get_policy_loss(name)(logp_BT, logp_BT.detach() + noise_BT, adv_B, mask_BT, cfg)
        entropy_BT = entropy_from_logits(logits_BTV.detach())
        assert torch.isfinite(loss), name
        assert bool(((entropy_BT > 0) & (entropy_BT <= math.log(vocab) + 1e-5)).all())
        assert all(math.isfinite(value) for value in metrics.values()), name
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        moved = sum(not torch.equal(initial[key], value) for key, value in model.state_dict().items())
        assert moved > 0, name
        assert all(torch.isfinite(p).all() for p in model.parameters()), name
