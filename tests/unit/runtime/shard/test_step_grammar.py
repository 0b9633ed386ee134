"""Constrained rows in real steps of the tiny model: forced tokens (several ids per generation,
within max_new_tokens and the request's slots), unconstrained neighbours untouched, continuation
rounds replaying the grammar, and tensor-parallel ranks in step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
from shard_helpers import BlockPool, Outputs, make_request, make_runner, run_to_end, shard_batch

from tgictl.proto.messages import FinishReason, Grammar, GrammarType, SamplingParams
from tgictl.runtime.guidance import json_schema_grammar
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.chunking import next_chunk_lengths
from tgictl.runtime.shard.step import ModelRunner
from tgictl.testing.grammar_cases import HOSTILE_SCHEMAS, SCHEMAS

PROMPT = [3, 17, 45, 200, 9, 31, 77, 5]
SCHEMA = SCHEMAS["long_keys"][0]
GRAMMAR = Grammar(GrammarType.LLGUIDANCE, json_schema_grammar(SCHEMA, strict=True))


@pytest.fixture(scope="module")
def runner(tiny_model_dir: Path) -> ModelRunner:
    return make_runner(tiny_model_dir)


@pytest.fixture(scope="module")
def unforced(tiny_model_dir: Path) -> ModelRunner:
    return make_runner(tiny_model_dir, forced_tokens=False)


def text(runner: ModelRunner, ids: list[int]) -> str:
    assert runner.grammars is not None
    eos = set(runner.eos_token_ids)
    return runner.grammars.tokenizer.decode_str([t for t in ids if t not in eos])


def run(runner: ModelRunner, requests: list, batch_id: int = 1) -> Outputs:  # noqa: ANN001
    outputs = Outputs()
    run_to_end(runner, shard_batch(runner, batch_id, requests), outputs)
    return outputs


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(do_sample=True, seed=4, temperature=1.3)],
                         ids=["greedy", "sampled"])
def test_forced_tokens_come_in_the_same_generation_and_change_nothing(
    runner: ModelRunner, unforced: ModelRunner, sampling: SamplingParams
) -> None:
    sampling = dataclasses.replace(sampling, grammar=GRAMMAR)
    request = make_request(BlockPool(), 0, PROMPT, max_new_tokens=300, sampling=sampling)
    forced, stepwise = run(runner, [request]), run(unforced, [request])
    # Forcing skips the forwards whose choice was certain; greedy/seeded choices elsewhere are the same.
    if sampling.samples:
        assert forced.ids(0)[:2] == stepwise.ids(0)[:2]
    else:
        assert forced.ids(0) == stepwise.ids(0)
    generations = forced.generations[0]
    assert len(generations) < len(stepwise.generations[0]) / 2  # the long keys came for free
    assert max(len(g.tokens.ids) for g in generations) > 5
    for g in generations:  # the sampled token has a logprob, the forced ones none
        assert not any(lp != lp for lp in g.tokens.logprobs[:1]) and all(lp != lp for lp in g.tokens.logprobs[1:])
    last = generations[-1].generated_text
    assert last is not None and last.finish_reason == FinishReason.EOS_TOKEN
    assert last.generated_tokens == len(forced.ids(0))
    jsonschema.validate(json.loads(text(runner, forced.ids(0))), SCHEMA)


def test_forced_tokens_count_toward_max_new_tokens_and_fit_the_slots(runner: ModelRunner) -> None:
    for max_new in (1, 2, 3, 7, 12):
        pool = BlockPool()
        # Exactly prompt + max_new_tokens - 1 slots, as the router allocates them.
        request = make_request(pool, 0, PROMPT, max_new_tokens=max_new, sampling=SamplingParams(grammar=GRAMMAR))
        outputs = run(runner, [request])
        assert len(outputs.ids(0)) == max_new
        end = outputs.generations[0][-1].generated_text
        assert end is not None and end.finish_reason == FinishReason.LENGTH and end.generated_tokens == max_new


def test_top_tokens_have_one_entry_per_id(runner: ModelRunner) -> None:
    request = make_request(BlockPool(), 0, PROMPT, max_new_tokens=40, top_n_tokens=2,
                           sampling=SamplingParams(grammar=GRAMMAR))
    generations, _, _ = runner.generate_token(shard_batch(runner, 2, [request]))
    (g,) = generations
    assert len(g.tokens.ids) > 1 and len(g.top_tokens) == len(g.tokens.ids)
    assert g.top_tokens[0].ids and all(not t.ids for t in g.top_tokens[1:])


def test_unconstrained_rows_beside_constrained_ones_are_unchanged(runner: ModelRunner) -> None:
    pool = BlockPool()
    free = [make_request(pool, 10 + i, PROMPT[i:] + [i], max_new_tokens=12, ignore_eos=True,
                         sampling=SamplingParams(do_sample=bool(i), seed=i)) for i in range(3)]
    alone = [run(runner, [r], 50 + r.id).ids(r.id) for r in free]
    constrained = [make_request(pool, i, PROMPT, max_new_tokens=200, sampling=SamplingParams(grammar=GRAMMAR))
                   for i in range(2)]
    mixed = run(runner, [constrained[0], free[0], constrained[1], free[1], free[2]], 60)
    assert [mixed.ids(r.id) for r in free] == alone
    for r in constrained:
        jsonschema.validate(json.loads(text(runner, mixed.ids(r.id))), SCHEMA)


def test_a_continuation_round_replays_the_grammar(runner: ModelRunner) -> None:
    sampling = SamplingParams(grammar=GRAMMAR)
    whole = run(runner, [make_request(BlockPool(), 0, PROMPT, max_new_tokens=300, sampling=sampling)]).ids(0)
    first = run(runner, [make_request(BlockPool(), 0, PROMPT, max_new_tokens=20, sampling=sampling)]).ids(0)
    replay = dataclasses.replace(sampling, grammar=dataclasses.replace(GRAMMAR, replay_tokens=len(first)))
    rest = run(runner, [make_request(BlockPool(), 0, PROMPT + first, max_new_tokens=280, sampling=replay)]).ids(0)
    assert first + rest == whole


def test_tensor_parallel_ranks_stay_in_step(runner: ModelRunner) -> None:
    """Rank 1 computes the same masks and forced tokens (it reports nothing): same batch state."""
    rank1 = ModelRunner(runner.model, runner.kv_cache, block_size=16, dist=DistContext(rank=1, world_size=2),
                        device=runner.device, grammars=runner.grammars)
    request = make_request(BlockPool(), 0, PROMPT, max_new_tokens=300, sampling=SamplingParams(grammar=GRAMMAR))
    rank0_batch, rank1_batch = shard_batch(runner, 3, [request]), shard_batch(rank1, 3, [request])
    while rank0_batch is not None:
        _, rank0_batch, _ = runner.generate_token(rank0_batch)
        generations, rank1_batch, _ = rank1.generate_token(rank1_batch)  # type: ignore[arg-type]
        assert generations == []
        assert (rank0_batch is None) == (rank1_batch is None)
        if rank0_batch is not None and rank1_batch is not None:
            assert rank0_batch.rows[0].all_ids == rank1_batch.rows[0].all_ids


def test_forced_tokens_are_charged_to_the_prefill_budget(runner: ModelRunner) -> None:
    pool = BlockPool()
    requests = [make_request(pool, 0, PROMPT, max_new_tokens=50),
                make_request(pool, 1, list(range(3, 43)), max_new_tokens=4, chunk_len=4)]
    batch = shard_batch(runner, 4, requests)
    for row in batch.rows:
        row.cache_len += row.chunk_len
    batch.rows[0].all_ids += [5, 6, 7]  # a sampled token and two forced ones, without K/V yet
    progress = [(row.prompt_len, row.cache_len) for row in batch.rows]
    pending = [row.pending for row in batch.rows]
    # budget 20 - (3 + 1 - 1) = 17 for the prefilling row; the decoding row computes all 3 pending tokens.
    assert next_chunk_lengths(progress, 20, pending) == [3, 17]
    assert next_chunk_lengths(progress, None, pending) == [3, 36]
    assert next_chunk_lengths(progress, 20) == [1, 19]  # without pending counts: one token per decoding row


@pytest.mark.parametrize("name", ["optional_properties", "self_reference"])
def test_a_grammar_that_fails_while_generating_ends_only_its_request(runner: ModelRunner, name: str) -> None:
    pool = BlockPool()
    hostile = Grammar(GrammarType.LLGUIDANCE, json_schema_grammar(HOSTILE_SCHEMAS[name], strict=True))
    neighbour = make_request(pool, 1, PROMPT[::-1], max_new_tokens=12, ignore_eos=True)
    alone = run(runner, [neighbour])
    failing = make_request(pool, 0, PROMPT, max_new_tokens=40, sampling=SamplingParams(grammar=hostile))
    outputs = run(runner, [failing, neighbour])
    last = outputs.generations[0][-1]
    assert last.generated_text is None and last.tokens.ids == ()
    assert "the grammar engine" in last.error and len(last.error) <= 1000 and "\n" not in last.error
    assert outputs.ids(1) == alone.ids(1)  # the rest of the batch goes on, unchanged
    assert outputs.generations[1][-1].error == ""


def test_a_matcher_that_cannot_be_made_fails_its_request_at_its_first_step(runner: ModelRunner) -> None:
    """Replayed tokens the grammar refuses (a corrupted continuation round): the request ends at its first
    step, even while its prompt is still being computed in chunks, and its neighbour is untouched."""
    pool = BlockPool()
    grammar = dataclasses.replace(GRAMMAR, replay_tokens=3)  # the prompt's last 3 ids are no JSON
    long_prompt = PROMPT * 6
    failing = make_request(pool, 0, long_prompt, max_new_tokens=5, chunk_len=8,
                           sampling=SamplingParams(grammar=grammar))
    neighbour = make_request(pool, 1, PROMPT, max_new_tokens=6, ignore_eos=True)
    alone = run(runner, [neighbour])
    batch = shard_batch(runner, 7, [failing, neighbour])
    generations, after, _ = runner.generate_token(batch)
    errors = {g.request_id: g.error for g in generations if g.error}
    assert list(errors) == [0] and "replayed tokens do not follow it" in errors[0]
    assert after is not None and after.request_ids == (1,)
    outputs = Outputs()
    outputs.add(generations)
    run_to_end(runner, after, outputs)
    assert outputs.ids(1) == alone.ids(1)
