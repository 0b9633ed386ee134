"""`tgictl shard`: serve one tensor-parallel rank over gRPC on `unix://{uds-path}-{RANK}`.

Flags and RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (read through tgictl.env) → ShardConfig →
runtime/shard/server.serve. The launcher starts one per rank; on its own it serves a single rank.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from tgictl.commands import speculation_options as spec
from tgictl.commands.batch_invariant_option import BATCH_INVARIANT_OPTION
from tgictl.commands.health_option import HEALTH_STEP_TIMEOUT_OPTION
from tgictl.commands.kv_cache_dtype_option import KV_CACHE_DTYPE_OPTION
from tgictl.commands.quantize_options import GROUP_SIZE_OPTION, QUANTIZE_OPTION
from tgictl.config import (
    DEFAULT_MODEL_ID,
    SHARD_DTYPES,
    HubConfig,
    ShardConfig,
    TracingConfig,
    default_uds_path,
    parse_lora_adapters,
)
from tgictl.env import apply_shard_openmp_defaults, read_env
from tgictl.quantization import quantize_spec
from tgictl.units import parse_size


def shard(
    model_id: str = typer.Option(
        DEFAULT_MODEL_ID, "--model-id",
        help="Hub id, local model directory, a .gguf file, or a hub repository's GGUF as owner/name/FILE.gguf.",
    ),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision (branch, tag or commit)."),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", help=f"One of {', '.join(SHARD_DTYPES)} (default: bfloat16 on CUDA and on CPUs with native bf16 math, else float32).",
        show_default=False,
    ),
    uds_path: Optional[Path] = typer.Option(
        None, "--uds-path", show_default=False,
        help="Socket base path; rank r listens on BASE-r (default: /tmp/tgictl-$UID/server). Its directory "
        "must be writable by you alone.",
    ),
    block_size: int = typer.Option(16, "--block-size", help="Tokens per KV block."),
    kv_cache_memory: Optional[str] = typer.Option(
        None, "--kv-cache-memory", show_default=False,
        help="KV cache bytes, e.g. 4GiB (CPU: the budget, default min(25% of available RAM, 4 GiB); "
        "CUDA: a cap on what free memory allows).",
    ),
    otlp_endpoint: Optional[str] = typer.Option(
        None, "--otlp-endpoint", show_default=False,
        help="Send OpenTelemetry traces to this OTLP/gRPC collector (the launcher passes the router's).",
    ),
    otlp_service_name: str = typer.Option("tgictl.shard", "--otlp-service-name", help="The service name in traces."),
    speculate: Optional[int] = spec.SPECULATE,
    speculate_ngram_min: int = spec.NGRAM_MIN,
    speculate_ngram_max: int = spec.NGRAM_MAX,
    speculate_max_batch: int = spec.MAX_BATCH,
    kv_cache_dtype: str = KV_CACHE_DTYPE_OPTION,
    quantize: Optional[str] = QUANTIZE_OPTION,
    quantize_group_size: Optional[int] = GROUP_SIZE_OPTION,
    batch_invariant: bool = BATCH_INVARIANT_OPTION,
    health_step_timeout: float = HEALTH_STEP_TIMEOUT_OPTION,
    lora_adapters: Optional[str] = typer.Option(
        None, "--lora-adapters", show_default=False,
        help="LoRA adapters to serve beside the model: name=PATH (a PEFT directory) or a hub id[@revision], "
        "comma-separated (default: LORA_ADAPTERS).",
    ),
) -> None:
    """Load the model and serve this rank until SIGTERM or SIGINT."""
    env = read_env()
    config = ShardConfig(
        model_id=model_id,
        revision=revision,
        dtype=dtype,
        uds_path=uds_path if uds_path is not None else default_uds_path(os.getuid()),
        block_size=block_size,
        kv_cache_memory=parse_size(kv_cache_memory) if kv_cache_memory is not None else None,
        kv_cache_dtype=kv_cache_dtype,
        quantize=quantize_spec(quantize, quantize_group_size),
        batch_invariant=batch_invariant,
        rank=env.rank if env.rank is not None else 0,
        world_size=env.world_size if env.world_size is not None else 1,
        master_addr=env.master_addr,
        master_port=env.master_port,
        tracing=TracingConfig(otlp_endpoint=otlp_endpoint, service_name=otlp_service_name),
        speculation=spec.speculation_config(
            speculate, speculate_ngram_min, speculate_ngram_max, speculate_max_batch, env
        ),
        lora_adapters=parse_lora_adapters(lora_adapters if lora_adapters is not None else env.lora_adapters),
        health_step_timeout_s=health_step_timeout,
    )
    apply_shard_openmp_defaults()  # before torch loads libgomp, which reads it once
    from tgictl.runtime.shard.server import (
        serve,  # torch loads only once the flags are known good
    )

    serve(config, HubConfig.from_env(env))


def register(app: typer.Typer) -> None:
    app.command("shard")(shard)
