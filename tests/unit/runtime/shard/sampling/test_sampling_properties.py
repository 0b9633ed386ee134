"""Hypothesis properties of NextTokenChooser over random parameter mixes."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tgictl.proto.messages import SamplingParams
from tgictl.runtime.shard.sampling.sampler import (
    NextTokenChooser,
    TokenHistory,
    needs_history,
)

VOCAB = 40

sampling_params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([1.0, 0.3, 0.9, 1.7]),
    top_k=st.sampled_from([0, 1, 3, 20, VOCAB + 5]),
    top_p=st.sampled_from([1.0, 0.2, 0.9]),
    typical_p=st.sampled_from([1.0, 0.5, 0.95]),
    min_p=st.sampled_from([0.0, 0.1, 0.5]),
    do_sample=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**64 - 1),
    repetition_penalty=st.sampled_from([1.0, 0.8, 1.5]),
    frequency_penalty=st.sampled_from([0.0, -0.5, 1.0]),
    presence_penalty=st.sampled_from([0.0, 0.5, -1.0]),
)
rows = st.tuples(
    sampling_params,
    st.lists(st.integers(min_value=0, max_value=VOCAB - 1), max_size=12),  # prompt
    st.integers(min_value=0, max_value=2**20),  # logits seed
    st.integers(min_value=0, max_value=500),  # step
)


def choose(batch: list[tuple[SamplingParams, list[int], int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    params = [row[0] for row in batch]
    logits = torch.stack([torch.randn(VOCAB, generator=torch.Generator().manual_seed(row[2])) * 3 for row in batch])
    chooser = NextTokenChooser.from_params(params, VOCAB, "cpu")
    history = TokenHistory.from_sequences([row[1] for row in batch], VOCAB, "cpu", needs_history(params))
    steps = torch.tensor([row[3] for row in batch], dtype=torch.int64)
    return chooser(logits, history, steps).next_ids, chooser.process(logits, history)


@settings(max_examples=25, deadline=None)
@given(st.lists(rows, min_size=1, max_size=6))
def test_each_row_is_chosen_as_if_alone_and_only_among_kept_tokens(batch: list) -> None:
    next_ids, scores = choose(batch)
    for index, row in enumerate(batch):
        assert next_ids[index].item() == choose([row])[0].item()
        assert torch.isfinite(scores[index, next_ids[index]])  # never a token a warper removed
        if not row[0].samples:
            assert next_ids[index].item() == scores[index].argmax().item()
