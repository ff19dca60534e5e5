"""``ebpo train`` on the tiny random model: a dense test reward and a small config, and what tests read back.

The tiny model is random, so the task reward (exact arithmetic answers) is always 0 and every advantage
would be 0. ``trainer_test_digits`` scores the fraction of digits in the completion instead, so groups have
distinct rewards and the policy loss has a gradient; :data:`FLAKY` makes it fail on demand.
"""

from __future__ import annotations

from ebpo import rewards
from ebpo.trackers import EXCLUDED_FROM_REPRODUCIBILITY, read_metrics
from ebpo.trainer.config import TrainConfig
from ebpo.trainer.config_files import load_config

FLAKY = {"armed": False, "fail_first": "", "calls": 0}
"""Switches of the test reward: when armed, a completion whose first character is in ``fail_first``
raises; ``calls`` counts calls."""


class DigitFraction:
    """Reward = fraction of the completion's characters that are digits (a dense signal for a random model)."""

    def __call__(self, completion: str, answer: str) -> float:
        FLAKY["calls"] += 1
        if FLAKY["armed"] and completion[:1] in FLAKY["fail_first"]:
            raise RuntimeError("verifier crashed")
        return sum(ch.isdigit() for ch in completion) / max(1, len(completion))

    def batch(self, completions, answers):
        return [self(c, a) for c, a in zip(completions, answers)]


if "trainer_test_digits" not in rewards.list_rewards():
    rewards.register_reward("trainer_test_digits")(DigitFraction)


def tiny_overrides(model_dir) -> list[str]:
    """2 prompts x G=4, 6-token responses, 2 updates per step, 9 validation problems x 2 samples."""
    return [
        f"model.path={model_dir}",
        "data.reward=trainer_test_digits",
        "data.train_size=40",
        "data.val_size=9",
        "data.batch_size=2",
        "data.group_size=4",
        "rollout.max_new_tokens=6",
        "optim.mini_batch_size=1",
        "optim.lr=0.01",
        "run.eval_n=2",
        "run.eval_k=2",
        "run.eval_every=0",
        "run.save_every=2",
        "run.progress=false",
        "run.plot=false",
        "run.device=cpu",
    ]


def tiny_config(model_dir, *overrides: str) -> TrainConfig:
    """:func:`tiny_overrides` then ``overrides``, as ``ebpo train`` reads them."""
    return load_config(None, tiny_overrides(model_dir) + list(overrides))


def final_params(run_dir):
    """The parameters of the run's ``checkpoints/last`` model, by name."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "last" / "model")
    return {name: p.detach().clone() for name, p in model.state_dict().items()}


def training_rows(run_dir):
    """metrics.jsonl rows without wall-time metrics and validation (which runs at different steps)."""
    drop = (*EXCLUDED_FROM_REPRODUCIBILITY, "eval/")
    return [{k: v for k, v in row.items() if not k.startswith(drop)} for row in read_metrics(run_dir)]
