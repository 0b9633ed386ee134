"""Helpers for the shard runtime tests: requests with router-style block placement, runners, step loops."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tgictl.quantization import QuantizeSpec
from tgictl.proto.messages import (
    Batch,
    Generation,
    Request,
    SamplingParams,
    StoppingParams,
)
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.models.registry import load_model
from tgictl.runtime.shard.sampling.grammar import GrammarCompiler
from tgictl.runtime.shard.step import ModelRunner

BLOCK_SIZE = 16
CPU = torch.device("cpu")


@dataclass
class BlockPool:
    """Hands out fresh blocks from 1 upwards (block 0 is the health probe's), as the router would."""

    next_block: int = 1

    def take(self, tokens: int, block_size: int = BLOCK_SIZE) -> tuple[int, ...]:
        count = math.ceil(tokens / block_size)
        blocks = tuple(range(self.next_block, self.next_block + count))
        self.next_block += count
        return blocks


def make_request(
    pool: BlockPool,
    rid: int,
    prompt: list[int] | tuple[int, ...],
    *,
    max_new_tokens: int = 8,
    sampling: SamplingParams | None = None,
    ignore_eos: bool = False,
    prefill_logprobs: bool = False,
    top_n_tokens: int = 0,
    cache_len: int = 0,
    chunk_len: int | None = None,
    blocks: tuple[int, ...] | None = None,
) -> Request:
    """Blocks for every position the request writes (prompt + max_new_tokens - 1), unless given."""
    blocks = blocks if blocks is not None else pool.take(len(prompt) + max_new_tokens - 1)
    return Request(
        id=rid,
        input_ids=tuple(prompt),
        sampling=sampling or SamplingParams(),
        stopping=StoppingParams(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos),
        blocks=blocks,
        cache_len=cache_len,
        chunk_len=chunk_len,
        prefill_logprobs=prefill_logprobs,
        top_n_tokens=top_n_tokens,
    )


def make_runner(
    model_dir: Path, num_blocks: int = 256, dtype: torch.dtype = torch.float32, forced_tokens: bool = True,
    quantize: QuantizeSpec | None = None, kv_cache_dtype: str = "auto",
) -> ModelRunner:
    dist = DistContext.single()
    model = load_model(Path(model_dir), dtype=dtype, device=CPU, dist=dist, quantize=quantize)
    cache = KVCache.for_model(
        model.config, world_size=1, num_blocks=num_blocks, block_size=BLOCK_SIZE, dtype=dtype, device=CPU,
        kv_cache_dtype=kv_cache_dtype,
    )
    grammars = GrammarCompiler(Path(model_dir), model.config.vocab_size, tuple(model.config.eos_token_ids))
    return ModelRunner(
        model, cache, block_size=BLOCK_SIZE, dist=dist, device=CPU, grammars=grammars, forced_tokens=forced_tokens
    )


def shard_batch(runner: ModelRunner, batch_id: int, requests: list[Request]) -> ShardBatch:
    return ShardBatch.from_batch(
        Batch(id=batch_id, requests=tuple(requests)),
        block_size=runner.block_size,
        num_blocks=runner.kv_cache.num_blocks,
        vocab_size=runner.vocab_size,
        device=runner.device,
        grammars=runner.grammars,
    )


@dataclass
class Outputs:
    """Everything a request emitted, gathered over steps."""

    generations: dict[int, list[Generation]] = field(default_factory=dict)

    def add(self, generations: list[Generation]) -> list[int]:
        """Record one step; returns the ids that finished in it."""
        finished = []
        for g in generations:
            self.generations.setdefault(g.request_id, []).append(g)
            if g.generated_text is not None:
                finished.append(g.request_id)
        return finished

    def ids(self, rid: int) -> list[int]:
        return [t for g in self.generations[rid] for t in g.tokens.ids]

    def logprobs(self, rid: int) -> list[float]:
        return [lp for g in self.generations[rid] for lp in g.tokens.logprobs]


def step(runner: ModelRunner, batch: ShardBatch, outputs: Outputs) -> ShardBatch | None:
    """One generate_token, then filter out finished requests as the router does."""
    generations, batch_next, _ = runner.generate_token(batch)
    finished = outputs.add(generations)
    if batch_next is None:
        return None
    keep = [rid for rid in batch_next.request_ids if rid not in finished]
    return batch_next.filter(keep) if keep else None


def run_to_end(runner: ModelRunner, batch: ShardBatch | None, outputs: Outputs, max_steps: int = 1000) -> None:
    for _ in range(max_steps):
        if batch is None:
            return
        batch = step(runner, batch, outputs)
    raise AssertionError("batch did not finish")
