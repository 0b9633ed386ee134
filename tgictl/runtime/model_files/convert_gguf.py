"""GGUF → a standard Hugging Face model directory (dequantized safetensors in a chosen dtype).

transformers already knows how to dequantize GGUF tensors and rebuild config and tokenizer, so we let
it load the file and only repair what its save path gets wrong for us: the leftover gguf
quantization_config (which makes save_pretrained refuse), and the chat template, which transformers 5
writes to chat_template.jinja while every consumer we care about reads tokenizer_config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tgictl.errors import ConversionError
from tgictl.log import get_logger
from tgictl.progress import phase
from tgictl.runtime.model_files.convert import check_writable, staging_dir

log = get_logger(__name__)

_DTYPES = ("float32", "bfloat16", "float16")
# tokenizer_config.json keys that describe where the tokenizer was loaded from, not the tokenizer.
_LOAD_TIME_KEYS = ("is_local", "local_files_only", "gguf_file", "name_or_path")


def gguf_architecture(path: Path) -> str:
    """The `general.architecture` of a GGUF file; ConversionError when `path` is no GGUF file."""
    try:
        import gguf

        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return str(field.contents())
    except (ValueError, KeyError, OSError, IndexError) as err:
        raise ConversionError(f"{path} is not a GGUF checkpoint ({err})") from None


def supported_architectures() -> list[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))


def convert_gguf(gguf_path: Path, output: Path, *, dtype: str = "float32", force: bool = False) -> Path:
    """Write `gguf_path` as an HF directory at `output` (config.json, generation_config.json,
    tokenizer.json, tokenizer_config.json with the chat template, model.safetensors); returns `output`."""
    with phase("loading torch and transformers for the conversion", logger=log):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in _DTYPES:
        raise ConversionError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if not gguf_path.is_file():
        raise ConversionError(f"No such file: {gguf_path}")
    check_writable(output, force=force)  # before the slow part: refuse at once
    architecture = gguf_architecture(gguf_path)
    known = supported_architectures()
    if architecture not in known:
        raise ConversionError(
            f"{gguf_path.name}: GGUF architecture {architecture!r} is not supported; known: {', '.join(known)}"
        )

    # debug: the callers say why they convert (hub.py logs its one line for the default model).
    log.debug("converting %s (%s) to %s in %s", gguf_path.name, architecture, output, dtype)
    with staging_dir(output, force=force) as staging:
        try:
            with phase(f"dequantizing {gguf_path.name} to {dtype} (transformers' GGUF loader, ~30 s for 135M)",
                       logger=log):
                model = AutoModelForCausalLM.from_pretrained(
                    gguf_path.parent, gguf_file=gguf_path.name, dtype=getattr(torch, dtype)
                )
        except (ValueError, ImportError, OSError, KeyError) as err:
            # transformers' loader names what it lacks (a tensor type, a package); the user gets that line.
            raise ConversionError(f"{gguf_path.name}: transformers could not load it: {err}") from err
        # The weights are already dequantized into plain tensors; dropping the quantizer makes the
        # model an ordinary one that saves (and later loads) without any gguf machinery.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.dtype = dtype
        with phase(f"writing safetensors and the tokenizer to {output}", logger=log):
            model.save_pretrained(staging, safe_serialization=True)
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            tokenizer.save_pretrained(staging)
        _fix_tokenizer_config(staging, tokenizer, max_length=getattr(model.config, "max_position_embeddings", None))
        _fix_model_config(staging / "config.json")
    return output


def _fix_model_config(path: Path) -> None:
    config: dict[str, Any] = json.loads(path.read_text())
    config.pop("quantization_config", None)
    # transformers stores the GGUF's free-text model name here; it is no path and misleads readers.
    config.pop("_model_name_or_path", None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _fix_tokenizer_config(directory: Path, tokenizer: Any, *, max_length: int | None) -> None:
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
