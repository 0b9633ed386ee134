"""Operating the router for real: API key, 429 under concurrency, /metrics, disconnects freeing KV
blocks (streaming and not), CORS, and the graceful shutdown on SIGTERM (the module's last test)."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.http_stack import Stack, http_stack

KEY = "s3cret-key"
SERVED = "tgictl-test/served"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"inputs": "the quick brown fox jumps over the lazy dog",
        "parameters": {"max_new_tokens": 2000, "ignore_eos": True}}  # seconds of decoding


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    args = ["--max-concurrent-requests", "2", "--api-key", KEY, "--cors-allow-origin", "https://example.org",
            "--max-total-tokens", "2048", "--graceful-termination-timeout", "0.5", "--served-model-name", SERVED]
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("http-ops"), router_args=args) as running:
        yield running


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=60.0, headers=AUTH) as c:
        yield c


def metric(http: httpx.Client, name: str, labels: str = "") -> float:
    text = http.get("/metrics").text
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name}{labels} not exported"
    return float(match.group(1))


def kv(http: httpx.Client) -> dict[str, float]:
    return {k: metric(http, f"tgictl_kv_blocks_{k}") for k in ("total", "free", "cached")}


def wait_until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_api_key(stack: Stack, http: httpx.Client) -> None:
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 1}}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = httpx.post(f"{stack.url}/generate", json=body, headers=headers)
        assert response.status_code == 401
        assert response.json()["error_type"] == "unauthorized"
    for path in ("/info", "/v1/models"):
        assert httpx.get(f"{stack.url}{path}").status_code == 401
    assert http.post("/generate", json=body).status_code == 200
    for path in ("/health", "/metrics"):  # reveal nothing about the model: open
        assert httpx.get(f"{stack.url}{path}").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{stack.url}/v1", api_key="wrong", max_retries=0).chat.completions.create(
            model="tgi", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    ok = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0).completions.create(
        model="tgi", prompt="hi", max_tokens=1
    )
    assert ok.usage.completion_tokens == 1


def test_served_model_name_replaces_the_tokenizer_path_everywhere(
    stack: Stack, http: httpx.Client, tiny_model_dir: Path
) -> None:
    assert http.get("/info").json()["model_id"] == SERVED
    # `root` stays what the model was loaded from (vLLM's meaning), `owned_by` the server (worker_contract.py).
    assert http.get("/v1/models").json()["data"] == [{
        "id": SERVED, "object": "model", "created": 0, "owned_by": "tgictl", "root": str(tiny_model_dir),
        "parent": None, "max_model_len": 2048,
    }]
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model="tgi", prompt="hi", max_tokens=1).model == SERVED
    chat = client.chat.completions.create(model="tgi", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert chat.model == SERVED


def test_cors(http: httpx.Client) -> None:
    preflight = http.options("/generate", headers={
        "Origin": "https://example.org", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    })
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://example.org"
    other = http.options("/generate", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers


def test_overloaded_and_stream_disconnect_frees_blocks(stack: Stack, http: httpx.Client) -> None:
    before = kv(http)
    assert before["free"] + before["cached"] == before["total"]
    failures = metric(http, "tgi_request_failure_total", '{err="overloaded"}')
    dropped = metric(http, "tgi_request_failure_total", '{err="dropped"}')
    with httpx.Client(base_url=stack.url, timeout=60.0, headers=AUTH) as a, \
            httpx.Client(base_url=stack.url, timeout=60.0, headers=AUTH) as b:
        with a.stream("POST", "/generate_stream", json=LONG) as first, \
                b.stream("POST", "/generate_stream", json=LONG) as second:
            # Keep the line iterators alive: a discarded one closes its response (a disconnect).
            first_lines, second_lines = first.iter_lines(), second.iter_lines()
            assert next(first_lines).startswith('data: {"index":1')
            assert next(second_lines).startswith('data: {"index":1')
            during = kv(http)
            assert during["free"] + during["cached"] < before["total"]
            third = http.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 1}})
            assert third.status_code == 429
            assert third.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
            chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
            assert chat.status_code == 429
    # Both clients left mid-stream: their requests are cancelled and every block comes back.
    wait_until(lambda: (lambda s: s["free"] + s["cached"] == s["total"])(kv(http)))
    assert metric(http, "tgi_request_failure_total", '{err="overloaded"}') == failures + 2
    # Cancelled, not finished: both requests were dropped before their last token.
    assert metric(http, "tgi_request_failure_total", '{err="dropped"}') == dropped + 2
    assert http.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 1}}).status_code == 200


def test_non_stream_disconnect_frees_blocks(stack: Stack, http: httpx.Client) -> None:
    dropped = metric(http, "tgi_request_failure_total", '{err="dropped"}')
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{stack.url}/generate", json=LONG, headers=AUTH, timeout=0.5)
    wait_until(lambda: metric(http, "tgi_request_failure_total", '{err="dropped"}') == dropped + 1)
    wait_until(lambda: (lambda s: s["free"] + s["cached"] == s["total"])(kv(http)))


def test_metrics(http: httpx.Client) -> None:
    requests = metric(http, "tgi_request_count_total")
    success = metric(http, "tgi_request_success_total")
    prompt = metric(http, "tgictl_prompt_tokens_total")
    body = {"inputs": "count these tokens", "parameters": {"max_new_tokens": 3, "ignore_eos": True}}
    assert http.post("/generate", json=body).status_code == 200
    n_prompt = len(http.post("/tokenize", json=body).json())
    assert metric(http, "tgi_request_count_total") == requests + 1
    assert metric(http, "tgi_request_success_total") == success + 1
    assert metric(http, "tgictl_prompt_tokens_total") == prompt + n_prompt
    # The same prompt again: its full blocks come from the prefix cache (at least one prompt token is
    # always computed, for the logits).
    assert http.get("/info").json()["prefix_caching"] is True
    long_body = {"inputs": "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 2,
                 "parameters": {"max_new_tokens": 2}}
    n_long = len(http.post("/tokenize", json=long_body).json())
    assert n_long > 32
    assert http.post("/generate", json=long_body).status_code == 200
    hits = metric(http, "tgictl_prefix_cache_hit_tokens_total")
    assert http.post("/generate", json=long_body).status_code == 200
    assert metric(http, "tgictl_prefix_cache_hit_tokens_total") == hits + min(n_long // 16 * 16, n_long - 1)
    text = http.get("/metrics").text
    for name in ("tgi_queue_size", "tgi_batch_current_size", "tgi_batch_max_total_tokens",
                 "tgi_request_duration_bucket", "tgi_request_input_length_bucket",
                 'tgi_batch_inference_count_total{method="decode"}', "tgi_request_mean_time_per_token_duration_count"):
        assert name in text, name
    # The KV tokens of every block, reserved block 0 included (block size 16).
    assert metric(http, "tgi_batch_max_total_tokens") == (kv(http)["total"] + 1) * 16


def test_long_generation_continues_seamlessly(http: httpx.Client) -> None:
    """Past the 1024-token round cap the request is rescheduled with its tokens appended; the client
    sees one answer whose totals cover both rounds."""
    body = {"inputs": "once upon a time", "parameters": {"max_new_tokens": 1030, "ignore_eos": True, "details": True}}
    # 1030 decode steps: generous time, since a CPU shared with other work slows every step
    response = http.post("/generate", json=body, timeout=600)
    details = response.json()["details"]
    assert details["generated_tokens"] == 1030 and len(details["tokens"]) == 1030
    assert details["finish_reason"] == "length"
    assert response.headers["x-generated-tokens"] == "1030"
    assert response.headers["x-prompt-tokens"] == str(len(http.post("/tokenize", json=body).json()))


def test_graceful_shutdown(stack: Stack, http: httpx.Client) -> None:
    """SIGTERM: new requests get 503 while in-flight ones may finish; past the 2 s graceful timeout the
    remaining stream ends with an in-band error; then the router exits 0."""
    assert http.get("/health").status_code == 200
    with httpx.Client(base_url=stack.url, timeout=60.0, headers=AUTH) as a:
        with a.stream("POST", "/generate_stream", json=LONG) as running:
            lines = running.iter_lines()
            assert next(lines).startswith('data: {"index":1')
            stack.router.send_signal(signal.SIGTERM)
            wait_until(lambda: http.get("/health").status_code == 503)
            refused = http.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 1}})
            assert refused.status_code == 503
            assert refused.json()["error_type"] == "shutting_down"
            last = [line for line in lines if line.startswith("data: ")][-1]
    assert json.loads(last[len("data: "):])["error_type"] == "shutting_down"
    assert stack.router.wait(timeout=20) == 0
