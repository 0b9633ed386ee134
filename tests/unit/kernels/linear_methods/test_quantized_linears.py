"""Every backend of every weight format equals the float matmul on the dequantized weights within float
rounding (float32 and bf16 activations, 1 to 64 rows, with and without bias); the dispatching forward
returns what one of them returns."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import Tensor

from tgictl.kernels.linear import amx_available
from tgictl.kernels.linear_methods import BLOCK_TYPES, GGUFWeight, Int4Weight, Int8Weight, LinearWeight
from tgictl.kernels.linear_methods.gguf_repack import as_int4_tiles
from tgictl.kernels.linear_methods.int4 import torch_layout_matches
from tgictl.kernels.linear_methods.native import quant_kernels
from tgictl.testing.gguf_blocks import quantized_blocks

OUT, IN = 200, 512  # 200 rows: not a multiple of the int4 tile (64)


def _weight(seed: int = 0, shape: tuple[int, int] = (OUT, IN)) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.05


def _gguf(type_name: str, shape: tuple[int, int] = (OUT, IN)) -> Callable[[torch.dtype], LinearWeight]:
    def build(dtype: torch.dtype) -> LinearWeight:
        rng = np.random.default_rng(3)
        data = quantized_blocks(type_name, _weight(shape=shape).numpy(), rng)
        return GGUFWeight(torch.from_numpy(data), BLOCK_TYPES[type_name], shape[1], dtype)

    return build


FORMATS: dict[str, Callable[[torch.dtype], LinearWeight]] = {
    "int8": lambda dtype: Int8Weight.quantize(_weight(), dtype),
    "int8, in not a line multiple": lambda dtype: Int8Weight.quantize(_weight(shape=(70, 100)), dtype),
    "int4/g32": lambda dtype: Int4Weight.quantize(_weight(), 32, dtype),
    "int4/g128": lambda dtype: Int4Weight.quantize(_weight(), 128, dtype),
    "int4/g64, in not a group multiple": lambda dtype: Int4Weight.quantize(_weight(shape=(70, 100)), 64, dtype),
    "int4/g32, odd in": lambda dtype: Int4Weight.quantize(_weight(shape=(130, 99)), 32, dtype),
    **{name: _gguf(name) for name in sorted(BLOCK_TYPES)},
    # one input row goes through groups of 4 weight rows, then one by one: 35 rows per thread on 2 threads
    "Q8_0, out not a multiple of 4 per thread": _gguf("Q8_0", (70, 256)),
    **{f"{name} as int4 tiles": (lambda dtype, name=name: as_int4_tiles(_gguf(name)(dtype))) for name in ("Q4_0", "Q4_1")},
}


def _tolerance(x: Tensor, weight: LinearWeight, bias: Tensor | None, dtype: torch.dtype) -> dict[str, float]:
    """Float rounding: float32, a few ulps of B = max sum |x| |w| + |b|; bf16, one bf16 rounding of a value
    as large as B (the output itself, torch's bf16 result before the bias is added, the bf16-rounded
    weights of the dequant backend)."""
    magnitude = x.float().abs() @ weight.dequantize().abs().t()
    bound = float((magnitude + (0 if bias is None else bias.float().abs())).max())
    if dtype == torch.float32:
        return {"rtol": 0.0, "atol": 1e-5 * bound}
    return {"rtol": 2**-7, "atol": 2**-8 * bound}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(FORMATS))
def test_every_backend_matches_the_reference(name: str, dtype: torch.dtype) -> None:
    weight = FORMATS[name](dtype)
    generator = torch.Generator().manual_seed(1)
    bias = torch.randn(weight.out_features, generator=generator).to(dtype)
    ran = set()
    for rows in (1, 3, 7, 17, 64):
        x = torch.randn(rows, weight.in_features, generator=generator).to(dtype)
        for b in (None, bias):
            expected = torch.nn.functional.linear(x.float(), weight.dequantize(), None if b is None else b.float())
            for backend, fn in weight.backends().items():
                out = fn(weight, x, b)
                if out is None:
                    continue
                ran.add(backend)
                assert out.dtype == dtype and out.shape == (rows, weight.out_features), backend
                torch.testing.assert_close(out.float(), expected, **_tolerance(x, weight, b, dtype),
                                           msg=lambda m: f"{backend}: {m}")
            dispatched = weight(x, b)
            assert any(torch.equal(dispatched, fn(weight, x, b)) for fn in weight.backends().values()
                       if fn(weight, x, b) is not None)
    # The fast paths are the ones that ran; torch's int4 kernel only where its packing is ours (AVX-512
    # builds: on AVX2-only CPUs torch packs int4 otherwise and the C kernel serves alone), and only with stored
    # zeros (Q4_0's tiles hold their scales alone where the C kernels serve them).
    assert "native" in ran
    if isinstance(weight, Int8Weight) and dtype == weight.dtype:  # torch's kernel crashes at other widths
        assert ("torch" in ran) == (weight.in_features % 16 == 0)
    if isinstance(weight, Int4Weight) and dtype == weight.dtype:
        assert ("torch" in ran) == (torch_layout_matches() and weight.has_zeros)
    kernels = quant_kernels()
    if isinstance(weight, Int4Weight) and dtype == torch.bfloat16 and kernels is not None \
            and kernels.int4_bf16_instructions != "none":
        assert "native_bf16" in ran
    if isinstance(weight, (GGUFWeight, Int8Weight)) and dtype == torch.bfloat16 == weight.dtype and amx_available():
        # the AMX kernel on rows decoded from the blocks / int8 rows; it takes widths in whole 32-wide tiles
        assert ("native_bf16" in ran) == (weight.in_features % 32 == 0)


def test_int8_stores_the_nearest_multiple_of_its_row_scale() -> None:
    w = _weight()
    w[3] = 0.0  # an all-zero row keeps a usable scale
    weight = Int8Weight.quantize(w, torch.float32)
    q, scales = weight.qweight, weight.scales
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127 and torch.all(scales > 0)
    assert torch.equal(weight.dequantize(), q.float() * scales[:, None])  # the definition, bit for bit
    assert torch.all((weight.dequantize() - w).abs() <= scales[:, None] / 2 * (1 + 1e-6))
    assert torch.equal(weight.dequantize()[3], torch.zeros(IN))
    rows = torch.tensor([7, 0, 199])
    assert torch.equal(weight.dequantize_rows(rows), weight.dequantize()[rows])
    assert weight.nbytes == OUT * IN + OUT * 4


def test_int8_scales_in_bf16_are_used_as_rounded() -> None:
    weight = Int8Weight.quantize(_weight(), torch.bfloat16)
    assert weight.scales.dtype == torch.bfloat16
    assert torch.equal(weight.dequantize(), weight.qweight.float() * weight.scales.float()[:, None])


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_groups_map_min_to_max_onto_0_to_15(group: int) -> None:
    w = _weight(shape=(70, 3 * group + group // 2))  # ragged rows and a partial last group
    weight = Int4Weight.quantize(w, group, torch.float32)
    n_pad, k_pad = 128, 4 * group
    assert weight.packed.shape == (2, k_pad, 32) and weight.scales_zeros.shape == (4, n_pad, 2)
    from tgictl.kernels.linear_methods.int4 import pack_tiles, unpack_tiles

    q = unpack_tiles(weight.packed)
    assert torch.equal(pack_tiles(q), weight.packed)
    scale = weight.scales_zeros[..., 0].t().repeat_interleave(group, dim=1)  # [N_pad, K_pad]
    zero = weight.scales_zeros[..., 1].t().repeat_interleave(group, dim=1)
    definition = ((q.float() - 8) * scale + zero)[:70, : w.shape[1]]
    assert torch.equal(weight.dequantize(), definition)
    rows = torch.tensor([69, 0, 31, 32, 33])
    assert torch.equal(weight.dequantize_rows(rows), weight.dequantize()[rows])


def _group_errors(w: torch.Tensor, deq: torch.Tensor, group: int) -> torch.Tensor:
    """Squared reconstruction error per (row, group), w's columns a multiple of `group`."""
    return (deq - w).square().view(w.shape[0], -1, group).sum(dim=-1)


@pytest.mark.parametrize("group", [32, 64])
def test_int4_clipping_never_reconstructs_a_group_worse_than_min_max(group: int) -> None:
    w = torch.randn(64, 4 * group, generator=torch.Generator().manual_seed(3))
    w[::3, 5] *= 12  # outliers in some rows' first group: there clipping pays
    weight = Int4Weight.quantize(w, group, torch.float32)
    low = w.view(64, 4, group).amin(dim=-1, keepdim=True)
    scale = (w.view(64, 4, group).amax(dim=-1, keepdim=True) - low) / 15
    min_max = (torch.round((w.view(64, 4, group) - low) / scale) * scale + low).view_as(w)  # 16 levels over [min, max]
    ours, theirs = _group_errors(w, weight.dequantize(), group), _group_errors(w, min_max, group)
    assert torch.all(ours <= theirs * (1 + 1e-4) + 1e-6)
    assert ours.sum() < 0.97 * theirs.sum()  # and it does clip: the outlier groups are reconstructed better
    spans = weight.dequantize().view(64, 4, group)
    assert torch.all(spans.amax(dim=-1) - spans.amin(dim=-1) <= (scale * 15).squeeze(-1) * (1 + 1e-5))


def test_int4_weights_already_on_16_levels_quantize_exactly() -> None:
    """A group holding 16 evenly spaced levels (the dequantization of a 4-bit file) comes back bit for bit."""
    generator = torch.Generator().manual_seed(4)
    q = torch.randint(0, 16, (64, 128), generator=generator)
    q[:, ::32] = 0
    q[:, 1::32] = 15  # every group spans all 16 levels
    scale = torch.rand(64, 4, 1, generator=generator) * 0.01 + 0.001
    low = torch.randn(64, 4, 1, generator=generator) * 0.01
    w = (q.view(64, 4, 32).float() * scale + low).view(64, 128)
    torch.testing.assert_close(Int4Weight.quantize(w, 32, torch.float32).dequantize(), w, rtol=0, atol=1e-7)


def test_int4_layout_is_torch_s_on_avx512_builds() -> None:
    # torch packs int4 in tiles of 64 rows exactly as int4.py does where its CPU capability is AVX-512, in
    # tiles of 32 rows elsewhere (AVX2 CPUs such as AMD Zen 3): there its kernel must be left unused.
    assert torch_layout_matches() == torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def test_int8_parts_concatenate_into_one_weight() -> None:
    from tgictl.kernels.linear_methods import concat_rows

    a, b = Int8Weight.quantize(_weight(1), torch.float32), Int8Weight.quantize(_weight(2, (30, IN)), torch.float32)
    fused = concat_rows([a, b])
    assert isinstance(fused, Int8Weight) and fused.shape == (OUT + 30, IN)
    assert torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


def test_native_kernels_decline_what_they_cannot_read() -> None:
    kernels = quant_kernels()
    assert kernels is not None
    weight = Int8Weight.quantize(_weight(), torch.float16)
    x = torch.randn(2, IN).half()
    assert kernels.int8_linear(x, weight.qweight, weight.scales, None) is None  # float16 scales
    assert kernels.int8_linear(x[:, None], weight.qweight, weight.scales, None) is None  # not 2-D
    # the format still answers, through the reference
    torch.testing.assert_close(weight(x).float(), x.float() @ weight.dequantize().t(), rtol=2e-3, atol=2e-3)



@pytest.mark.parametrize("rows", [255, 256, 300])
def test_int8_prefill_rows_through_onednn_strips(rows: int) -> None:
    """From 256 bf16 rows (prefill chunks) int8 decodes strips of rows to bf16 for oneDNN's GEMM, except on AMX
    machines: within the bf16 tolerance of the reference, and the dispatch's choice for shapes the table lacks."""
    from tgictl.kernels.linear_methods.int8 import ONEDNN_STRIP_ROWS, ONEDNN_STRIPS_MIN_ROWS

    weight = Int8Weight.quantize(_weight(shape=(ONEDNN_STRIP_ROWS + 70, IN)), torch.bfloat16)  # a partial strip
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(rows, IN, generator=generator).to(torch.bfloat16)
    bias = torch.randn(weight.out_features, generator=generator).to(torch.bfloat16)
    strips = weight.backends()["onednn_strips"]
    out = strips(weight, x, bias)
    if rows < ONEDNN_STRIPS_MIN_ROWS or amx_available():
        assert out is None
        return
    assert out is not None and out.dtype == torch.bfloat16 and out.shape == (rows, weight.out_features)
    expected = torch.nn.functional.linear(x.float(), weight.dequantize(), bias.float())
    torch.testing.assert_close(out.float(), expected, **_tolerance(x, weight, bias, torch.bfloat16))
    assert strips(weight, x.float(), bias.float()) is None  # float32 activations take the other backends
    assert torch.equal(weight(x, bias), out)
