"""Clustered verl train samplers over ``ebpo.data.samplers`` (verl's ``data.sampler`` contract
``cls(data_source, data_config)``).

Their cursor is saved in verl's own ``data.pt`` (torchdata's ``StatefulDataLoader`` stores the sampler's
``state_dict``), so a resumed run continues the same order, also after the first epoch. The cursor is the
prompts handed out, not the stream's look-ahead: the stream takes a whole batch at a time, while verl's v1
trainer under ``algorithm.filter_groups`` fetches prompts one by one and stops anywhere in a batch; a resume
goes on with the first prompt not yet handed out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ebpo.data.samplers import StreamSampler, get_sampler
from ebpo.integrations.verl.estimators import to_plain

__all__ = ["ClusteredSampler", "TopicSampler", "DifficultySampler", "create_sampler"]


def _dataset_column(data_source: Any, key: str) -> list[Any]:
    """Per-row values of ``key`` (``col`` or ``col.field``) from a verl ``RLHFDataset`` or any indexable."""
    column, _, field = key.partition(".")
    frame = getattr(data_source, "dataframe", None)
    if frame is not None and column in getattr(frame, "column_names", []):
        rows = list(frame[column])
    else:
        rows = [data_source[i].get(column) for i in range(len(data_source))]
    values = []
    for i, row in enumerate(rows):
        value = row.get(field) if field and isinstance(row, Mapping) else (row if not field else None)
        if value is None:
            raise ValueError(f"sampler: dataset row {i} has no {key!r}; write it in the data (extra_info)")
        values.append(value)
    return values


class ClusteredSampler(StreamSampler):
    """A verl train sampler over one of ``ebpo.data.samplers``' streams (subclasses set ``kind``).

    verl config: ``+data.sampler.class_path=pkg://ebpo.integrations.verl
    +data.sampler.class_name=TopicSampler`` (or ``DifficultySampler``), ``data.shuffle=False`` is implied.
    Read from ``data_config``: batch size ``gen_batch_size or train_batch_size`` (so every dataloader batch
    is one batch of our stream), ``seed`` (default 0), and ``sampler.key`` (the column, default
    ``extra_info.<kind>``), plus ``sampler.options`` (``leftover`` / ``after_epoch``).
    """

    kind: str = ""

    def __init__(self, data_source: Any, data_config: Any) -> None:
        sampler_cfg = to_plain(data_config.get("sampler", None)) or {}
        key = sampler_cfg.get("key") or f"extra_info.{self.kind}"
        batch_size = int(data_config.get("gen_batch_size", None) or data_config.get("train_batch_size"))
        seed = data_config.get("seed", None)
        stream = get_sampler(
            self.kind,
            _dataset_column(data_source, key),
            batch_size,
            int(seed) if seed is not None else 0,
            **(sampler_cfg.get("options") or {}),
        )
        super().__init__(stream)
        self.data_source = data_source
        self._handed_out: tuple[int, int] | None = None  # (epoch, position) after the last index yielded

    def __iter__(self) -> Iterator[int]:
        # StreamSampler advances the stream by whole batches (position += batch size) before yielding their
        # indices: the first batch of this pass started at position - batch_size
        start = None
        for count, index in enumerate(super().__iter__(), start=1):
            if start is None:
                start = self.stream.position - self.stream.batch_size
            self._handed_out = (self.stream.epoch, start + count)
            yield index

    def state_dict(self) -> dict[str, Any]:
        """The stream's state with its cursor at the first prompt not yet handed out."""
        state = super().state_dict()
        if self._handed_out is not None and self._handed_out[0] == state["epoch"]:
            state["position"] = self._handed_out[1]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._handed_out = None


class TopicSampler(ClusteredSampler):
    """Topic-coherent batches (the paper's EBPO-topic): ``extra_info.topic`` by default."""

    kind = "topic"


class DifficultySampler(ClusteredSampler):
    """Easy-to-hard curriculum (the paper's EBPO-diff): ``extra_info.difficulty`` (pass rate) by default."""

    kind = "difficulty"


def create_sampler(data_config: Any, dataset: Any) -> Any:
    """verl's ``data.sampler`` option: ``cls(dataset, data_config)`` from ``sampler.class_path`` /
    ``sampler.class_name`` when set (verl 0.9 dropped it from ``create_rl_sampler``), else verl's own."""
    sampler_cfg = data_config.get("sampler", None)
    if sampler_cfg is not None and sampler_cfg.get("class_path", None):
        from verl.utils.import_utils import load_extern_object

        cls = load_extern_object(sampler_cfg.class_path, sampler_cfg.class_name)
        if not callable(cls):
            raise ValueError(
                f"data.sampler.class_name={sampler_cfg.class_name!r} in {sampler_cfg.class_path} is a "
                f"{type(cls).__name__}, not a sampler class"
            )
        return cls(data_source=dataset, data_config=data_config)
    from verl.trainer.ppo.utils import create_rl_sampler

    return create_rl_sampler(data_config, dataset)
