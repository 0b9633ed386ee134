"""`tgictl shard` as the launcher sees it: the socket file means ready, a stale one is replaced, a
live one or an unsafe directory is refused, and SIGTERM / SIGINT drain the RPC in flight, remove
the socket and exit 0."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

from shard_procs import ShardConn, start_shard, warmup_batch

from tgictl.proto import convert
from tgictl.proto import generate_pb2 as pb
from tgictl.proto.messages import WarmupRequest


def test_stale_socket_is_replaced_a_live_one_refused_and_sigterm_drains(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = tmp_path / "s"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(f"{base}-0")  # a crashed shard's file: nobody listens on it
    stale.close()
    stale_inode = Path(f"{base}-0").lstat().st_ino
    shard = start_shard(tiny_model_dir, base, tmp_path / "shard.log")
    second = None
    try:
        shard.wait_ready(stale_inode=stale_inode)
        conn = ShardConn(shard.socket_path)
        # The socket appears only once the server listens: the first call needs no retry.
        assert conn.call("Info", pb.InfoRequest(), timeout_s=5.0).vocab_size == 512

        second = start_shard(tiny_model_dir, base, tmp_path / "second.log")
        assert second.wait_exit() == 2
        assert f"another server is already listening on {base}-0" in second.log()

        # A long probe forward is in flight when SIGTERM arrives: it still completes.
        long_warmup = convert.warmup_request_to_pb(WarmupRequest(batch=warmup_batch(1500), max_prefill_tokens=1500))

        async def warmup_then_signal() -> pb.WarmupResponse:
            call = conn.stubs[0].Warmup(long_warmup, timeout=60.0)
            while "Warmup started" not in shard.log():
                await asyncio.sleep(0.005)
            shard.signal(signal.SIGTERM)
            return await call

        reply = conn.run(warmup_then_signal())
        assert reply.max_supported_total_tokens == 1024 * 16
        conn.close()
        assert shard.wait_exit() == 0, shard.log()
        assert not shard.socket_path.exists()
    finally:
        shard.kill()
        if second is not None:
            second.kill()


def test_sigint_stops_cleanly(tiny_model_dir: Path, tmp_path: Path) -> None:
    shard = start_shard(tiny_model_dir, tmp_path / "s", tmp_path / "shard.log")
    try:
        shard.wait_ready()
        shard.signal(signal.SIGINT)
        assert shard.wait_exit() == 0, shard.log()
        assert not shard.socket_path.exists()
    finally:
        shard.kill()


def test_a_socket_directory_others_can_write_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The other unsafe directories are unit-tested (tests/unit/runtime/shard/test_uds.py)."""
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(0o777)
    shard = start_shard(tiny_model_dir, directory / "s", tmp_path / "shard.log")
    try:
        assert shard.wait_exit() == 2
        assert f"socket directory {directory} is writable by group or others" in shard.log()
        assert list(directory.iterdir()) == []
    finally:
        shard.kill()
