"""tgictl.log: one logging setup, rich for people and JSON lines for machines."""

from __future__ import annotations

import io
import json
import logging

import pytest

from tgictl.config import LogConfig
from tgictl.errors import ConfigError
from tgictl.log import ROOT_LOGGER, child_environ, configure_logging, get_logger


@pytest.fixture(autouse=True)
def _restore_tgictl_logger():
    """configure_logging changes the process-wide `tgictl` logger; put it back for other tests."""
    logger = logging.getLogger(ROOT_LOGGER)
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_json_lines_carry_message_level_and_extra_fields() -> None:
    stream = io.StringIO()
    configure_logging(LogConfig(level="info", json_output=True), stream=stream)
    log = get_logger("tgictl.test")
    log.debug("hidden at info")
    log.info("hello %s", "world", extra={"request_id": 7})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["message"] == "hello world"
    assert record["level"] == "info"
    assert record["logger"] == "tgictl.test"
    assert record["request_id"] == 7


def test_reconfiguring_does_not_duplicate_lines() -> None:
    stream = io.StringIO()
    configure_logging(LogConfig(level="debug", json_output=True), stream=stream)
    configure_logging(LogConfig(level="debug", json_output=True), stream=stream)
    get_logger("x").debug("once")
    assert len(stream.getvalue().splitlines()) == 1


def test_rich_output_for_people() -> None:
    stream = io.StringIO()
    configure_logging(LogConfig(level="warning"), stream=stream)
    get_logger("x").info("quiet")
    get_logger("x").warning("loud and clear")
    text = stream.getvalue()
    assert "loud and clear" in text
    assert "quiet" not in text
    assert "WARNING" in text


def test_child_environ_round_trips_through_env() -> None:
    from tgictl.env import Env

    env = Env.from_environ({"HOME": "/h", **child_environ(LogConfig(level="debug", json_output=True))})
    assert (env.log_level, env.json_output) == ("debug", True)


def test_bad_level_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--log-level must be one of debug, info, warning, error, critical, got 'loud'"):
        LogConfig(level="loud")


def test_plain_unpadded_lines_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    stream = io.StringIO()  # not a tty, as a file or a pipe
    configure_logging(LogConfig(level="info"), stream=stream)
    long = "word " * 60
    get_logger("x").info("short")
    get_logger("x").info(long.strip())
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # the long message is not wrapped
    assert lines[0].endswith(" INFO short")  # nothing padded after it
    assert lines[1].endswith(long.strip()) and len(lines[1]) < len(long) + 30
    import os

    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and os.environ["TQDM_DISABLE"] == "1"


def test_rich_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    configure_logging(LogConfig(level="info"), stream=stream)
    get_logger("x").info("hello")
    assert isinstance(logging.getLogger(ROOT_LOGGER).handlers[0], __import__("rich.logging").logging.RichHandler)
    assert "hello" in stream.getvalue()
