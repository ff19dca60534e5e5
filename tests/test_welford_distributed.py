"""Welford.all_reduce over two gloo processes on CPU equals one pass over all ranks' data."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ebpo.welford import EWWelford, Welford

WORLD_SIZE = 2


def _shard(rank: int) -> np.ndarray:
    # rank 0: 300 values around 1e6; rank 1: 77 values around 1e6 + 5 (uneven sizes and means)
    rng = np.random.default_rng(100 + rank)
    return 1e6 + 5.0 * rank + rng.standard_normal(300 if rank == 0 else 77)


def _reduce_on_rank(rank: int, init_file: str) -> tuple[dict, dict]:
    """Join the gloo group, all_reduce a Welford and an EWWelford built from this rank's shard."""
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=timedelta(seconds=120),
    )
    try:
        acc = Welford().update(torch.from_numpy(_shard(rank)))
        acc.all_reduce()
        ew = EWWelford(3.0).update(_shard(rank)).step().update([float(rank)])
        ew.all_reduce()
        return acc.state_dict(), ew.state_dict()
    finally:
        dist.destroy_process_group()


def _worker(rank: int, init_file: str, results) -> None:
    torch.set_num_threads(1)
    results.put((rank, *_reduce_on_rank(rank, init_file)))


def test_two_process_all_reduce_equals_one_pass(tmp_path):
    # rank 1 runs in a spawned process; rank 0 runs here, so only one extra interpreter pays torch's import
    init_file = str(tmp_path / "init")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    child = ctx.Process(target=_worker, args=(1, init_file, results))
    child.start()
    try:
        rows = [(0, *_reduce_on_rank(0, init_file)), results.get()]
    finally:
        child.join(timeout=120)
    assert child.exitcode == 0
    states = {rank: (plain, ew) for rank, plain, ew in rows}
    assert sorted(states) == [0, 1]
    # every rank ends with bit-identical state
    assert states[0] == states[1]

    one_pass = Welford().update(np.concatenate([_shard(0), _shard(1)]))
    plain = Welford()
    plain.load_state_dict(states[0][0])
    assert plain.count == one_pass.count == 377
    assert plain.mean == pytest.approx(one_pass.mean, rel=1e-14)
    assert plain.var == pytest.approx(one_pass.var, rel=1e-10)

    # EW: each rank's shard aged one step, then one fresh value per rank, merged = the same on one process
    reference = EWWelford(3.0).update(np.concatenate([_shard(0), _shard(1)])).step().update([0.0, 1.0])
    ew = EWWelford(3.0)
    ew.load_state_dict(states[0][1])
    assert ew.count == pytest.approx(reference.count, rel=1e-12)
    assert ew.mean == pytest.approx(reference.mean, rel=1e-12)
    assert ew.var == pytest.approx(reference.var, rel=1e-9)
