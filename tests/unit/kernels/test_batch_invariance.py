"""Fixed row blocks (--batch-invariant): a row's product is the same whatever the rows around it and
however many there are, and it is still the matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tgictl.kernels.batch_invariance import BLOCK_ROWS, batch_invariant, enable_batch_invariance, in_row_blocks
from tgictl.kernels.linear_methods.dense import DenseWeight


# An LM-head-like shape: oneDNN's bf16 product of it changes kernels with the row count.
IN, OUT = 576, 8192


def test_each_row_is_the_same_in_any_batch_and_position() -> None:
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(OUT, IN, generator=g) * 0.05).bfloat16()
    rows = torch.randn(80, IN, generator=g).bfloat16()
    target = rows[0]
    alone = in_row_blocks(lambda x: F.linear(x, weight), target[None])[0]
    for count in (1, 2, 3, 9, 31, BLOCK_ROWS, 33, 34, 40, 65, 80):
        for position in {0, count // 2, count - 1}:
            batch = rows[:count].clone()
            batch[position] = target
            out = in_row_blocks(lambda x: F.linear(x, weight), batch)
            assert out.shape == (count, OUT)
            assert torch.equal(out[position], alone), (count, position)


def test_blocks_compute_the_matmul() -> None:
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 48, generator=g)
    x = torch.randn(70, 48, generator=g)
    torch.testing.assert_close(in_row_blocks(lambda rows: F.linear(rows, weight), x), F.linear(x, weight))


def test_linear_weights_use_blocks_only_when_enabled(invariant: None) -> None:
    calls: list[int] = []
    weight = DenseWeight(torch.randn(16, 8))
    original = weight.matmul

    def counting(x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        calls.append(x.shape[0])
        return original(x, bias)

    weight.matmul = counting  # type: ignore[method-assign]
    x = torch.randn(40, 8)
    torch.testing.assert_close(weight(x), x @ weight.weight.T)
    assert calls == [BLOCK_ROWS, BLOCK_ROWS] and batch_invariant()
    enable_batch_invariance(False)
    calls.clear()
    weight(x)
    assert calls == [40]
