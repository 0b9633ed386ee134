"""Helpers for the model tests: paged forwards over router-style block tables, and the logits of the same tokens
through transformers (its own KV cache) to compare them with."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

from tgictl.kernels import build_attention_metadata
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.models.registry import load_model

CPU = torch.device("cpu")
BLOCK_SIZE = 4
NUM_BLOCKS = 48
PARITY_TOLERANCE = 1e-4
DECODE_STEPS = 16


def load(model_dir: Path, dtype: torch.dtype = torch.float32) -> CausalLM:
    return load_model(model_dir, dtype=dtype, device=CPU, dist=DistContext.single())


class PagedSequence:
    """One sequence's block table (shuffled blocks, as a router's free list hands them out) and slots."""

    def __init__(self, blocks: list[int]) -> None:
        self.blocks = blocks

    def slots(self, start: int, stop: int) -> Tensor:
        return torch.tensor([self.blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, stop)])


def shuffled_blocks(seed: int, count: int, first: int = 1) -> list[int]:
    blocks = list(range(first, first + count))
    random.Random(seed).shuffle(blocks)
    return blocks


def forward(
    model: CausalLM,
    cache: KVCache,
    parts: list[tuple[PagedSequence, Tensor, int]],
    all_logits: bool = False,
) -> list[Tensor]:
    """One paged forward over several sequences; parts: (sequence, new token ids, cache_len).

    Returns per sequence the logits of its last new token ([1, vocab]) or of every new token.
    """
    ids, positions, slots, rows, spans = [], [], [], [], []
    offset = 0
    for seq, new_ids, cache_len in parts:
        n = new_ids.shape[0]
        ids.append(new_ids)
        positions.append(torch.arange(cache_len, cache_len + n))
        slots.append(seq.slots(cache_len, cache_len + n))
        wanted = list(range(offset, offset + n)) if all_logits else [offset + n - 1]
        spans.append((len(rows), len(rows) + len(wanted)))
        rows.extend(wanted)
        offset += n
    meta = build_attention_metadata(
        [c for _, _, c in parts], [t.shape[0] for _, t, _ in parts], [s.blocks for s, _, _ in parts], BLOCK_SIZE, CPU
    )
    logits = model(torch.cat(ids), torch.cat(positions), torch.cat(slots), cache, meta, torch.tensor(rows))
    return [logits[a:b] for a, b in spans]


def hf_step(hf: Any, ids: Tensor, cache: Any) -> tuple[Tensor, Any]:
    """transformers forward with its own KV cache; returns (logits [tokens, vocab], cache)."""
    with torch.no_grad():
        out = hf(ids[None], use_cache=True, **({} if cache is None else {"cache": cache}))
    return out.logits[0].float(), out.cache


def tokens(seed: int, count: int) -> Tensor:
    return torch.randint(3, 512, (count,), generator=torch.Generator().manual_seed(seed))


def parity(model_dir: Path, steps: int = DECODE_STEPS) -> float:
    """Max |tgictl - transformers| over an 11-token prefill (all positions) and `steps` teacher-forced steps."""
    model = load(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    cache = model.allocate_kv_cache(NUM_BLOCKS, BLOCK_SIZE)
    seq = PagedSequence(shuffled_blocks(seed=7, count=8))
    prompt, forced = tokens(1, 11), tokens(2, steps)
    (ours,) = forward(model, cache, [(seq, prompt, 0)], all_logits=True)
    reference, hf_cache = hf_step(hf, prompt, None)
    worst = (ours - reference).abs().max().item()
    for step, token in enumerate(forced):
        (ours,) = forward(model, cache, [(seq, token[None], prompt.shape[0] + step)])
        reference, hf_cache = hf_step(hf, token[None], hf_cache)
        worst = max(worst, (ours[0] - reference[-1]).abs().max().item())
    return worst
