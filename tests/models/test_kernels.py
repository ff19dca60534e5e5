"""``ebpo.models.kernels``: what decides a CPU run's bits, and the portable mode that fixes them."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
import torch

from ebpo.models import build as bm
from ebpo.models import kernels
from ebpo.models.recipes.arith import BaseModelConfig

AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
"""
INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Xeon\n"


def test_cpu_name_is_vendor_family_and_model_of_the_first_processor():
    assert kernels.cpu_name(AMD) == "AuthenticAMD family 26 model 2"
    assert kernels.cpu_name(INTEL) == "GenuineIntel family 6 model 143"
    assert kernels.cpu_name("processor : 0\nBogoMIPS : 50\n")  # no vendor line (an ARM board): the machine


def test_platform_info_names_torch_aten_kernels_and_cpu():
    info = kernels.platform_info()
    assert info == {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": kernels.cpu_name(),
    }
    assert kernels.platform_difference(info) is None
    reason = kernels.platform_difference(info | {"cpu": "GenuineIntel family 6 model 143"})
    assert "cpu GenuineIntel family 6 model 143 there" in reason and "torch" not in reason


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_portable_sqrt_is_one_over_rsqrt_within_an_ulp_of_the_exact_root(seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(1 + seed * 517, generator=generator) * 10.0 ** torch.randint(
        -8, 8, (1,), generator=generator
    )
    expected = torch.reciprocal(torch.rsqrt(x))
    exact = x.double().sqrt()
    with kernels.PortableSqrt():
        plain = torch.sqrt(x)
        method = x.sqrt()
        out = torch.empty_like(x)
        torch.sqrt(x, out=out)
        inplace = x.clone().sqrt_()
    for got in (plain, method, out, inplace):
        assert torch.equal(got, expected)
    ulp = torch.finfo(torch.float32).eps * exact.abs()
    assert ((plain.double() - exact).abs() <= ulp).all()


def test_adam_steps_under_portable_sqrt_stay_within_rounding_of_native_ones():
    torch.manual_seed(0)
    weights = [torch.randn(16, 8, requires_grad=True) for _ in range(2)]
    copies = [w.detach().clone().requires_grad_(True) for w in weights]
    for params, mode in ((weights, None), (copies, kernels.PortableSqrt())):
        optimizer = torch.optim.Adam(params, lr=1e-2)
        for step in range(3):
            torch.manual_seed(step)
            loss = sum((p * torch.randn_like(p)).sum() for p in params)
            optimizer.zero_grad()
            loss.backward()
            if mode is None:
                optimizer.step()
            else:
                with mode:
                    optimizer.step()
    for a, b in zip(weights, copies):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_config_survives_the_trip_to_the_portable_process():
    config = replace(BaseModelConfig(), steps=7, level_weights=(1.0, 2.0, 3.0, 4.0, 5.0))
    back = bm._config_from_dict(BaseModelConfig, json.loads(json.dumps(asdict(config))))
    assert back == config and back.key() == config.key()


def test_the_portable_process_takes_the_pinned_kernels():
    """The pins are set in the child's environment before torch loads there: it reports AVX2 whatever this
    process runs (AVX512 on a machine that has it), and hashes a two-step build."""
    sha, capability = bm.portable_prefix_sha256(replace(BaseModelConfig(), steps=2, eval_per_cell=0), 2)
    if sha is None:
        pytest.skip(capability)
    assert capability == kernels.PORTABLE_CAPABILITY
    assert len(sha) == 64 and int(sha, 16) >= 0


def test_a_portable_result_holds_for_the_torch_release_it_was_recorded_with():
    recorded = {"portable_prefix_sha256": "0" * 64, "portable_torch": kernels.torch_release()}
    assert kernels.portable_difference(recorded) is None
    assert "torch 2.0.0" in kernels.portable_difference(recorded | {"portable_torch": "2.0.0"})
    assert kernels.portable_difference({}) == "no portable prefix hash recorded"
    assert "+" not in kernels.torch_release() and torch.__version__.startswith(kernels.torch_release())
