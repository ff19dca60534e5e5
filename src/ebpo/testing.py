"""``check_estimator``: the contract every advantage estimator of ebpo keeps, as one call an author runs on theirs.

::

    from ebpo.testing import check_estimator

    check_estimator(MedianBaseline)                 # a class (built with the options given)
    check_estimator("median_baseline", q=0.25)      # or a registered name
    report = check_estimator(MyEstimator, raise_on_failure=False)   # look at the report instead

The suite holds every built-in estimator to these properties through this function (``tests/advantages``), so
an estimator that passes keeps the contract the trainer, ``ebpo diagnose`` and the verl and TRL adapters
rely on (docs/design.md, "Advantage estimators"; docs/extending.md):

- ``output``: on an ordinary batch, a float32 tensor of shape (N,) on the rewards' device, finite, and
  ``metrics()`` a mapping of names to finite numbers;
- ``degenerate_batches``: all pass, all fail, a single sample, groups of one, uneven groups, shaped rewards
  (+1/-1 and real-valued), one value everywhere, the largest rewards allowed (1e30) and the empty batch give
  finite advantages, metrics and state (the empty batch: an empty float32 tensor, the state untouched);
- ``no_signal_is_zero``: a fresh estimator's first batch, every reward equal, gets advantage 0 everywhere (an
  estimator with a fixed baseline breaks this by design: pass ``skip=("no_signal_is_zero",)``);
- ``group_ids``: the same samples in another order, with group ids of any kind (ints, strings, tuples, a numpy
  object array, a tensor), get the same advantages (groups need not be contiguous; verl's ids are strings);
- ``non_finite_refused``: a NaN, an infinity or a reward beyond 1e30 is refused, by ``__call__`` and by
  ``observe``, with a ``ValueError`` naming its position, and leaves the state as it was;
- ``bad_input_refused``: lengths that differ, 2-D rewards, an unhashable group id: ``ValueError`` /
  ``TypeError``, the state as it was;
- ``raising_batch_keeps_state``: a batch that raises after the estimator has worked on it (an error injected
  into its ``_advantages``) leaves the state as it was, and the next batch gets what it would have got;
- ``state_dict_round_trip``: after a stream of batches, the state survives ``torch.save`` and
  ``torch.load(weights_only=True)`` (plain numbers, strings, lists, dicts and tensors) into a fresh estimator,
  whose ``state_dict()`` is then the same, every number finite;
- ``resume``: over a stream of batches (with an ``observe`` call, as DAPO's dropped groups), an estimator
  restored halfway gives exactly the advantages and metrics of one that never stopped;
- ``dtype_device``: rewards as float32, float64 or bfloat16 tensors, a list or a numpy array give the same
  advantages, float32 on the rewards' device, on each device checked (the CPU, and CUDA when available).

Each failure names its property and the batch that broke it; :func:`check_estimator` raises
:class:`EstimatorCheckFailed` (an ``AssertionError``, so a test shows the report) listing every one, or returns
the :class:`CheckReport` with ``raise_on_failure=False``.
"""

from __future__ import annotations

import copy
import io
import math
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ebpo.advantages import get_estimator

__all__ = ["PROPERTIES", "CheckReport", "EstimatorCheckFailed", "Failure", "check_estimator"]


@dataclass(frozen=True)
class Case:
    """One batch a property is checked on: its name, rewards, group ids and cluster keys (constant per group)."""

    label: str
    rewards: list[float]
    index: list[Any]
    cluster: list[Any]

    def __str__(self) -> str:
        return f"{self.label!r} (rewards {_short(self.rewards)}, groups {_short(self.index)})"


def _short(values: Sequence[Any], limit: int = 12) -> str:
    shown = ", ".join(f"{v:g}" if isinstance(v, float) else repr(v) for v in list(values)[:limit])
    return (
        f"[{shown}{', ...' if len(values) > limit else ''}] ({len(values)} values)"
        if len(values) > limit
        else f"[{shown}]"
    )


def _values(out: torch.Tensor) -> str:
    """Advantages for a message: rounded, the first dozen."""
    return _short([float(f"{v:.6g}") for v in out.detach().cpu().double().tolist()])


def _case(label: str, groups: Sequence[Sequence[float]], *, shuffle: int | None = None) -> Case:
    """A batch of ``groups`` (each a list of rewards): group g has id g and cluster ``"c{g % 2}"``; with
    ``shuffle`` (a seed) the samples come in a random order."""
    rows = [(float(r), g, f"c{g % 2}") for g, rewards in enumerate(groups) for r in rewards]
    if shuffle is not None:
        random.Random(shuffle).shuffle(rows)
    return Case(label, [r for r, _, _ in rows], [g for _, g, _ in rows], [c for _, _, c in rows])


ORDINARY = _case("three groups of four", [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]])
DEGENERATE = (
    _case("all pass", [[1, 1, 1, 1], [1, 1, 1, 1]]),
    _case("all fail", [[0, 0, 0, 0], [0, 0, 0, 0]]),
    _case("one sample", [[1]]),
    _case("groups of one", [[0.3], [0.9], [0.5]]),
    _case("uneven groups", [[1], [0, 1], [0, 0, 1, 1, 0], [1, 1, 1]], shuffle=0),
    _case("shaped +1/-1", [[1, -1, -1, -1], [-1, -1, -1, -1], [1, 1, -1, 1]]),
    _case("shaped real-valued", [[0.25, -1.5, 3.0], [0.1, 0.1], [-2.0, 0.75, 0.5, 1.25]], shuffle=1),
    _case("one value everywhere", [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]),
    _case("largest rewards allowed", [[1e30, -1e30], [0.0, 1e30], [-1e30, -1e30]]),
)
EMPTY = Case("empty", [], [], [])


@dataclass(frozen=True)
class Failure:
    """A property that does not hold: its name, the batch that broke it and what went wrong."""

    property: str
    batch: str
    message: str

    def __str__(self) -> str:
        on = f" on batch {self.batch}" if self.batch else ""
        return f"FAILED {self.property}{on}: {self.message}"


@dataclass
class CheckReport:
    """What :func:`check_estimator` found: the properties that hold, those that fail, those skipped (why)."""

    estimator: str
    passed: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failed(self) -> list[str]:
        """The names of the failing properties, in the order they were checked."""
        return list(dict.fromkeys(f.property for f in self.failures))

    def __str__(self) -> str:
        head = (
            f"check_estimator({self.estimator}): {len(self.passed)} properties hold, {len(self.failed)} fail"
            + (f", {len(self.skipped)} skipped" if self.skipped else "")
        )
        lines = [head, *map(str, self.failures)]
        lines += [f"SKIPPED {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


class EstimatorCheckFailed(AssertionError):
    """Raised by :func:`check_estimator` when a property fails; ``report`` holds every finding."""

    def __init__(self, report: CheckReport) -> None:
        super().__init__(str(report))
        self.report = report


class _Broken(Exception):
    """A property's check found a fault (``case``: the batch, ``message``: what)."""

    def __init__(self, case: Case | str | None, message: str) -> None:
        super().__init__(message)
        self.case = "" if case is None else str(case)


class _NotApplicable(Exception):
    """A property that cannot be checked on this estimator (the report says why)."""


class _Injected(RuntimeError):
    """The error :func:`raising_batch_keeps_state` makes an estimator's batch raise."""


# -------------------------------------------------------------------------------------------------------------
# helpers the properties share


def _call(est: Any, case: Case, rewards: Any = None, index: Any = None) -> torch.Tensor:
    """``est`` on ``case`` (its rewards as a float64 tensor unless ``rewards`` is given); an error on this
    valid batch is the finding (:class:`_Broken` naming it)."""
    if rewards is None:
        rewards = torch.tensor(case.rewards, dtype=torch.float64)
    try:
        return est(rewards, case.index if index is None else index, cluster=case.cluster)
    except _Injected:
        raise
    except Exception as err:  # noqa: BLE001 - any error on a valid batch breaks the property
        raise _Broken(case, f"raised {type(err).__name__}: {' '.join(str(err).split())}") from None


def _check_output(out: Any, case: Case, device: torch.device | str = "cpu") -> None:
    """``out``: a finite float32 tensor of shape (N,) on ``device``; else :class:`_Broken`."""
    if not isinstance(out, torch.Tensor):
        raise _Broken(case, f"returned {type(out).__name__}, not a torch.Tensor")
    if out.shape != (len(case.rewards),):
        raise _Broken(case, f"returned shape {tuple(out.shape)}, not ({len(case.rewards)},): one per sample")
    if out.dtype != torch.float32:
        raise _Broken(case, f"returned dtype {out.dtype}, not torch.float32")
    if out.device != torch.device(device):
        raise _Broken(case, f"returned a tensor on {out.device}, not on the rewards' device {device}")
    bad = (~torch.isfinite(out)).nonzero().flatten().tolist()
    if bad:
        raise _Broken(case, f"advantage of sample {bad[0]} is {out[bad[0]].item()}, not a finite number")


def _check_metrics(est: Any, case: Case) -> None:
    metrics = est.metrics()
    if not isinstance(metrics, dict):
        raise _Broken(case, f"metrics() returned {type(metrics).__name__}, not a dict of name -> number")
    for name, value in metrics.items():
        if not isinstance(name, str) or not _is_finite_number(value):
            raise _Broken(case, f"metrics()[{name!r}] is {value!r}, not a finite number")


def _is_finite_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _leaves(tree: Any, path: str = "state") -> Iterator[tuple[str, Any]]:
    """(path, value) of every leaf of a nested state (dicts, lists, tuples)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, f"{path}[{key!r}]")
    elif isinstance(tree, list | tuple):
        for i, value in enumerate(tree):
            yield from _leaves(value, f"{path}[{i}]")
    else:
        yield path, tree


def _check_state_finite(est: Any, case: Case | str) -> None:
    for path, value in _leaves(est.state_dict()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            if not bool(torch.isfinite(value).all()):
                raise _Broken(case, f"{path} holds a value that is not finite")
        elif isinstance(value, float) and not math.isfinite(value):
            raise _Broken(case, f"{path} is {value}, not finite")


def _same(a: Any, b: Any) -> bool:
    """Deep equality of two states (tensors and arrays compared element by element)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a.cpu(), b.cpu()))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _snapshot(est: Any) -> Any:
    return copy.deepcopy(est.state_dict())


def _keeps_state(est: Any, before: Any, case: Case | str, what: str) -> None:
    if not _same(est.state_dict(), before):
        raise _Broken(case, f"{what} changed the state; a batch that raises must leave it as it was")


def _stream(seed: int = 0, steps: int = 6) -> list[tuple[str, Case]]:
    """Batches of a training run: groups of 1..6 samples, binary or real-valued, shuffled; step 2 is an
    ``observe`` call (DAPO's dropped groups), the others ``__call__``."""
    rng = random.Random(seed)
    out = []
    for step in range(steps):
        binary = step % 2 == 0
        groups = [
            [
                float(rng.random() < 0.5) if binary else round(rng.gauss(0.5, 1.0), 6)
                for _ in range(rng.randint(1, 6))
            ]
            for _ in range(rng.randint(2, 5))
        ]
        case = _case(f"stream step {step}", groups, shuffle=seed * 100 + step)
        out.append(("observe" if step == 2 else "call", case))
    return out


def _apply(est: Any, kind: str, case: Case) -> torch.Tensor | None:
    if kind == "observe":
        est.observe(torch.tensor(case.rewards, dtype=torch.float64), case.index, cluster=case.cluster)
        return None
    return _call(est, case)


# -------------------------------------------------------------------------------------------------------------
# the properties


def output(make: Callable[[], Any], devices: Sequence[str]) -> None:
    est = make()
    out = _call(est, ORDINARY)
    _check_output(out, ORDINARY)
    _check_metrics(est, ORDINARY)


def degenerate_batches(make: Callable[[], Any], devices: Sequence[str]) -> None:
    est = make()
    for case in DEGENERATE:
        out = _call(est, case)
        _check_output(out, case)
        _check_metrics(est, case)
        _check_state_finite(est, case)
    before = _snapshot(est)
    out = _call(est, EMPTY)
    _check_output(out, EMPTY)
    if not _same(est.state_dict(), before):
        raise _Broken(EMPTY, "changed the state; an empty batch must leave it alone")


def no_signal_is_zero(make: Callable[[], Any], devices: Sequence[str]) -> None:
    case = _case("one value everywhere, first batch", [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    out = _call(make(), case)
    if not bool((out == 0).all()):
        raise _Broken(
            case, f"advantages {_values(out)}, not 0: every reward is the same, so nothing is better"
        )


def group_ids(make: Callable[[], Any], devices: Sequence[str]) -> None:
    base = _case("uneven groups, contiguous", [[1, 0, 0], [0.5, 0.25], [1], [0, 1, 1, 1, 0.75]])
    expected = _call(make(), base)
    order = list(range(len(base.rewards)))
    random.Random(7).shuffle(order)
    names: dict[str, Callable[[int], Any]] = {
        "ints": lambda g: 1000 - 7 * g,
        "strings": lambda g: f"uid-{g}",
        "tuples": lambda g: (g, "t"),
        "mixed objects": lambda g: f"o{g}" if g % 2 else g,
    }
    for kind, make_id in names.items():
        ids = [make_id(base.index[i]) for i in order]
        index: Any = ids
        if kind == "mixed objects":
            index = np.empty(len(ids), dtype=object)
            index[:] = ids
        case = Case(
            f"the same samples shuffled, group ids as {kind}",
            [base.rewards[i] for i in order],
            ids,
            [base.cluster[i] for i in order],
        )
        out = _call(make(), case, index=index)
        _check_output(out, case)
        if not torch.allclose(out.double(), expected[order].double(), rtol=1e-5, atol=1e-6):
            raise _Broken(case, f"advantages {_values(out)}, not {_values(expected[order])} as in {base}")
    tensor_ids = Case("group ids as a tensor", base.rewards, base.index, base.cluster)
    out = _call(make(), tensor_ids, index=torch.tensor(base.index))
    if not torch.allclose(out.double(), expected.double(), rtol=1e-5, atol=1e-6):
        raise _Broken(tensor_ids, f"advantages {_values(out)}, not {_values(expected)}")


def non_finite_refused(make: Callable[[], Any], devices: Sequence[str]) -> None:
    est = make()
    _call(est, ORDINARY)  # some history first
    bad_batches: list[tuple[Any, int]] = [
        (torch.tensor([0.0, 1.0, 0.0, math.nan, math.inf], dtype=torch.float64), 3),
        ([0.0, 1.0, 1.0, 0.0, -math.inf], 4),
        (np.array([1.0, 0.0, 1e39, 0.0, 1.0]), 2),
        (torch.tensor([1e300, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64), 0),
    ]
    index, cluster = [0, 0, 1, 1, 1], ["a", "a", "b", "b", "b"]
    for rewards, position in bad_batches:
        values = rewards.tolist() if hasattr(rewards, "tolist") else list(rewards)
        case = Case(f"reward {values[position]:g} at position {position}", values, index, cluster)
        for method in ("__call__", "observe"):
            before = _snapshot(est)
            try:
                getattr(est, method)(rewards, index, cluster=cluster)
            except ValueError as err:
                if not re.search(rf"\b{position}\b", str(err)):
                    raise _Broken(
                        case,
                        f"{method} raised ValueError {str(err)!r}, which does not name position {position}",
                    ) from None
            except Exception as err:  # noqa: BLE001
                raise _Broken(
                    case, f"{method} raised {type(err).__name__}: {err}; expected ValueError"
                ) from None
            else:
                raise _Broken(
                    case, f"{method} accepted it; a reward that is not finite (or |r| > 1e30) must be refused"
                )
            _keeps_state(est, before, case, f"the refused {method}")


def bad_input_refused(make: Callable[[], Any], devices: Sequence[str]) -> None:
    est = make()
    _call(est, ORDINARY)
    cases: list[tuple[str, Any, Any, Any, type[Exception]]] = [
        ("index shorter than rewards", [0.0, 1.0, 1.0], [0, 1], None, ValueError),
        ("cluster shorter than rewards", [0.0, 1.0, 1.0], [0, 0, 1], ["a"], ValueError),
        ("2-D rewards", torch.zeros(2, 2, dtype=torch.float64), [0, 1], None, ValueError),
        ("an unhashable group id", [0.0, 1.0], [0, [1]], None, TypeError),
    ]
    for label, rewards, index, cluster, expected in cases:
        case = Case(
            label, rewards.tolist() if isinstance(rewards, torch.Tensor) else rewards, index, cluster or []
        )
        before = _snapshot(est)
        try:
            est(rewards, index, cluster=cluster)
        except expected:
            pass
        except Exception as err:  # noqa: BLE001
            raise _Broken(case, f"raised {type(err).__name__}: {err}; expected {expected.__name__}") from None
        else:
            raise _Broken(case, f"accepted it; expected {expected.__name__}")
        _keeps_state(est, before, case, "the refused batch")


def raising_batch_keeps_state(make: Callable[[], Any], devices: Sequence[str]) -> None:
    est, twin = make(), make()
    if not callable(getattr(est, "_advantages", None)):
        raise _NotApplicable("it does not compute through _advantages, where the error would be injected")
    failing = _case("mixed groups", [[1, 0, 1], [0, 0], [0.5, 1, 0, 1]], shuffle=3)
    after = _case("the next batch", [[0, 1], [1, 1, 0], [0, 0, 0, 1]], shuffle=4)
    for est_ in (est, twin):
        _call(est_, ORDINARY)
    before = _snapshot(est)
    original = est._advantages
    reached = []

    def fail_after_working(batch: Any) -> Any:
        original(batch)
        reached.append(True)
        raise _Injected("an error injected after _advantages ran")

    est._advantages = fail_after_working
    try:
        _call(est, failing)
    except _Injected:
        pass
    finally:
        del est._advantages
    if not reached:
        raise _NotApplicable(
            "its __call__ does not go through _advantages, where the error would be injected"
        )
    _keeps_state(est, before, failing, "a batch that raised")
    got, expected = _call(est, after), _call(twin, after)
    if not torch.equal(got, expected):
        raise _Broken(after, f"after a batch that raised, advantages {_values(got)}, not {_values(expected)}")


def state_dict_round_trip(make: Callable[[], Any], devices: Sequence[str]) -> None:
    est = make()
    stream = _stream(seed=1)
    for kind, case in stream[:4]:
        _apply(est, kind, case)
    _check_state_finite(est, "after 4 batches of a stream")
    buffer = io.BytesIO()
    try:
        torch.save(est.state_dict(), buffer)
        buffer.seek(0)
        state = torch.load(buffer, weights_only=True)
    except Exception as err:  # noqa: BLE001
        lines = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).splitlines() or [""]
        reason = next((line.strip() for line in lines if "Unsupported global" in line), lines[0].strip())
        raise _Broken(
            None,
            f"state_dict() does not survive torch.save / torch.load(weights_only=True) ({type(err).__name__}: "
            f"{reason[:200]}); keep plain numbers, strings, lists, dicts and tensors",
        ) from None
    fresh = make()
    fresh.load_state_dict(state)
    if not _same(fresh.state_dict(), est.state_dict()):
        raise _Broken(
            None, "state_dict() after load_state_dict(est.state_dict()) differs from the one loaded"
        )


def resume(make: Callable[[], Any], devices: Sequence[str]) -> None:
    stream = _stream(seed=2)
    straight, stopped = make(), make()
    for kind, case in stream[:3]:
        _apply(straight, kind, case)
        _apply(stopped, kind, case)
    resumed = make()
    resumed.load_state_dict(copy.deepcopy(stopped.state_dict()))
    for kind, case in stream[3:]:
        if kind == "observe":
            _apply(resumed, kind, case)
            _apply(straight, kind, case)
            continue
        got, expected = _call(resumed, case), _call(straight, case)
        if not torch.equal(got, expected):
            raise _Broken(
                case, f"restored halfway: advantages {_values(got)}, not {_values(expected)} (never stopped)"
            )
        if not _same(resumed.metrics(), straight.metrics()):
            raise _Broken(case, f"restored halfway: metrics {resumed.metrics()}, not {straight.metrics()}")


def dtype_device(make: Callable[[], Any], devices: Sequence[str]) -> None:
    case = ORDINARY
    expected = _call(make(), case)
    for device in devices:
        variants: list[tuple[str, Any]] = [
            (f"float64 tensor on {device}", torch.tensor(case.rewards, dtype=torch.float64, device=device)),
            (f"float32 tensor on {device}", torch.tensor(case.rewards, dtype=torch.float32, device=device)),
            (f"bfloat16 tensor on {device}", torch.tensor(case.rewards, dtype=torch.bfloat16, device=device)),
        ]
        if device == "cpu":
            variants += [("a Python list", list(case.rewards)), ("a numpy array", np.array(case.rewards))]
        for label, rewards in variants:
            at = Case(f"{case.label}, rewards as {label}", case.rewards, case.index, case.cluster)
            out = _call(make(), case, rewards=rewards)
            _check_output(out, at, rewards.device if isinstance(rewards, torch.Tensor) else "cpu")
            if not torch.allclose(out.cpu().double(), expected.double(), rtol=1e-5, atol=1e-6):
                raise _Broken(at, f"advantages {_values(out)}, not {_values(expected)} (float64 on the CPU)")


PROPERTIES: dict[str, Callable[[Callable[[], Any], Sequence[str]], None]] = {
    "output": output,
    "degenerate_batches": degenerate_batches,
    "no_signal_is_zero": no_signal_is_zero,
    "group_ids": group_ids,
    "non_finite_refused": non_finite_refused,
    "bad_input_refused": bad_input_refused,
    "raising_batch_keeps_state": raising_batch_keeps_state,
    "state_dict_round_trip": state_dict_round_trip,
    "resume": resume,
    "dtype_device": dtype_device,
}
"""Every property, in the order checked (the module docstring says what each asks)."""


def check_estimator(
    estimator: str | type,
    /,
    *,
    skip: Sequence[str] = (),
    devices: Sequence[str] | None = None,
    raise_on_failure: bool = True,
    **options: Any,
) -> CheckReport:
    """Check an estimator against every property of :data:`PROPERTIES` (module docstring).

    Args:
        estimator: a registered name (built with ``ebpo.get_estimator(name, **options)``) or a class (built as
            ``cls(**options)``); a fresh one is built for each check that needs one.
        skip: properties not to check (each listed as skipped in the report).
        devices: where ``dtype_device`` puts the rewards; default the CPU, and ``cuda`` when available.
        raise_on_failure: raise :class:`EstimatorCheckFailed` when a property fails (default), or return the
            report.
        options: the estimator's keyword options.

    Returns the :class:`CheckReport`.
    """
    unknown = sorted(set(skip) - set(PROPERTIES))
    if unknown:
        raise ValueError(f"skip names no property: {unknown}; properties: {', '.join(PROPERTIES)}")
    if isinstance(estimator, str):
        label = estimator

        def make() -> Any:
            return get_estimator(estimator, **options)
    elif isinstance(estimator, type):
        label = estimator.__name__

        def make() -> Any:
            return estimator(**options)
    else:
        raise TypeError(f"check_estimator takes a registered name or a class, got {estimator!r}")
    if options:
        label += "(" + ", ".join(f"{k}={v!r}" for k, v in options.items()) + ")"
    if devices is None:
        devices = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    report = CheckReport(label)
    try:
        make()
    except Exception as err:  # noqa: BLE001 - cannot check what does not build
        report.failures.append(Failure("builds", "", f"{type(err).__name__}: {err}"))
        return _finish(report, raise_on_failure)
    for name, check in PROPERTIES.items():
        if name in skip:
            report.skipped[name] = "skipped as asked"
            continue
        try:
            check(make, devices)
        except _Broken as broken:
            report.failures.append(Failure(name, broken.case, str(broken)))
        except _NotApplicable as why:
            report.skipped[name] = f"not checked: {why}"
        except Exception as err:  # noqa: BLE001 - an error on a valid batch breaks the property too
            report.failures.append(Failure(name, "", f"raised {type(err).__name__}: {err}"))
        else:
            report.passed.append(name)
    return _finish(report, raise_on_failure)


def _finish(report: CheckReport, raise_on_failure: bool) -> CheckReport:
    if raise_on_failure and not report.ok:
        raise EstimatorCheckFailed(report)
    return report
