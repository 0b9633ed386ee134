"""csrc/dpbf16_linear.c: bf16 products of 1-32 rows by VDPBF16PS on the weight as stored, which kernels/linear.py
takes for 5-32 rows on AVX512-BF16 CPUs without AMX (AMD Zen 4 and 5) instead of a oneDNN copy of every weight.
Tested on a Sapphire Rapids build less AMX and AVX512-FP16 (what Zen 4 and 5 have) wherever the CPU runs
AVX512-BF16, against float64 products of the same bf16 inputs; an AVX2 build has no kernel."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tgictl.kernels import linear as linear_module
from tgictl.kernels.native import NativeKernels, _bind, _build, cpu_flags, load_native_kernels

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the kernel is x86-64 code")
needs_bf16 = pytest.mark.skipif("avx512_bf16" not in cpu_flags().split(), reason="this CPU cannot run AVX512-BF16")
ZEN_LIKE = ("-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8", "-mno-avx512fp16")


@pytest.fixture(scope="module")
def zen_like(tmp_path_factory: pytest.TempPathFactory) -> NativeKernels:
    return _bind(_build("cc", tmp_path_factory.mktemp("kernels-no-amx"), march="sapphirerapids",
                        extra_flags=ZEN_LIKE))


def _exact(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if bias is None else bias.double())


@needs_bf16
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16, 17, 25, 32])
@pytest.mark.parametrize(("n", "k"), [(1, 4), (7, 36), (25, 64), (49, 576), (100, 160), (577, 1536)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_products_equal_float64_rounded_once(zen_like: NativeKernels, m: int, n: int, k: int,
                                             with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=generator).bfloat16()
    w = (torch.randn(n, k, generator=generator) * 0.1).bfloat16()
    bias = torch.randn(n, generator=generator) if with_bias else None
    out = zen_like.dpbf16_linear(x, w, bias)
    assert out is not None and out.dtype == torch.bfloat16 and out.shape == (m, n)
    exact = _exact(x, w, bias)
    # float32 sums in another order, then one rounding to bf16: within half a bf16 step of the exact value
    # plus the float32 sums' rounding (k terms of about |x||w|).
    slack = k * 2**-24 * (x.double().abs() @ w.double().abs().t())
    error = (out.double() - exact).abs()
    assert bool((error <= exact.abs() * 2**-8 + slack + 1e-30).all()), float((error - exact.abs() * 2**-8).max())


@needs_bf16
def test_a_row_does_not_depend_on_the_batch_or_the_threads(zen_like: NativeKernels) -> None:
    """Each input row sums its own products in one order, whatever the rows beside it and the thread count."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(32, 576, generator=generator).bfloat16()
    w = torch.randn(961, 576, generator=generator).bfloat16()
    full = zen_like.dpbf16_linear(x, w, None)
    assert full is not None
    for rows in (1, 5, 8, 9, 24):
        part = zen_like.dpbf16_linear(x[:rows], w, None)
        assert part is not None and torch.equal(part, full[:rows]), rows
    torch.set_num_threads(1)
    try:
        assert torch.equal(zen_like.dpbf16_linear(x, w, None), full)
    finally:
        torch.set_num_threads(2)


@needs_bf16
def test_every_row_and_column_is_its_own_product(zen_like: NativeKernels) -> None:
    """Rows past the 8-row vectors and columns past the strips (and their one-row tail) land where they belong."""
    m, n, k = 29, 53, 64
    x = torch.zeros(m, k).bfloat16()
    w = torch.zeros(n, k).bfloat16()
    x[torch.arange(m), torch.arange(m) % k] = 1.0
    w[torch.arange(n), torch.arange(n) % k] = torch.arange(1, n + 1).bfloat16()
    out = zen_like.dpbf16_linear(x, w, None)
    assert out is not None
    assert torch.equal(out, F.linear(x.float(), w.float()).bfloat16())


@needs_bf16
def test_it_declines_what_it_does_not_serve(zen_like: NativeKernels) -> None:
    w = torch.randn(8, 64).bfloat16()
    assert zen_like.dpbf16_linear(torch.randn(33, 64).bfloat16(), w, None) is None  # past 32 rows
    assert zen_like.dpbf16_linear(torch.randn(6, 30).bfloat16(), torch.randn(8, 30).bfloat16(), None) is None  # k % 4
    assert zen_like.dpbf16_linear(torch.randn(6, 64), w.float(), None) is None  # float32
    assert zen_like.dpbf16_linear_available() == 1


def test_an_avx2_build_has_no_kernel(tmp_path: Path) -> None:
    haswell = _bind(_build("cc", tmp_path, march="haswell"))
    assert haswell.dpbf16_linear_available() == 0
    assert haswell.dpbf16_linear(torch.randn(6, 32).bfloat16(), torch.randn(8, 32).bfloat16(), None) is None


def test_linear_takes_it_for_5_to_32_rows_where_amx_is_absent() -> None:
    native = load_native_kernels()
    assert native is not None
    assert linear_module.dpbf16_linear_available() == ("avx512_bf16" in cpu_flags().split())
    generator = torch.Generator().manual_seed(7)
    w = torch.randn(40, 64, generator=generator).bfloat16()
    for rows in (5, 32, 33):
        x = torch.randn(rows, 64, generator=generator).bfloat16()
        out = linear_module.linear(x, w)
        takes_it = linear_module.dpbf16_linear_available() and not linear_module.amx_available() and rows <= 32
        if takes_it:
            assert torch.equal(out, native.dpbf16_linear(x, w, None))
        torch.testing.assert_close(out.float(), F.linear(x.float(), w.float()), rtol=2**-7, atol=1e-2)
