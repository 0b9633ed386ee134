"""The `--quantize` / `--quantize-group-size` flags that `shard`, `launch` and `profile` share."""

from __future__ import annotations

from typing import Optional

import typer

from tgictl.quantization import DEFAULT_INT4_GROUP_SIZE, INT4_GROUP_SIZES, QUANTIZE_METHODS

QUANTIZE_OPTION: Optional[str] = typer.Option(
    None, "--quantize", show_default=False,
    help=f"Quantize a safetensors model's weights at load: {' or '.join(QUANTIZE_METHODS)} (int8: one scale per "
    "output row; int4: a scale and a zero per group of input weights; the embedding and LM head become int8). "
    "Activations stay in --dtype. A GGUF model is served in its own blocks and takes no --quantize.",
)
GROUP_SIZE_OPTION: Optional[int] = typer.Option(
    None, "--quantize-group-size", show_default=False,
    help=f"int4 group size, one of {', '.join(map(str, INT4_GROUP_SIZES))} (default {DEFAULT_INT4_GROUP_SIZE}).",
)
