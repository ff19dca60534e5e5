"""Why a vote of eight misses what the model's most likely answer gets right (a diagnostic, not a benchmark).

For each of the 1,800 test problems of ``ebpo base-model --grid test`` (40 per topic x level cell, seed 0) it
samples 64 answers at T = 1 and measures, on the problems whose most frequent answer of the 64 is right:
the right answer's share, the likeliest wrong answer's share and kind (``arith.answer_kind``), the expected
maj@8 over random 8-subsets of the 64 (``ebpo.eval.metrics.maj_at_k``), and, for comparison, the probability
with which the model's teacher writes any one wrong label (``ebpo.models.recipes.arith``).

    python docs/results/long_sft/vote_collisions.py src/ebpo/models/arith_base            # D2, about a minute
    python docs/results/long_sft/vote_collisions.py ~/.cache/ebpo/base_models/arith-6cacd0f01581   # L2

The recipe is read from the model's ``build_info.json``.
"""

from __future__ import annotations

import argparse
import json
import signal
from collections import Counter
from pathlib import Path
from statistics import mean

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ebpo.eval.metrics import maj_at_k, score_problem
from ebpo.generation import sample
from ebpo.models.recipes import arith as recipe
from ebpo.models.recipes.arith import BaseModelConfig
from ebpo.tasks import arith

SAMPLES, VOTERS, BATCH = 64, 8, 128
P_RIGHT_BANDS = ((0.0, 0.2), (0.2, 0.35), (0.35, 0.5), (0.5, 1.01))


def problem_row(record, texts: list[str], config: BaseModelConfig) -> dict:
    """One problem's vote: shares of the right and the likeliest wrong answer, maj@8 of the 64, the teacher."""
    rewards = [arith.verify(text, record.answer) for text in texts]
    answers = [None if (a := arith.extract_answer(text)) is None else str(a) for text in texts]
    scores = score_problem(record.id, rewards, answers, lambda a, b: a == b)
    counts = Counter(a for a in answers if a is not None)
    right = next((a for a, reward in zip(answers, rewards) if reward > 0), None)
    wrong = [(c, a) for a, c in counts.items() if a != right]
    top_count, top_answer = max(wrong) if wrong else (0, None)
    return {
        "mode_right": right is not None and counts[right] == max(counts.values()),
        "p_right": counts.get(right, 0) / SAMPLES,
        "p_top_wrong": top_count / SAMPLES,
        "top_kind": arith.answer_kind(top_answer, record.answer) if wrong else "none",
        "distinct_wrong": len(wrong),
        "maj8": maj_at_k(scores.clusters, scores.cluster_correct, VOTERS),
        "teacher_one_wrong": (1 - recipe.teacher_accuracy(config, record.topic, record.level))
        / len(recipe.wrong_labels(int(record.answer), config)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="a built base model directory (with build_info.json)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = BaseModelConfig(**json.loads((args.model / "build_info.json").read_text())["config"])
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    records = arith.generate("test", 40 * len(arith.TOPICS) * len(arith.LEVELS), seed=0)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for start in range(0, len(records), BATCH):
        chunk = records[start : start + BATCH]
        out = sample(
            model,
            tokenizer,
            [r.prompt for r in chunk],
            n=SAMPLES,
            temperature=1.0,
            top_p=1.0,
            max_new_tokens=config.max_new_tokens,
            generator=generator,
        )
        for m, record in enumerate(chunk):
            rows.append(problem_row(record, out.texts[m * SAMPLES : (m + 1) * SAMPLES], config))
    voted = [r for r in rows if r["mode_right"]]
    print(
        f"{args.model}: pass@1 {mean(r['p_right'] for r in rows):.3f}, maj@8 {mean(r['maj8'] for r in rows):.3f}, "
        f"most frequent of 64 right on {len(voted) / len(rows):.3f} of {len(rows)} test problems"
    )
    print(
        f"where it is right ({len(voted)}): right answer's share {mean(r['p_right'] for r in voted):.3f}, "
        f"likeliest wrong answer's {mean(r['p_top_wrong'] for r in voted):.3f} "
        f"(the teacher writes any one wrong label with {mean(r['teacher_one_wrong'] for r in voted):.4f}), "
        f"{mean(r['distinct_wrong'] for r in voted):.1f} distinct wrong answers, maj@8 {mean(r['maj8'] for r in voted):.3f}"
    )
    lost: Counter[str] = Counter()
    for r in voted:
        lost[r["top_kind"]] += 1 - r["maj8"]
    total = sum(lost.values())
    print(
        "votes lost there, by kind of the likeliest wrong answer: "
        + ", ".join(f"{kind} {share / total:.2f}" for kind, share in lost.most_common())
    )
    for low, high in P_RIGHT_BANDS:
        band = [r for r in voted if low <= r["p_right"] < high]
        if band:
            print(
                f"  right answer's share in [{low:.2f}, {min(high, 1):.2f}): {len(band)} problems, "
                f"maj@8 {mean(r['maj8'] for r in band):.3f}, likeliest wrong {mean(r['p_top_wrong'] for r in band):.3f}"
            )


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head`: end as a shell tool does when its reader exits
    main()
