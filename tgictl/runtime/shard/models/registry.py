"""Model families keyed by config.json's `model_type`, and the one entry point that loads a model."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

import torch
from torch import nn

from tgictl.errors import UnsupportedModelError
from tgictl.kernels.linear_methods import DenseWeight, LinearWeight
from tgictl.kernels.prepacked import can_prepack, prepack_weights
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.layers.embedding import ParallelLMHead
from tgictl.runtime.shard.layers.moe import Experts
from tgictl.runtime.shard.families import FAMILIES, supported_model_types
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.models.decoder import DecoderForCausalLM
from tgictl.runtime.shard.weights import Weights

logger = logging.getLogger(__name__)

# The model class of every family of families.FAMILIES (the one list of families; a test holds the two to the
# same names). Every family shares one class: what differs is data (FamilySpec; the experts of an MoE
# family: ModelConfig.moe).
ModelClass = Callable[..., CausalLM]  # (config, weights, *, dtype, device, dist) -> the loaded model
MODEL_FAMILIES: Mapping[str, ModelClass] = MappingProxyType(dict.fromkeys(FAMILIES, DecoderForCausalLM))


def model_class(model_type: str) -> ModelClass:
    try:
        return MODEL_FAMILIES[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(supported_model_types())}"
        ) from None


def load_model(model_dir: Path, *, dtype: torch.dtype, device: torch.device, dist: DistContext,
               quantize: QuantizeSpec | None = None) -> CausalLM:
    """Load this rank's part of the model in `model_dir` (config.json + safetensors or one GGUF file), ready
    for forward; `quantize` quantizes a safetensors model's projections at load."""
    config = ModelConfig.from_dir(Path(model_dir))
    cls = model_class(config.model_type)
    # Fail on an unsplittable head count before reading any weight.
    config.head_split(dist.rank, dist.world_size)
    start = time.perf_counter()
    with Weights(Path(model_dir), dtype=dtype, device=device, dist=dist, quantize=quantize) as weights:
        model = cls(config, weights, dtype=dtype, device=device, dist=dist)
        source = "GGUF blocks" if weights.is_gguf else (quantize.label if quantize is not None else "dense")
    model.eval()
    if device.type == "cpu":
        prepack_weights(packing_candidates(model))
    logger.info(
        "loaded %s (%s, %s weights: %.1f MiB) rank %d/%d in %.2f s",
        model_dir,
        config.model_type,
        source,
        weight_bytes(model) / 2**20,
        dist.rank,
        dist.world_size,
        time.perf_counter() - start,
    )
    return model


def packing_candidates(model: nn.Module) -> list[LinearWeight]:
    """The weights held a second time for oneDNN (kernels/prepacked.py): every dense bf16 weight, and the LM
    head in any other format (GGUF's Q8_0, --quantize's int8 vocabulary): the largest matmul, whose quantized
    kernels take 5-10x oneDNN's time at 16-32 rows. Quantized projections stay as they are (a bf16 copy
    would undo their format's memory saving), and so do MoE experts: they are most of such a model's bytes, and a
    decode step gives each a few rows, which the C kernels serve from the weights as stored."""
    experts = {id(w) for module in model.modules() if isinstance(module, Experts)
               for w in (*module.gate_up, *module.down)}
    found: dict[int, LinearWeight] = {}
    for module in model.modules():
        if isinstance(module, DenseWeight) and can_prepack(module.weight) and id(module) not in experts:
            found[id(module)] = module
        elif isinstance(module, ParallelLMHead) and module.weight.dtype == torch.bfloat16:
            found[id(module.weight)] = module.weight
    return list(found.values())


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every weight the model holds, each stored tensor counted once (a tied LM head is the
    embedding)."""
    seen: dict[int, int] = {}
    for tensor in (*model.parameters(), *model.buffers()):
        seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    return sum(seen.values())
