"""`tgictl router`: attach to running shards through the master socket and serve TGI's and OpenAI's
HTTP APIs. Flags (TGI's router options) → RouterConfig → runtime/router/runner.run_router."""

from __future__ import annotations

import os
from typing import Optional

import typer

from tgictl.config import DEFAULT_MODEL_ID, RouterConfig, default_uds_path


def router(
    master_shard_uds_path: Optional[str] = typer.Option(
        None, "--master-shard-uds-path", show_default=False,
        help="Rank 0's socket (default: /tmp/tgictl-$UID/server-0); the other ranks are discovered.",
    ),
    tokenizer_name: str = typer.Option(
        DEFAULT_MODEL_ID, "--tokenizer-name", help="Hub id or local directory holding the model's tokenizer."
    ),
    hostname: str = typer.Option("127.0.0.1", "--hostname", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", help="HTTP port."),
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
    graceful_termination_timeout: float = typer.Option(
        90.0, "--graceful-termination-timeout", help="Seconds in-flight requests may run after SIGTERM."
    ),
) -> None:
    """Serve the HTTP API in front of running shards until SIGTERM or SIGINT."""
    from tgictl.runtime.router.runner import run_router

    config = RouterConfig(
        master_shard_uds_path=master_shard_uds_path or f"{default_uds_path(os.getuid())}-0",
        tokenizer_name=tokenizer_name,
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
    run_router(config)


def register(app: typer.Typer) -> None:
    app.command("router")(router)
