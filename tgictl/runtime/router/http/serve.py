"""`tgictl router` at run time: resolve the tokenizer, attach to the shards, serve HTTP with uvicorn,
and shut down gracefully on SIGTERM/SIGINT (drain first, then stop listening)."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import signal
from pathlib import Path
from types import FrameType

import uvicorn

from tgictl.config import RouterConfig
from tgictl.tracing import configure_tracing, shutdown_tracing
from tgictl.runtime.model_files.resolve import resolve_model
from tgictl.runtime.router.http.app import create_app
from tgictl.runtime.router.http.connection_guard import guarded_protocol
from tgictl.runtime.router.service import RouterService
from tgictl.runtime.router.shard_client import ShardedClient

log = logging.getLogger(__name__)


class GracefulServer(uvicorn.Server):
    """uvicorn, except that the first signal drains the service (503 for new requests, in-flight
    ones finish up to the graceful timeout) before uvicorn stops; a second SIGINT forces the exit."""

    def __init__(self, config: uvicorn.Config, service: RouterService) -> None:
        super().__init__(config)
        self._service = service
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Future[None] | None = None
        self._drain_started = False

    async def serve(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)  # type: ignore[arg-type]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it and kill us before cleanup.
        if self._drain_started:
            # A second signal: no more waiting. Requests still running end now with an error event
            # (the drain's own timeout path), then uvicorn stops.
            log.info("received %s again: ending the %d requests still running", signal.Signals(sig).name,
                     self._service.in_flight)
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._service.stop_waiting)
            else:
                self.should_exit = True
            return
        self._drain_started = True
        log.info("received %s: draining", signal.Signals(sig).name)
        if self._loop is None:
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        self._draining = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self._service.drain()
        finally:
            self.should_exit = True


async def _start_or_stop(config: RouterConfig, model_dir: Path, client: ShardedClient, model_id: str) -> RouterService | None:
    """RouterService.start (the warmup can take many seconds), or None when SIGTERM/SIGINT came first."""
    loop = asyncio.get_running_loop()
    starting = asyncio.ensure_future(RouterService.start(config, model_dir, client, model_id))
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, starting.cancel)
    try:
        return await starting
    except asyncio.CancelledError:
        log.info("stopped before serving: a signal came during start-up (the warmup)")
        return None
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def serve(config: RouterConfig, model_dir: Path, model_id: str) -> None:
    client = await ShardedClient.connect(config.master_shard_uds_path)
    try:
        service = await _start_or_stop(config, model_dir, client, model_id)
    except BaseException:
        await client.close()
        raise
    if service is None:
        await client.close()
        return
    try:
        uv_config = uvicorn.Config(
            create_app(service),
            host=config.hostname,
            port=config.port,
            log_config=None,  # tgictl.log configured logging for the whole process
            lifespan="off",
            timeout_graceful_shutdown=5,  # the service drained already
            access_log=False,
            http=guarded_protocol(config.http_header_timeout_s, config.max_connections),
        )
        log.info("router listening on http://%s:%d", config.hostname, config.port)
        await GracefulServer(uv_config, service).serve()
    finally:
        await service.close()


def run_router(config: RouterConfig) -> None:
    """Blocking: serve until a signal ends it. The tokenizer is resolved like a model id."""
    model_dir = resolve_model(config.tokenizer_name)
    configure_tracing(config.tracing)
    coroutine = serve(config, model_dir, config.model_name)
    try:
        if importlib.util.find_spec("uvloop") is not None:
            import uvloop

            uvloop.run(coroutine)
        else:
            asyncio.run(coroutine)
    finally:
        shutdown_tracing()
