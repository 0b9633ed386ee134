"""KV events over real ZMQ sockets as a vLLM subscriber reads them: topic, sequence numbers, the msgpack
EventBatch, replay from a sequence number with its end marker; and from a running router, the events of
a real request (its prompt's blocks) after the AllBlocksCleared of start-up."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
import zmq

from tests.unit.runtime.router.test_service import run
from tgictl.runtime.router.http.app import create_app
from tgictl.runtime.router.kv_event_publisher import END_SEQ, KvEventPublisher, binds
from tgictl.runtime.router.service import RouterService
from tgictl.testing.fake_shard import FakeServiceClient


def _subscriber(context: zmq.Context, endpoint: str, topic: bytes = b"") -> zmq.Socket:
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(endpoint)
    return sub


def _receive(sub: zmq.Socket, count: int) -> list[tuple[bytes, int, list[Any]]]:
    out = []
    for _ in range(count):
        topic, seq, payload = sub.recv_multipart()
        out.append((topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
    return out


def _connected(publisher: KvEventPublisher, sub: zmq.Socket) -> None:
    """PUB drops what it sends before a subscription arrives: probe until one gets through."""
    sub.setsockopt(zmq.RCVTIMEO, 50)
    for _ in range(200):
        publisher.publish([["AllBlocksCleared"]])
        try:
            sub.recv_multipart()
            break
        except zmq.Again:
            continue
    time.sleep(0.2)
    while True:
        try:
            sub.recv_multipart()
        except zmq.Again:
            break
    sub.setsockopt(zmq.RCVTIMEO, 5000)


def test_batches_carry_topic_sequence_and_vllm_s_event_batch_and_replay(tmp_path: Path) -> None:
    endpoint, replay = f"ipc://{tmp_path}/kv", f"ipc://{tmp_path}/replay"
    assert binds(endpoint) and binds("tcp://*:5557") and not binds("tcp://indexer:5557")
    publisher = KvEventPublisher(endpoint, replay, topic="kv@pod@model", buffer=3)
    context = zmq.Context()
    try:
        sub = _subscriber(context, endpoint, b"kv@")
        _connected(publisher, sub)
        sent = [[["BlockStored", [i], None, [1, 2], 2, None, None]] for i in range(5)]
        for events in sent:
            publisher.publish(events)
        received = _receive(sub, 5)
        first = received[0][1]
        assert [seq for _, seq, _ in received] == list(range(first, first + 5))  # consecutive from the probes on
        for (topic, _, batch), events in zip(received, sent):
            ts, body = batch  # vLLM's EventBatch: [ts, events] (data_parallel_rank omitted, as msgspec does)
            assert topic == b"kv@pod@model" and abs(ts - time.time()) < 60 and body == events

        for delimiter in ((), (b"",)):  # a DEALER, and a client that frames like REQ
            client = context.socket(zmq.DEALER)
            client.setsockopt(zmq.RCVTIMEO, 5000)
            client.connect(replay)
            client.send_multipart([*delimiter, (first + 3).to_bytes(8, "big")])
            frames = [client.recv_multipart() for _ in range(3)]
            assert [f[len(delimiter)] for f in frames] == [(first + 3).to_bytes(8, "big"),
                                                          (first + 4).to_bytes(8, "big"), END_SEQ]
            assert msgpack.unpackb(frames[0][-1])[1] == sent[3] and frames[-1][-1] == b""
            # Before the buffer's oldest: what is left (the last 3), then the end.
            client.send_multipart([*delimiter, (0).to_bytes(8, "big")])
            seqs = [int.from_bytes(client.recv_multipart()[len(delimiter)], "big", signed=True) for _ in range(4)]
            assert seqs == [first + 2, first + 3, first + 4, -1]
            client.close(0)
        sub.close(0)
    finally:
        publisher.close()
        context.term()


def test_a_router_publishes_its_prompt_s_blocks(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    """A subscriber that joins late (PUB drops what was sent before it) asks the replay socket for
    everything since sequence 0, as vLLM's subscriber does on a gap."""
    endpoint, replay = f"ipc://{tmp_path}/router-kv", f"ipc://{tmp_path}/router-replay"
    context = zmq.Context()

    async def body(service: RouterService, fake: FakeServiceClient) -> None:
        transport = httpx.ASGITransport(app=create_app(service))
        prompt = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            tokens = (await client.post("/tokenize", json={"inputs": prompt})).json()
            answer = await client.post("/generate", json={"inputs": prompt, "parameters": {"max_new_tokens": 2}})
        assert answer.status_code == 200
        client_socket = context.socket(zmq.DEALER)
        client_socket.setsockopt(zmq.RCVTIMEO, 5000)
        client_socket.connect(replay)
        client_socket.send_multipart([(0).to_bytes(8, "big")])
        frames = [client_socket.recv_multipart() for _ in range(3)]
        client_socket.close(0)
        assert [int.from_bytes(f[0], "big", signed=True) for f in frames] == [0, 1, -1]
        batches = [msgpack.unpackb(f[1])[1] for f in frames[:2]]
        assert batches[0] == [["AllBlocksCleared"]]  # a (re)started router: forget what it held before
        (stored,) = batches[1]
        ids = [t["id"] for t in tokens]
        whole = (len(ids) - 1) // 16 * 16  # the prompt's last position is always computed, never cached
        assert whole >= 16 and stored[0] == "BlockStored" and stored[3] == ids[:whole] and stored[4] == 16
        assert len(stored[1]) == whole // 16 and stored[2] is None

    try:
        run(tiny_tokenizer_dir, body, kv_events_endpoint=endpoint, kv_events_replay_endpoint=replay)
    finally:
        context.term()
