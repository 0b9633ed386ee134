"""`tgictl convert PATH`: PyTorch checkpoints to safetensors, GGUF files to HF model directories."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tgictl.config import CONVERT_DTYPES, ConvertConfig, LogConfig
from tgictl.env import read_env
from tgictl.log import print_result


def convert(
    ctx: typer.Context,
    path: Path = typer.Argument(..., help="A .gguf file, a .bin/.pt file, a *.bin.index.json, or a directory."),
    dtype: Optional[str] = typer.Option(
        None,
        "--dtype",
        help=f"One of {', '.join(CONVERT_DTYPES)} (default: keep a PyTorch checkpoint's dtype; GGUF → float32).",
        metavar="DTYPE",
    ),
    output: Optional[Path] = typer.Option(
        None, "--output", help="Output directory (default: the checkpoint's directory; for GGUF the file name "
        "without .gguf beside it; inside an installed package or a read-only directory: ~/.cache/tgictl/converted/).",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output."),
) -> None:
    """Convert a checkpoint to safetensors (every tensor checked) and print the output directory."""
    from tgictl.runtime.model_files.convert import convert as run_convert

    config = ConvertConfig(path=path, dtype=dtype, output=output, force=force, cache_dir=read_env().cache_dir)
    result = run_convert(config)
    log_config: LogConfig | None = ctx.obj
    print_result(log_config, str(result), {"source": str(path), "path": str(result), "dtype": dtype})


def register(app: typer.Typer) -> None:
    app.command("convert")(convert)
