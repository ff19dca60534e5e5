"""The build machinery every base-model recipe shares (``ebpo.models.recipes``: ``arith`` = S1, ``gym`` = S2):
a build that trains on one thread into a staging directory, the shipped build of a recipe's default config as
package data, the cache, the prefix hash the guard tests retrain, and ``check_base_model``'s full rebuild.

The default config of each recipe is built once and shipped with the package (``ebpo/models/arith_base/``,
``ebpo/models/gym_base/``, a few MB): :func:`build_base_model` returns that directory when its recorded recipe
key equals the current recipe's key, so nothing is trained at run time. Any other config is built into the cache
``$EBPO_CACHE/base_models/<recipe>-<key>`` (default ``~/.cache/ebpo``) and reused from there. A build always runs
on one torch thread: the weights depend on the thread count. :func:`check_base_model` (``ebpo base-model
--check``) rebuilds a recipe's default config and compares every tensor with the shipped one.

The recipe key (``config.key()``) hashes the config, the recipe's format version and what its generator and
teacher produce on a fixed sample: a change that changes the training data changes the key; an edit that does
not (a comment, a refactor) does not. What each recipe builds: docs/base_model.md (S1), docs/gym_base_model.md
(S2).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ebpo.models.recipes import RECIPES, default_config, recipe_of
from ebpo.persist import replace_dir

logger = logging.getLogger(__name__)

BUILD_INFO = "build_info.json"
PREFIX_STEPS = 25
"""The build records a hash of the weights after this many SFT steps: the guard test retrains that prefix."""
BUILD_THREADS = 1


def state_dict_sha256(model) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of every tensor of ``model.state_dict()``."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        array = tensor.detach().cpu().contiguous().numpy()
        digest.update(f"{name}|{array.dtype}|{tuple(array.shape)}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


# --- where models live --------------------------------------------------------------------------------


def cache_root() -> Path:
    """``$EBPO_CACHE`` or ``~/.cache/ebpo``."""
    return Path(os.environ.get("EBPO_CACHE", "~/.cache/ebpo")).expanduser()


def base_model_path(config: Any = None, cache_dir: str | Path | None = None) -> Path:
    """Where the cached build of ``config`` lives (built or not): ``<cache>/base_models/<recipe>-<key>``."""
    config = config or default_config()
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    return root / "base_models" / f"{recipe_of(config).name}-{config.key()}"


def is_built(path: Path) -> bool:
    """A finished build: ``build_info.json`` is written last, so its presence means the rest is there."""
    return (Path(path) / BUILD_INFO).is_file()


def load_build_info(path: str | Path) -> dict[str, Any]:
    """The ``build_info.json`` of a built model directory."""
    info_file = Path(path) / BUILD_INFO
    if not info_file.is_file():
        raise FileNotFoundError(
            f"{info_file} not found: not a finished base-model build (run `ebpo base-model`)"
        )
    return json.loads(info_file.read_text())


def shipped_model_path(config: Any = None) -> Path | None:
    """The shipped model directory if it holds a build of ``config`` (default recipe), else ``None``."""
    config = config or default_config()
    shipped = recipe_of(config).shipped_dir
    if not is_built(shipped):
        return None
    return shipped if load_build_info(shipped).get("key") == config.key() else None


def default_base_model_path() -> Path:
    """Path of the default base model: the shipped one when current, else its cache location."""
    return shipped_model_path() or base_model_path(default_config())


# --- build --------------------------------------------------------------------------------------------


class _OneThread:
    """Run a block on :data:`BUILD_THREADS` torch threads, then restore the previous count."""

    def __enter__(self):
        import torch

        self.previous = torch.get_num_threads()
        torch.set_num_threads(BUILD_THREADS)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.previous)


def platform_info() -> dict[str, str]:
    """What a native build's last bits depend on besides the recipe (:func:`ebpo.models.kernels.platform_info`)."""
    from ebpo.models.kernels import platform_info as info

    return info()


def train_prefix_sha256(config: Any = None, steps: int = PREFIX_STEPS) -> str:
    """Hash of the weights after the first ``steps`` SFT steps of ``config``'s build (same schedule)."""
    config = config or default_config()
    recipe = recipe_of(config)
    with _OneThread():
        model, tokenizer = recipe.new_model(config)
        recipe.train(model, tokenizer, config, progress=False, stop_after=steps)
    return state_dict_sha256(model)


def _config_from_dict(config_cls: type, values: dict[str, Any]) -> Any:
    """A recipe config from its ``asdict`` form read back from JSON (lists back to the tuples they were)."""
    defaults = config_cls()
    kwargs = {}
    for f in fields(config_cls):
        if f.name in values:
            value = values[f.name]
            kwargs[f.name] = tuple(value) if isinstance(getattr(defaults, f.name), tuple) else value
    return config_cls(**kwargs)


def _portable_prefix_child(request: dict[str, Any]) -> dict[str, Any]:
    """:func:`portable_prefix_sha256`'s work, in the portable process."""
    config = _config_from_dict(RECIPES.get(request["recipe"]).config_cls, request["config"])
    return {"sha256": train_prefix_sha256(config, request["steps"])}


def portable_prefix_sha256(config: Any, steps: int | None = None) -> tuple[str | None, str]:
    """:func:`train_prefix_sha256` in portable mode (``ebpo.models.kernels``): one value on every x86-64 CPU with
    AVX2. Returns ``(sha256, capability)``, or ``(None, reason)`` where this CPU cannot take the portable kernels."""
    from ebpo.models.kernels import run_portable

    request = {
        "recipe": recipe_of(config).name,
        "config": asdict(config),
        "steps": PREFIX_STEPS if steps is None else steps,
    }
    result, capability = run_portable("ebpo.models.build:_portable_prefix_child", request)
    return (result["sha256"] if result else None), capability


def _portable_prefix(config: Any, steps: int) -> dict[str, str]:
    """The prefix hash in portable mode and torch's release, as ``build_info.json`` records them; empty where
    this CPU cannot take the portable kernels."""
    from ebpo.models.kernels import torch_release

    sha, _ = portable_prefix_sha256(config, steps)
    return {"portable_prefix_sha256": sha, "portable_torch": torch_release()} if sha else {}


def _train(config: Any, progress: bool, describe_target: str, *, portable: bool = False):
    """The build proper: fresh model, prefix hash (also in portable mode when ``portable``), full SFT.
    Returns (model, tokenizer, info)."""
    recipe = recipe_of(config)
    started, cpu_started = time.perf_counter(), time.process_time()
    with _OneThread():
        model, tokenizer = recipe.new_model(config)
        n_params = sum(p.numel() for p in model.parameters())
        if progress:
            logger.info(
                f"building the {recipe.what} ({n_params / 1e6:.2f}M parameters, {config.steps} SFT steps, "
                f"one thread) into {describe_target}"
            )
        prefix = min(PREFIX_STEPS, config.steps)
        prefix_sha = train_prefix_sha256(config, prefix)  # what the guard test retrains
        portable_prefix = _portable_prefix(config, prefix) if portable else {}
        model, tokenizer = recipe.new_model(config)  # the full run starts from the same initial weights
        losses = recipe.train(model, tokenizer, config, progress=progress)
        weights_sha = state_dict_sha256(model)
    info = {
        "recipe": recipe.name,
        "config": asdict(config),
        "key": config.key(),
        "format_version": recipe.format_version,
        "num_parameters": n_params,
        "threads": BUILD_THREADS,
        **platform_info(),
        "prefix_steps": prefix,
        "prefix_sha256": prefix_sha,
        **portable_prefix,
        "weights_sha256": weights_sha,
        "loss_every_100_steps": losses[::100],
        "final_loss": losses[-1] if losses else None,
        "train_seconds": time.perf_counter() - started,
        "train_cpu_seconds": time.process_time() - cpu_started,
    }
    return model, tokenizer, info


def _save(model, tokenizer, info: dict[str, Any], path: Path) -> None:
    """Write the model, tokenizer and ``build_info.json`` (last) into a staging directory, then swap it into
    place (:func:`ebpo.persist.replace_dir`): an interrupted build leaves no half-written model, and
    concurrent builds do not clash (another build finished meanwhile, or ``--force``, is replaced whole)."""

    def fill(staging: Path) -> None:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / BUILD_INFO).write_text(json.dumps(info, indent=1) + "\n")

    replace_dir(path, fill)


def build_base_model(
    config: Any = None,
    *,
    force: bool = False,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    portable: bool = False,
) -> Path:
    """The directory of the base model of ``config`` (any recipe's config; default: S1's default, the shipped
    one); builds it if needed.

    Order: the shipped model if it holds ``config``'s recipe (unless ``force`` or ``out_dir``); else a
    finished build in ``out_dir`` or the cache with the same key (unless ``force``); else a new build
    there. The directory loads with ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``; its
    ``build_info.json`` holds the recipe, key, hashes, loss curve and the validation grid; with ``portable``
    (a build to ship: ``ebpo base-model --out``) also the prefix hash in portable mode, which
    ``check_base_model`` and the guard tests compare on any CPU.
    """
    config = config or default_config()
    if not force and out_dir is None:
        shipped = shipped_model_path(config)
        if shipped is not None:
            return shipped
    path = Path(out_dir) if out_dir is not None else base_model_path(config, cache_dir)
    if is_built(path) and not force and load_build_info(path).get("key") == config.key():
        if progress:
            logger.info(f"reusing the base model built in {path} (--force rebuilds)")
        return path

    started = time.perf_counter()
    model, tokenizer, info = _train(config, progress, str(path), portable=portable)
    grid = measure_grid(model, tokenizer, config, split="validation", progress=progress)
    info["grid_validation"] = grid
    info["build_seconds"] = time.perf_counter() - started
    _save(model, tokenizer, info, path)
    if progress:
        logger.info(f"built in {info['build_seconds']:.0f} s, final loss {info['final_loss']:.3f}: {path}")
    return path


def measure_grid(model, tokenizer, config: Any, *, split: str, progress: bool) -> dict[str, Any]:
    """The recipe's pass@1 / maj@n / greedy grid of ``model`` on ``split`` (``eval_per_cell`` problems per
    cell, ``eval_samples`` samples each at ``eval_temperature``, seeded by ``config.seed``); printed as tables
    when ``progress``. Empty when ``eval_per_cell`` is 0."""
    if config.eval_per_cell <= 0:
        return {}
    from ebpo.models.grid import grid_report

    grid = recipe_of(config).grid(model, tokenizer, config, split=split, progress=progress)
    if progress:
        logger.info(
            grid_report(grid, split=split, samples=config.eval_samples, temperature=config.eval_temperature)
        )
    return grid


def check_base_model(config: Any = None, *, progress: bool = True) -> tuple[list[str], list[str]]:
    """Rebuild ``config`` (default recipe) in full and compare it with the shipped build, tensor by tensor.

    Returns ``(problems, notes)``; notes only where this machine is not the build's platform. On the platform the build recorded (torch, ATen's kernels, the CPU:
    :func:`platform_info`) every difference is a problem. Elsewhere the full weights can differ in their last
    bits whatever the recipe, so their differences are notes, and what decides is the prefix hash in portable
    mode (``ebpo.models.kernels``), which holds on any CPU with AVX2: a portable prefix that differs from the
    recorded one is a problem everywhere.
    """
    import torch
    from safetensors.torch import load_file

    config = config or default_config()
    shipped = recipe_of(config).shipped_dir
    problems: list[str] = []
    notes: list[str] = []
    if not is_built(shipped):
        return [f"no shipped model in {shipped}"], notes
    shipped_info = load_build_info(shipped)
    if shipped_info.get("key") != config.key():
        problems.append(
            f"the shipped model's recipe key {shipped_info.get('key')} is not the current recipe's "
            f"{config.key()}: the recipe or the data changed since it was built"
        )
    here = platform_info()
    differs = {k: (shipped_info.get(k), v) for k, v in here.items() if shipped_info.get(k) != v}
    from ebpo.models.kernels import portable_difference

    recorded_portable = portable_difference(shipped_info) is None
    if not recorded_portable and "portable_prefix_sha256" in shipped_info:
        notes.append(f"portable prefix not checked: {portable_difference(shipped_info)}")
    if recorded_portable:
        portable, capability = portable_prefix_sha256(config, shipped_info.get("prefix_steps", PREFIX_STEPS))
        if portable is None:
            notes.append(f"portable prefix not checked: {capability}")
        elif portable != shipped_info["portable_prefix_sha256"]:
            problems.append(
                f"the hash after the first {PREFIX_STEPS} SFT steps in portable mode differs from the recorded "
                "one: the recipe's data, initialisation, optimizer or schedule changed"
            )
        elif differs:
            notes.append(
                f"the first {PREFIX_STEPS} SFT steps in portable mode equal the recorded ones bit for bit"
            )
    model, _, info = _train(config, progress, "memory (check)")
    rebuilt = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    saved = load_file(str(shipped / "model.safetensors"))
    weights: list[str] = []
    for name, tensor in saved.items():
        if name not in rebuilt:
            problems.append(f"tensor {name} is in the shipped model but not in the rebuild")
        elif rebuilt[name].shape != tensor.shape or not torch.equal(rebuilt[name], tensor):
            weights.append(f"tensor {name} differs")
    if info["weights_sha256"] != shipped_info.get("weights_sha256"):
        weights.append("the hash of the rebuilt weights differs from the recorded weights_sha256")
    if info["prefix_sha256"] != shipped_info.get("prefix_sha256"):
        weights.append(f"the hash after the first {PREFIX_STEPS} SFT steps differs from the recorded one")
    if not differs:
        problems.extend(weights)
    elif weights:
        notes.extend(weights)
        notes.append(
            "these differences are float rounding only if the portable prefix matched: this machine differs from "
            "the build's in "
            + ", ".join(f"{k} (built with {old}, here {new})" for k, (old, new) in differs.items())
        )
    if differs and not recorded_portable:
        problems.append(
            "this machine differs from the build's platform and the portable prefix could not be compared: "
            "nothing here can tell a changed recipe from float rounding"
        )
    return problems, notes
