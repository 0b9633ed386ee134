"""KV cache events over ZMQ, as vLLM's ZmqEventPublisher sends them (`--kv-events-endpoint`; the optional
extra `tgictl[kv-events]`: pyzmq and msgpack). docs/replicas.md, "KV events".

- PUB socket on the endpoint: multipart `[topic, seq (8 bytes, big-endian), payload]`; the payload is an
  EventBatch `[ts, [event, ...]]` in msgpack (router/kv/cache_events.py makes the events). The socket
  binds when the endpoint's host is a wildcard (`tcp://*:5557`) or it is ipc/inproc, and connects
  otherwise (to a consumer that binds, as llm-d's indexer does): vLLM's rule.
- ROUTER socket on the replay endpoint: a request `[identity, (b""), start_seq (8 bytes)]` is answered
  with every buffered batch from `start_seq` on, one `[identity, (b""), seq, payload]` message each,
  then `[identity, (b""), seq -1, b""]` as the end. The last `buffer` batches are kept.

All ZMQ work runs on one thread of its own (ZMQ sockets are not thread-safe); `publish` only queues.
Sequence numbers start at 0 and count every batch, so a subscriber sees a gap and asks for a replay.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from tgictl.errors import ConfigError

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_STOP = object()


def _load() -> tuple[Any, Any]:
    try:
        import msgpack
        import zmq
    except ImportError:
        raise ConfigError("--kv-events-endpoint needs pyzmq and msgpack: pip install 'tgictl[kv-events]'") from None
    return zmq, msgpack


def binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard host or a local transport binds; a named host is a consumer to connect to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KvEventPublisher:
    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                 buffer: int = 10_000) -> None:
        self._zmq, self._msgpack = _load()
        self._context = self._zmq.Context()
        self._pub = self._context.socket(self._zmq.PUB)
        self._pub.setsockopt(self._zmq.LINGER, 0)
        (self._pub.bind if binds(endpoint) else self._pub.connect)(endpoint)
        self._replay = None
        if replay_endpoint is not None:
            self._replay = self._context.socket(self._zmq.ROUTER)
            self._replay.setsockopt(self._zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._next_seq = 0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        log.info("KV events: publishing on %s%s", endpoint, f", replay on {replay_endpoint}" if replay_endpoint else "")

    def publish(self, events: list[list[Any]]) -> None:
        """Queue one batch (thread-safe, never blocks)."""
        self._queue.put((time.time(), events))

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(5.0)
        self._context.term()

    def _run(self) -> None:
        try:
            while True:
                if self._replay is not None and self._replay.poll(0):
                    self._serve_replay()
                try:
                    item = self._queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is _STOP:
                    return
                ts, events = item  # type: ignore[misc]
                payload = self._msgpack.packb([ts, events])
                seq = self._next_seq
                self._next_seq += 1
                self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])
                self._buffer.append((seq, payload))
        finally:
            self._pub.close()
            if self._replay is not None:
                self._replay.close()

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()  # type: ignore[union-attr]
        if len(frames) not in (2, 3) or (len(frames) == 3 and frames[1] != b"") or len(frames[-1]) != 8:
            log.warning("KV events: malformed replay request of %d frames ignored", len(frames))
            return
        prefix = frames[:-1]  # the identity, and the empty delimiter a REQ/DEALER client may send
        start = int.from_bytes(frames[-1], "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart([*prefix, seq.to_bytes(8, "big"), payload])  # type: ignore[union-attr]
        self._replay.send_multipart([*prefix, END_SEQ, b""])  # type: ignore[union-attr]
