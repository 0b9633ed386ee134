"""vLLM's routes for LoRA adapters at runtime: POST /v1/load_lora_adapter and /v1/unload_lora_adapter, with
vLLM's bodies and answers. Served only with --allow-lora-loading (otherwise they are unknown paths, 404),
behind the API key when one is set (router/adapters.py; docs/apis.md, "Adapters at runtime")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict

from tgictl.runtime.router.service import RouterService


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str
    lora_path: str


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str
    lora_int_id: int | None = None  # vLLM's; the name is what identifies an adapter here


def adapter_router(service: RouterService, auth: Callable[..., Any]) -> APIRouter:
    router = APIRouter(tags=["LoRA adapters"])
    protected = [Depends(auth)]

    @router.post("/v1/load_lora_adapter", dependencies=protected)
    async def load(body: LoadLoraAdapterRequest) -> Response:
        """Load a PEFT adapter directory; requests may then name it as `model` or `adapter_id`."""
        await service.adapters.load(body.lora_name, body.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @router.post("/v1/unload_lora_adapter", dependencies=protected)
    async def unload(body: UnloadLoraAdapterRequest) -> Response:
        """Unload an adapter no queued or running request uses (409 while one does)."""
        await service.adapters.unload(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    return router
