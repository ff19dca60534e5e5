"""Plugins: a user's own estimators, policy losses, rewards, tasks, samplers, schemas, benchmarks, brought into
every command and engine by importing their code before anything checks a name.

A plugin is Python code that registers things when it is imported (``@ebpo.register_estimator("median")``,
``@register_reward("mine")``, ``register_task(...)``). It comes in one of three ways, all read by
:func:`load_plugins`, the one loader every entry point calls:

- an installed package's entry point in the group :data:`ENTRY_POINT_GROUP` (``ebpo.plugins``): a module,
  imported, or a function taking no arguments, called once::

      [project.entry-points."ebpo.plugins"]
      my_estimators = "my_package.estimators"

- code that is not installed, named by the user: ``--plugins NAME`` on every ``ebpo`` command (repeatable,
  or comma-separated), ``run.plugins`` in ``ebpo train``'s config, ``EBPOConfig.plugins`` (TRL),
  ``--plugins`` of ``python -m ebpo.integrations.verl`` and of the learning benchmark. ``NAME`` is a ``.py``
  file (any name ending in ``.py`` or holding a ``/``; imported as the module named after its file) or an
  importable module (``my_package.estimators``);
- :data:`ENV_VAR` (``EBPO_PLUGINS``), names as above separated by ``os.pathsep``: for processes started by
  someone else's launcher (our verl launcher sets it for every Ray process of a run).

Every plugin is imported once per process, however often it is named: each entry point calls
:func:`load_plugins` where it starts, as it may be entered alone (a command, before its parser is built; a
config file, ``load_config``; a ``TrainConfig`` handed to ``Trainer``; ``EBPOConfig``; a verl process: the
list and the reasons in docs/design.md, "Registries"), and one that passes through several (``ebpo train``:
the command, its config file, the ``Trainer``) imports each plugin once. A plugin that fails to import, or
that registers a name already taken (a built-in's or another plugin's), raises :class:`PluginError`: one
line naming the plugin, the line of its code that failed and the error; the commands print it and run
nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from functools import partial
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from ebpo.errors import ConfigError

__all__ = ["ENTRY_POINT_GROUP", "ENV_VAR", "HELP", "PluginError", "load_plugins", "resolve_names"]

ENTRY_POINT_GROUP = "ebpo.plugins"
ENV_VAR = "EBPO_PLUGINS"
HELP = (
    "import your own code before anything is checked: a .py file or an importable module that registers "
    "estimators, policy losses, rewards, tasks, samplers or schemas (repeatable, or comma-separated); "
    f"installed packages' {ENTRY_POINT_GROUP!r} entry points are always loaded (docs/extending.md)"
)
"""What ``--plugins`` does, in every command's help."""

_PACKAGE_DIR = Path(__file__).resolve().parent
_loaded: set[str] = set()  # the plugins imported in this process, by resolved name or entry point


class PluginError(ConfigError):
    """A plugin that cannot be used: it failed to import, or registers a name that is taken."""


def split_names(names: Iterable[str]) -> list[str]:
    """``names`` with comma-separated items split and blanks dropped (``--plugins a.py,b`` = ``a.py``, ``b``)."""
    return [part.strip() for name in names for part in str(name).split(",") if part.strip()]


def is_file(name: str) -> bool:
    """Whether a plugin name is a file (it ends in ``.py`` or holds a path separator), not a module name."""
    return name.endswith(".py") or "/" in name or os.sep in name


def resolve_names(names: Iterable[str]) -> list[str]:
    """``names`` as :func:`load_plugins` reads them, files made absolute (another directory, another process:
    the same files), each once, in order."""
    resolved = [
        str(Path(name).expanduser().resolve()) if is_file(name) else name for name in split_names(names)
    ]
    return list(dict.fromkeys(resolved))


def load_plugins(names: Iterable[str] = (), *, entry_points: bool = True) -> list[str]:
    """Import every plugin not yet imported in this process: the installed ``ebpo.plugins`` entry points
    (unless ``entry_points`` is false), those named in ``$EBPO_PLUGINS``, then ``names`` (files or module
    names, see the module docstring). Returns ``names`` resolved (:func:`resolve_names`), for a config or a
    child process to name the same plugins; a plugin imported already is skipped (a plugin that failed is
    tried again, and fails with the same line). Raises :class:`PluginError` (one line) for a plugin that
    fails."""
    if entry_points:
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            key = f"entry point {entry.name} = {entry.value}"
            if key not in _loaded:
                label = f"{entry.name} (entry point {entry.value!r} of {_distribution(entry)})"
                _import(key, label, partial(_load_entry_point, entry))
    for name in resolve_names(os.environ.get(ENV_VAR, "").split(os.pathsep)):
        if name not in _loaded:
            _import(name, f"{name} (from ${ENV_VAR})", partial(_import_name, name))
    resolved = resolve_names(names)
    for name in resolved:
        if name not in _loaded:
            _import(name, name, partial(_import_name, name))
    return resolved


def _distribution(entry: Any) -> str:
    dist = getattr(entry, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an installed package"


def _load_entry_point(entry: Any) -> None:
    """An entry point's module imported, or its function called (``importlib.metadata`` or its backport,
    whichever found the distribution)."""
    loaded = entry.load()
    if callable(loaded) and not isinstance(loaded, ModuleType):
        loaded()


def _import_name(name: str) -> None:
    """A plugin given by name: a ``.py`` file or a module."""
    if is_file(name):
        _import_file(Path(name))
    else:
        importlib.import_module(name)


def _import(key: str, label: str, load: Callable[[], None]) -> None:
    """Import one plugin (``load``); mark it loaded; one :class:`PluginError` line for whatever goes wrong."""
    try:
        load()
    except PluginError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of a user's code becomes one line
        raise PluginError(f"plugin {label}: {_describe(err)}") from None
    _loaded.add(key)


def _import_file(path: Path) -> ModuleType:
    """Import the ``.py`` file ``path`` as the module named after it (``my_estimators.py``: ``my_estimators``),
    so that what it defines pickles by that name in any process that loads the same plugin."""
    if not path.is_file():
        raise PluginError(f"plugin {path}: no such file")
    name = path.stem
    if not name.isidentifier():
        raise PluginError(
            f"plugin {path}: {name!r} is not a module name; rename the file (letters, digits, _)"
        )
    taken = sys.modules.get(name)
    if taken is not None:
        where = getattr(taken, "__file__", None)
        if where is not None and Path(where).resolve() == path:
            return taken  # imported already (by the user's own code)
        raise PluginError(
            f"plugin {path}: a module named {name!r} is already imported (from {where or 'built-in'}); rename "
            "the file"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file always has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _describe(err: BaseException) -> str:
    """The error in one line, with the line of the user's code it came from (the innermost frame outside
    ebpo and importlib): ``NameError: name 'x' is not defined (my_estimators.py, line 3)``."""
    from ebpo.registry import AlreadyRegistered

    where = ""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        file = frame.filename
        if file.startswith("<") or Path(file).resolve().is_relative_to(_PACKAGE_DIR):
            continue
        if "importlib" in Path(file).parts:
            continue
        where = f" ({file}, line {frame.lineno})"
        break
    text = " ".join(str(err).split()) or "no message"
    if isinstance(err, AlreadyRegistered):
        return f"{text}; give yours another name{where}"
    return f"{type(err).__name__}: {text}{where}"
