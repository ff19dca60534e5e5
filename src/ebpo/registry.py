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
silently replace a built-in.

A *family* is an entry built from a name with an argument, ``<prefix>:<argument>``: ``TASKS.register_family("gym",
make_gym_task, pattern="<dataset>[,<dataset>...]")`` makes ``TASKS.get("gym:chain_sum,gcd")`` call
``make_gym_task("chain_sum,gcd")`` (with any keyword options ``get`` was given), and lists ``gym:<dataset>[,...]``
among the valid choices; the family's factory raises ``ValueError`` for an argument it does not take. An unknown name, here and for every fixed set of option values
(:func:`check_choice`, e.g. EBPO's ``normalize``), raises ``ValueError`` worded
``unknown <kind> 'x'; valid choices: a, b, c`` with the choices sorted; a registry's adds how a name of one's
own is registered (``--plugins``).

Where each registry lives (the public functions around them keep their names): advantage estimators in
``ebpo.advantages.registry``, policy losses in ``ebpo.losses``, rewards in ``ebpo.rewards``, loader schemas in
``ebpo.data.loaders``, prompt samplers in ``ebpo.data.samplers``, task suites in ``ebpo.tasks``, topic backends in ``ebpo.annotate.topic``,
evaluation benchmarks in ``ebpo.eval.benchmarks``, the learning benchmark's methods in
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


PLUGINS_HINT = (
    "a name of your own is registered by its plugin: add --plugins FILE.py|MODULE (docs/extending.md)"
)
"""What an unknown name of a registry a plugin can extend adds: how that name gets registered."""


def unknown_choice(
    kind: str, value: object, choices: Iterable[str], *, extensible: bool = False
) -> ValueError:
    """The one error for an unknown name: ``unknown <kind> 'x'; valid choices: a, b, c`` (choices sorted), and
    for a registry that plugins extend (``extensible``) :data:`PLUGINS_HINT` after it."""
    hint = f"; {PLUGINS_HINT}" if extensible else ""
    return ValueError(f"unknown {kind} {value!r}; valid choices: {', '.join(sorted(choices))}{hint}")


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
        self._families: dict[str, tuple[Callable[..., T], str]] = {}

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

    def register_family(self, prefix: str, factory: Callable[..., T], *, pattern: str) -> Callable[..., T]:
        """Entries named ``<prefix>:<argument>``, each built by ``factory(argument, **options)`` when looked up;
        ``pattern`` describes the argument in the list of valid choices (``<dataset>[,<dataset>...]``).

        Raises ``ValueError`` if ``prefix`` is already a family, or holds a ``:``."""
        if not isinstance(prefix, str) or not prefix or ":" in prefix:
            raise ValueError(
                f"a {self.kind} family prefix must be a non-empty string without ':', got {prefix!r}"
            )
        if prefix in self._families:
            raise ValueError(f"{self.kind} family {prefix!r} is already registered")
        self._families[prefix] = (factory, pattern)
        return factory

    def get(self, name: str, **options: object) -> T:
        """The entry registered as ``name``, or built by its family (``<prefix>:<argument>``, with ``options``);
        an unknown name raises :func:`unknown_choice`'s error. Options are for families: a fixed entry given
        some raises ``ValueError``."""
        family = self.family_of(name)
        if family is not None and name not in self._entries:
            factory, _ = self._families[family]
            return factory(name[len(family) + 1 :], **options)
        if name not in self:
            raise unknown_choice(self.kind, name, self.names(families=True), extensible=True)
        if options:
            raise ValueError(f"{self.kind} {name!r} takes no options, got {', '.join(sorted(options))}")
        return self._entries[name]

    def family_of(self, name: object) -> str | None:
        """The family prefix ``name`` belongs to (``gym`` for ``gym:gcd``), else ``None``."""
        if not isinstance(name, str) or ":" not in name:
            return None
        prefix = name.split(":", 1)[0]
        return prefix if prefix in self._families else None

    def unregister(self, name: str) -> T:
        """Remove and return the entry registered as ``name`` (for tests and plugins that clean up)."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def names(self, *, families: bool = False) -> list[str]:
        """Registered names, sorted; with ``families``, each family's ``<prefix>:<pattern>`` too."""
        patterns = (
            [f"{prefix}:{pattern}" for prefix, (_, pattern) in self._families.items()] if families else []
        )
        return sorted([*self._entries, *patterns])

    def __contains__(self, name: object) -> bool:
        """A registered name, or a name of a registered family (its argument is checked when it is built)."""
        return (isinstance(name, str) and name in self._entries) or self.family_of(name) is not None

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
