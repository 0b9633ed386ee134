"""A GGUF file served natively: the model directory the shard and the router read it from
(docs/architecture.md, "Weight formats").

The shard reads config.json and the file's tensors (runtime/shard/gguf_file.py); the router reads
tokenizer.json and tokenizer_config.json. These come from the GGUF metadata, written once into tgictl's
cache (`models/gguf/<stem>-<key>/`) beside `model.gguf`, a symbolic link to the file itself: no tensor
is dequantized or copied. The key hashes the file's path, size and modification time, so a replaced
file gets a fresh directory; the directory appears in one rename, complete or not at all.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tgictl.errors import ConfigError, ConversionError
from tgictl.log import get_logger
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.model_files.conversion_output import staging_dir
from tgictl.runtime.model_files.gguf_metadata import (
    check_architecture,
    supported_architectures,
    write_model_config,
    write_tokenizer,
)
from tgictl.runtime.shard.families import FAMILIES

log = get_logger(__name__)

GGUF_LINK = "model.gguf"
_WRITTEN = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def served_architectures() -> list[str]:
    """The GGUF architectures of the families the shard implements (runtime/shard/families.py; llama.cpp writes
    Mistral models as "llama") whose config transformers can read from the file's metadata. llama.cpp also writes
    olmo2, granite and smollm3; transformers reads neither their config nor their tokenizer from a GGUF file, so
    those are served from their safetensors checkpoints."""
    wanted = {family.gguf_architecture for family in FAMILIES.values()}
    return sorted(wanted.intersection(supported_architectures()))


def is_gguf_path(path: Path) -> bool:
    return path.suffix == ".gguf"


def served_gguf_file(model_dir: Path, quantize: QuantizeSpec | None = None) -> Path | None:
    """The GGUF file a model directory is served from (its only *.gguf, when it holds no safetensors), or
    None. A GGUF model is quantized already: asking --quantize of it is a ConfigError."""
    if not model_dir.is_dir() or any(model_dir.glob("*.safetensors")):
        return None
    files = sorted(model_dir.glob("*.gguf"))
    if len(files) > 1:
        raise ConfigError(f"{model_dir} holds {len(files)} GGUF files; point --model-id at one of them")
    if files and quantize is not None:
        raise ConfigError(f"--quantize applies to safetensors models; {files[0].resolve().name} is a GGUF file, quantized "
                          "already (its blocks are served as they are)")
    return files[0] if files else None


def _key(gguf_path: Path) -> str:
    stat = gguf_path.stat()
    return hashlib.sha256(f"{gguf_path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:12]


def _complete(directory: Path, gguf_path: Path) -> bool:
    link = directory / GGUF_LINK
    return all((directory / name).is_file() for name in _WRITTEN) and link.is_symlink() and link.resolve() == gguf_path


def gguf_model_dir(gguf_path: Path, cache_dir: Path) -> Path:
    """The directory `gguf_path` is served from, written into `cache_dir` the first time."""
    source = gguf_path.expanduser().resolve()
    if not source.is_file():
        raise ConversionError(f"No such file: {gguf_path}")
    target = cache_dir / "models" / "gguf" / f"{source.stem}-{_key(source)}"
    if _complete(target, source):
        return target
    architecture = check_architecture(source, served_architectures())
    log.info("reading the config and tokenizer of %s (%s) into %s, once", source.name, architecture, target)
    try:
        with staging_dir(target, force=True) as staging:
            config = write_model_config(source, staging)
            write_tokenizer(source, staging, max_length=getattr(config, "max_position_embeddings", None),
                            vocab_size=getattr(config, "vocab_size", None))
            (staging / GGUF_LINK).symlink_to(source)
    except OSError:
        # Another process wrote the same directory first and its rename won; use its result.
        if not _complete(target, source):
            raise
    return target
