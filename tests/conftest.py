"""Shared fixtures: seeded randomness, the shared data directory, a tiny local model, GPU skipping."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("EBPO_SHARED", REPO.parent / "shared"))
BENCHMARK_DIR = SHARED / "data" / "benchmarks"

# Tiny models gain nothing from intra-op threads, and a shared machine loses a lot to them.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def benchmark_dir() -> Path:
    if not BENCHMARK_DIR.is_dir():
        pytest.skip(f"shared benchmark data not found at {BENCHMARK_DIR}")
    return BENCHMARK_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised tiny Llama model + char tokenizer saved with save_pretrained."""
    from ebpo.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
