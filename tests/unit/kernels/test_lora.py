"""The two batched LoRA paths (padded bmm, per-adapter segments) against the per-token definition,
and the base rows left bit for bit as they were."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tgictl.kernels.lora import AdapterGroups, add_lora, add_lora_reference, group_tokens

CPU = torch.device("cpu")


def _factors(count: int, inp: int, outs: list[int], rank: int, seed: int) -> tuple[torch.Tensor, list]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(count, inp, len(outs) * rank, generator=g)
    bs, first = [], 0
    for out in outs:
        bs.append((first, torch.randn(count, rank, out, generator=g)))
        first += out
    return a, bs


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize(
    "token_slots",
    [
        [0, 1, 2, 3, 0, 1, 2, 3],  # decode, every adapter present
        [-1, 2, -1, 2, 0, -1],  # base rows mixed in, some adapters absent
        [1] * 9 + [0, -1, 3],  # one long prefill segment and single tokens
        [-1, -1, 3],
    ],
)
def test_batched_paths_equal_the_per_token_definition(padded: bool, token_slots: list[int]) -> None:
    outs = [12, 4, 4]
    a, bs = _factors(4, 10, outs, rank=3, seed=len(token_slots))
    x = torch.randn(len(token_slots), 10)
    base = torch.randn(len(token_slots), sum(outs))
    groups = group_tokens(token_slots, 4, CPU)
    assert groups is not None
    groups = dataclasses.replace(groups, padded=padded)
    got = add_lora(x, base.clone(), a, bs, groups)
    want = add_lora_reference(x, base.clone(), a, bs, token_slots)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for t, slot in enumerate(token_slots):
        if slot < 0:
            assert torch.equal(got[t], base[t])  # the base rows are not touched at all
        else:
            assert not torch.allclose(got[t], base[t])


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
