"""Disconnect storm: 64 clients at once, streaming and not, half of them going away at
random points: while queued, before the first token, mid-stream, and while their long prompt is
still being prefilled in chunks (--max-batch-prefill-tokens 32 against ~100-token prompts).

The clients that stay must get exactly the text the same greedy request gets when it runs alone,
and afterwards every KV block must be free or in the prefix cache, with nothing left queued.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.http_stack import Stack
from tests.reliability.support import (
    GREEDY,
    generate,
    is_error_event,
    sse_data,
    wait_idle,
)

CLIENTS = 64
PROMPTS = 8
NEW_TOKENS = 16
SEED = 20260409
LEAVE_MODES = ("queued", "before_first_token", "mid_stream", "chunked_prefill")
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def stack_args() -> tuple[list[str], list[str]]:
    # Prefill 32 tokens a step: a ~100-token prompt takes 3-4 steps, and the last of 64 waits its turn.
    return ["--max-batch-prefill-tokens", "32", "--max-total-tokens", "256", "--max-concurrent-requests", "128"], []


def prompt(index: int) -> str:
    words = ("amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "jasper")
    return " ".join(f"{words[(index + k) % len(words)]}{index}" for k in range(24))  # ~100 tokens


@dataclass(frozen=True)
class Client:
    index: int
    stream: bool
    leave: str | None  # one of LEAVE_MODES, or None for a client that stays

    @property
    def prompt(self) -> str:
        return prompt(self.index % PROMPTS)


@dataclass
class Outcome:
    client: Client
    text: str | None = None  # stayers: the generated text
    error: str | None = None
    tokens_seen: int = 0  # leavers: events received before leaving


def plan() -> list[Client]:
    rng = random.Random(SEED)
    leavers = set(rng.sample(range(CLIENTS), CLIENTS // 2))
    return [
        Client(i, stream=i % 2 == 0, leave=LEAVE_MODES[(i // 2) % len(LEAVE_MODES)] if i in leavers else None)
        for i in range(CLIENTS)
    ]


def body(client: Client) -> dict[str, object]:
    return {"inputs": client.prompt, "parameters": {**GREEDY, "max_new_tokens": NEW_TOKENS}}


async def run_stream(http: httpx.AsyncClient, client: Client, rng: random.Random) -> Outcome:
    outcome = Outcome(client)
    leave_after = {"before_first_token": 0, "mid_stream": rng.randint(1, NEW_TOKENS - 2)}.get(client.leave or "")
    async with http.stream("POST", "/generate_stream", json=body(client)) as response:
        if response.status_code != 200:
            outcome.error = f"status {response.status_code}: {(await response.aread())[:200]!r}"
            return outcome
        if leave_after == 0:
            return outcome  # headers only: gone before the first token
        async for line in response.aiter_lines():
            for event in sse_data([line]):
                if is_error_event(event):
                    outcome.error = str(event)
                    return outcome
                outcome.tokens_seen += 1
                if leave_after is not None and outcome.tokens_seen >= leave_after:
                    return outcome  # closing the response mid-stream drops the connection
                if event.get("generated_text") is not None:
                    outcome.text = str(event["generated_text"])
    return outcome


async def run_plain(http: httpx.AsyncClient, client: Client) -> Outcome:
    outcome = Outcome(client)
    response = await http.post("/generate", json=body(client))
    if response.status_code == 200:
        outcome.text = str(response.json()["generated_text"])
    else:
        outcome.error = f"status {response.status_code}: {response.text[:200]}"
    return outcome


async def run_client(http: httpx.AsyncClient, client: Client, rng: random.Random) -> Outcome:
    task = asyncio.ensure_future(run_stream(http, client, rng) if client.stream else run_plain(http, client))
    # Leaving by cancelling the task closes the connection wherever the request is on the server.
    delay = {"queued": rng.uniform(0.0, 0.02), "chunked_prefill": rng.uniform(0.02, 0.4)}.get(client.leave or "")
    if delay is None and client.leave is not None and not client.stream:
        delay = rng.uniform(0.05, 0.6)  # non-streaming "before first token" / "mid-generation"
    if delay is None:
        return await task
    done, _ = await asyncio.wait({task}, timeout=delay)
    if done:
        return task.result()  # finished (or left on its own) before the delay
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return Outcome(client)


async def storm(url: str, clients: list[Client]) -> list[Outcome]:
    rng = random.Random(SEED + 1)
    limits = httpx.Limits(max_connections=CLIENTS * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S, limits=limits) as http:
        return list(await asyncio.gather(*(run_client(http, c, rng) for c in clients)))


def test_stayers_get_their_alone_output_and_nothing_leaks(stack: Stack) -> None:
    reference = {i: generate(stack.url, prompt(i), NEW_TOKENS) for i in range(PROMPTS)}
    clients = plan()
    outcomes = asyncio.run(asyncio.wait_for(storm(stack.url, clients), timeout=120))

    stayers = [o for o in outcomes if o.client.leave is None]
    wrong = [(o.client, o.text, o.error, reference[o.client.index % PROMPTS]) for o in stayers
             if o.text != reference[o.client.index % PROMPTS]]
    assert not wrong, f"{len(wrong)} of {len(stayers)} staying clients got a wrong answer: {wrong[:4]}\n{stack.logs()}"
    leavers = [o for o in outcomes if o.client.leave is not None]
    errors = [o for o in leavers if o.error is not None]
    assert not errors, f"leaving clients saw errors before leaving: {errors[:4]}"

    state = wait_idle(stack.url)
    assert state.free + state.cached == state.total and state.queue == 0
    assert httpx.get(f"{stack.url}/health", timeout=10).status_code == 200
    modes = Counter(f"{'stream' if o.client.stream else 'plain'}:{o.client.leave}" for o in leavers)
    mid = sum(1 for o in leavers if o.client.stream and o.tokens_seen > 0)
    metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
    dropped = re.search(r'^tgi_request_failure_total\{err="dropped"\} (\S+)$', metrics, re.M)
    print(f"\nstorm: {len(outcomes)} requests; {len(stayers)} stayed, all correct; {len(leavers)} left "
          f"({dict(sorted(modes.items()))}; {mid} streaming ones after >= 1 token; the router counted "
          f"{dropped.group(1) if dropped else '?'} dropped); "
          f"blocks leaked: {state.total - state.free - state.cached}")
    assert len(stayers) == CLIENTS // 2


def test_the_server_still_serves_after_the_storm(stack: Stack) -> None:
    assert generate(stack.url, prompt(0), NEW_TOKENS) == generate(stack.url, prompt(0), NEW_TOKENS)
    state = wait_idle(stack.url)
    assert state.free + state.cached == state.total
