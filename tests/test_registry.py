"""ebpo.registry: the generic Registry, its one error wording, and every registry converted to it."""

from __future__ import annotations

import re

import pytest
import torch

import ebpo
from ebpo import losses, rewards
from ebpo.advantages import EBPO_CHOICES, GroupStats, ebpo_advantage
from ebpo.annotate import topic
from ebpo.data import loaders, samplers
from ebpo.registry import PLUGINS_HINT, Registry, check_choice, unknown_choice

# -- the class --------------------------------------------------------------------------------------------


def test_register_as_decorator_and_as_call_return_the_entry():
    shapes: Registry[object] = Registry("shape")

    @shapes.register("square")
    def square(side: float) -> float:
        return side * side

    circle = object()
    assert shapes.register("circle", circle) is circle
    assert square(3.0) == 9.0  # the decorator hands the function back unchanged
    assert shapes.get("square") is square and shapes.get("circle") is circle
    assert shapes.register("nothing", None) is None  # None is an entry like any other, not "no entry"
    assert shapes.get("nothing") is None


def test_names_are_sorted_whatever_the_registration_order():
    kinds: Registry[int] = Registry("kind")
    for position, name in enumerate(["zeta", "alpha", "Mu", "beta_2", "beta"]):
        kinds.register(name, position)
    # str ordering: uppercase before lowercase, a prefix before its extensions
    assert kinds.names() == ["Mu", "alpha", "beta", "beta_2", "zeta"]
    assert kinds.names() is not kinds.names()  # a fresh list: callers cannot edit the registry through it


def test_unknown_name_has_exactly_the_one_wording():
    losses: Registry[int] = Registry("policy loss")
    losses.register("vanilla", 1)
    losses.register("clip_cov", 2)
    losses.register("kl_cov", 3)
    with pytest.raises(ValueError) as error:
        losses.get("ppo")
    assert (
        str(error.value)
        == f"unknown policy loss 'ppo'; valid choices: clip_cov, kl_cov, vanilla; {PLUGINS_HINT}"
    )
    with pytest.raises(ValueError) as error:
        losses.get(None)  # type: ignore[arg-type]  # a name from a config can be anything
    assert (
        str(error.value)
        == f"unknown policy loss None; valid choices: clip_cov, kl_cov, vanilla; {PLUGINS_HINT}"
    )
    with pytest.raises(ValueError) as error:
        Registry("reward").get("math")
    assert (
        str(error.value) == f"unknown reward 'math'; valid choices: ; {PLUGINS_HINT}"
    )  # empty: lists nothing


def test_duplicate_registration_raises_and_keeps_the_first_entry():
    rewards: Registry[str] = Registry("reward")
    rewards.register("math", "first")
    with pytest.raises(ValueError, match=r"^reward 'math' "):
        rewards.register("math", "second")
    with pytest.raises(ValueError, match=r"^reward 'math' "):
        rewards.register("math", "first")  # the same object twice too: one name, one registration
    with pytest.raises(ValueError, match=r"^reward 'math' "):
        rewards.register("math")(lambda: None)
    assert rewards.get("math") == "first"


@pytest.mark.parametrize("name", ["", 3, None])
def test_a_name_must_be_a_non_empty_string(name):
    registry: Registry[int] = Registry("sampler")
    with pytest.raises(ValueError, match=rf"\bsampler\b.*{re.escape(repr(name))}$"):
        registry.register(name, 1)  # type: ignore[arg-type]
    assert registry.names() == []


def test_contains_and_unregister():
    backends: Registry[int] = Registry("topic backend")
    backends.register("keyword", 1)
    assert "keyword" in backends and "judge" not in backends
    assert 1 not in backends and ["keyword"] not in backends  # non-strings (even unhashable) are never names
    assert backends.unregister("keyword") == 1
    assert "keyword" not in backends and backends.names() == []
    backends.register("keyword", 2)  # the name is free again
    assert backends.get("keyword") == 2
    with pytest.raises(ValueError, match=rf"topic backend 'judge'.*\bkeyword; {re.escape(PLUGINS_HINT)}$"):
        backends.unregister("judge")


def test_check_choice_uses_the_same_wording_for_fixed_option_values():
    check_choice("EBPO tau2", "raw", ("raw", "latent"))  # a valid value passes silently
    with pytest.raises(ValueError) as error:
        check_choice("EBPO tau2", "latnet", ("raw", "latent"))
    assert str(error.value) == "unknown EBPO tau2 'latnet'; valid choices: latent, raw"
    with pytest.raises(ValueError, match=r"EBPO tau2 \['raw'\].*latent, raw$"):
        check_choice("EBPO tau2", ["raw"], ("raw", "latent"))  # unhashable: still the one message
    check_choice("sampler", "topic", iter(["random", "topic"]))  # any iterable of choices, read once
    assert str(unknown_choice("dtype", "fp8", ["float32", "bfloat16"])) == (
        "unknown dtype 'fp8'; valid choices: bfloat16, float32"
    )


# -- every converted registry: the public functions keep their signatures and share the wording -------------


def _converted():
    """(public lookup, its list function, the kind in the message) for each registry converted to Registry."""
    return {
        "estimators": (ebpo.get_estimator, ebpo.list_estimators, "advantage estimator"),
        "policy losses": (losses.get_policy_loss, losses.list_policy_losses, "policy loss"),
        "rewards": (rewards.get_reward, rewards.list_rewards, "reward"),
        "schemas": (loaders.get_schema, loaders.list_schemas, "schema"),
        "samplers": (lambda name: samplers.get_sampler(name, [1, 2], 1), samplers.list_samplers, "sampler"),
        "topic backends": (topic.get_topic_backend, topic.list_topic_backends, "topic backend"),
    }


@pytest.mark.parametrize("which", list(_converted()))
def test_every_registry_rejects_an_unknown_name_with_the_one_wording(which):
    get, list_names, kind = _converted()[which]
    names = list_names()
    assert names == sorted(names) and len(names) >= 2
    # the whole wording is what this test holds: every registry words the error alike (docs/design.md)
    expected = f"unknown {kind} 'no_such_name'; valid choices: {', '.join(names)}; {PLUGINS_HINT}"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        get("no_such_name")


def test_the_converted_registries_still_hold_their_builtins():
    get = {which: entry[1]() for which, entry in _converted().items()}
    assert get["estimators"] == ["dr_grpo", "ebpo", "grpo", "jspo", "reinforce_pp_baseline", "rloo"]
    assert get["policy losses"] == ["clip_cov", "kl_cov", "vanilla"]
    assert {"arith", "math", "math_dapo"} <= set(get["rewards"])
    assert {"aime24", "dapo_math_17k", "math500", "olympiadbench", "records", "shared"} <= set(get["schemas"])
    assert get["samplers"] == ["difficulty", "random", "topic"]
    assert get["topic backends"] == ["embedding", "judge", "keyword"]


def test_register_functions_refuse_a_builtin_name():
    attempts = {
        "advantage estimator 'grpo'": lambda: ebpo.register_estimator("grpo")(type("X", (), {})),
        "policy loss 'vanilla'": lambda: losses.register_policy_loss("vanilla")(lambda *a: None),
        "reward 'math'": lambda: rewards.register_reward("math")(lambda **kw: None),
        "schema 'records'": lambda: loaders.register_schema("records", "dup")(lambda row, i, s: None),
        "sampler 'random'": lambda: samplers.register_sampler("random", lambda *a: None),
        "topic backend 'keyword'": lambda: topic.register_topic_backend("keyword", lambda **kw: None),
    }
    for what, attempt in attempts.items():
        with pytest.raises(ValueError, match=f"^{re.escape(what)} "):
            attempt()
    assert ebpo.get_estimator("grpo").name == "grpo"  # the built-in is untouched


# -- EBPO's option values: one table, one wording --------------------------------------------------------


def test_ebpo_options_are_validated_from_one_table_with_the_one_wording():
    assert EBPO_CHOICES == {
        "prior_scope": ("global", "cluster"),
        "tau2": ("raw", "latent"),
        "sigma2": ("total", "pooled"),
        "normalize": ("batch", "group", "prior", "none"),
        "prior_staleness": ("all", "max_lag", "decay"),
    }
    for option, choices in EBPO_CHOICES.items():
        for value in choices:  # every listed value builds an estimator that keeps it
            assert f"{option}={value!r}" in repr(ebpo.get_estimator("ebpo", **{option: value}))
        listed = re.escape(", ".join(sorted(choices)))
        with pytest.raises(ValueError, match=f"EBPO {option} 'bogus'.*{listed}$"):
            ebpo.get_estimator("ebpo", **{option: "bogus"})
    # the pure function checks the same table, with the same message (not a bare KeyError)
    one_M = torch.ones(1, dtype=torch.float64)
    stats = GroupStats(one_M * 2, one_M * 0.5, one_M * 0.5)
    with pytest.raises(ValueError, match=r"EBPO normalize 'bogus'.*batch, group, none, prior$"):
        ebpo_advantage(
            torch.tensor([0.0, 1.0], dtype=torch.float64),
            torch.zeros(2, dtype=torch.long),
            stats,
            one_M,
            one_M,
            one_M,
            normalize="bogus",
        )


def test_a_family_builds_entries_from_the_name_after_its_prefix():
    tasks: Registry[tuple] = Registry("task")
    tasks.register("arith", ("arith",))
    built = tasks.register_family("gym", lambda argument, **options: (argument, options), pattern="<dataset>")
    assert built("x") == ("x", {})  # the factory handed back
    assert tasks.get("gym:chain_sum,gcd") == ("chain_sum,gcd", {})
    assert tasks.get("gym:gcd", gcd={"max_value": 9}) == ("gcd", {"gcd": {"max_value": 9}})
    assert "gym:anything" in tasks and "gym" not in tasks and "arith" in tasks
    assert tasks.family_of("gym:gcd") == "gym" and tasks.family_of("arith") is None
    assert tasks.names() == ["arith"] and tasks.names(families=True) == ["arith", "gym:<dataset>"]
    with pytest.raises(ValueError) as error:
        tasks.get("gymm:gcd")
    assert str(error.value) == f"unknown task 'gymm:gcd'; valid choices: arith, gym:<dataset>; {PLUGINS_HINT}"
    with pytest.raises(ValueError, match="^task 'arith' takes no options, got mod$"):
        tasks.get("arith", mod=1)
    with pytest.raises(ValueError, match="task family 'gym' is already registered"):
        tasks.register_family("gym", lambda argument: (argument,), pattern="<x>")
    with pytest.raises(ValueError, match="without ':'"):
        tasks.register_family("a:b", lambda argument: (argument,), pattern="<x>")


def test_an_unknown_name_of_a_registry_says_how_a_name_of_ones_own_is_registered():
    table: Registry[int] = Registry("widget")
    table.register("a", 1)
    with pytest.raises(ValueError) as err:
        table.get("median_baseline")
    assert str(err.value) == f"unknown widget 'median_baseline'; valid choices: a; {PLUGINS_HINT}"
    assert "--plugins" in PLUGINS_HINT
    with pytest.raises(
        ValueError, match=r"^unknown mode 'x'; valid choices: a, b$"
    ):  # a fixed set: no plugin adds one
        check_choice("mode", "x", ["b", "a"])
