"""Fixtures for every test: one torch thread, seeded randomness, our benchmark files, a tiny local model, GPU
skipping. Helpers that several test modules share live in ``tests/helpers/``.

The tests mirror the package: ``tests/<package>/test_<module>.py`` for a module of ``src/ebpo/<package>/``,
``tests/test_<module>.py`` for a top-level module; the project-wide checks (README, docs paths, the import graph,
the wheel, input paths across commands, a refused write across persist and the trainer, docs/theory.md) sit at the
top level too; ``tests/test_benchmarks.py`` and ``tests/bench_learning/`` hold ``benchmarks/`` to account."""

from __future__ import annotations

import os
import random
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# Our JSON Lines copies of the five evaluation sets, the project's test data, lie in the folder beside the
# clone that CI provides (or under $EBPO_SHARED); a clone without it skips the tests that read them.
SHARED = Path(os.environ.get("EBPO_SHARED", REPO.parent / "shared"))
BENCHMARK_DIR = SHARED / "data" / "benchmarks"

# The suite runs as in an activated environment (README: `source .venv/bin/activate`): the PATH finds this
# environment's `ebpo` first, so the commands a message prints read `ebpo ...` (settings.command_prefix;
# its other forms have a test of their own), and a test's child processes find the same commands.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

# Tiny models gain nothing from intra-op threads, and a shared machine loses a lot to them.
torch.set_num_threads(1)


def _installed(distribution: str) -> bool:
    # by its distribution: a folder of tests on sys.path could pass for the package (importlib.util.find_spec)
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


# verl and TRL 1.x need separate environments (docs/integrations.md): `make test-main` runs the suite in .venv,
# where verl is not installed, and `make test-verl` runs integrations/verl in .venv-verl. Without verl that
# folder is not collected (its conftest imports the adapter), and the run's header says so.
VERL_MISSING = not _installed("verl")
collect_ignore = ["integrations/verl"] if VERL_MISSING else []


def pytest_report_header() -> str | None:
    if VERL_MISSING:
        return "tests/integrations/verl: not collected, verl is not installed here (make test-verl runs it)"
    return None


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Every test starts on one intra-op thread and gets the count back afterwards, whatever it (or a trainer's
    ``run.threads``) set meanwhile."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _console():
    """Every test sees the library's messages as the commands' console shows them (``ebpo.console.setup``, as
    ``ebpo`` and the other entry points do first), whether it runs a command or calls the library directly; the
    ``ebpo`` logger is left as Python has it afterwards (a test of the embedded default calls
    ``ebpo.console.teardown`` first)."""
    from ebpo import console

    console.setup()
    yield
    console.teardown()


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def benchmark_dir() -> Path:
    if not BENCHMARK_DIR.is_dir():
        pytest.skip(
            f"our benchmark JSON Lines files are not at {BENCHMARK_DIR} (a clone without ../shared; set "
            f"EBPO_SHARED to the folder holding data/benchmarks to run this test)"
        )
    return BENCHMARK_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised tiny Llama model + char tokenizer saved with save_pretrained."""
    from ebpo.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised tiny Qwen3 model + byte-level BPE tokenizer with a ChatML template and two EOS
    ids (``helpers.chat_model``), saved with save_pretrained."""
    from helpers.chat_model import build_test_chat_model

    return build_test_chat_model(tmp_path_factory.mktemp("chat-model"))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # in several processes (`make test-main`, one file per process at a time, in this order): the files
        # with a slow test first, so that no process ends the run alone on one of them
        slow_files = {item.path for item in items if "slow" in item.keywords}
        items.sort(key=lambda item: item.path not in slow_files)
    if not torch.cuda.is_available():
        skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def plugin_pkg_dir(tmp_path_factory) -> Path:
    """The fixture plugin package (``tests/fixtures/plugin_pkg``) installed by pip into a fresh folder: put it on
    ``sys.path`` (or ``PYTHONPATH``) and its ``ebpo.plugins`` entry point is found."""
    from helpers.plugins import install_plugin_pkg

    return install_plugin_pkg(tmp_path_factory.mktemp("plugin-pkg") / "site")


@pytest.fixture
def plugin_sandbox(tmp_path_factory):
    """Every plugin a test loads (and what it registers) is gone when the test ends."""
    from helpers.plugins import sandbox

    with sandbox(tmp_path_factory.getbasetemp()):
        yield
