"""Request bodies of Anthropic's Messages API (its API reference, "Messages"), as far as a local model can
serve them. Unknown fields are ignored, as the openai schemas do; fields of the wrong type are a 422."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ContentBlock(BaseModel):
    """Any content block; which fields matter depends on `type` (translate.py reads them)."""

    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None  # text
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: Any = None  # tool_use: the arguments object
    tool_use_id: str | None = None  # tool_result
    content: str | list[ContentBlock] | None = None  # tool_result
    is_error: bool | None = None  # tool_result
    thinking: str | None = None  # thinking


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[ContentBlock]


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    type: str | None = None  # "custom" or absent; Anthropic's own tools (bash, web search...) have others


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str  # auto, any, tool, none
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingParam(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str  # enabled, disabled, adaptive, between_tools
    budget_tokens: int | None = None


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: str  # json_schema
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: OutputFormat | None = None


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens: a conversation, counted as the model would read it."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None  # names a LoRA adapter, as OpenAI's `model` does
    messages: list[MessageParam]
    system: str | list[ContentBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None  # its `format`: structured output (a JSON schema)
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="extension (vLLM's)")


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
