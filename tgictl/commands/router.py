"""`tgictl router`: attach to running shards through the master socket and serve TGI's and OpenAI's
HTTP APIs. Flags (TGI's router options, shared with `tgictl launch` through commands/router_options)
→ RouterConfig → runtime/router/runner.run_router."""

from __future__ import annotations

import os
from typing import Optional

import typer

from tgictl.commands.router_options import RouterFlags, with_router_options
from tgictl.config import DEFAULT_MODEL_ID, default_uds_path
from tgictl.env import read_env


@with_router_options
def router(
    master_shard_uds_path: Optional[str] = typer.Option(
        None, "--master-shard-uds-path", show_default=False,
        help="Rank 0's socket (default: /tmp/tgictl-$UID/server-0); the other ranks are discovered.",
    ),
    tokenizer_name: str = typer.Option(
        DEFAULT_MODEL_ID, "--tokenizer-name", help="Hub id or local directory holding the model's tokenizer."
    ),
    *,
    router_flags: RouterFlags,
) -> None:
    """Serve the HTTP API in front of running shards until SIGTERM or SIGINT."""
    from tgictl.runtime.router.http.serve import run_router

    run_router(router_flags.config(
        master_shard_uds_path=master_shard_uds_path or f"{default_uds_path(os.getuid())}-0",
        tokenizer_name=tokenizer_name,
        env=read_env(),
    ))


def register(app: typer.Typer) -> None:
    app.command("router")(router)
