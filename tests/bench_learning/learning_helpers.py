"""Helpers shared by the learning benchmark's tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from typing import Any

SHARED_YAML = """\
model:
  path: null
data:
  task: arith
  levels: [1, 2]
  val_size: 18
  sampler: random
  batch_size: 8
  group_size: 4
rollout:
  temperature: 1.0
  top_p: 1.0
  max_new_tokens: 8
algorithm:
  estimator: ebpo
  loss_agg_mode: token-mean
  kl_coef: 0.01
optim:
  lr: 1.0e-3
  mini_batch_size: 2
run:
  steps: 10
  eval_every: 5
  save_every: 5
  eval_n: 2
  eval_k: 2
"""
"""Shared sizes the tests derive by hand: P = 8, G = 4 (so R = 32), 8 / 2 = 4 updates, 10 steps."""


def fake_result(spec, pass1: float, val: list[float] | None = None, **extra: Any) -> dict[str, Any]:
    """A result as :func:`benchmarks.learning.run.execute` writes it, with given test Pass@1 and validation
    curve (evaluated at steps 0, 5, 10, ...)."""
    val = val if val is not None else [0.2, 0.2, 0.2]
    steps = 5 * (len(val) - 1)
    n = spec.test_settings["n"]
    result = {
        "key": spec.key,
        "spec": spec.to_dict(),
        "label": spec.label,
        "command": "python -m benchmarks.learning --unit",
        "base_model": spec.model_path,
        "code_fingerprint": "abc",
        "steps": steps,
        "val_best_maj": max(val),
        "val_best_step": 0,
        "test": {
            "pass@1": pass1,
            f"maj@{n}": pass1,
            "num_problems": 9,
            "by_topic": {"mod": {"pass@1": pass1}, "dot": {"pass@1": pass1 / 2}},
            "by_level": {"1": {"pass@1": pass1}, "2": {"pass@1": 0.0}},
        },
        "test_best": None,
        "curves": {
            "eval/pass@1": [[5.0 * i, v] for i, v in enumerate(val)],
            "actor/grad_norm": [[float(s), 0.5] for s in range(1, steps + 1)],
        },
        "timing": {
            "train_s": 10.0,
            "train_cpu_s": 8.0,
            "val_cpu_s": 2.0,
            "test_s": 2.0,
            "test_cpu_s": 1.0,
            "resumed_from_step": 0,
            "threads": 1,
        },
        "counts": {
            "train_responses": spec.train_responses,
            "val_samples": spec.val_samples,
            "test_samples": 9 * n,
        },
    }
    result.update(extra)
    return result
