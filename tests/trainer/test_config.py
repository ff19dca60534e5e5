"""Trainer configuration: YAML + dotted overrides, type checks, each section's checks, the earlier spellings of
EBPO's and the loss's options, and the names looked up when a run is set up."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import pytest
import torch

from ebpo import settings
from ebpo.advantages import EBPOOptions
from ebpo.errors import ConfigError
from ebpo.losses import PolicyLossOptions
from ebpo.trainer import setup
from ebpo.trainer.config import AlgorithmConfig, RunConfig, TrainConfig, describe
from ebpo.trainer.config_files import PRESETS_DIR, load_config, save_config

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(PRESETS_DIR.glob("*.yaml"))
PRESET_NAMES = {
    "ebpo",
    "gym",
    "grpo",
    "dr_grpo",
    "dapo",
    "entropymech_clip_cov",
    "entropymech_kl_cov",
    "ebpo_topic",
    "ebpo_diff",
}


def test_defaults_validate_and_method_name():
    cfg = load_config()
    assert cfg.algorithm.estimator == "ebpo"
    assert cfg.data.task == "arith"
    assert cfg.model.path is None  # the built-in base model
    assert cfg.method == "ebpo"
    cfg.algorithm.policy_loss = "kl_cov"
    assert cfg.method == "ebpo-kl_cov"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "algorithm:\n  estimator: grpo\n  estimator_options: {eps: 1.0e-6}\nrollout:\n  temperature: 0.7\n"
        "optim:\n  lr: 1\n"
    )
    cfg = load_config(
        path, ["rollout.temperature=0.8", "algorithm.estimator_options.eps=0.001", "run.steps=7"]
    )
    assert cfg.algorithm.estimator == "grpo"  # from the file
    assert cfg.rollout.temperature == 0.8  # the override wins over the file
    assert cfg.algorithm.estimator_options == {"eps": 0.001}  # grpo's own options: keys nest and merge
    assert cfg.algorithm.estimator_kwargs() == {"eps": 0.001}
    assert cfg.run.steps == 7 and isinstance(cfg.run.steps, int)
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)  # an int widens to a float field
    assert cfg.data.batch_size == TrainConfig().data.batch_size  # untouched keys keep their defaults


def test_parse_override_values_are_yaml():
    parse_override = settings.parse_override
    assert parse_override("a.b=0.8") == (["a", "b"], 0.8)
    assert parse_override("run.progress=false") == (["run", "progress"], False)
    assert parse_override("model.path=null") == (["model", "path"], None)
    assert parse_override("optim.betas=[0.9, 0.95]") == (["optim", "betas"], [0.9, 0.95])
    assert load_config(None, ["optim.lr=1e-3"]).optim.lr == 0.001  # YAML 1.1 reads 1e-3 as a string
    assert parse_override("model.path=/a=b") == (["model", "path"], "/a=b")  # split at the first '='
    with pytest.raises(ConfigError, match="not key=value"):
        parse_override("algorithm.estimator")
    with pytest.raises(ConfigError, match="empty key part"):
        parse_override("algorithm..estimator=grpo")
    assert settings.apply_overrides({"a": {"x": 1}}, ["a.y=2"]) == {"a": {"x": 1, "y": 2}}


def test_unknown_key_names_the_valid_keys():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.temprature=0.8"])
    assert str(err.value) == "unknown config key 'rollout.temprature' (did you mean 'rollout.temperature'?)"
    with pytest.raises(ConfigError, match="valid keys: model, data, rollout, algorithm, optim, run"):
        settings.build(TrainConfig, {"trainer": {}})
    with pytest.raises(ConfigError, match=r"'algorithm.ebpo.prior_scop'.*algorithm.ebpo.prior_scope"):
        load_config(None, ["algorithm.ebpo.prior_scop=cluster"])


def test_every_unknown_key_is_in_one_message_with_the_nearest_key_of_any_section():
    # three typos, one run: each with the key meant, a key of another section found by its name, and a key
    # nothing is close to with its section's keys
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.group_size=4", "optim.weight_decy=0", "run.stepz=3", "run.colour=red"])
    assert str(err.value) == (
        "4 unknown config keys: 'algorithm.group_size' (did you mean 'data.group_size'?); "
        "'optim.weight_decy' (did you mean 'optim.weight_decay'?); 'run.stepz' (did you mean 'run.steps'?); "
        f"'run.colour' (valid keys: {', '.join('run.' + f.name for f in dataclasses.fields(RunConfig))})"
    )


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"optim.learning_rate.*optim.lr.*bad.yaml"):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.loss_agg_mode=sum", "algorithm.loss_agg_mode"),
        ("algorithm.kl_estimator=k4", "algorithm.kl_estimator"),
        ("data.cluster_key=source", "data.cluster_key"),
        ("data.difficulty_source=guess", "data.difficulty_source"),
        ("model.dtype=float8", "model.dtype"),
        ("rollout.old_logp=cache", "rollout.old_logp"),
        ("run.step_kl=some", "run.step_kl"),
        ("algorithm.loss.cov_count=floor", "algorithm.loss.cov_count"),
        ("algorithm.ebpo.normalize=priors", "algorithm.ebpo.normalize"),
        ("algorithm.loss_options={clip_ratio: 0.2}", "algorithm.loss.clip_ratio"),
        ("algorithm.loss_options={max_response_len: 9}", "algorithm.loss.max_response_len"),
        ("algorithm.estimator_options={prior_scop: cluster}", "algorithm.ebpo.prior_scop"),
        ("run.steps=1.5", "run.steps"),
        ("optim.lr=fast", "optim.lr"),
        ("run.progress=yes please", "run.progress"),
        ("data.batch_size=6", "optim.mini_batch_size=3"),  # the fix: a mini-batch size that divides 6
        ("run.eval_k=64", "run.eval_k"),
        ("rollout.top_p=0", "rollout.top_p"),
        ("rollout.temperature=0", "rollout.temperature"),
        ("data.group_size=0", "data.group_size"),
        ("run.device=tpu", "run.device"),
        ("algorithm.ebpo.tau2_floor=-1", "algorithm.ebpo.tau2_floor"),
        ("algorithm.loss.dual_clip_c=1", "algorithm.loss"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert key in str(err.value) and "\n" not in str(err.value)


def test_a_fixed_choice_lists_the_valid_ones():
    with pytest.raises(ConfigError, match=r"'sum'; valid choices: seq-mean-token-mean, .*token-mean$"):
        load_config(None, ["algorithm.loss_agg_mode=sum"])


def test_chat_template_reads_on_and_off_as_words(tmp_path):
    # YAML 1.1 reads the words on / off (and yes / true) as booleans: a choice with on and off takes them back
    assert load_config(None, []).data.chat_template == "auto"
    for word, setting in (("on", "on"), ("off", "off"), ("true", "on"), ("auto", "auto")):
        assert load_config(None, [f"data.chat_template={word}"]).data.chat_template == setting
    saved = tmp_path / "config.yaml"
    saved.write_text("data:\n  chat_template: off\n")
    assert load_config(str(saved)).data.chat_template == "off"
    with pytest.raises(
        ConfigError, match=r"unknown data.chat_template 'yes please'; valid choices: auto, off, on"
    ):
        load_config(None, ["data.chat_template=yes please"])


def _setup_error(*overrides: str) -> str:
    """The one-line ConfigError that checking a run's setup with ``overrides`` raises (before any model loads)."""
    cfg = load_config(None, list(overrides))
    with pytest.raises(ConfigError) as err:
        setup.check_setup(cfg)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    ("override", "start", "listed"),
    [
        (
            "algorithm.estimator=ppo",
            "algorithm.estimator: unknown advantage estimator 'ppo'",
            "dr_grpo, ebpo",
        ),
        ("algorithm.policy_loss=dpo", "algorithm.policy_loss: unknown policy loss 'dpo'", "clip_cov, kl_cov"),
        ("data.sampler=shuffle", "data.sampler: unknown prompt sampler 'shuffle'", "difficulty, random"),
        ("data.task=gsm8k", "data.task: unknown task 'gsm8k'", "arith"),
        ("data.reward=exact", "data.reward: unknown reward 'exact'", "arith"),
        ("data.schema=csv", "data.schema: unknown schema 'csv'", "records"),
        ("data.train_file=/no/such/file.jsonl", "data.train_file: file not found", ""),
    ],
)
def test_names_are_looked_up_when_the_run_is_set_up(override, start, listed):
    assert load_config(None, [override])  # the config itself holds any name: registries can grow
    message = _setup_error(override)
    assert message.startswith(start) and listed in message


def test_cuda_asked_for_and_not_visible_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _setup_error("run.device=cuda:1").startswith("run.device=cuda:1 but no CUDA device is visible")


def test_estimator_options_are_checked_against_the_estimator():
    # an EBPO option given to grpo: grpo's options are listed, under the key as it was given
    message = _setup_error("algorithm.estimator=grpo", "algorithm.estimator_options.normalize=prior")
    assert (
        "algorithm.estimator_options.normalize" in message
        and "algorithm.estimator_options.norm_by_std" in message
    )
    # an EBPO option set while another estimator runs would be ignored: refused, with the fix
    with pytest.raises(ConfigError, match=r"algorithm.ebpo .*set algorithm.estimator=ebpo"):
        load_config(None, ["algorithm.estimator=grpo", "algorithm.ebpo.normalize=prior"])


def test_ebpo_options_under_either_spelling():
    # algorithm.estimator_options.<option> (estimator ebpo) is read as algorithm.ebpo.<option>
    new = load_config(None, ["algorithm.ebpo.prior_memory=50", "algorithm.ebpo.tau2=latent"])
    old = load_config(
        None, ["algorithm.estimator_options.prior_memory=50", "algorithm.estimator_options.tau2=latent"]
    )
    assert new.to_dict() == old.to_dict()
    assert old.algorithm.ebpo.prior_memory == "50" and old.algorithm.ebpo.half_life == 50.0
    assert old.algorithm.estimator_options == {}
    assert old.algorithm.estimator_kwargs() == dataclasses.asdict(old.algorithm.ebpo)
    whole = load_config(
        None, ["algorithm.estimator_options={prior_scope: cluster}", "data.cluster_key=topic"]
    )
    assert whole.algorithm.ebpo.prior_scope == "cluster"
    # the estimator set later (in an override) decides what estimator_options means
    grpo = load_config("ebpo_topic", ["algorithm.estimator=grpo", "algorithm.estimator_options={eps: 0.5}"])
    assert grpo.algorithm.estimator_options == {"eps": 0.5} and grpo.algorithm.ebpo == EBPOOptions()
    rows = {key: (default, text) for key, default, text in describe()}
    assert (
        rows["algorithm.ebpo.prior_memory"][0] == "all"
        and "half-life" in rows["algorithm.ebpo.prior_memory"][1]
    )
    assert (
        "algorithm.estimator_options.<option> is read as algorithm.ebpo.<option>"
        in rows["algorithm.estimator_options"][1]
    )


def test_loss_options_under_either_spelling():
    new = load_config("dapo", ["algorithm.loss.dual_clip_c=null"])
    old = load_config("dapo", ["algorithm.loss_options.dual_clip_c=null"])
    assert new.to_dict() == old.to_dict()
    assert (new.algorithm.loss.clip_eps_high, new.algorithm.loss.dual_clip_c) == (0.28, None)
    # a whole mapping replaces the preset's options, under either spelling, as it always did
    whole = load_config("dapo", ["algorithm.loss_options={dual_clip_c: null}"])
    assert whole.algorithm.loss == PolicyLossOptions(dual_clip_c=None)


def test_the_later_layer_wins_whichever_spelling_each_uses(tmp_path):
    # ebpo_topic.yaml writes algorithm.ebpo.prior_scope; an override in the earlier spelling wins over it
    cfg = load_config("ebpo_topic", ["algorithm.estimator_options.prior_scope=cluster"])
    assert cfg.algorithm.ebpo.prior_scope == "cluster"
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "algorithm:\n  estimator_options: {normalize: prior}\n  loss_options: {clip_eps_high: 0.3}\n"
    )
    cfg = load_config(mine, ["algorithm.ebpo.normalize=group", "algorithm.loss.clip_eps_high=0.25"])
    assert cfg.algorithm.ebpo.normalize == "group" and cfg.algorithm.loss.clip_eps_high == 0.25
    # one file giving one option under both spellings is ambiguous: refused, naming both and the file
    both = tmp_path / "both.yaml"
    both.write_text("algorithm:\n  estimator_options: {normalize: prior}\n  ebpo: {normalize: group}\n")
    with pytest.raises(
        ConfigError, match=r"algorithm.estimator_options.normalize and algorithm.ebpo.normalize .*both.yaml"
    ):
        load_config(both)


OLD_LAYOUT = """\
algorithm:
  estimator: ebpo
  estimator_options:
    normalize: prior
    tau2: latent
  policy_loss: vanilla
  loss_agg_mode: token-mean
  loss_options:
    clip_eps_high: 0.28
    dual_clip_c: null
  kl_coef: 0.001
"""


def test_every_listed_key_and_its_earlier_spelling_reads_its_default():
    """Each key of --help-config, and algorithm.estimator_options.<option> / algorithm.loss_options.<option>
    for EBPO's and the loss's options, set to the default it lists (as it lists it) gives the default config."""
    reference = load_config().to_dict()
    for key, value, _ in describe():
        earlier = key.replace("algorithm.ebpo.", "algorithm.estimator_options.").replace(
            "algorithm.loss.", "algorithm.loss_options."
        )
        for spelling in dict.fromkeys([key, earlier]):
            assert load_config(None, [f"{spelling}={value}"]).to_dict() == reference, spelling


def test_a_run_saved_with_the_earlier_layout_resumes_as_it_was(tmp_path):
    """A run directory's config.yaml written with algorithm.estimator_options / loss_options is the base of
    --resume: read as the same config, and written back in the present layout."""
    base = settings.parse_yaml(OLD_LAYOUT)
    cfg = load_config(None, ["run.steps=200"], base=base)
    assert (cfg.algorithm.ebpo.normalize, cfg.algorithm.ebpo.tau2) == ("prior", "latent")
    assert (cfg.algorithm.loss.clip_eps_high, cfg.algorithm.loss.dual_clip_c) == (0.28, None)
    save_config(cfg, tmp_path / "config.yaml")
    saved = settings.read_yaml(tmp_path / "config.yaml")
    assert (
        saved["algorithm"]["ebpo"]["normalize"] == "prior" and saved["algorithm"]["estimator_options"] == {}
    )
    again = load_config(None, ["algorithm.estimator_options.normalize=group"], base=saved)
    assert again.algorithm.ebpo.normalize == "group" and again.algorithm.ebpo.tau2 == "latent"


def test_estimator_options_from_python_are_read_as_ebpo_options():
    algorithm = AlgorithmConfig(estimator_options={"normalize": "prior"})
    assert algorithm.ebpo.normalize == "prior" and algorithm.estimator_options == {}
    with pytest.raises(ConfigError, match=r"algorithm.estimator_options.tau2_floor: tau2_floor must be"):
        AlgorithmConfig(estimator_options={"tau2_floor": -1.0})
    with pytest.raises(
        ConfigError, match=r"algorithm.estimator_options \['prior_scop'\]: EBPO's options are"
    ):
        AlgorithmConfig(estimator_options={"prior_scop": "cluster"})


def test_cluster_prior_needs_cluster_keys():
    with pytest.raises(ConfigError, match="set data.cluster_key=topic"):
        load_config(None, ["algorithm.ebpo.prior_scope=cluster"])
    cfg = load_config(None, ["algorithm.ebpo.prior_scope=cluster", "data.cluster_key=topic"])
    assert cfg.data.cluster_key == "topic"


def test_micro_batch_must_divide_the_mini_batch():
    # mini-batch = 4 prompts x G = 8 -> 32 sequences: 8 divides it, 5 does not
    assert load_config(None, ["optim.micro_batch_size=8"]).optim.micro_batch_size == 8
    with pytest.raises(ConfigError, match=r"micro_batch_size \(5\) must divide .* = 32"):
        load_config(None, ["optim.micro_batch_size=5"])


def test_validate_checks_fields_set_by_hand():
    cfg = load_config()
    cfg.run.threads = -1
    with pytest.raises(ConfigError, match=r"run.threads must be >= 1"):
        cfg.validate()
    cfg = load_config()
    cfg.data.cluster_key = "source"  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"unknown data.cluster_key 'source'"):
        cfg.validate()
    cfg = load_config()
    cfg.algorithm.ebpo.tau2_floor = float("nan")
    with pytest.raises(ConfigError, match=r"algorithm.ebpo.tau2_floor must be a finite number"):
        cfg.validate()
    cfg = load_config()
    cfg.optim.mini_batch_size = 5
    with pytest.raises(ConfigError, match=r"optim.mini_batch_size"):
        cfg.validate()
    assert load_config().validate() == load_config()


def test_every_field_has_help_text():
    rows = describe()
    keys = [key for key, _, _ in rows]
    assert "algorithm.estimator" in keys and "run.seed" in keys and "optim.mini_batch_size" in keys
    assert "algorithm.ebpo.normalize" in keys and "algorithm.loss.clip_eps_high" in keys
    assert len(keys) == len(set(keys))
    missing = [key for key, _, text in rows if len(text) < 10]
    assert not missing, f"fields without help: {missing}"


def test_every_fixed_choice_is_a_literal():
    """A string option is a Literal (its choices checked where it is read), or a name looked up in a registry
    at setup, or free text (a path, a name, a device)."""
    registry_names = {
        "data.task",
        "data.schema",
        "data.reward",
        "data.sampler",
        "algorithm.estimator",
        "algorithm.policy_loss",
    }
    free_text = {"model.path", "data.train_file", "data.val_file", "run.out_dir", "run.name", "run.device"}
    plain = set()
    for key, f in settings.leaves(TrainConfig):
        section = TrainConfig
        for part in key.split(".")[:-1]:
            section = typing.get_type_hints(section)[part]
        hint = typing.get_type_hints(section)[f.name]
        if hint is str or (typing.get_origin(hint) is types.UnionType and str in typing.get_args(hint)):
            plain.add(key)
    assert plain == registry_names | free_text | {"algorithm.ebpo.prior_memory"}  # 'all' or a half-life


def test_all_presets_present():
    assert {p.stem for p in PRESETS} == PRESET_NAMES


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_presets_load_and_validate(path):
    cfg = load_config(path)
    text = path.read_text()
    assert "#" in text, f"{path.name} must say in comments how it scales the paper's settings"
    if path.stem == "dapo":
        assert cfg.algorithm.loss.clip_eps_low == 0.2
        assert cfg.algorithm.loss.clip_eps_high == 0.28
        assert cfg.algorithm.loss_agg_mode == "token-mean"
        assert cfg.algorithm.dynamic_sampling and cfg.algorithm.overlong_shaping
        assert cfg.algorithm.kl_coef == 0.0
    if path.stem == "grpo":
        assert cfg.algorithm.estimator == "grpo" and cfg.algorithm.loss_agg_mode == "seq-mean-token-mean"
    if path.stem == "dr_grpo":
        assert (
            cfg.algorithm.estimator == "dr_grpo" and cfg.algorithm.loss_agg_mode == "seq-mean-token-sum-norm"
        )
    if path.stem.startswith("entropymech"):
        assert cfg.algorithm.policy_loss == path.stem.removeprefix("entropymech_")
        assert cfg.algorithm.loss.cov_count == "stochastic"
    if path.stem == "ebpo_topic":
        assert cfg.data.sampler == "topic"
    if path.stem == "ebpo_diff":
        assert cfg.data.sampler == "difficulty"
    if path.stem == "gym":
        assert cfg.model.path == "builtin:gym" and cfg.data.task.startswith("gym:")
    setup.check_setup(cfg)  # its names found, its estimator's options taken
    setup.build_algorithm(cfg, torch.Generator())


def test_ebpo_preset_is_the_builtin_default():
    """`ebpo train` with no arguments and `--config ebpo` run the same thing."""
    assert load_config(PRESETS_DIR / "ebpo.yaml").to_dict() == load_config().to_dict()


# ---------------------------------------------------------------------------------------------------
# bad values end in one line that names the key and the fix, never a traceback


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("run.threads=-1", r"run.threads must be >= 1 \(or null for torch's choice\), got -1"),
        ("run.threads=0", r"run.threads must be >= 1"),
        ("optim.lr=inf", r"optim.lr must be a finite number, got inf"),
        ("optim.lr=.nan", r"optim.lr must be a finite number, got nan"),
        ("rollout.temperature=inf", r"rollout.temperature must be a finite number, got inf"),
        ("optim.betas=[0.9, .inf]", r"optim.betas\[1\] must be a finite number, got inf"),
        ("algorithm.estimator_options={eps: .inf}", r"algorithm.ebpo.eps must be a finite number"),
        ("optim.warmup_steps=-3", r"optim.warmup_steps must be >= 0 \(0 = constant lr\), got -3"),
        ("model.path=", r"model.path is empty; set a value, or model.path=null for the default"),
        ("data.train_file=", r"data.train_file is empty"),
        ("run.out_dir=", r"run.out_dir is empty; set a value \(default 'runs'\)"),
        ("optim.weight_decay=-1", r"optim.weight_decay must be >= 0, got -1.0"),
        ("optim.betas=[1.5, 0.9]", r"optim.betas must be two numbers in \[0, 1\) like \[0.9, 0.999\]"),
        ("optim.betas=[0.9]", r"optim.betas must be two numbers in \[0, 1\)"),
        ("optim.eps=0", r"optim.eps must be > 0 \(AdamW divides by sqrt\(v\) \+ eps\), got 0.0"),
        ("optim.eps=-1", r"optim.eps must be > 0"),
        ("run.seed=-1", r"run.seed must be in \[0, 4294967295\], got -1"),
        ("run.seed=4294967296", r"run.seed must be in \[0, 4294967295\]"),
    ],
)
def test_bad_values_name_the_key_and_the_fix(override, pattern):
    with pytest.raises(ConfigError, match=pattern) as err:
        load_config(None, [override])
    assert "\n" not in str(err.value)  # one line


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_group_size_one_with_a_group_relative_estimator_is_refused(estimator):
    # G = 1: each group's baseline is its only reward, so r - baseline = 0 for every sample
    message = _setup_error(f"algorithm.estimator={estimator}", "data.group_size=1")
    assert message.startswith("data.group_size=1") and repr(estimator) in message
    assert "data.group_size >= 2" in message and "algorithm.estimator=ebpo | jspo" in message


@pytest.mark.parametrize("estimator", ["ebpo", "jspo"])
def test_group_size_one_is_fine_where_the_baseline_pools_groups(estimator):
    # EBPO shrinks toward the global prior and JSPO toward the batch mean: a group of one still has a signal
    cfg = load_config(None, [f"algorithm.estimator={estimator}", "data.group_size=1"])
    setup.check_setup(cfg)
    assert setup.build_algorithm(cfg, torch.Generator()).estimator.name == estimator


def test_help_of_micro_batch_size_says_when_the_loss_changes():
    (text,) = [text for key, _, text in describe() if key == "optim.micro_batch_size"]
    assert "identical" not in text
    assert "clip_cov" in text and "kl_cov" in text


def test_aggregation_modes_and_kl_names_come_from_the_losses_module():
    import ebpo.losses as losses
    from ebpo.trainer import config

    assert not hasattr(config, "AGG_MODES") and not hasattr(config, "KL_ESTIMATORS")  # one source of truth
    assert set(typing.get_args(losses.KLEstimator)) == set(losses.KL_ESTIMATORS)
    for mode in losses.AGG_MODES:
        assert load_config(None, [f"algorithm.loss_agg_mode={mode}"]).algorithm.loss_agg_mode == mode
    for kind in losses.KL_ESTIMATORS:
        assert load_config(None, [f"algorithm.kl_estimator={kind}"]).algorithm.kl_estimator == kind
    with pytest.raises(ConfigError, match=r"unknown algorithm.kl_estimator 'k4'; valid choices: k1, k2, k3"):
        load_config(None, ["algorithm.kl_estimator=k4"])


def test_a_built_in_model_on_another_task_family_gets_one_note_naming_its_preset():
    """S2 on arith (``model.path=builtin:gym`` without ``--config gym``) is noted, with the preset that trains it
    on its own mixture; the same family with other options, a data file, or S1 on arith is not."""
    from ebpo.trainer.cli import task_note

    note = task_note(load_config(overrides=["model.path=builtin:gym"]))
    assert note == (
        "note: model.path is the built-in gym base model S2, made for gym tasks; this run trains it on "
        "data.task=arith (`ebpo train --config gym` trains it on its own)"
    )
    s1_on_gym = task_note(load_config(overrides=["model.path=builtin:arith", "data.task=gym:gcd"]))
    assert s1_on_gym is not None and s1_on_gym.endswith("(`ebpo train --config ebpo` trains it on its own)")
    for overrides in (
        [],
        ["model.path=builtin:gym", "data.task=gym:gcd"],
        ["model.path=builtin:gym", "data.train_file=problems.jsonl"],
    ):
        assert task_note(load_config(overrides=overrides)) is None, overrides
    assert task_note(load_config("gym")) is None
