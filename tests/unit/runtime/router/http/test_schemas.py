"""Request schemas: what each API field becomes in GenerationInput, and what is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError as PydanticValidationError

from tgictl.errors import ToolError, ValidationError
from tgictl.runtime.router.http.schemas_openai import (
    ChatRequest,
    CompletionRequest,
    Message,
)
from tgictl.runtime.router.http.schemas_tgi import GenerateRequest, to_generation_input


def test_tgi_parameters_map_one_to_one() -> None:
    request = GenerateRequest.model_validate({"inputs": "hi", "parameters": {
        "temperature": 0.5, "top_k": 3, "top_p": 0.9, "typical_p": 0.8, "min_p": 0.1, "repetition_penalty": 1.1,
        "frequency_penalty": 0.2, "presence_penalty": 0.3, "max_new_tokens": 7, "stop": ["x"], "truncate": 5,
        "seed": 11, "top_n_tokens": 2, "decoder_input_details": True, "ignore_eos": True, "do_sample": True,
        "best_of": 1, "unknown_field": "ignored",
    }})
    gi = to_generation_input(request, stream=False)
    assert (gi.temperature, gi.top_k, gi.top_p, gi.typical_p, gi.min_p) == (0.5, 3, 0.9, 0.8, 0.1)
    assert (gi.repetition_penalty, gi.frequency_penalty, gi.presence_penalty) == (1.1, 0.2, 0.3)
    assert (gi.max_new_tokens, gi.stop, gi.truncate, gi.seed, gi.top_n_tokens) == (7, ("x",), 5, 11, 2)
    assert gi.decoder_input_details and gi.ignore_eos and gi.do_sample and gi.add_special_tokens
    assert gi.best_of == 1 and not gi.stream


def test_tgi_do_sample_quirk_and_explicit_nulls() -> None:
    # TGI: no `parameters` at all samples; a `parameters` object without do_sample is greedy.
    assert to_generation_input(GenerateRequest(inputs="hi"), stream=False).do_sample
    assert not to_generation_input(GenerateRequest.model_validate({"inputs": "hi", "parameters": {}}),
                                   stream=False).do_sample
    # huggingface_hub sends every field, unset ones as null.
    nulls = {k: None for k in ("stop", "watermark", "details", "decoder_input_details", "do_sample", "grammar",
                               "adapter_id", "seed", "best_of", "return_full_text")}
    gi = to_generation_input(GenerateRequest.model_validate({"inputs": "hi", "parameters": nulls}), stream=True)
    assert gi.stop == () and not gi.do_sample and gi.stream


@pytest.mark.parametrize(("field", "value", "message"), [
    ("watermark", True, "`watermark` is not supported"),
])
def test_tgi_unsupported_features_are_refused(field: str, value: object, message: str) -> None:
    request = GenerateRequest.model_validate({"inputs": "hi", "parameters": {field: value}})
    with pytest.raises(ValidationError, match=message):
        to_generation_input(request, stream=False)


def test_adapter_id_and_openai_model_reach_validation() -> None:
    request = GenerateRequest.model_validate({"inputs": "hi", "parameters": {"adapter_id": "lora"}})
    assert to_generation_input(request, stream=False).adapter_id == "lora"
    from tgictl.runtime.router.http.schemas_openai import CompletionRequest

    body = CompletionRequest.model_validate({"model": "sql", "prompt": "hi"})
    chosen = body.generation_input("hi", max_new_tokens=2, top_n_tokens=None, choice=0, add_special_tokens=True)
    assert chosen.model == "sql" and chosen.adapter_id is None


def test_tgi_mistyped_fields_fail_schema_validation() -> None:
    with pytest.raises(PydanticValidationError):
        GenerateRequest.model_validate({"inputs": "hi", "parameters": {"max_new_tokens": "many"}})
    with pytest.raises(PydanticValidationError):
        GenerateRequest.model_validate({"inputs": 3})


def test_openai_temperature_zero_is_greedy_and_choices_get_their_own_seed() -> None:
    chat = ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "temperature": 0,
                                       "seed": 2**64 - 1, "max_completion_tokens": 4, "max_tokens": 9})
    first = chat.generation_input("t", max_new_tokens=chat.max_new_tokens(), top_n_tokens=None, choice=0,
                                  add_special_tokens=False)
    second = chat.generation_input("t", max_new_tokens=chat.max_new_tokens(), top_n_tokens=None, choice=1,
                                   add_special_tokens=False)
    assert not first.do_sample and first.temperature is None
    assert first.max_new_tokens == 4  # max_completion_tokens wins over the deprecated max_tokens
    assert (first.seed, second.seed) == (2**64 - 1, 0)  # wraps around u64
    assert not first.add_special_tokens
    negative = ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "seed": -1})
    assert negative.generation_input("t", max_new_tokens=None, top_n_tokens=None, choice=1,
                                     add_special_tokens=False).seed == -1  # left for the validator to refuse
    sampled = ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    gi = sampled.generation_input("t", max_new_tokens=None, top_n_tokens=None, choice=0, add_special_tokens=False)
    assert gi.do_sample and gi.temperature is None and gi.seed is None  # OpenAI samples at T=1 by default


def test_openai_stop_and_penalties() -> None:
    one = CompletionRequest.model_validate({"prompt": "p", "stop": "x", "presence_penalty": 0.5})
    gi = one.generation_input("p", max_new_tokens=None, top_n_tokens=None, choice=0, add_special_tokens=True)
    assert gi.stop == ("x",) and gi.presence_penalty == 0.5 and gi.repetition_penalty is None
    many = CompletionRequest.model_validate({"prompt": ["a", "b"], "stop": ["x", "y"]})
    assert many.prompts() == ["a", "b"] and many.stop_list() == ("x", "y")
    assert CompletionRequest.model_validate({"prompt": "p"}).stop_list() == ()


def test_chat_messages_flatten_for_the_template() -> None:
    message = Message.model_validate({"role": "user", "content": [
        {"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}},
    ]})
    assert message.to_chat().template_dict(False) == {"role": "user", "content": "look: ![](http://x/a.png)"}
    calls = [{"id": "0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    tool = Message.model_validate({"role": "assistant", "tool_calls": calls}).to_chat()
    # A template without tool support sees the call as the model writes calls ...
    assert tool.template_dict(False)["content"] == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert "tool_calls" not in tool.template_dict(False)
    # ... one with tool support gets the calls, arguments parsed, as transformers' templates expect.
    native = tool.template_dict(native_tools=True)
    assert native["content"] == "" and native["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    result = Message.model_validate({"role": "tool", "content": "22C", "tool_call_id": "0"}).to_chat().template_dict(False)
    assert result == {"role": "tool", "content": "22C", "tool_call_id": "0"}


def test_chat_refusals() -> None:
    def check(extra: dict[str, object], message: str) -> None:
        request = ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **extra})
        with pytest.raises(ValidationError, match=message):
            request.check_supported()

    tools = [{"type": "function", "function": {"name": "f"}}]
    both = ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                                       "response_format": {"type": "json_object"}})
    with pytest.raises(ToolError, match="Grammar and tools are mutually exclusive"):
        both.check_supported()
    check({"top_logprobs": 2}, "`top_logprobs` requires `logprobs`")
    with pytest.raises(ValidationError, match="`messages` cannot be empty"):
        ChatRequest.model_validate({"messages": []}).check_supported()
