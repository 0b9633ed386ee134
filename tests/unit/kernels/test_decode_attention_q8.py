"""csrc/decode_attention_q8.c, decode attention over an int8 KV cache: the VNNI kernel and the portable loop against
the torch path on the same cache (both dequantize the same bytes), every group size, head sizes 64 and 128, long
sequences, soft-caps, float32 and bf16 queries; a sequence's bits alone and in a batch; and csrc/fused_layers.c's
rotary + store writing the bytes the torch store writes."""

from __future__ import annotations

import pytest
import torch
from paged_cases import CaseSpec, build_case

from tgictl.kernels import fused
from tgictl.kernels.attention_fast import decode_attention_torch
from tgictl.kernels.kv_pages import Int8Pages, allocate_pages, gather_rows, store_rows
from tgictl.kernels.native import cpu_flags, load_native_kernels, paged_decode_int8
from tgictl.runtime.shard.layers.rotary import apply_rotary

HAS_VNNI = {"avx512bw", "avx512_vnni"} <= set(cpu_flags().split())
# The VNNI kernel also rounds the query, to two int8 parts (a step of 1/254 of the first's scale): outputs are
# averages of unit-normal values, ~0.1-1 in size.
QUERY_INT8_TOL = {"atol": 5e-3, "rtol": 1e-2}  # bf16 outputs: one rounding of the output is 2^-9
EXACT_PATH_TOL = {"atol": 1e-5, "rtol": 1e-5}


def _run(case, portable: bool, softcap: float | None = None) -> torch.Tensor:
    kernels = load_native_kernels()
    assert kernels is not None
    plan = case.meta.decode
    out = paged_decode_int8(kernels, case.query, case.key_cache, case.value_cache, plan.slots, plan.context_lens,
                            plan.max_context_len, case.scale, softcap, portable=portable)
    assert out is not None and out.dtype == case.query.dtype
    return out


def _torch(case, softcap: float | None = None) -> torch.Tensor:
    """The torch path on float32 queries (the exact dequantized arithmetic)."""
    return decode_attention_torch(case.query.float(), case.key_cache, case.value_cache, case.meta.decode, case.scale,
                                  softcap)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX512-VNNI")
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_vnni_kernel_every_group_size(group: int, head_dim: int) -> None:
    spec = CaseSpec(((0, 1), (20, 1), (130, 1), (300, 1)), block_size=16, heads=2 * group, kv_heads=2,
                    head_dim=head_dim, seed=group)
    case = build_case(spec, torch.bfloat16, "int8")
    torch.testing.assert_close(_run(case, portable=False).float(), _torch(case), **QUERY_INT8_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 8), (9, 3, 64), (8, 1, 128), (6, 6, 32)])
def test_portable_loop_matches_the_torch_path(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> None:
    spec = CaseSpec(((5, 1), (40, 1), (0, 1)), block_size=4, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    case = build_case(spec, dtype, "int8")
    tol = EXACT_PATH_TOL if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}
    torch.testing.assert_close(_run(case, portable=True).float(), _torch(case), **tol)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX512-VNNI")
@pytest.mark.parametrize("softcap", [None, 1.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_sequences_and_softcap(softcap: float | None, dtype: torch.dtype) -> None:
    spec = CaseSpec(((2099, 1), (5, 1)), block_size=16, heads=32, kv_heads=8, head_dim=64)
    case = build_case(spec, dtype, "int8")
    torch.testing.assert_close(_run(case, False, softcap).float(), _torch(case, softcap), **QUERY_INT8_TOL)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX512-VNNI")
def test_queries_with_outlier_dimensions() -> None:
    """Real models' queries have a few dimensions tens of times the rest (SmolLM2's do): one int8 step of the
    query's scale is then larger than most of its values. A single int8 query lost up to 0.18 of an output there."""
    spec = CaseSpec(((600, 1), (90, 1)), block_size=16, heads=9, kv_heads=3, head_dim=64, seed=5)
    case = build_case(spec, torch.bfloat16, "int8")
    case.query[:, :, 3] *= 40
    case.query[:, :, 17] *= -25
    torch.testing.assert_close(_run(case, portable=False).float(), _torch(case), **QUERY_INT8_TOL)


@pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no AVX512-VNNI")
def test_a_sequence_gets_the_same_bits_alone_and_in_a_batch() -> None:
    kernels = load_native_kernels()
    seqs = ((299, 1), (40, 1), (700, 1))
    batch = build_case(CaseSpec(seqs, block_size=16, heads=9, kv_heads=3, head_dim=64, seed=3), torch.bfloat16, "int8")
    together = _run(batch, portable=False)
    plan = batch.meta.decode
    for i, (cache_len, _) in enumerate(seqs):
        length = cache_len + 1
        slots = plan.slots.view(len(seqs), plan.max_context_len)[i, :length].contiguous()
        alone = paged_decode_int8(kernels, batch.query[i : i + 1].contiguous(), batch.key_cache, batch.value_cache,
                                  slots, torch.tensor([length]), length, batch.scale, None)
        assert alone is not None and torch.equal(alone, together[i : i + 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [8, 64, 128])
def test_rotary_store_writes_the_torch_stores_bytes(dtype: torch.dtype, head_dim: int) -> None:
    tokens, heads, kv_heads = 5, 6, 2
    gen = torch.Generator().manual_seed(head_dim)
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen) * 3).to(dtype)
    qkv[1, heads * head_dim : (heads + 1) * head_dim] = 0  # an all-zero k row (KV head 0): scale 0, values 0
    angles = torch.rand(tokens, head_dim // 2, generator=gen) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    slots = torch.tensor([9, 3, 17, 0, 30])
    shape = (8, 4, kv_heads, head_dim)
    fast_k, fast_v = (allocate_pages("int8", shape, dtype, torch.device("cpu")) for _ in range(2))
    q = fused.rotary_store_kv(qkv, cos, sin, slots, fast_k, fast_v, heads, kv_heads)
    assert q is not None and isinstance(fast_k, Int8Pages)
    ref_k, ref_v = (allocate_pages("int8", shape, dtype, torch.device("cpu")) for _ in range(2))
    rows = qkv.view(tokens, heads + 2 * kv_heads, head_dim)
    rotated = apply_rotary(rows[:, : heads + kv_heads], cos, sin)
    store_rows(rotated[:, heads:], ref_k, slots)
    store_rows(rows[:, heads + kv_heads :], ref_v, slots)
    assert torch.equal(fast_v.values, ref_v.values) and torch.equal(fast_v.scales, ref_v.scales)
    if dtype == torch.bfloat16:  # every product rounded as torch's bf16 ops round it: the same bytes
        assert torch.equal(q, rotated[:, :heads])
        assert torch.equal(fast_k.values, ref_k.values) and torch.equal(fast_k.scales, ref_k.scales)
    else:  # float32 rotates with fused multiply-adds (float rounding): a value may land one step over
        torch.testing.assert_close(q, rotated[:, :heads], rtol=1e-6, atol=1e-6)
        assert int((fast_k.values.int() - ref_k.values.int()).abs().max()) <= 1
        torch.testing.assert_close(fast_k.scales, ref_k.scales, rtol=2**-7, atol=0)
    assert gather_rows(fast_k, slots[1:2], torch.float32)[:, 0].abs().sum() == 0  # the zeroed row
