"""Shutdown under load: SIGTERM to `tgictl launch` while requests are running. Requests
that can finish within --graceful-termination-timeout finish with their whole output; the ones that
cannot get an error (an in-band event when streaming) when the grace period ends; new requests get
503 meanwhile; the launcher exits 0 and leaves nothing behind."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx

from tests.integration.launch_procs import start_launch
from tests.reliability.support import (
    GREEDY,
    assert_error_json,
    is_error_event,
    sse_data,
)

GRACE_S = 2.0
SHORT, LONG = 24, 1000  # tokens: well within the grace period / far beyond it on two CPU cores
LONGEST = 2000  # tokens: 32 prompt tokens at most plus these stay within the tiny model's 2,048 positions


async def client(url: str, index: int, started: asyncio.Event, tokens: int | None = None) -> tuple[str, int, str]:
    """(kind, tokens asked, how it ended)."""
    stream, tokens = index % 2 == 0, tokens or (SHORT if index < 4 else LONG)
    body = {"inputs": f"shutdown client {index}", "parameters": {**GREEDY, "max_new_tokens": tokens, "details": True}}
    kind = "stream" if stream else "plain"
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as http:
        if not stream:
            started.set()
            response = await http.post("/generate", json=body)
            if response.status_code == 200:
                generated = response.json()["details"]["generated_tokens"]
                return kind, tokens, f"finished {generated}"
            error = assert_error_json(response.status_code, response.content)
            return kind, tokens, f"status {response.status_code} {error['error_type']}"
        async with http.stream("POST", "/generate_stream", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                for event in sse_data([line]):
                    if is_error_event(event):
                        return kind, tokens, f"error event {event['error_type']}"
                    started.set()
                    if event.get("details") is not None:
                        return kind, tokens, f"finished {event['details']['generated_tokens']}"
        return kind, tokens, "stream ended without a final event"


def test_sigterm_drains_then_ends_the_rest_and_exits_0(tiny_model_dir: Path, tmp_path: Path) -> None:
    launched = start_launch(tiny_model_dir, tmp_path, extra_args=("--graceful-termination-timeout", str(GRACE_S)))
    try:
        with httpx.Client() as probe:
            launched.wait_healthy(probe)

        async def scenario() -> tuple[list[tuple[str, int, str]], list[int], float]:
            started = [asyncio.Event() for _ in range(8)]
            tasks = [asyncio.ensure_future(client(launched.url, i, started[i])) for i in range(8)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=60)
            await asyncio.sleep(0.2)
            launched.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(0.3)
            refused = []
            async with httpx.AsyncClient(base_url=launched.url, timeout=10.0) as http:
                for path in ("/generate", "/generate_stream", "/v1/completions"):
                    body = {"inputs": "late", "prompt": "late", "parameters": {"max_new_tokens": 2}, "max_tokens": 2}
                    answer = await http.post(path, json=body)
                    assert assert_error_json(answer.status_code, answer.content)["error_type"] == "shutting_down"
                    refused.append(answer.status_code)
                refused.append((await http.get("/health")).status_code)
            outcomes = list(await asyncio.wait_for(asyncio.gather(*tasks), timeout=60))
            return outcomes, refused, time.monotonic() - signalled

        outcomes, refused, took = asyncio.run(scenario())
        assert refused == [503, 503, 503, 503], refused
        for kind, tokens, how in outcomes:
            ended_early = "error event shutting_down" if kind == "stream" else "status 503 shutting_down"
            allowed = {f"finished {tokens}", ended_early}
            assert how in allowed, (kind, tokens, how, outcomes)
        assert all(how == f"finished {tokens}" for _, tokens, how in outcomes if tokens == SHORT), outcomes
        assert took < GRACE_S + 5.0, f"the last request ended {took:.1f} s after SIGTERM"
        assert launched.wait_exit(timeout_s=60) == 0, launched.log()
        launched.assert_nothing_left()
        ended = sorted(how for _, _, how in outcomes)
        print(f"\nshutdown: 8 in-flight + 4 late requests; in flight: {ended}; late: {refused}; "
              f"all ended {took:.2f} s after SIGTERM (grace {GRACE_S} s); launcher exit 0")
    finally:
        launched.stop()


def test_a_second_signal_ends_streams_with_an_error_event_at_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    limits = ("--max-input-tokens", "32", "--max-total-tokens", str(32 + LONGEST))  # room for the long stream
    launched = start_launch(tiny_model_dir, tmp_path, extra_args=("--graceful-termination-timeout", "60", *limits))
    try:
        with httpx.Client() as probe:
            launched.wait_healthy(probe)

        async def scenario() -> tuple[str, float]:
            started = asyncio.Event()
            # a stream far beyond any grace: alone on two fast cores the tiny model once decoded LONG tokens
            # within the second between the signals, so this one asks for the most its positions allow
            task = asyncio.ensure_future(client(launched.url, 6, started, tokens=LONGEST))
            await asyncio.wait_for(started.wait(), timeout=60)
            launched.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            launched.proc.send_signal(signal.SIGTERM)
            second = time.monotonic()
            kind, tokens, how = await asyncio.wait_for(task, timeout=30)
            return how, time.monotonic() - second

        how, took = asyncio.run(scenario())
        assert how == "error event shutting_down"  # never a stream cut without a word
        assert took < 3.0, f"the stream ended {took:.1f} s after the second signal"
        assert launched.wait_exit(timeout_s=30) == 0, launched.log()
        log = launched.log()
        assert "another signal: router" in log and "did not stop" not in log, log
        launched.assert_nothing_left()
    finally:
        launched.stop()
