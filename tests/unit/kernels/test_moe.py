"""MoE routing and grouping (kernels/moe.py): transformers' router arithmetic, the pairs sorted by expert, and the
weighted sum back to the tokens."""

from __future__ import annotations

import torch

from tgictl.kernels.moe import ExpertGroups, route


def test_route_takes_the_top_k_of_the_softmax_and_renormalises() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 2.9]])
    ids, weights = route(logits, 2, normalize=False)
    probs = torch.softmax(logits, dim=-1)
    assert ids.tolist() == [[1, 2], [0, 3]]
    torch.testing.assert_close(weights, probs.gather(1, ids), rtol=0, atol=0)
    _, normalized = route(logits, 2, normalize=True)
    torch.testing.assert_close(normalized.sum(-1), torch.ones(2))
    torch.testing.assert_close(normalized, weights / weights.sum(-1, keepdim=True), rtol=0, atol=0)


def test_route_softmax_is_float32_whatever_the_logits_dtype() -> None:
    logits = torch.randn(5, 16, generator=torch.Generator().manual_seed(0)).bfloat16()
    ids, weights = route(logits, 4, normalize=True)
    expected_weights, expected_ids = torch.topk(torch.softmax(logits.float(), -1), 4, -1)
    assert weights.dtype == torch.float32 and torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights / expected_weights.sum(-1, keepdim=True))


def test_groups_sort_pairs_by_expert_keeping_token_order() -> None:
    ids = torch.tensor([[3, 0], [0, 5], [3, 1]])  # 3 tokens, top 2, 6 experts (2 and 4 unused)
    groups = ExpertGroups.build(ids, 6)
    assert groups.spans == ((0, 0, 2), (1, 2, 3), (3, 3, 5), (5, 5, 6))
    assert groups.active_experts == (0, 1, 3, 5)
    assert groups.tokens.tolist() == [0, 1, 2, 0, 2, 1]  # expert 0: tokens 0, 1; expert 1: 2; expert 3: 0, 2; 5: 1
    assert groups.order.tolist() == [1, 2, 5, 0, 4, 3]  # pair = token * top_k + choice
    x = torch.arange(3.0).unsqueeze(1).expand(3, 4)
    assert groups.gather(x)[:, 0].tolist() == [0.0, 1.0, 2.0, 0.0, 2.0, 1.0]


def test_one_row_groups_only_its_chosen_experts() -> None:
    groups = ExpertGroups.build(torch.tensor([[7, 2, 100, 41]]), 128)
    assert groups.active_experts == (2, 7, 41, 100)
    assert all(stop - start == 1 for _, start, stop in groups.spans)


def test_combine_is_each_tokens_weighted_sum_in_float32() -> None:
    generator = torch.Generator().manual_seed(1)
    tokens, top_k, experts, hidden = 6, 3, 5, 8
    ids = torch.stack([torch.randperm(experts, generator=generator)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=generator)
    outputs_by_pair = torch.randn(tokens * top_k, hidden, generator=generator)  # pair p's expert output
    groups = ExpertGroups.build(ids, experts)
    sorted_outputs = outputs_by_pair[groups.order]
    expected = (outputs_by_pair.view(tokens, top_k, hidden) * weights.unsqueeze(-1)).sum(1)
    torch.testing.assert_close(groups.combine(sorted_outputs, weights), expected)
    from_bf16 = groups.combine(sorted_outputs.bfloat16(), weights)  # bf16 outputs widen exactly; float32 sums
    exact = (outputs_by_pair.bfloat16().float().view(tokens, top_k, hidden) * weights.unsqueeze(-1)).sum(1)
    assert from_bf16.dtype == torch.float32 and torch.equal(from_bf16, exact)
