"""GGUF → a standard Hugging Face model directory (dequantized safetensors in a chosen dtype).

transformers already knows how to dequantize GGUF tensors and rebuild config and tokenizer, so we let
it load the file; gguf_metadata.py repairs what its save path gets wrong for us (the leftover gguf
quantization_config, which makes save_pretrained refuse, and the chat template's file).
"""

from __future__ import annotations

from pathlib import Path

from tgictl.errors import ConversionError
from tgictl.log import get_logger
from tgictl.progress import phase
from tgictl.runtime.model_files.convert import check_writable, staging_dir
from tgictl.runtime.gguf_reader import read_gguf
from tgictl.runtime.model_files.gguf_metadata import (
    check_architecture,
    fix_model_config,
    supported_architectures,
    write_tokenizer,
)
from tgictl.runtime.model_files.gguf_moe import moe_fields

log = get_logger(__name__)

_DTYPES = ("float32", "bfloat16", "float16")


def convert_gguf(gguf_path: Path, output: Path, *, dtype: str = "float32", force: bool = False) -> Path:
    """Write `gguf_path` as an HF directory at `output` (config.json, generation_config.json,
    tokenizer.json, tokenizer_config.json with the chat template, model.safetensors); returns `output`."""
    with phase("loading torch and transformers for the conversion", logger=log):
        import torch
        from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise ConversionError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if not gguf_path.is_file():
        raise ConversionError(f"No such file: {gguf_path}")
    check_writable(output, force=force)  # before the slow part: refuse at once
    architecture = check_architecture(gguf_path, supported_architectures())
    experts = moe_fields(read_gguf(gguf_path))
    if experts:  # transformers' GGUF loader drops Mixtral's experts and misreads Qwen3-MoE's width
        raise ConversionError(f"{gguf_path.name} is a mixture of experts ({experts['model_type']}); transformers "
                              "cannot dequantize it whole: serve the file itself (--model-id FILE.gguf, docs/moe.md)")

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
            write_tokenizer(gguf_path, staging, max_length=getattr(model.config, "max_position_embeddings", None))
        fix_model_config(staging / "config.json", gguf_path)
    return output
