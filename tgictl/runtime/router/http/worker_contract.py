"""The worker contract: what gateways and schedulers read from a replica besides the generation APIs, in
one place (docs/replicas.md, "The worker contract"; docs/architecture.md, "Replicas and gateways").

| route | who reads it | what tgictl answers |
| --- | --- | --- |
| `GET /version` | SGLang Model Gateway (SMG) detects a vLLM-like HTTP engine by it; vLLM's route | `{"version": tgictl's version}` |
| `GET /v1/models` | SMG's metadata (first entry: `id` is the served name, `root` the model path, `max_model_len`); OpenAI clients | `owned_by: "tgictl"`, `root`, `parent`, `max_model_len` |
| `GET /server_info`, `GET /model_info` (and SGLang's older `/get_server_info`, `/get_model_info`) | SGLang-style gateways | SGLang's field names for the same facts |
| `GET /metrics` | SMG's load monitor (as a vLLM worker), llm-d / Gateway API endpoint pickers | vLLM-named gauges (router/gateway_metrics.py) |
| `GET /health` | every gateway and Kubernetes probe | 200 while the shards serve, 503 while draining |
| KV events (ZMQ, vLLM's format) | llm-d's precise prefix-cache scorer | router/kv_event_publisher.py, behind `--kv-events-endpoint` |

Why `owned_by: "tgictl"` and `/version`: SMG reads `owned_by` first ("vllm" or "sglang" name an engine);
any other value sends it to the `/version` (vLLM) and `/server_info` (SGLang) probes, and `/version`
wins. As a vLLM worker it reads metadata from `/v1/models` and `/version` and load from the `vllm:`
gauges, which is what tgictl exports; as a `generic` worker (no `/version`) its load monitor reads
nothing. `owned_by` is who serves the model, not the model's name (the field's OpenAI meaning).

Model names: a request may name the model by its id or by TGI's `tgi` (config.BASE_MODEL_ALIASES);
/v1/models lists the id only, so gateways that pick a worker by model need the alias declared
(SMG: `--model-alias tgi=MODEL_ID`, which `tgictl launch --replicas` passes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from tgictl import __version__
from tgictl.runtime.router.http.responses import TgiJSONResponse
from tgictl.runtime.router.service import RouterService

OWNED_BY = "tgictl"


def model_card(service: RouterService, name: str, parent: str | None = None) -> dict[str, Any]:
    """One /v1/models entry in vLLM's shape: `root` is what the model was loaded from, `parent` the base
    model of an adapter, `max_model_len` the most tokens (prompt + generated) one request may hold."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": OWNED_BY,
        "root": service.config.tokenizer_name if parent is None else name,
        "parent": parent,
        "max_model_len": service.limits.max_total_tokens,
    }


def server_info(service: RouterService) -> dict[str, Any]:
    """SGLang's /server_info field names for this replica's facts (SMG reads a subset of them)."""
    config, limits, info = service.config, service.limits, service.info
    return {
        "model_path": config.tokenizer_name,
        "tokenizer_path": config.tokenizer_name,
        "served_model_name": service.model_id,
        "tp_size": info.world_size,
        "dp_size": 1,
        "pp_size": 1,
        "context_length": limits.max_total_tokens,
        "max_total_tokens": limits.max_batch_total_tokens,
        "max_running_requests": config.max_concurrent_requests,
        "page_size": info.block_size,
        "is_embedding": False,
        "disaggregation_mode": "null",
        "version": __version__,
    }


def model_info(service: RouterService) -> dict[str, Any]:
    return {
        "model_path": service.config.tokenizer_name,
        "tokenizer_path": service.config.tokenizer_name,
        "is_generation": True,
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }


def worker_router(service: RouterService, auth: Callable[..., Any]) -> APIRouter:
    """The contract's own routes (/v1/models and /metrics stay with the TGI routes, which build them
    with model_card and gateway_metrics)."""
    router = APIRouter()
    protected = [Depends(auth)]

    @router.get("/version", tags=["Worker"])
    async def version() -> Response:
        """tgictl's version (vLLM's route: gateways recognise a vLLM-like worker by it)."""
        return TgiJSONResponse({"version": __version__})

    for path in ("/server_info", "/get_server_info"):
        router.add_api_route(path, lambda: TgiJSONResponse(server_info(service)), methods=["GET"],
                             dependencies=protected, tags=["Worker"], summary="SGLang-style server facts")
    for path in ("/model_info", "/get_model_info"):
        router.add_api_route(path, lambda: TgiJSONResponse(model_info(service)), methods=["GET"],
                             dependencies=protected, tags=["Worker"], summary="SGLang-style model facts")
    return router
