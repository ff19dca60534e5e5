"""The identities of docs/theory.md, each checked by property tests (hypothesis) or exact enumeration.

1. mu_glob cancels under batch normalisation with equal group sizes and one prior; it does not with
   unequal G, per-cluster priors, or ``normalize`` = group / prior / none.
2. A group-constant advantage c has zero expected policy gradient when each sequence's weight in the loss
   is a constant (seq-mean-token-sum, seq-mean-token-sum-norm); under seq-mean-token-mean the expected
   push is c * grad E[1/|o|] (a length bias), under token-mean c * grad E[1/T] (T: the token count the
   loss divides by). Computed exactly on a tiny softmax policy by enumerating every group of outputs and
   running them through the project's own policy loss and ``agg_loss``.
3. EBPO's expected gradient with a fixed prior is (1 - (1 - S) / G) grad J per sample: mu_glob is absent.
4. The entropy proposition's covariance: within a group EBPO's batch-normalised advantage is r minus a
   constant over one batch-wide scale, so its per-group Cov(logp, A) is REINFORCE++-baseline's times one
   constant for the whole batch; S and mu_glob play no part.
5. ``normalize="prior"``: A = (r - V_eb) / (sqrt(sigma2) + eps); the all-fail penalty -S mu / sigma
   survives a step in which every group fails, and grows with mu_glob.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import ebpo
from ebpo.advantages import ebpo_advantage, group_ids, group_moments, shrinkage_baseline
from ebpo.losses import PolicyLossConfig, agg_loss, get_policy_loss

EPS = 1e-6  # the estimators' default eps
# Property tests draw their examples from a fixed seed (derandomize=True), so every run checks the same cases.


def f64(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64)


def _prior(M: int, mu, sigma2: float, tau2: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mu_M = f64(mu) if isinstance(mu, list) else torch.full((M,), float(mu), dtype=torch.float64)
    return mu_M, torch.full((M,), sigma2, dtype=torch.float64), torch.full((M,), tau2, dtype=torch.float64)


def _ebpo(rewards: list[float], sizes: list[int], mu, sigma2: float, tau2: float, normalize: str):
    """EBPO's advantage for groups of the given sizes (contiguous) under a fixed prior: (A, S_M, stats)."""
    rewards_N = f64(rewards)
    group_N = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    stats = group_moments(rewards_N, group_N, len(sizes))
    mu_M, sigma2_M, tau2_M = _prior(len(sizes), mu, sigma2, tau2)
    adv_N, shrinkage_M, _ = ebpo_advantage(
        rewards_N, group_N, stats, mu_M, sigma2_M, tau2_M, normalize=normalize, eps=EPS
    )
    return adv_N, shrinkage_M, stats, group_N


reward_values = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(-3.0, 3.0, allow_nan=False))
prior_values = {
    "sigma2": st.floats(0.01, 2.0),
    "tau2": st.floats(0.001, 2.0),
    "mu_a": st.floats(-2.0, 2.0),
    "mu_b": st.floats(-2.0, 2.0),
}


# ------------------------------------------------------------------------------------------------------
# Identity 1: mu_glob cancels under batch normalisation (equal G, one prior)
# ------------------------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    M=st.integers(1, 6),
    G=st.integers(1, 6),
    data=st.data(),
    **prior_values,
)
def test_batch_normalisation_cancels_mu_glob_with_equal_group_sizes(M, G, data, sigma2, tau2, mu_a, mu_b):
    rewards = data.draw(st.lists(reward_values, min_size=M * G, max_size=M * G))
    adv_a, S_M, stats, group_N = _ebpo(rewards, [G] * M, mu_a, sigma2, tau2, "batch")
    adv_b, _, _, _ = _ebpo(rewards, [G] * M, mu_b, sigma2, tau2, "batch")
    torch.testing.assert_close(adv_a, adv_b, atol=1e-9, rtol=0)  # whatever mu_glob is
    # a - mean(a) = r - (1 - S) rbar_m - S rbar_batch (S is one number here: one prior, one G)
    S = float(S_M[0])
    rewards_N = f64(rewards)
    centred_N = rewards_N - (1 - S) * stats.mean_M[group_N] - S * rewards_N.mean()
    num = M * G
    std = float(centred_N.std()) if num > 1 else 0.0
    torch.testing.assert_close(adv_a, centred_N / (std + EPS), atol=1e-9, rtol=1e-9)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    history=st.lists(st.tuples(st.integers(1, 6), st.floats(0.0, 1.0)), min_size=1, max_size=8),
    batch_p=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6),
    G=st.integers(2, 6),
    options=st.sampled_from(
        [{}, {"prior_memory": 3.0}, {"tau2": "latent"}, {"sigma2": "pooled", "prior_memory": 1.5}]
    ),
    seed=st.integers(0, 2**16),
)
def test_the_estimator_with_equal_group_sizes_depends_on_the_prior_only_through_S(
    history, batch_p, G, options, seed
):
    # Any history (group sizes free), any memory or tau2/sigma2 variant, then a batch of equal G: the
    # estimator's output equals the mu-free closed form with S read back from the prior it used.
    rng = random.Random(seed)
    est = ebpo.get_estimator("ebpo", **options)
    for step, (size, p) in enumerate(history):
        rewards = [float(rng.random() < p) for _ in range(size * 3)]
        est(rewards, [f"{step}-{i // size}" for i in range(size * 3)])
    rewards = [float(rng.random() < p) for p in batch_p for _ in range(G)]
    index = [m for m in range(len(batch_p)) for _ in range(G)]
    adv = est(rewards, index)
    prior = est.prior_stats()  # ageing leaves mean and variance unchanged, so these are the ones used
    noise = prior["sigma2"] / G
    S = noise / (noise + prior["tau2"]) if noise + prior["tau2"] > 0 else 0.0
    rewards_N = f64(rewards)
    rbar_N = rewards_N.view(-1, G).mean(dim=1).repeat_interleave(G)
    centred_N = rewards_N - (1 - S) * rbar_N - S * rewards_N.mean()
    torch.testing.assert_close(adv.double(), centred_N / (float(centred_N.std()) + EPS), atol=2e-5, rtol=1e-5)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(1, 6), min_size=2, max_size=6), data=st.data(), **prior_values)
def test_unequal_group_sizes_let_mu_glob_through_the_batch_normalisation(
    sizes, data, sigma2, tau2, mu_a, mu_b
):
    # a - mean(a) is affine in mu_glob with slope -(S_m - Sbar), Sbar = sum_m G_m S_m / N the sample-weighted
    # mean shrinkage. S_m = sigma2 / (sigma2 + G_m tau2) differs between sizes, so mu_glob does not cancel.
    rewards = data.draw(st.lists(reward_values, min_size=sum(sizes), max_size=sum(sizes)))
    raw_a, S_M, _, group_N = _ebpo(rewards, sizes, mu_a, sigma2, tau2, "none")
    raw_b, _, _, _ = _ebpo(rewards, sizes, mu_b, sigma2, tau2, "none")
    S_N = S_M[group_N]
    slope_N = -(S_N - S_N.mean())
    torch.testing.assert_close(
        (raw_b - raw_b.mean()) - (raw_a - raw_a.mean()), slope_N * (mu_b - mu_a), atol=1e-9, rtol=1e-9
    )


def test_an_all_fail_step_with_unequal_group_sizes_rewards_failure_in_the_larger_groups():
    # Every group fails: a_m = -S_m mu. Sizes 4, 4, 5, 5 with sigma2 = 0.25, tau2 = 0.05, mu = 0.5:
    # S_4 = 0.25 / (0.25 + 4 * 0.05) = 0.5556, S_5 = 0.25 / (0.25 + 0.25) = 0.5, Sbar = (8 S_4 + 10 S_5) / 18
    # = 0.5247. Centred: groups of 4 get -(0.5556 - 0.5247) * 0.5 < 0, groups of 5 get +(0.0247) * 0.5 > 0,
    # and batch normalisation scales them to order one: failing responses in the larger groups are pushed
    # *up*. Their values hardly depend on mu: A = -(S_m - Sbar) mu / (mu std(S) + eps).
    sizes = [4, 4, 5, 5]
    for mu in (0.1, 0.5, 0.9):
        adv, S_M, _, group_N = _ebpo([0.0] * 18, sizes, mu, 0.25, 0.05, "batch")
        assert S_M.tolist() == pytest.approx([5 / 9, 5 / 9, 0.5, 0.5])
        S_N = S_M[group_N]
        expected_N = -(S_N - S_N.mean()) * mu / (mu * float(S_N.std()) + EPS)
        torch.testing.assert_close(adv, expected_N, atol=1e-9, rtol=1e-9)
        assert (adv[:8] < -0.9).all() and (adv[8:] > 0.8).all()
    # equal sizes: every group fails, every advantage is 0 up to rounding (the documented no-signal step)
    adv, _, _, _ = _ebpo([0.0] * 16, [4] * 4, 0.5, 0.25, 0.05, "batch")
    assert float(adv.abs().max()) < 1e-8


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    G=st.integers(1, 6),
    M=st.integers(2, 6),
    data=st.data(),
    sigma2=st.floats(0.01, 2.0),
    tau2=st.floats(0.001, 2.0),
)
def test_per_cluster_priors_let_differences_of_mu_through(G, M, data, sigma2, tau2):
    # prior_scope=cluster: each group reads its own cluster's mu_m. Shifting every mu_m by the same c
    # cancels (equal S); shifting them by different amounts d_m moves a - mean(a) by -(S d_m - mean(S d)).
    rewards = data.draw(st.lists(reward_values, min_size=M * G, max_size=M * G))
    mu = data.draw(st.lists(st.floats(-1.0, 1.0), min_size=M, max_size=M))
    shift = data.draw(st.floats(-1.0, 1.0))
    moved = data.draw(st.lists(st.floats(-1.0, 1.0), min_size=M, max_size=M))
    base, S_M, _, group_N = _ebpo(rewards, [G] * M, mu, sigma2, tau2, "batch")
    same, _, _, _ = _ebpo(rewards, [G] * M, [m + shift for m in mu], sigma2, tau2, "batch")
    torch.testing.assert_close(base, same, atol=1e-9, rtol=0)
    raw_a, _, _, _ = _ebpo(rewards, [G] * M, mu, sigma2, tau2, "none")
    raw_b, _, _, _ = _ebpo(
        rewards, [G] * M, [m + d for m, d in zip(mu, moved, strict=True)], sigma2, tau2, "none"
    )
    sd_N = S_M[group_N] * f64(moved)[group_N]
    torch.testing.assert_close(
        (raw_b - raw_b.mean()) - (raw_a - raw_a.mean()), -(sd_N - sd_N.mean()), atol=1e-9, rtol=1e-9
    )


@pytest.mark.parametrize("normalize", ["group", "prior", "none"])
@settings(max_examples=40, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5), data=st.data(), **prior_values)
def test_without_batch_centring_mu_glob_enters_with_slope_minus_S_over_the_scale(
    normalize, sizes, data, sigma2, tau2, mu_a, mu_b
):
    # group: scale sqrt((1 - S) s^2 + S sigma2) + eps; prior: sqrt(sigma2) + eps; none: 1. None of them
    # depends on mu, so A(mu_b) - A(mu_a) = -S_m (mu_b - mu_a) / scale_m exactly.
    rewards = data.draw(st.lists(reward_values, min_size=sum(sizes), max_size=sum(sizes)))
    adv_a, S_M, stats, group_N = _ebpo(rewards, sizes, mu_a, sigma2, tau2, normalize)
    adv_b, _, _, _ = _ebpo(rewards, sizes, mu_b, sigma2, tau2, normalize)
    scale_M = {
        "group": torch.sqrt((1 - S_M) * stats.var_M + S_M * sigma2) + EPS,
        "prior": torch.full_like(S_M, math.sqrt(sigma2) + EPS),
        "none": torch.ones_like(S_M),
    }[normalize]
    torch.testing.assert_close(adv_b - adv_a, -(S_M / scale_M)[group_N] * (mu_b - mu_a), atol=1e-9, rtol=1e-9)


# ------------------------------------------------------------------------------------------------------
# Identities 2 and 3: expected policy gradients, exactly, on a tiny softmax policy
# ------------------------------------------------------------------------------------------------------

EOS, VOCAB, MAX_LEN = 0, 3, 3  # tokens 0 (EOS), 1, 2; responses of at most 3 tokens


def _responses(stop_at_eos: bool) -> list[tuple[int, ...]]:
    """Every response: with EOS, token strings that end at the first EOS or at MAX_LEN (15 of them);
    without, all 2^3 strings over {1, 2} (all of length 3)."""
    if not stop_at_eos:
        return list(itertools.product([1, 2], repeat=MAX_LEN))
    out = []
    for length in range(1, MAX_LEN + 1):
        for body in itertools.product([1, 2], repeat=length - 1):
            out.append((*body, EOS))
    out += [body for body in itertools.product([1, 2], repeat=MAX_LEN)]  # truncated at MAX_LEN
    return out


class TinyPolicy:
    """pi(o_t | o_{t-1}, t) = softmax(theta[t, o_{t-1}]), theta of shape (T, VOCAB + 1, VOCAB) (the last
    row is the start token). ``logp_ST`` holds the token log-probabilities of every response (S, T), and
    ``mask_ST`` marks its tokens."""

    def __init__(self, seed: int, stop_at_eos: bool = True, scale: float = 1.0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.theta = (
            scale * torch.randn(MAX_LEN, VOCAB + 1, VOCAB, generator=gen, dtype=torch.float64)
        ).requires_grad_()
        if not stop_at_eos:  # EOS never sampled: a fixed-length policy over {1, 2}
            with torch.no_grad():
                self.theta[:, :, EOS] = -torch.inf
        self.responses = _responses(stop_at_eos)
        S = len(self.responses)
        self.tokens_ST = torch.zeros(S, MAX_LEN, dtype=torch.long)
        self.prev_ST = torch.full((S, MAX_LEN), VOCAB, dtype=torch.long)
        self.mask_ST = torch.zeros(S, MAX_LEN, dtype=torch.bool)
        for s, resp in enumerate(self.responses):
            for t, token in enumerate(resp):
                self.tokens_ST[s, t] = token
                self.mask_ST[s, t] = True
                if t + 1 < MAX_LEN:
                    self.prev_ST[s, t + 1] = token
        self.lengths_S = self.mask_ST.sum(dim=1).double()

    def logp_ST(self) -> torch.Tensor:
        logits_STV = self.theta[torch.arange(MAX_LEN)[None, :], self.prev_ST]  # (S, T, V)
        logp_ST = torch.log_softmax(logits_STV, dim=-1).gather(-1, self.tokens_ST[..., None])[..., 0]
        return torch.where(self.mask_ST, logp_ST, torch.zeros_like(logp_ST))

    def probs_S(self) -> torch.Tensor:
        return self.logp_ST().sum(dim=1).exp()

    def grad(self, value: torch.Tensor) -> torch.Tensor:
        (g,) = torch.autograd.grad(value, self.theta)
        return torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)  # EOS columns at -inf carry no gradient


def expected_loss_gradient(policy: TinyPolicy, G: int, advantage, mode: str, only=None) -> torch.Tensor:
    """E over all G-tuples of responses of grad L, L = the project's PPO loss at ratio 1 with aggregation
    ``mode`` on the tuple as one batch; ``advantage(tuple) -> (G,)`` float64. ``only(tuple)`` restricts the
    sum to the tuples it accepts (the rest count as 0)."""
    logp_ST = policy.logp_ST()
    prob_S = logp_ST.sum(dim=1).exp().detach()
    cfg = PolicyLossConfig(loss_agg_mode=mode, max_response_len=MAX_LEN, dual_clip_c=None)
    loss_fn = get_policy_loss("vanilla")
    total = logp_ST.new_zeros(())
    for combo in itertools.product(range(len(policy.responses)), repeat=G):
        if only is not None and not only(combo):
            continue
        idx = torch.tensor(combo)
        weight = prob_S[idx].prod()
        logp_GT = logp_ST[idx]
        loss, _ = loss_fn(logp_GT, logp_GT.detach(), advantage(combo), policy.mask_ST[idx], cfg)
        total = total + weight * loss
    return policy.grad(total)


CONST_MODES = ["seq-mean-token-sum", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("mode", CONST_MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_constant_group_advantage_has_zero_expected_gradient_when_sequence_weights_are_constant(mode, seed):
    # E[sum_i c w grad log pi(o_i)] = c w G sum_o grad pi(o) = c w G grad 1 = 0.
    policy = TinyPolicy(seed)
    c = -0.37
    expected = expected_loss_gradient(policy, 2, lambda combo: f64([c, c]), mode)
    assert float(expected.abs().max()) < 1e-14
    # ...though each realised gradient is not 0 (Theorem 1's statement about one realised group)
    logp_ST = policy.logp_ST()
    loss = agg_loss(-c * logp_ST[:2], policy.mask_ST[:2], mode, max_len=MAX_LEN)
    assert float(policy.grad(loss).abs().max()) > 1e-2


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("c", [-0.37, 1.5])
def test_seq_mean_token_mean_turns_a_constant_advantage_into_a_length_push(seed, c):
    # seq-mean-token-mean weighs sequence i by 1 / (B |o_i|): E[grad L] = -(c / B) sum_i E[grad log pi(o_i)
    # / |o_i|] = -c grad E[1/|o|]. A negative c (an all-fail penalty) makes descent lower E[1/|o|]: longer
    # responses; it says nothing about correctness.
    policy = TinyPolicy(seed)
    expected = expected_loss_gradient(policy, 2, lambda combo: f64([c, c]), "seq-mean-token-mean")
    inv_len = (policy.probs_S() / policy.lengths_S).sum()
    length_push = -c * policy.grad(inv_len)
    torch.testing.assert_close(expected, length_push, atol=1e-13, rtol=1e-10)
    assert float(length_push.abs().max()) > 1e-3


@pytest.mark.parametrize("seed", [0, 1])
def test_token_mean_pushes_by_the_shared_token_count_only(seed):
    # token-mean divides by T = sum_j |o_j| over the batch: E[grad L] = -c grad E[1/T]; zero when every
    # response has the same length. With G = 2 the push is smaller than seq-mean-token-mean's and shrinks
    # further as more sequences share T.
    c = -0.37
    policy = TinyPolicy(seed)
    expected = expected_loss_gradient(policy, 2, lambda combo: f64([c, c]), "token-mean")
    L_S, p_S = policy.lengths_S, policy.probs_S()
    inv_total = (p_S[:, None] * p_S[None, :] / (L_S[:, None] + L_S[None, :])).sum()
    torch.testing.assert_close(expected, -c * policy.grad(inv_total), atol=1e-13, rtol=1e-10)
    fixed = TinyPolicy(seed, stop_at_eos=False)
    assert (
        float(expected_loss_gradient(fixed, 2, lambda combo: f64([c, c]), "token-mean").abs().max()) < 1e-14
    )


def _rewards_of(policy: TinyPolicy, correct: set[int]):
    """Binary verifiable reward: 1 for the responses whose number is in ``correct``."""
    return f64([1.0 if s in correct else 0.0 for s in range(len(policy.responses))])


@pytest.mark.parametrize("normalize", ["none", "prior"])
@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 1000),
    correct=st.sets(st.integers(0, 14), min_size=1, max_size=14),
    sigma2=st.floats(0.05, 1.0),
    tau2=st.floats(0.0, 1.0),
    mu_a=st.floats(0.0, 1.0),
    mu_b=st.floats(0.0, 1.0),
)
def test_ebpo_expected_gradient_is_the_true_gradient_scaled_and_free_of_mu(
    normalize, seed, correct, sigma2, tau2, mu_a, mu_b
):
    # A_i = r_i - (1 - S) rbar - S mu over a constant scale k (1, or sqrt(sigma2) + eps), prior fixed.
    # E[A_i grad log pi(o_i)] = E[r grad log pi] - (1 - S)/G E[r grad log pi] - 0 = (1 - (1 - S)/G) grad J,
    # since r_j (j != i) and mu are independent of o_i. Under seq-mean-token-sum (weights 1/G):
    # E[grad L] = -(1 - (1 - S)/G) grad J / k, the same for every mu (GRPO without std: S = 0, 1 - 1/G).
    G = 2
    policy = TinyPolicy(seed)
    reward_S = _rewards_of(policy, correct)
    mu_M, sigma2_M, tau2_M = _prior(1, 0.0, sigma2, tau2)
    S = float(shrinkage_baseline(torch.zeros(1, dtype=torch.float64), f64([G]), mu_M, sigma2_M, tau2_M)[0])
    scale = 1.0 if normalize == "none" else math.sqrt(sigma2) + EPS

    def advantage(mu):
        return lambda combo: _ebpo(reward_S[list(combo)].tolist(), [G], mu, sigma2, tau2, normalize)[0]

    grad_a = expected_loss_gradient(policy, G, advantage(mu_a), "seq-mean-token-sum")
    grad_b = expected_loss_gradient(policy, G, advantage(mu_b), "seq-mean-token-sum")
    grad_J = policy.grad((policy.probs_S() * reward_S).sum())
    torch.testing.assert_close(grad_a, -(1 - (1 - S) / G) * grad_J / scale, atol=1e-12, rtol=1e-9)
    torch.testing.assert_close(grad_a, grad_b, atol=1e-12, rtol=1e-9)


def test_theorem1_all_fail_push_is_real_and_cancelled_by_the_same_offset_elsewhere():
    # With normalize="none" and a fixed prior, the mu-part of the advantage is the constant -S mu on every
    # group. Over the all-fail tuples alone (probability (1-J)^G) it gives, under seq-mean-token-sum,
    # E[grad L ; all fail] = (S mu / G) G (1-J)^(G-1) sum_{o fails} pi grad log pi = -S mu (1-J)^(G-1) grad J:
    # descent raises J, as Theorem 1 says. On every other tuple the same offset gives exactly the opposite.
    G, mu, sigma2, tau2 = 3, 0.6, 0.2, 0.05
    policy = TinyPolicy(4)
    correct = {3, 7, 8, 12}
    reward_S = _rewards_of(policy, correct)
    S = (sigma2 / G) / (sigma2 / G + tau2)
    J = float((policy.probs_S() * reward_S).sum().detach())
    grad_J = policy.grad((policy.probs_S() * reward_S).sum())

    def mu_part(combo):  # the advantage with mu minus the advantage with mu = 0: -S mu on every sample
        rewards = reward_S[list(combo)].tolist()
        return (
            _ebpo(rewards, [G], mu, sigma2, tau2, "none")[0]
            - _ebpo(rewards, [G], 0.0, sigma2, tau2, "none")[0]
        )

    def all_fail(combo):
        return all(s not in correct for s in combo)

    fail_part = expected_loss_gradient(policy, G, mu_part, "seq-mean-token-sum", only=all_fail)
    rest = expected_loss_gradient(policy, G, mu_part, "seq-mean-token-sum", only=lambda c: not all_fail(c))
    closed = -S * mu * (1 - J) ** (G - 1) * grad_J
    torch.testing.assert_close(fail_part, closed, atol=1e-13, rtol=1e-9)
    torch.testing.assert_close(rest, -closed, atol=1e-13, rtol=1e-9)
    assert float(closed.abs().max()) > 1e-3


# ------------------------------------------------------------------------------------------------------
# Identity 4: the entropy proposition is translation invariance
# ------------------------------------------------------------------------------------------------------


def _group_cov(x_N: torch.Tensor, y_N: torch.Tensor, group_N: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per-group (population) covariance of x and y, (M,)."""
    out = torch.zeros(num_groups, dtype=torch.float64)
    for m in range(num_groups):
        sel = group_N == m
        out[m] = ((x_N[sel] - x_N[sel].mean()) * (y_N[sel] - y_N[sel].mean())).mean()
    return out


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(2, 6), min_size=2, max_size=6),
    history=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5),
    options=st.sampled_from([{}, {"prior_scope": "cluster", "cluster_min_groups": 1}, {"prior_memory": 2.0}]),
    seed=st.integers(0, 2**16),
)
def test_entropy_proposition_covariance_is_reinforce_pp_baseline_times_one_batch_constant(
    sizes, history, options, seed
):
    # Within group q, EBPO's batch-normalised A = (r - V_q - mean(a)) / (std(a) + eps): r minus a constant,
    # over a batch-wide scale. So Cov_q(logp, A) = Cov_q(logp, r) / (std(a) + eps) for every q, and the
    # ratio to REINFORCE++-baseline's (r - rbar_q, whitened over the batch) is one number for the batch,
    # whatever S, mu_glob, the cluster priors or the group sizes are. GRPO's ratio is 1 / s_q per group.
    rng = random.Random(seed)
    est = ebpo.get_estimator("ebpo", **options)
    for step, p in enumerate(history):
        rewards = [float(rng.random() < p) for _ in range(12)]
        est(rewards, [f"h{step}-{i // 4}" for i in range(12)], cluster=[f"c{i // 4 % 2}" for i in range(12)])
    rewards = [rng.gauss(0.5, 1.0) for _ in range(sum(sizes))]
    index = [m for m, size in enumerate(sizes) for _ in range(size)]
    cluster = [f"c{m % 2}" for m in index]
    logp_N = f64([rng.gauss(-2.0, 1.0) for _ in rewards])
    group_N, M = group_ids(index)
    a_ebpo = est(rewards, index, cluster=cluster).double()
    a_rpp = ebpo.get_estimator("reinforce_pp_baseline")(rewards, index).double()
    cov_r = _group_cov(logp_N, f64(rewards), group_N, M)
    assume(bool((cov_r.abs() > 1e-2).all()))
    ratio_ebpo = _group_cov(logp_N, a_ebpo, group_N, M) / cov_r
    ratio_rpp = _group_cov(logp_N, a_rpp, group_N, M) / cov_r
    torch.testing.assert_close(ratio_ebpo, ratio_ebpo[:1].expand(M), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ratio_rpp, ratio_rpp[:1].expand(M), atol=1e-5, rtol=1e-4)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(M=st.integers(1, 6), G=st.integers(1, 6), data=st.data(), **prior_values)
def test_batch_spread_of_raw_advantages_is_within_plus_S_squared_between(
    M, G, data, sigma2, tau2, mu_a, mu_b
):
    # Equal G: a - mean(a) = (r - rbar_m) + S (rbar_m - rbar_batch); the cross term sums to 0 in each group,
    # so the population variance is mean within-group variance + S^2 * variance of the group means. The
    # proposition's sigma_batch^2 = E[sigma_q^2] + Var(mu_q) is the S = 1 case; shrinkage S < 1 narrows it.
    rewards = data.draw(st.lists(reward_values, min_size=M * G, max_size=M * G))
    raw, S_M, stats, group_N = _ebpo(rewards, [G] * M, mu_a, sigma2, tau2, "none")
    S = float(S_M[0])
    rewards_N = f64(rewards)
    within = float(((rewards_N - stats.mean_M[group_N]) ** 2).mean())
    between = float(((stats.mean_M - rewards_N.mean()) ** 2).mean())
    assert float(((raw - raw.mean()) ** 2).mean()) == pytest.approx(
        within + S * S * between, rel=1e-9, abs=1e-12
    )


# ------------------------------------------------------------------------------------------------------
# Identity 5: normalize="prior" keeps the paper's baseline in the training advantage
# ------------------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    history=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6),
    M=st.integers(1, 6),
    G=st.integers(1, 6),
    options=st.sampled_from([{}, {"sigma2": "pooled"}, {"prior_memory": 2.0, "tau2": "latent"}]),
    seed=st.integers(0, 2**16),
)
def test_normalize_prior_keeps_the_all_fail_penalty_even_when_every_group_fails(history, M, G, options, seed):
    rng = random.Random(seed)
    est = ebpo.get_estimator("ebpo", normalize="prior", **options)
    for step, p in enumerate(history):
        rewards = [float(rng.random() < p) for _ in range(16)]
        est(rewards, [f"h{step}-{i // 4}" for i in range(16)])
    adv = est([0.0] * (M * G), [m for m in range(M) for _ in range(G)])
    prior = est.prior_stats()
    noise = prior["sigma2"] / G
    S = noise / (noise + prior["tau2"]) if noise + prior["tau2"] > 0 else 0.0
    expected = -S * prior["mu_glob"] / (math.sqrt(prior["sigma2"]) + EPS)
    torch.testing.assert_close(
        adv.double(), torch.full((M * G,), expected, dtype=torch.float64), atol=1e-6, rtol=1e-5
    )
    paper = ebpo.get_estimator("ebpo", **options)  # the default, fed the same history, gives 0 here
    rng = random.Random(seed)
    for step, p in enumerate(history):
        rewards = [float(rng.random() < p) for _ in range(16)]
        paper(rewards, [f"h{step}-{i // 4}" for i in range(16)])
    assert float(paper([0.0] * (M * G), [m for m in range(M) for _ in range(G)]).abs().max()) < 1e-8


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    G=st.integers(1, 32),
    sigma2=st.floats(1e-3, 1.0),
    tau2=st.floats(0.0, 1.0),
    mu=st.floats(0.0, 0.9),
    gap=st.floats(0.01, 0.5),
)
def test_normalize_prior_corollary_holds_for_the_training_advantage(G, sigma2, tau2, mu, gap):
    # all-fail group, fixed S and sigma: A = -S mu / (sigma + eps), more negative as mu grows (slope -S/sigma).
    low, S_M, _, _ = _ebpo([0.0] * G, [G], mu, sigma2, tau2, "prior")
    high, _, _, _ = _ebpo([0.0] * G, [G], mu + gap, sigma2, tau2, "prior")
    S = float(S_M[0])
    assert float(low[0]) == pytest.approx(-S * mu / (math.sqrt(sigma2) + EPS), rel=1e-12, abs=1e-15)
    assert float(high[0] - low[0]) == pytest.approx(-S * gap / (math.sqrt(sigma2) + EPS), rel=1e-9)
    assert float(high[0]) < float(low[0])
