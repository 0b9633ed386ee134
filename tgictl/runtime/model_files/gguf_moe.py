"""The mixture-of-experts settings of a GGUF file, written into the config.json its model directory gets
(docs/moe.md, "GGUF").

transformers' GGUF config reader knows Qwen3-MoE's expert count and top-k but not the experts' width, and reads
llama.cpp's Mixtral (architecture `llama` with `llama.expert_count`) as a dense Llama. llama.cpp's own keys say
what it computes: `{arch}.expert_count`, `{arch}.expert_used_count`, `{arch}.expert_feed_forward_length` and, where
written, `{arch}.expert_weights_norm` (otherwise llama.cpp renormalises the top-k weights of both families).
"""

from __future__ import annotations

from typing import Any

from tgictl.errors import ConversionError
from tgictl.runtime.gguf_reader import GGUFFile

# GGUF architecture -> the model_type its experts make it (llama.cpp writes Mixtral as `llama`).
MOE_MODEL_TYPES: dict[str, str] = {"llama": "mixtral", "qwen3moe": "qwen3_moe"}


def moe_fields(header: GGUFFile) -> dict[str, Any]:
    """config.json values for the experts of the GGUF file `header` describes; empty for a dense model."""
    fields, gguf_path = header.fields, header.path
    arch = str(fields.get("general.architecture", ""))
    experts = int(fields.get(f"{arch}.expert_count") or 0)
    if experts == 0 or arch not in MOE_MODEL_TYPES:
        return {}
    used = fields.get(f"{arch}.expert_used_count")
    if used is None:
        raise ConversionError(f"{gguf_path.name}: {arch}.expert_count is {experts} but {arch}.expert_used_count "
                              "is missing")
    normalize = bool(fields.get(f"{arch}.expert_weights_norm", True))
    model_type = MOE_MODEL_TYPES[arch]
    values: dict[str, Any] = {"model_type": model_type, "num_experts_per_tok": int(used)}
    if model_type == "mixtral":
        if not normalize:
            raise ConversionError(f"{gguf_path.name}: {arch}.expert_weights_norm is false; Mixtral renormalises")
        # The experts are the MLP (intermediate_size = feed_forward_length); llama.cpp applies no window to llama.
        values.update(architectures=["MixtralForCausalLM"], num_local_experts=experts, sliding_window=None)
    else:
        width = fields.get(f"{arch}.expert_feed_forward_length")
        if width is None:
            raise ConversionError(f"{gguf_path.name}: {arch}.expert_feed_forward_length is missing")
        values.update(num_experts=experts, moe_intermediate_size=int(width), norm_topk_prob=normalize)
    return values
