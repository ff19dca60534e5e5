"""The learning benchmark's budget, budget variants, run specs and keys; the two arms and ebpo-best."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from pathlib import Path

import pytest
from benchmarks.learning import matrix
from benchmarks.learning import methods as M
from benchmarks.learning.cli import budget_from, design_from
from benchmarks.learning.cli import build_parser as bench_parser
from benchmarks.learning.spec import (
    EQUAL_RESPONSES,
    FIXED_PROMPTS,
    KEYED_ONLY_OFF_DEFAULT,
    Budget,
    RunSpec,
    build_spec,
    model_path_from,
    spec_from_dict,
)

from ebpo.advantages import EBPOOptions

REPO = Path(__file__).resolve().parents[2]


def override(spec, key: str) -> str:
    """The value of ``key=value`` in a spec's overrides (the last one wins, as in load_config)."""
    values = [item.split("=", 1)[1] for item in spec.overrides if item.split("=", 1)[0] == key]
    assert values, f"{key} not in overrides"
    return values[-1]


# --- budget ------------------------------------------------------------------------------------------


def test_budget_resolves_every_unset_size_from_the_shared_preset(configs_dir):
    b = Budget().resolve(configs_dir)
    # SHARED_YAML: batch 8, G 4, mini-batch 2, 10 steps, eval every 5, 18 x 2 validation, lr 1e-3, 8 tokens
    assert (b.steps, b.prompts, b.responses, b.updates) == (10, 8, 8 * 4, 8 // 2)
    assert (b.eval_every, b.save_every, b.val_size, b.eval_n) == (5, 5, 18, 2)
    assert (b.lr, b.max_new_tokens, b.test_size) == (1e-3, 8, None)
    given = Budget(steps=3, prompts=6, responses=48, updates=3, eval_every=1, lr=0.5).resolve(configs_dir)
    assert (given.steps, given.prompts, given.responses, given.updates, given.eval_every) == (3, 6, 48, 3, 1)
    assert given.save_every == 1 and given.lr == 0.5  # the checkpoint cadence follows the validations
    with pytest.raises(ValueError, match=r"^budget: steps .*\b0$"):
        Budget(steps=0)
    with pytest.raises(ValueError, match=r"Budget\.resolve"):
        Budget().prompts_per_step(FIXED_PROMPTS, 4)


def test_budget_variants_and_mini_batches_by_hand(configs_dir):
    b = Budget(prompts=8, responses=64, updates=4).resolve(configs_dir)
    # fixed prompts: P = 8 at every G; equal responses: R / G = 64 / 4 = 16, 64 / 16 = 4
    assert [b.prompts_per_step(FIXED_PROMPTS, G) for G in (4, 16)] == [8, 8]
    assert [b.prompts_per_step(EQUAL_RESPONSES, G) for G in (4, 8, 16)] == [16, 8, 4]
    # 4 updates: 16 prompts -> mini-batch 4; 8 -> 2; 4 -> 1; 6 prompts: largest divisor of 6 <= 4 is 3 -> 2
    assert [b.mini_batch_size(p) for p in (16, 8, 4, 6)] == [4, 2, 1, 2]
    assert Budget(updates=8).resolve(configs_dir).mini_batch_size(2) == 1  # updates drop to the 2 prompts
    with pytest.raises(ValueError, match=r"R=64 .*G=5\b"):
        b.prompts_per_step(EQUAL_RESPONSES, 5)
    with pytest.raises(ValueError, match="'equal-prompts'"):
        b.prompts_per_step("equal-prompts", 4)


def test_spec_overrides_apply_the_budget_of_the_variant(configs_dir):
    budget = Budget(steps=3, prompts=8, responses=64, updates=4).resolve(configs_dir)
    grpo = M.get_method(M.PUBLISHED, "grpo")
    spec = build_spec(grpo, EQUAL_RESPONSES, 16, 7, budget, "/m", configs=configs_dir)
    cfg = spec.load_config()
    assert (cfg.data.group_size, cfg.data.batch_size, cfg.optim.mini_batch_size) == (16, 4, 1)
    assert cfg.data.train_size == 3 * 4  # one epoch: steps x prompts per step
    assert (cfg.run.steps, cfg.run.seed, cfg.run.eval_every, cfg.run.eval_n, cfg.run.eval_k) == (
        3,
        7,
        5,
        2,
        2,
    )
    assert cfg.model.path == "/m" and cfg.run.threads == 1 and cfg.run.device == "cpu"
    assert spec.train_responses == 3 * 4 * 16
    # validations at steps 0 and 3 (eval_every 5 > 3 steps: only before and at the end): 2 x 18 x 2 answers
    assert spec.validations == 2 and spec.val_samples == 2 * 18 * 2
    assert spec.label == "published/grpo/equal-responses/G16/seed7"


def test_validations_count_step_zero_the_cadence_and_the_end(configs_dir):
    grpo = M.get_method(M.PUBLISHED, "grpo")
    for steps, every, expected in ((10, 5, 3), (12, 5, 4), (10, 1, 11)):
        budget = Budget(steps=steps, eval_every=every).resolve(configs_dir)
        # steps 0, 5, 10 | 0, 5, 10, 12 | 0, 1, ..., 10
        assert (
            build_spec(grpo, FIXED_PROMPTS, 4, 0, budget, "/m", configs=configs_dir).validations == expected
        )


# --- keys --------------------------------------------------------------------------------------------


def test_key_is_the_config_not_the_cell_name(configs_dir):
    budget = Budget(steps=3, prompts=8, responses=32).resolve(configs_dir)

    def spec(arm, name, variant=FIXED_PROMPTS, G=4, seed=0, b=budget):
        return build_spec(M.get_method(arm, name), variant, G, seed, b, "/m", configs=configs_dir)

    # arm (a)'s GRPO is the published GRPO: one run
    assert spec(M.ESTIMATORS, "grpo").key == spec(M.PUBLISHED, "grpo").key
    # fixed prompts P = 8 and equal responses R = 32 coincide at G = 4 (32 / 4 = 8 prompts), not at G = 8
    assert (
        spec(M.PUBLISHED, "grpo", EQUAL_RESPONSES, 4).key == spec(M.PUBLISHED, "grpo", FIXED_PROMPTS, 4).key
    )
    assert (
        spec(M.PUBLISHED, "grpo", EQUAL_RESPONSES, 8).key != spec(M.PUBLISHED, "grpo", FIXED_PROMPTS, 8).key
    )
    base = spec(M.ESTIMATORS, "ebpo")
    assert base.key != spec(M.ESTIMATORS, "ebpo-prior").key
    assert base.key != spec(M.ESTIMATORS, "ebpo", seed=1).key
    assert base.key != spec(M.ESTIMATORS, "ebpo", b=Budget(steps=4, prompts=8).resolve(configs_dir)).key
    assert (
        base.key
        != spec(M.ESTIMATORS, "ebpo", b=Budget(steps=3, prompts=8, test_n=4).resolve(configs_dir)).key
    )
    again = spec_from_dict(json.loads(json.dumps(base.to_dict())))
    assert again == base and again.key == base.key and again.label == base.label


def test_fields_added_later_enter_the_key_only_off_their_earlier_default(configs_dir):
    """rollout.old_logp, run.step_kl and optim.shared_prompts came after runs were keyed: at their earlier
    defaults (recompute, all, false: what the trainer did before they existed) they stay out of the key, so
    those runs keep theirs (the committed matrix's keys, tested below); any other value, today's defaults
    included, is another run."""
    budget = Budget(steps=3, prompts=8).resolve(configs_dir)
    grpo = M.get_method(M.PUBLISHED, "grpo")
    plain = build_spec(grpo, FIXED_PROMPTS, 4, 0, budget, "/m", configs=configs_dir)
    exact = ("rollout.old_logp=recompute", "run.step_kl=all", "optim.shared_prompts=false")

    def key_with(*overrides: str) -> str:
        return RunSpec(plain.values_json, plain.overrides + overrides, "/m", plain.test, plain.checkpoint).key

    config = plain.load_config()
    assert (config.rollout.old_logp, config.run.step_kl, config.optim.shared_prompts) == (
        "sampler",
        "subset",
        None,
    )
    keys = {
        key_with(*exact, "rollout.old_logp=sampler"),
        key_with(*exact, "run.step_kl=subset"),
        key_with(*exact, "run.step_kl=none"),
        key_with(*exact, "optim.shared_prompts=true"),
        plain.key,
    }
    assert len(keys) == 5 and key_with(*exact) not in keys
    # the fields are left out of the hashed config only at their earlier defaults
    assert dict(KEYED_ONLY_OFF_DEFAULT) == {
        ("rollout", "old_logp"): "recompute",
        ("run", "step_kl"): "all",
        ("optim", "shared_prompts"): False,
        ("data", "chat_template"): "auto",
        ("data", "task_options"): {},
    }
    assert config.data.chat_template == "auto"  # the default: keyed as before the field existed
    assert key_with(*exact, "data.chat_template=off") != key_with(*exact)
    assert config.data.task_options == {}  # likewise; a task's generator settings are another run
    assert key_with(*exact, "data.task_options={chain_sum: {max_terms: 2}}") != key_with(*exact)


def test_key_follows_the_model_weights_not_the_model_path(configs_dir, tmp_path):
    """A model rebuilt in place is another model (its runs must rerun); the same model in another
    checkout is the same (its runs are reused)."""
    budget = Budget(steps=3, prompts=8).resolve(configs_dir)
    grpo = M.get_method(M.PUBLISHED, "grpo")

    def key(model_dir):
        return build_spec(grpo, FIXED_PROMPTS, 4, 0, budget, str(model_dir), configs=configs_dir).key

    here, there = tmp_path / "checkout-a" / "model", tmp_path / "checkout-b" / "model"
    for directory in (here, there):
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"weights v1")
    assert key(here) == key(there)
    (here / "model.safetensors").write_bytes(b"weights v2, rebuilt in place")
    assert key(here) != key(there)


def test_planned_values_are_frozen_against_later_preset_edits(configs_dir):
    budget = Budget(steps=2).resolve(configs_dir)
    grpo = M.get_method(M.PUBLISHED, "grpo")
    planned = build_spec(grpo, FIXED_PROMPTS, 4, 0, budget, "/m", configs=configs_dir)
    (configs_dir / "grpo.yaml").write_text("algorithm: {estimator: grpo, kl_coef: 0.5}\n")
    replanned = build_spec(grpo, FIXED_PROMPTS, 4, 0, budget, "/m", configs=configs_dir)
    assert replanned.load_config().algorithm.kl_coef == 0.5
    assert planned.load_config().algorithm.kl_coef != 0.5 and planned.key != replanned.key


def test_model_path_comes_from_the_shared_preset_and_nothing_is_built(configs_dir, tmp_path, monkeypatch):
    import ebpo.models.build as build

    monkeypatch.setattr(build, "build_base_model", lambda *a, **k: pytest.fail("built the base model"))
    monkeypatch.setenv("EBPO_CACHE", str(tmp_path / "cache"))
    assert model_path_from(configs_dir) == str(build.default_base_model_path())  # model.path null
    assert not (tmp_path / "cache").exists()
    text = (configs_dir / "ebpo.yaml").read_text().replace("path: null", f"path: {tmp_path / 'shipped'}")
    (configs_dir / "ebpo.yaml").write_text(text)
    assert model_path_from(configs_dir) == str(tmp_path / "shipped")
    assert model_path_from(configs_dir, str(tmp_path / "given")) == str(tmp_path / "given")


# --- the two arms --------------------------------------------------------------------------------------


def _resolved(arm: str, names, configs_dir) -> dict[str, dict]:
    budget = Budget(steps=3).resolve(configs_dir)
    selection = M.Selection("ebpo-latent", "test", (100,), "/m", "c", resolved=True)
    out = {}
    for name in names:
        method = M.best_method(selection, "/m")[0] if name == M.BEST else M.get_method(arm, name)
        out[name] = build_spec(method, FIXED_PROMPTS, 4, 1, budget, "/m", configs=configs_dir).config
    return out


def test_arm_a_methods_differ_only_in_the_estimator_and_its_options(configs_dir):
    names = list(M.ARM_METHODS[M.ESTIMATORS]) + list(M.OPTION_CANDIDATES)
    configs = _resolved(M.ESTIMATORS, names, configs_dir)

    def without_estimator(config: dict) -> dict:
        algorithm = {
            k: v
            for k, v in config["algorithm"].items()
            if k not in ("estimator", "estimator_options", "ebpo")
        }
        # data.cluster_key only hands the clusters to the estimator (prior_scope=cluster); the order is random
        data = {k: v for k, v in config["data"].items() if k != "cluster_key"}
        return {**config, "algorithm": algorithm, "data": data}

    reference = without_estimator(configs["grpo"])
    for name, config in configs.items():
        assert without_estimator(config) == reference, name
        assert config["data"]["sampler"] == "random"
    # the shared loss is GRPO's as published (configs/grpo.yaml), with nothing DAPO- or EntropyMech-like
    published_grpo = _resolved(M.PUBLISHED, ["grpo"], configs_dir)["grpo"]
    assert configs["grpo"] == published_grpo
    a = configs["ebpo"]["algorithm"]
    assert a["policy_loss"] == "vanilla" and not a["dynamic_sampling"] and not a["overlong_shaping"]
    defaults = dataclasses.asdict(EBPOOptions())

    def options(algorithm: dict) -> dict:
        """The estimator's options that differ from their defaults (EBPO's section, or any other's)."""
        ebpo = {k: v for k, v in algorithm["ebpo"].items() if v != defaults[k]}
        return {**algorithm["estimator_options"], **ebpo}

    estimators = {name: (c["algorithm"]["estimator"], options(c["algorithm"])) for name, c in configs.items()}
    assert estimators["grpo"] == ("grpo", {}) and estimators["ebpo"] == ("ebpo", {})
    assert estimators["dr_grpo"][0] == "dr_grpo" and estimators["jspo"][0] == "jspo"
    assert (
        estimators["rloo"][0] == "rloo" and estimators["reinforce_pp_baseline"][0] == "reinforce_pp_baseline"
    )
    assert estimators["ebpo-prior"] == ("ebpo", {"normalize": "prior"})
    assert estimators[M.BEST] == ("ebpo", {"tau2": "latent"})  # the selection's options
    assert estimators["ebpo-cluster"] == ("ebpo", {"prior_scope": "cluster"})
    assert configs["ebpo-cluster"]["data"]["cluster_key"] == "topic"
    assert (
        len({json.dumps(e, sort_keys=True) for e in estimators.values()}) == len(estimators) - 1
    )  # best = latent


def test_arm_b_presets_keep_their_own_loss_and_entropymech_selects_the_ratio(configs_dir):
    configs = _resolved(M.PUBLISHED, M.ARM_METHODS[M.PUBLISHED], configs_dir)
    for name, config in configs.items():  # every preset shares ebpo.yaml's optimizer and validation
        assert config["optim"] == configs["grpo"]["optim"] and config["run"] == configs["grpo"]["run"], name
    assert configs["dapo"]["algorithm"]["dynamic_sampling"]
    assert configs["ebpo-topic"]["data"]["sampler"] == "topic"
    assert configs["ebpo-diff"]["data"]["sampler"] == "difficulty"
    for name, loss in (("entropymech-clip-cov", "clip_cov"), ("entropymech-kl-cov", "kl_cov")):
        algorithm = configs[name]["algorithm"]
        assert algorithm["policy_loss"] == loss and algorithm["loss"]["cov_count"] == "stochastic"
    assert configs["entropymech-clip-cov"]["algorithm"]["loss"]["clip_cov_ratio"] == 2e-4  # the paper's
    assert M.get_method(M.PUBLISHED, "ebpo-diff").checkpoint == "last"
    with pytest.raises(ValueError, match="'ppo'.*dapo, dr-grpo, ebpo-diff"):
        M.get_method(M.PUBLISHED, "ppo")


# --- ebpo-best -----------------------------------------------------------------------------------------


def test_best_method_is_the_resolved_selection_or_none_with_the_reason(tmp_path):
    method, how = M.best_method(None, "/m")
    assert method is None and how.startswith("no `ebpo-best` row: no selection was made")
    path = tmp_path / "best.json"
    assert M.read_selection(path) is None
    chosen = M.Selection("ebpo-prior", "highest mean validation AUC", (100, 101), "/m", "cmd", resolved=True)
    path.write_text(json.dumps(chosen.to_dict()))
    assert M.read_selection(path) == chosen
    method, how = M.best_method(M.read_selection(path), "/m")
    assert method is not None and method.name == M.BEST
    assert method.overrides == M.get_method(M.ESTIMATORS, "ebpo-prior").overrides and "[100, 101]" in how
    with pytest.raises(ValueError, match=r"/m \(no id\).* /other \(name:/other\)"):
        M.best_method(chosen, "/other")
    # the leader's lead not resolved: no row, and why (the selection's own account of its lead)
    led = dataclasses.replace(chosen, resolved=False, chosen_by="ebpo-prior - ebpo ... not resolved")
    path.write_text(json.dumps(led.to_dict()))
    method, how = M.best_method(M.read_selection(path), "/m")
    assert (
        method is None and "no resolved winner (ebpo-prior - ebpo ... not resolved; seeds [100, 101])" in how
    )
    # older files: the format before seeds and model, and one that does not say whether the lead is resolved
    for old in (
        {"method": "ebpo-topic-cluster", "chosen_by": "old format"},
        {**chosen.to_dict(), "resolved": None},
    ):
        path.write_text(json.dumps(old))
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: .*--select-options"):
            M.read_selection(path)


def test_a_selection_follows_its_model_to_another_checkout_and_refuses_another_model(tmp_path):
    """The selection records the model's identity (the weights hash of an ebpo base-model build, else the
    weight files' hash), so the committed selection holds in a clone at another path, and a changed model is
    refused even at the same path."""
    import shutil

    from ebpo.models.recipes.arith import SHIPPED_DIR

    here, there = tmp_path / "a" / "arith_base", tmp_path / "b" / "arith_base"
    shutil.copytree(SHIPPED_DIR, here)
    shutil.copytree(SHIPPED_DIR, there)
    shipped = M.model_identity(str(here))
    assert shipped == M.model_identity(str(there)) == M.model_identity(str(SHIPPED_DIR))
    assert shipped.startswith("weights:")
    chosen = M.Selection("ebpo-prior", "auc", (100,), str(here), "cmd", shipped, resolved=True)
    path = tmp_path / "best.json"
    path.write_text(json.dumps(chosen.to_dict()))
    assert M.read_selection(path) == chosen
    method, _ = M.best_method(M.read_selection(path), str(there))  # another checkout: the same model
    assert method.overrides == M.get_method(M.ESTIMATORS, "ebpo-prior").overrides

    plain = tmp_path / "plain"  # a model directory without build_info.json: its weight files are hashed
    plain.mkdir()
    (plain / "model.safetensors").write_bytes(b"weights one")
    first = M.model_identity(str(plain))
    (plain / "model.safetensors").write_bytes(b"weights two")
    assert first.startswith("files:") and M.model_identity(str(plain)) != first
    with pytest.raises(ValueError, match=rf"{re.escape(str(plain))} \({first}\).* \(files:[0-9a-f]+\)"):
        M.best_method(M.Selection("ebpo-prior", "auc", (100,), str(plain), "cmd", first), str(plain))
    assert M.model_identity("Qwen/Qwen2.5-Math-1.5B") == "name:Qwen/Qwen2.5-Math-1.5B"  # a hub id


def test_selection_seeds_must_be_disjoint_from_reported_seeds():
    M.check_disjoint((0, 1, 2, 3, 4), M.SELECTION_SEEDS)  # the defaults are disjoint
    with pytest.raises(ValueError, match=r"seeds \[1\] .*ebpo-best"):
        M.check_disjoint((0, 1), (1, 100))


def test_select_best_calls_the_leader_a_winner_only_when_its_lead_over_the_paper_options_is_resolved():
    ebpo = {0: 0.3, 1: 0.4, 2: 0.5}
    # ebpo-prior leads by 0.10, 0.10, 0.13: mean 0.11, sd sqrt((1e-4 + 1e-4 + 4e-4) / 2) = 0.01732, half-width
    # t(0.975, 2) 4.303 x 0.01732 / sqrt(3) = 0.0430: [+6.70, +15.30] points, above 0
    leader, resolved, how = M.select_best({"ebpo": ebpo, "ebpo-prior": {0: 0.4, 1: 0.5, 2: 0.63}})
    assert (leader, resolved) == ("ebpo-prior", True) and "ebpo-prior 0.5100 (n=3)" in how
    assert how.endswith("ebpo-prior - ebpo, paired over 3 seeds: +11.00 points, 95% interval [+6.70, +15.30], "
                        "resolved: ebpo-best")  # fmt: skip
    # a higher mean (0.50 against 0.40) by +0.2, -0.1, +0.2: sd 0.1732, half-width 0.430: [-33.03, +53.03]
    leader, resolved, how = M.select_best({"ebpo": ebpo, "ebpo-prior": {0: 0.5, 1: 0.3, 2: 0.7}})
    assert (leader, resolved) == ("ebpo-prior", False)
    assert how.endswith("+10.00 points, 95% interval [-33.03, +53.03], not resolved: no resolved winner")
    # the paper's options lead (or tie for the lead: candidate order): nothing is ahead of them
    leader, resolved, how = M.select_best(
        {"ebpo": ebpo, "ebpo-latent": ebpo, "ebpo-ewm": {0: 0.1, 1: 0.2, 2: 0.3}}
    )
    assert (leader, resolved) == ("ebpo", False) and "a tie between ebpo, ebpo-latent" in how
    assert how.endswith("the paper's options (ebpo) lead: no variant is ahead of them")
    # ties go to the earlier candidate; one seed gives no interval, so no winner
    leader, resolved, how = M.select_best({"ebpo": {0: 0.1}, "ebpo-ewm": {0: 0.2}, "ebpo-latent": {0: 0.2}})
    assert (leader, resolved) == ("ebpo-latent", False) and "a tie between ebpo-ewm, ebpo-latent" in how
    assert "+10.00 points (one seed: no interval), not resolved" in how
    with pytest.raises(ValueError, match=r"no finished runs of ebpo \(the paper's options\)"):
        M.select_best({"ebpo-ewm": {0: 0.2}, "ebpo-latent": {0: 0.1}})
    with pytest.raises(ValueError, match=r"candidates \[\]"):
        M.select_best({})


def test_the_options_key_alike_under_either_spelling(configs_dir):
    """EBPO's and the loss's options enter the key as given, under algorithm.estimator_options /
    algorithm.ebpo and algorithm.loss_options / algorithm.loss alike."""
    budget = Budget(steps=3, prompts=8).resolve(configs_dir)
    prior = build_spec(
        M.get_method(M.ESTIMATORS, "ebpo-prior"), FIXED_PROMPTS, 4, 0, budget, "/m", configs=configs_dir
    )
    assert "algorithm.estimator_options.normalize=prior" in prior.overrides
    spelled = tuple(item.replace("estimator_options.", "ebpo.") for item in prior.overrides)
    assert RunSpec(prior.values_json, spelled, "/m", prior.test, prior.checkpoint).key == prior.key
    published = build_spec(
        M.get_method(M.PUBLISHED, "grpo"), FIXED_PROMPTS, 4, 0, budget, "/m", configs=configs_dir
    )
    values = json.loads(published.values_json)
    algorithm = values["algorithm"]
    for earlier, present in (("estimator_options", "ebpo"), ("loss_options", "loss")):
        algorithm[present if earlier in algorithm else earlier] = algorithm.pop(
            earlier, algorithm.pop(present, {})
        )
    respelled = RunSpec(json.dumps(values, sort_keys=True), published.overrides, "/m", published.test, "best")
    assert respelled.values_json != published.values_json and respelled.key == published.key
    other = RunSpec(
        published.values_json,
        published.overrides + ("algorithm.loss.clip_eps_high=0.3",),
        "/m",
        published.test,
        "best",
    )
    assert other.key != published.key


EARLIER_DEFAULTS = ["--lr", "2e-4"] + [
    "--set",
    "rollout.old_logp=recompute",
    "--set",
    "run.step_kl=all",
    "--set",
    "optim.shared_prompts=false",
]
"""The flags that plan the runs of docs/results/superseded/lr2e-4/learning_matrix_cells.csv: its rate, and the
exact log-prob paths that were the trainer's defaults when it ran."""

RESULTS = REPO / "docs" / "results"
TEN_SEEDS = ["--seeds", *map(str, range(10))]
PUBLISHED_MATRIX = [
    *TEN_SEEDS,
    *("--methods", "grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "jspo", "ebpo", "ebpo-prior"),
    *(
        "estimators/ebpo-pooled",
        "dr-grpo",
        "dapo",
        "entropymech-clip-cov",
        "entropymech-kl-cov",
        "ebpo-naive",
    ),
    *("ebpo-topic", "ebpo-diff", "--sweep", "grpo", "estimators/ebpo", "estimators/ebpo-pooled"),
]
"""The published matrix's runs on seeds 0-9 (docs/results/README.md): every default row, and ebpo-pooled, the
selection's unresolved leader, in the sweep (it ran there as ebpo-best, under the earlier rule)."""
VERDICT_CELLS = [
    *("--methods", "grpo", "estimators/ebpo", "published/dapo"),
    *("--sweep", "grpo", "estimators/ebpo", "--groups", "4", "16", "--budgets", "fixed-prompts"),
    *("--seeds", *map(str, range(10, 20))),
]
"""The flags of the published matrix (seeds 0-9) and of its verdict cells on seeds 10-19."""


def test_settings_come_last_and_key_only_what_they_change(configs_dir):
    """--set puts a trainer override after the run's own, so it wins; one at the trainer's default keys the
    same run as no setting, one elsewhere another run. (That the exact paths key runs as they were keyed
    before those fields existed is the next test's: the committed matrix's keys.)"""
    method = M.get_method(M.ESTIMATORS, "grpo")
    exact = ("rollout.old_logp=recompute", "run.step_kl=all", "optim.shared_prompts=false")

    def spec_with(settings):
        budget = Budget(steps=3, prompts=8, settings=settings).resolve(configs_dir)
        return build_spec(method, FIXED_PROMPTS, 4, 0, budget, "/m", configs=configs_dir)

    plain, earlier, at_default = spec_with(()), spec_with(exact), spec_with(("rollout.old_logp=sampler",))
    assert earlier.overrides[-3:] == exact and earlier.config["rollout"]["old_logp"] == "recompute"
    assert plain.config["rollout"]["old_logp"] == "sampler" and at_default.key == plain.key
    assert earlier.key != plain.key


def planned_keys(argv: list[str], best_file: str | None) -> set[str]:
    """The run keys `python -m benchmarks.learning ARGV` plans with the shipped presets and base model,
    ebpo-best taken from ``best_file`` (None for ``--select-options``, which plans the candidates)."""
    args = bench_parser().parse_args(argv)
    budget = budget_from(args).resolve(M.CONFIGS)
    selection = None if best_file is None else M.read_selection(RESULTS / best_file)
    plan = matrix.plan(
        design_from(args), budget, model_path=model_path_from(), configs=M.CONFIGS, selection=selection
    )
    return {spec.key for spec in plan.runs}


def committed_keys(path: Path) -> set[str]:
    with open(path) as handle:
        return {row["key"] for row in csv.DictReader(handle)}


@pytest.mark.golden
@pytest.mark.parametrize(
    "cells, argv, best_file, at_least",
    [
        ("learning_matrix_cells.csv", PUBLISHED_MATRIX, "ebpo_best_options.json", 200),
        ("learning_matrix_seeds10-19_cells.csv", VERDICT_CELLS, "ebpo_best_options.json", 40),
        ("learning_options_cells.csv", ["--select-options"], None, 15),
        (
            "superseded/lr2e-4/learning_matrix_cells.csv",
            EARLIER_DEFAULTS,
            "superseded/lr2e-4/ebpo_best_options.json",
            100,
        ),
        ("superseded/lr2e-4/learning_options_cells.csv", ["--select-options", *EARLIER_DEFAULTS], None, 15),
    ],
)
def test_the_committed_results_are_runs_the_matrix_plans(cells, argv, best_file, at_least):
    """Every key of a published CSV (a matrix, or the selection of ebpo-best) is a run that `python -m
    benchmarks.learning` plans with the shipped presets and base model, given the flags of its command (seeds;
    for the superseded matrix the rate and log-prob paths of its time) and the selection published beside it:
    a change to the config that changed keys would orphan the published results. ``at_least``: distinct runs
    the CSV must hold (270, 50, 18, 110 and 18 are published), so that a cut file cannot pass."""
    committed = committed_keys(RESULTS / cells)
    planned = planned_keys(argv, best_file)
    assert len(committed) >= at_least and committed <= planned, sorted(committed - planned)


# --- the committed labels --------------------------------------------------------------------------------

SELECTION_OF = {
    ".": "ebpo_best_options.json",
    "near_miss_model": "near_miss_model/ebpo_best_options.json",
    "ten_seeds": "near_miss_model/ebpo_best_options.json",  # D2's matrix on ten seeds, D2's selection
    "run_on_model": "run_on_model/ebpo_best_options.json",
    "superseded/lr2e-4": "superseded/lr2e-4/ebpo_best_options.json",
}
"""The selection behind each folder of docs/results whose matrix had an ``ebpo-best`` row; any other folder's
pages may name no such row."""


@pytest.mark.golden
@pytest.mark.parametrize("selection", sorted(set(SELECTION_OF.values())))
def test_each_committed_selection_says_what_its_runs_give(selection):
    """The leader and whether its lead over ebpo is resolved, recomputed from the selection's committed runs
    (``learning_options_cells.csv`` beside it), are the file's."""
    chosen = M.read_selection(RESULTS / selection)
    assert chosen is not None
    scores: dict[str, dict[int, float]] = {}
    with open((RESULTS / selection).parent / "learning_options_cells.csv") as handle:
        for row in csv.DictReader(handle):
            scores.setdefault(row["method"], {})[int(row["seed"])] = float(row["auc"])
    leader, resolved, how = M.select_best(scores)
    assert (leader, resolved, how) == (chosen.method, chosen.resolved, chosen.chosen_by)
    assert sorted(chosen.seeds) == sorted({seed for values in scores.values() for seed in values})


@pytest.mark.golden
def test_docs_results_names_ebpo_best_only_where_its_selection_resolved_it():
    """A generated page's ``ebpo-best`` row or line (``| ebpo-best |``, ``- `ebpo-best` = ...``) and a CSV's
    ``ebpo-best`` cells appear only in a folder whose selection's lead is resolved; elsewhere the runs are named
    by their options (or, where the leader was ``ebpo`` itself, left to ``ebpo``'s rows)."""
    resolved = {folder: M.read_selection(RESULTS / path).resolved for folder, path in SELECTION_OF.items()}
    assert resolved == {  # the current selection, R1's and lr 2e-4's did not resolve; D2's did, just
        ".": False,
        "near_miss_model": True,
        "ten_seeds": True,
        "run_on_model": False,
        "superseded/lr2e-4": False,
    }
    named = []
    for path in sorted(RESULTS.rglob("learning_*")):
        folder = path.parent.relative_to(RESULTS).as_posix()
        if path.suffix == ".md":
            lines = path.read_text().splitlines()
            hits = [
                i for i, line in enumerate(lines, 1) if line.startswith(("| ebpo-best |", "- `ebpo-best` ="))
            ]
        elif path.suffix == ".csv":
            with open(path) as handle:
                rows = list(csv.DictReader(handle))
            hits = [i for i, row in enumerate(rows, 2) if row.get("method") == M.BEST]
        else:
            continue
        if hits and not resolved.get(folder, False):
            named.append(f"{path.relative_to(RESULTS)}: lines {hits[:5]}")
    assert not named, "ebpo-best named without a resolved selection:\n" + "\n".join(named)
    checked = [p for p in RESULTS.rglob("learning_*") if p.suffix in (".md", ".csv")]
    assert len(checked) > 40  # the pages are read, not an empty glob
