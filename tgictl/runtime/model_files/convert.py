"""Checkpoint conversion entry point: picks the converter from what PATH is, and owns the rules every
converter shares (what exists, what may be overwritten, writing into place atomically).

    .gguf                           → a standard HF directory (convert_gguf.py)
    .bin / .pt, an index, or a dir  → safetensors next to or beside the source (convert_torch.py)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tgictl.config import ConvertConfig
from tgictl.errors import ConversionError

TORCH_SUFFIXES = (".bin", ".pt", ".pth")


def convert(config: ConvertConfig) -> Path:
    """Convert `config.path`; returns the directory holding the result."""
    path = config.path
    if not path.exists():
        raise ConversionError(f"No such file or directory: {path}")
    if path.is_file() and path.suffix == ".gguf":
        from tgictl.runtime.model_files.convert_gguf import convert_gguf

        output = config.output if config.output is not None else path.with_suffix("")
        return convert_gguf(path, output, dtype=config.dtype or "float32", force=config.force)
    from tgictl.runtime.model_files.convert_torch import convert_torch_checkpoint

    return convert_torch_checkpoint(path, config.output, dtype=config.dtype, force=config.force)


def check_writable(target: Path, *, force: bool) -> None:
    """Refuse to replace an existing result unless forced (a conversion can take minutes to redo)."""
    if target.exists() and (target.is_file() or any(target.iterdir())) and not force:
        raise ConversionError(f"{target} already exists; pass --force to overwrite it")


@contextmanager
def staging_dir(output: Path, *, force: bool) -> Iterator[Path]:
    """Yield an empty sibling directory to write into; on success it replaces `output` in one rename.

    A crash halfway leaves only the staging directory behind, never an `output` that looks complete
    (the hub's one-time default-model conversion relies on that).
    """
    check_writable(output, force=force)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.parent / f".{output.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        if output.exists():
            shutil.rmtree(output) if output.is_dir() else output.unlink()
        staging.rename(output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
