"""Validation during training (docs/design.md §5): pass@1 over ``run.eval_n`` samples, unbiased pass@k and maj@k.

It draws from its own generator, re-seeded identically at every validation: common random numbers across
checkpoints, and the training RNG stream is never touched (exact resume depends on that).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from ebpo.data.prompts import PromptFormat
from ebpo.data.records import Record
from ebpo.eval.metrics import ProblemScores, score_problem, summarize
from ebpo.generation import sample
from ebpo.trainer.config import TrainConfig
from ebpo.trainer.rollout import score_samples

EVAL_SEED_OFFSET = 1_000_003
"""The validation generator's seed is ``run.seed`` plus this, apart from the training stream's."""


@torch.no_grad()
def validate(
    model: Any,
    tokenizer: Any,
    records: list[Record],
    reward_fn: Any,
    cfg: TrainConfig,
    *,
    prompt_format: PromptFormat | None = None,
) -> dict[str, float]:
    """``eval/pass@1``, ``eval/pass@k``, ``eval/maj@k`` (k = ``run.eval_k``) over ``records``, and
    ``eval/pass@1/<topic>`` per topic when the records have topics.

    The prompts are ``prompt_format``'s ids (default: ``data.chat_template`` resolved against ``tokenizer``),
    as training and ``ebpo eval`` read them.

    Answers are extracted with the reward's ``extract`` and clustered with its ``equivalent`` (plain string
    equality when the reward has none), as ``ebpo eval`` does.
    """
    run, n = cfg.run, cfg.run.eval_n
    if prompt_format is None:
        prompt_format = PromptFormat.resolve(tokenizer, cfg.data.chat_template, option="data.chat_template")
    rollouts = sample(
        model,
        tokenizer,
        prompt_format.ids(records),
        n=n,
        temperature=run.eval_temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        generator=torch.Generator(device="cpu").manual_seed(run.seed + EVAL_SEED_OFFSET),
    )
    answers = [rec.answer for rec in records for _ in range(n)]
    prompts = [rec.prompt for rec in records for _ in range(n)]
    rewards_N, _, _ = score_samples(reward_fn, rollouts.texts, answers, prompts)  # a failed sample scores 0
    extract = getattr(reward_fn, "extract", None)  # optional in the reward protocol
    equivalent = getattr(reward_fn, "equivalent", None) or (lambda gold, pred: gold == pred)
    by_topic: dict[str, list[ProblemScores]] = defaultdict(list)
    for m, rec in enumerate(records):
        rows = slice(m * n, (m + 1) * n)
        extracted = [extract(t) if extract is not None else t.strip() for t in rollouts.texts[rows]]
        extracted = [None if x is None else str(x) for x in extracted]
        problem = score_problem(rec.id, rewards_N[rows].tolist(), extracted, equivalent)
        by_topic["all"].append(problem)
        by_topic[str(rec.topic)].append(problem)
    k = run.eval_k
    overall = summarize(by_topic.pop("all"), ks=(1, k), maj_ks=(k,), seed=run.seed)
    metrics = {
        f"eval/{name}": overall[name] for name in ("pass@1", f"pass@{k}", f"maj@{k}") if name in overall
    }
    metrics["eval/pass@1_se"] = overall["pass@1/se_problems"]  # standard error over the problems
    if len(by_topic) > 1 or "None" not in by_topic:
        for topic, problems in sorted(by_topic.items()):
            metrics[f"eval/pass@1/{topic}"] = summarize(problems)["pass@1"]
    return metrics
