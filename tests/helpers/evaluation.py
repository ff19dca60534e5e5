"""Scripted stand-ins for ``ebpo eval``'s tests (``tests/eval/``): a reward for synthetic records, the
records, and a seeded generator that can fail on cue."""

from __future__ import annotations

import torch

from ebpo.data.records import Record


class ExactReward:
    """Reward for synthetic records: 1 if the completion's text after 'ans=' equals the gold."""

    def extract(self, completion: str) -> str | None:
        return completion.split("ans=")[-1] if "ans=" in completion else None

    def batch(self, completions, answers):
        return [float(self.extract(c) == a) for c, a in zip(completions, answers)]


def synthetic_records(num: int) -> list[Record]:
    return [Record(id=f"p{i}", prompt=f"question {i}", answer=str(i)) for i in range(num)]


class SeededGenerator:
    """(prompts, n, seeds) -> texts; each prompt's answers drawn from its own seed. Counts calls and can
    raise ``error`` after ``fail_after`` calls (a simulated crash or Ctrl-C)."""

    def __init__(self, fail_after: int | None = None, error: BaseException | None = None):
        self.calls: list[list[str]] = []
        self.fail_after = fail_after
        self.error = error or RuntimeError("simulated crash")

    def __call__(self, prompts, n, seeds):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise self.error
        self.calls.append(list(prompts))
        assert len(seeds) == len(prompts)
        out = []
        for prompt, seed in zip(prompts, seeds):
            gold = prompt.split()[-1]
            gen = torch.Generator().manual_seed(seed)
            draws = torch.randint(0, 3, (n,), generator=gen).tolist()  # 0: correct, 1: "x", 2: no answer
            out.append([f"ans={gold}" if d == 0 else ("ans=x" if d == 1 else "no idea") for d in draws])
        return out
