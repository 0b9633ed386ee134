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
    with pytest.raises(ConfigError, match="log level must be one of debug, info, warning, error, critical, got 'loud'"):
        LogConfig(level="loud")
