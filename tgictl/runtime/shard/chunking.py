"""How many tokens each row computes in the next forward (TGI's flash_causal_lm.py chunking).

Pure Python on (prompt length, cached length) pairs, so that the router's test double of a shard
(tgictl/testing/fake_shard.py) follows exactly the rule the real shard applies.
"""

from __future__ import annotations

from collections.abc import Sequence


def next_chunk_lengths(
    progress: Sequence[tuple[int, int]], max_prefill_tokens: int | None, pending: Sequence[int] | None = None
) -> list[int]:
    """`progress`: (prompt_len, cache_len) per row, in batch order. Decoding rows take their pending
    tokens (`pending`: 1, or 1 + the tokens a grammar forced, docs/architecture.md, "Guided
    generation"; None: 1 each), charged up front; the rest of the budget goes to prefilling rows from
    the newest (last) to the oldest, each getting at least 1 token so every row progresses. None: no
    budget."""
    lengths = [
        1 if pending is None or prompt_len > cache_len else max(pending[i], 1)
        for i, (prompt_len, cache_len) in enumerate(progress)
    ]
    budget = None if max_prefill_tokens is None else max_prefill_tokens - (sum(lengths) - 1)
    for i in range(len(progress) - 1, -1, -1):
        prompt_len, cache_len = progress[i]
        remaining = prompt_len - cache_len
        if remaining > 0:
            lengths[i] = remaining if budget is None else max(min(remaining, budget), 1)
            if budget is not None:
                budget -= lengths[i]
    return lengths
