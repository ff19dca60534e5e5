"""What the verl end-to-end tests share: launching ``python -m ebpo.integrations.verl`` (one process session
per run, its CPU time counted, nothing left behind), reading what verl wrote (its file logger's metrics, its
rollout dumps, the checkpoints) and the core estimator fed the same rewards (the state the prior must have).

Imported by the test modules of this folder (pytest puts it on ``sys.path``); no test lives here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

import ebpo
from ebpo.integrations import ESTIMATOR_STATE_FILE

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "examples" / "verl" / "cpu_quickstart.py"


def load_quickstart():
    """``examples/verl/cpu_quickstart.py``, the laptop command docs/integrations.md gives: tested as shipped."""
    spec = importlib.util.spec_from_file_location("cpu_quickstart", QUICKSTART)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


quickstart = load_quickstart()


def verl_config(*overrides: str):
    """verl's ``ppo_trainer.yaml`` composed with ``overrides``, as Hydra hands it to a launcher."""
    from hydra import compose, initialize_config_dir

    from ebpo.integrations.verl.main import _config_dir

    with initialize_config_dir(config_dir=_config_dir(), version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


# ---------------------------------------------------------------------------------------------------------
# a fresh interpreter's imports
# ---------------------------------------------------------------------------------------------------------
#: modules of verl's Ray trainer and workers: registering our estimators must not import them
HEAVY_MODULES = ("verl.trainer.ppo.ray_trainer", "verl.workers.engine", "verl.workers.engine_workers")

FRESH_IMPORT = f"""
import json, sys
import verl
from verl.trainer.ppo import core_algos
def state():
    ours = sorted(n for n, f in core_algos.ADV_ESTIMATOR_REGISTRY.items() if hasattr(f, "__ebpo_estimator__"))
    return {{"ours": ours, "heavy": [m for m in {HEAVY_MODULES!r} if m in sys.modules]}}
after_verl = state()
import ebpo.integrations.verl as v
print(json.dumps({{"after_verl": after_verl, "after_ebpo": {{**state(), "registered": v.REGISTERED}}}}))
"""


def fresh_import(**env: str) -> dict:
    """A fresh interpreter's ``import verl`` (verl loads the ``verl.plugins`` entry points, ours among them)
    then ``import ebpo.integrations.verl``: after each, our names in verl's advantage registry and which of
    :data:`HEAVY_MODULES` are loaded; after the second, ``REGISTERED``. ``env``: added to the environment,
    from which ``VERL_USE_EXTERNAL_MODULES`` and ``VERL_PLATFORM`` are removed."""
    clean = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_PLATFORM")}
    result = subprocess.run(
        [sys.executable, "-c", FRESH_IMPORT],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------
# one run of the entry point
# ---------------------------------------------------------------------------------------------------------
def session_pids(sid: int) -> list[int]:
    """Processes of session ``sid`` (the launched entry point and everything Ray started under it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class SessionCPU:
    """Samples the CPU time of every process of a session (Ray's workers are not our children, so
    ``os.times()`` misses them); the total loses at most the last sampling interval of each process."""

    def __init__(self, sid: int, interval: float = 0.25) -> None:
        self.sid, self.interval, self.seen = sid, interval, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for pid in session_pids(self.sid):
                self.seen[pid] = max(self.seen.get(pid, 0.0), _cpu_seconds(pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self.seen.values())


#: CPU seconds of every run's processes, by run name (tests print them beside their wall time)
CPU_SECONDS: dict[str, float] = {}


def entry_point(root: Path, name: str, steps: int, *overrides: str) -> list[str]:
    """``python -m ebpo.integrations.verl`` with the quickstart's overrides for ``root``, then ``overrides`` (a
    later value of a key wins; ``++key=value`` for the quickstart's ``+`` keys); its rollout dump goes to
    ``root/<name>-rollouts``, verl's file logger (:class:`Launch`) to ``root/<name>.metrics.jsonl``."""
    return [
        sys.executable,
        "-m",
        "ebpo.integrations.verl",
        *quickstart.verl_overrides(root, steps=steps, experiment=name, rollouts=f"{name}-rollouts"),
        "trainer.logger=[console,file]",
        *overrides,
    ]


class Launch:
    """``command`` in ``root`` in a process session of its own, its output in ``root/<name>.log``, verl's file
    logger writing to ``root/<name>.metrics.jsonl``. :meth:`wait` returns (exit code, output) once every
    process of the session is gone (killed after ``timeout``)."""

    def __init__(self, root: Path, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        self.root, self.name = root, name
        self.log = root / f"{name}.log"
        self.ray_tmp = tempfile.mkdtemp(prefix="ebpo-ray-", dir="/tmp")  # Ray's socket paths: < 107 bytes
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": self.ray_tmp}
        full_env["VERL_FILE_LOGGER_PATH"] = str(root / f"{name}.metrics.jsonl")
        # Ray's token authentication keeps one token per user (~/.ray/auth_token), which every cluster started
        # on the machine rewrites: clusters of other jobs running beside ours would lock our drivers out
        full_env["RAY_AUTH_MODE"] = "disabled"
        for key in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES"):
            full_env.pop(key, None)
        full_env.update(env or {})
        self.started = time.perf_counter()
        self._out = open(self.log, "w")
        self.process = subprocess.Popen(
            command,
            cwd=root,
            env=full_env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.cpu = SessionCPU(self.process.pid)

    def wait(self, timeout: float = 600) -> tuple[int, str]:
        try:
            code = self.process.wait(timeout=max(1.0, timeout - (time.perf_counter() - self.started)))
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            self.stop()
        assert not session_pids(self.process.pid), f"processes of {self.name} left behind"
        return code, self.log.read_text()

    def stop(self) -> None:
        """End every process of the session (Ray's own processes, then anything left)."""
        for attempt in range(50):
            pids = session_pids(self.process.pid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL if attempt > 20 else signal.SIGTERM)
                except OSError:
                    pass
            time.sleep(0.2)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if not self._out.closed:
            self._out.close()
            shutil.rmtree(self.ray_tmp, ignore_errors=True)
            CPU_SECONDS[self.name] = self.cpu.stop()
            WALL_SECONDS[self.name] = time.perf_counter() - self.started


#: wall seconds of every run, by name
WALL_SECONDS: dict[str, float] = {}


#: what Ray raises when its raylet did not register within its fixed 30 s (a machine too loaded)
RAY_START_TIMEOUT = "The current node timed out during startup"


class Lanes:
    """Runs, lane after lane at once: each lane starts its runs one after the other (a run of a lane may
    use what an earlier one of its lane wrote). A verl run spends much of its time waiting on its own
    processes, so two lanes keep 2 cores busy where one leaves them half idle.

    ``lanes``: lists of ``(name, root, command)`` or ``(name, root, command, env)``; :meth:`result` waits for
    one run and returns its (exit code, output)."""

    def __init__(self, lanes: list[list[tuple]], timeout: float = 900) -> None:
        self.lanes, self.timeout = lanes, timeout
        self.results: dict[str, tuple[int, str]] = {}
        self.done = {run[0]: threading.Event() for lane in lanes for run in lane}
        self.running: dict[str, Launch] = {}
        self._stopped = False
        self.threads = [threading.Thread(target=self._run, args=(lane,), daemon=True) for lane in lanes]

    def start(self) -> Lanes:
        for thread in self.threads:
            thread.start()
        return self

    def _run(self, lane: list[tuple]) -> None:
        for name, root, command, *env in lane:
            try:
                for _attempt in range(2):
                    if self._stopped:
                        raise RuntimeError("stopped")
                    self.running[name] = launch = Launch(root, name, command, *env)
                    self.results[name] = code, log = launch.wait(self.timeout)
                    # Ray gives its raylet a fixed 30 s to register; a loaded machine can miss it: once more
                    if code == 0 or RAY_START_TIMEOUT not in log:
                        break
                    launch.log.rename(launch.log.with_suffix(".first-attempt.log"))
            except BaseException as error:  # a run that could not start: the tests that need it fail
                self.results[name] = (-2, f"{type(error).__name__}: {error}")
            finally:
                self.done[name].set()

    def root_of(self, name: str) -> Path:
        """The folder run ``name`` ran in."""
        return next(run[1] for lane in self.lanes for run in lane if run[0] == name)

    def result(self, name: str) -> tuple[int, str]:
        """(exit code, output) of run ``name``, once it has ended."""
        self.done[name].wait()
        return self.results[name]

    def succeeded(self, *names: str) -> None:
        """Fail the calling test, with the end of the output, unless every run named ended with status 0."""
        for name in names:
            code, log = self.result(name)
            assert code == 0, f"run {name} ended with status {code}:\n{log[-4000:]}"

    def stop(self) -> None:
        self._stopped = True
        for launch in list(self.running.values()):
            launch.stop()
        for thread in self.threads:
            thread.join(timeout=60)


# ---------------------------------------------------------------------------------------------------------
# what verl wrote
# ---------------------------------------------------------------------------------------------------------
def step_metrics(path: Path) -> dict[int, dict[str, float]]:
    """verl's file logger (one JSON line per step: ``{"step": N, "data": {...}}``) -> {N: {key: value}}."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[int(row["step"])] = {k: v for k, v in row["data"].items() if isinstance(v, int | float)}
    return out


def dumped_rows(folder: Path) -> dict[int, list[dict]]:
    """verl's rollout dump (``trainer.rollout_data_dir``): {step: rows}. v1 sorts a step's rows by their key
    ``{uid}_{session}_{index}`` (a group's rows together, groups in uid order: the order prompts were fetched);
    the legacy trainer writes them in the order the batch was trained."""
    out = {}
    for path in folder.glob("*.jsonl"):
        out[int(path.stem)] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def step_rewards(folder: Path) -> dict[int, torch.Tensor]:
    """verl's dumped rollouts: {step: rewards in dump order}."""
    return {
        step: torch.tensor([row["score"] for row in rows], dtype=torch.float32)
        for step, rows in dumped_rows(folder).items()
    }


CHATML_TURN = re.compile(r"user\n(.*)\nassistant", re.S)
"""A prompt rendered by ChatML (S2's template) as verl dumps it: decoded without its special tokens."""


def dumped_prompt(text: str) -> str:
    """The user's message of a prompt verl dumped (``input``): the text itself under the quickstart model's bare
    template, the user turn of S2's ChatML rendering (``<|im_start|>`` / ``<|im_end|>`` dropped by the decode)."""
    match = CHATML_TURN.fullmatch(text.strip())
    return match.group(1).strip() if match else text.strip()


def step_prompts(folder: Path, n: int) -> dict[int, list[str]]:
    """verl's dumped rollouts: {step: the step's prompts in dump order}, one per group of ``n`` rows."""
    out = {}
    for step, rows in dumped_rows(folder).items():
        prompts = [row["input"].strip() for row in rows]
        assert all(prompts[i] == prompts[i - i % n] for i in range(len(prompts))), (folder, step)
        out[step] = prompts[::n]
    return out


def step_groups(folder: Path) -> dict[int, list[tuple[str, list[tuple[str, float]]]]]:
    """{step: [(prompt, sorted (response, reward) pairs of its group)] in group order}: what a step sampled
    and scored, independent of the order of a group's rows (verl numbers sessions as requests arrive)."""
    out = {}
    for step, rows in dumped_rows(folder).items():
        groups: dict[str, list[dict]] = defaultdict(list)
        for row in rows:
            groups[row["uid"].rsplit("_", 2)[0] if "_" in row["uid"] else row["uid"]].append(row)
        out[step] = [
            (members[0]["input"], sorted((row["output"], row["score"]) for row in members))
            for members in groups.values()
        ]
    return out


def stream_prompts(root: Path, kind: str, batch: int, steps: int, seed: int = 0) -> list[list[str]]:
    """Prompts of the first ``steps`` batches of ebpo's own ``kind`` stream (``topic`` / ``difficulty``) over
    the training parquet: what verl must draw through ``data.sampler``."""
    import pandas as pd

    from ebpo.data.samplers import get_sampler

    frame = pd.read_parquet(root / "train.parquet")
    prompts = [row[0]["content"].strip() for row in frame["prompt"]]
    stream = get_sampler(kind, [info[kind] for info in frame["extra_info"]], batch, seed=seed)
    return [[prompts[i] for i in stream.next_batch()] for _ in range(steps)]


def saved_state(root: Path, step: int, ckpt: str = "ckpt", name: str = "ebpo") -> dict:
    """Estimator ``name``'s state (EBPO's: global prior, cluster priors) in
    ``root/ckpt/global_step_<step>/ebpo_estimator.pt``."""
    state = torch.load(root / ckpt / f"global_step_{step}" / ESTIMATOR_STATE_FILE, weights_only=False)
    return state[name]["state"]


def saved_prior(root: Path, step: int, ckpt: str = "ckpt") -> dict:
    """The estimator's global prior in ``root/ckpt/global_step_<step>/ebpo_estimator.pt``."""
    return saved_state(root, step, ckpt)["prior"]


def actor_weights(root: Path, step: int, ckpt: str = "ckpt") -> dict[str, torch.Tensor]:
    """The actor's parameters in a 1-rank checkpoint (FSDP2 writes DTensors; one rank holds them whole)."""
    state = torch.load(
        root / ckpt / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt", weights_only=False
    )
    return {name: getattr(value, "_local_tensor", value).clone() for name, value in state.items()}


def replay_estimator(
    steps: list[tuple[list[tuple[torch.Tensor, Any]], torch.Tensor, list | None]], n: int, **options
):
    """The core estimator fed, step by step, the groups the replay buffer cleared (``observe``: each a
    ``(rewards, cluster key or None)``) and then the batch (group of row i = i // n; ``cluster``: one key per
    row, or None): the state the adapter's estimator must have."""
    est = ebpo.get_estimator("ebpo", **options)
    for observed, rewards, cluster in steps:
        for group, key in observed:
            index = torch.zeros(len(group), dtype=torch.long)
            est.observe(group, index, cluster=None if key is None else [key] * len(group))
        est(rewards, torch.arange(len(rewards)) // n, cluster=cluster)
    return est


def replay(
    steps: list[tuple[list[tuple[torch.Tensor, Any]], torch.Tensor, list | None]], n: int, **options
) -> dict:
    """The global prior of :func:`replay_estimator`."""
    return replay_estimator(steps, n, **options).state_dict()["prior"]


def assert_prior_equal(saved, expected, path: str = "prior") -> None:
    """Equal structure, numbers equal to float64 rounding (groups are visited in another order)."""
    if isinstance(expected, dict):
        assert set(saved) == set(expected), path
        for key in expected:
            assert_prior_equal(saved[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list | tuple):
        assert len(saved) == len(expected), path
        for i, (a, b) in enumerate(zip(saved, expected)):
            assert_prior_equal(a, b, f"{path}[{i}]")
    elif isinstance(expected, int | float | torch.Tensor):
        assert float(saved) == pytest.approx(float(expected), rel=1e-9, abs=1e-12), path
    else:
        assert saved == expected, path


def slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against 1, 2, ... (reward per step)."""
    steps = range(1, len(values) + 1)
    mean_step, mean_value = (len(values) + 1) / 2, sum(values) / len(values)
    return sum((s - mean_step) * (v - mean_value) for s, v in zip(steps, values)) / sum(
        (s - mean_step) ** 2 for s in steps
    )


# ---------------------------------------------------------------------------------------------------------
# EBPO by hand (docs/design.md §1), for groups of any sizes
# ---------------------------------------------------------------------------------------------------------
class LoopEBPO:
    """EBPO with its default options (global prior over all history, raw tau2, total sigma2, batch
    normalisation) written as plain loops over Python floats, the reference the verl paths are held to.

    A call takes one step's groups, ``{group id: [rewards of its valid rows]}`` (any sizes >= 1), and returns
    ``{group id: [advantages]}`` in the same order:
    1. every reward joins the history of rewards, every group mean the history of group means;
    2. mu_glob = mean(rewards seen), sigma2 = their sample variance, tau2 = the group means' (0 below 2);
    3. S_m = (sigma2 / G_m) / (sigma2 / G_m + tau2) (0 when that denominator is 0),
       V_m = (1 - S_m) mean_m + S_m mu_glob, a = r - V_m;
    4. A = (a - mean a) / (std a + eps) over the step's rows (std with N - 1; A = 0 for N < 2).
    """

    def __init__(self, eps: float = 1e-6) -> None:
        self.rewards: list[float] = []
        self.means: list[float] = []
        self.eps = eps

    @staticmethod
    def _variance(values: list[float]) -> float:
        if len(values) < 2:
            return 0.0
        mean = sum(values) / len(values)
        return sum((v - mean) ** 2 for v in values) / (len(values) - 1)

    def __call__(self, groups: dict) -> dict:
        for rewards in groups.values():
            self.rewards.extend(rewards)
            self.means.append(sum(rewards) / len(rewards))
        mu_glob = sum(self.rewards) / len(self.rewards)
        sigma2, tau2 = self._variance(self.rewards), self._variance(self.means)
        raw = {}
        for uid, rewards in groups.items():
            noise = sigma2 / len(rewards)
            shrinkage = noise / (noise + tau2) if noise + tau2 > 0 else 0.0
            baseline = (1 - shrinkage) * sum(rewards) / len(rewards) + shrinkage * mu_glob
            raw[uid] = [r - baseline for r in rewards]
        flat = [a for values in raw.values() for a in values]
        if len(flat) < 2:
            return {uid: [0.0] * len(values) for uid, values in raw.items()}
        mean = sum(flat) / len(flat)
        std = self._variance(flat) ** 0.5
        return {uid: [(a - mean) / (std + self.eps) for a in values] for uid, values in raw.items()}


def random_uneven_step(gen: torch.Generator, step: int, width: int = 5):
    """A step of 1-5 groups of 2-6 responses (shaped rewards), interleaved, with responses rejected at random
    (their whole mask zeroed, as verl's rollout-correction rejection does), so a group keeps 0..G rows, and a
    few responses with only some tokens masked (token-level rejection: they keep their reward).
    Returns ``(rewards_N, mask_BT, uids, token_rewards_BT)``: the reward sits on the last token of each
    response's original length."""
    num_groups = int(torch.randint(1, 6, (1,), generator=gen))
    sizes = torch.randint(2, 7, (num_groups,), generator=gen).tolist()
    uids = [f"s{step}g{g}" for g, size in enumerate(sizes) for _ in range(size)]
    order = torch.randperm(len(uids), generator=gen).tolist()
    uids = [uids[i] for i in order]
    n = len(uids)
    rewards_N = torch.randint(0, 2, (n,), generator=gen).float() + 0.5 * torch.rand(n, generator=gen)
    lengths_N = torch.randint(1, width + 1, (n,), generator=gen)
    mask_BT = (torch.arange(width).unsqueeze(0) < lengths_N.unsqueeze(1)).float()
    token_BT = torch.zeros(n, width)
    token_BT[torch.arange(n), lengths_N - 1] = rewards_N
    rejected_N = torch.rand(n, generator=gen) < 0.35
    mask_BT[rejected_N] = 0.0
    partial_N = ~rejected_N & (lengths_N > 1) & (torch.rand(n, generator=gen) < 0.3)
    mask_BT[partial_N, 0] = 0.0  # one token of the response rejected: the row still trains
    return rewards_N, mask_BT, uids, token_BT


def loop_advantages(
    reference: LoopEBPO, rewards_N: torch.Tensor, mask_BT: torch.Tensor, uids: list
) -> torch.Tensor:
    """Per-row advantages by :class:`LoopEBPO` over the rows with a trainable token; 0 for the others."""
    valid = (mask_BT.sum(-1) > 0).tolist()
    groups: dict = {}
    for i, uid in enumerate(uids):
        if valid[i]:
            groups.setdefault(uid, []).append(float(rewards_N[i]))
    out = torch.zeros(len(uids), dtype=torch.float64)
    if groups:
        advantages = reference(groups)
        taken = defaultdict(int)
        for i, uid in enumerate(uids):
            if valid[i]:
                out[i] = advantages[uid][taken[uid]]
                taken[uid] += 1
    return out
