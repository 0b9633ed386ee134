"""The life of one `tgictl shard` process: load, listen, serve, stop (TGI's server.py `serve`).

Order matters to the launcher: the socket directory is checked first (a bad `--uds-path` fails
before anything is loaded), then the rank joins the tensor-parallel group and loads its slice of the
model, and only then does the socket file appear at `{uds_path}-{rank}`. The server binds a temporary name next
to it and renames it once it listens, so the file's existence means "loaded and accepting RPCs".
A stale file from a crashed shard is replaced; a socket someone still listens on is not.

SIGTERM / SIGINT: stop accepting RPCs, let the one in flight finish (up to `shutdown_grace_s`), remove
the socket and return (exit 0). An unrecoverable error in an RPC (see servicer.py) takes the same
path and then raises DeviceError, so the process exits non-zero and the launcher tears down the rest.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import grpc
import grpc.aio
import torch

from tgictl.config import HubConfig, ShardConfig
from tgictl.env import apply_shard_library_defaults, read_env, shard_malloc_arenas
from tgictl.errors import ConfigError, DeviceError
from tgictl.kernels.batch_invariance import enable_batch_invariance
from tgictl.progress import phase
from tgictl.proto.generate_pb2_grpc import add_TextGenerationServiceServicer_to_server
from tgictl.runtime.shard.cpu_threads import configure_cpu_threads
from tgictl.runtime.shard.dist import DistContext, destroy_distributed, init_distributed
from tgictl.runtime.shard.faults import StepFaults
from tgictl.runtime.shard.host_memory import limit_malloc_arenas
from tgictl.runtime.shard.runtime import ShardRuntime, default_dtype
from tgictl.runtime.shard.servicer import DeviceWorker, ShardServicer
from tgictl.runtime.shard.uds import (
    check_socket_path,
    prepare_socket_dir,
    remove_socket,
)
from tgictl.tracing import configure_tracing, shutdown_tracing

log = logging.getLogger("tgictl.shard")

# Prompt logprobs of long batches make large messages; TGI lifts gRPC's 4 MiB limit the same way.
_SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.max_send_message_length", 2**31 - 1),
]
# After the server stopped, how long a device job that outlived the grace period may still take.
_DRAIN_TIMEOUT_S = 1.0


def select_device(rank: int) -> torch.device:
    """CUDA device rank % device_count when CUDA is present (one GPU per rank), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def _resolve_model(config: ShardConfig, hub: HubConfig | None) -> Path:
    from tgictl.runtime.model_files.resolve import (
        resolve_model,  # the hub client is only needed on this path
    )

    return resolve_model(config.model_id, config.revision, hub=hub)


def _resolve_adapters(config: ShardConfig, hub: HubConfig | None) -> list[tuple[str, Path]]:
    if not config.lora_adapters:
        return []
    from tgictl.runtime.model_files.resolve_adapter import resolve_adapter

    hub = hub if hub is not None else HubConfig.from_env(read_env())
    return [(spec.name, resolve_adapter(spec, hub)) for spec in config.lora_adapters]


def serve(config: ShardConfig, hub: HubConfig | None = None) -> None:
    """Serve one rank until SIGTERM/SIGINT. Raises DeviceError after an unrecoverable RPC error."""
    apply_shard_library_defaults()
    arenas = shard_malloc_arenas()
    if arenas is not None:
        limit_malloc_arenas(arenas)  # before the worker and gRPC threads exist
    socket_path = config.socket_path(config.rank)
    prepare_socket_dir(socket_path.parent)
    check_socket_path(socket_path)
    # Every torch computation of the process (conversion, loading, the collectives' set-up, then every RPC's
    # job) runs on the worker's one thread, so the process has a single OpenMP pool (DeviceWorker says why).
    worker = DeviceWorker()
    try:
        runtime, dist = worker.call(_load, config, hub)
        configure_tracing(config.tracing)
        try:
            failure = asyncio.run(_serve_grpc(config, runtime, socket_path, worker))
        finally:
            shutdown_tracing()
    finally:
        worker.shutdown()
    if failure is not None:
        # No destroy_distributed here: with a peer gone it could block; the process is about to exit.
        raise DeviceError(f"shard rank {config.rank} stopped after an unrecoverable error: {failure}")
    destroy_distributed(dist)
    log.info("rank %d stopped", config.rank)


def _load(config: ShardConfig, hub: HubConfig | None) -> tuple[ShardRuntime, DistContext]:
    """Resolve the model and adapters, join the tensor-parallel group and load this rank's slice."""
    model_dir = _resolve_model(config, hub)
    adapters = _resolve_adapters(config, hub)
    device = select_device(config.rank)
    if device.type == "cpu":  # before loading: its parallel regions are the first the team runs
        configure_cpu_threads(read_env(), config.rank, config.world_size)
    dtype = config.dtype or default_dtype(device)
    dist = init_distributed(
        config.rank, config.world_size, config.master_addr or "127.0.0.1", config.master_port or 29500, device,
        shared_memory=read_env().shm_collectives,
    )
    enable_batch_invariance(config.batch_invariant)
    with phase(f"rank {config.rank}: loading {model_dir.name} ({dtype} on {device})", logger=log):
        runtime = ShardRuntime.load(
            model_dir, dtype, device, dist, block_size=config.block_size, kv_cache_memory=config.kv_cache_memory,
            quantize=config.quantize, lora_adapters=adapters, kv_cache_dtype=config.kv_cache_dtype,
        )
    runtime.set_speculation(config.speculation)
    log.info("rank %d/%d loaded %s (%s on %s)", config.rank, config.world_size, model_dir, dtype, device)
    return runtime, dist


async def _serve_grpc(
    config: ShardConfig, runtime: ShardRuntime, socket_path: Path, worker: DeviceWorker
) -> str | None:
    """Listen until stopped; returns the fatal error's message, or None after a signal."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    failures: list[str] = []

    def on_fatal(message: str) -> None:
        failures.append(message)
        stop.set()

    # Test-only fault injection (TGICTL_FAULT_INJECT); inert when unset.
    faults = StepFaults(read_env().fault_injection)
    servicer = ShardServicer(runtime, config.urls, worker=worker, on_fatal=on_fatal, faults=faults,
                             lookahead=read_env().lookahead, health_step_timeout_s=config.health_step_timeout_s)
    server = grpc.aio.server(options=_SERVER_OPTIONS)
    add_TextGenerationServiceServicer_to_server(servicer, server)
    temporary = socket_path.with_name(f"{socket_path.name}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)
    try:
        server.add_insecure_port(f"unix:{temporary}")
    except RuntimeError as err:
        raise ConfigError(f"cannot listen on {temporary}: {err}") from err
    await server.start()
    os.replace(temporary, socket_path)  # atomic: the final name appears listening, replacing a stale one
    inode = socket_path.lstat().st_ino
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("rank %d serving on unix://%s", config.rank, socket_path)
    try:
        await stop.wait()
    finally:
        grace = config.shutdown_grace_s
        log.info("rank %d stopping: no new RPCs, up to %.0f s for the one in flight", config.rank, grace)
        await server.stop(grace)
        remove_socket(socket_path, inode)
        drained = await loop.run_in_executor(None, worker.drain, _DRAIN_TIMEOUT_S)
        abandoned = worker.abandoned() if not drained else []
        if abandoned:
            # Its client (the router) is gone, so nobody will read the result: not a failure. Python
            # would wait for the thread at exit, so leave now; the socket is already gone.
            log.info("rank %d: stopped while %s was still computing for a client that has left; not waiting for it",
                     config.rank, ", ".join(abandoned))
            logging.shutdown()
            os._exit(0)
        if not drained:
            # A device job outlived the grace period with its client still waiting (a hung collective,
            # say). Python would wait for its thread forever at exit, so leave now.
            log.error("rank %d: a device job is still running after the grace period; exiting", config.rank)
            logging.shutdown()
            os._exit(DeviceError.exit_code)
    return failures[0] if failures else None
