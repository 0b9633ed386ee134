"""The batched LoRA paths (the compiled kernel, padded bmm, per-adapter segments) against the
per-token definition, and the base rows left bit for bit as they were."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tgictl.kernels.lora import (
    AdapterGroups,
    LoraFactors,
    _add_native,
    add_lora,
    add_lora_reference,
    group_tokens,
)

CPU = torch.device("cpu")


def _factors(count: int, inp: int, outs: list[int], rank: int, seed: int) -> LoraFactors:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(count, inp, len(outs) * rank, generator=g)
    b = torch.randn(count, rank, sum(outs), generator=g)
    return LoraFactors(a, b, tuple(sum(outs[:p]) for p in range(len(outs) + 1)))


TOKEN_SLOTS = [
    [0, 1, 2, 3, 0, 1, 2, 3],  # decode, every adapter present
    [-1, 2, -1, 2, 0, -1],  # base rows mixed in, some adapters absent
    [1] * 21 + [0, -1, 3],  # one long prefill segment (two native chunks) and single tokens
    [-1, -1, 3],
]


def _check_against_definition(got: torch.Tensor, base: torch.Tensor, want: torch.Tensor, token_slots: list[int],
                              tolerance: float) -> None:
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    for t, slot in enumerate(token_slots):
        if slot < 0:
            assert torch.equal(got[t], base[t])  # the base rows are not touched at all
        else:
            assert not torch.allclose(got[t], base[t])


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("token_slots", TOKEN_SLOTS)
def test_torch_paths_equal_the_per_token_definition(padded: bool, token_slots: list[int]) -> None:
    outs = [12, 4, 4]
    factors = _factors(4, 10, outs, rank=3, seed=len(token_slots))
    x = torch.randn(len(token_slots), 10)
    base = torch.randn(len(token_slots), sum(outs))
    groups = group_tokens(token_slots, 4, CPU)
    assert groups is not None
    groups = dataclasses.replace(groups, padded=padded)
    got = add_lora(x, base.clone(), factors, groups, native=False)
    want = add_lora_reference(x, base.clone(), factors, token_slots)
    _check_against_definition(got, base, want, token_slots, 1e-5)


# (rank, projection widths): the kernel tiles P * R and each width in two 16-float vectors, then one,
# then single floats; these cover every combination of the three.
NATIVE_SHAPES = [(5, [40, 8, 8]), (16, [40, 24, 8]), (11, [72, 16, 17]), (16, [48])]


@pytest.mark.parametrize(("dtype", "factor_dtype"),
                         [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                          (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("token_slots", TOKEN_SLOTS)
@pytest.mark.parametrize(("rank", "outs"), NATIVE_SHAPES)
def test_native_kernel_equals_the_per_token_definition(
    dtype: torch.dtype, factor_dtype: torch.dtype, token_slots: list[int], rank: int, outs: list[int]
) -> None:
    factors = _factors(4, 37, outs, rank=rank, seed=len(token_slots))
    # bf16 factors: the definition runs on the same (rounded) values in float32
    factors = LoraFactors(factors.a.to(factor_dtype), factors.b.to(factor_dtype), factors.bounds)
    x = torch.randn(len(token_slots), 37).to(dtype)
    base = (torch.randn(len(token_slots), sum(outs)) * 10).to(dtype)
    groups = group_tokens(token_slots, 4, CPU)
    assert groups is not None
    got = base.clone()
    assert _add_native(x, got, factors, groups)
    # float32: the same sums in another order; bf16: the kernel rounds y + delta once, so it is within
    # half an ulp of the float32 definition
    exact = LoraFactors(factors.a.float(), factors.b.float(), factors.bounds)
    want = add_lora_reference(x.float(), base.float().clone(), exact, token_slots)
    tolerance = 1e-4 if dtype == torch.float32 else 2.0**-8
    _check_against_definition(got.float(), base.float(), want, token_slots, tolerance)


def test_grouping_chooses_padding_only_for_even_groups() -> None:
    even = group_tokens([0, 1, 2, 0, 1, 2], 3, CPU)
    uneven = group_tokens([0] * 20 + [1, 2], 3, CPU)
    assert isinstance(even, AdapterGroups) and even.padded and even.all_slots
    assert isinstance(uneven, AdapterGroups) and not uneven.padded
    assert group_tokens([-1, -1], 3, CPU) is None


def test_select_renumbers_the_logit_rows() -> None:
    groups = group_tokens([2, 2, 2, -1, 0, 0], 3, CPU)
    assert groups is not None
    picked = groups.select([2, 3, 5], CPU)  # the last token of each of three rows
    assert picked is not None
    assert picked.slots == (0, 2) and picked.tokens == ((2,), (0,))
    assert groups.select([3], CPU) is None
