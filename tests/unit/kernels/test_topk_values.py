"""The sampler's top-k values kernel (kernels/fused.py topk_values, csrc/topk_values.c) against torch.topk's
values: the same floats in the same (descending) order, on peaked and flat rows, ties, -inf entries, k from 1 to
the whole row; rows holding NaN are left to torch."""

from __future__ import annotations

import pytest
import torch

from tgictl.kernels import fused
from tgictl.kernels.native import load_native_kernels


@pytest.fixture(autouse=True)
def _native_available() -> None:
    assert load_native_kernels() is not None  # the development and CI machines have gcc


@pytest.mark.parametrize("rows", [1, 3, 32])
@pytest.mark.parametrize("k", [1, 2, 50, 64, 256, 1000])
def test_values_equal_torch_topk(rows: int, k: int) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + k)
    scale = torch.tensor([0.05, 1.0, 8.0])[torch.arange(rows) % 3][:, None]  # flat, middling and peaked rows
    scores = torch.randn(rows, 6000, generator=gen) * scale
    scores[:, ::7] = float("-inf")  # tokens an earlier warper removed
    probs = scores.softmax(-1)
    for x in (scores, probs, scores.to(torch.bfloat16).float()):  # bf16-rounded: many ties
        values = fused.topk_values(x.contiguous(), k)
        assert values is not None
        assert torch.equal(values, x.topk(k, dim=-1).values)


def test_k_as_wide_as_the_row_sorts_it_and_other_calls_decline() -> None:
    x = torch.randn(4, 300)
    values = fused.topk_values(x, 300)
    assert values is not None and torch.equal(values, x.sort(dim=-1, descending=True).values)
    assert fused.topk_values(x, 301) is None and fused.topk_values(x, 0) is None
    assert fused.topk_values(x.t(), 2) is None  # not contiguous
    assert fused.topk_values(x.double(), 2) is None
    for at in (150, 0):  # NaN past the first k entries, and among them: torch orders NaN first, so torch answers
        x[2, at] = float("nan")
        assert fused.topk_values(x, 5) is None
        x[2, at] = 1.0
    assert fused.topk_values(x, 5) is not None
