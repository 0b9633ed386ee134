"""Feedback during long opaque steps (a conversion, loading weights, the warmup): what is happening
and for how long, never silence. On a terminal a rich spinner with the elapsed time; otherwise (a
file, a pipe, a launcher reading a child's stderr) one plain log line when the step starts, one every
`every_s` seconds while it runs, and one when it ends with its duration.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

log = logging.getLogger("tgictl.progress")

PERIOD_S = 5.0


def _interactive(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def phase(description: str, *, logger: logging.Logger | None = None, every_s: float = PERIOD_S,
          stream: TextIO | None = None) -> Iterator[None]:
    """Report `description` while the block runs (it should read as "converting X", "loading Y")."""
    out = logger or log
    stream = stream if stream is not None else sys.stderr
    start = time.monotonic()
    if _interactive(stream) and out.isEnabledFor(logging.INFO):
        from rich.console import Console

        with Console(file=stream).status(f"{description} ..."):
            yield
        out.info("%s: done in %.1f s", description, time.monotonic() - start)
        return
    out.info("%s ...", description)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            out.info("%s: still running after %.0f s", description, time.monotonic() - start)

    ticker = threading.Thread(target=tick, name="tgictl-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
    out.info("%s: done in %.1f s", description, time.monotonic() - start)
