"""Property: for generated JSON schemas and regexes, every output that ended by the grammar's own end
validates / fully matches — greedy and sampled, alone and in batches mixed with unconstrained rows
(docs/architecture.md, "Guided generation"). The tiny random model does the generating: its output
under a grammar is still an instance of it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shard_helpers import BlockPool, Outputs, make_request, make_runner, run_to_end, shard_batch

from tgictl.proto.messages import FinishReason, Grammar, SamplingParams
from tgictl.runtime.router.guided.grammars import GrammarRequest, GrammarValidator
from tgictl.runtime.shard.step import ModelRunner

MAX_NEW = 160
SCHEMA_MAX_NEW = 640
KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)


def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    small = st.integers(min_value=-50, max_value=50)
    return st.one_of(
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span}, small,
                  st.integers(0, 200)),
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
        st.builds(lambda p: {"type": "string", "pattern": p}, st.sampled_from(["^[a-z]{1,4}$", "^[0-9]{2}-[A-Z]$"])),
        st.builds(lambda values: {"enum": values},
                  st.lists(st.one_of(st.text("xyz", min_size=1, max_size=3), st.integers(0, 9)), min_size=1,
                           max_size=4, unique=True)),
    )


def _objects(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def build(props: dict[str, dict[str, Any]], optional: set[str]) -> dict[str, Any]:
        return {"type": "object", "properties": props, "required": [k for k in props if k not in optional],
                "additionalProperties": False}

    props = st.dictionaries(KEYS, children, min_size=1, max_size=3)
    return props.flatmap(lambda p: st.sets(st.sampled_from(sorted(p))).map(lambda o: build(p, o)))


SCHEMA_VALUES = st.recursive(
    _leaf(),
    lambda children: st.one_of(
        _objects(children),
        st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, children, st.integers(0, 2)),
    ),
    max_leaves=5,
)
SCHEMAS = _objects(SCHEMA_VALUES)

ATOMS = st.sampled_from(["[a-c]", "[0-9]", "x", "yz", "(ab|cd)", "[A-Z]{1,2}", "\\.", "-"])
REGEXES = st.lists(
    st.tuples(ATOMS, st.sampled_from(["", "?", "{2}", "{0,3}", "{1,2}"])).map(lambda a: f"(?:{a[0]}){a[1]}"),
    min_size=1, max_size=5,
).map("".join)


@pytest.fixture(scope="module")
def runner(tiny_model_dir: Path) -> ModelRunner:
    return make_runner(tiny_model_dir)


@pytest.fixture(scope="module")
def validator(runner: ModelRunner) -> GrammarValidator:
    assert runner.grammars is not None
    return GrammarValidator(runner.grammars.tokenizer)


SAMPLINGS = [SamplingParams(), SamplingParams(do_sample=True, seed=1, temperature=1.4),
             SamplingParams(do_sample=True, seed=2, top_k=20, repetition_penalty=1.3)]


def generate(runner: ModelRunner, grammar: Grammar, mixed: bool, max_new: int = MAX_NEW) -> list[tuple[str, FinishReason]]:
    """One request per sampling setting (greedy and sampled), with unconstrained neighbours if `mixed`."""
    pool = BlockPool()
    prompt = [5, 9, 77, 31]
    requests = [make_request(pool, i, prompt, max_new_tokens=max_new, sampling=SamplingParams(
        do_sample=s.do_sample, seed=s.seed, temperature=s.temperature, top_k=s.top_k,
        repetition_penalty=s.repetition_penalty, grammar=grammar)) for i, s in enumerate(SAMPLINGS)]
    if mixed:
        requests += [make_request(pool, 100 + i, prompt, max_new_tokens=8, ignore_eos=True,
                                  sampling=SamplingParams(do_sample=True, seed=i)) for i in range(2)]
        requests = requests[::-1]
    outputs = Outputs()
    run_to_end(runner, shard_batch(runner, 1, requests), outputs)
    assert runner.grammars is not None
    eos = set(runner.eos_token_ids)
    results = []
    for i in range(len(SAMPLINGS)):
        end = outputs.generations[i][-1].generated_text
        assert end is not None
        text = runner.grammars.tokenizer.decode_str([t for t in outputs.ids(i) if t not in eos])
        results.append((text, end.finish_reason))
    return results


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, mixed=st.booleans())
def test_generated_schemas_give_valid_instances(runner: ModelRunner, validator: GrammarValidator,
                                                schema: dict[str, Any], mixed: bool) -> None:
    grammar = validator.compile(GrammarRequest.json_schema(schema, strict=True))
    # A bounded schema's longest instance (3 levels of up to 3 optional 12-character keys, which can be a
    # token per character) can pass 160 tokens: the budget here covers it, so every answer must end.
    for text, reason in generate(runner, grammar, mixed, max_new=SCHEMA_MAX_NEW):
        assert reason == FinishReason.EOS_TOKEN, (schema, text)  # bounded schemas always end
        jsonschema.validate(json.loads(text), schema)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(regex=REGEXES, mixed=st.booleans())
def test_generated_regexes_are_fully_matched(runner: ModelRunner, validator: GrammarValidator, regex: str,
                                             mixed: bool) -> None:
    grammar = validator.compile(GrammarRequest("regex", regex))
    for text, reason in generate(runner, grammar, mixed):
        assert reason == FinishReason.EOS_TOKEN, (regex, text)
        assert re.fullmatch(regex, text), (regex, text)
