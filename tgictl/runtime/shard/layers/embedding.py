"""Vocab-parallel embedding and LM head: each rank holds a contiguous block of vocabulary rows.

Blocks are ceil(vocab / world_size) rows (the last rank's may be shorter), so any vocabulary size
splits. The embedding sums the ranks' partial lookups (each token lives on exactly one rank); the LM
head all-gathers every rank's logits, so every rank ends with identical full logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgictl.kernels.linear_methods import LinearWeight, Role
from tgictl.runtime.shard.dist import DistContext, all_gather, all_reduce
from tgictl.runtime.shard.layers.linear import as_linear_weight
from tgictl.runtime.shard.weights import Weights

# Rows the LM head computes per pass (see ParallelLMHead.forward).
LM_HEAD_ROWS = 512

def vocab_range(vocab_size: int, rank: int, world_size: int) -> tuple[int, int, int]:
    """(start, stop, block) of this rank's vocabulary rows; block is the padded per-rank size."""
    block = -(-vocab_size // world_size)
    start = min(rank * block, vocab_size)
    return start, min(start + block, vocab_size), block


def load_vocab_rows(weights: Weights, name: str, vocab_size: int) -> LinearWeight:
    """This rank's rows of a [vocab, hidden] matrix, in the format the vocabulary matrices take."""
    start, stop, _ = vocab_range(vocab_size, weights.dist.rank, weights.dist.world_size)
    return weights.linear_rows([(name, start, stop)], Role.VOCAB)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, weight: Tensor | LinearWeight, vocab_size: int, dist: DistContext) -> None:
        super().__init__()
        self.weight = as_linear_weight(weight)  # [rows_per_rank, hidden]; lookups dequantize their rows
        self.dist = dist
        self.start, self.stop, _ = vocab_range(vocab_size, dist.rank, dist.world_size)

    def forward(self, input_ids: Tensor) -> Tensor:
        """input_ids: [tokens] int64 -> [tokens, hidden]."""
        if not self.dist.is_sharded:
            return self.weight.embedding(input_ids)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.stop - self.start)  # [tokens] ids another rank holds
        out = self.weight.embedding(local.masked_fill(outside, 0))
        out = out.masked_fill(outside[:, None], 0)
        return all_reduce(out, self.dist)


class ParallelLMHead(nn.Module):
    def __init__(self, weight: Tensor | LinearWeight, vocab_size: int, dist: DistContext) -> None:
        super().__init__()
        # Shares the embedding's weight module when the embeddings are tied (same rows on every rank).
        self.weight = as_linear_weight(weight)
        self.vocab_size = vocab_size
        self.dist = dist
        _, _, self.block = vocab_range(vocab_size, dist.rank, dist.world_size)

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden: [n, hidden] -> logits [n, vocab_size] in the product's dtype (the model's), identical on
        every rank. Not widened to float32 here: the greedy kernel reads bf16 logits as they are (widening
        is exact), and the consumers that need float32 (log_softmax, the sampling warpers) widen what they
        use; a [32, 49,152] float32 copy per decode step cost ~1 ms on 2 cores.

        Many rows (a long prompt's logprobs) go LM_HEAD_ROWS at a time, so the gathered ranks exist for one
        slice at a time (at 4,096 rows of a 49,152-token vocabulary: 0.4 GB of bf16 per gather not held at
        once)."""
        if hidden.shape[0] <= LM_HEAD_ROWS:
            return self._logits(hidden)
        first = self._logits(hidden[:LM_HEAD_ROWS])
        logits = first.new_empty((hidden.shape[0], self.vocab_size))
        logits[:LM_HEAD_ROWS] = first
        for at in range(LM_HEAD_ROWS, hidden.shape[0], LM_HEAD_ROWS):
            logits[at : at + LM_HEAD_ROWS] = self._logits(hidden[at : at + LM_HEAD_ROWS])
        return logits

    def _logits(self, hidden: Tensor) -> Tensor:
        logits = self.weight(hidden)  # [n, rows_per_rank]
        if self.dist.is_sharded:
            missing = self.block - logits.shape[1]
            if missing:
                logits = F.pad(logits, (0, missing))  # every rank sends [n, block]
            logits = all_gather(logits, self.dist, dim=-1)[:, : self.vocab_size]
        return logits
