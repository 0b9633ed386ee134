"""csrc/fma_linear.c: bf16 products of 5+ rows by FMA on widened weights, built where torch's bf16 matmul is its
generic loop (AVX2 without AVX512-BW or AVX-NE-CONVERT). Tested on an AVX2 (-march=haswell) build on every
x86-64 machine, against float64 products of the same bf16 inputs; the baseline x86-64 build has no kernel."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tgictl.kernels import linear as linear_module
from tgictl.kernels.native import NativeKernels, _bind, _build, cpu_flags, load_native_kernels

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64" or "avx2" not in cpu_flags().split(),
                                reason="the kernel is AVX2 code")


@pytest.fixture(scope="module")
def haswell(tmp_path_factory: pytest.TempPathFactory) -> NativeKernels:
    return _bind(_build("cc", tmp_path_factory.mktemp("kernels-haswell"), march="haswell"))


def _exact(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("m", [5, 8, 17, 64, 70, 131])
@pytest.mark.parametrize(("n", "k"), [(1, 16), (2, 48), (3, 64), (47, 576), (100, 160), (577, 1536)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_products_equal_float64_rounded_once(haswell: NativeKernels, m: int, n: int, k: int,
                                             with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=generator).bfloat16()
    w = (torch.randn(n, k, generator=generator) * 0.1).bfloat16()
    bias = torch.randn(n, generator=generator).bfloat16() if with_bias else None
    out = haswell.fma_linear(x, w, bias)
    assert out is not None and out.dtype == torch.bfloat16 and out.shape == (m, n)
    exact = _exact(x, w, bias)
    # float32 sums in another order, then one rounding to bf16: within half a bf16 step of the exact value
    # plus the float32 sums' rounding (k terms of about |x||w|).
    slack = k * 2**-24 * (x.double().abs() @ w.double().abs().t())
    error = (out.double() - exact).abs()
    assert bool((error <= exact.abs() * 2**-8 + slack + 1e-30).all()), float((error - exact.abs() * 2**-8).max())


def test_every_row_and_column_is_its_own_product(haswell: NativeKernels) -> None:
    """Rows and columns past the 4 x 3 micro-tiles and the 64 x 48 tasks land where they belong."""
    m, n, k = 69, 50, 32
    x = torch.zeros(m, k).bfloat16()
    w = torch.zeros(n, k).bfloat16()
    x[torch.arange(m), torch.arange(m) % k] = 1.0
    w[torch.arange(n), torch.arange(n) % k] = torch.arange(1, n + 1).bfloat16()
    out = haswell.fma_linear(x, w, None)
    assert out is not None
    assert torch.equal(out, F.linear(x.float(), w.float()).bfloat16())


def test_it_declines_what_it_does_not_serve(haswell: NativeKernels) -> None:
    x = torch.randn(6, 24).bfloat16()
    assert haswell.fma_linear(x, torch.randn(8, 24).bfloat16(), None) is None  # k not a multiple of 16
    assert haswell.fma_linear(x.float(), torch.randn(8, 24), None) is None  # float32
    assert haswell.fma_linear_available() == 1


def test_the_baseline_build_has_no_kernel(tmp_path: Path) -> None:
    baseline = _bind(_build("cc", tmp_path, march="x86-64"))
    assert baseline.fma_linear_available() == 0
    assert baseline.fma_linear(torch.randn(6, 32).bfloat16(), torch.randn(8, 32).bfloat16(), None) is None


def test_this_build_has_it_exactly_where_torch_multiplies_bf16_slowly() -> None:
    native = load_native_kernels()
    assert native is not None
    flags = set(cpu_flags().split())
    expected = {"avx2", "fma"} <= flags and "avx512bw" not in flags and "avx_ne_convert" not in flags
    assert bool(native.fma_linear_available()) == expected


def test_linear_takes_it_from_five_bf16_rows_where_it_is_built() -> None:
    native = load_native_kernels()
    assert native is not None
    generator = torch.Generator().manual_seed(7)
    w = torch.randn(40, 64, generator=generator).bfloat16()
    for rows in (5, 33):
        x = torch.randn(rows, 64, generator=generator).bfloat16()
        out = linear_module.linear(x, w)
        if linear_module.fma_linear_available():
            assert torch.equal(out, native.fma_linear(x, w, None))
        else:
            assert native.fma_linear(x, w, None) is None
        torch.testing.assert_close(out.float(), F.linear(x.float(), w.float()), rtol=2**-7, atol=1e-2)
