"""What every converter (convert_gguf.py, convert_torch.py, gguf_model.py) shares about its output: what may be
overwritten, and writing into place atomically. Apart from convert.py, which picks the converter, so that the
converters import it and convert.py imports them, with no circle."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tgictl.errors import ConversionError

TORCH_SUFFIXES = (".bin", ".pt", ".pth")


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
