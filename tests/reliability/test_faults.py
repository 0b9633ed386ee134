"""Faults.

A shard that fails some batches (TGICTL_FAULT_INJECT, the test-only setting read by tgictl.env): only
the requests of a failing step fail (an in-band error event when streaming, 424 otherwise), the server
goes on serving, and /health answers 503 until a real forward succeeds again.

A shard killed with SIGKILL mid-batch under `tgictl launch`: every in-flight client gets an error
within seconds, the launcher exits non-zero, and no process or socket is left behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.http_stack import Stack
from tests.integration.launch_procs import pid_alive, start_launch
from tests.reliability.support import (
    GREEDY,
    assert_error_json,
    is_error_event,
    sse_data,
    wait_idle,
)
from tgictl.env import Env, FaultInjection
from tgictl.errors import ConfigError
from tgictl.runtime.shard.faults import InjectedFaultError, StepFaults

# Steps (Prefill and Decode counted together): 5 = R2's first Decode, 6 = the first /health probe
# after it, 11 = R4's Prefill. See test_a_failing_batch_fails_only_its_requests for the sequence.
FAULTS = "fail_batch:5-6,11"
PROMPT = "the shard keeps serving"


@pytest.fixture(scope="module")
def stack_env() -> dict[str, str]:
    return {"TGICTL_FAULT_INJECT": FAULTS}


def test_fault_setting_parses_and_is_inert_when_unset() -> None:
    assert Env.from_environ({"HOME": "/h"}).fault_injection is None
    plan = Env.from_environ({"HOME": "/h", "TGICTL_FAULT_INJECT": FAULTS}).fault_injection
    assert plan == FaultInjection(((5, 6), (11, 11)))
    assert [step for step in range(1, 14) if plan.fails(step)] == [5, 6, 11]
    for bad in ("fail_batch", "fail_batch:0", "fail_batch:3-2", "crash:1", "fail_batch:1,x"):
        with pytest.raises(ConfigError, match="TGICTL_FAULT_INJECT"):
            Env.from_environ({"HOME": "/h", "TGICTL_FAULT_INJECT": bad})
    inert = StepFaults(None)
    for _ in range(1000):
        inert.before_step("Decode")
    faults = StepFaults(FaultInjection(((2, 2),)))
    faults.before_step("Prefill")
    with pytest.raises(InjectedFaultError, match="Decode step 2"):
        faults.before_step("Decode")
    faults.before_step("Decode")
    assert InjectedFaultError.grpc_status != "INTERNAL"  # recoverable: the shard must not stop


def generate(url: str, stream: bool) -> httpx.Response:
    body = {"inputs": PROMPT, "parameters": {**GREEDY, "max_new_tokens": 3}}
    return httpx.post(f"{url}/generate_stream" if stream else f"{url}/generate", json=body, timeout=30)


def test_a_failing_batch_fails_only_its_requests(stack: Stack) -> None:
    url = stack.url

    def health() -> int:
        return httpx.get(f"{url}/health", timeout=30).status_code

    r1 = generate(url, stream=False)  # steps 1-3
    assert r1.status_code == 200, r1.text
    expected = r1.json()["generated_text"]

    r2 = generate(url, stream=True)  # step 4 gives a token, step 5 fails
    events = sse_data(r2.text.splitlines())
    assert r2.status_code == 200 and len(events) == 2, r2.text
    assert "token" in events[0] and is_error_event(events[1]) and events[1]["error_type"] == "generation", events
    assert "injected fault" in events[1]["error"]

    assert health() == 503  # step 6: the probe forward fails
    assert health() == 200  # step 7: a real forward succeeds again
    assert health() == 200  # the cheap check from now on (no step)

    r3 = generate(url, stream=False)  # steps 8-10
    assert r3.status_code == 200 and r3.json()["generated_text"] == expected

    r4 = generate(url, stream=False)  # step 11 (its Prefill) fails
    assert r4.status_code == 424, r4.text
    assert assert_error_json(424, r4.content)["error_type"] == "generation"
    assert health() == 200  # step 12: the probe forward works at once

    r5 = generate(url, stream=True)  # steps 13-15
    final = sse_data(r5.text.splitlines())[-1]
    assert final["generated_text"] == expected, r5.text
    assert stack.shard.poll() is None and stack.router.poll() is None
    state = wait_idle(url)
    assert state.free + state.cached == state.total
    print(f"\nfault injection: 5 requests, 2 failed as planned (1 in-band error event, 1 x 424), "
          f"3 correct; 5 /health calls (one 503); blocks leaked: {state.total - state.free - state.cached}")


async def _client(url: str, stream: bool, index: int, started: asyncio.Event) -> tuple[str, float]:
    """Run one long request; returns (how it ended, monotonic time it ended)."""
    body = {"inputs": f"long request {index}", "parameters": {**GREEDY, "max_new_tokens": 900}}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60.0, connect=5.0)) as http:
            if not stream:
                started.set()
                response = await http.post("/generate", json=body)
                if response.status_code == 200:
                    return "finished", time.monotonic()
                assert_error_json(response.status_code, response.content)
                return f"status {response.status_code}", time.monotonic()
            async with http.stream("POST", "/generate_stream", json=body) as response:
                async for line in response.aiter_lines():
                    for event in sse_data([line]):
                        if is_error_event(event):
                            return f"error event {event['error_type']}", time.monotonic()
                        started.set()
                        if event.get("generated_text") is not None:
                            return "finished", time.monotonic()
                return "stream ended without a final event", time.monotonic()
    except httpx.TransportError as err:
        return f"connection closed ({type(err).__name__})", time.monotonic()


def test_a_shard_killed_mid_batch(tiny_model_dir: Path, tmp_path: Path) -> None:
    launched = start_launch(tiny_model_dir, tmp_path)
    try:
        with httpx.Client() as probe:
            launched.wait_healthy(probe)
        shard_pid = launched.child_pids()["shard 0"]

        async def scenario() -> tuple[list[tuple[str, float]], float]:
            started = [asyncio.Event() for _ in range(6)]
            tasks = [asyncio.ensure_future(_client(launched.url, i % 2 == 0, i, started[i])) for i in range(6)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=60)
            await asyncio.sleep(0.3)  # tokens are flowing: the shard is mid-batch
            os.kill(shard_pid, signal.SIGKILL)
            killed_at = time.monotonic()
            return list(await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)), killed_at

        outcomes, killed_at = asyncio.run(scenario())
        late = [(how, end - killed_at) for how, end in outcomes if end - killed_at > 10.0]
        assert not late, f"clients still waiting 10 s after the kill: {late}"
        assert not [how for how, _ in outcomes if how == "finished"], outcomes
        code = launched.wait_exit(timeout_s=60)
        assert code != 0, launched.log()
        launched.assert_nothing_left()
        assert not pid_alive(shard_pid)
        print(f"\nshard SIGKILL: 6 in-flight requests, all ended with an error within "
              f"{max(end - killed_at for _, end in outcomes):.2f} s ({sorted({how for how, _ in outcomes})}); "
              f"launcher exit code {code}; no process or socket left")
    finally:
        launched.stop()
