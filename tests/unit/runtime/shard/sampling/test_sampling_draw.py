"""Inverse-CDF draw: exact on hand-made rows, never a zero-probability token, right frequencies."""

from __future__ import annotations

import pytest
import torch

from tgictl.runtime.shard.sampling.inverse_cdf import BLOCK, draw

ALMOST_ONE = 1.0 - 2.0**-53


def test_uniform_picks_the_token_whose_interval_contains_it() -> None:
    probs = torch.tensor([[0.25, 0.25, 0.5, 0.0]]).expand(5, 4)
    uniform = torch.tensor([0.0, 0.2, 0.3, 0.6, 0.99], dtype=torch.float64)
    assert draw(probs, uniform).tolist() == [0, 0, 1, 2, 2]


@pytest.mark.parametrize("vocab", [7, BLOCK, 3 * BLOCK + 5])
def test_zero_probability_tokens_are_never_drawn_at_the_extremes(vocab: int) -> None:
    probs = torch.zeros(2, vocab)
    probs[:, 3] = 0.4  # leading zeros before it, a run of zeros after the last token with mass
    probs[:, vocab // 2 + 1] = 0.6
    uniform = torch.tensor([0.0, ALMOST_ONE], dtype=torch.float64)
    assert draw(probs, uniform).tolist() == [3, vocab // 2 + 1]


def test_rows_that_do_not_sum_to_one_exactly_stay_inside_their_support() -> None:
    # float32 rows summing to slightly less or more than 1 (rounding in softmax).
    probs = torch.tensor([[0.3, 0.3, 0.3999999, 0.0], [0.3, 0.3, 0.4000001, 0.0]])
    assert draw(probs, torch.full((2,), ALMOST_ONE, dtype=torch.float64)).tolist() == [2, 2]


def test_frequencies_follow_the_probabilities_across_blocks() -> None:
    # Mass spread over several blocks, including a tiny one: the two-level search must weigh blocks.
    vocab = 4 * BLOCK
    probs = torch.zeros(vocab)
    probs[[10, BLOCK + 3, 2 * BLOCK + 200, 4 * BLOCK - 1]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    draws = 20000
    uniform = (torch.arange(draws, dtype=torch.float64) + 0.5) / draws  # evenly spread: exact quantiles
    ids = draw(probs.expand(draws, vocab), uniform)
    counts = torch.bincount(ids, minlength=vocab)
    assert counts[[10, BLOCK + 3, 2 * BLOCK + 200, 4 * BLOCK - 1]].tolist() == [2000, 4000, 6000, 8000]
    assert counts.sum().item() == draws
