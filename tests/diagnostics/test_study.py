"""``ebpo diagnose`` (``ebpo.diagnostics``): its definitions, and the tool on policies whose answers are known.

The known-answer policy is a softmax over K fixed answers per prompt (:class:`SoftmaxPolicy`, a torch module with
a causal LM's call contract, so the tool runs it through the same sampler and log-prob pass as a real model):
prompt q answers token k with probability softmax(theta_q)_k and then stops. With reward v_qk for answer k,
J = (1/P) sum_q sum_k pi_qk v_qk and dJ/dtheta_qj = (1/P) pi_qj (v_qj - J_q), J_q = sum_k pi_qk v_qk.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math

import numpy as np
import pytest
import torch
from transformers import PretrainedConfig
from transformers.modeling_outputs import CausalLMOutputWithPast

import ebpo
from ebpo.advantages import AdvantageEstimator, dr_grpo_advantage, register_estimator
from ebpo.data.records import Record
from ebpo.diagnostics import measures, report, study
from ebpo.diagnostics.config import DiagnoseConfig
from ebpo.errors import ConfigError
from helpers.trackers import mlflow_artifact, offline_trackers, tensorboard_texts, wandb_segments

PAD, EOS = 0, 1
TRACKERS_HERE = ["tensorboard"] + [name for name in ("wandb", "mlflow") if importlib.util.find_spec(name)]
"""The trackers the command test reports to: TensorBoard, and wandb and MLflow where their extras are in."""


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


# ------------------------------------------------------------------------------------------------------
# definitions


def test_t_quantile_against_the_table():
    # t_{0.975, df} from standard tables
    for df, value in (
        (1, 12.706),
        (2, 4.303),
        (3, 3.182),
        (9, 2.262),
        (15, 2.131),
        (30, 2.042),
        (120, 1.980),
    ):
        assert measures.t_quantile(df) == pytest.approx(value, abs=1e-3)


def test_mean_interval_and_jackknife():
    interval = measures.mean_interval([1.0, 2.0, 3.0])  # mean 2, s = 1, half = 4.303 / sqrt(3)
    assert interval.value == 2.0 and interval.high - 2.0 == pytest.approx(4.303 / math.sqrt(3), abs=1e-3)
    values = np.random.default_rng(0).normal(size=20)
    jack = measures.jackknife_interval(lambda idx: float(values[idx].mean()), 20)
    t = measures.mean_interval(values)  # the jackknife of a mean is the t-interval
    assert (jack.value, jack.low, jack.high) == pytest.approx((t.value, t.low, t.high))


def test_gradient_statistics_from_products_match_the_vectors():
    generator = torch.Generator().manual_seed(1)
    grad_RK = torch.randn(7, 5, generator=generator, dtype=torch.float64) + torch.linspace(
        1, 2, 5, dtype=torch.float64
    )
    ref_RK = grad_RK * 0.5 + torch.randn(7, 5, generator=generator, dtype=torch.float64)
    noise_R = torch.rand(7, generator=generator, dtype=torch.float64)
    products = measures.GradientProducts.of(grad_RK, ref_RK)
    ref2_R = (ref_RK**2).sum(dim=1).numpy()
    cos_R = measures.cosines(products.dot_R, products.norm2_R, ref2_R)
    torch.testing.assert_close(
        torch.from_numpy(cos_R), torch.nn.functional.cosine_similarity(grad_RK, ref_RK)
    )
    # loop reference of the relative squared error and the variance ratio (their docstrings' formulas)
    scale = sum(float(g @ r) for g, r in zip(grad_RK, ref_RK)) / sum(float(g @ g) for g in grad_RK)
    error = sum(float(((scale * g - r) ** 2).sum()) - float(n) for g, r, n in zip(grad_RK, ref_RK, noise_R))
    signal = sum(float(r @ r) - float(n) for r, n in zip(ref_RK, noise_R))
    rel = measures.relative_squared_error(products.dot_R, products.norm2_R, ref2_R, noise_R.numpy())
    assert rel == pytest.approx(error / signal)
    mean_K = grad_RK.mean(dim=0)
    spread = float(((grad_RK - mean_K) ** 2).sum() / 6)  # tr of the sample covariance
    pairs = [(r, s) for r in range(7) for s in range(7) if r != s]
    size = sum(float(grad_RK[r] @ grad_RK[s]) for r, s in pairs) / len(pairs)
    assert measures.variance_ratio(products.gram_RR) == pytest.approx(spread / size)
    assert spread == pytest.approx(
        sum(float(((grad_RK[r] - grad_RK[s]) ** 2).sum()) for r, s in pairs) / len(pairs) / 2
    )
    assert measures.variance_ratio(products.gram_RR[:1, :1]) != measures.variance_ratio(
        products.gram_RR[:1, :1]
    )  # NaN
    opposite = torch.stack([torch.ones(5), -torch.ones(5)]).double()  # no common direction: NaN, not a ratio
    assert math.isnan(measures.variance_ratio((opposite @ opposite.T).numpy()))
    # and a zero gradient aligns with nothing and is no better than nothing
    zero = measures.GradientProducts.of(torch.zeros(7, 5, dtype=torch.float64), ref_RK)
    assert np.all(measures.cosines(zero.dot_R, zero.norm2_R, ref2_R) == 0)
    assert measures.relative_squared_error(
        zero.dot_R, zero.norm2_R, ref2_R, noise_R.numpy()
    ) == pytest.approx(1.0)


def test_sketch_keeps_inner_products_in_expectation_and_is_linear():
    generator = torch.Generator().manual_seed(2)
    x_D = torch.randn(300, generator=generator, dtype=torch.float64)
    y_D = torch.randn(300, generator=generator, dtype=torch.float64)
    y_D = 0.6 * x_D + y_D
    shapes = [(20, 10), (100,)]

    def split(v: torch.Tensor) -> list[torch.Tensor]:
        return [v[:200].view(20, 10), v[200:]]

    dots = []
    for seed in range(400):
        sketch = measures.GradientSketch([200, 100], 32, seed)
        sx, sy = sketch(split(x_D)), sketch(split(y_D))
        torch.testing.assert_close(
            sketch(split(x_D + 2 * y_D)), sx + 2 * sy
        )  # linear, same (h, s) every call
        dots.append(float(sx @ sy))
    exact = float(x_D @ y_D)
    bound = math.sqrt(
        (float(x_D @ x_D) * float(y_D @ y_D) + exact**2) / 32
    )  # the docstring's bound on its sd
    assert float(np.std(dots)) <= 1.15 * bound  # the sd of 400 draws is itself off by about 4%
    assert float(np.mean(dots)) == pytest.approx(exact, abs=4 * bound / math.sqrt(400))
    whole = measures.GradientSketch([200, 100], 0, 0)(split(x_D))  # dim 0: the gradient itself
    torch.testing.assert_close(whole, x_D)
    assert shapes  # the two parameter shapes above: a matrix and a vector


@pytest.mark.parametrize(
    "text",
    ["grpo", "reinforce_pp_baseline", "dr_grpo", "rloo", "jspo", "ebpo", "ebpo:normalize=prior", "ebpo:normalize=group",
     "ebpo:prior_scope=cluster,normalize=batch", "grpo:norm_by_std=false"],
)  # fmt: skip
def test_raw_advantage_reading_matches_each_estimator(text):
    # What the table states: the training advantage is (a - m) / c with a = r - b the raw advantage, m the
    # batch mean of a where the estimator centres (else 0) and c > 0 constant within each group. Checked on
    # random batches after a few steps of history, the twin fed the same batches.
    from ebpo.diagnostics.config import parse_estimator

    name, options = parse_estimator(text)
    read = measures.raw_advantage(name, options)
    estimator = ebpo.get_estimator(name, **options)
    twin = ebpo.get_estimator(read.twin[0], **read.twin[1]) if read.twin else None
    rng = np.random.default_rng(0)
    for _ in range(4):  # four steps of history
        rewards_N = torch.from_numpy((rng.random((6, 4)) < rng.random((6, 1))).astype(float).reshape(-1))
        index_N, cluster_N = torch.arange(6).repeat_interleave(4), [m % 2 for m in range(6) for _ in range(4)]
        adv_N = estimator(rewards_N, index_N, cluster_N).double()
        raw_N = adv_N if twin is None else twin(rewards_N, index_N, cluster_N).double()
        centred_N = (raw_N - raw_N.mean() if read.centres else raw_N).view(6, 4)
        for adv_G, a_G in zip(adv_N.view(6, 4), centred_N):
            if float(a_G.abs().max()) < 1e-9:
                assert float(adv_G.abs().max()) < 1e-5
                continue
            scale = float(adv_G @ a_G / (a_G @ a_G))  # 1 / c
            assert scale > 0
            torch.testing.assert_close(adv_G, scale * a_G, atol=1e-5, rtol=1e-5)


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


def test_bad_settings_fail_with_one_line():
    with pytest.raises(ConfigError, match="--estimators ebpo:normalise=prior"):
        study.estimator_specs(DiagnoseConfig(estimators=["grpo", "ebpo:normalise=prior"]))
    with pytest.raises(ConfigError, match="--compare-to"):
        DiagnoseConfig(estimators=["ebpo"])
    with pytest.raises(ConfigError, match=r"\breference_samples\b"):
        DiagnoseConfig(reference_samples=7)
    with pytest.raises(ConfigError, match=r"\['groups'\]"):
        ebpo.diagnose(groups=[4])


# ------------------------------------------------------------------------------------------------------
# the command, end to end on the shipped model


@pytest.fixture
def offline(monkeypatch, tmp_path):
    yield from offline_trackers(monkeypatch, tmp_path)


def test_command_on_the_shipped_model_writes_the_table_csv_and_figure(
    tmp_path, capsys, offline, plugin_pkg_dir, plugin_sandbox, monkeypatch
):
    from ebpo.cli import main
    from helpers.plugins import FILE_ESTIMATOR, MY_ESTIMATORS, PKG_ESTIMATOR

    # beside GRPO and EBPO, a lone file's estimator (--plugins) and an installed package's (its entry point)
    monkeypatch.syspath_prepend(str(plugin_pkg_dir))
    out = tmp_path / "diag"
    code = main(
        ["diagnose", "-M", "4", "-R", "2", "-W", "1", "-G", "2", "4", "--reference-samples", "4", "--quiet",
         "--plugins", str(MY_ESTIMATORS), "--estimators", "grpo", "ebpo", f"{FILE_ESTIMATOR}:q=0.25",
         PKG_ESTIMATOR, "--projection-dim", "256", "--out-dir", str(out), "--report-to", *TRACKERS_HERE]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert (
        "| ebpo | ebpo: vanilla, token-mean | 4 |" in printed
        and "| grpo | grpo: vanilla, seq-mean-token-mean | 2 |" in printed
        and f"| {FILE_ESTIMATOR}:q=0.25 | grpo: vanilla, seq-mean-token-mean | 4 |" in printed
        and f"| {PKG_ESTIMATOR} | grpo: vanilla, seq-mean-token-mean | 2 |" in printed
    )
    for name in ("diagnose.md", "diagnose.csv", "batches.csv", "diagnose.png"):
        assert (out / name).stat().st_size > 0
    rows = (out / "diagnose.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 * 2  # header, 4 estimators x 2 group sizes
    assert len((out / "batches.csv").read_text().splitlines()) == 1 + 4 * 2 * 2
    assert "nan" not in (out / "batches.csv").read_text()
    # the trackers hold the table: the same estimators, group sizes and cosines as diagnose.csv
    table = [dict(row) for row in csv.DictReader((out / "diagnose.csv").open())]
    expected = [(row["estimator"], int(row["G"]), float(row["cosine"])) for row in table]
    text = tensorboard_texts(out / "tensorboard")["diagnose"][0]
    cells = [line.split(" | ") for line in text.splitlines()[2:]]
    header = text.splitlines()[0].strip("| ").split(" | ")
    column = {name: header.index(name) for name in ("estimator", "G", "cosine")}
    assert [
        (c[column["estimator"]].strip("| "), int(c[column["G"]]), float(c[column["cosine"]])) for c in cells
    ] == expected
    wandb_dir, uri = offline
    estimators = ["grpo", "ebpo", f"{FILE_ESTIMATOR}:q=0.25", PKG_ESTIMATOR]
    if "wandb" in TRACKERS_HERE:
        (segment,) = wandb_segments(wandb_dir)
        (logged,) = segment.history.values()  # wandb keeps a table as a file, its path in the history
        data = json.loads((segment.folder / "files" / logged["diagnose.path"]).read_text())
        got = [dict(zip(data["columns"], row)) for row in data["data"]]
        assert [(r["estimator"], r["G"], r["cosine"]) for r in got] == expected
        assert segment.config["estimators"] == estimators
    if "mlflow" in TRACKERS_HERE:
        from mlflow.tracking import MlflowClient

        (run,) = MlflowClient(uri).search_runs(
            [MlflowClient(uri).get_experiment_by_name("ebpo").experiment_id]
        )
        data = json.loads(mlflow_artifact(uri, run.info.run_id, "diagnose.json", tmp_path / "a").read_text())
        got = [dict(zip(data["columns"], row)) for row in data["data"]]
        assert [(r["estimator"], r["G"], r["cosine"]) for r in got] == expected
        assert run.data.params["estimators"] == json.dumps(estimators)
        artifacts = {a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id)}
        assert artifacts >= {"diagnose.md", "diagnose.csv", "batches.csv", "diagnose.png", "diagnose.json"}
    assert main(["diagnose", "--estimators", "grpo", "nope", "--quiet"]) == 2
    assert "unknown advantage estimator 'nope'" in capsys.readouterr().err


def test_python_api_is_the_command():
    assert ebpo.diagnose is study.diagnose
    assert {f.name for f in dataclasses.fields(DiagnoseConfig)} >= {"estimators", "group_sizes", "preset"}


def test_the_figure_draws_each_estimators_paired_difference_against_compare_to():
    # Rows as summarize() gives them (estimators in order, G ascending per estimator); the figure's lines are
    # the table's Δ columns: each estimator but compare_to, per metric, its _diff and the _diff interval (not
    # its own value and interval).
    def row(label, G, cos, cos_diff, err_diff):
        return {
            "estimator": label,
            "G": G,
            "cosine": cos,
            "cosine_low": cos - 0.1,
            "cosine_high": cos + 0.1,
            "cosine_diff": cos_diff,
            "cosine_diff_low": cos_diff - 0.01,
            "cosine_diff_high": cos_diff + 0.02,
            "baseline_error_diff": err_diff,
            "baseline_error_diff_low": err_diff - 0.003,
            "baseline_error_diff_high": err_diff + 0.001,
        }

    rows = [row("grpo", 4, 0.7, 0.0, 0.0), row("grpo", 2, 0.6, 0.0, 0.0)]
    rows += [
        row("ebpo", 4, 0.75, 0.05, -0.004),
        row("ebpo", 2, 0.61, 0.01, -0.02),
        row("rloo", 2, 0.5, -0.1, 0.03),
    ]
    lines = report.difference_series(report.Summary(rows, [], {}), "grpo")
    assert [(line.metric, line.estimator) for line in lines] == [
        ("baseline_error", "ebpo"),
        ("baseline_error", "rloo"),
        ("cosine", "ebpo"),
        ("cosine", "rloo"),
    ]
    ebpo_cos = lines[2]
    assert ebpo_cos.G == [2, 4] and ebpo_cos.value == [0.01, 0.05]
    assert ebpo_cos.low == pytest.approx([0.0, 0.04]) and ebpo_cos.high == pytest.approx([0.03, 0.07])
    assert lines[0].value == [-0.02, -0.004] and lines[0].low == pytest.approx([-0.023, -0.007])
    assert lines[3].G == [2] and lines[3].value == [-0.1]
    assert report.difference_series(report.Summary(rows[:2], [], {}), "grpo") == []  # nothing to compare
