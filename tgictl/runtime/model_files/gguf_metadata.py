"""What a GGUF file says besides its tensors, written as the files every consumer of an HF model directory
reads: config.json, generation_config.json, tokenizer.json and tokenizer_config.json (with the chat
template). Both the conversion (convert_gguf.py) and native serving (gguf_model.py) write them this way.

transformers reads GGUF metadata (config, tokenizer) without dequantizing any tensor; we repair what its
save path gets wrong for us: the leftover gguf quantization_config, the free-text model name stored as a
path, the chat template, which transformers 5 writes to chat_template.jinja while every consumer we care
about reads tokenizer_config.json, and the settings its config reader drops (gguf_config.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tgictl.errors import ConversionError
from tgictl.runtime.gguf_reader import GGUFFormatError, read_gguf
from tgictl.runtime.model_files.gguf_config import reconcile_config
from tgictl.runtime.model_files.gguf_moe import moe_fields

# tokenizer_config.json keys that describe where the tokenizer was loaded from, not the tokenizer.
_LOAD_TIME_KEYS = ("is_local", "local_files_only", "gguf_file", "name_or_path")


def gguf_architecture(path: Path) -> str:
    """The `general.architecture` of a GGUF file; ConversionError when `path` is no GGUF file."""
    try:
        header = read_gguf(path)
    except GGUFFormatError as err:
        raise ConversionError(f"{path} is not a GGUF checkpoint ({err})") from None
    if not header.architecture:
        raise ConversionError(f"{path} is not a GGUF checkpoint (no general.architecture)")
    return header.architecture


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers can read, as files name them (transformers lists llama.cpp's `qwen3moe`
    under its own model type, `qwen3_moe`)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    file_names = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
    return sorted(file_names.get(a, a) for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))


def check_architecture(gguf_path: Path, known: list[str]) -> str:
    architecture = gguf_architecture(gguf_path)
    if architecture not in known:
        raise ConversionError(
            f"{gguf_path.name}: GGUF architecture {architecture!r} is not supported; known: {', '.join(known)}"
        )
    return architecture


def write_model_config(gguf_path: Path, directory: Path) -> Any:
    """config.json and generation_config.json from the GGUF metadata; returns the transformers config."""
    from transformers import AutoConfig, GenerationConfig

    try:
        config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except (ValueError, ImportError, OSError, KeyError) as err:
        raise ConversionError(f"{gguf_path.name}: transformers could not read its config: {err}") from err
    config.save_pretrained(directory)
    GenerationConfig.from_model_config(config).save_pretrained(directory)
    fix_model_config(directory / "config.json", gguf_path)
    return config


def write_tokenizer(gguf_path: Path, directory: Path, *, max_length: int | None, vocab_size: int | None = None) -> None:
    """tokenizer.json and tokenizer_config.json (chat template inside) from the GGUF's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tokenizer.save_pretrained(directory)
    if vocab_size is not None:
        drop_tokens_past_the_vocabulary(directory, vocab_size)
    fix_tokenizer_config(directory, tokenizer, max_length=max_length)


def drop_tokens_past_the_vocabulary(directory: Path, vocab_size: int) -> None:
    """Removes the added tokens whose ids the model has no row for. transformers' GGUF reader gives a byte-level
    BPE vocabulary without an unknown token a default `<|endoftext|>` after the last id (a Llama 3 GGUF: id 128256
    of a 128,256-token vocabulary); no weight can produce it, and grammar compilers refuse a tokenizer larger
    than the model's vocabulary."""
    tokenizer_path, config_path = directory / "tokenizer.json", directory / "tokenizer_config.json"
    data = json.loads(tokenizer_path.read_text())
    dropped = {t["content"] for t in data.get("added_tokens", []) if t["id"] >= vocab_size}
    if not dropped:
        return
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < vocab_size]
    if data.get("model", {}).get("unk_token") in dropped:
        data["model"]["unk_token"] = None
    tokenizer_path.write_text(json.dumps(data, ensure_ascii=False))
    if config_path.exists():
        config = json.loads(config_path.read_text())
        decoder = config.get("added_tokens_decoder", {})
        config["added_tokens_decoder"] = {k: v for k, v in decoder.items() if int(k) < vocab_size}
        for key in ("unk_token", "pad_token", "eos_token", "bos_token"):
            if config.get(key) in dropped:
                config[key] = None
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def fix_model_config(path: Path, gguf_path: Path) -> None:
    config: dict[str, Any] = json.loads(path.read_text())
    config.pop("quantization_config", None)
    # transformers stores the GGUF's free-text model name here; it is no path and misleads readers.
    config.pop("_model_name_or_path", None)
    try:
        header = read_gguf(gguf_path)
    except GGUFFormatError as err:
        raise ConversionError(f"{gguf_path} is not a GGUF checkpoint ({err})") from None
    config = reconcile_config(config, header)  # what transformers' reader drops (gguf_config.py)
    config.update(moe_fields(header))  # and the experts' settings (gguf_moe.py)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def fix_tokenizer_config(directory: Path, tokenizer: Any, *, max_length: int | None) -> None:
    path = directory / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    template_file = directory / "chat_template.jinja"
    template = tokenizer.chat_template
    if template is None and template_file.exists():
        template = template_file.read_text()
    if template is not None:
        config["chat_template"] = template
        # One source of truth: two templates that could drift apart would be worse than none.
        template_file.unlink(missing_ok=True)
    if tokenizer.eos_token is None:
        raise ConversionError("the GGUF tokenizer has no eos token; generation could never stop")
    config["eos_token"] = tokenizer.eos_token
    # A class name transformers 4 and 5 both resolve to the fast tokenizer reading tokenizer.json.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if max_length is not None:
        config["model_max_length"] = int(max_length)
    for key in _LOAD_TIME_KEYS:
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
