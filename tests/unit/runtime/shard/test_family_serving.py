"""Every family through the shard's step path beyond plain greedy decoding (sliding windows of 5 positions,
shorter than the prompts): speculative decoding gives the plain path's tokens and logprobs, guided generation's
output follows its schema, and bf16 with --quantize int8 / int4 serves a mixed batch to its end."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
import torch
from shard_helpers import BlockPool, Outputs, make_request, make_runner, run_to_end, shard_batch

from tgictl.config import SpeculationConfig
from tgictl.proto.messages import FinishReason, Grammar, GrammarType, SamplingParams
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.guidance import json_schema_grammar
from tgictl.runtime.shard.step import ModelRunner
from tgictl.testing.grammar_cases import SCHEMAS
from tgictl.testing.tiny_models import FAMILIES, window_options

PATTERN = [5, 6, 7, 8, 9, 10, 11, 12]
PROMPTS = [PATTERN * 4, [3, 17, 45, 200, 9, 31, 77, 5, 120, 64, 33, 300], PATTERN * 3 + [5, 6]]
SCHEMA = SCHEMAS["flat"][0]


def _run(runner: ModelRunner, speculate: int, sampling: SamplingParams | None = None) -> Outputs:
    runner.set_speculation(SpeculationConfig(tokens=speculate, max_batch=8))
    pool = BlockPool()
    requests = [make_request(pool, rid, prompt, max_new_tokens=20, ignore_eos=True, sampling=sampling)
                for rid, prompt in enumerate(PROMPTS)]
    outputs = Outputs()
    run_to_end(runner, shard_batch(runner, 0, requests), outputs)
    return outputs


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_speculation_gives_the_plain_paths_tokens(family: str, make_tiny_model: Callable[..., Path]) -> None:
    runner = make_runner(make_tiny_model(family, **window_options(family, 5)))
    plain, speculative = _run(runner, 0), _run(runner, 3)
    for rid in range(len(PROMPTS)):
        assert speculative.ids(rid) == plain.ids(rid)
        assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(speculative.logprobs(rid), plain.logprobs(rid)))
    assert sum(g.draft_tokens for gs in speculative.generations.values() for g in gs) > 0  # drafts were verified


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_guided_output_follows_its_schema(family: str, make_tiny_model: Callable[..., Path]) -> None:
    runner = make_runner(make_tiny_model(family, **window_options(family, 5)))
    grammar = Grammar(GrammarType.LLGUIDANCE, json_schema_grammar(SCHEMA, strict=True))
    request = make_request(BlockPool(), 0, PROMPTS[1], max_new_tokens=200, sampling=SamplingParams(grammar=grammar))
    outputs = Outputs()
    run_to_end(runner, shard_batch(runner, 0, [request]), outputs)
    ids = outputs.ids(0)
    end = outputs.generations[0][-1].generated_text
    assert end is not None and end.finish_reason == FinishReason.EOS_TOKEN
    assert runner.grammars is not None
    text = runner.grammars.tokenizer.decode_str([t for t in ids if t not in runner.eos_token_ids])
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_bf16_quantized_serves_a_batch_to_its_end(family: str, method: str,
                                                  make_tiny_model: Callable[..., Path]) -> None:
    model_dir = make_tiny_model(family, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256,
                                **window_options(family, 5))
    runner = make_runner(model_dir, dtype=torch.bfloat16, quantize=QuantizeSpec(method, 32))
    outputs = _run(runner, 0, SamplingParams(do_sample=True, seed=5, temperature=0.8))
    for rid in range(len(PROMPTS)):
        assert len(outputs.ids(rid)) == 20 and all(0 <= t < 512 for t in outputs.ids(rid))
        assert all(math.isfinite(lp) for lp in outputs.logprobs(rid))
