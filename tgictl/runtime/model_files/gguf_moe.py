"""The mixture-of-experts settings of a GGUF file, written into the config.json its model directory gets
(docs/moe.md, "GGUF").

transformers' GGUF config reader knows Qwen3-MoE's expert count and top-k but not the experts' width, and reads
llama.cpp's Mixtral (architecture `llama` with `llama.expert_count`) as a dense Llama. llama.cpp's own keys say
what it computes: `{arch}.expert_count`, `{arch}.expert_used_count`, `{arch}.expert_feed_forward_length` and, where
written, `{arch}.expert_weights_norm` (otherwise llama.cpp renormalises the top-k weights of both families).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tgictl.errors import ConversionError
from tgictl.runtime.gguf_reader import read_gguf

# GGUF architecture -> the model_type its experts make it (llama.cpp writes Mixtral as `llama`).
MOE_MODEL_TYPES: dict[str, str] = {"llama": "mixtral", "qwen3moe": "qwen3_moe"}


def moe_fields(gguf_path: Path) -> dict[str, Any]:
    """config.json values for the experts of `gguf_path`; empty for a dense model."""
    fields = read_gguf(gguf_path).fields
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


def add_moe_fields(gguf_path: Path, config_path: Path) -> None:
    """Rewrite config.json (written from transformers' reading of the GGUF) with the file's expert settings."""
    values = moe_fields(gguf_path)
    if not values:
        return
    config: dict[str, Any] = json.loads(config_path.read_text())
    config.update(values)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
