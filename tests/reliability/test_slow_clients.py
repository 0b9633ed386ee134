"""Slow and excess clients (slowloris): headers that never finish are cut at --http-header-timeout, bodies that
never finish get a 408 at --http-body-timeout, connections beyond --max-connections get a 503 at once, and the
server answers everyone else meanwhile and afterwards."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from urllib.parse import urlparse

import httpx
import pytest

from tests.integration.http_stack import Stack
from tests.reliability.support import GREEDY, wait_idle

MAX_CONNECTIONS = 24
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
WAIT_S = 30.0  # a bound on every wait below: a server that never acts fails the test instead of hanging it


@pytest.fixture(scope="module")
def stack_args() -> tuple[list[str], list[str]]:
    return ["--max-concurrent-requests", "8", "--max-connections", str(MAX_CONNECTIONS),
            "--http-header-timeout", str(HEADER_TIMEOUT_S), "--http-body-timeout", str(BODY_TIMEOUT_S)], []


def connect(stack: Stack) -> socket.socket:
    url = urlparse(stack.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=WAIT_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by the socket's timeout)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def test_connections_beyond_the_cap_are_refused_and_unfinished_headers_are_cut(
    stack: Stack, sockets: ExitStack
) -> None:
    slow = []
    for _ in range(MAX_CONNECTIONS + 16):
        sock = sockets.enter_context(connect(stack))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line that ends the headers
        slow.append(sock)
    # The first MAX_CONNECTIONS are held (for now); the rest were answered 503 and closed at once.
    refused = [read_until_closed(sock) for sock in slow[MAX_CONNECTIONS:]]
    assert all(answer.startswith(b"HTTP/1.1 503") for answer in refused), refused[:2]
    assert json.loads(refused[0].split(b"\r\n\r\n", 1)[1])["error_type"] == "overloaded"
    # The held ones are cut once their headers are overdue: each sees the connection closed, no answer.
    started = time.monotonic()
    assert all(read_until_closed(sock) == b"" for sock in slow[:MAX_CONNECTIONS])
    assert time.monotonic() - started < WAIT_S
    with httpx.Client(base_url=stack.url, timeout=WAIT_S) as http:
        assert http.get("/health").status_code == 200
        body = {"inputs": "still serving", "parameters": {**GREEDY, "max_new_tokens": 4}}
        assert http.post("/generate", json=body).status_code == 200
    assert stack.router.poll() is None and stack.shard.poll() is None
    wait_idle(stack.url)


def test_a_keep_alive_connection_that_dawdles_over_its_next_headers_is_cut(stack: Stack, sockets: ExitStack) -> None:
    sock = sockets.enter_context(connect(stack))
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    first = sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200"), first
    sock.sendall(b"GET /health HTTP/1.1\r\n")  # the next request's headers, never finished
    assert read_until_closed(sock) == b""


def test_a_body_that_never_finishes_gets_408_in_the_routes_shape(stack: Stack, sockets: ExitStack) -> None:
    for path, shape in (("/generate", "tgi"), ("/v1/completions", "openai")):
        sock = sockets.enter_context(connect(stack))
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                     "content-length: 200\r\n\r\n{\"inputs\": ".encode())
        answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        if shape == "tgi":
            assert error["error_type"] == "request_timeout"
        else:
            assert error["error"]["code"] == "request_timeout"
    with httpx.Client(base_url=stack.url, timeout=WAIT_S) as http:
        assert http.get("/health").status_code == 200
