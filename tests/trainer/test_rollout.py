"""``ebpo.trainer.rollout``: the typed rollout batch pads when concatenated and keeps its rows when selected."""

from __future__ import annotations

import torch

from ebpo.trainer.rollout import RolloutBatch


def _batch(prompt_ids, response_ids, score):
    prompt_ids_BP, response_ids_BT = torch.tensor(prompt_ids), torch.tensor(response_ids)
    num = prompt_ids_BP.shape[0]
    return RolloutBatch(
        prompt_ids_BP=prompt_ids_BP,
        prompt_mask_BP=(prompt_ids_BP > 0).long(),
        response_ids_BT=response_ids_BT,
        response_mask_BT=(response_ids_BT > 0).long(),
        lengths_B=(response_ids_BT > 0).sum(1),
        truncated_B=torch.zeros(num, dtype=torch.bool),
        score_B=torch.tensor(score, dtype=torch.float64),
        reward_B=torch.tensor(score, dtype=torch.float64),
        valid_B=torch.ones(num, dtype=torch.bool),
    )


def test_rollout_batch_concat_pads_and_select_keeps_rows():
    # round a: P = 1, T = 2; round b: P = 2, T = 1 -> prompts left-padded to 2, responses right-padded to 2
    a = _batch([[5], [6]], [[7, 8], [9, 0]], [0.5, 1.0])
    b = _batch([[1, 2]], [[3]], [0.0])
    batch = RolloutBatch.concat([a, b], pad_id=0)
    assert batch.num_rows == 3
    assert batch.prompt_ids_BP.tolist() == [[0, 5], [0, 6], [1, 2]]
    assert batch.prompt_mask_BP.tolist() == [[0, 1], [0, 1], [1, 1]]
    assert batch.response_ids_BT.tolist() == [[7, 8], [9, 0], [3, 0]]
    assert batch.response_mask_BT.tolist() == [[1, 1], [1, 0], [1, 0]]
    assert batch.score_B.tolist() == [0.5, 1.0, 0.0] and batch.lengths_B.tolist() == [2, 1, 1]
    picked = batch.select(torch.tensor([2, 0]))
    assert picked.response_ids_BT.tolist() == [[3, 0], [7, 8]] and picked.score_B.tolist() == [0.0, 0.5]
    tokens = picked.tokens
    assert torch.equal(tokens.prompt_ids_BP, picked.prompt_ids_BP)
    assert torch.equal(tokens.response_mask_BT, picked.response_mask_BT)
