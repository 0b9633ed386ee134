"""What transformers' GGUF config reader drops that changes a family's outputs, put back into config.json as
llama.cpp reads it (docs/architecture.md, "Weight formats").

transformers maps a fixed table of GGUF keys per architecture; llama.cpp writes more, and without these the
served model would silently compute another function:
- rotary scaling: `{arch}.rope.scaling.*` (linear, yarn; Gemma 3 scales its global layers only), a `rope_freqs`
  tensor (llama.cpp's form of Llama 3's llama3 scaling: one divisor per frequency, kept as tgictl's
  `frequency_divisors`), Phi-3's `rope_factors_long` / `rope_factors_short` tensors (longrope);
- Phi-3's sliding window and partial rotary (`rope.dimension_count` under the head size);
- Gemma 2's soft-caps, and Gemma's query scale, which llama.cpp does not store but derives from the model
  size (head_dim, or hidden / heads for the 27B models);
- a scaling type nobody here implements is refused with one line naming the key.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tgictl.errors import UnsupportedModelError
from tgictl.runtime.gguf_reader import GGUFFile

# Block counts of the 27B Gemma models, whose query scale llama.cpp takes from hidden / heads.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def reconcile_config(config: dict[str, Any], header: GGUFFile) -> dict[str, Any]:
    """config.json as transformers wrote it from `header`'s metadata, with what it dropped put back."""
    arch = header.architecture
    config = dict(config)

    def key(name: str) -> Any:
        return header.fields.get(f"{arch}.{name}")

    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    rope = _rope_scaling(header, arch, key)
    if rope:
        _update_rope(config, rope, global_only=arch == "gemma3")
        original = key("rope.scaling.original_context_length")
        if original is not None and rope["rope_type"] in ("longrope", "yarn"):
            # a top-level value wins over the rope dict's (Phi-3's config carries one, default 4096)
            config["original_max_position_embeddings"] = int(original)
    if key("rope.freq_base_swa") is not None and arch == "gemma3":
        config.setdefault("rope_parameters", {}).setdefault("sliding_attention", {})["rope_theta"] = float(
            key("rope.freq_base_swa"))
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if key(name) is not None:
            config[name] = float(key(name))
    if key("attention.sliding_window") is not None:
        config["sliding_window"] = int(key("attention.sliding_window"))
    rotary = key("rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        if arch != "phi3":
            raise UnsupportedModelError(f"{header.path.name}: {arch}.rope.dimension_count {rotary} below the head "
                                        f"size {head_dim} (partial rotary) is not supported for {arch!r}")
        config["partial_rotary_factor"] = int(rotary) / head_dim
        _update_rope(config, {"partial_rotary_factor": int(rotary) / head_dim}, global_only=False)
    if arch in _GEMMA_27B_LAYERS:
        big = int(config.get("num_hidden_layers", 0)) == _GEMMA_27B_LAYERS[arch]
        config["query_pre_attn_scalar"] = int(config["hidden_size"]) // heads if big else head_dim
    return config


def _rope_scaling(header: GGUFFile, arch: str, key: Any) -> dict[str, Any]:
    """The rotary scaling the file carries, as transformers' rope parameters ({} when none)."""
    kind = key("rope.scaling.type")
    original = key("rope.scaling.original_context_length")
    params: dict[str, Any] = {}
    if kind in ("linear", "yarn"):
        params = {"rope_type": kind, "factor": float(key("rope.scaling.factor"))}
        if kind == "yarn" and original is not None:
            params["original_max_position_embeddings"] = int(original)
    elif kind not in (None, "none"):
        raise UnsupportedModelError(f"{header.path.name}: rope scaling {kind!r} ({arch}.rope.scaling.type) is not "
                                    "supported; supported: linear, yarn")
    if "rope_freqs.weight" in header.tensors:
        if params:
            raise UnsupportedModelError(f"{header.path.name}: a rope_freqs tensor beside {arch}.rope.scaling.type "
                                        f"{kind!r} is not supported")
        divisors = np.asarray(header.array("rope_freqs.weight"), dtype=np.float32)
        params = {"rope_type": "default", "frequency_divisors": [float(x) for x in divisors]}
    if "rope_factors_long.weight" in header.tensors:
        long, short = (np.asarray(header.array(f"rope_factors_{which}.weight"), dtype=np.float32)
                       for which in ("long", "short"))
        params = {"rope_type": "longrope", "long_factor": [float(x) for x in long],
                  "short_factor": [float(x) for x in short]}
        if key("rope.scaling.attn_factor") is not None:
            params["attention_factor"] = float(key("rope.scaling.attn_factor"))
    return params


def _update_rope(config: dict[str, Any], params: dict[str, Any], *, global_only: bool) -> None:
    """Merge `params` into the rope dict transformers 5 wrote (Gemma 3: the global layers' one)."""
    rope = config.setdefault("rope_parameters", {})
    if global_only:
        rope = rope.setdefault("full_attention", {})
    rope.update(params)
    config.pop("rope_scaling", None)  # one place for the rope keys: rope_parameters
