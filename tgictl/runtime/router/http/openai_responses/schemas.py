"""Request bodies of OpenAI's Responses API (its API reference, "Responses"), as far as a local model can
serve them. Unknown fields are ignored; fields of the wrong type are a 422."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str  # input_text, output_text, text, refusal (images and files are refused)
    text: str | None = None
    refusal: str | None = None


class InputItem(BaseModel):
    """A message ({role, content} with or without type "message"), a function_call, a function_call_output,
    or a reasoning item (not shown to the template)."""

    model_config = ConfigDict(extra="ignore")

    type: str | None = None
    role: str | None = None
    content: str | list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: str  # text, json_object, json_schema
    name: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextParam(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat | None = None


class ReasoningParam(BaseModel):
    model_config = ConfigDict(extra="ignore")

    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None  # names a LoRA adapter, as chat's `model` does
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    text: TextParam | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool = True
    reasoning: ReasoningParam | None = None
    metadata: dict[str, Any] | None = None
    top_k: int | None = Field(default=None, description="extension")
    seed: int | None = Field(default=None, description="extension")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="extension (vLLM's)")
    max_reasoning_tokens: int | None = Field(default=None, description="extension: the most tokens a reasoning "
                                             "model may think before its answer")
