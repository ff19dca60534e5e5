"""One actor update through verl's own code (driver ``_update_actor``, worker ``train_mini_batch``, FSDP2
engine, ``ppo_loss`` / ``agg_loss``) on 1 and 2 CPU ranks: a step whose groups ``filter_groups`` dropped
trains exactly as if they had been removed, for every ``loss_agg_mode`` verl has, and the update does not
depend on the number of ranks. ``tests/integrations/verl/verl_update_harness.py`` runs the cases under ``torch.distributed.run``
(gloo); with SGD (no momentum, no weight decay, no clipping) the parameter change of an update is
-lr x the sum of its mini-batches' gradients, so comparing parameters compares gradients.

The batch: 8 groups x 4 rows, groups 1, 4 and 5 dropped (20 rows kept). With 2 prompts (8 rows) per
mini-batch the kept rows make 3 mini-batches (8, 8, 4 rows); the reference trains those 3 with verl's own
worker and driver, the last one as a mini-batch of its own size.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
from ebpo.integrations.compat import trl_conflict  # noqa: E402

if trl_conflict():
    pytest.skip(trl_conflict(), allow_module_level=True)

from ebpo.integrations.verl.cpu.config import legacy_cpu_refusal  # noqa: E402

if legacy_cpu_refusal():  # verl's update path on the CPU unpads with flash-attn on this verl
    pytest.skip(legacy_cpu_refusal(), allow_module_level=True)

pytestmark = pytest.mark.slow

HARNESS = Path(__file__).resolve().parent / "verl_update_harness.py"
MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
WALL: dict[str, float] = {}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_harness(tmp: Path, model_dir: Path, ranks: int, cases: list[str]) -> dict[str, dict]:
    out = tmp / f"update-{ranks}.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VERL_PLATFORM": "cpu"}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    started = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={ranks}",
            f"--master_port={free_port()}",
            str(HARNESS),
            str(model_dir),
            str(out),
            *cases,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    WALL[f"{ranks} rank(s)"] = time.perf_counter() - started
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return {case["name"]: case for case in torch.load(out, weights_only=False)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("verl-update")
    one = [f"{m}/ours:ours:ebpo:2:{m}" for m in MODES]
    one += [f"{m}/removed:verl:removed:2:{m}" for m in MODES]
    one += [f"{m}/zeroed:verl:zeroed:2:{m}" for m in MODES]
    # one mini-batch per update (the whole batch): the same rows in every mini-batch on 1 and 2 ranks
    whole = [f"{m}/whole-ours:ours:ebpo:8:{m}" for m in MODES]
    whole += [f"{m}/whole-none:ours:none:8:{m}" for m in ("token-mean", "seq-mean-token-mean")]
    one += whole + [f"{m}/whole-removed:verl:removed:8:{m}" for m in MODES]
    # the two launches at once: the 1-rank one is a single process, which leaves a core idle on its own
    with ThreadPoolExecutor(2) as pool:
        one_rank = pool.submit(run_harness, tmp, tiny_model_dir, 1, one)
        two_ranks = pool.submit(run_harness, tmp, tiny_model_dir, 2, whole)
        results = {f"1/{k}": v for k, v in one_rank.result().items()}
        results |= {f"2/{k}": v for k, v in two_ranks.result().items()}
    print(f"\n[verl update] harness wall time: {', '.join(f'{k} {v:.0f} s' for k, v in WALL.items())}")
    return results


def flat(case: dict) -> torch.Tensor:
    return torch.cat([d.flatten() for d in case["delta"].values()]).double()


def per_update(case: dict, key: str) -> list[float]:
    """One value per mini-batch update, over the case's ``_update_actor`` calls."""
    return [float(v) for metrics in case["metrics"] for v in metrics[key]]


LOSSES = ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/grad_norm")


@pytest.mark.parametrize("mode", MODES)
def test_filtered_step_trains_as_if_the_groups_were_removed(runs, mode):
    ours, removed, zeroed = (runs[f"1/{mode}/{kind}"] for kind in ("ours", "removed", "zeroed"))
    assert len(ours["metrics"]) == 1 and len(removed["metrics"]) == 2  # one driver call; reference: 2 + 1
    for key in LOSSES:
        assert per_update(ours, key) == pytest.approx(per_update(removed, key), rel=1e-6, abs=1e-9), key
    assert len(per_update(ours, "actor/pg_loss")) == 3  # 20 kept rows in mini-batches of 8: 8, 8, 4
    torch.testing.assert_close(
        flat(ours), flat(removed), rtol=0, atol=1e-7 * float(flat(removed).abs().max())
    )
    assert flat(ours).norm() > 0.05  # lr 0.5: a real update
    # the comparison can fail: keeping the dropped rows with their mask zeroed (4 mini-batches, fixed
    # seq-mean denominators, an all-zero third mini-batch) trains something else; under token-mean that
    # mini-batch divides 0 by 0
    assert (flat(zeroed) - flat(removed)).norm() > 0.1 * flat(removed).norm()
    if mode == "token-mean":
        assert any(v != v for v in per_update(zeroed, "actor/pg_loss"))  # NaN


@pytest.mark.parametrize("mode", MODES)
def test_update_does_not_depend_on_the_number_of_ranks(runs, mode):
    # the whole batch as one mini-batch: on 2 ranks rank 0 trains 16 kept rows, rank 1 the last 4 kept rows
    # and 12 padding rows; loss and gradient equal those of 1 rank, and of verl's worker on the 20 rows alone
    two, one, removed = (
        runs[f"2/{mode}/whole-ours"],
        runs[f"1/{mode}/whole-ours"],
        runs[f"1/{mode}/whole-removed"],
    )
    scale = float(flat(removed).abs().max())
    for case in (two, one):
        for key in LOSSES:
            assert per_update(case, key) == pytest.approx(per_update(removed, key), rel=1e-5), key
        torch.testing.assert_close(flat(case), flat(removed), rtol=0, atol=1e-5 * scale)
    if mode in ("token-mean", "seq-mean-token-mean"):  # nothing filtered: verl's own update, 1 vs 2 ranks
        a, b = runs[f"2/{mode}/whole-none"], runs[f"1/{mode}/whole-none"]
        for key in LOSSES:
            assert per_update(a, key) == pytest.approx(per_update(b, key), rel=1e-5), key
        torch.testing.assert_close(flat(a), flat(b), rtol=0, atol=1e-5 * float(flat(b).abs().max()))
