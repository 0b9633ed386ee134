"""tgictl.progress: a long step says what it does while it runs, on a terminal or in a log."""

from __future__ import annotations

import io
import logging
import time

import pytest

from tgictl.progress import phase


def test_plain_output_gets_a_start_periodic_and_end_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tgictl")
    with phase("converting a model", logger=logging.getLogger("tgictl.t"), every_s=0.05, stream=io.StringIO()):
        time.sleep(0.23)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "converting a model ..."
    assert 2 <= sum("still running after" in m for m in messages) <= 5
    assert messages[-1].startswith("converting a model: done in 0.2")


def test_a_failure_is_not_reported_as_done(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tgictl")
    with pytest.raises(RuntimeError):
        with phase("loading", logger=logging.getLogger("tgictl.t"), every_s=10, stream=io.StringIO()):
            raise RuntimeError("boom")
    assert [r.getMessage() for r in caplog.records] == ["loading ..."]


def test_a_terminal_gets_a_spinner(caplog: pytest.LogCaptureFixture) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    caplog.set_level(logging.INFO, logger="tgictl")
    screen = Terminal()
    with phase("warming up", logger=logging.getLogger("tgictl.t"), stream=screen):
        time.sleep(0.3)
    assert "warming up" in screen.getvalue()  # the live status line
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["warming up"]  # only the end line
