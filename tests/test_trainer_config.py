"""Trainer configuration: YAML + dotted overrides, type checks, validation messages, the presets."""

from __future__ import annotations

from pathlib import Path

import pytest

from ebpo.errors import ConfigError
from ebpo.trainer.config import (
    PRESETS_DIR,
    TrainConfig,
    apply_overrides,
    describe,
    from_dict,
    load_config,
    parse_override,
)

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted(PRESETS_DIR.glob("*.yaml"))
PRESET_NAMES = {
    "ebpo",
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
    assert cfg.algorithm.estimator_options == {"eps": 0.001}  # dict keys nest and merge
    assert cfg.run.steps == 7 and isinstance(cfg.run.steps, int)
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)  # an int widens to a float field
    assert cfg.data.batch_size == TrainConfig().data.batch_size  # untouched keys keep their defaults


def test_parse_override_values_are_yaml():
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
    assert apply_overrides({"a": {"x": 1}}, ["a.y=2"]) == {"a": {"x": 1, "y": 2}}


def test_unknown_key_names_the_valid_keys():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.temprature=0.8"])
    message = str(err.value)
    assert "rollout.temprature" in message and "rollout.temperature" in message and "rollout.top_p" in message
    with pytest.raises(ConfigError, match="valid keys: model, data, rollout, algorithm, optim, run"):
        from_dict({"trainer": {}})


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"optim.learning_rate.*optim.lr.*bad.yaml"):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("algorithm.estimator=ppo", r"unknown estimator 'ppo'.*valid choices: .*dr_grpo, ebpo, grpo"),
        ("algorithm.policy_loss=dpo", r"unknown policy loss 'dpo'.*valid choices: clip_cov, kl_cov, vanilla"),
        ("algorithm.loss_agg_mode=sum", r"unknown aggregation mode 'sum'.*token-mean"),
        ("data.sampler=shuffle", r"unknown sampler 'shuffle'.*difficulty, random, topic"),
        ("data.cluster_key=source", r"unknown cluster key 'source'.*none, topic"),
        ("data.task=gsm8k", r"unknown task 'gsm8k'.*arith"),
        ("data.reward=exact", r"unknown reward 'exact'.*arith"),
        ("algorithm.loss_options={clip_ratio: 0.2}", r"unknown field\(s\) \['clip_ratio'\].*clip_eps_high"),
        ("algorithm.loss_options={max_response_len: 9}", r"max_response_len"),
        ("algorithm.estimator_options={prior_scop: cluster}", r"rejected by 'ebpo'"),
        ("run.steps=1.5", r"run.steps must be an integer, got 1.5"),
        ("optim.lr=fast", r"optim.lr must be a number, got 'fast'"),
        ("run.progress=yes please", r"run.progress must be true or false"),
        ("data.batch_size=6", r"multiple of optim.mini_batch_size \(4\); e.g. set optim.mini_batch_size=3"),
        ("run.eval_k=64", r"run.eval_k \(64\) must be <= run.eval_n"),
        ("rollout.top_p=0", r"rollout.top_p must be in \(0, 1\]"),
        ("rollout.temperature=0", r"rollout.temperature must be > 0"),
        ("data.group_size=0", r"data.group_size must be >= 1"),
        ("data.train_file=/no/such/file.jsonl", r"data.train_file: file not found"),
        ("run.device=tpu", r"run.device must be auto \| cpu \| cuda"),
    ],
)
def test_validation_messages_say_the_fix(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(None, [override])


def test_estimator_options_name_the_key_at_fault_and_list_the_options():
    # algorithm.estimator_options is checked key by key against the estimator's options (EBPO's are the fields
    # of ebpo.advantages.EBPOOptions), and the message names algorithm.estimator_options.<key>
    ebpo_keys = "prior_scope, cluster_min_groups, prior_memory, tau2, tau2_floor, sigma2, normalize, eps"
    listed = ", ".join(f"algorithm.estimator_options.{key}" for key in ebpo_keys.split(", "))
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.estimator_options.prior_scop=cluster"])
    assert str(err.value) == (
        f"algorithm.estimator_options.prior_scop is rejected by 'ebpo': not one of its options ({listed})"
    )
    with pytest.raises(
        ConfigError, match=r"^algorithm.estimator_options.tau2_floor: tau2_floor must be >= 0"
    ):
        load_config(None, ["algorithm.estimator_options.tau2_floor=-1"])
    with pytest.raises(ConfigError, match=r"^algorithm.estimator_options.prior_memory: prior_memory must be"):
        load_config(None, ["algorithm.estimator_options.prior_memory=forever"])
    with pytest.raises(
        ConfigError, match=r"rejected by 'grpo': .*\(algorithm.estimator_options.norm_by_std, "
    ):
        load_config(None, ["algorithm.estimator=grpo", "algorithm.estimator_options.normalize=prior"])
    assert load_config(None, ["algorithm.estimator_options.prior_memory=50"]).algorithm.estimator_options == {
        "prior_memory": 50  # kept as written: the estimator reads a half-life of 50 steps
    }
    # --help-config lists each of EBPO's options with its default and its one help text
    rows = {key: (default, text) for key, default, text in describe()}
    assert rows["algorithm.estimator_options.prior_memory"][0] == "'all'"
    assert "half-life" in rows["algorithm.estimator_options.prior_memory"][1]


def test_cluster_prior_needs_cluster_keys():
    with pytest.raises(ConfigError, match="set data.cluster_key=topic"):
        load_config(None, ["algorithm.estimator_options={prior_scope: cluster}"])
    cfg = load_config(None, ["algorithm.estimator_options={prior_scope: cluster}", "data.cluster_key=topic"])
    assert cfg.data.cluster_key == "topic"


def test_micro_batch_must_divide_the_mini_batch():
    # mini-batch = 4 prompts x G = 8 -> 32 sequences: 8 divides it, 5 does not
    assert load_config(None, ["optim.micro_batch_size=8"]).optim.micro_batch_size == 8
    with pytest.raises(ConfigError, match=r"micro_batch_size \(5\) must divide .* = 32"):
        load_config(None, ["optim.micro_batch_size=5"])


def test_every_field_has_help_text():
    rows = describe()
    keys = [key for key, _, _ in rows]
    assert "algorithm.estimator" in keys and "run.seed" in keys and "optim.mini_batch_size" in keys
    assert len(keys) == len(set(keys))
    missing = [key for key, _, text in rows if len(text) < 10]
    assert not missing, f"fields without help: {missing}"


def test_all_presets_present():
    assert {p.stem for p in PRESETS} == PRESET_NAMES


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_presets_load_and_validate(path):
    cfg = load_config(path)
    text = path.read_text()
    assert "#" in text, f"{path.name} must say in comments how it scales the paper's settings"
    if path.stem == "dapo":
        assert cfg.algorithm.loss_options["clip_eps_low"] == 0.2
        assert cfg.algorithm.loss_options["clip_eps_high"] == 0.28
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
    if path.stem == "ebpo_topic":
        assert cfg.data.sampler == "topic"
    if path.stem == "ebpo_diff":
        assert cfg.data.sampler == "difficulty"


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
    with pytest.raises(ConfigError, match=rf"data.group_size=1.*'{estimator}'.*all-zero advantages") as err:
        load_config(
            None, [f"algorithm.estimator={estimator}", "data.group_size=1", "optim.micro_batch_size=null"]
        )
    assert "data.group_size >= 2" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("estimator", ["ebpo", "jspo"])
def test_group_size_one_is_fine_where_the_baseline_pools_groups(estimator):
    # EBPO shrinks toward the global prior and JSPO toward the batch mean: a group of one still has a signal
    cfg = load_config(None, [f"algorithm.estimator={estimator}", "data.group_size=1"])
    assert cfg.data.group_size == 1


def test_help_of_micro_batch_size_says_when_the_loss_changes():
    (text,) = [text for key, _, text in describe() if key == "optim.micro_batch_size"]
    assert "identical" not in text
    assert "clip_cov" in text and "kl_cov" in text


def test_aggregation_modes_and_kl_names_come_from_the_losses_module():
    import ebpo.losses as losses
    from ebpo.trainer import config

    assert not hasattr(config, "AGG_MODES") and not hasattr(config, "KL_ESTIMATORS")  # one source of truth
    for mode in losses.AGG_MODES:
        assert load_config(None, [f"algorithm.loss_agg_mode={mode}"]).algorithm.loss_agg_mode == mode
    for kind in losses.KL_ESTIMATORS:
        assert load_config(None, [f"algorithm.kl_estimator={kind}"]).algorithm.kl_estimator == kind
    with pytest.raises(ConfigError, match=r"unknown KL estimator 'k4'.*valid choices: k1, k2, k3"):
        load_config(None, ["algorithm.kl_estimator=k4"])
