"""The actor update of a step whose saturated groups ``algorithm.filter_groups`` dropped: trained exactly as if
those rows had been removed from the batch.

verl cannot simply be handed the smaller batch: its actor splits a batch into mini-batches of
``ppo_mini_batch_size * rollout.n`` rows and requires a whole number of them per data-parallel rank; and a
batch that keeps the dropped rows with their ``response_mask`` zeroed is trained differently from one without
them: ``agg_loss`` divides the ``seq-mean-*`` modes by the fixed ``global_batch_size`` (zeroed rows still
count, so the loss shrinks by the fraction of rows kept), a mini-batch whose rows are all zeroed divides 0 by
0 under ``token-mean``, and every such mini-batch still takes an optimizer step.

So the driver (:func:`layout_filtered_update`, called by ``EBPORayPPOTrainer._update_actor``) sends the
K kept rows, in batch order, followed by just enough dropped rows, mask zeroed, to fill the last mini-batch
(``ceil(K / rows_per_update)`` mini-batches, the same number the K rows alone would make), and marks each
row in :data:`TRAINED_KEY`. The worker (:class:`ebpo.integrations.verl.worker.EBPOTrainingWorker`) sets
each mini-batch's ``global_batch_size`` to its number of marked rows, summed over the data-parallel ranks.
Then every mini-batch's loss and gradient are those of its kept rows alone, for every ``loss_agg_mode``:
``token-mean`` divides by the kept tokens (the padding rows have none), ``token-sum`` adds nothing for them,
the ``seq-mean-*`` modes divide by the kept sequences. Every mini-batch holds at least one kept row (the
first slice of data-parallel rank 0 always does), so none is empty. Nothing is sent when every group was
dropped: the step takes no optimizer step, as an empty batch would.

Rows verl's own rollout-correction rejection zeroed stay as verl treats them (marked, counted in the
``seq-mean-*`` denominators): only ebpo's filter is undone here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["TRAINED_KEY", "layout_filtered_update"]

#: per-row bool tensor the driver adds to the actor's batch: True for rows that are trained on, False for the
#: padding rows that only complete the last mini-batch.
TRAINED_KEY = "ebpo_trained"


def layout_filtered_update(batch: Any, dropped_B: np.ndarray, rows_per_update: int) -> Any | None:
    """The batch to send to verl's actor update when the rows ``dropped_B`` (bool, one per row) were filtered.

    Returns ``batch`` itself when nothing was dropped, None when everything was, and otherwise a new
    ``DataProto``: the kept rows in batch order, then the first ``-K mod rows_per_update`` dropped rows with
    their ``response_mask`` zeroed, and :data:`TRAINED_KEY` marking which is which.
    """
    dropped_B = np.asarray(dropped_B, dtype=bool)
    if len(dropped_B) != len(batch):
        raise ValueError(f"layout_filtered_update: {len(dropped_B)} flags for a batch of {len(batch)} rows")
    kept = np.flatnonzero(~dropped_B)
    if len(kept) == len(batch):
        return batch
    if len(kept) == 0:
        return None
    padding = -len(kept) % rows_per_update
    order = np.concatenate([kept, np.flatnonzero(dropped_B)[:padding]])
    out = batch.select_idxs(order)
    out.meta_info = dict(batch.meta_info)
    token_num = out.meta_info.get("global_token_num")
    if token_num is not None and len(token_num) == len(batch):
        out.meta_info["global_token_num"] = [token_num[i] for i in order]
    trained_B = torch.zeros(len(order), dtype=torch.bool)
    trained_B[: len(kept)] = True
    mask_BT = out.batch["response_mask"]
    out.batch["response_mask"] = mask_BT * trained_B.to(mask_BT.device).unsqueeze(-1).to(mask_BT.dtype)
    out.batch[TRAINED_KEY] = trained_B.to(mask_BT.device)
    return out
