"""The ``gym`` reward (``ebpo.rewards.gym``): reasoning-gym's own ``score_answer`` on the ``<answer>`` of a
completion, partial credit, its counters, and a gold that is not a gym entry."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym", reason="the gym tasks need the ebpo[gym] extra")

import reasoning_gym  # noqa: E402

from ebpo.rewards import get_reward  # noqa: E402
from ebpo.tasks import get_task  # noqa: E402
from ebpo.tasks.gym import (
    decode_entry,  # noqa: E402
    encode_entry,  # noqa: E402
)
from helpers.gym import SMALL, gold  # noqa: E402


@pytest.fixture(scope="module")
def task():
    return get_task("gym:chain_sum,spell_backward", **SMALL)


@pytest.mark.parametrize("partial", [False, True])
def test_reward_is_score_answer_on_hand_made_completions(task, partial):
    reward = get_reward("gym", partial_credit=partial)
    for record in task.generate("test", 12, seed=1):
        entry = decode_entry(record.answer)
        # the generator that made the entry scores it: reasoning-gym's own, with the record's settings
        dataset = reasoning_gym.create_dataset(entry["dataset"], **entry.get("config", {}))
        original = dataset[0]  # any entry of the same dataset: score_answer reads answer and metadata
        assert set(original) >= {"question", "answer", "metadata"}
        right, wrong = gold(record), gold(record) + "7"
        cases = {
            f"<answer>{right}</answer>": right,  # right, in tags
            f"so <answer> {right} </answer>": right,  # spaces inside the tags are stripped
            f"<answer>1</answer> then <answer>{right}</answer>": right,  # the last pair counts
            f"<answer>{wrong}</answer>": wrong,  # wrong (partial credit where the dataset gives it)
            right: None,  # missing tags: no answer
            f"<answer>{right}": None,  # an unclosed tag: no answer
        }
        for completion, extracted in cases.items():
            expected = dataset.score_answer(extracted, entry)
            if not partial:
                expected = 1.0 if expected == 1.0 else 0.0
            assert reward(completion, record.answer) == expected, (completion, record.answer)
            assert reward.extract(completion) == extracted
        assert reward(f"<answer>{right}</answer>", record.answer) == 1.0
        assert reward(right, record.answer) == 0.0
    assert get_reward("gym", partial_credit=True)(
        "<answer>427</answer>", _chain_sum_gold("42")
    ) == pytest.approx(2 / 3)
    assert get_reward("gym")("<answer>427</answer>", _chain_sum_gold("42")) == 0.0


def _chain_sum_gold(answer: str) -> str:
    return encode_entry("chain_sum", {"answer": answer, "metadata": {}}, {})


def test_reward_counts_no_answers_and_scorer_errors_and_rejects_bad_gold():
    reward = get_reward("gym")
    prime = encode_entry("prime_factorization", {"answer": "2 × 3", "metadata": {"number": 6}}, {})
    assert reward("<answer>2 × 3</answer>", prime) == 1.0
    assert reward("<answer>two and three</answer>", prime) == 0.0  # its score_answer raises on this: scored 0
    assert reward("no tags", prime) == 0.0
    assert reward.metrics() == {
        "reward/verified": 3.0,
        "reward/no_answer": 1.0,
        "reward/verifier_errors": 1.0,
    }
    assert reward.batch(["<answer>2 × 3</answer>"], [prime]) == [1.0]
    with pytest.raises(ValueError, match=r"gym reward: the gold answer '42' is not a gym entry"):
        reward("<answer>42</answer>", "42")
    with pytest.raises(TypeError, match="partial_credit"):
        get_reward("gym", partial_credit="yes")
