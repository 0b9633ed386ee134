"""The error hierarchy. Each error knows how it crosses every boundary: HTTP status and TGI
`error_type`, gRPC status name, and CLI exit code. Boundaries map errors in exactly one place each
(cli.py for exit codes, the router server for HTTP, the shard servicer for gRPC)."""

from __future__ import annotations

# Every boundary bounds the messages it sends (HTTP bodies, gRPC statuses, stream events): an error may
# quote a client's input (a grammar, a prompt) and must stay a readable line whatever that input's size
# (gRPC also refuses status details over its 16 KB metadata limit).
MAX_MESSAGE_CHARS = 1000


def bounded(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`message` cut to at most `limit` characters, saying how much was cut."""
    if len(message) <= limit:
        return message
    suffix = f"... ({len(message) - limit + 40} more characters)"
    return message[: limit - len(suffix)] + suffix


class TgictlError(Exception):
    """Base of every error tgictl raises on purpose. The message is one readable line."""

    http_status: int = 500
    error_type: str = "internal"
    grpc_status: str = "INTERNAL"  # name of a grpc.StatusCode member; kept as text so no grpc import
    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(TgictlError):
    """Bad command-line arguments or configuration values."""

    http_status = 400
    error_type = "usage"
    grpc_status = "INVALID_ARGUMENT"
    exit_code = 2


class ConfigError(UsageError):
    """A configuration value is out of range or inconsistent with another one."""


class ModelNotFoundError(TgictlError):
    """A model id that resolves nowhere (not a local dir, not in the cache, hub unreachable)."""

    error_type = "model_not_found"
    exit_code = 2


class ConversionError(TgictlError):
    """A checkpoint that cannot be converted: missing, not a checkpoint, unsupported architecture."""

    error_type = "conversion"
    exit_code = 2


class UnsupportedModelError(TgictlError):
    """A model_type or feature the shard runtime does not implement."""

    error_type = "unsupported_model"
    exit_code = 2


class ValidationError(TgictlError):
    """A request that breaks a limit. Messages name the field and the limit (TGI's wording)."""

    http_status = 422
    error_type = "validation"
    grpc_status = "INVALID_ARGUMENT"
    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(f"Input validation error: {message}")
        self.detail = message


class InvalidRequestError(TgictlError):
    """A malformed shard request (unknown field values, out-of-range blocks, slots or token ids)."""

    http_status = 422
    error_type = "validation"
    grpc_status = "INVALID_ARGUMENT"


class BatchNotFoundError(TgictlError):
    """A batch id the shard does not hold."""

    grpc_status = "NOT_FOUND"
    error_type = "generation"
    http_status = 424


class OverloadedError(TgictlError):
    http_status = 429
    error_type = "overloaded"

    def __init__(self, message: str = "Model is overloaded") -> None:
        super().__init__(message)


class GenerationError(TgictlError):
    """A shard failed while computing a batch; the affected requests fail, the server goes on."""

    http_status = 424
    error_type = "generation"


class ShardConnectionError(GenerationError):
    """The router cannot reach a shard (socket gone, transport failure). 503, not TGI's 424: the request
    was not at fault and this replica cannot serve, so a gateway in front retries it on another replica
    (docs/replicas.md, "Failover")."""

    http_status = 503
    error_type = "unavailable"


class DeviceError(TgictlError):
    """An unrecoverable device failure (out of memory, a collective that failed). The shard exits."""

    grpc_status = "INTERNAL"
    error_type = "device"


class TemplateError(TgictlError):
    http_status = 422
    error_type = "template_error"

    def __init__(self, message: str) -> None:
        super().__init__(f"Template error: {message}")


class ToolError(TgictlError):
    """A bad `tools` / `tool_choice` request (TGI's words and type)."""

    http_status = 422
    error_type = "tool_error"

    def __init__(self, message: str) -> None:
        super().__init__(f"Tool error: {message}")


class PayloadTooLargeError(TgictlError):
    http_status = 413
    error_type = "payload_too_large"


class AllocatorError(TgictlError):
    """Router code misused a KV block allocator (double free, a foreign allocation, a prompt longer
    than the token budget). A bug in the caller, never a client's fault, hence a 500."""

    error_type = "allocator"


class AllocatorIntegrityError(AllocatorError):
    """An allocator's bookkeeping is inconsistent (`check_integrity` or an internal guard)."""


class ChildFailedError(TgictlError):
    """A shard or the router exited on its own under `tgictl launch`; the message names it and its
    last log line."""

    error_type = "child_failed"
    exit_code = 1


class UnhealthyError(TgictlError):
    """A health check that fails. Over gRPC UNAVAILABLE: reporting it never stops the shard."""

    http_status = 503
    error_type = "healthcheck"
    grpc_status = "UNAVAILABLE"
