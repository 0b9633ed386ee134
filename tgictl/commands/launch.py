"""`tgictl launch`: one command that serves a model: N `tgictl shard` processes and a `tgictl router`.

Flags → LaunchConfig (the router options in a RouterConfig, validated before anything starts) →
runtime/launcher.launch. Shard options and every router option pass through unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tgictl.units import parse_size
from tgictl.config import DEFAULT_MODEL_ID, SHARD_DTYPES, LaunchConfig, LogConfig, RouterConfig
from tgictl.env import inherited_environ, read_env


def launch(
    ctx: typer.Context,
    model_id: str = typer.Option(DEFAULT_MODEL_ID, "--model-id", help="Hub id or local model directory."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision (branch, tag or commit)."),
    num_shard: int = typer.Option(1, "--num-shard", help="Tensor-parallel shards (GPUs, or processes on CPU)."),
    hostname: str = typer.Option("127.0.0.1", "--hostname", help="Address the HTTP server listens on."),
    port: int = typer.Option(8080, "--port", help="HTTP port."),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", show_default=False,
        help=f"One of {', '.join(SHARD_DTYPES)} (default: float32 on CPU, bfloat16 on CUDA).",
    ),
    block_size: int = typer.Option(16, "--block-size", help="Tokens per KV block."),
    kv_cache_memory: Optional[str] = typer.Option(
        None, "--kv-cache-memory", show_default=False,
        help="KV cache bytes per shard, e.g. 4GiB (CPU: the budget, default min(25% of available RAM, 4 GiB); "
        "CUDA: a cap on what free memory allows).",
    ),
    shard_uds_path: Optional[Path] = typer.Option(
        None, "--shard-uds-path", show_default=False,
        help="Socket base path; shard r listens on BASE-r (default: a fresh private directory in /tmp, "
        "removed on exit). Its directory must be writable by you alone.",
    ),
    master_addr: str = typer.Option("127.0.0.1", "--master-addr", help="torch.distributed rendezvous address."),
    master_port: Optional[int] = typer.Option(
        None, "--master-port", show_default=False, help="torch.distributed rendezvous port (default: a free port)."
    ),
    graceful_termination_timeout: float = typer.Option(
        90.0, "--graceful-termination-timeout", help="Seconds in-flight requests may run after SIGTERM."
    ),
    max_concurrent_requests: int = typer.Option(128, "--max-concurrent-requests", help="Beyond this: 429."),
    max_input_tokens: Optional[int] = typer.Option(
        None, "--max-input-tokens", show_default=False, help="Default: from warmup (max_total_tokens - 1)."
    ),
    max_total_tokens: Optional[int] = typer.Option(
        None, "--max-total-tokens", show_default=False, help="Default: from warmup."
    ),
    max_batch_prefill_tokens: Optional[int] = typer.Option(
        None, "--max-batch-prefill-tokens", show_default=False,
        help="Default: 4096, at most max_position_embeddings and the KV capacity.",
    ),
    max_batch_total_tokens: Optional[int] = typer.Option(
        None, "--max-batch-total-tokens", show_default=False,
        help="Default and maximum: the KV tokens the shards hold after warmup.",
    ),
    max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size", show_default=False),
    waiting_served_ratio: float = typer.Option(0.3, "--waiting-served-ratio", help="Without chunking only."),
    max_waiting_tokens: int = typer.Option(20, "--max-waiting-tokens", help="Without chunking only."),
    max_best_of: int = typer.Option(2, "--max-best-of"),
    max_stop_sequences: int = typer.Option(4, "--max-stop-sequences"),
    max_top_n_tokens: int = typer.Option(5, "--max-top-n-tokens"),
    max_client_batch_size: int = typer.Option(
        4, "--max-client-batch-size", help="Most prompts x n choices in one OpenAI request."
    ),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", show_default=False, help="Require `Authorization: Bearer KEY` on generating routes."
    ),
    cors_allow_origin: Optional[list[str]] = typer.Option(
        None, "--cors-allow-origin", show_default=False, help="Repeatable; default: any origin."
    ),
    payload_limit: int = typer.Option(2_000_000, "--payload-limit", help="Largest request body in bytes."),
    validation_workers: int = typer.Option(2, "--validation-workers", help="Tokenizer threads."),
) -> None:
    """Serve a model: resolve it, start the shards and the router, stop them all on SIGTERM/Ctrl-C."""
    from tgictl.runtime.launcher import launch as run_launch

    router = RouterConfig(
        master_shard_uds_path="",  # the launcher's choice (rank 0's socket)
        tokenizer_name=model_id,  # the launcher passes the resolved directory
        hostname=hostname,
        port=port,
        max_concurrent_requests=max_concurrent_requests,
        max_best_of=max_best_of,
        max_stop_sequences=max_stop_sequences,
        max_top_n_tokens=max_top_n_tokens,
        max_input_tokens=max_input_tokens,
        max_total_tokens=max_total_tokens,
        max_batch_prefill_tokens=max_batch_prefill_tokens,
        max_batch_total_tokens=max_batch_total_tokens,
        max_batch_size=max_batch_size,
        waiting_served_ratio=waiting_served_ratio,
        max_waiting_tokens=max_waiting_tokens,
        max_client_batch_size=max_client_batch_size,
        api_key=api_key,
        cors_allow_origin=tuple(cors_allow_origin or ()),
        payload_limit=payload_limit,
        validation_workers=validation_workers,
        graceful_termination_timeout_s=graceful_termination_timeout,
    )
    config = LaunchConfig(
        router=router,
        model_id=model_id,
        revision=revision,
        num_shard=num_shard,
        dtype=dtype,
        block_size=block_size,
        kv_cache_memory=parse_size(kv_cache_memory) if kv_cache_memory is not None else None,
        shard_uds_path=shard_uds_path.expanduser().absolute() if shard_uds_path is not None else None,
        master_addr=master_addr,
        master_port=master_port,
    )
    log_config = ctx.obj if isinstance(ctx.obj, LogConfig) else LogConfig()
    # The children start from this process's environment (cli.py exported the logging setup into it).
    run_launch(config, log_config, read_env(), inherited_environ())


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)
