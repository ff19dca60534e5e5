"""What decides the last bits of a training run on the CPU, and the portable mode that fixes them.

On x86-64 with torch's CPU wheel, the float rounding of a build depends on the recipe and on which kernels run
it. Three libraries choose kernels by the CPU they find: ATen (its own vectorised loops, by
``torch.backends.cpu.get_cpu_capability()``: DEFAULT, AVX2, AVX512), oneDNN (by its ISA) and MKL, whose matrix
products and vector-math functions dispatch on the CPU's vendor as well as its instruction set. So two
machines that report the same torch and the same ATen capability (an AMD EPYC and an Intel Xeon, both AVX512)
still train to different bits. :func:`platform_info` names all of it, the CPU included.

The portable mode gives one result on every x86-64 CPU with AVX2 (measured on an AMD EPYC and, emulated with
``qemu-x86_64 -cpu Haswell`` and ``-cpu EPYC-Rome``, on an Intel and an older AMD CPU; docs/base_model.md,
"Which CPUs reproduce a build"):

- :data:`PORTABLE_ENV` pins ATen to its AVX2 loops, oneDNN to AVX2 and MKL to its conditional numerical
  reproducibility mode ``COMPATIBLE``, whose matrix products give the same bits on Intel and AMD;
- :class:`PortableSqrt` computes square roots (Adam's denominator) as ``1 / rsqrt(x)`` with ATen's own
  kernels, whose IEEE division and square root round the same everywhere: MKL's vector-math ``sqrt``, which
  torch uses for float tensors, is not correctly rounded under ``COMPATIBLE`` and its last bit follows the
  CPU's approximation instructions.

The environment variables are read when torch loads (this module imports torch; ``ebpo.models.build``
imports it only when it needs it), so a portable computation runs in a process of its own
(:func:`run_portable`; ``ebpo.models.build.portable_prefix_sha256`` hashes a build's prefix so). It is
slower and rounds differently from a native run: it exists to check a recipe on any machine, not to train.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE"}
"""The kernel choices the portable mode pins, set in the environment of a fresh process."""

PORTABLE_CAPABILITY = "AVX2"
"""ATen's capability in portable mode; a CPU without AVX2 cannot take the portable kernels."""


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU as MKL's dispatch sees it: vendor, family and model (``AuthenticAMD family 26 model 2``).

    Read from ``/proc/cpuinfo`` (or the text given); on a system without it, :func:`platform.machine`.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            import platform

            return platform.machine() or "unknown"
    found: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key in ("vendor_id", "cpu family", "model") and key not in found:
            found[key] = value.strip()
        if not line.strip() and found:  # the first processor's block is enough
            break
    if "vendor_id" not in found:
        import platform

        return platform.machine() or "unknown"
    return f"{found['vendor_id']} family {found.get('cpu family', '?')} model {found.get('model', '?')}"


def platform_info() -> dict[str, str]:
    """What the bits of a native (unpinned) build depend on besides the recipe: torch, ATen's kernels, the CPU."""
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": cpu_name(),
    }


def platform_difference(recorded: dict[str, Any]) -> str | None:
    """Why a native result recorded on ``recorded``'s platform (a ``build_info.json``) cannot be expected to the
    bit here, naming each field that differs; None on the same platform."""
    here = platform_info()
    differs = [f"{k} {recorded.get(k)} there, {v} here" for k, v in here.items() if recorded.get(k) != v]
    if not differs:
        return None
    return "recorded on another platform (" + "; ".join(differs) + "): its kernels round differently"


def torch_release() -> str:
    """torch's version without its build label (``2.13.0`` for ``2.13.0+cpu``): what a portable result depends
    on, the CPU aside (ATen's AVX2 loops and the MKL torch bundles are those of the release)."""
    return torch.__version__.split("+")[0]


def portable_difference(recorded: dict[str, Any]) -> str | None:
    """Why a portable result recorded with ``recorded["portable_torch"]`` cannot be expected here; None when
    it can (any CPU with AVX2; :func:`run_portable` says when this one has none)."""
    if "portable_prefix_sha256" not in recorded:
        return "no portable prefix hash recorded"
    if recorded.get("portable_torch") != torch_release():
        return (
            f"the portable prefix was recorded on torch {recorded.get('portable_torch')}, here {torch_release()}: "
            "another release may round differently"
        )
    return None


class PortableSqrt(TorchDispatchMode):
    """Within it, ``torch.sqrt`` and its in-place and ``out=`` forms are ``1 / rsqrt(x)``: ATen's vector square
    root and division, IEEE-rounded on every CPU, instead of MKL's vector-math ``sqrt`` (``with PortableSqrt():``).
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.sqrt.default:
            return torch.reciprocal(torch.rsqrt(args[0]))
        if func is torch.ops.aten.sqrt.out:
            return torch.reciprocal(torch.rsqrt(args[0]), out=kwargs["out"])
        if func is torch.ops.aten.sqrt_.default:
            return args[0].rsqrt_().reciprocal_()
        return func(*args, **kwargs)


def run_portable(function: str, request: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Call ``function`` (``"module:name"``, taking and returning a JSON-able dict) in portable mode: in a fresh
    process with :data:`PORTABLE_ENV`, within :class:`PortableSqrt`.

    Returns ``(result, capability)``; ``(None, reason)`` when this machine cannot take the portable kernels
    (no AVX2: the reason names the capability it has). Raises ``RuntimeError`` if the process fails.
    """
    package_root = str(Path(__file__).resolve().parents[2])
    env = os.environ | PORTABLE_ENV
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "ebpo.models.kernels", function, json.dumps(request)],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the portable run of {function} failed (exit {done.returncode}): {tail}")
    answer = json.loads(lines[-1])
    return answer["result"], answer["capability"]


def _child(function: str, request: dict[str, Any]) -> dict[str, Any]:
    """The portable process: check that the pins took, then call ``function`` under :class:`PortableSqrt`."""
    import importlib

    capability = torch.backends.cpu.get_cpu_capability()
    if capability != PORTABLE_CAPABILITY:
        reason = f"this CPU runs ATen's {capability} kernels, not the {PORTABLE_CAPABILITY} ones the portable mode needs"
        return {"result": None, "capability": reason}
    module, name = function.split(":")
    call = getattr(importlib.import_module(module), name)
    with PortableSqrt():
        return {"result": call(request), "capability": capability}


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], json.loads(sys.argv[2]))), flush=True)
