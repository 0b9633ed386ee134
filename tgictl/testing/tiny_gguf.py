"""Tiny GGUF models for tests, written the way llama.cpp's converter writes them: a tiny random model of
tiny_models.py, its tensors renamed to GGUF names, llama's q/k rows permuted, Gemma's norms stored as 1 + w,
projections in chosen block types (gguf.quants.quantize where gguf-py can, else blocks by their spec:
tgictl/testing/gguf_blocks.py), norms in F32, the family's own keys (windows, soft-caps, rotary dimensions and
scaling; Llama 3's and Phi-3's rotary factors as tensors), and the byte-level BPE tokenizer with its chat
template in the metadata.

transformers loads these files (dequantizing them), which makes it the oracle for the native path.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tgictl.runtime.model_files.gguf_model import served_architectures
from tgictl.runtime.shard.families import FAMILIES
from tgictl.testing.gguf_blocks import quantized_blocks
from tgictl.testing.tiny_models import BOS_TOKEN, CHATML_TEMPLATE, EOS_TOKEN, SPECIAL_TOKENS, write_tiny_model

# family -> GGUF general.architecture, for the families whose GGUF files tgictl serves (families.py is the list).
ARCHITECTURES: dict[str, str] = {
    family: entry.gguf_architecture for family, entry in FAMILIES.items()
    if entry.gguf_architecture in served_architectures()
}
TypeChoice = Callable[[str], str]  # GGUF tensor name -> type name ("F32", "Q4_0", ...)
# transformers reads no head size from a qwen3 GGUF (its config default, 128, applies): heads of 128 there.
# Gemma's query scale is not stored either: llama.cpp derives head_dim (below 27B), so the tiny model uses that.
_OPTIONS: dict[str, dict[str, Any]] = {
    "qwen3": {"num_heads": 2, "num_kv_heads": 1},
    "gemma2": {"query_pre_attn_scalar": 64, "tie_word_embeddings": True},  # llama.cpp writes no separate head
    "gemma3_text": {"query_pre_attn_scalar": 64, "final_logit_softcapping": None},  # Gemma 3 has none
    "mixtral": {"intermediate_size": 64},  # the experts' width
    "qwen3_moe": {"moe_intermediate_size": 64},
}
# Architectures whose q/k rows llama.cpp permutes, and those whose norms it stores as 1 + w.
_PERMUTED = ("llama",)
_NORM_PLUS_ONE = ("gemma2", "gemma3")
# One expert's projection in an HF checkpoint; llama.cpp's converter stacks a layer's experts per projection.
_EXPERT = re.compile(r"^(?P<stem>.+\.experts)\.(?P<expert>\d+)\.(?P<projection>[^.]+)\.weight$")


def every_projection(type_name: str) -> TypeChoice:
    """One block type for every matrix (embedding and LM head included), F32 for the rest."""
    return lambda name: type_name if name.endswith(".weight") and "norm" not in name else "F32"


def llama_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute` of q/k rows (the inverse of transformers')."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape
    )


def _add_family_metadata(writer: Any, arch: str, config: dict[str, Any]) -> None:
    """What llama.cpp's converter writes beyond the llama keys: windows, soft-caps, rotary scaling."""
    import gguf

    if config.get("sliding_window") is not None and arch in ("gemma2", "gemma3", "phi3"):
        writer.add_sliding_window(int(config["sliding_window"]))
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) is not None and arch == "gemma2":
            writer.add_key_value(f"{arch}.{key}", float(config[key]), gguf.GGUFValueType.FLOAT32)
    rope = config.get("rope_parameters") or {}
    scaled = rope.get("full_attention", {}) if arch == "gemma3" else rope
    if scaled.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaled["factor"]))
    if scaled.get("rope_type") == "longrope":  # llama.cpp's Phi3MiniModel: the attention factor, computed
        original = int(config["original_max_position_embeddings"])
        scale = config["max_position_embeddings"] / original
        factor = scaled.get("attention_factor") or (
            1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(original)))
        writer.add_rope_scaling_attn_factors(float(factor))
        writer.add_rope_scaling_orig_ctx_len(original)


def _extra_tensors(arch: str, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """The rotary factor tensors llama.cpp's converter adds: Llama 3's scaling as one divisor per frequency
    (`rope_freqs`), Phi-3's longrope factors."""
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type") == "llama3":
        return {"rope_freqs.weight": _llama3_divisors(rope, config["head_dim"])}
    if rope.get("rope_type") == "longrope":
        return {f"rope_factors_{which}.weight": np.array(rope[f"{which}_factor"], dtype=np.float32)
                for which in ("long", "short")}
    return {}


def _llama3_divisors(rope: dict[str, Any], head_dim: int) -> np.ndarray:
    """llama.cpp's LlamaModel rope_freqs: 1 for short wavelengths, factor for long ones, interpolated between."""
    factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    old = float(rope["original_max_position_embeddings"])
    freqs = 1.0 / (float(rope["rope_theta"]) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    divisors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            divisors.append(1.0)
        elif wavelen > old / low:
            divisors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def _add_metadata(writer: Any, arch: str, config: dict[str, Any], model_dir: Path) -> None:
    import gguf

    writer.add_name("tiny test model")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    rope = config.get("rope_parameters") or {}
    rotary = float(rope.get("partial_rotary_factor", config.get("partial_rotary_factor")) or 1.0)
    writer.add_rope_dimension_count(int(config["head_dim"] * rotary))
    if arch == "gemma3":  # global and local bases, as llama.cpp writes them
        writer.add_rope_freq_base(float(rope["full_attention"]["rope_theta"]))
        writer.add_key_value(gguf.Keys.Rope.FREQ_BASE_SWA.format(arch=arch),
                             float(rope["sliding_attention"]["rope_theta"]), gguf.GGUFValueType.FLOAT32)
    else:
        writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    _add_family_metadata(writer, arch, config)
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(config["vocab_size"])
    experts = config.get("num_local_experts") or config.get("num_experts")
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        if config.get("moe_intermediate_size"):
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(tokenizer["model"]["vocab"])
    for added in tokenizer["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")  # the tiny tokenizer's split is Qwen2's
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in SPECIAL_TOKENS else 1 for token in tokens])  # 3: control
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab[BOS_TOKEN])
    writer.add_eos_token_id(vocab[EOS_TOKEN])
    writer.add_pad_token_id(vocab[BOS_TOKEN])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)


def source_dir(path: Path, work_dir: Path | None = None) -> Path:
    """Where write_tiny_gguf(path, work_dir=...) writes the safetensors model the file is made from."""
    return (work_dir or path.parent) / f"{path.stem}-source"


def write_tiny_gguf(path: Path, family: str = "llama", *, types: TypeChoice | None = None, seed: int = 0,
                    work_dir: Path | None = None, **model_options: Any) -> Path:
    """Write a tiny `family` model as the GGUF file `path` and return `path`.

    types: the block type of each GGUF tensor (default Q8_0 matrices, F32 norms and biases). Matrices
    must have input sizes in multiples of the block size: 256 for the K-quants (hidden_size=256).
    work_dir: where the intermediate safetensors model is written (default: next to `path`).
    """
    import gguf
    from safetensors.numpy import load_file

    arch_name = ARCHITECTURES[family]
    arch = {name: value for value, name in gguf.MODEL_ARCH_NAMES.items()}[arch_name]
    options = {"hidden_size": 256, "intermediate_size": 512, "num_heads": 4, "num_kv_heads": 2,
               **_OPTIONS.get(family, {}), **model_options}
    source = write_tiny_model(source_dir(path, work_dir), family, seed=seed, **options)
    config = json.loads((source / "config.json").read_text())
    tensors = load_file(str(source / "model.safetensors"))
    choose = types or every_projection("Q8_0")
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    heads = {".attn_q.": config["num_attention_heads"], ".attn_k.": config["num_key_value_heads"]}
    rng = np.random.default_rng(seed)

    writer = gguf.GGUFWriter(str(path), arch_name)
    _add_metadata(writer, arch_name, config, source)
    for gguf_name, data in _extra_tensors(arch_name, config).items():
        writer.add_tensor(gguf_name, data)
    for hf_name, value in sorted(_stack_experts(tensors).items()):
        stem, _, suffix = hf_name.rpartition(".")
        mapped = names.get_name(stem)
        if mapped is None and hf_name == "lm_head.weight":
            continue  # an architecture without an output tensor (Gemma 2) ties its head to the embedding
        gguf_name = f"{mapped}.{suffix}"
        data = value.astype(np.float32)
        if arch_name in _PERMUTED:
            for marker, count in heads.items():
                if marker in gguf_name:
                    data = llama_permute(data, count)
        if arch_name in _NORM_PLUS_ONE and gguf_name.endswith("norm.weight"):
            data = data + 1
        type_name = choose(gguf_name) if data.ndim >= 2 else "F32"
        if type_name == "F32":
            writer.add_tensor(gguf_name, data)
        elif type_name == "F16":
            writer.add_tensor(gguf_name, data.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[type_name]
            blocks = quantized_blocks(type_name, data.reshape(-1, data.shape[-1]), rng)
            writer.add_tensor(gguf_name, blocks.reshape(*data.shape[:-1], -1), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _stack_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A layer's experts as llama.cpp's converter writes them: one [experts, out, in] tensor per projection, under
    the HF name without the expert's index (gguf-py's TensorNameMap maps that to `blk.N.ffn_gate_exps`)."""
    stacked: dict[str, dict[int, np.ndarray]] = {}
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        match = _EXPERT.match(name)
        if match is None:
            out[name] = value
        else:
            stacked.setdefault(f"{match['stem']}.{match['projection']}.weight", {})[int(match["expert"])] = value
    for name, experts in stacked.items():
        out[name] = np.stack([experts[e] for e in range(len(experts))])
    return out


def dequantized_checkpoint(gguf_path: Path, source: Path, out: Path) -> Path:
    """The HF model directory holding exactly the values `gguf_path` stores (blocks dequantized by gguf-py, llama's
    q/k rows put back, experts unstacked), with the config and tokenizer of `source` (write_tiny_gguf's model):
    transformers on it is the oracle where transformers cannot load the GGUF itself (Mixtral, written as llama)."""
    import shutil

    import gguf
    from safetensors.numpy import load_file, save_file

    reader = gguf.GGUFReader(str(gguf_path))
    stored = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32) for t in reader.tensors}
    config = json.loads((source / "config.json").read_text())
    arch_name = ARCHITECTURES[config["model_type"]]
    arch = {name: value for value, name in gguf.MODEL_ARCH_NAMES.items()}[arch_name]
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    heads = {".attn_q.": config["num_attention_heads"], ".attn_k.": config["num_key_value_heads"]}
    tensors = {}
    for hf_name in load_file(str(source / "model.safetensors")):
        match = _EXPERT.match(hf_name)
        stem = f"{match['stem']}.{match['projection']}" if match else hf_name.rpartition(".")[0]
        gguf_name = f"{names.get_name(stem)}.{hf_name.rpartition('.')[2]}"
        value = stored[gguf_name][int(match["expert"])] if match else stored[gguf_name]
        if arch_name in _PERMUTED:
            for marker, count in heads.items():
                if marker in gguf_name:  # llama_permute undone: (heads, half, 2) rows back to (heads, 2, half)
                    value = value.reshape(count, value.shape[0] // count // 2, 2, -1).swapaxes(1, 2).reshape(
                        value.shape)
        tensors[hf_name] = np.ascontiguousarray(value)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out / name)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
