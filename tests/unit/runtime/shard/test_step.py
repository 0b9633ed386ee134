"""generate_token on a tiny llama: batching invariance, chunked prefill, seeds, stopping, logprobs.

transformers on the same weights is the oracle for logprobs; runs of the same requests alone are the
oracle for what batching (filter, concatenate, chunking) must leave unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from shard_helpers import (
    BlockPool,
    Outputs,
    make_request,
    make_runner,
    run_to_end,
    shard_batch,
    step,
)

from tgictl.proto.messages import FinishReason, SamplingParams
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.chunking import next_chunk_lengths
from tgictl.runtime.shard.step import ModelRunner

PROMPTS = [
    [3, 17, 45, 200, 9, 31, 77, 5, 120, 64, 33],
    [100, 101, 102, 7, 8, 9, 250, 251, 4, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61],
    [11, 400, 12],
    [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
]
SAMPLING = [
    SamplingParams(),
    SamplingParams(do_sample=True, seed=7, temperature=0.9, top_k=40),
    SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5),
    SamplingParams(do_sample=True, seed=11, top_p=0.8, presence_penalty=0.4),
]
LONG_PROMPT = [(i * 37 + 11) % 500 + 3 for i in range(40)]


@pytest.fixture(scope="module")
def runner(tiny_model_dir: Path) -> ModelRunner:
    return make_runner(tiny_model_dir)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def hf_log_softmax(hf_model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] log-probabilities transformers gives after each prefix."""
    with torch.inference_mode():
        return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)


def run_alone(runner: ModelRunner, rid: int, **kwargs: object) -> Outputs:
    runner.set_max_prefill_tokens(None)
    outputs = Outputs()
    request = make_request(BlockPool(), rid, PROMPTS[rid], sampling=SAMPLING[rid], max_new_tokens=8, **kwargs)
    run_to_end(runner, shard_batch(runner, rid, [request]), outputs)
    return outputs


def test_filter_and_concatenate_leave_every_request_unchanged(runner: ModelRunner) -> None:
    alone = [run_alone(runner, rid, top_n_tokens=3) for rid in range(4)]
    runner.set_max_prefill_tokens(None)
    pool = BlockPool()
    requests = [
        make_request(pool, rid, PROMPTS[rid], sampling=SAMPLING[rid], max_new_tokens=8, top_n_tokens=3)
        for rid in range(4)
    ]
    outputs = Outputs()
    batch = step(runner, shard_batch(runner, 0, requests[:2]), outputs)
    batch = step(runner, batch, outputs)
    # Requests 2 and 3 join: their prompts share one forward with the decode tokens of 0 and 1.
    batch = ShardBatch.concatenate([batch, shard_batch(runner, 1, requests[2:])])
    assert batch.request_ids == (0, 1, 2, 3) and batch.id == 0
    batch = step(runner, batch, outputs)
    batch = step(runner, batch, outputs)
    # The router cancels request 1 (a client disconnect): the others go on without it.
    batch = batch.filter([0, 2, 3])
    assert batch.request_ids == (0, 2, 3)
    run_to_end(runner, batch, outputs)

    for rid in range(4):
        expected, got = alone[rid], outputs
        count = 4 if rid == 1 else 8
        assert got.ids(rid) == expected.ids(rid)[:count], f"request {rid}"
        assert got.logprobs(rid) == pytest.approx(expected.logprobs(rid)[:count], abs=1e-5)
        tops = [g.top_tokens[0] for g in got.generations[rid]]
        expected_tops = [g.top_tokens[0] for g in expected.generations[rid]][:count]
        assert [t.ids for t in tops] == [t.ids for t in expected_tops]


def test_filter_and_concatenate_reject_bad_ids(runner: ModelRunner) -> None:
    pool = BlockPool()
    batch = shard_batch(runner, 5, [make_request(pool, rid, PROMPTS[rid]) for rid in range(2)])
    with pytest.raises(Exception, match="not in the batch"):
        batch.filter([0, 9])
    with pytest.raises(Exception, match="at least one"):
        batch.filter([])
    twin = shard_batch(runner, 6, [make_request(pool, 1, PROMPTS[1])])
    with pytest.raises(Exception, match="share request ids"):
        ShardBatch.concatenate([batch, twin])


def test_three_chunk_prefill_equals_one_prefill(runner: ModelRunner, hf_model: torch.nn.Module) -> None:
    one = Outputs()
    runner.set_max_prefill_tokens(None)
    request = make_request(BlockPool(), 0, LONG_PROMPT, max_new_tokens=5, prefill_logprobs=True, top_n_tokens=2)
    run_to_end(runner, shard_batch(runner, 0, [request]), one)

    chunked = Outputs()
    runner.set_max_prefill_tokens(14)
    request = make_request(
        BlockPool(), 0, LONG_PROMPT, max_new_tokens=5, prefill_logprobs=True, top_n_tokens=2, chunk_len=14
    )
    batch: ShardBatch | None = shard_batch(runner, 0, [request])
    expected_current = [14, 14, 12]  # chunk sizes: the router's 14, then the budget's 14, then the rest
    for current in expected_current:
        assert batch is not None and batch.to_cached().current_tokens == current
        generations, batch, timings = runner.generate_token(batch)
        chunked.add(generations)
        assert timings.forward_ns > 0
        # Nothing is emitted until the last chunk of the prompt has been computed.
        assert (generations == []) == (current != 12)
    run_to_end(runner, batch, chunked)

    assert chunked.ids(0) == one.ids(0)
    assert chunked.logprobs(0) == pytest.approx(one.logprobs(0), abs=1e-5)
    first_one, first_chunked = one.generations[0][0], chunked.generations[0][0]
    assert first_chunked.prefill_tokens is not None and first_one.prefill_tokens is not None
    assert first_chunked.prefill_tokens.ids == tuple(LONG_PROMPT)
    assert first_chunked.prefill_tokens.logprobs[1:] == pytest.approx(first_one.prefill_tokens.logprobs[1:], abs=1e-5)
    assert [g.prefill_tokens for g in chunked.generations[0][1:]] == [None] * 4
    # And both equal transformers' log_softmax at every prompt position (the first has none).
    reference = hf_log_softmax(hf_model, LONG_PROMPT)
    expected = [reference[p - 1, LONG_PROMPT[p]].item() for p in range(1, len(LONG_PROMPT))]
    assert math.isnan(first_chunked.prefill_tokens.logprobs[0])
    assert list(first_chunked.prefill_tokens.logprobs[1:]) == pytest.approx(expected, abs=1e-4)
    # Top-n of the first generated token: transformers' n most likely after the whole prompt.
    best = torch.topk(reference[-1], 2)
    assert first_chunked.top_tokens[0].ids == tuple(best.indices.tolist())
    assert list(first_chunked.top_tokens[0].logprobs) == pytest.approx(best.values.tolist(), abs=1e-4)
    # Top-n at every prompt position, gathered over the three chunks: transformers' n most likely
    # after each prefix; a prompt token that is the most likely one has exactly its top logprob.
    tops = first_chunked.prefill_top_tokens
    assert len(tops) == len(LONG_PROMPT) and tops[0].ids == ()
    assert [t.ids for t in tops] == [t.ids for t in first_one.prefill_top_tokens]
    for p in range(1, len(LONG_PROMPT)):
        best = torch.topk(reference[p - 1], 2)
        assert tops[p].ids == tuple(best.indices.tolist())
        assert list(tops[p].logprobs) == pytest.approx(best.values.tolist(), abs=1e-4)
        if tops[p].ids[0] == LONG_PROMPT[p]:
            assert tops[p].logprobs[0] == first_chunked.prefill_tokens.logprobs[p]


def test_chunked_sampled_request_draws_as_if_prefilled_at_once(runner: ModelRunner) -> None:
    """Tokens sampled after intermediate chunks are discarded without using up a random draw or
    entering the penalty counts, while another request decodes in the same forwards."""
    params = SamplingParams(do_sample=True, seed=5, temperature=1.5, repetition_penalty=1.8)

    def run(max_prefill: int | None, chunk_len: int | None) -> Outputs:
        runner.set_max_prefill_tokens(max_prefill)
        pool = BlockPool()
        outputs = Outputs()
        decoding = make_request(pool, 1, PROMPTS[0], max_new_tokens=12, sampling=SAMPLING[1])
        batch = step(runner, shard_batch(runner, 0, [decoding]), outputs)
        sampled = make_request(pool, 0, LONG_PROMPT, max_new_tokens=8, sampling=params, chunk_len=chunk_len)
        run_to_end(runner, ShardBatch.concatenate([batch, shard_batch(runner, 1, [sampled])]), outputs)  # type: ignore[list-item]
        return outputs

    whole, chunked = run(None, None), run(14, 13)
    assert chunked.ids(0) == whole.ids(0)
    assert chunked.ids(1) == whole.ids(1)


def test_a_request_resumed_at_its_step_offset_samples_what_it_would_have_in_one_go(runner: ModelRunner) -> None:
    """The router resumes a preempted request (or a continuation round) as its prompt plus the tokens so far,
    with step_offset = their count: the seeded stream goes on where it stopped, penalties included (they count
    the prompt's ids too). Without the offset it draws other tokens."""
    params = SamplingParams(do_sample=True, seed=21, temperature=1.3, repetition_penalty=1.4, frequency_penalty=0.3)
    runner.set_max_prefill_tokens(None)
    whole = Outputs()
    run_to_end(runner, shard_batch(runner, 0, [make_request(BlockPool(), 0, PROMPTS[1], max_new_tokens=14,
                                                            sampling=params)]), whole)
    done = whole.ids(0)[:6]

    def resumed(offset: int) -> list[int]:
        out = Outputs()
        request = make_request(BlockPool(), 1, list(PROMPTS[1]) + done, max_new_tokens=8,
                               sampling=dataclasses.replace(params, step_offset=offset))
        run_to_end(runner, shard_batch(runner, 1, [request]), out)
        return out.ids(1)

    assert resumed(6) == whole.ids(0)[6:]
    assert resumed(0) != whole.ids(0)[6:]


def test_prompt_logprobs_with_a_cached_prefix(runner: ModelRunner, hf_model: torch.nn.Module) -> None:
    """A request whose first block comes from the cache (cache_len 16) gets NaN for those tokens and
    for the first computed one, then transformers' values, and the same tokens as a full prefill."""
    runner.set_max_prefill_tokens(None)
    pool = BlockPool()
    full = make_request(pool, 0, LONG_PROMPT, max_new_tokens=4, prefill_logprobs=True)
    full_out = Outputs()
    run_to_end(runner, shard_batch(runner, 0, [full]), full_out)

    shared_blocks = full.blocks[:1] + pool.take(len(LONG_PROMPT) + 3 - 16)
    cached = make_request(
        pool, 1, LONG_PROMPT, max_new_tokens=4, prefill_logprobs=True, cache_len=16, blocks=shared_blocks
    )
    cached_out = Outputs()
    run_to_end(runner, shard_batch(runner, 1, [cached]), cached_out)

    assert cached_out.ids(1) == full_out.ids(0)
    logprobs = cached_out.generations[1][0].prefill_tokens.logprobs  # type: ignore[union-attr]
    assert len(logprobs) == len(LONG_PROMPT)
    assert all(math.isnan(v) for v in logprobs[:17])
    reference = hf_log_softmax(hf_model, LONG_PROMPT)
    expected = [reference[p - 1, LONG_PROMPT[p]].item() for p in range(17, len(LONG_PROMPT))]
    assert list(logprobs[17:]) == pytest.approx(expected, abs=1e-4)


def test_prompt_logprobs_of_several_rows_in_one_forward(runner: ModelRunner, hf_model: torch.nn.Module) -> None:
    runner.set_max_prefill_tokens(None)
    pool = BlockPool()
    requests = [
        make_request(pool, 0, PROMPTS[1], max_new_tokens=2, prefill_logprobs=True),
        make_request(pool, 1, PROMPTS[2], max_new_tokens=2),  # no prompt logprobs: one logit row only
        make_request(pool, 2, PROMPTS[3], max_new_tokens=2, prefill_logprobs=True),
    ]
    generations, _, _ = runner.generate_token(shard_batch(runner, 0, requests))
    by_id = {g.request_id: g for g in generations}
    assert by_id[1].prefill_tokens is None
    assert all(g.prefill_top_tokens == () for g in generations)  # no top_n_tokens asked
    for rid, prompt in ((0, PROMPTS[1]), (2, PROMPTS[3])):
        reference = hf_log_softmax(hf_model, prompt)
        expected = [reference[p - 1, prompt[p]].item() for p in range(1, len(prompt))]
        logprobs = by_id[rid].prefill_tokens.logprobs  # type: ignore[union-attr]
        assert math.isnan(logprobs[0]) and list(logprobs[1:]) == pytest.approx(expected, abs=1e-4)
        assert by_id[rid].tokens.ids[0] == int(reference[-1].argmax())


def test_prompt_logprobs_scored_in_slices_equal_one_pass(
    runner: ModelRunner, hf_model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long prompts' logits and log-softmaxes go in slices (memory: never [prompt rows, V] at once); the
    slices' seams change nothing."""
    from tgictl.runtime.shard import step as step_module
    from tgictl.runtime.shard.layers import embedding

    runner.set_max_prefill_tokens(None)

    def first_step() -> dict[int, object]:
        pool = BlockPool()
        requests = [
            make_request(pool, 0, PROMPTS[1], max_new_tokens=2, prefill_logprobs=True, top_n_tokens=2),
            make_request(pool, 1, PROMPTS[2], max_new_tokens=2),
            make_request(pool, 2, LONG_PROMPT, max_new_tokens=2, prefill_logprobs=True, top_n_tokens=3),
        ]
        return {g.request_id: g for g in runner.generate_token(shard_batch(runner, 0, requests))[0]}

    whole = first_step()
    monkeypatch.setattr(step_module, "PROMPT_LOGPROB_ROWS", 3)  # seams inside every prompt
    monkeypatch.setattr(embedding, "LM_HEAD_ROWS", 4)
    head_rows: list[int] = []  # the rows of every LM head call: no call makes [all prompt rows, V]
    head = runner.model.lm_head.forward
    monkeypatch.setattr(runner.model.lm_head, "forward",
                        lambda hidden: head_rows.append(hidden.shape[0]) or head(hidden))
    sliced = first_step()
    assert len(head_rows) > 1 and max(head_rows) <= 3  # 3: the prompt slices, and the three sampled rows
    for rid, prompt in ((0, PROMPTS[1]), (2, LONG_PROMPT)):
        ours, theirs = sliced[rid], whole[rid]
        assert ours.tokens.ids == theirs.tokens.ids  # type: ignore[attr-defined]
        logprobs = ours.prefill_tokens.logprobs  # type: ignore[attr-defined]
        assert list(logprobs[1:]) == pytest.approx(list(theirs.prefill_tokens.logprobs[1:]), abs=1e-5)  # type: ignore[attr-defined]
        reference = hf_log_softmax(hf_model, prompt)
        assert list(logprobs[1:]) == pytest.approx([reference[p - 1, prompt[p]].item() for p in range(1, len(prompt))],
                                                   abs=1e-4)
        tops = [t.ids for t in ours.prefill_top_tokens]  # type: ignore[attr-defined]
        assert len(tops) == len(prompt) and tops == [t.ids for t in theirs.prefill_top_tokens]  # type: ignore[attr-defined]
        assert all(len(ids) >= 2 for ids in tops[1:])
    assert sliced[1].prefill_tokens is None  # type: ignore[attr-defined]


def test_next_chunks_walk_from_newest_to_oldest(runner: ModelRunner) -> None:
    pool = BlockPool()
    requests = [
        make_request(pool, 0, PROMPTS[0]),  # decoding after the first step
        make_request(pool, 1, LONG_PROMPT, chunk_len=4),  # 36 prompt tokens left after the first step
        make_request(pool, 2, PROMPTS[1], chunk_len=5),  # 15 left
    ]
    batch = shard_batch(runner, 0, requests)
    for row in batch.rows:
        row.cache_len += row.chunk_len
    progress = [(row.prompt_len, row.cache_len) for row in batch.rows]
    # budget 30 - (3 - 1) = 28: the newest takes its 15, the older one the remaining 13.
    assert next_chunk_lengths(progress, 30) == [1, 13, 15]
    # An exhausted budget still moves every prefilling row by one token.
    assert next_chunk_lengths(progress, 10) == [1, 1, 8]
    assert next_chunk_lengths(progress, None) == [1, 36, 15]


def test_seed_gives_the_same_tokens_alone_and_in_a_batch_of_8(runner: ModelRunner) -> None:
    runner.set_max_prefill_tokens(None)
    params = SamplingParams(do_sample=True, seed=1234, temperature=1.3, top_p=0.95)
    alone = Outputs()
    run_to_end(runner, shard_batch(runner, 0, [make_request(BlockPool(), 0, PROMPTS[0], sampling=params)]), alone)

    pool = BlockPool()
    others = [
        make_request(
            pool, rid, PROMPTS[rid % 4][: 2 + rid], sampling=SamplingParams(do_sample=True, seed=rid, temperature=1.3)
        )
        for rid in range(1, 8)
    ]
    mine = make_request(pool, 0, PROMPTS[0], sampling=params)
    batched = Outputs()
    run_to_end(runner, shard_batch(runner, 1, others[:4] + [mine] + others[4:]), batched)
    assert batched.ids(0) == alone.ids(0)
    # Different seeds do draw different tokens (the seed is really used).
    other = Outputs()
    changed = make_request(BlockPool(), 0, PROMPTS[0], sampling=SamplingParams(do_sample=True, seed=99, temperature=1.3, top_p=0.95))
    run_to_end(runner, shard_batch(runner, 2, [changed]), other)
    assert other.ids(0) != alone.ids(0)
    assert alone.generations[0][-1].generated_text.seed == 1234  # type: ignore[union-attr]


def first_greedy_token(runner: ModelRunner, prompt: list[int]) -> int:
    generations, _, _ = runner.generate_token(shard_batch(runner, 0, [make_request(BlockPool(), 0, prompt)]))
    return generations[0].tokens.ids[0]


def test_stopping_on_eos_and_length(make_tiny_model, tiny_model_dir: Path) -> None:  # noqa: ANN001
    token = first_greedy_token(make_runner(tiny_model_dir, num_blocks=16), PROMPTS[2])
    # The same weights with that token declared EOS in config.json (and so generation_config.json).
    runner = make_runner(make_tiny_model("llama", eos_token_id=token), num_blocks=32)
    assert token in runner.eos_token_ids

    def finish(**kwargs: object) -> list[tuple[int, FinishReason | None]]:
        outputs = Outputs()
        request = make_request(BlockPool(), 0, PROMPTS[2], **kwargs)
        run_to_end(runner, shard_batch(runner, 0, [request]), outputs)
        return [
            (g.generated_text.generated_tokens, g.generated_text.finish_reason)
            for g in outputs.generations[0]
            if g.generated_text is not None
        ]

    assert finish(max_new_tokens=5) == [(1, FinishReason.EOS_TOKEN)]
    assert finish(max_new_tokens=5, ignore_eos=True) == [(5, FinishReason.LENGTH)]
    # The last allowed token is also EOS: LENGTH wins (TGI order).
    assert finish(max_new_tokens=1) == [(1, FinishReason.LENGTH)]


def test_timings_and_non_reporting_ranks(tiny_model_dir: Path, runner: ModelRunner) -> None:
    runner.set_max_prefill_tokens(None)
    generations, batch, timings = runner.generate_token(
        shard_batch(runner, 0, [make_request(BlockPool(), 0, PROMPTS[0], max_new_tokens=2)])
    )
    assert len(generations) == 1 and batch is not None
    assert timings.forward_ns > 0 and timings.decode_ns > 0
    assert timings.total_ns == timings.forward_ns + timings.decode_ns

    # Rank 1 of 2 computes the same step but leaves reporting to rank 0 (generate.proto).
    rank1 = ModelRunner(
        runner.model, runner.kv_cache, block_size=16, dist=DistContext(rank=1, world_size=2), device=runner.device
    )
    generations, batch, _ = rank1.generate_token(
        shard_batch(rank1, 0, [make_request(BlockPool(), 0, PROMPTS[0], max_new_tokens=2)])
    )
    assert generations == []
    assert batch is not None and batch.rows[0].generated == 1 and len(batch.rows[0].all_ids) == len(PROMPTS[0]) + 1


def test_health_probe_runs_a_real_forward(runner: ModelRunner) -> None:
    assert runner.health() is True


def test_finished_rows_leave_the_returned_batch(runner: ModelRunner) -> None:
    # Decoding the returned batch as is, without the router's FilterBatch, must keep working: a
    # finished row left behind would overrun its slots in the next forward (and used to kill the shard).
    runner.set_max_prefill_tokens(None)
    pool = BlockPool()
    requests = [
        make_request(pool, 0, PROMPTS[0], max_new_tokens=1),
        make_request(pool, 1, PROMPTS[1], max_new_tokens=3, ignore_eos=True),
        make_request(pool, 2, PROMPTS[2], max_new_tokens=2, ignore_eos=True),
    ]
    alone = [run_alone_request(runner, r) for r in requests]
    outputs = Outputs()
    generations, batch, _ = runner.generate_token(shard_batch(runner, 5, requests))
    outputs.add(generations)
    assert [g.generated_text is not None for g in generations] == [True, False, False]
    assert batch is not None and batch.id == 5 and batch.request_ids == (1, 2)
    assert batch.to_cached().request_ids == (1, 2) and batch.to_cached().current_tokens == 2
    generations, batch, _ = runner.generate_token(batch)
    outputs.add(generations)
    assert batch is not None and batch.request_ids == (1,)
    generations, batch, _ = runner.generate_token(batch)
    outputs.add(generations)
    assert batch is None
    assert [outputs.ids(r.id) for r in requests] == alone


def run_alone_request(runner: ModelRunner, request) -> list[int]:  # noqa: ANN001
    outputs = Outputs()
    run_to_end(runner, shard_batch(runner, 100 + request.id, [request]), outputs)
    return outputs.ids(request.id)
