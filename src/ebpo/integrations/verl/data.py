"""Our records -> verl's RL parquet rows (``data_source``, chat ``prompt``, ``reward_model``, ``extra_info``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_INSTRUCTION", "record_to_verl_row", "write_verl_parquet"]

DEFAULT_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def record_to_verl_row(
    record: Any,
    index: int,
    *,
    data_source: str,
    ability: str = "math",
    instruction: str = DEFAULT_INSTRUCTION,
) -> dict[str, Any]:
    """One ``ebpo.data.records.Record`` as a row of verl's RL parquet format.

    ``{"data_source", "prompt": [{"role": "user", "content": prompt + " " + instruction}], "ability",
    "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"index", "id", "source", "topic",
    "difficulty"}}``. ``prompt`` is the record's conversation (``ebpo.data.prompts.conversation``: a loader's own
    messages, else one user turn), the instruction appended to its last message: chat messages, which verl's
    dataset and agent loop render with the model's chat template, so a model reads the ids ``ebpo train`` and
    ``ebpo eval`` give it (``data.chat_template=auto``; a tokenizer without a template needs one for verl).
    ``data_source`` is what verl's reward dispatches on (``math_dapo``: verl's DAPO math
    verifier; ``ebpo.integrations.verl.rewards.compute_score`` reads our reward names such as ``arith``), so
    it is the same for every row and the record's own source goes to ``extra_info``; ``topic`` /
    ``difficulty`` are what the clustered samplers and ``cluster_key`` read (missing ones are written as
    None). ``instruction=""`` keeps the prompt as it is (the ``arith`` models answer bare prompts).
    """
    from ebpo.data.prompts import conversation

    messages = conversation(record)
    if instruction:
        messages[-1]["content"] = f"{messages[-1]['content']} {instruction}"
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": str(record.answer)},
        "extra_info": {
            "index": int(index),
            "id": str(record.id),
            "source": record.source,
            "topic": record.topic,
            "difficulty": None if record.difficulty is None else float(record.difficulty),
        },
    }


def write_verl_parquet(
    records: Sequence[Any], path: str | os.PathLike, *, data_source: str, **row_options: Any
) -> Path:
    """Write ``records`` to ``path`` in verl's parquet format (:func:`record_to_verl_row`); returns the path."""
    from ebpo.data.loaders import write_parquet

    if not records:
        raise ValueError(f"write_verl_parquet: no records to write to {path}")
    rows = [record_to_verl_row(r, i, data_source=data_source, **row_options) for i, r in enumerate(records)]
    out = Path(path)
    write_parquet(out, rows)  # atomically
    return out
