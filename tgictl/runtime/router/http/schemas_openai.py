"""Request bodies of the OpenAI routes (TGI's router/src/lib.rs ChatRequest, CompletionRequest) and their translation to GenerationInput.

Deliberate differences from TGI: `n` >= 1 choices are generated (TGI ignores n); presence_penalty is
a real presence penalty (TGI maps it to repetition_penalty + 2); temperature 0 means greedy.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tgictl.errors import ValidationError
from tgictl.runtime.router.validation import GenerationInput

U64 = 2**64


class ImageUrl(BaseModel):
    url: str


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None
    image_url: ImageUrl | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def template_dict(self) -> dict[str, Any]:
        """What the chat template sees (TGI: content flattened to one string)."""
        if isinstance(self.content, list):
            pieces = []
            for part in self.content:
                if part.type == "text" and part.text is not None:
                    pieces.append(part.text)
                elif part.type == "image_url" and part.image_url is not None:
                    pieces.append(f"![]({part.image_url.url})")
            content = "".join(pieces)
        elif self.content is None and self.tool_calls:
            content = json.dumps(self.tool_calls)
        else:
            content = self.content or ""
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields both OpenAI routes share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = Field(default=None, description="extension")
    min_p: float | None = Field(default=None, description="extension")
    typical_p: float | None = Field(default=None, description="extension")
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = Field(default=None, description="extension")
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    ignore_eos: bool = Field(default=False, description="extension for benchmarks: generate past EOS")

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def generation_input(
        self, inputs: str, *, max_new_tokens: int | None, top_n_tokens: int | None, choice: int,
        add_special_tokens: bool, input_ids: tuple[int, ...] | None = None, prompt_logprobs: bool = False,
    ) -> GenerationInput:
        """One choice's request. Choice i of a seeded request uses seed + i, so the choices differ
        (OpenAI's n) yet the whole answer is reproducible."""
        greedy = self.temperature == 0.0
        seed = self.seed
        if seed is not None and seed >= 0:  # a negative seed stays as is, for validation to refuse
            seed = (seed + choice) % U64
        return GenerationInput(
            inputs=inputs,
            add_special_tokens=add_special_tokens,
            stream=self.stream,
            temperature=None if greedy else self.temperature,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            top_k=self.top_k,
            top_p=self.top_p,
            typical_p=self.typical_p,
            min_p=self.min_p,
            # OpenAI samples at temperature 1 unless told otherwise (TGI: do_sample unless T == 0).
            do_sample=not greedy,
            max_new_tokens=max_new_tokens,
            stop=self.stop_list(),
            seed=seed,
            top_n_tokens=top_n_tokens,
            ignore_eos=self.ignore_eos,
            input_ids=input_ids,
            decoder_input_details=prompt_logprobs,
        )


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str


class ChatRequest(SamplingFields):
    messages: list[Message]
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    logit_bias: dict[str, float] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: ResponseFormat | None = None

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def check_supported(self) -> None:
        if not self.messages:
            raise ValidationError("`messages` cannot be empty")
        if self.response_format is not None and self.response_format.type != "text":
            raise ValidationError("grammar is not supported")
        if self.tool_choice not in (None, "auto", "none"):
            raise ValidationError("forcing a tool with `tool_choice` is not supported")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValidationError("`top_logprobs` requires `logprobs` to be true")


class CompletionRequest(SamplingFields):
    # Text, texts, token ids, or lists of token ids (what evaluation harnesses send).
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    echo: bool = Field(default=False, description="return the prompt before the completion (with its logprobs)")
    logprobs: int | None = None

    def prompts(self) -> list[str | tuple[int, ...]]:
        """One entry per prompt: its text, or its token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(i, int) for i in prompt):
            return [tuple(prompt)]  # type: ignore[arg-type]
        return [p if isinstance(p, str) else tuple(p) for p in prompt]  # type: ignore[union-attr]

