"""The quantized C kernels built for other CPUs than this one: AVX2 (-march=haswell) and baseline x86-64
(SSE2, effectively the scalar code) give the reference results too, so machines without AVX-512 run
correct code; their int4 many-row and 1-4 row bf16 kernels decline (no bf16 dot product). Built for AVX512-BF16 without
AMX (as AMD Zen 4 has it), that kernel takes its VDPBF16PS path and gives the same results, and the GGUF and int8
many-row products take csrc/dpbf16_linear.c up to 32 rows."""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

import numpy as np
import pytest
import torch

from tgictl.kernels.linear_methods import BLOCK_TYPES, GGUFWeight, Int4Weight, Int8Weight
from tgictl.kernels.linear_methods.native import bind_quant_kernels
from tgictl.kernels.native import _build, cpu_flags
from tgictl.testing.gguf_blocks import quantized_blocks

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the variants are x86-64 targets")


@pytest.fixture(scope="module", params=["haswell", "x86-64"])
def variant(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    path = _build("cc", tmp_path_factory.mktemp(f"kernels-{request.param}"), march=request.param)
    return bind_quant_kernels(ctypes.CDLL(str(path)))


def test_variant_kernels_match_the_reference(variant) -> None:
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(130, 256, generator=generator) * 0.05
    x = torch.randn(5, 256, generator=generator)
    bias = torch.randn(130, generator=generator)
    int8 = Int8Weight.quantize(w, torch.bfloat16)
    int4 = Int4Weight.quantize(w, 64, torch.float32)
    outputs = {
        int8: variant.int8_linear(x, int8.qweight, int8.scales, bias),
        int4: variant.int4_linear(x, int4.packed, int4.scales_zeros, 64, 130, bias),
    }
    for name, block_type in BLOCK_TYPES.items():
        data = torch.from_numpy(quantized_blocks(name, w.numpy(), np.random.default_rng(1)))
        weight = GGUFWeight(data, block_type, 256, torch.float32)
        outputs[weight] = variant.gguf_linear(x, data, block_type.native_id, 256, bias)
        assert variant.gguf_bf16_linear(x.bfloat16(), data, block_type.native_id, 256, bias) is None  # no AMX
        decoded = variant.gguf_dequantize(data, block_type.native_id, 256)
        torch.testing.assert_close(decoded, weight.dequantize(), rtol=1e-6, atol=1e-7)
    assert variant.int4_bf16_instructions == "none"
    assert variant.int8_bf16_linear(x.bfloat16(), int8.qweight, int8.scales, bias) is None  # no AMX
    assert variant.int4_bf16_linear(x.bfloat16(), int4.packed, int4.scales_zeros.bfloat16(), 64, 130, bias) is None
    # the 1-4 row VDPBF16PS kernel declines too, and int4_linear's bf16 rows take the float32 kernel instead
    x16, int4_16 = x[:2].bfloat16(), Int4Weight.quantize(w, 64, torch.bfloat16)
    y = torch.empty(2, 130)
    assert variant.int4_rows_bf16(x16.data_ptr(), int4_16.packed.data_ptr(), int4_16.scales_zeros.data_ptr(), 3,
                                  64, None, y.data_ptr(), 2, 130, 256, 256, 1) == -1
    out16 = variant.int4_linear(x16, int4_16.packed, int4_16.scales_zeros, 64, 130, bias)
    assert out16 is not None and out16.dtype == torch.bfloat16
    expected16 = torch.nn.functional.linear(x16.float(), int4_16.dequantize(), bias)
    torch.testing.assert_close(out16.float(), expected16, rtol=2**-8, atol=1e-3)
    for weight, out in outputs.items():
        expected = torch.nn.functional.linear(x, weight.dequantize(), bias)
        bound = float((x.abs() @ weight.dequantize().abs().t() + bias.abs()).max())
        assert out is not None
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5 * bound, msg=lambda m: f"{weight.format_key}: {m}")


def test_variant_builds_are_distinct_files(tmp_path: Path) -> None:
    assert _build("cc", tmp_path, march="haswell") != _build("cc", tmp_path, march="x86-64")


# Sapphire Rapids less what AMD Zen 4 and 5 lack: AMX and AVX512-FP16 (GCC lowers F16C conversions to it)
NO_AMX = ("-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8", "-mno-avx512fp16")


def test_the_avx512_bf16_path_without_amx(tmp_path: Path) -> None:
    from tests.unit.kernels.linear_methods.test_int4_bf16 import check_against_bf16_weights

    if "avx512_bf16" not in cpu_flags().split():
        pytest.skip("this CPU cannot run AVX512-BF16 code")
    path = _build("cc", tmp_path, march="sapphirerapids", extra_flags=NO_AMX)
    kernels = bind_quant_kernels(ctypes.CDLL(str(path)))
    assert kernels.int4_bf16_instructions == "avx512-bf16"
    # GGUF and int8 rows decoded per strip, multiplied by csrc/dpbf16_linear.c: up to 32 rows; above, int8 goes
    # 32 rows at a time (a prefill) and GGUF declines
    data = torch.from_numpy(quantized_blocks("Q8_0", torch.randn(70, 256).numpy(), np.random.default_rng(0)))
    q8_0 = GGUFWeight(data, BLOCK_TYPES["Q8_0"], 256, torch.bfloat16)
    int8 = Int8Weight.quantize(torch.randn(70, 256), torch.bfloat16)
    bias = torch.randn(70)
    for rows in (5, 32, 33, 70):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).bfloat16()
        products = ((q8_0, kernels.gguf_bf16_linear(x, data, BLOCK_TYPES["Q8_0"].native_id, 256, bias)),
                    (int8, kernels.int8_bf16_linear(x, int8.qweight, int8.scales, bias)))
        for weight, out in products:
            if rows > 32 and weight is q8_0:
                assert out is None
                continue
            expected = torch.nn.functional.linear(x.float(), weight.dequantize().bfloat16().float(), bias)
            assert out is not None and out.dtype == torch.bfloat16
            torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=1e-2)
            if weight is int8:  # each row as it is alone: the parts of 32 change no row's sums
                alone = kernels.int8_bf16_linear(x[-1:], int8.qweight, int8.scales, bias)
                assert alone is not None and torch.equal(out[-1:], alone)
    for rows, shape in ((1, (200, 512)), (7, (130, 99)), (33, (576, 1536))):
        w = torch.randn(*shape, generator=torch.Generator().manual_seed(rows)) * 0.05
        check_against_bf16_weights(kernels, Int4Weight.quantize(w, 32, torch.bfloat16), rows, seed=rows)
