"""Model families keyed by config.json's `model_type`, and the one entry point that loads a model."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import torch

from tgictl.errors import UnsupportedModelError
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.models.llama import LlamaForCausalLM, MistralForCausalLM
from tgictl.runtime.shard.models.qwen import Qwen2ForCausalLM, Qwen3ForCausalLM
from tgictl.runtime.shard.weights import Weights

logger = logging.getLogger(__name__)

MODEL_FAMILIES: Mapping[str, type[LlamaForCausalLM]] = MappingProxyType(
    {
        "llama": LlamaForCausalLM,
        "mistral": MistralForCausalLM,
        "qwen2": Qwen2ForCausalLM,
        "qwen3": Qwen3ForCausalLM,
    }
)


def supported_model_types() -> list[str]:
    return sorted(MODEL_FAMILIES)


def model_class(model_type: str) -> type[LlamaForCausalLM]:
    try:
        return MODEL_FAMILIES[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(supported_model_types())}"
        ) from None


def load_model(model_dir: Path, *, dtype: torch.dtype, device: torch.device, dist: DistContext) -> CausalLM:
    """Load this rank's part of the model in `model_dir` (config.json + safetensors), ready for forward."""
    config = ModelConfig.from_dir(Path(model_dir))
    cls = model_class(config.model_type)
    # Fail on an unsplittable head count before reading any weight.
    config.head_split(dist.rank, dist.world_size)
    start = time.perf_counter()
    with Weights(Path(model_dir), dtype=dtype, device=device, dist=dist) as weights:
        model = cls(config, weights, dtype=dtype, device=device, dist=dist)
    model.eval()
    logger.info(
        "loaded %s (%s) rank %d/%d in %.2f s",
        model_dir,
        config.model_type,
        dist.rank,
        dist.world_size,
        time.perf_counter() - start,
    )
    return model
