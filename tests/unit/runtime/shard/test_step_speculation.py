"""generate_token with drafts: the output is the plain path's, token for token, whatever the drafts.

The oracle is the same requests run without speculation. Drafts come from the known continuation
(all accepted), from it with every third token wrong (runs cut at the first mismatch), or from the
real n-gram index; greedy, seeded sampling, penalties and top-n tokens all go through verification.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest
from shard_helpers import (
    BlockPool,
    Outputs,
    make_request,
    make_runner,
    run_to_end,
    shard_batch,
)

from tgictl.config import SpeculationConfig
from tgictl.proto.messages import BlockGrant, SamplingParams
from tgictl.runtime.shard.batch import RowState, apply_grants
from tgictl.runtime.shard.step import ModelRunner

PATTERN = [5, 6, 7, 8, 9, 10, 11, 12]
PROMPTS = [PATTERN * 4, [3, 17, 45, 200, 9, 31, 77, 5, 120, 64, 33], PATTERN * 3 + [5, 6], [11, 400, 12]]
SAMPLING = [
    SamplingParams(),
    SamplingParams(do_sample=True, seed=7, temperature=0.9, top_k=40),
    SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5),
    SamplingParams(do_sample=True, seed=11, top_p=0.8, presence_penalty=0.4),
]
MAX_NEW = [24, 17, 9, 30]


class KnownContinuation:
    """Drafts the request's true continuation (from a plain run), wrong at every `wrong_every`-th."""

    def __init__(self, prompt_len: int, continuation: Sequence[int], wrong_every: int | None) -> None:
        self.prompt_len = prompt_len
        self.continuation = list(continuation)
        self.wrong_every = wrong_every
        self.drafted = 0
        self.accepted = 0

    def propose(self, ids: Sequence[int], limit: int) -> list[int]:
        done = len(ids) - self.prompt_len
        draft = self.continuation[done : done + limit]
        if self.wrong_every:
            draft = [(t + 1) % 512 if (done + i) % self.wrong_every == 2 else t for i, t in enumerate(draft)]
        return draft

    def record(self, drafted: int, accepted: int, config: SpeculationConfig) -> None:
        self.drafted += drafted
        self.accepted += accepted


@pytest.fixture(scope="module")
def runner(tiny_model_dir: Path) -> ModelRunner:
    return make_runner(tiny_model_dir)


def run(runner: ModelRunner, speculate: int, **request_kwargs: object) -> Outputs:
    runner.set_speculation(SpeculationConfig(tokens=speculate, max_batch=8))
    pool = BlockPool()
    requests = [
        make_request(pool, rid, PROMPTS[rid], sampling=SAMPLING[rid], max_new_tokens=MAX_NEW[rid], **request_kwargs)
        for rid in range(len(PROMPTS))
    ]
    outputs = Outputs()
    run_to_end(runner, shard_batch(runner, 0, requests), outputs)
    return outputs


def assert_same(plain: Outputs, speculative: Outputs) -> None:
    for rid in range(len(PROMPTS)):
        assert speculative.ids(rid) == plain.ids(rid)
        for a, b in zip(speculative.logprobs(rid), plain.logprobs(rid), strict=True):
            assert math.isclose(a, b, abs_tol=1e-5)
        assert [g.generated_text for g in speculative.generations[rid] if g.generated_text] == [
            g.generated_text for g in plain.generations[rid] if g.generated_text
        ]


@pytest.mark.parametrize("wrong_every", [None, 3])
def test_drafts_change_nothing_but_the_number_of_steps(runner: ModelRunner, wrong_every: int | None) -> None:
    plain = run(runner, 0, top_n_tokens=3)
    drafters: dict[int, KnownContinuation] = {}

    def known(row: RowState) -> KnownContinuation:
        rid = row.request.id
        drafters[rid] = KnownContinuation(len(PROMPTS[rid]), plain.ids(rid), wrong_every)
        return drafters[rid]

    ngram_drafter, runner.new_drafter = runner.new_drafter, known
    try:
        speculative = run(runner, 4, top_n_tokens=3)
    finally:
        runner.new_drafter = ngram_drafter
    assert_same(plain, speculative)
    for rid in range(len(PROMPTS)):
        tops = [t for g in speculative.generations[rid] for t in g.top_tokens]
        plain_tops = [t for g in plain.generations[rid] for t in g.top_tokens]
        assert [t.ids for t in tops] == [t.ids for t in plain_tops]
        for got, want in zip(tops, plain_tops, strict=True):  # other matmul shapes: float rounding only
            assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(got.logprobs, want.logprobs, strict=True))
        steps, plain_steps = len(speculative.generations[rid]), len(plain.generations[rid])
        accepted = sum(g.accepted_tokens for g in speculative.generations[rid])
        assert accepted == drafters[rid].accepted > 0
        assert steps == plain_steps - accepted  # every accepted draft saves one step
        if wrong_every is None:  # all drafts right: 1 + 4 tokens per step, as far as max_new_tokens allows
            assert steps == 1 + math.ceil((MAX_NEW[rid] - 1) / 5)
        else:
            assert accepted < drafters[rid].drafted


def test_ngram_drafts_keep_outputs_identical(runner: ModelRunner) -> None:
    plain = run(runner, 0)
    speculative = run(runner, 3)
    assert_same(plain, speculative)
    assert sum(g.draft_tokens for gs in speculative.generations.values() for g in gs) > 0


def test_drafts_stay_within_max_new_tokens_and_slots(runner: ModelRunner) -> None:
    """A one-token request never drafts; a request's drafts never pass its last owned slot."""
    runner.set_speculation(SpeculationConfig(tokens=8, max_batch=8))
    pool = BlockPool()
    for max_new in (1, 2, 3):
        request = make_request(pool, max_new, PATTERN * 2, max_new_tokens=max_new)
        batch = shard_batch(runner, max_new, [request])
        outputs = Outputs()
        while batch is not None:
            for row in batch.rows:
                assert row.cache_len + row.chunk_len <= len(PATTERN * 2) + max_new - 1
            generations, batch, _ = runner.generate_token(batch)
            outputs.add(generations)
        assert len(outputs.ids(max_new)) == max_new
    runner.set_speculation(SpeculationConfig())


def test_drafts_stop_where_the_rows_blocks_end(runner: ModelRunner) -> None:
    """A row holding blocks for a few positions past its prompt (the router grants the rest as it grows)
    drafts only into the room it has; granted a block when its next step needs one, it ends with the plain
    path's tokens."""
    prompt, max_new = PATTERN * 3 + [5], 40  # 25 tokens: its two blocks leave room for 7 more positions
    plain = Outputs()
    run_to_end(runner, shard_batch(runner, 0, [make_request(BlockPool(), 0, prompt, max_new_tokens=max_new)]), plain)
    runner.set_speculation(SpeculationConfig(tokens=8, max_batch=8))
    pool = BlockPool()
    batch = shard_batch(runner, 1, [make_request(pool, 1, prompt, max_new_tokens=max_new, blocks=pool.take(len(prompt) + 1))])
    outputs, cut = Outputs(), 0
    while batch is not None:
        (row,) = batch.rows
        if not batch.fits_next_step():
            apply_grants([batch], [BlockGrant(1, pool.take(16))], runner.kv_cache.num_blocks)
        assert len(row.all_ids) + len(row.draft) <= row.capacity  # every position the step writes is its own
        cut += 0 < row.capacity - len(row.all_ids) < 8 and len(row.draft) == row.capacity - len(row.all_ids)
        generations, batch, _ = runner.generate_token(batch)
        outputs.add(generations)
    runner.set_speculation(SpeculationConfig())
    assert outputs.ids(1) == plain.ids(0)
    assert cut > 0  # some drafts were shortened to the room left
