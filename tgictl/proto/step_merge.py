"""Consecutive steps of one batch read as one step (generate.proto's DecodeRequest.steps).

A Decode that runs several steps answers with one Generation per request, as a speculative step that
produced several tokens does: its tokens and top tokens those of every step in order, generated_text from
the step it finished in (a finished row leaves the batch, so no later step reports it), prompt logprobs
with its first token (they come with a request's first generation), draft counts summed, the error of the
step it failed in. The shard
(runtime/shard/decode_steps.py) and the testing fake shard both merge this way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from tgictl.proto.messages import Generation, Tokens


def merge_generation(earlier: Generation, later: Generation) -> Generation:
    """One request's generations of two consecutive steps as one."""
    return dataclasses.replace(
        earlier,
        tokens=Tokens(earlier.tokens.ids + later.tokens.ids, earlier.tokens.logprobs + later.tokens.logprobs),
        top_tokens=earlier.top_tokens + later.top_tokens,
        generated_text=later.generated_text,
        draft_tokens=earlier.draft_tokens + later.draft_tokens,
        accepted_tokens=earlier.accepted_tokens + later.accepted_tokens,
        error=later.error,  # a request that failed in the later step: its earlier tokens, then its error
    )


def merge_generations(earlier: Sequence[Generation], later: Iterable[Generation]) -> list[Generation]:
    """Two consecutive steps' generations as one step's, in the order requests first reported."""
    merged = list(earlier)
    index = {g.request_id: i for i, g in enumerate(merged)}
    for generation in later:
        at = index.get(generation.request_id)
        if at is None:  # its first token came in the later step (a prompt's last chunk)
            index[generation.request_id] = len(merged)
            merged.append(generation)
        else:
            merged[at] = merge_generation(merged[at], generation)
    return merged
