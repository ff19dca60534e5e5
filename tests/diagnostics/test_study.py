"""``ebpo.diagnostics.study``: the tool on policies whose answers are known, its fast gradient paths, and the tiny
model on a gym task.

The known-answer policy is a softmax over K fixed answers per prompt (:class:`SoftmaxPolicy`, a torch module with
a causal LM's call contract, so the tool runs it through the same sampler and log-prob pass as a real model):
prompt q answers token k with probability softmax(theta_q)_k and then stops. With reward v_qk for answer k,
J = (1/P) sum_q sum_k pi_qk v_qk and dJ/dtheta_qj = (1/P) pi_qj (v_qj - J_q), J_q = sum_k pi_qk v_qk.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import PretrainedConfig
from transformers.modeling_outputs import CausalLMOutputWithPast

import ebpo
from ebpo.advantages import AdvantageEstimator, dr_grpo_advantage, register_estimator
from ebpo.data.records import Record
from ebpo.diagnostics import measures, report, study
from ebpo.diagnostics.config import DiagnoseConfig
from helpers.gym import needs_gym

PAD, EOS = 0, 1


class SoftmaxTokenizer:
    """Prompt ``"q<i>"`` is token 2 + i; answer k is token 2 + P + k and reads ``"a<k>"``."""

    pad_token_id, eos_token_id = PAD, EOS

    def __init__(self, num_prompts: int) -> None:
        self.num_prompts = num_prompts

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [2 + int(text[1:])]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"a{i - 2 - self.num_prompts}" for i in ids if i >= 2 + self.num_prompts)


class SoftmaxPolicy(torch.nn.Module):
    """After prompt token q: logits theta_q over the K answer tokens (every other token at -1e4); after an
    answer: EOS with probability 1. The only parameters are theta (P, K)."""

    def __init__(self, theta_PK: torch.Tensor) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(theta_PK.clone().float())
        self.config = PretrainedConfig()
        self.config.num_hidden_layers = (
            1  # the sampler builds a DynamicCache from it; this model never fills it
        )
        self.num_prompts, self.num_answers = theta_PK.shape
        self.vocab = 2 + self.num_prompts + self.num_answers

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, **_):
        is_prompt_BL = (input_ids >= 2) & (input_ids < 2 + self.num_prompts)
        prompt_BL = (input_ids - 2).clamp(0, self.num_prompts - 1)
        answer_BLV = torch.nn.functional.pad(self.theta[prompt_BL], (2 + self.num_prompts, 0), value=-1e4)
        stop_V = torch.full((self.vocab,), -1e4).index_fill(0, torch.tensor([EOS]), 0.0)
        logits_BLV = torch.where(is_prompt_BL[..., None], answer_BLV, stop_V)
        return CausalLMOutputWithPast(logits=logits_BLV, past_key_values=past_key_values)


class AnswerValues:
    """Reward of answer ``"a<k>"``: entry k of the record's answer, a comma-separated list of values."""

    def __call__(self, completion: str, answer: str) -> float:
        return float(answer.split(",")[int(completion[1:])])

    def batch(self, completions: list[str], answers: list[str]) -> list[float]:
        return [self(c, a) for c, a in zip(completions, answers)]


def softmax_setup(values_PK: torch.Tensor, theta_PK: torch.Tensor) -> dict:
    """The tool's inputs for a softmax policy with answer values ``values_PK``."""
    num_prompts = values_PK.shape[0]
    records = [
        Record(id=str(q), prompt=f"q{q}", answer=",".join(f"{v:.17g}" for v in values_PK[q].tolist()))
        for q in range(num_prompts)
    ]
    return {
        "model": SoftmaxPolicy(theta_PK),
        "tokenizer": SoftmaxTokenizer(num_prompts),
        "records": records,
        "reward_fn": AnswerValues(),
    }


def analytic_gradient(values_PK: torch.Tensor, theta_PK: torch.Tensor) -> torch.Tensor:
    """dJ/dtheta for J = mean_q sum_k pi_qk v_qk (module docstring), flattened as the tool flattens theta."""
    pi_PK = torch.softmax(theta_PK.double(), dim=1)
    rate_P = (pi_PK * values_PK).sum(dim=1, keepdim=True)
    return (pi_PK * (values_PK - rate_P) / values_PK.shape[0]).reshape(-1)


SMALL = {
    "prompts": 8,
    "batches": 24,
    "warmup_batches": 4,
    "reference_samples": 32,
    "projection_dim": 0,
    "quiet": True,
    "max_new_tokens": 4,
}


@pytest.fixture(scope="module")
def binary_case():
    """P = 8 prompts, K = 4 answers, one right answer each (reward 1), theta ~ N(0, 0.5²): every answer keeps a
    probability of a few percent at least, so 24 batches see each coordinate of the gradient vary."""
    generator = torch.Generator().manual_seed(3)
    theta_PK = 0.5 * torch.randn(8, 4, generator=generator)
    right_P = torch.randint(0, 4, (8,), generator=generator)
    values_PK = torch.nn.functional.one_hot(right_P, 4).double()
    setup = softmax_setup(values_PK, theta_PK)
    result = ebpo.diagnose(estimators=["grpo", "rloo", "dr_grpo"], group_sizes=[2, 4], **SMALL, **setup)
    return values_PK, theta_PK, result


# ------------------------------------------------------------------------------------------------------
# known answers


def test_reference_gradient_matches_the_analytic_gradient_of_the_expected_reward(binary_case):
    values_PK, theta_PK, result = binary_case
    truth_D = analytic_gradient(values_PK, theta_PK)
    ref_RD = result.reference_RK
    mean_D = ref_RD.mean(dim=0)
    se_D = ref_RD.std(dim=0, unbiased=True) / math.sqrt(ref_RD.shape[0])
    # every batch holds all 8 prompts, so each reference estimates the same gradient: its mean over the 24
    # batches is within 4 standard errors of the truth in every one of the 32 coordinates (a false alarm
    # has probability about 32 * 6e-5), while the truth is far from 0 on that scale
    assert torch.all((mean_D - truth_D).abs() <= 4 * se_D + 1e-9), (mean_D, truth_D, se_D)
    assert float(truth_D.norm()) > 10 * float(se_D.norm() / math.sqrt(len(se_D)))
    # the halves' noise estimate is unbiased for the reference's own variance: tr Cov over the batches
    spread = float(((ref_RD - mean_D) ** 2).sum() / (ref_RD.shape[0] - 1))
    assert spread == pytest.approx(float(result.reference_noise_R.mean()), rel=0.35)


def test_grpo_baseline_error_is_sigma2_over_G_for_binary_rewards(binary_case):
    values_PK, theta_PK, result = binary_case
    rate_P = (torch.softmax(theta_PK.double(), dim=1) * values_PK).sum(dim=1)
    sigma2 = float((rate_P * (1 - rate_P)).mean())  # E[(r̄ - p)²] = p(1 - p)/G, averaged over prompts
    summary = report.summarize(result)
    for G in (2, 4):
        row = next(r for r in summary.rows if r["estimator"] == "grpo" and r["G"] == G)
        half = (row["baseline_error_high"] - row["baseline_error_low"]) / 2
        assert abs(row["baseline_error"] - sigma2 / G) <= 1.7 * half, (G, row["baseline_error"], sigma2 / G)
        assert half < 0.25 * sigma2 / G  # narrow enough to tell sigma2/G from RLOO's sigma2/(G - 1)
        rloo = next(r for r in summary.rows if r["estimator"] == "rloo" and r["G"] == G)
        loo_half = (rloo["baseline_error_high"] - rloo["baseline_error_low"]) / 2
        assert abs(rloo["baseline_error"] - sigma2 / (G - 1)) <= 1.7 * loo_half


def test_ebpo_baseline_error_matches_theorem_2_on_gaussian_rewards():
    # Theorem 2: theta_q ~ (mu, tau2), r ~ (theta_q, sigma2); the shrunk baseline (1 - S) r̄ + S mu with
    # S = (sigma2/G) / (sigma2/G + tau2) has MSE (1 - S) sigma2/G. Here 64 prompts whose latent rates have
    # mean 0.5 and variance tau2 = 0.01 exactly; a uniform policy over 16 answers whose values are theta_q +
    # sigma z_k, z_k the 16 standardised normal quantiles (a discretised Gaussian), sigma2 = 0.04; G = 4:
    # S = 0.01 / 0.02 = 0.5, EBPO with the textbook prior (pooled sigma2, latent tau2) 0.005, GRPO 0.01.
    P, K, G, tau2, sigma2 = 64, 16, 4, 0.01, 0.04
    generator = torch.Generator().manual_seed(5)
    draw_P = torch.randn(P, generator=generator, dtype=torch.float64)
    latent_P = 0.5 + math.sqrt(tau2) * (draw_P - draw_P.mean()) / draw_P.std(unbiased=False)
    z_K = torch.special.ndtri((torch.arange(K, dtype=torch.float64) + 0.5) / K)
    z_K = (z_K - z_K.mean()) / z_K.std(unbiased=False)
    values_PK = latent_P[:, None] + math.sqrt(sigma2) * z_K[None, :]
    setup = softmax_setup(values_PK, torch.zeros(P, K))
    textbook = "ebpo:sigma2=pooled,tau2=latent,normalize=none"
    settings = SMALL | {"prompts": P, "batches": 20, "warmup_batches": 10, "reference_samples": 64}
    result = ebpo.diagnose(estimators=["grpo", textbook], group_sizes=[G], **settings, **setup)
    rows = {r["estimator"]: r for r in report.summarize(result).rows}
    shrinkage = (sigma2 / G) / (sigma2 / G + tau2)
    for label, closed_form in (("grpo", sigma2 / G), (textbook, (1 - shrinkage) * sigma2 / G)):
        row = rows[label]
        half = (row["baseline_error_high"] - row["baseline_error_low"]) / 2
        assert abs(row["baseline_error"] - closed_form) <= 1.7 * half, (
            label,
            row["baseline_error"],
            closed_form,
        )
        assert half < 0.15 * closed_form
    # the pool's figures recover the model's two variances, and Theorem 2's optimum
    pool = report.summarize(result).pool[0]
    assert pool["sigma2"] == pytest.approx(sigma2, rel=0.05)
    assert pool["tau2"] == pytest.approx(tau2, abs=0.004)
    assert pool["optimal_shrinkage"] == pytest.approx(shrinkage, abs=0.1)


@pytest.fixture
def shifted_estimator():
    """``test_shifted``: Dr. GRPO's r - r̄ plus 0.5 for every response."""

    @register_estimator("test_shifted")
    class Shifted(AdvantageEstimator):
        def _advantages(self, batch):
            return dr_grpo_advantage(
                batch.rewards_N, batch.group_N, batch.num_groups, stats=batch.stats
            ) + 0.5, {}

    yield "test_shifted"
    ebpo.advantages.registry._ESTIMATORS.unregister("test_shifted")


def test_a_constant_shift_of_every_advantage_leaves_the_expected_gradient_unchanged(
    binary_case, shifted_estimator
):
    # Under constant sequence weights (Dr. GRPO's loss) the shift adds 0.5 sum_i w grad log pi(o_i), whose
    # expectation is 0 (the score identity; docs/theory.md §2). Its realised size is not small: the test
    # would see a shift that moved the expected gradient.
    values_PK, theta_PK, _ = binary_case
    setup = softmax_setup(values_PK, theta_PK)
    result = ebpo.diagnose(
        estimators=["dr_grpo", shifted_estimator],
        compare_to="dr_grpo",
        preset="dr_grpo",
        group_sizes=[4],
        **SMALL | {"batches": 40},
        **setup,
    )
    plain_RD = result.arms[("dr_grpo", 4)].gradients_RK
    shifted_RD = result.arms[(shifted_estimator, 4)].gradients_RK
    diff_RD = shifted_RD - plain_RD
    mean_D, se_D = diff_RD.mean(dim=0), diff_RD.std(dim=0, unbiased=True) / math.sqrt(diff_RD.shape[0])
    assert torch.all(mean_D.abs() <= 4 * se_D + 1e-12)  # 32 coordinates, 4 standard errors each
    assert float(diff_RD.norm(dim=1).mean()) > 0.5 * float(plain_RD.norm(dim=1).mean())
    # and the shift's expected push is exactly what is absent: it equals 0.5 x the batch's mean score, a
    # vector with mean 0, not the gradient's direction
    assert float(mean_D.norm()) < 0.2 * float(plain_RD.mean(dim=0).norm())


def test_the_fast_gradients_equal_a_plain_backward_per_loss():
    # study's two fast paths, the log-probs of distinct rows only (batch_logp) and one backward per distinct
    # direction (ascent_directions: proportional weights reuse a gradient), against a plain forward and
    # backward of each loss over every row, on the shipped model
    from ebpo.eval.harness import load_model
    from ebpo.models.build import build_base_model
    from ebpo.tasks import get_task

    model, tokenizer = load_model(build_base_model(progress=False), device="cpu", dtype="float32")
    records = list(get_task("arith").generate("train", 4, 0))
    cfg = DiagnoseConfig(max_new_tokens=8)
    rollouts = study._sample(
        model, tokenizer, [r.prompt for r in records], 6, cfg, torch.Generator().manual_seed(0)
    )
    inputs = study._inputs(rollouts, torch.arange(24), torch.device("cpu"))
    assert len(set(rollouts.texts[:6])) < 6  # equal responses in a group: batch_logp has rows to merge
    params = [p for p in model.parameters() if p.requires_grad]
    sketch = measures.GradientSketch([p.numel() for p in params], 0, 0)
    loss = study._preset_loss("grpo", 8, torch.Generator())
    adv_B = torch.randn(24, dtype=torch.float64)
    advantages = [
        adv_B,
        3 * adv_B,
        torch.zeros(24, dtype=torch.float64),
        torch.randn(24, dtype=torch.float64),
    ]
    logp_BT = study.batch_logp(model, inputs, 1.0)
    weights = [study.loss_weights(loss, logp_BT, a, inputs["response_mask"]) for a in advantages]
    fast = study.ascent_directions(logp_BT, params, weights, sketch)
    for adv, direction in zip(advantages, fast):
        model.zero_grad()
        logp = study._logp(model, inputs, 1.0)
        value, _ = loss.fn(logp, logp.detach(), adv.float(), inputs["response_mask"], loss.cfg)
        value.backward()
        plain = -torch.cat([p.grad.reshape(-1).double() for p in params])
        # float32 gradients summed in another order
        torch.testing.assert_close(direction, plain, atol=1e-6 * float(plain.abs().max()), rtol=1e-4)
    assert float(fast[0].norm()) > 0


def test_python_api_is_the_command():
    assert ebpo.diagnose is study.diagnose
    assert {f.name for f in dataclasses.fields(DiagnoseConfig)} >= {"estimators", "group_sizes", "preset"}


@needs_gym
def test_ebpo_diagnose_on_a_gym_task(tiny_model_dir, tmp_path):
    from ebpo.diagnostics import study
    from ebpo.diagnostics.config import DiagnoseConfig

    cfg = DiagnoseConfig(
        model=str(tiny_model_dir),
        task="gym:chain_sum",
        task_options="{chain_sum: {max_terms: 2, max_digits: 1}}",
        prompts=4,
        batches=2,
        warmup_batches=1,
        group_sizes=[2],
        reference_samples=4,
        estimators=["grpo", "ebpo"],
        projection_dim=64,
        max_new_tokens=4,
        out_dir=str(tmp_path / "diag"),
        quiet=True,
    )
    records = study._load_records(cfg)
    assert {r.topic for r in records} == {"chain_sum"} and type(study._reward(cfg)).__name__ == "GymReward"
    result = study.diagnose(cfg)
    assert set(result.arms) == {("grpo", 2), ("ebpo", 2)}
