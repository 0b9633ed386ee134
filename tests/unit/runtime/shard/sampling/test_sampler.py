"""NextTokenChooser end to end: choices, seeds, logprobs, filter/concatenate, top-n tokens."""

from __future__ import annotations

import torch

from tgictl.proto.messages import SamplingParams
from tgictl.runtime.shard.sampling.sampler import (
    NextTokenChooser,
    TokenHistory,
    needs_history,
    top_n_tokens,
)

VOCAB = 64


def run_steps(
    params: list[SamplingParams], logits: torch.Tensor, steps: int, prompts: list[list[int]] | None = None
) -> list[list[int]]:
    """Tokens per row over `steps` steps with the same logits each step (history grows)."""
    chooser = NextTokenChooser.from_params(params, logits.shape[1], "cpu")
    prompts = prompts if prompts is not None else [[1, 2, 3] for _ in params]
    history = TokenHistory.from_sequences(prompts, logits.shape[1], "cpu", needs_history(params))
    tokens: list[list[int]] = [[] for _ in params]
    for step in range(steps):
        out = chooser(logits, history, torch.full((len(params),), step, dtype=torch.int64))
        history.append(out.next_ids)
        for row, token in enumerate(out.next_ids.tolist()):
            tokens[row].append(token)
    return tokens


def test_greedy_fast_path_is_argmax_with_ties_to_the_lowest_id() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0], [-1.0, -5.0, 2.0, 2.0]])
    chooser = NextTokenChooser.from_params([SamplingParams()] * 3, 4, "cpu")
    assert chooser.fast_path
    history = TokenHistory.from_sequences([[0], [1], [2]], 4, "cpu", needed=False)
    out = chooser(logits, history, torch.zeros(3, dtype=torch.int64))
    assert out.next_ids.tolist() == [1, 0, 2]
    assert torch.equal(out.log_probs, logits.log_softmax(-1))
    assert torch.equal(out.logprobs, logits.log_softmax(-1)[torch.arange(3), out.next_ids])


def test_greedy_without_top_n_skips_the_distribution_and_matches_the_full_path() -> None:
    logits = torch.randn(32, 49152, generator=torch.Generator().manual_seed(3)) * 4
    logits[5, 11] = logits[5, 40000] = logits[5].max() + 1  # a tie: the lowest id, as argmax
    chooser = NextTokenChooser.from_params([SamplingParams()] * 32, 49152, "cpu")
    history = TokenHistory.from_sequences([[0]] * 32, 49152, "cpu", needed=False)
    steps = torch.zeros(32, dtype=torch.int64)
    full = chooser(logits, history, steps)
    fast = chooser(logits, history, steps, distribution=False)
    assert fast.log_probs is None and full.log_probs is not None
    assert torch.equal(fast.next_ids, full.next_ids) and fast.next_ids[5].item() == 11
    # Both within 1e-5 of the float64 truth: the fast path sums in double, log_softmax's float32 sum over
    # 49,152 terms drifts by ~1e-6 with AVX-512's 16 lanes and by up to ~1e-5 with AVX2's 8.
    exact = logits.double().log_softmax(-1)[torch.arange(32), full.next_ids].float()
    torch.testing.assert_close(fast.logprobs, exact, rtol=0, atol=1e-6)
    torch.testing.assert_close(full.logprobs, exact, rtol=0, atol=2e-5)


def test_without_the_distribution_rules_masks_and_draws_choose_the_same_with_the_models_logprobs() -> None:
    # distribution=False (no top-n) skips the [B, V] log_softmax on every path: the chosen tokens are the
    # full path's, their logprobs the raw logits' log_softmax (from the greedy kernel's normaliser)
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(4)) * 3
    history = TokenHistory.from_sequences([[1], [2], [3]], VOCAB, "cpu", needed=True)
    steps = torch.tensor([0, 5, 9])
    allowed = torch.ones(3, VOCAB, dtype=torch.bool)
    allowed[:, logits.argmax(-1)] = False
    cases = [
        ([SamplingParams(repetition_penalty=1.3)] * 3, None),
        ([SamplingParams(do_sample=True, temperature=0.7, top_p=0.9, seed=s) for s in range(3)], None),
        ([SamplingParams()] * 3, allowed),
    ]
    for params, mask in cases:
        chooser = NextTokenChooser.from_params(params, VOCAB, "cpu")
        lean = chooser(logits, history, steps, mask, distribution=False)
        full = chooser(logits, history, steps, mask, distribution=True)
        assert lean.log_probs is None and full.log_probs is not None
        assert torch.equal(lean.next_ids, full.next_ids)
        torch.testing.assert_close(lean.logprobs, full.logprobs, rtol=0, atol=2e-5)
        exact = logits.double().log_softmax(-1).gather(1, lean.next_ids[:, None])[:, 0]
        torch.testing.assert_close(lean.logprobs.double(), exact, rtol=0, atol=2e-6)
    assert all(bool(allowed[r, lean.next_ids[r]]) for r in range(3))  # the last case's mask was applied


def test_top_k_one_equals_greedy() -> None:
    torch.manual_seed(0)
    logits = torch.randn(8, VOCAB)
    params = [SamplingParams(top_k=1, do_sample=True, seed=s, temperature=1.5) for s in range(8)]
    out = NextTokenChooser.from_params(params, VOCAB, "cpu")(
        logits, TokenHistory.from_sequences([[]] * 8, VOCAB, "cpu", False), torch.arange(8)
    )
    assert torch.equal(out.next_ids, logits.argmax(-1))


def test_greedy_rows_with_penalties_take_the_argmax_of_penalised_scores() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    # Token 0 in the prompt: 3.0 / 2 = 1.5 < 2.0, so greedy moves to token 1.
    tokens = run_steps([SamplingParams(repetition_penalty=2.0)], logits, 1, prompts=[[0]])
    assert tokens == [[1]]


def test_logprobs_are_the_raw_log_softmax_even_with_top_k_and_penalties() -> None:
    # TGI returns logprobs of the warped distribution (renormalised over top_k); we return the model's.
    torch.manual_seed(1)
    logits = torch.randn(3, VOCAB)
    params = [
        SamplingParams(top_k=2, do_sample=True, seed=1),
        SamplingParams(top_p=0.3, temperature=0.5, seed=2),
        SamplingParams(repetition_penalty=1.5, frequency_penalty=1.0),
    ]
    chooser = NextTokenChooser.from_params(params, VOCAB, "cpu")
    history = TokenHistory.from_sequences([[1], [2], [3, 4]], VOCAB, "cpu", needs_history(params))
    out = chooser(logits, history, torch.zeros(3, dtype=torch.int64))
    raw = logits.log_softmax(-1)
    assert torch.equal(out.log_probs, raw)
    assert torch.equal(out.logprobs, raw[torch.arange(3), out.next_ids])
    assert torch.isfinite(out.log_probs).all()  # tokens removed by top_k still have their logprob
    assert out.logprobs[0].item() < 0.0  # not the renormalised log(1) or log(0.5) of a 2-token set


def test_same_seed_gives_the_same_tokens_alone_and_anywhere_in_a_batch_of_eight() -> None:
    generator = torch.Generator().manual_seed(2)
    target = SamplingParams(do_sample=True, seed=12345, temperature=1.3, top_p=0.95, frequency_penalty=0.3)
    target_logits = torch.randn(1, VOCAB, generator=generator)
    alone = run_steps([target], target_logits, 24)[0]
    others = [
        SamplingParams(),
        SamplingParams(do_sample=True, seed=12345),  # same seed, different settings
        SamplingParams(top_k=5, seed=7),
        SamplingParams(repetition_penalty=1.4),
        SamplingParams(typical_p=0.8, seed=9, min_p=0.05),
        SamplingParams(temperature=0.6, seed=2**64 - 1),
        SamplingParams(presence_penalty=1.0, do_sample=True, seed=3),
    ]
    other_logits = torch.randn(7, VOCAB, generator=generator)
    for position in (0, 3, 7):
        order = list(range(7))
        torch.manual_seed(position)
        order = [order[i] for i in torch.randperm(7).tolist()]
        params = [others[i] for i in order]
        rows = [other_logits[i] for i in order]
        params.insert(position, target)
        rows.insert(position, target_logits[0])
        batched = run_steps(params, torch.stack(rows), 24)
        assert batched[position] == alone, position
    assert len(set(alone)) > 5  # it really sampled


def test_different_seeds_give_different_tokens() -> None:
    logits = torch.zeros(1, VOCAB)  # uniform: every token equally likely
    sequences = {tuple(run_steps([SamplingParams(do_sample=True, seed=s)], logits, 16)[0]) for s in range(6)}
    assert len(sequences) == 6


def test_step_count_drives_the_draw_not_the_call_count() -> None:
    logits = torch.zeros(1, VOCAB)
    params = [SamplingParams(do_sample=True, seed=99)]
    chooser = NextTokenChooser.from_params(params, VOCAB, "cpu")
    history = TokenHistory.from_sequences([[]], VOCAB, "cpu", False)
    first = [chooser(logits, history, torch.tensor([s])).next_ids.item() for s in range(10)]
    again = [chooser(logits, history, torch.tensor([s])).next_ids.item() for s in reversed(range(10))]
    assert first == again[::-1]


def test_sampling_frequencies_match_the_softmax() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log()
    draws = 4000
    for temperature in (1.0, 0.5):
        expected = (logits / temperature).softmax(-1)
        # One seed over many steps, and many seeds at one step: both must follow the distribution.
        one_seed = [SamplingParams(do_sample=True, seed=7, temperature=temperature)] * draws
        many_seeds = [SamplingParams(do_sample=True, seed=s, temperature=temperature) for s in range(draws)]
        for params, steps in ((one_seed, torch.arange(draws)), (many_seeds, torch.zeros(draws, dtype=torch.int64))):
            chooser = NextTokenChooser.from_params(params, 4, "cpu")
            history = TokenHistory.from_sequences([[]] * draws, 4, "cpu", False)
            ids = chooser(logits.expand(draws, 4), history, steps).next_ids
            frequencies = torch.bincount(ids, minlength=4).float() / draws
            assert (frequencies - expected).abs().max().item() < 0.03, (temperature, frequencies, expected)


def test_zero_probability_tokens_are_never_sampled() -> None:
    logits = torch.full((1, VOCAB), float("-inf"))
    logits[0, 5] = 0.0
    logits[0, 40] = 1.0
    draws = run_steps([SamplingParams(do_sample=True, seed=4)], logits, 50)[0]
    assert set(draws) <= {5, 40} and set(draws) == {5, 40}


def test_filter_and_concatenate_keep_each_rows_behaviour() -> None:
    generator = torch.Generator().manual_seed(3)
    params_a = [SamplingParams(do_sample=True, seed=1), SamplingParams(), SamplingParams(top_p=0.9, seed=2)]
    params_b = [SamplingParams(repetition_penalty=1.5, seed=3, do_sample=True), SamplingParams(top_k=4, seed=4)]
    prompts_a, prompts_b = [[1, 2], [3], [4, 5, 6]], [[7, 7], [8]]
    logits = torch.randn(5, VOCAB, generator=generator)
    steps = torch.tensor([3, 1, 4, 1, 5])

    def choose_each() -> list[int]:
        """Every row on its own chooser and history."""
        ids = []
        for row, (params, prompt) in enumerate(zip(params_a + params_b, prompts_a + prompts_b)):
            chooser = NextTokenChooser.from_params([params], VOCAB, "cpu")
            history = TokenHistory.from_sequences([prompt], VOCAB, "cpu", needs_history([params]))
            ids.append(chooser(logits[row : row + 1], history, steps[row : row + 1]).next_ids.item())
        return ids

    alone = choose_each()
    chooser_a = NextTokenChooser.from_params(params_a, VOCAB, "cpu")
    chooser_b = NextTokenChooser.from_params(params_b, VOCAB, "cpu")
    history_a = TokenHistory.from_sequences(prompts_a, VOCAB, "cpu", needs_history(params_a))
    history_b = TokenHistory.from_sequences(prompts_b, VOCAB, "cpu", needs_history(params_b))
    assert not history_a.materialised and history_b.materialised

    chooser = NextTokenChooser.concatenate([chooser_a, chooser_b])
    history = TokenHistory.concatenate([history_a, history_b])
    assert chooser(logits, history, steps).next_ids.tolist() == alone

    keep = [4, 0, 3]
    filtered = chooser.filter(keep)(logits[keep], history.filter(keep), steps[keep])
    assert filtered.next_ids.tolist() == [alone[i] for i in keep]


def test_top_n_tokens_follows_tgi() -> None:
    log_probs = torch.tensor([[-1.0, -3.0, -4.0, -2.0, -3.0]]).expand(6, 5)
    result = top_n_tokens(log_probs, [0, 2, 3, 4, 5, 9])
    assert [ids for ids, _ in result] == [[], [0, 3], [0, 3, 1, 4], [0, 3, 1, 4], [0, 3, 1, 4, 2], [0, 3, 1, 4, 2]]
    assert result[2][1] == [-1.0, -2.0, -3.0, -3.0]


def test_top_n_tokens_with_no_requests_is_all_empty() -> None:
    assert top_n_tokens(torch.randn(2, 7), [0, 0]) == [([], []), ([], [])]


MIXED = [
    SamplingParams(),
    SamplingParams(do_sample=True, seed=3, temperature=1.7),
    SamplingParams(do_sample=True, seed=5, top_k=5, top_p=0.9, min_p=0.05),
    SamplingParams(repetition_penalty=3.0, frequency_penalty=2.0, presence_penalty=2.0),
    SamplingParams(do_sample=True, seed=9, typical_p=0.5, repetition_penalty=0.5),
]


def test_a_grammar_mask_applies_before_every_rule() -> None:
    """Whatever the rule, a row picks only allowed tokens; an all-allowed row picks exactly what it
    picks without a mask; logprobs stay the raw model's."""
    torch.manual_seed(1)
    logits = torch.randn(len(MIXED), VOCAB) * 4
    history = TokenHistory.from_sequences([[1, 2, 3]] * len(MIXED), VOCAB, "cpu", needs_history(MIXED))
    chooser = NextTokenChooser.from_params(MIXED, VOCAB, "cpu")
    steps = torch.zeros(len(MIXED), dtype=torch.int64)
    unmasked = chooser(logits, history, steps)
    for trial in range(20):
        allowed = torch.rand(len(MIXED), VOCAB, generator=torch.Generator().manual_seed(trial)) < 0.1
        allowed[:, 7] = True  # at least one allowed token per row
        allowed[0] = True  # row 0 unconstrained
        masked = chooser(logits, history, steps + trial, allowed)
        assert allowed[torch.arange(len(MIXED)), masked.next_ids].all()
        assert torch.equal(masked.log_probs, logits.log_softmax(-1))
    everything = chooser(logits, history, steps, torch.ones_like(logits, dtype=torch.bool))
    assert torch.equal(everything.next_ids, unmasked.next_ids)


def test_a_mask_leaving_one_token_picks_it_even_when_the_model_dislikes_it() -> None:
    logits = torch.zeros(len(MIXED), VOCAB)
    logits[:, 11] = -1e30  # the model's least likely token
    allowed = torch.zeros(len(MIXED), VOCAB, dtype=torch.bool)
    allowed[:, 11] = True
    history = TokenHistory.from_sequences([[11]] * len(MIXED), VOCAB, "cpu", needs_history(MIXED))
    out = NextTokenChooser.from_params(MIXED, VOCAB, "cpu")(logits, history, torch.zeros(len(MIXED), dtype=torch.int64), allowed)
    assert out.next_ids.tolist() == [11] * len(MIXED)


def test_the_cpu_draw_from_python_uniforms_equals_the_tensor_uniforms_draw() -> None:
    # On the CPU the uniforms come from Python ints (uniform_from_keys); the tensor hash is the device path
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(11)) * 2
    params = [SamplingParams(do_sample=True, temperature=0.9, seed=(2**64 - 1) - s * 7919) for s in range(5)]
    params.insert(2, SamplingParams())  # a greedy row between them
    history = TokenHistory.from_sequences([[]] * 6, VOCAB, "cpu", False)
    host = NextTokenChooser.from_params(params, VOCAB, "cpu")
    tensor = NextTokenChooser.from_params(params, VOCAB, "cpu")
    tensor.host_seed_keys = None
    assert host.host_seed_keys is not None
    for step in (0, 1, 77, 2**31 + 5):
        steps = torch.full((6,), step, dtype=torch.int64)
        assert torch.equal(host(logits, history, steps).next_ids, tensor(logits, history, steps).next_ids)
