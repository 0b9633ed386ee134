"""What every process takes: how it logs and where its traces go."""

from __future__ import annotations

from dataclasses import dataclass

from tgictl.errors import ConfigError

LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class LogConfig:
    """How a process logs. `level` is one of LOG_LEVELS (lower case)."""

    level: str = "info"
    json_output: bool = False

    def __post_init__(self) -> None:
        if self.level.lower() not in LOG_LEVELS:
            raise ConfigError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {self.level!r}")
        object.__setattr__(self, "level", self.level.lower())



@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry export of one process's spans (TGI's --otlp-endpoint, --otlp-service-name)."""

    otlp_endpoint: str | None = None  # an OTLP/gRPC collector, e.g. http://127.0.0.1:4317; None: off
    service_name: str = "tgictl.router"
    export_delay_ms: int = 1000  # how long finished spans wait to be sent in one batch

    def __post_init__(self) -> None:
        if self.otlp_endpoint is not None and not self.otlp_endpoint.strip():
            raise ConfigError("--otlp-endpoint must not be empty")
        if not self.service_name.strip():
            raise ConfigError("--otlp-service-name must not be empty")


SHARD_SERVICE_SUFFIX = ".shard"


def shard_service_name(router_service_name: str) -> str:
    """The shards' service name beside the router's (TGI: ...router and ...server)."""
    return router_service_name.removesuffix(".router") + SHARD_SERVICE_SUFFIX

