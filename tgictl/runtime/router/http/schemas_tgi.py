"""Request bodies of TGI's native routes (TGI's GenerateRequest, router/src/lib.rs) and their translation to GenerationInput.

Responses are built as plain dicts in routes_tgi.py because TGI omits some keys when empty and keeps
others as null; the shapes are documented there. Unknown fields are ignored, as serde does.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tgictl.errors import ValidationError
from tgictl.runtime.router.guided.grammars import tgi_grammar
from tgictl.runtime.router.validation import GenerationInput


class GenerateParameters(BaseModel):
    """Every field is optional and null means "not given": clients such as huggingface_hub send
    explicit nulls."""

    model_config = ConfigDict(extra="ignore")

    best_of: int | None = Field(default=None, description="Generate best_of sequences, return the most likely")
    temperature: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = Field(default=None, description="tgictl extension: a real presence penalty")
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    min_p: float | None = Field(default=None, description="tgictl extension")
    do_sample: bool | None = None
    max_new_tokens: int | None = None
    return_full_text: bool | None = None
    stop: list[str] | None = None
    truncate: int | None = None
    watermark: bool | None = None
    details: bool | None = None
    decoder_input_details: bool | None = None
    seed: int | None = None
    top_n_tokens: int | None = None
    grammar: Any = Field(
        default=None,
        description='{"type": "json" | "json_object", "value": schema} | {"type": "json_schema", "value": '
        '{"name", "schema"}} | {"type": "regex", "value": regex}',
    )
    adapter_id: str | None = None
    ignore_eos: bool | None = Field(default=None, description="tgictl extension for benchmarks: generate past EOS")
    priority: int | None = Field(default=None, description="tgictl extension (vLLM's): with --scheduling-policy "
                                 "priority, lower runs first")


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    inputs: str
    # TGI QUIRK kept for compatibility: a request without `parameters` samples (do_sample=true).
    parameters: GenerateParameters = Field(default_factory=lambda: GenerateParameters(do_sample=True))


class CompatGenerateRequest(GenerateRequest):
    stream: bool = False


def unsupported(parameters: GenerateParameters) -> None:
    """Features TGI has and tgictl does not: refused with a validation error, never ignored."""
    if parameters.watermark:
        raise ValidationError("`watermark` is not supported")


def to_generation_input(request: GenerateRequest, *, stream: bool) -> GenerationInput:
    p = request.parameters
    unsupported(p)
    return GenerationInput(
        inputs=request.inputs,
        add_special_tokens=True,
        stream=stream,
        best_of=p.best_of,
        temperature=p.temperature,
        repetition_penalty=p.repetition_penalty,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        top_k=p.top_k,
        top_p=p.top_p,
        typical_p=p.typical_p,
        min_p=p.min_p,
        do_sample=bool(p.do_sample),
        max_new_tokens=p.max_new_tokens,
        stop=tuple(p.stop or ()),
        truncate=p.truncate,
        seed=p.seed,
        top_n_tokens=p.top_n_tokens,
        decoder_input_details=bool(p.decoder_input_details),
        ignore_eos=bool(p.ignore_eos),
        grammar=tgi_grammar(p.grammar) if p.grammar is not None else None,
        adapter_id=p.adapter_id,
        priority=p.priority,
    )
