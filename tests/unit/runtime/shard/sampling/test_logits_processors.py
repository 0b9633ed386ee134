"""Each sampling parameter does exactly what it says, checked through NextTokenChooser.process."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TypicalLogitsWarper,
)

from tgictl.errors import InvalidRequestError
from tgictl.proto.messages import SamplingParams
from tgictl.runtime.shard.sampling import logits_processors as lp
from tgictl.runtime.shard.sampling.logits_processors import CANDIDATE_LADDER
from tgictl.runtime.shard.sampling.sampler import (
    NextTokenChooser,
    TokenHistory,
    needs_history,
)

NEG_INF = float("-inf")


def process(params: list[SamplingParams], logits: torch.Tensor, prompts: list[list[int]] | None = None):
    vocab = logits.shape[1]
    chooser = NextTokenChooser.from_params(params, vocab, "cpu")
    prompts = prompts if prompts is not None else [[] for _ in params]
    history = TokenHistory.from_sequences(prompts, vocab, "cpu", needs_history(params))
    return chooser.process(logits, history)


def kept(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().squeeze(1).tolist())


def test_neutral_rows_are_bitwise_unchanged_next_to_active_rows() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 64)
    active = SamplingParams(
        temperature=0.7, top_k=10, top_p=0.8, typical_p=0.9, min_p=0.05, repetition_penalty=1.3,
        frequency_penalty=0.4, presence_penalty=0.3, seed=1,
    )
    out = process([SamplingParams(), active, SamplingParams(do_sample=True)], logits, [[1, 2], [3], [4]])
    assert torch.equal(out[0], logits[0])
    assert torch.equal(out[2], logits[2])
    assert not torch.equal(out[1], logits[1])


def test_temperature_divides_scores_of_its_row_only() -> None:
    torch.manual_seed(1)
    logits = torch.randn(2, 32)
    out = process([SamplingParams(temperature=0.5), SamplingParams()], logits)
    assert torch.equal(out[0], logits[0] / 0.5)
    assert torch.equal(out[1], logits[1])


def test_top_k_keeps_exactly_the_k_best() -> None:
    torch.manual_seed(2)
    logits = torch.randn(2, 100)  # continuous: no ties
    out = process([SamplingParams(top_k=3), SamplingParams(top_k=17)], logits)
    assert kept(out[0]) == set(logits[0].topk(3).indices.tolist())
    assert kept(out[1]) == set(logits[1].topk(17).indices.tolist())
    finite = torch.isfinite(out)
    assert torch.equal(out[finite], logits[finite])  # kept scores are untouched


def test_top_k_keeps_ties_at_the_kth_score() -> None:
    logits = torch.tensor([[5.0, 4.0, 1.0, 4.0, 4.0, 0.0]])
    out = process([SamplingParams(top_k=2)], logits)
    assert kept(out[0]) == {0, 1, 3, 4}


def test_top_k_larger_than_vocab_keeps_everything() -> None:
    logits = torch.randn(1, 8)
    assert torch.equal(process([SamplingParams(top_k=50)], logits), logits)


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [(0.45, {2}), (0.55, {2, 0}), (0.79, {2, 0}), (0.85, {2, 0, 3}), (0.96, {2, 0, 3, 1})],
)
def test_top_p_keeps_the_nucleus(top_p: float, expected: set[int]) -> None:
    # Probabilities 0.3, 0.05, 0.5, 0.15 at ids 0..3: nucleus order 2, 0, 3, 1.
    logits = torch.tensor([[0.3, 0.05, 0.5, 0.15]]).log()
    assert kept(process([SamplingParams(top_p=top_p)], logits)[0]) == expected


def reference_top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Full sort, straight from the definition."""
    probs = scores.softmax(-1)
    order = probs.argsort(descending=True)
    before = 0.0
    keep = torch.zeros_like(scores, dtype=torch.bool)
    for token in order.tolist():
        if before >= p:
            break
        keep[token] = True
        before += probs[token].item()
    return scores.masked_fill(~keep, NEG_INF)


def test_top_p_matches_the_definition_on_peaked_and_flat_rows() -> None:
    # Peaked rows settle within the first rung's candidates, a broader one on the second, flat rows need
    # the full sort: every rung gives the definition's answer.
    generator = torch.Generator().manual_seed(3)
    vocab = 6000
    scales = [8.0, 4.0, 0.3, 0.05, 2.0]
    tops = (0.9, 0.5, 0.95, 0.3, 0.5)
    logits = torch.stack([torch.randn(vocab, generator=generator) * s for s in scales])
    out = process([SamplingParams(top_p=p) for p in tops], logits.double().float())
    for row, p in enumerate(tops):
        expected = reference_top_p(logits[row], p)
        # Float summation order may differ at the very boundary token; allow at most that one.
        assert len(kept(out[row]) ^ kept(expected)) <= 1, row
    first, second = CANDIDATE_LADDER[:2]
    assert len(kept(out[0])) < first < len(kept(out[4])) < second < len(kept(out[2]))


def test_top_p_after_top_k_uses_the_renormalised_kept_set() -> None:
    # top_k=2 keeps probabilities 0.4, 0.3 -> renormalised 4/7, 3/7; top_p=0.5 keeps only the best.
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    assert kept(process([SamplingParams(top_k=2, top_p=0.5)], logits)[0]) == {0}
    assert kept(process([SamplingParams(top_p=0.5)], logits)[0]) == {0, 1}


@pytest.mark.parametrize("vocab", [300, 6000])
def test_typical_p_matches_transformers(vocab: int) -> None:
    generator = torch.Generator().manual_seed(4)
    masses = [0.2, 0.5, 0.9, 0.95, 0.99, 0.7]
    scales = [5.0, 2.0, 1.0, 0.2, 3.0, 0.05]
    logits = torch.stack([torch.randn(vocab, generator=generator) * s for s in scales])
    out = process([SamplingParams(typical_p=m) for m in masses], logits)
    for row, mass in enumerate(masses):
        expected = TypicalLogitsWarper(mass=mass)(None, logits[row : row + 1])[0]
        assert torch.equal(torch.isfinite(out[row]), torch.isfinite(expected)), (row, mass)
        assert torch.equal(out[row][torch.isfinite(out[row])], expected[torch.isfinite(expected)])


def test_min_p_removes_exactly_the_tokens_below_the_threshold() -> None:
    # Best 0.4, min_p 0.125 -> threshold 0.05: only the 0.04 token goes (0.06 stays).
    logits = torch.tensor([[0.3, 0.04, 0.4, 0.06, 0.2]]).log()
    assert kept(process([SamplingParams(min_p=0.125)], logits)[0]) == {0, 2, 3, 4}
    torch.manual_seed(5)
    logits = torch.randn(2, 500) * 2
    out = process([SamplingParams(min_p=0.1), SamplingParams(min_p=0.5)], logits)
    for row, p in enumerate((0.1, 0.5)):
        probs = logits[row].softmax(-1)
        assert kept(out[row]) == set((probs >= p * probs.max()).nonzero().squeeze(1).tolist())


def test_repetition_penalty_lowers_only_repeated_tokens() -> None:
    logits = torch.tensor([[2.0, -1.0, 3.0, -2.0, 1.0, 0.5], [2.0, -1.0, 3.0, -2.0, 1.0, 0.5]])
    prompts = [[2, 3, 2, 2], [5]]  # rows of different lengths: nothing pads row 1 with token 0
    out = process([SamplingParams(repetition_penalty=2.0), SamplingParams(repetition_penalty=2.0)], logits, prompts)
    assert out[0].tolist() == [2.0, -1.0, 1.5, -4.0, 1.0, 0.5]  # once per distinct token, not per count
    assert out[1].tolist() == [2.0, -1.0, 3.0, -2.0, 1.0, 0.25]  # token 0 untouched


def test_repetition_penalty_below_one_raises_repeated_tokens() -> None:
    logits = torch.tensor([[2.0, -1.0, 3.0, -2.0]])
    out = process([SamplingParams(repetition_penalty=0.5)], logits, [[0, 1]])
    assert out[0].tolist() == [4.0, -0.5, 3.0, -2.0]


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_matches_transformers(penalty: float) -> None:
    torch.manual_seed(6)
    logits = torch.randn(1, 50)
    prompt = [3, 7, 7, 0, 49, 12]
    out = process([SamplingParams(repetition_penalty=penalty)], logits, [prompt])
    expected = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt]), logits.clone())
    assert torch.equal(out, expected)


def test_frequency_and_presence_penalties_subtract_the_right_amounts() -> None:
    logits = torch.zeros(3, 5)
    prompts = [[1, 1, 1, 4], [1, 1, 1, 4], [1, 1, 1, 4]]
    params = [
        SamplingParams(frequency_penalty=0.5),
        SamplingParams(presence_penalty=0.25),
        SamplingParams(frequency_penalty=0.5, presence_penalty=-1.0),
    ]
    out = process(params, logits, prompts)
    assert out[0].tolist() == [0.0, -1.5, 0.0, 0.0, -0.5]  # raw counts: 3 and 1
    assert out[1].tolist() == [0.0, -0.25, 0.0, 0.0, -0.25]  # once per present token
    assert out[2].tolist() == [0.0, -0.5, 0.0, 0.0, 0.5]


def test_penalties_count_generated_tokens_too() -> None:
    logits = torch.zeros(1, 5)
    vocab = 5
    params = [SamplingParams(frequency_penalty=1.0)]
    chooser = NextTokenChooser.from_params(params, vocab, "cpu")
    history = TokenHistory.from_sequences([[2]], vocab, "cpu", needed=True)
    history.append(torch.tensor([2]))
    history.append(torch.tensor([3]))
    assert chooser.process(logits, history)[0].tolist() == [0.0, 0.0, -2.0, -1.0, 0.0]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 0.0), ("temperature", math.inf), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
        ("typical_p", 0.0), ("min_p", 1.0), ("min_p", -0.1), ("repetition_penalty", 0.0),
        ("frequency_penalty", math.nan), ("presence_penalty", math.inf), ("seed", -1), ("seed", 2**64),
    ],
)
def test_out_of_range_parameters_are_rejected_with_their_name(field: str, value: float) -> None:
    with pytest.raises(InvalidRequestError, match=f"sampling.{field} of request row 1"):
        NextTokenChooser.from_params([SamplingParams(), SamplingParams(**{field: value})], 10, "cpu")


def test_sort_based_warpers_leave_neutral_rows_alone_when_called_on_them() -> None:
    # The chooser passes only active rows, but the functions themselves must be identities on neutral ones.
    generator = torch.Generator().manual_seed(7)
    # The neutral row is so peaked that float32 cumulative sums reach 1.0 long before its last token.
    scores = torch.randn(3, 700, generator=generator) * torch.tensor([[4.0], [40.0], [2.0]])
    for warp, value in ((lp.top_p, 0.9), (lp.typical_p, 0.9)):
        out = warp(scores, torch.tensor([[value], [1.0], [value]]))
        assert torch.equal(out[1], scores[1])
        assert torch.equal(out[[0, 2]], warp(scores[[0, 2]], torch.tensor([[value], [value]])))
        assert 0 < torch.isfinite(out[0]).sum().item() < 700
