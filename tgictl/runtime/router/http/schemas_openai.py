"""Request bodies of the OpenAI routes (TGI's router/src/lib.rs ChatRequest, CompletionRequest) and their translation to GenerationInput.

Deliberate differences from TGI: `n` >= 1 choices are generated (TGI ignores n); presence_penalty is
a real presence penalty (TGI maps it to repetition_penalty + 2); temperature 0 means greedy;
`response_format: {"type": "json_object"}` needs no schema (any JSON object; TGI refuses it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tgictl.errors import ToolError, ValidationError
from tgictl.runtime.router.guided.grammars import GrammarRequest, tgi_grammar
from tgictl.runtime.router.guided.tools import plan_tools
from tgictl.runtime.router.http.chat.messages import CalledTool, ChatMessage
from tgictl.runtime.router.http.chat.turn import ChatTurn
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
    tool_call_id: str | None = None

    def to_chat(self) -> ChatMessage:
        """The neutral message (TGI: content flattened to one string; an image as a markdown link)."""
        if isinstance(self.content, list):
            pieces = []
            for part in self.content:
                if part.type == "text" and part.text is not None:
                    pieces.append(part.text)
                elif part.type == "image_url" and part.image_url is not None:
                    pieces.append(f"![]({part.image_url.url})")
            content = "".join(pieces)
        else:
            content = self.content or ""
        calls = []
        for call in self.tool_calls or ():
            function = call.get("function")
            if not isinstance(function, dict):
                raise ToolError("an assistant message's tool_calls need function.name")
            calls.append(CalledTool.parsed(call.get("id"), function.get("name"), function.get("arguments", {})))
        return ChatMessage(self.role, content, tuple(calls), self.tool_call_id, self.name)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    json_schema: Any = None  # OpenAI: {"name", "schema", "strict"}
    value: Any = None  # TGI's grammar union: {"type": "json" | "regex", "value": ...}


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
    response_format: ResponseFormat | None = None
    priority: int | None = Field(default=None, description="extension (vLLM's): with --scheduling-policy "
                                 "priority, lower runs first")

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def response_grammar(self) -> GrammarRequest | None:
        """OpenAI's response_format (text, json_object, json_schema with `strict`), or TGI's grammar
        union (json, regex) in the same field."""
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return GrammarRequest.json_schema({"type": "object"}, strict=True)
        if fmt.type == "json_schema":
            spec = fmt.json_schema
            if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                raise ValidationError("grammar is not valid: `json_schema` needs {\"name\", \"schema\"}")
            return GrammarRequest.json_schema(spec.get("schema", {"type": "object"}), strict=spec.get("strict") is True)
        if fmt.type in ("json", "regex"):
            return tgi_grammar({"type": fmt.type, "value": fmt.value})
        raise ValidationError(
            f"`response_format` type `{fmt.type}` is not supported: use `text`, `json_object` or `json_schema`"
        )

    def generation_input(
        self, inputs: str, *, max_new_tokens: int | None, top_n_tokens: int | None, choice: int,
        add_special_tokens: bool, input_ids: tuple[int, ...] | None = None, prompt_logprobs: bool = False,
        grammar: GrammarRequest | None = None,
    ) -> GenerationInput:
        """One choice's request. Choice i of a seeded request uses seed + i, so the choices differ
        (OpenAI's n) yet the whole answer is reproducible."""
        greedy = self.temperature == 0.0
        seed = self.seed
        if seed is not None and 0 <= seed < U64:  # one out of range stays as is, for validation to refuse
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
            grammar=grammar,
            model=self.model,
            priority=self.priority,
        )


class ChatRequest(SamplingFields):
    messages: list[Message]
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    logit_bias: dict[str, float] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    tool_prompt: str | None = Field(default=None, description="TGI: the instruction appended with the tools "
                                    "for templates without tool support")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="extension (vLLM's): more "
                                                        "variables for the chat template, e.g. enable_thinking")
    max_reasoning_tokens: int | None = Field(default=None, description="extension: the most tokens a reasoning "
                                             "model may think before its answer")

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat_turn(self) -> ChatTurn:
        plan = plan_tools(self.tools, self.tool_choice, self.parallel_tool_calls)
        return ChatTurn(
            messages=tuple(m.to_chat() for m in self.messages), tools=plan,
            response_grammar=None if plan is not None else self.response_grammar(), tool_prompt=self.tool_prompt,
            template_kwargs=self.chat_template_kwargs or {}, max_reasoning_tokens=self.max_reasoning_tokens,
        )

    def check_supported(self) -> None:
        if not self.messages:
            raise ValidationError("`messages` cannot be empty")
        for index, message in enumerate(self.messages):
            # OpenAI's rule: only an assistant message that makes tool calls may leave out its content.
            if message.content is None and not (message.role == "assistant" and message.tool_calls):
                raise ValidationError(f"`messages[{index}].content` is required for a `{message.role}` message")
        if self.tools and self.response_format is not None and self.response_format.type != "text":
            raise ToolError("Grammar and tools are mutually exclusive")
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

