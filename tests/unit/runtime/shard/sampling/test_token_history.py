"""TokenHistory: counts of prompt and generated tokens, filtered and concatenated with the batch."""

from __future__ import annotations

import pytest
import torch

from tgictl.errors import InvalidRequestError
from tgictl.runtime.shard.sampling.sampler import TokenHistory

VOCAB = 6


def test_counts_cover_the_prompt_without_padding() -> None:
    history = TokenHistory.from_sequences([[1, 1, 4], [], [5]], VOCAB, "cpu", needed=True)
    assert history.counts is not None
    assert history.counts.tolist() == [[0, 2, 0, 0, 1, 0], [0] * 6, [0, 0, 0, 0, 0, 1]]  # no phantom 0s


def test_append_counts_one_token_per_row() -> None:
    history = TokenHistory.from_sequences([[1], [2]], VOCAB, "cpu", needed=True)
    history.append(torch.tensor([1, 0]))
    history.append(torch.tensor([3, 0]))
    assert history.counts is not None
    assert history.counts.tolist() == [[0, 2, 0, 1, 0, 0], [2, 0, 1, 0, 0, 0]]


def test_unneeded_history_is_not_materialised_but_tracks_rows() -> None:
    history = TokenHistory.from_sequences([[1], [2], [3]], VOCAB, "cpu", needed=False)
    history.append(torch.tensor([0, 0, 0]))
    assert history.counts is None and history.size == 3
    assert history.filter([2]).size == 1


def test_filter_keeps_rows_in_the_given_order() -> None:
    history = TokenHistory.from_sequences([[0], [1], [2, 2]], VOCAB, "cpu", needed=True)
    filtered = history.filter([2, 0])
    filtered.append(torch.tensor([5, 5]))
    assert filtered.counts is not None
    assert filtered.counts.tolist() == [[0, 0, 2, 0, 0, 1], [1, 0, 0, 0, 0, 1]]
    assert history.counts is not None and history.counts[0, 5].item() == 0  # the original is untouched


def test_concatenate_gives_zero_counts_to_unmaterialised_parts() -> None:
    needed = TokenHistory.from_sequences([[3]], VOCAB, "cpu", needed=True)
    unneeded = TokenHistory.from_sequences([[1], [2]], VOCAB, "cpu", needed=False)
    merged = TokenHistory.concatenate([unneeded, needed])
    assert merged.counts is not None and merged.size == 3
    assert merged.counts.tolist() == [[0] * 6, [0] * 6, [0, 0, 0, 1, 0, 0]]
    merged.append(torch.tensor([1, 1, 1]))
    assert merged.counts[:, 1].tolist() == [1, 1, 1]
    assert TokenHistory.concatenate([unneeded, unneeded]).counts is None


def test_token_ids_outside_the_vocabulary_are_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="token id 6 is outside the vocabulary"):
        TokenHistory.from_sequences([[1], [6]], VOCAB, "cpu", needed=True)
