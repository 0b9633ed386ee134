"""csrc/decode_attention_bf16.c, the bf16 decode attention on AVX512-BF16 CPUs: the float32 reference's result
for every group size it serves, head sizes 64 and 128, chunk tails and the longer chunks of long sequences;
a sequence's result is the same bits alone and in any batch; other shapes, and builds without AVX512-BF16,
take paged_decode.c's loop and still match."""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

import pytest
import torch
from paged_cases import CaseSpec, build_case, naive_attention

from tgictl.kernels.native import _bind, _build, cpu_flags, load_native_kernels

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}
HAS_BF16_DOT = "avx512_bf16" in cpu_flags().split()


def _kernel_status(kernels, case, fn: str = "tgictl_decode_attention_bf16") -> tuple[int, torch.Tensor]:
    """The C entry point called directly: its status and output."""
    plan = case.meta.decode
    out = torch.empty_like(case.query)
    entry = getattr(kernels.library, fn)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    entry.argtypes = [p, p, p, p, p, i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_float, p, ctypes.c_int]
    entry.restype = ctypes.c_int
    spec = case.spec
    status = entry(case.query.data_ptr(), case.key_cache.data_ptr(), case.value_cache.data_ptr(), plan.slots.data_ptr(),
                   plan.context_lens.data_ptr(), plan.context_lens.numel(), plan.max_context_len, spec.heads,
                   spec.kv_heads, spec.head_dim, case.scale, 0.0, out.data_ptr(), 2)
    return status, out


@pytest.mark.skipif(not HAS_BF16_DOT, reason="this CPU has no AVX512-BF16")
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_group_size_matches_the_reference(group: int, head_dim: int) -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    # lengths: one key, a block tail, one chunk and a bit, several chunks with a tail
    spec = CaseSpec(((0, 1), (20, 1), (130, 1), (300, 1)), block_size=16, heads=2 * group, kv_heads=2,
                    head_dim=head_dim, seed=group)
    case = build_case(spec, torch.bfloat16)
    status, out = _kernel_status(kernels, case)
    assert status == 0  # served here, not by the fallback
    torch.testing.assert_close(out.float(), naive_attention(case), **BF16_TOL)


@pytest.mark.skipif(not HAS_BF16_DOT, reason="this CPU has no AVX512-BF16")
@pytest.mark.parametrize("softcap", [None, 1.5])
def test_long_sequences_take_longer_chunks_and_still_match(softcap: float | None) -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    # 2,100 keys: more than 16 chunks of 128, so each chunk grows to 144 keys (15 chunks, the last short)
    case = build_case(CaseSpec(((2099, 1), (5, 1)), block_size=16, heads=9, kv_heads=3, head_dim=64), torch.bfloat16)
    plan = case.meta.decode
    out = kernels.paged_decode(case.query, case.key_cache, case.value_cache, plan.slots, plan.context_lens,
                               plan.max_context_len, case.scale, softcap)
    assert out is not None
    torch.testing.assert_close(out.float(), naive_attention(case, softcap), **BF16_TOL)


@pytest.mark.skipif(not HAS_BF16_DOT, reason="this CPU has no AVX512-BF16")
def test_a_sequence_gets_the_same_bits_alone_and_in_a_batch() -> None:
    """The chunking follows each sequence's own length, so batching changes nothing (--batch-invariant)."""
    kernels = load_native_kernels()
    assert kernels is not None
    seqs = ((299, 1), (40, 1), (700, 1))
    batch = build_case(CaseSpec(seqs, block_size=16, heads=9, kv_heads=3, head_dim=64, seed=3), torch.bfloat16)
    _, together = _kernel_status(kernels, batch)
    for i, (cache_len, _) in enumerate(seqs):
        plan = batch.meta.decode
        length = cache_len + 1
        slots = plan.slots.view(len(seqs), plan.max_context_len)[i, :length].contiguous()
        alone = kernels.paged_decode(batch.query[i : i + 1].contiguous(), batch.key_cache, batch.value_cache, slots,
                                     torch.tensor([length]), length, batch.scale, None)
        assert alone is not None and torch.equal(alone, together[i : i + 1])


def test_other_shapes_are_left_to_the_generic_loop() -> None:
    kernels = load_native_kernels()
    assert kernels is not None
    for spec in (CaseSpec(((30, 1),), block_size=16, heads=9, kv_heads=1, head_dim=64),  # 9 heads per KV head
                 CaseSpec(((30, 1),), block_size=16, heads=4, kv_heads=2, head_dim=32)):  # head size 32
        case = build_case(spec, torch.bfloat16)
        status, _ = _kernel_status(kernels, case)
        assert status == -2
        plan = case.meta.decode
        out = kernels.paged_decode(case.query, case.key_cache, case.value_cache, plan.slots, plan.context_lens,
                                   plan.max_context_len, case.scale, None)
        assert out is not None
        torch.testing.assert_close(out.float(), naive_attention(case), **BF16_TOL)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 target")
def test_a_build_without_avx512_bf16_takes_the_generic_loop(tmp_path: Path) -> None:
    kernels = _bind(_build("cc", tmp_path, march="haswell"))
    case = build_case(CaseSpec(((200, 1), (7, 1)), block_size=16, heads=9, kv_heads=3, head_dim=64), torch.bfloat16)
    status, _ = _kernel_status(kernels, case)
    assert status == -2
    _, out = _kernel_status(kernels, case, "tgictl_paged_decode_bf16")
    torch.testing.assert_close(out.float(), naive_attention(case), **BF16_TOL)
