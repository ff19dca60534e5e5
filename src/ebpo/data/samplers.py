"""Prompt samplers: the random, topic-coherent and easy-to-hard curriculum streams (docs/design.md §4).

Every sampler is an :class:`IndexStream`: an endless, deterministic sequence of record indices cut into
batches of ``batch_size`` prompts. The order of epoch ``e`` is a pure function of ``(seed, e)``, so the whole
state is a cursor ``(epoch, position)``; ``state_dict()`` / ``load_state_dict()`` save and restore it and a
resumed stream continues the identical sequence.

Epochs are made of whole batches (``drop_last`` semantics, as in TRL's ``RepeatSampler`` and verl's
dataloader): an epoch holds ``num_batches = floor(N / batch_size)`` batches, so a batch never straddles two
epochs and a framework that cuts our index stream into batches of the same size sees exactly our batches.

- ``random`` (the paper's EBPO-naive): a fresh permutation every epoch; the ``N mod batch_size`` prompts at its
  tail sit out that epoch (a different few each epoch).
- ``topic`` (EBPO-topic): topic-coherent. Per epoch the topics are put in a random order and the prompts
  inside each topic are shuffled; each topic is cut into full batches, and all of one topic's batches come
  before the next topic's, so consecutive batches share a topic. A topic's leftover (fewer prompts than a
  batch) is handled by ``leftover``: ``"mix"`` (default) pools the leftovers of all topics, in topic order,
  into mixed batches at the end of the epoch (every prompt is seen once per epoch, except the final
  ``< batch_size`` of the pool, which sit out that epoch); ``"drop"`` leaves them out of that epoch (every
  batch is single-topic; the prompts left out change from epoch to epoch because the shuffle does).
- ``difficulty`` (EBPO-diff, the curriculum): difficulty is the base model's pass rate, and the epoch goes
  from easy to hard (high pass rate first), ties kept in record order, no shuffling; the hardest
  ``N mod batch_size`` prompts do not fit a whole batch and are left out. After the first epoch
  (the paper trains exactly one), ``after_epoch`` decides: ``"repeat"`` (default) starts the same easy-to-hard
  pass again, as a non-shuffling sequential sampler would; ``"shuffle"`` continues with random permutations.

Frameworks: :class:`StreamSampler` wraps any stream as a ``torch.utils.data.Sampler`` (one epoch per
``__iter__``, optional TRL-style repetition of each index), and :func:`cluster_key` gives the cluster a
record belongs to (its topic or its difficulty bucket) for EBPO's ``prior_scope="cluster"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from ebpo.data.records import Record
from ebpo.registry import Registry

__all__ = [
    "IndexStream",
    "RandomSampler",
    "TopicSampler",
    "DifficultySampler",
    "StreamSampler",
    "get_sampler",
    "list_samplers",
    "register_sampler",
    "cluster_key",
    "difficulty_bucket",
]


def _field(item: Any, name: str) -> Any:
    """The ``name`` attribute of a Record, the ``name`` key of a mapping, or the item itself (a raw key)."""
    if isinstance(item, Record):
        return getattr(item, name)
    if isinstance(item, dict):
        return item.get(name)
    return item


def _describe(item: Any, position: int) -> str:
    ident = item.id if isinstance(item, Record) else item.get("id") if isinstance(item, dict) else None
    return f"record {position}" + (f" (id {ident!r})" if ident is not None else "")


class IndexStream:
    """An endless stream of record indices in batches; subclasses define one epoch's order.

    Args:
        num_records: N, the number of records indexed ``0..N-1``.
        batch_size: prompts per batch (B). Must satisfy ``1 <= B <= N``.
        seed: seed of every random choice; epoch ``e`` uses ``numpy.random.default_rng([seed, e])``.
    """

    name: str = "base"

    def __init__(self, num_records: int, batch_size: int, seed: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"{self.name} sampler: batch_size must be >= 1, got {batch_size}")
        if num_records < batch_size:
            raise ValueError(
                f"{self.name} sampler: batch_size {batch_size} is larger than the number of records "
                f"({num_records}); lower the batch size or add data"
            )
        self.num_records = int(num_records)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0  # index into the current epoch's order of the next prompt to hand out
        self._cached_epoch: int | None = None
        self._cached_order: list[int] = []

    # -- the order ---------------------------------------------------------------------------------------
    def _epoch_order(self, epoch: int) -> list[int]:
        """Indices of epoch ``epoch``: a multiple of ``batch_size`` long, each index at most once."""
        raise NotImplementedError

    def epoch_order(self, epoch: int) -> list[int]:
        """The full index order of epoch ``epoch`` (cached for the current epoch)."""
        if self._cached_epoch != epoch:
            order = self._epoch_order(epoch)
            if len(order) % self.batch_size != 0 or not order:
                raise AssertionError(f"{self.name}: epoch order of length {len(order)} is not whole batches")
            self._cached_epoch, self._cached_order = epoch, order
        return self._cached_order

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch])

    # -- consuming ---------------------------------------------------------------------------------------
    @property
    def batches_per_epoch(self) -> int:
        """Number of batches in one epoch (the same for every epoch of a given stream)."""
        return len(self.epoch_order(0)) // self.batch_size

    def next_batch(self) -> list[int]:
        """The next ``batch_size`` indices; rolls over to the next epoch when this one is used up."""
        order = self.epoch_order(self.epoch)
        if self.position >= len(order):
            self.epoch, self.position = self.epoch + 1, 0
            order = self.epoch_order(self.epoch)
        batch = order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return list(batch)

    def __iter__(self) -> Iterator[list[int]]:
        """Endless iterator of batches (``next_batch`` forever)."""
        while True:
            yield self.next_batch()

    # -- checkpointing -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cursor plus what identifies the stream (checked on load)."""
        return {
            "name": self.name,
            "num_records": self.num_records,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursor; raises if the state belongs to a different stream (name, N, B or seed)."""
        for key in ("name", "num_records", "batch_size", "seed"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"{self.name} sampler: checkpoint has {key}={state.get(key)!r} but this sampler has "
                    f"{key}={getattr(self, key)!r}; build the sampler with the checkpoint's settings"
                )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_records={self.num_records}, batch_size={self.batch_size}, "
            f"seed={self.seed}, epoch={self.epoch}, position={self.position})"
        )


class RandomSampler(IndexStream):
    """The usual shuffled stream (the paper's EBPO-naive): a new permutation each epoch, whole batches."""

    name = "random"

    def __init__(self, records: Sequence[Any], batch_size: int, seed: int = 0) -> None:
        super().__init__(len(records), batch_size, seed)

    def _epoch_order(self, epoch: int) -> list[int]:
        perm_N = self._rng(epoch).permutation(self.num_records)
        usable = (self.num_records // self.batch_size) * self.batch_size
        return perm_N[:usable].tolist()


class TopicSampler(IndexStream):
    """Topic-coherent stream (EBPO-topic, docs/design.md §4): consecutive batches come from one topic.

    Args:
        records: Records (their ``topic``), mappings with a ``"topic"`` key, or the topic keys themselves.
        batch_size: prompts per batch.
        seed: seed of the topic order and of the order inside each topic (both reshuffled every epoch).
        leftover: what to do with a topic's last prompts that do not fill a batch: ``"mix"`` pools them
            into mixed batches at the end of the epoch; ``"drop"`` leaves them out of that epoch.
    """

    name = "topic"
    LEFTOVER_CHOICES = ("mix", "drop")

    def __init__(self, records: Sequence[Any], batch_size: int, seed: int = 0, leftover: str = "mix") -> None:
        if leftover not in self.LEFTOVER_CHOICES:
            raise ValueError(
                f"topic sampler: leftover must be one of {self.LEFTOVER_CHOICES}, got {leftover!r}"
            )
        self.leftover = leftover
        members: dict[Hashable, list[int]] = {}
        for i, item in enumerate(records):
            topic = _field(item, "topic")
            if topic is None or topic == "":
                raise ValueError(
                    f"topic sampler: {_describe(item, i)} has no topic; label the data with "
                    "`ebpo annotate topic` or use the 'random' sampler"
                )
            members.setdefault(topic, []).append(i)
        # topics in a canonical order (sorted by their string form) so the seed alone fixes the stream
        self.topics: list[Hashable] = sorted(members, key=str)
        self._members = [members[t] for t in self.topics]
        super().__init__(len(records), batch_size, seed)
        if leftover == "drop" and all(len(m) < batch_size for m in self._members):
            raise ValueError(
                f"topic sampler: no topic has batch_size={batch_size} prompts, so leftover='drop' leaves "
                "nothing; use leftover='mix' or a smaller batch size"
            )

    def _epoch_order(self, epoch: int) -> list[int]:
        rng = self._rng(epoch)
        topic_order = rng.permutation(len(self.topics))
        full: list[int] = []
        pool: list[int] = []
        for t in topic_order:
            members = self._members[t]
            shuffled = [members[j] for j in rng.permutation(len(members))]
            cut = (len(shuffled) // self.batch_size) * self.batch_size
            full.extend(shuffled[:cut])
            pool.extend(shuffled[cut:])
        if self.leftover == "mix":
            full.extend(pool[: (len(pool) // self.batch_size) * self.batch_size])
        return full


class DifficultySampler(IndexStream):
    """Easy-to-hard curriculum (EBPO-diff, docs/design.md §4): sorted by pass rate, highest first, no shuffle.

    Args:
        records: Records (their ``difficulty`` = base-model pass rate in [0, 1]), mappings with a
            ``"difficulty"`` key, or the pass rates themselves.
        batch_size: prompts per batch.
        seed: used only by ``after_epoch="shuffle"`` (epochs after the first).
        after_epoch: ``"repeat"`` replays the same easy-to-hard order every epoch; ``"shuffle"`` makes every
            epoch after the first a random permutation.
    """

    name = "difficulty"
    AFTER_EPOCH_CHOICES = ("repeat", "shuffle")

    def __init__(
        self, records: Sequence[Any], batch_size: int, seed: int = 0, after_epoch: str = "repeat"
    ) -> None:
        if after_epoch not in self.AFTER_EPOCH_CHOICES:
            raise ValueError(
                f"difficulty sampler: after_epoch must be one of {self.AFTER_EPOCH_CHOICES}, got {after_epoch!r}"
            )
        self.after_epoch = after_epoch
        pass_rates: list[float] = []
        for i, item in enumerate(records):
            value = _field(item, "difficulty")
            try:
                pass_rate = float(value)
            except (TypeError, ValueError):
                pass_rate = math.nan
            if not 0.0 <= pass_rate <= 1.0:
                raise ValueError(
                    f"difficulty sampler: {_describe(item, i)} has difficulty {value!r}, need a pass rate in "
                    "[0, 1]; run `ebpo annotate difficulty` first"
                )
            pass_rates.append(pass_rate)
        self.pass_rates = pass_rates
        super().__init__(len(records), batch_size, seed)
        # stable sort on -pass_rate: easy (high pass rate) first, ties in record order
        self._curriculum = sorted(range(self.num_records), key=lambda i: -pass_rates[i])

    def _epoch_order(self, epoch: int) -> list[int]:
        usable = (self.num_records // self.batch_size) * self.batch_size
        if epoch == 0 or self.after_epoch == "repeat":
            return self._curriculum[:usable]
        return self._rng(epoch).permutation(self.num_records)[:usable].tolist()


SamplerFactory = Callable[..., IndexStream]
_SAMPLERS: Registry[SamplerFactory] = Registry("sampler")


def register_sampler(name: str, factory: SamplerFactory) -> None:
    """Add a sampler ``factory(records, batch_size, seed, **options) -> IndexStream`` under ``name``."""
    _SAMPLERS.register(name, factory)


def list_samplers() -> list[str]:
    """Names accepted by :func:`get_sampler`, sorted."""
    return _SAMPLERS.names()


def get_sampler(
    name: str, records: Sequence[Any], batch_size: int, seed: int = 0, **options: Any
) -> IndexStream:
    """Build the sampler ``name`` (``random``, ``topic`` or ``difficulty``) over ``records``.

    ``records`` are ``Record`` objects, mappings with the needed key, or the keys themselves (topic
    labels for ``topic``, pass rates for ``difficulty``, anything for ``random``). ``options`` go to the
    sampler (``leftover`` for ``topic``, ``after_epoch`` for ``difficulty``).
    """
    return _SAMPLERS.get(name)(records, batch_size, seed, **options)


register_sampler("random", RandomSampler)
register_sampler("topic", TopicSampler)
register_sampler("difficulty", DifficultySampler)


class StreamSampler(Sampler[int]):
    """A ``torch.utils.data.Sampler`` over an :class:`IndexStream`: one epoch per ``__iter__``.

    Each ``iter()`` yields the stream from its cursor to the end of the current epoch (a whole epoch when
    the cursor sits at an epoch start; the rest of it after a mid-epoch resume), advancing the stream as
    it goes, so the next ``iter()`` continues with the next epoch and ``state_dict()`` is the stream's.

    With ``mini_repeat_count=G`` every index is yielded ``G`` times in a row and with ``repeat_count=R``
    each batch is replayed ``R`` times, in the layout of TRL's ``RepeatSampler``:
    ``for batch: for _ in range(R): for idx in batch: for _ in range(G): yield idx``.

    Args:
        stream: the index stream (from :func:`get_sampler`).
        mini_repeat_count: consecutive copies of each index (TRL: ``num_generations``).
        repeat_count: times each batch is replayed (TRL: ``num_iterations * steps_per_generation``).
    """

    def __init__(self, stream: IndexStream, mini_repeat_count: int = 1, repeat_count: int = 1) -> None:
        if mini_repeat_count < 1 or repeat_count < 1:
            raise ValueError(
                f"mini_repeat_count and repeat_count must be >= 1, got {mini_repeat_count} and {repeat_count}"
            )
        self.stream = stream
        self.mini_repeat_count = int(mini_repeat_count)
        self.repeat_count = int(repeat_count)

    def __iter__(self) -> Iterator[int]:
        stream = self.stream
        order = stream.epoch_order(stream.epoch)
        if stream.position >= len(order):  # the previous epoch was used up: start the next one
            stream.epoch, stream.position = stream.epoch + 1, 0
        epoch = stream.epoch
        while stream.epoch == epoch and stream.position < len(stream.epoch_order(epoch)):
            batch = stream.next_batch()
            for _ in range(self.repeat_count):
                for index in batch:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        """Indices in one full epoch: batches * batch_size * mini_repeat_count * repeat_count."""
        stream = self.stream
        return stream.batches_per_epoch * stream.batch_size * self.mini_repeat_count * self.repeat_count

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)


def difficulty_bucket(pass_rate: float, num_buckets: int = 4) -> str:
    """Name of the pass-rate bucket ``[k/K, (k+1)/K)`` holding ``pass_rate`` (the last bucket includes 1).

    Example (K = 4): 0.0 -> ``"pass_rate[0.00,0.25)"``, 0.5 -> ``"pass_rate[0.50,0.75)"``,
    1.0 -> ``"pass_rate[0.75,1.00]"``.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    if not (0.0 <= pass_rate <= 1.0):
        raise ValueError(f"pass rate must lie in [0, 1], got {pass_rate!r}")
    k = min(int(math.floor(pass_rate * num_buckets)), num_buckets - 1)
    close = "]" if k == num_buckets - 1 else ")"
    return f"pass_rate[{k / num_buckets:.2f},{(k + 1) / num_buckets:.2f}{close}"


def _topic_key(record: Any, num_buckets: int) -> Hashable:
    topic = _field(record, "topic")
    if topic is None or topic == "":
        raise ValueError("cluster_key: record has no topic; run `ebpo annotate topic` first")
    return topic


def _difficulty_key(record: Any, num_buckets: int) -> Hashable:
    value = _field(record, "difficulty")
    if value is None:
        raise ValueError("cluster_key: record has no difficulty; run `ebpo annotate difficulty` first")
    return difficulty_bucket(float(value), num_buckets)


_CLUSTER_KEYS: dict[str, Callable[[Any, int], Hashable]] = {
    "topic": _topic_key,
    "difficulty": _difficulty_key,
}


def cluster_key(record: Any, by: str = "topic", num_buckets: int = 4) -> Hashable:
    """The cluster a record belongs to, for EBPO's ``prior_scope="cluster"``: its ``topic``
    (``by="topic"``) or its pass-rate bucket (``by="difficulty"``, :func:`difficulty_bucket` with
    ``num_buckets``). Accepts a Record, a mapping, or the raw key."""
    if by not in _CLUSTER_KEYS:
        raise ValueError(f"cluster_key: by must be one of {sorted(_CLUSTER_KEYS)}, got {by!r}")
    return _CLUSTER_KEYS[by](record, num_buckets)
