"""EBPOTrainer over 2 processes (``torchrun --nproc_per_node 2``, gloo on CPU), as TRL users launch it.

One 2-process run of 3 generation blocks with every structure that spreads a block over processes and steps
(``tests/integrations/trl/trl_multiprocess_worker.py``: ``steps_per_generation=6``, ``num_iterations=2``, 2 gradient-accumulation
micro-steps, 1 completion per process and micro-step so that a group of G = 4 straddles the processes, the
topic stream, ``prior_scope="cluster"``), a 2-process resume from a mid-block checkpoint, and the same run in
1 process. Rewards depend only on the prompt and the completion's place in its group, so every run scores
the same rows alike and the estimator states must agree exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

import trl_multiprocess_worker as worker  # noqa: E402  (this folder is on sys.path under pytest)

from ebpo.integrations.trl import ESTIMATOR_STATE_FILE  # noqa: E402

pytestmark = pytest.mark.slow  # two 2-process TRL runs and a 1-process one

WORKER = Path(worker.__file__)
# global_step when each of the 3 blocks is generated: a block serves 6 optimizer steps
BLOCK_STEPS = [0, 6, 12]
ROWS_PER_BLOCK = 3 * worker.G  # 3 prompts x G completions
MID_BLOCK = 9  # optimizer step 9 lies inside the second block (steps 7-12)
# a checkpoint of the resumed run: a block start of the uninterrupted run, not of the resumed one
AFTER_RESUME = 12
SAVE_STEPS = 3  # checkpoints at 3, 6, 9, ... (a resumed run keeps the checkpoint's save_steps)


CLUES = ("Error", "error:", "Exception", "terminate", "Fatal", "Traceback", 'File "', "exitcode")


def torchrun(*args: str, cwd: Path) -> None:
    """Run the worker in 2 processes; fail with the end of its output when it fails."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONFAULTHANDLER"] = "1"  # a rank that dies of a signal prints its Python stack
    done = subprocess.run(
        [*command, str(WORKER), *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        # the ranks' own last words first: torchrun's summary that follows them is long and says little
        clues = [line for line in done.stdout.splitlines() if any(word in line for word in CLUES)]
        pytest.fail(
            f"torchrun failed ({done.returncode}); lines that name a failure:\n" + "\n".join(clues[-40:])
            + f"\n--- end of the output:\n{done.stdout[-4000:]}"
        )  # fmt: skip


def recorded(folder: Path) -> list[dict]:
    return [torch.load(folder / f"states-rank{rank}.pt", weights_only=False) for rank in (0, 1)]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """The uninterrupted 2-process run (checkpoints every 3 steps), the 2-process resume from step 9 (into
    another directory), and the 1-process run."""
    root = tmp_path_factory.mktemp("trl-2proc")
    model = str(tiny_model_dir)
    torchrun(
        "--model", model, "--out", str(root / "run"), "--record", str(root / "whole"), "--save_steps",
        str(SAVE_STEPS), cwd=root,
    )  # fmt: skip
    checkpoint = root / "run" / f"checkpoint-{MID_BLOCK}"
    torchrun(
        "--model", model, "--out", str(root / "resumed-run"), "--record", str(root / "resumed"), "--resume",
        str(checkpoint), "--save_steps", str(SAVE_STEPS), cwd=root,
    )  # fmt: skip
    single = worker.run(model, root / "single", processes=1)
    return {
        "whole": recorded(root / "whole"),
        "resumed": recorded(root / "resumed"),
        "single": single,
        "checkpoint": torch.load(checkpoint / ESTIMATOR_STATE_FILE, weights_only=False),
        "resumed_checkpoint": torch.load(
            root / "resumed-run" / f"checkpoint-{AFTER_RESUME}" / ESTIMATOR_STATE_FILE, weights_only=False
        ),
    }


def test_both_processes_hold_the_same_prior_after_every_block(runs):
    rank0, rank1 = runs["whole"]
    dataset = worker.make_dataset()
    topics = dict(zip(dataset["prompt"], dataset["topic"]))
    assert [b["global_step"] for b in rank0["blocks"]] == BLOCK_STEPS
    assert [b["global_step"] for b in rank1["blocks"]] == BLOCK_STEPS
    for k, (mine, theirs) in enumerate(zip(rank0["blocks"], rank1["blocks"])):
        assert mine["state"] == theirs["state"], f"block {k}: the ranks' estimators differ"
        # each block's prior holds every process's rewards: 12 more per block, not one process's 6
        assert mine["state"]["prior"]["W_glob"]["count"] == ROWS_PER_BLOCK * (k + 1)
        # the group that straddles the processes: one prompt is on both ranks
        assert len(set(mine["prompts"]) & set(theirs["prompts"])) == 1
        # topic-coherent blocks
        assert len({topics[p] for p in mine["prompts"] + theirs["prompts"]}) == 1
    assert rank0["final"] == rank1["final"] == rank0["blocks"][-1]["state"]


def test_two_processes_equal_one_process_on_the_same_rewards(runs):
    single = runs["single"]
    rank0 = runs["whole"][0]
    assert [b["global_step"] for b in single.blocks] == BLOCK_STEPS
    for k, (two, one) in enumerate(zip(rank0["blocks"], single.blocks)):
        assert two["state"] == one["state"], f"block {k}: 2 processes and 1 process disagree"
    assert rank0["final"] == single.estimator.state_dict()
    assert {name for name, _ in rank0["final"]["cluster_priors"]} == set(worker.TOPICS)


def test_resume_from_a_mid_block_checkpoint_ends_in_the_uninterrupted_state(runs):
    whole = runs["whole"][0]["blocks"]
    # the checkpoint in the middle of block 2 holds the prior as of that block's start (block 1 only) ...
    assert runs["checkpoint"]["estimator"] == whole[0]["state"]
    for rank0_or_1 in runs["resumed"]:
        blocks = rank0_or_1["blocks"]
        # ... TRL regenerates block 2 when it resumes at step 9 and then generates every 6 steps: block 3 at
        # step 15 (where an uninterrupted run generates it at 12). Each block is counted once.
        assert [b["global_step"] for b in blocks] == [MID_BLOCK, MID_BLOCK + 6]
        assert [b["state"] for b in blocks] == [whole[1]["state"], whole[2]["state"]]
        assert rank0_or_1["final"] == runs["whole"][0]["final"]
    # step 12 of the resumed run lies inside its block (steps 10-15), but a run resumed from there would
    # start with block 3 (the dataloader's block at step 12), so the checkpoint holds blocks 1 and 2
    assert runs["resumed_checkpoint"]["estimator"] == whole[1]["state"]
