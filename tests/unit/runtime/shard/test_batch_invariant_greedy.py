"""--batch-invariant end to end on the shard's step path: in bf16, each request's greedy tokens are
the same alone, in a batch of 4 and in a batch of 40 (past the 33 rows where oneDNN's LM-head
product changes kernels on the Xeon; without the mode, 2 of these 4 rows diverged there at tokens
12-13 on that machine)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from shard_helpers import BlockPool, Outputs, make_request, make_runner, run_to_end, shard_batch

from tgictl.runtime.shard.step import ModelRunner

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def smollm2_shaped(make_tiny_model: Callable[..., Path]) -> Path:
    """SmolLM2-135M's widths (hidden 576, 9 query / 3 KV heads, MLP 1536, vocabulary 49152), 2 layers."""
    return make_tiny_model("llama", num_layers=2, hidden_size=576, num_heads=9, num_kv_heads=3,
                           intermediate_size=1536, vocab_size=49152, init_std=0.05, dtype="bfloat16")


def _greedy(runner: ModelRunner, prompts: list[list[int]], indices: range) -> dict[int, list[int]]:
    pool, outputs = BlockPool(), Outputs()
    requests = [make_request(pool, i, prompts[i], max_new_tokens=NEW_TOKENS, ignore_eos=True) for i in indices]
    run_to_end(runner, shard_batch(runner, 1, requests), outputs)
    return {i: outputs.ids(i) for i in indices}


def test_greedy_tokens_do_not_depend_on_the_batch(smollm2_shaped: Path, invariant: None) -> None:
    runner = make_runner(smollm2_shaped, num_blocks=2048, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(5, 40, (40,), generator=g).tolist()
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in lengths]
    alone = {i: _greedy(runner, prompts, range(i, i + 1))[i] for i in range(4)}
    assert all(len(tokens) == NEW_TOKENS for tokens in alone.values())
    for size in (4, 40):
        batched = _greedy(runner, prompts, range(size))
        for i in range(4):
            assert batched[i] == alone[i], (size, i)
