"""What the plugin tests share: the two fixtures a user would write (``tests/fixtures``), the package installed
by entry point into a fresh folder, and a sandbox that takes every registration of a test back afterwards."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from ebpo import plugins
from ebpo.registry import Registry

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MY_ESTIMATORS = FIXTURES / "my_estimators.py"
"""A lone file of estimators (``median_baseline``, ``running_mean_baseline``), named with ``--plugins``."""
PLUGIN_PKG = FIXTURES / "plugin_pkg"
"""A package whose ``ebpo.plugins`` entry point registers ``trimmed_mean_baseline`` and ``answer_anywhere``."""
PKG_ESTIMATOR = "trimmed_mean_baseline"
FILE_ESTIMATOR, STATEFUL_ESTIMATOR = "median_baseline", "running_mean_baseline"


def install_plugin_pkg(target: Path, python: str | Path = sys.executable, env: dict | None = None) -> Path:
    """``pip install --no-deps --target target`` of the fixture package (built from a copy, so that the
    checkout gets no build folders): a fresh folder that holds it, entry point and all, and nothing else.
    With another ``python`` (a fresh virtual environment's), into that environment itself."""
    source = target.parent / f"{target.name}-source"
    shutil.copytree(PLUGIN_PKG, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    where = ["--target", str(target)] if str(python) == sys.executable else []
    pip = [
        str(python),
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        *where,
        str(source),
    ]
    subprocess.run(pip, check=True, capture_output=True, env=env)
    return target


def _registries() -> list[Registry]:
    """Every registry of ebpo (and the learning benchmark's) imported so far."""
    found: dict[int, Registry] = {}
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(("ebpo", "benchmarks")):
            found.update((id(v), v) for v in list(vars(module).values()) if isinstance(v, Registry))
    return list(found.values())


@contextlib.contextmanager
def sandbox(*dirs: Path) -> Iterator[None]:
    """Whatever plugins a block loads are gone afterwards: their registrations, their modules (those imported
    from ``tests/fixtures`` or ``dirs``) and the loader's memory of them (the registries are global to the
    process, and test files share processes)."""
    names = {id(r): set(r.names()) for r in _registries()}
    modules, loaded, path = set(sys.modules), set(plugins._loaded), list(sys.path)
    homes = [FIXTURES, *(Path(d).resolve() for d in dirs)]
    try:
        yield
    finally:
        gone = set()
        for name in set(sys.modules) - modules:
            file = getattr(sys.modules[name], "__file__", None)
            if file is not None and any(Path(file).resolve().is_relative_to(home) for home in homes):
                gone.add(name)
                del sys.modules[name]
        for registry in _registries():
            if id(registry) in names:  # known before: whatever came since goes
                new = set(registry.names()) - names[id(registry)]
            else:  # imported during the block (its built-ins with it): what the plugins' modules registered
                new = {n for n in registry.names() if getattr(registry.get(n), "__module__", None) in gone}
            for name in new:
                registry.unregister(name)
        plugins._loaded.intersection_update(loaded)
        sys.path[:] = path
