"""Checkpoint conversion entry point: picks the converter from what PATH is (the rules every converter
shares, what may be overwritten and writing into place atomically, are conversion_output.py's).

    .gguf                           → a standard HF directory (convert_gguf.py)
    .bin / .pt, an index, or a dir  → safetensors next to or beside the source (convert_torch.py)
"""

from __future__ import annotations

import os
import site
import sysconfig
from pathlib import Path

from tgictl.config import ConvertConfig
from tgictl.errors import ConversionError
from tgictl.log import get_logger

log = get_logger(__name__)


def installed_package_dirs() -> tuple[Path, ...]:
    """Where installed Python packages live (site-packages, a virtual environment's too)."""
    paths = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    paths.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())
    paths.add(site.getusersitepackages())
    return tuple(Path(p).resolve() for p in paths)


def inside_installed_package(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(root) for root in installed_package_dirs()) or any(
        part in ("site-packages", "dist-packages") for part in resolved.parts
    )


def default_output(source_dir: Path, name: str, cache_dir: Path | None) -> Path:
    """Next to the input, unless that is inside an installed package (pip would own, and may delete,
    what we write there) or not writable: then tgictl's cache, under converted/NAME."""
    if cache_dir is not None and (inside_installed_package(source_dir) or not os.access(source_dir, os.W_OK)):
        target = cache_dir / "converted" / name
        log.info("%s is inside an installed package or not writable: writing the conversion to %s", source_dir, target)
        return target
    return source_dir / name


def convert(config: ConvertConfig) -> Path:
    """Convert `config.path`; returns the directory holding the result."""
    path = config.path
    if not path.exists():
        raise ConversionError(f"No such file or directory: {path}")
    if path.is_file() and path.suffix == ".gguf":
        from tgictl.runtime.model_files.convert_gguf import convert_gguf

        output = config.output or default_output(path.parent, path.stem, config.cache_dir)
        return convert_gguf(path, output, dtype=config.dtype or "float32", force=config.force)
    from tgictl.runtime.model_files.convert_torch import convert_torch_checkpoint

    output = config.output
    source_dir = path if path.is_dir() else path.parent
    if output is None and config.cache_dir is not None and inside_installed_package(source_dir):
        output = default_output(source_dir, source_dir.name, config.cache_dir)
    return convert_torch_checkpoint(path, output, dtype=config.dtype, force=config.force)
