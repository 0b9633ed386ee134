"""The one logging setup every tgictl process uses: rich text on a terminal, plain unpadded lines in
files and pipes, JSON lines for machines.

Logs go to stderr; stdout is reserved for a command's result (a path, a JSON object) so it can be
piped. Child processes (shards, router) get the same setup through TGICTL_LOG_LEVEL and
TGICTL_JSON_OUTPUT, see `child_environ`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, TextIO

from tgictl.config import LogConfig
from tgictl.env import JSON_OUTPUT_VAR, LOG_LEVEL_VAR, disable_library_progress_bars

ROOT_LOGGER = "tgictl"

# LogRecord attributes that are not user `extra=` fields.
RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys()) | {"message", "asctime"}


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, logger, message, pid, plus any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in record.__dict__.items():
            if key not in RECORD_FIELDS and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


# Not a terminal (a file, a pipe, a launcher reading a child): plain lines, never padded or wrapped.
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(message)s"
PLAIN_DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"


def _interactive(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _handler(config: LogConfig, stream: TextIO) -> logging.Handler:
    if config.json_output or not _interactive(stream):
        handler: logging.Handler = logging.StreamHandler(stream)
        if config.json_output:
            handler.setFormatter(JsonLinesFormatter())
        else:
            handler.setFormatter(logging.Formatter(PLAIN_FORMAT, PLAIN_DATE_FORMAT))
        return handler
    from rich.console import Console
    from rich.logging import RichHandler

    return RichHandler(
        console=Console(file=stream, stderr=stream is sys.stderr),
        show_path=False,
        rich_tracebacks=False,
        markup=False,
        log_time_format="[%X]",
    )


def configure_logging(config: LogConfig, stream: TextIO | None = None) -> logging.Logger:
    """(Re)configure the `tgictl` logger tree; idempotent, so calling it twice never doubles lines."""
    logger = logging.getLogger(ROOT_LOGGER)
    for old in list(logger.handlers):
        logger.removeHandler(old)
    stream = stream if stream is not None else sys.stderr
    logger.addHandler(_handler(config, stream))
    if not _interactive(stream):
        # Libraries' tqdm bars redraw one line with carriage returns: in a file that is one line of
        # thousands of characters. Off for this process and the ones it starts.
        disable_library_progress_bars()
    logger.setLevel(config.level.upper())
    # Records still propagate: tgictl never configures the root logger, so nothing repeats them, and
    # a host application (or pytest's caplog) that listens on the root still sees them.
    return logger


def child_environ(config: LogConfig) -> dict[str, str]:
    """The variables a child process needs to log exactly like its parent."""
    return {LOG_LEVEL_VAR: config.level, JSON_OUTPUT_VAR: "1" if config.json_output else "0"}


def export_to_children(config: LogConfig) -> None:
    """Put the logging setup into this process's environment so every child inherits it, whoever spawns it."""
    os.environ.update(child_environ(config))


def print_result(config: LogConfig | None, text: str, data: Mapping[str, Any]) -> None:
    """A command's result on stdout: `text` for people, `data` as one JSON object with --json-output."""
    if config is not None and config.json_output:
        print(json.dumps(dict(data), default=str), flush=True)
    else:
        print(text, flush=True)


def get_logger(name: str) -> logging.Logger:
    """A logger under the `tgictl` tree (pass __name__)."""
    return logging.getLogger(name if name.startswith(ROOT_LOGGER) else f"{ROOT_LOGGER}.{name}")
