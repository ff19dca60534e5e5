"""One small generic registry, behind every "name -> thing" table of ebpo, with one error wording.

::

    ESTIMATORS: Registry[type[AdvantageEstimator]] = Registry("advantage estimator")

    @ESTIMATORS.register("grpo")                  # as a decorator (returns the class unchanged)
    class GRPOEstimator(AdvantageEstimator): ...

    SAMPLERS.register("random", RandomSampler)    # or as a call (returns the entry)

    ESTIMATORS.get("gpro")   # ValueError: unknown advantage estimator 'gpro'; valid choices: dr_grpo, ...
    ESTIMATORS.names()       # sorted
    "grpo" in ESTIMATORS     # True

Registering a name twice raises :class:`AlreadyRegistered`, a ``ValueError`` naming the module that holds the
name (``advantage estimator 'grpo' is already registered (by ebpo.advantages.baselines)``): a plugin cannot
silently replace a built-in. An unknown name, here and for every fixed set of option values
(:func:`check_choice`, e.g. EBPO's ``normalize``), raises ``ValueError`` worded
``unknown <kind> 'x'; valid choices: a, b, c`` with the choices sorted.

Where each registry lives (the public functions around them keep their names): advantage estimators in
``ebpo.advantages.registry``, policy losses in ``ebpo.losses``, rewards in ``ebpo.rewards``, loader schemas in
``ebpo.data.loaders``, prompt samplers in ``ebpo.data.samplers``, task suites in ``ebpo.tasks``, topic backends in ``ebpo.annotate.topic``,
evaluation benchmarks in ``ebpo.eval.harness``, the learning benchmark's methods in
``benchmarks/learning/methods.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar, overload

__all__ = ["AlreadyRegistered", "Registry", "check_choice", "unknown_choice"]

T = TypeVar("T")


class _Missing:
    """Marks ``register(name)`` called without an entry (the decorator form); ``None`` is a valid entry."""


_MISSING = _Missing()


class AlreadyRegistered(ValueError):
    """A name registered twice; ``kind`` and ``name`` say which (a plugin's loader names the plugin)."""

    def __init__(self, kind: str, name: str, holder: str | None) -> None:
        by = f" (by {holder})" if holder else ""
        super().__init__(f"{kind} {name!r} is already registered{by}")
        self.kind, self.name = kind, name


def unknown_choice(kind: str, value: object, choices: Iterable[str]) -> ValueError:
    """The one error for an unknown name: ``unknown <kind> 'x'; valid choices: a, b, c`` (choices sorted)."""
    return ValueError(f"unknown {kind} {value!r}; valid choices: {', '.join(sorted(choices))}")


def check_choice(kind: str, value: object, choices: Iterable[str]) -> None:
    """Raise :func:`unknown_choice`'s ``ValueError`` unless ``value`` is one of ``choices``."""
    names = list(choices)
    if not (isinstance(value, str) and value in names):
        raise unknown_choice(kind, value, names)


class Registry(Generic[T]):
    """Entries of one kind by name: register once, look up by name, list the names sorted.

    ``kind`` names what is registered, in the singular, as users read it in an error
    (``"policy loss"``, ``"reward"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T) -> T: ...

    def register(self, name: str, entry: T | _Missing = _MISSING) -> T | Callable[[T], T]:
        """Add ``entry`` under ``name`` and return it; without ``entry``, a decorator that does so.

        Raises :class:`AlreadyRegistered` if ``name`` is already registered, ``ValueError`` if it is not a
        non-empty string.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")

        def add(item: T) -> T:
            if name in self._entries:
                holder = getattr(self._entries[name], "__module__", None)  # classes and functions have one
                raise AlreadyRegistered(self.kind, name, holder if isinstance(holder, str) else None)
            self._entries[name] = item
            return item

        if isinstance(entry, _Missing):
            return add
        return add(entry)

    def get(self, name: str) -> T:
        """The entry registered as ``name``; an unknown name raises :func:`unknown_choice`'s error."""
        if name not in self:
            raise unknown_choice(self.kind, name, self._entries)
        return self._entries[name]

    def unregister(self, name: str) -> T:
        """Remove and return the entry registered as ``name`` (for tests and plugins that clean up)."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
