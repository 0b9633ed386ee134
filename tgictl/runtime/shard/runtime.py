"""One rank's shard runtime: the small facade the gRPC servicer calls.

It owns the model, the KV cache and the model runner; the servicer owns the cache of batches by id and
the protobuf conversion. Until `warmup` sizes it, the KV cache holds only block 0 (enough for the
health probe): the router always warms up before it schedules (TGI's backends/v3/src/client/sharded_client.rs), and a batch whose
blocks do not exist is refused as an invalid request rather than written out of bounds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from tgictl.config import SpeculationConfig
from tgictl.errors import ConfigError, InvalidRequestError, UnhealthyError
from tgictl.kernels import DEFAULT_ATTENTION_BACKEND
from tgictl.kernels.native import load_native_kernels
from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE
from tgictl.quantization import QuantizeSpec
from tgictl.proto.messages import (
    Batch,
    Generation,
    Info,
    Timings,
    WarmupRequest,
    WarmupResult,
)
from tgictl.runtime.host import cpu_has_native_bf16, default_serving_dtype
from tgictl.runtime.shard.batch import ShardBatch
from tgictl.runtime.shard.dist import DistContext
from tgictl.runtime.shard.host_memory import release_free_memory
from tgictl.runtime.shard.kv_cache import KVCache
from tgictl.runtime.shard.lora.adapter_files import read_adapter
from tgictl.runtime.shard.lora.attach import attach_adapters, read_adapters, set_adapter_slot
from tgictl.runtime.shard.lora.delta import factor_dtype
from tgictl.runtime.shard.model_config import ModelConfig
from tgictl.runtime.shard.models.base import CausalLM
from tgictl.runtime.shard.models.registry import load_model
from tgictl.runtime.shard.sampling.grammar import GrammarCompiler
from tgictl.runtime.shard.step import ModelRunner
from tgictl.runtime.shard.warmup import KVMemorySettings, warmup

log = logging.getLogger(__name__)

StepOutput = tuple[list[Generation], ShardBatch | None, Timings]

# Steps between returns of freed heap memory to the OS (host_memory.py); a trim costs at most ~15 ms
# (microseconds when little is free), so one in this many steps is noise next to the steps themselves.
TRIM_EVERY_STEPS = 128

_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ConfigError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype}")
        return dtype
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def default_dtype(device: torch.device) -> str:
    """The shard's dtype when none is given (one rule, shared with `tgictl profile`)."""
    return default_serving_dtype(device.type == "cuda", device.type == "cpu" and cpu_has_native_bf16())[0]


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, value in _DTYPES.items() if value == dtype)


class ShardRuntime:
    def __init__(
        self,
        model: CausalLM,
        *,
        dtype: torch.dtype,
        device: torch.device,
        dist: DistContext,
        block_size: int,
        kv_settings: KVMemorySettings,
        grammars: GrammarCompiler | None = None,
        adapters: Sequence[str] = (),
    ) -> None:
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        self.model = model
        self.config = model.config
        self.dtype = dtype
        self.device = device
        self.dist = dist
        self.block_size = block_size
        self.kv_settings = kv_settings
        self.adapters = tuple(adapters)  # LoRA adapter names, already attached to the model
        self.runner = ModelRunner(
            model, self.make_cache(1), block_size=block_size, dist=dist, device=device, grammars=grammars,
            num_adapters=len(self.adapters),
        )
        self._steps = 0  # Prefill and Decode steps run, for the periodic heap trim

    @classmethod
    def load(
        cls,
        model_dir: Path | str,
        dtype: str | torch.dtype,
        device: torch.device | str,
        dist: DistContext,
        block_size: int = 16,
        kv_cache_memory: int | None = None,
        cuda_memory_fraction: float = 0.9,
        quantize: QuantizeSpec | None = None,
        lora_adapters: Sequence[tuple[str, Path]] = (),
        kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE,
    ) -> ShardRuntime:
        """Load this rank's slice of the model. kv_cache_memory: bytes (see warmup.py for defaults);
        kv_cache_dtype: the cache's format (--kv-cache-dtype, docs/kv-cache.md);
        quantize: --quantize for a safetensors model (docs/architecture.md, "Weight formats");
        lora_adapters: (name, PEFT directory) pairs, checked before the model's weights are read."""
        settings = KVMemorySettings(kv_cache_memory=kv_cache_memory, cuda_memory_fraction=cuda_memory_fraction,
                                    kv_cache_dtype=kv_cache_dtype)
        torch_dtype, torch_device = parse_dtype(dtype), torch.device(device)
        # A bad adapter fails start-up before the (much larger) model is read.
        adapters = read_adapters(lora_adapters, ModelConfig.from_dir(Path(model_dir)), torch_dtype, torch_device)
        model = load_model(Path(model_dir), dtype=torch_dtype, device=torch_device, dist=dist, quantize=quantize)
        attach_adapters(model, adapters, torch_device)
        del adapters  # the stacked copies on the model are what is served
        release_free_memory(collect_garbage=True)  # the parts of the fused weights, freed at load
        if torch_device.type == "cpu":
            load_native_kernels()  # built (about a second, once per machine) now, not in the first request
        config = model.config
        # The vocabulary for grammars loads in the background; a model without tokenizer.json refuses them.
        grammars = (
            GrammarCompiler(Path(model_dir), config.vocab_size, tuple(config.eos_token_ids))
            if (Path(model_dir) / "tokenizer.json").is_file()
            else None
        )
        return cls(
            model, dtype=torch_dtype, device=torch_device, dist=dist, block_size=block_size, kv_settings=settings,
            grammars=grammars, adapters=[name for name, _ in lora_adapters],
        )

    def make_cache(self, num_blocks: int, local_blocks: int | None = None) -> KVCache:
        return self.model.allocate_kv_cache(num_blocks, self.block_size,
                                            kv_cache_dtype=self.kv_settings.kv_cache_dtype, local_blocks=local_blocks)

    def info(self) -> Info:
        return Info(
            dtype=dtype_name(self.dtype),
            device_type=self.device.type,
            block_size=self.block_size,
            support_chunking=True,
            use_prefix_caching=True,
            attention_impl=DEFAULT_ATTENTION_BACKEND,
            model_type=self.config.model_type,
            vocab_size=self.config.vocab_size,
            num_layers=self.config.num_layers,
            max_position_embeddings=self.config.max_position_embeddings,
            eos_token_ids=tuple(self.config.eos_token_ids),
            world_size=self.dist.world_size,
            speculate=self.runner.speculation.tokens,
            adapters=self.adapters,
            layer_windows=tuple(window or 0 for window in self.config.layer_windows),
        )

    def warmup(self, request: WarmupRequest) -> WarmupResult:
        try:
            return warmup(
                self.runner,
                request,
                settings=self.kv_settings,
                make_cache=self.make_cache,
                bytes_per_block=self.model.kv_bytes_per_block(self.block_size,
                                                              kv_cache_dtype=self.kv_settings.kv_cache_dtype),
                local_group=self.model.local_group_shape(self.block_size, kv_cache_dtype=self.kv_settings.kv_cache_dtype),
                max_position_embeddings=self.config.max_position_embeddings,
            )
        finally:
            release_free_memory(collect_garbage=True)  # the probe forward's activations

    def load_adapter(self, name: str, path: str, adapter_index: int) -> None:
        """Read a PEFT adapter into slot `adapter_index` (from 1): a free slot or the next new one. A bad
        adapter is a ConfigError that changes nothing; rows in flight keep their adapters' slots."""
        slots = len(self.adapters)
        if not 1 <= adapter_index <= slots + 1:
            raise InvalidRequestError(f"adapter_index must be within 1 .. {slots + 1}, got {adapter_index}")
        if adapter_index <= slots and self.adapters[adapter_index - 1]:
            raise InvalidRequestError(f"adapter slot {adapter_index} holds {self.adapters[adapter_index - 1]!r}")
        adapter = read_adapter(name, Path(path), self.config, factor_dtype(self.dtype, self.device))
        slots = max(slots, adapter_index)
        held = set_adapter_slot(self.model, slots, adapter_index - 1, adapter, self.device)
        names = [*self.adapters, *[""] * (slots - len(self.adapters))]
        names[adapter_index - 1] = name
        self._set_adapters(tuple(names))
        log.info("LoRA adapter %r loaded into slot %d (%.1f MiB of factors on this rank)", name, adapter_index,
                 held / 2**20)

    def unload_adapter(self, adapter_index: int) -> None:
        """Empty slot `adapter_index` (its factors become zeros); a free or unknown slot is left as it is."""
        if not 1 <= adapter_index <= len(self.adapters) or not self.adapters[adapter_index - 1]:
            return
        set_adapter_slot(self.model, len(self.adapters), adapter_index - 1, None, self.device)
        names = list(self.adapters)
        log.info("LoRA adapter %r unloaded from slot %d", names[adapter_index - 1], adapter_index)
        names[adapter_index - 1] = ""
        self._set_adapters(tuple(names))

    def _set_adapters(self, names: tuple[str, ...]) -> None:
        self.adapters = names
        self.runner.num_adapters = len(names)

    def set_speculation(self, config: SpeculationConfig) -> None:
        """Speculative decoding for every later step (docs/architecture.md, "Speculative decoding")."""
        self.runner.set_speculation(config)

    def set_max_prefill_tokens(self, tokens: int) -> None:
        """The router's prefill budget, which later chunks are sized within."""
        self.runner.set_max_prefill_tokens(tokens)

    def new_batch(self, batch: Batch) -> ShardBatch:
        return ShardBatch.from_batch(
            batch,
            block_size=self.block_size,
            num_blocks=self.runner.kv_cache.num_blocks,
            groups=self.runner.kv_cache.groups,
            vocab_size=self.config.vocab_size,
            device=self.device,
            grammars=self.runner.grammars,
            num_adapters=len(self.adapters),
        )

    def prefill(self, batch: Batch, cached: ShardBatch | None = None) -> StepOutput:
        """Build `batch`; with `cached` (chunking), run it in the same forward after the cached rows."""
        start = time.perf_counter_ns()
        new = self.new_batch(batch)
        concat_ns = None
        if cached is not None:
            cached.check_fits_next_step()  # its rows step in this forward too
            concat_start = time.perf_counter_ns()
            new = ShardBatch.concatenate([cached, new])
            concat_ns = time.perf_counter_ns() - concat_start
        return self._step(new, start, concat_ns)

    def decode(self, batches: Sequence[ShardBatch]) -> StepOutput:
        start = time.perf_counter_ns()
        for batch in batches:  # before anything is consumed: a refusal changes nothing
            batch.check_fits_next_step()
        batch = ShardBatch.concatenate(batches)  # one batch comes back as is; none is an error
        concat_ns = time.perf_counter_ns() - start if len(batches) > 1 else None
        return self._step(batch, start, concat_ns)

    def _step(self, batch: ShardBatch, start: int, concat_ns: int | None) -> StepOutput:
        generations, next_batch, timings = self.runner.generate_token(batch)
        self._steps += 1
        if self._steps % TRIM_EVERY_STEPS == 0:
            # Batches of ever-changing shapes leave freed activations scattered over malloc's heap,
            # which it keeps: shard RSS after 90 s of 16-client load 4,859 MiB with this, 4,935 without.
            release_free_memory()
        total = time.perf_counter_ns() - start
        return generations, next_batch, Timings(timings.forward_ns, timings.decode_ns, total, concat_ns)

    def health(self) -> None:
        """Raise UnhealthyError unless a real one-token forward gives finite logits."""
        if not self.runner.health():
            raise UnhealthyError("health probe forward produced non-finite logits")
