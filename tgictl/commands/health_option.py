"""The `--health-step-timeout` flag that `shard` and `launch` share (docs/architecture.md, "Health")."""

from __future__ import annotations

import typer

from tgictl.config import DEFAULT_HEALTH_STEP_TIMEOUT_S

HEALTH_STEP_TIMEOUT_OPTION: float = typer.Option(
    DEFAULT_HEALTH_STEP_TIMEOUT_S, "--health-step-timeout",
    help="Seconds one step may run before /health reports the shard unhealthy (a hung device or collective). "
    "/health never waits for a step; raise this for models whose largest prefill takes longer.",
)
