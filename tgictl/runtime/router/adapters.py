"""LoRA adapters loaded and unloaded while the server runs (POST /v1/load_lora_adapter, /v1/unload_lora_adapter;
docs/apis.md, "Adapters at runtime").

The router owns the slots, as it owns memory: a request carries its adapter's slot (Request.adapter_index),
so the router chooses which slot an adapter is loaded into (a free one, else a new one) and tells every rank
(LoadAdapter, under the batcher's forward lock so all ranks see it between the same two steps). Requests in
flight keep their adapters: a load only fills a slot no request names, and unloading an adapter that a
queued or running request uses is refused (409) rather than deferred, so the caller knows at once and
retries when those requests are done. An unloaded slot's cached prefixes are dropped (their KV was computed
with the old factors) before another adapter may take it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tgictl.errors import TgictlError
from tgictl.proto.messages import LoadAdapterRequest

log = logging.getLogger(__name__)

# Slots at most (start-up adapters included): each slot is a layer of zeros or factors in every adapted
# linear of every rank, so a client with the API key cannot make the shards grow without bound.
MAX_ADAPTER_SLOTS = 64
# An adapter's name is a `model` clients send, a /v1/models id and a metrics label: letters, digits and
# `._-/:@+` (hub ids fit), at most 200 characters.
_NAME = re.compile(r"[\w.\-/:@+]{1,200}")
MAX_PATH_CHARS = 4096


class AdapterError(TgictlError):
    """A load or unload the router refuses: a bad name or directory (400), an unknown adapter (404), an
    adapter still in use (409)."""

    error_type = "adapter"

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.http_status = status


class AdapterClient(Protocol):
    """What loading needs of the shards (ShardedClient implements it)."""

    async def load_adapter(self, request: LoadAdapterRequest) -> None: ...

    async def unload_adapter(self, adapter_index: int) -> None: ...


@dataclass
class AdapterSlots:
    """The shards' adapter slots by name ("" free), in adapter_index order (from 1)."""

    names: tuple[str, ...]

    @property
    def loaded(self) -> tuple[str, ...]:
        return tuple(name for name in self.names if name)

    def index(self, name: str) -> int | None:
        return self.names.index(name) + 1 if name and name in self.names else None

    def holds(self, adapter_index: int, name: str | None) -> bool:
        """Whether slot `adapter_index` still holds `name` (0 / None: the base model, always there)."""
        if adapter_index == 0:
            return True
        return adapter_index <= len(self.names) and self.names[adapter_index - 1] == name


class RuntimeAdapters:
    def __init__(
        self, slots: AdapterSlots, client: AdapterClient, forward_lock: asyncio.Lock, base_names: Sequence[str],
        in_use: Callable[[], Iterable[int]], on_change: Callable[[AdapterSlots], None],
        forget: Callable[[int], None],
    ) -> None:
        """in_use: the adapter_index of every queued and running request; on_change: the slots changed (the
        validator, metrics); forget: drop an adapter index's cached prefixes."""
        self.slots = slots
        self._client = client
        self._forward_lock = forward_lock
        self._base_names = tuple(base_names)
        self._in_use = in_use
        self._on_change = on_change
        self._forget = forget
        self._changing = asyncio.Lock()  # one load or unload at a time: each sees the slots the last left

    async def load(self, name: str, path: str) -> int:
        """Load `path` as adapter `name`; returns its adapter_index."""
        if not _NAME.fullmatch(name) or name in self._base_names:
            raise AdapterError(f"`lora_name` must be 1-200 letters, digits or `._-/:@+`, and not "
                               f"{', '.join(self._base_names)}")
        if not path or len(path) > MAX_PATH_CHARS or "\x00" in path or not path.isprintable():
            raise AdapterError("`lora_path` must be the path of a PEFT adapter directory the shards can read")
        async with self._changing:
            if self.slots.index(name) is not None:
                raise AdapterError(f"The lora adapter '{name}' has already been loaded.")
            names = list(self.slots.names)
            index = names.index("") + 1 if "" in names else len(names) + 1
            if index > MAX_ADAPTER_SLOTS:
                raise AdapterError(f"no adapter slot is left (at most {MAX_ADAPTER_SLOTS}): unload one first", 409)
            async with self._forward_lock:  # between two steps, on every rank alike
                try:
                    await self._client.load_adapter(LoadAdapterRequest(name, path, index))
                except TgictlError:
                    await self._client.unload_adapter(index)  # a rank that did load it gives the slot back
                    raise
            names += [""] * (index - len(names))
            names[index - 1] = name
            self._set(tuple(names))
        log.info("LoRA adapter %r loaded from %s into slot %d", name, path, index)
        return index

    async def unload(self, name: str) -> None:
        async with self._changing:
            index = self.slots.index(name)
            if index is None:
                raise AdapterError(f"The lora adapter '{name}' cannot be found.", 404)
            users = sum(1 for used in self._in_use() if used == index)
            if users:
                raise AdapterError(
                    f"The lora adapter '{name}' is in use by {users} queued or running requests: unload it when "
                    "they are done", 409)
            # No await since the check: from here no request may name it (validation refuses it, and
            # service.open drops one validated before).
            before = self.slots
            self._set(tuple("" if i == index - 1 else n for i, n in enumerate(before.names)))
            try:
                async with self._forward_lock:
                    await self._client.unload_adapter(index)
            except TgictlError:
                self._set(before.names)  # still loaded on the shards: it stays usable
                raise
            self._forget(index)
        log.info("LoRA adapter %r unloaded from slot %d", name, index)

    def _set(self, names: tuple[str, ...]) -> None:
        self.slots = AdapterSlots(names)
        self._on_change(self.slots)
