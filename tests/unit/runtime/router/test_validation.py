"""Validation: TGI's order and messages, the deliberate fixes, and tokenization once."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tgictl.errors import ValidationError
from tgictl.proto.messages import GrammarType
from tgictl.runtime.router.guided.grammars import GrammarRequest, GrammarValidator
from tgictl.runtime.router.text.tokenizer import RouterTokenizer
from tgictl.runtime.router.validation import (
    GenerationInput,
    ValidationLimits,
    Validator,
)


@pytest.fixture(scope="module")
def validator(tiny_model_dir: Path) -> Validator:
    return Validator(RouterTokenizer(tiny_model_dir), ValidationLimits(max_input_tokens=20, max_total_tokens=30))


def message(validator: Validator, **fields: object) -> str:
    request = GenerationInput(**{"inputs": "hello world", **fields})  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as info:
        validator.validate(request)
    assert info.value.http_status == 422 and info.value.error_type == "validation"
    assert str(info.value).startswith("Input validation error: ")
    return info.value.detail


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"best_of": 2}, "you must use sampling when `best_of` is > 1"),
        ({"temperature": 0.0}, "`temperature` must be strictly positive"),
        ({"temperature": float("nan")}, "`temperature` must be a finite number"),
        ({"repetition_penalty": -1.0}, "`repetition_penalty` must be strictly positive"),
        ({"frequency_penalty": 2.5}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
        ({"presence_penalty": -3.0}, "`presence_penalty` must be >= -2.0 and <= 2.0"),
        ({"top_p": 0.0}, "`top_p` must be > 0.0 and <= 1.0"),
        ({"top_p": 1.5}, "`top_p` must be > 0.0 and <= 1.0"),
        ({"typical_p": 0.0}, "`typical_p` must be > 0.0 and <= 1.0"),
        ({"top_k": 0}, "`top_k` must be strictly positive"),
        ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
        ({"stop": ("a", "b", "c", "d", "e")}, "`stop` supports up to 4 stop sequences. Given: 5"),
        ({"best_of": 2, "do_sample": True, "seed": 1}, "`seed` must not be set when `best_of` > 1"),
        ({"top_n_tokens": 6}, "`top_n_tokens` must be >= 0 and <= 5. Given: 6"),
        ({"inputs": ""}, "`inputs` cannot be empty"),
        ({"truncate": 0}, "`truncate` must be strictly positive and less than 20. Given: 0"),
        ({"truncate": 21}, "`truncate` must be strictly positive and less than 20. Given: 21"),
        ({"stream": True, "decoder_input_details": True},
         "`decoder_input_details` == true is not supported when streaming tokens"),
        ({"seed": -1}, "`seed` must be >= 0 and <= 18446744073709551615"),
    ],
)
def test_each_limit_names_its_field(validator: Validator, fields: dict[str, object], expected: str) -> None:
    assert message(validator, **fields) == expected


def test_temperature_is_checked_before_top_p(validator: Validator) -> None:
    assert message(validator, temperature=-1.0, top_p=5.0) == "`temperature` must be strictly positive"


def test_total_tokens_then_input_length(validator: Validator) -> None:
    long_text = " ".join(["word"] * 40)
    n = len(validator._tokenizer.encode(long_text))
    assert n > 30
    assert message(validator, inputs=long_text, max_new_tokens=1) == (
        f"`inputs` tokens + `max_new_tokens` must be <= 30. Given: {n} `inputs` tokens and 1 `max_new_tokens`"
    )
    truncated = validator.validate(GenerationInput(inputs=long_text, truncate=10, max_new_tokens=5))
    assert truncated.input_length == 10
    assert truncated.input_ids == tuple(validator._tokenizer.encode(long_text)[-10:])


def test_input_longer_than_max_input_tokens(validator: Validator) -> None:
    text = " ".join(["word"] * 40)
    ids = validator._tokenizer.encode(text)[:25]
    text = validator._tokenizer.decode(ids)
    n = len(validator._tokenizer.encode(text))
    assert 20 < n < 30
    assert message(validator, inputs=text, max_new_tokens=30 - n) == (
        f"`inputs` must have less than 20 tokens. Given: {n}"
    )


def test_defaults_and_deliberate_fixes(validator: Validator) -> None:
    ok = validator.validate(GenerationInput(inputs="hello world", top_p=1.0, presence_penalty=0.5))
    n = ok.input_length
    assert ok.max_new_tokens == 30 - n and ok.max_total_new_tokens == 30 - n
    assert ok.sampling.top_p == 1.0 and ok.sampling.presence_penalty == 0.5
    assert ok.sampling.repetition_penalty == 1.0  # presence is not mapped onto repetition (TGI's quirk)
    assert not ok.sampling.samples
    seeded = validator.validate(GenerationInput(inputs="hi", seed=2**64 - 1, do_sample=True, max_new_tokens=3))
    assert seeded.sampling.seed == 2**64 - 1 and seeded.sampling.samples


def test_per_round_cap(tiny_model_dir: Path) -> None:
    validator = Validator(
        RouterTokenizer(tiny_model_dir),
        ValidationLimits(max_input_tokens=20, max_total_tokens=3000, max_new_tokens_per_round=16),
    )
    ok = validator.validate(GenerationInput(inputs="hi", max_new_tokens=100))
    assert ok.max_new_tokens == 16 and ok.max_total_new_tokens == 100


def test_the_whole_request_must_fit_max_total_tokens(tiny_model_dir: Path) -> None:
    """TGI's limit covers all of max_new_tokens, not one continuation round: a mistaken 10^12 is a 422
    at once instead of minutes of generation."""
    validator = Validator(
        RouterTokenizer(tiny_model_dir),
        ValidationLimits(max_input_tokens=20, max_total_tokens=3000, max_new_tokens_per_round=16),
    )
    n = validator.validate(GenerationInput(inputs="hi", max_new_tokens=1)).input_length
    with pytest.raises(ValidationError) as raised:
        validator.validate(GenerationInput(inputs="hi", max_new_tokens=10**12))
    assert str(raised.value).endswith(
        f"`inputs` tokens + `max_new_tokens` must be <= 3000. Given: {n} `inputs` tokens and {10**12} `max_new_tokens`"
    )
    assert raised.value.http_status == 422
    fits = validator.validate(GenerationInput(inputs="hi", max_new_tokens=3000 - n))
    assert fits.max_total_new_tokens == 3000 - n and fits.max_new_tokens == 16


def test_best_of_limits(validator: Validator) -> None:
    assert validator.validate_best_of(2) == 2
    with pytest.raises(ValidationError, match="`best_of` must be > 0 and <= 2. Given: 3"):
        validator.validate_best_of(3)
    single = Validator(validator._tokenizer, dataclasses.replace(validator.limits, max_best_of=1))
    with pytest.raises(ValidationError, match="`best_of` != 1 is not allowed for this endpoint"):
        single.validate_best_of(2)


def test_grammars_are_compiled_at_validation_and_refused_without_an_engine(tiny_model_dir: Path) -> None:
    limits = ValidationLimits(max_input_tokens=20, max_total_tokens=30)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    grammars = GrammarValidator.for_model(tiny_model_dir, config["vocab_size"], (config["eos_token_id"],))
    with_engine = Validator(RouterTokenizer(tiny_model_dir), limits, grammars)
    validated = with_engine.validate(GenerationInput(inputs="hi", grammar=GrammarRequest("regex", "[ab]{2}")))
    assert validated.sampling.grammar is not None and validated.sampling.grammar.type == GrammarType.LLGUIDANCE
    assert with_engine.validate(GenerationInput(inputs="hi")).sampling.grammar is None
    with pytest.raises(ValidationError, match="grammar is not valid: .*unclosed"):
        with_engine.validate(GenerationInput(inputs="hi", grammar=GrammarRequest("regex", "(a")))
    without = Validator(RouterTokenizer(tiny_model_dir), limits)
    with pytest.raises(ValidationError, match="grammar is not supported"):
        without.validate(GenerationInput(inputs="hi", grammar=GrammarRequest("regex", "a")))


def test_adapters_by_adapter_id_and_openai_model(tiny_model_dir: Path) -> None:
    limits = ValidationLimits(
        max_input_tokens=20, max_total_tokens=30, adapters=("sql", "chat"), base_model_names=("org/base", "tgi")
    )
    validator = Validator(RouterTokenizer(tiny_model_dir), limits)
    check = lambda **f: (lambda r: (r.adapter_index, r.adapter))(validator.validate(GenerationInput(inputs="hi", **f)))  # noqa: E731
    assert check() == (0, None)
    assert check(adapter_id="chat") == (2, "chat")
    assert check(model="sql") == (1, "sql")
    assert check(model="tgi") == check(model="org/base") == check(adapter_id="") == (0, None)
    assert check(adapter_id="sql", model="chat") == (1, "sql")  # TGI's parameter wins
    detail = message(validator, adapter_id="nope")
    assert detail == "`adapter_id` `nope` is not a loaded LoRA adapter; adapters: `sql`, `chat` (the base model: `org/base`, `tgi`)"
    assert "`model` `gpt-4` is not a loaded LoRA adapter" in message(validator, model="gpt-4")


def test_without_adapters_openai_model_is_ignored_but_adapter_id_is_checked(validator: Validator) -> None:
    assert validator.validate(GenerationInput(inputs="hi", model="gpt-4")).adapter_index == 0
    assert "adapters: none" in message(validator, adapter_id="lora")


def test_priority_needs_the_priority_policy_and_a_32_bit_value(tiny_model_dir: Path, validator: Validator) -> None:
    """vLLM's rule: under fcfs a priority other than 0 is refused rather than silently meaning nothing."""
    assert validator.validate(GenerationInput(inputs="hi", priority=0)).priority == 0
    assert message(validator, priority=3) == (
        "`priority` other than 0 needs the server to run with --scheduling-policy priority"
    )
    by_priority = Validator(RouterTokenizer(tiny_model_dir), ValidationLimits(
        max_input_tokens=20, max_total_tokens=30, priority_scheduling=True))
    assert by_priority.validate(GenerationInput(inputs="hi", priority=-7)).priority == -7
    assert by_priority.validate(GenerationInput(inputs="hi")).priority == 0
    assert message(by_priority, priority=2**31) == "`priority` must be >= -2147483648 and <= 2147483647"
