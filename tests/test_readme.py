"""Every shell command README.md shows in a code block runs as printed, in `make demo`'s environment.

The commands are read from README itself, so a command added there has to be given a plan here: run (as printed,
in an empty directory, with `.venv/bin` on the PATH as `source .venv/bin/activate` puts it, which the suite
does for every test: tests/conftest.py), or skipped with its reason (a clone, the hub, another environment, the
suite itself). What a run may add is named beside it and is only ever more `KEY=VALUE` overrides or flags after
the command as printed, which override its defaults: fewer steps and validation problems for a run README
describes at full length, so the test holds that the command starts, trains and finishes, not its figures
(those are docs/training.md's and tests/models/test_shipped.py's). A placeholder a command names (`my.yaml`,
`DIR`, `train.jsonl`, `my_estimators.py`) is made first, under that name.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

# a run of `ebpo train` shortened: two steps of 2 prompts, 9 validation problems x 2 samples, no plot
SHORT_TRAIN = "run.steps=2 data.batch_size=2 data.val_size=9 run.eval_n=2 run.eval_k=2 optim.mini_batch_size=2 run.plot=false"
SHORT_DIAGNOSE = "-M 4 -R 2 -W 1 -G 2 4 --reference-samples 4 --quiet"


def shell_commands(text: str) -> list[str]:
    """Each command of README's ```bash blocks, as a reader copies it: comments after it dropped, a line ending
    in a backslash joined to the next."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", "", block)
        for line in joined.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()  # README's comments follow two or more spaces
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


@dataclass(frozen=True)
class Plan:
    skip: str | None = None
    """Why it is not run here; None: it runs."""
    extra: str = ""
    """What is added after the command as printed (overrides, flags), and only that."""
    env: dict[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    """Placeholders the command names, made before it runs (see :func:`_make`)."""


PLANS: dict[str, Plan] = {
    "git clone <this repository> ebpo && cd ebpo": Plan(
        skip="a clone: the network, and this checkout is one"
    ),
    "make demo": Plan(skip="builds the environment this test runs in (and then runs `ebpo train`, below)"),
    "make test": Plan(skip="the suite this test belongs to"),
    "ebpo train": Plan(extra=SHORT_TRAIN),
    "ebpo train --config grpo run.steps=100": Plan(extra=SHORT_TRAIN),
    "ebpo train --config my.yaml model.path=DIR data.train_file=train.jsonl data.reward=math": Plan(
        extra=SHORT_TRAIN, files=("my.yaml", "DIR", "train.jsonl")
    ),
    "ebpo eval ckpt/a ckpt/b --n 32": Plan(
        skip="loads the five evaluation sets from the Hugging Face hub, and ckpt/a, ckpt/b are your models "
        "(tests/eval/test_cli.py runs ebpo eval on our copies of the sets)"
    ),
    "ebpo train data.task=gym:chain_sum,gcd": Plan(extra=SHORT_TRAIN),
    "ebpo train 'run.report_to=[tensorboard,wandb,mlflow]'": Plan(
        extra=SHORT_TRAIN,
        env={"WANDB_MODE": "offline"},  # no wandb login here: README's offline mode
    ),
    "ebpo diagnose --plugins my_estimators.py --estimators grpo ebpo median_baseline": Plan(
        extra=SHORT_DIAGNOSE, files=("my_estimators.py",)
    ),
    "ebpo --version; ebpo train --help-config": Plan(),
    'pip install ".[verl]"': Plan(
        skip="installs into an environment of its own (make verl-env), from the network"
    ),
    "python -m verl.trainer.main_ppo algorithm.adv_estimator=ebpo "
    "trainer.checkpoint_callback_class=ebpo.integrations.verl.EBPOCheckpointCallback ...": Plan(
        skip="verl's launcher with your overrides (`...`), in .venv-verl: tests/integrations/verl runs it"
    ),
    ".venv-verl/bin/python examples/verl/cpu_quickstart.py --out runs/verl-cpu": Plan(
        skip="runs in .venv-verl for a few minutes: tests/integrations/verl (make test-verl) runs it"
    ),
    "make lint": Plan(skip="ruff and mypy over the tree, not a command of the package"),
    "make bench": Plan(skip="speed benchmarks, minutes, in both environments (docs/benchmarks.md)"),
}


def _make(name: str, where: Path) -> None:
    """The placeholder ``name`` as a reader of README would have it."""
    if name == "my.yaml":  # a YAML file with a subset of the keys
        (where / name).write_text("algorithm:\n  estimator: grpo\n")
    elif name == "DIR":  # a model directory: the shipped base model's files
        shutil.copytree(REPO / "src" / "ebpo" / "models" / "arith_base", where / name)
    elif name == "train.jsonl":  # prompts and answers, math-verify's reward scores them
        rows = [
            f'{{"id": "sum-{a}-{b}", "prompt": "{a} + {b}=", "answer": "{a + b}"}}'
            for a in range(8)
            for b in range(5)
        ]
        (where / name).write_text("\n".join(rows) + "\n")
    elif name == "my_estimators.py":  # docs/extending.md's example
        shutil.copy(REPO / "tests" / "fixtures" / "my_estimators.py", where / name)
    else:
        raise AssertionError(f"no recipe for the placeholder {name!r}")


def test_every_command_readme_shows_has_a_plan():
    shown = shell_commands(README.read_text())
    assert shown, "no ```bash block found in README.md"
    assert sorted(set(shown) - set(PLANS)) == [], "README shows a command this test has no plan for"
    assert sorted(set(PLANS) - set(shown)) == [], "a plan for a command README no longer shows"


def test_readme_says_how_the_commands_are_found_after_make_demo():
    text = README.read_text()
    assert "source .venv/bin/activate" in text and ".venv/bin/ebpo" in text


RUN = [command for command, plan in PLANS.items() if plan.skip is None]


@pytest.mark.slow
@pytest.mark.parametrize("command", RUN)
def test_a_readme_command_runs_as_printed(command, tmp_path):
    plan = PLANS[command]
    for name in plan.files:
        _make(name, tmp_path)
    env = {**os.environ, **plan.env}
    env.pop("MLFLOW_TRACKING_URI", None)  # a fresh shell: the defaults README describes
    env.pop("WANDB_DIR", None)
    assert shutil.which("ebpo", path=env["PATH"]), "`ebpo` is not on the PATH of an activated .venv"
    proc = subprocess.run(
        ["bash", "-c", f"{command} {plan.extra}".strip()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr
    left = sorted(p.name for p in tmp_path.iterdir()) if tmp_path.exists() else []
    # what a run writes is under runs/ (or the placeholders the command was given), never loose in the directory
    assert set(left) <= {"runs", *plan.files}, left
