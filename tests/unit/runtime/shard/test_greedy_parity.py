"""Greedy tokens of the shard runtime equal transformers' `generate` on SmolLM2-135M-Instruct (float32).

(a) each of 8 chat prompts alone; (b) all 8 in one batch that grows while it runs: some requests are
prefilled first, others join later steps in the same forward as the running rows' decode tokens
(TGI's Prefill with a cached batch), one of them split into chunks, and finished requests are
filtered out between steps as the router does.
"""

from __future__ import annotations

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

from tgictl.proto.messages import FinishReason
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.shard.step import ModelRunner

NEW_TOKENS = 32
QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "Explain what a CPU does in one sentence.",
    "Give me three tips for staying focused while studying.",
    "What is 12 times 7?",
    "Translate 'good morning' into Spanish and German.",
    "Tell me a short story about a robot who learns to paint, in two sentences.",
)


@pytest.fixture(scope="module")
def prompts(smollm2_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    out = []
    for question in QUESTIONS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


@pytest.fixture(scope="module")
def expected(smollm2_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuation of each prompt alone (it stops after an EOS token)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS
            )
            out.append(generated[0, len(prompt) :].tolist())
    return out


@pytest.fixture(scope="module")
def runner(smollm2_dir: Path) -> ModelRunner:
    return make_runner(smollm2_dir, num_blocks=64)


def test_each_prompt_alone_matches_transformers(
    runner: ModelRunner, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    runner.set_max_prefill_tokens(None)
    for rid, prompt in enumerate(prompts):
        outputs = Outputs()
        request = make_request(BlockPool(), rid, prompt, max_new_tokens=NEW_TOKENS)
        run_to_end(runner, shard_batch(runner, rid, [request]), outputs)
        assert outputs.ids(rid) == expected[rid], f"prompt {rid}"
        last = outputs.generations[rid][-1].generated_text
        assert last is not None
        eos = expected[rid][-1] in runner.eos_token_ids and len(expected[rid]) < NEW_TOKENS
        assert last.finish_reason == (FinishReason.EOS_TOKEN if eos else FinishReason.LENGTH)


def test_growing_batch_matches_transformers(
    runner: ModelRunner, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    pool = BlockPool()
    requests = [make_request(pool, rid, p, max_new_tokens=NEW_TOKENS) for rid, p in enumerate(prompts)]
    # A budget that forces the longest late joiner (request 7) into chunks while others decode.
    runner.set_max_prefill_tokens(24)
    outputs = Outputs()
    # Step at which each group joins: 0-2 first (full prompts in one forward), 3-4 at step 3
    # together with the running rows' decode tokens, 5-7 at step 6 with a chunk budget.
    joins = {0: [0, 1, 2], 3: [3, 4], 6: [5, 6, 7]}
    chunk_first = {7: 10}  # the router split request 7: 10 tokens now, the rest as the budget allows
    batch: ShardBatch | None = None
    for step_index in range(200):
        if step_index in joins:
            group = []
            for rid in joins[step_index]:
                request = requests[rid]
                if rid in chunk_first:
                    request = make_request(
                        pool, rid, prompts[rid], max_new_tokens=NEW_TOKENS, chunk_len=chunk_first[rid],
                        blocks=request.blocks,
                    )
                group.append(request)
            new = shard_batch(runner, step_index, group)
            batch = new if batch is None else ShardBatch.concatenate([batch, new])
        if batch is None:
            if step_index > max(joins):
                break
            continue
        batch = step(runner, batch, outputs)
    assert batch is None
    for rid in range(len(prompts)):
        assert outputs.ids(rid) == expected[rid], f"prompt {rid}"
