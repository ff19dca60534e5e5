"""Fixtures for the learning benchmark's tests: the repository root on ``sys.path`` (so that the package
``benchmarks.learning`` imports normally) and a configs directory with known shared sizes."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from learning_helpers import SHARED_YAML  # noqa: E402

from ebpo.trainer.config_files import PRESETS_DIR  # noqa: E402


@pytest.fixture
def configs_dir(tmp_path) -> Path:
    """The shipped presets with ``ebpo.yaml`` replaced by :data:`SHARED_YAML`."""
    target = tmp_path / "configs"
    shutil.copytree(PRESETS_DIR, target)
    (target / "ebpo.yaml").write_text(SHARED_YAML)
    return target
