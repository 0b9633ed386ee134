"""Mixture-of-experts routing and grouping as pure functions on tensors (docs/moe.md): the router's top-k choice,
the step's token-expert pairs grouped by expert, and the weighted sum that brings the experts' outputs back to
their tokens.

Why group: a token picks k of E experts, so a batch of T tokens makes T * k pairs spread over up to E experts.
Sorting the pairs by expert once gives every active expert one contiguous slice of rows, which its weights then
multiply in one product (one read of its weights for all its tokens; at one row only the k chosen experts' weights
are read). No per-token loop, no product for an expert nobody chose.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def route(logits: Tensor, top_k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """transformers' MoE routers: softmax over the experts in float32, the top_k largest probabilities (ties: the
    lower expert id first, torch.topk's rule), divided by their sum when `normalize`.

    logits: [tokens, experts]. Returns (expert ids [tokens, top_k] int64, weights [tokens, top_k] float32), each
    row in decreasing probability.
    """
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


@dataclass(frozen=True)
class ExpertGroups:
    """A step's token-expert pairs sorted by expert (stable: tokens in batch order within an expert).

    A pair p = token * top_k + j is the token's j-th choice. `order` [pairs] holds the pairs in sorted order,
    `tokens` [pairs] each sorted pair's token, and `spans` every active expert's (expert, start, stop) slice of
    the sorted pairs, in expert order.
    """

    num_tokens: int
    top_k: int
    order: Tensor
    tokens: Tensor
    spans: tuple[tuple[int, int, int], ...]

    @classmethod
    def build(cls, ids: Tensor, num_experts: int) -> ExpertGroups:
        """ids: [tokens, top_k] int64 expert ids from `route`."""
        num_tokens, top_k = ids.shape
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=num_experts).tolist()
        spans, start = [], 0
        for expert, count in enumerate(counts):
            if count:
                spans.append((expert, start, start + count))
                start += count
        return cls(num_tokens, top_k, order, torch.div(order, top_k, rounding_mode="floor"), tuple(spans))

    @property
    def active_experts(self) -> tuple[int, ...]:
        return tuple(expert for expert, _, _ in self.spans)

    def gather(self, x: Tensor) -> Tensor:
        """x [tokens, hidden] -> [pairs, hidden]: each sorted pair's token row."""
        return x.index_select(0, self.tokens)

    def combine(self, outputs: Tensor, weights: Tensor) -> Tensor:
        """Each token's sum over its k choices of weight * output, in float32 in the token's choice order (the
        order transformers' grouped path sums in; independent of the other tokens).

        outputs: [pairs, hidden] the experts' outputs in sorted order; weights: [tokens, top_k] from `route`
        (rounded to the activations' dtype already where the family does so). Returns [tokens, hidden] float32:
        the caller rounds once, after the tensor-parallel sum.
        """
        pairs = torch.empty(outputs.shape, dtype=torch.float32, device=outputs.device)
        pairs.index_copy_(0, self.order, outputs.float())
        pairs.mul_(weights.reshape(-1, 1).float())
        return pairs.view(self.num_tokens, self.top_k, -1).sum(dim=1)
