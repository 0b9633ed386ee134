"""Serving budgets from a model's config.json and the discovered hardware, without loading weights.

Pure arithmetic: `model_shape(config)` (model_shape.py) reads the dimensions, `compute_budgets(shape, hardware, settings)`
derives every figure TGI's launcher and warmup derive (reference §4.3 and §7.3). Each figure carries a
`source` string saying which rule or input produced it, so `tgictl profile` can show its reasoning.
The real warmup probe on the shard replaces the memory estimates with measurements.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from tgictl.errors import ConfigError
from tgictl.kv_cache_dtype import DEFAULT_KV_CACHE_DTYPE, check_kv_cache_dtype, kv_bytes_per_head
from tgictl.kv_cache_dtype import describe as describe_kv_cache_dtype
from tgictl.kv_groups import split_blocks
from tgictl.quantization import QuantizeSpec
from tgictl.runtime.host import default_serving_dtype
from tgictl.runtime.profile.family_shape import layer_groups, pooled_kv, windowed_kv
from tgictl.runtime.profile.hardware import GIB, Hardware, lookup_card_flops
from tgictl.runtime.profile.model_shape import (
    ModelShape,
    activation_bytes_per_token,
    attention_split,
    kv_heads_per_shard,
    model_flops_per_token,
    weight_bytes_per_shard,
)
from tgictl.runtime.router.scheduling.limits import DEFAULT_MAX_BATCH_PREFILL_TOKENS

MIN_COMPUTE_OPTIMAL_PREFILL = 100  # TGI uses the FLOPs rule only above this many tokens
PREFILL_DEFAULT_BY_MODEL_TYPE: Mapping[str, int] = {"qwen2_vl": 10000, "qwen2_5_vl": 10000, "gemma3": 8000}
DTYPE_BYTES: Mapping[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
DEFAULT_CUDA_GRAPHS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # TGI's --cuda-graphs default
LAUNCHER_WIGGLE_ROOM = 0.95  # TGI launcher's TGI_WIGGLE_ROOM default, used for the vram clamp
WARMUP_WIGGLE_ROOM = 0.90  # TGI shard's TGI_WIGGLE_ROOM default, used when sizing the KV cache
CUDA_CONTEXT_BYTES = 512 * (1 << 20)  # a CUDA context plus kernels: NVML's free figure predates it
CPU_KV_FRACTION = 0.25  # CPU hosts: at most this share of available RAM goes to the KV cache ...
CPU_KV_CAP_BYTES = 4 * GIB  # ... and never more than this, so a profile on a laptop stays sane
# transformers stores "no limit" as int(1e30) in tokenizer_config.json; anything this large is unset.
UNSET_MODEL_MAX_LENGTH = 10**12


@dataclass(frozen=True)
class BudgetSettings:
    """The user's choices; None means "derive it"."""

    num_shard: int = 1
    dtype: str | None = None
    block_size: int = 16
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int | None = None
    # Per shard. CPU: the KV budget (None → min(25% of available RAM, 4 GiB)); CUDA: a cap on what the
    # free memory allows (None → no cap). The same meaning as the shard's --kv-cache-memory.
    kv_cache_memory_bytes: int | None = None
    cuda_memory_fraction: float = 1.0
    quantize: QuantizeSpec | None = None  # --quantize: the projections' and vocabulary's bytes follow
    kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE  # --kv-cache-dtype: bytes per cached token follow

    def __post_init__(self) -> None:
        if self.num_shard < 1:
            raise ConfigError(f"--num-shard must be >= 1, got {self.num_shard}")
        check_kv_cache_dtype(self.kv_cache_dtype)
        if self.block_size < 1:
            raise ConfigError(f"--block-size must be >= 1, got {self.block_size}")
        if self.dtype is not None and self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        for name in ("max_input_tokens", "max_total_tokens", "max_batch_prefill_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 0:
            raise ConfigError(f"--kv-cache-memory must be >= 0 bytes, got {self.kv_cache_memory_bytes}")
        if not 0.0 < self.cuda_memory_fraction <= 1.0:
            raise ConfigError(f"--cuda-memory-fraction must be in (0, 1], got {self.cuda_memory_fraction}")
        if (
            self.max_input_tokens is not None
            and self.max_total_tokens is not None
            and self.max_input_tokens >= self.max_total_tokens
        ):
            raise ConfigError(
                f"--max-input-tokens ({self.max_input_tokens}) must be < --max-total-tokens ({self.max_total_tokens})"
            )


@dataclass(frozen=True)
class Figure:
    value: int | float | str | tuple[int, ...] | None
    source: str


@dataclass(frozen=True)
class Budgets:
    target: Figure  # "cpu" or "cuda" with the devices the shards use
    dtype: Figure
    weight_bytes_per_shard: Figure
    model_flops_per_token: Figure
    attention_heads_per_shard: Figure  # query heads of each shard, in rank order
    kv_heads_per_shard: Figure  # of the shard holding the most (it sizes every shard's KV cache)
    kv_bytes_per_token_per_shard: Figure
    kv_bytes_per_block_per_shard: Figure
    # per token at max_total_tokens if every sliding-window layer kept exactly its window
    windowed_kv_bytes_per_token_per_shard: Figure
    # what the run-time pool holds per token at max_total_tokens (release margin; two layer groups' split)
    pooled_kv_bytes_per_token_per_shard: Figure
    activation_bytes_per_token_per_shard: Figure
    device_flops: Figure
    max_batch_prefill_tokens: Figure
    kv_cache_memory_bytes_per_shard: Figure
    kv_blocks: Figure
    max_batch_total_tokens: Figure
    max_total_tokens: Figure
    max_input_tokens: Figure
    cuda_graphs: Figure
    problems: tuple[str, ...]  # what TGI's launcher or router would refuse to start with

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every figure as {"value", "source"}; tuples become lists."""
        figures = {
            key: {"value": list(item["value"]) if isinstance(item["value"], tuple) else item["value"],
                  "source": item["source"]}
            for key, item in asdict(self).items()
            if key != "problems"
        }
        return figures | {"problems": list(self.problems)}


# Helpers below return (value, source) pairs; compute_budgets wraps them into Figures.
Sourced = tuple[int, str]


def _dtype(settings: BudgetSettings, hardware: Hardware) -> tuple[str, str]:
    # The shard's own default (it does not follow config.json's dtype), so the sizes match what it loads.
    if settings.dtype is not None:
        return settings.dtype, "--dtype"
    dtype, why = default_serving_dtype(bool(hardware.gpus), hardware.cpu.native_bf16)
    return dtype, f"shard default: {why}"


def _device_flops(hardware: Hardware, num_shard: int, dtype: str) -> tuple[float | None, str]:
    if hardware.gpus:
        used = hardware.gpus[:num_shard]
        cards = [lookup_card_flops(gpu.name) for gpu in used]
        unknown = [gpu.name for gpu, card in zip(used, cards) if card is None]
        if unknown:
            return None, f"no FLOPs figure for {unknown[0]!r}"
        known = [card for card in cards if card is not None]
        total = sum(card.dense_16bit_flops for card in known)
        return total, f"{num_shard} × {known[0].card}: {known[0].source}"
    wanted = "float32" if dtype == "float32" else "bfloat16"  # the 16-bit dtypes share one measurement
    for measured in hardware.cpu_matmul:
        if measured.dtype == wanted:
            # Shards on one host share its cores, so the rate is not multiplied by num_shard.
            return measured.flops_per_s, f"measured {wanted} {measured.size}² matmul on all CPU cores"
    return None, f"CPU {wanted} matmul rate not measured"


def _memory_per_shard(hardware: Hardware, settings: BudgetSettings) -> tuple[float, str]:
    """Memory one shard may fill with weights, KV and activations (TGI's vram_maximum input)."""
    if hardware.gpus:
        total = min(gpu.total_memory_bytes for gpu in hardware.gpus[: settings.num_shard])
        return total * settings.cuda_memory_fraction * LAUNCHER_WIGGLE_ROOM, "GPU memory"
    available = hardware.cpu.available_memory_bytes / settings.num_shard
    return available * LAUNCHER_WIGGLE_ROOM, "available RAM"


def _prefill_tokens(
    shape: ModelShape, settings: BudgetSettings, device_flops: float | None, flops: int, vram_max: int,
    vram_name: str, on_gpu: bool,
) -> Sourced:
    """--max-batch-prefill-tokens, else: on GPUs TGI's launcher rule (the tokens the cards compute in
    one second at peak by the FLOPs table, if over 100, else a default); on a CPU what `tgictl launch`
    uses (router/scheduling/limits.py: 4096), because the FLOPs rule there follows a noisy matmul
    measurement (it is named in the source for comparison). Then at most max_position_embeddings,
    then at most what memory holds (weights, KV and activations)."""
    if settings.max_batch_prefill_tokens is not None:
        return settings.max_batch_prefill_tokens, "--max-batch-prefill-tokens"
    value = PREFILL_DEFAULT_BY_MODEL_TYPE.get(shape.model_type, DEFAULT_MAX_BATCH_PREFILL_TOKENS)
    source = f"TGI default {value}"
    if not on_gpu:
        value = DEFAULT_MAX_BATCH_PREFILL_TOKENS
        source = f"router default {value}"
        if device_flops is not None and flops > 0 and not shape.is_vlm:
            source += f" (TGI's FLOPs rule would give {int(device_flops / flops)}; tgictl does not use it)"
    elif device_flops is not None and flops > 0 and not shape.is_vlm:
        optimal = int(device_flops / flops)
        if optimal > MIN_COMPUTE_OPTIMAL_PREFILL:
            value, source = optimal, f"FLOPs rule: {device_flops:.4g} FLOP/s / {flops} FLOP per token"
        else:
            source = f"FLOPs rule gave {optimal} <= {MIN_COMPUTE_OPTIMAL_PREFILL}: {source}"
    max_position = shape.max_position_embeddings
    if max_position is not None and value > max_position:
        value, source = max_position, f"{source} → clamped to max_position_embeddings"
    if vram_max < value:
        value, source = max(vram_max, 0), f"{source} → clamped to what fits in {vram_name}"
    return value, source


def _kv_memory(hardware: Hardware, settings: BudgetSettings, weights: int, prefill_activations: int) -> Sourced:
    """The shard's warmup rule (runtime/shard/warmup.py, after TGI §7.3), estimated before loading."""
    explicit = settings.kv_cache_memory_bytes
    if hardware.gpus:
        # TGI's warmup keeps (1 − fraction·wiggle) of the total back and measures free memory after the
        # weights and the probe forward; before loading we subtract their estimates instead.
        keep = 1.0 - settings.cuda_memory_fraction * WARMUP_WIGGLE_ROOM
        free = min(g.free_memory_bytes - keep * g.total_memory_bytes for g in hardware.gpus[: settings.num_shard])
        value = max(0, int(free - CUDA_CONTEXT_BYTES - weights - prefill_activations))
        source = (
            "free GPU memory − (1 − cuda_memory_fraction × 0.90) × total (TGI warmup) − CUDA context 0.5 GiB"
            " − weights − prefill activations"
        )
        if explicit is not None and explicit < value:  # on CUDA the flag is a cap on what memory allows
            return explicit, "--kv-cache-memory (a cap below what GPU memory allows)"
        return value, source
    if explicit is not None:
        return explicit, "--kv-cache-memory"
    # Each shard applies the rule to the RAM it sees; ram_needed in the problems catches overcommit.
    return (
        min(int(hardware.cpu.available_memory_bytes * CPU_KV_FRACTION), CPU_KV_CAP_BYTES),
        "min(25% of available RAM, 4 GiB), per shard (shard warmup rule)",
    )


def _max_total_tokens(
    shape: ModelShape, settings: BudgetSettings, capacity: int, tokenizer_max_length: int | None
) -> Sourced:
    if settings.max_total_tokens is not None:
        return settings.max_total_tokens, "--max-total-tokens"
    limits = [(capacity, "KV capacity less block 0")]
    if tokenizer_max_length is not None and tokenizer_max_length < UNSET_MODEL_MAX_LENGTH:
        limits.append((tokenizer_max_length, "tokenizer model_max_length"))
    if shape.max_position_embeddings is not None:
        limits.append((shape.max_position_embeddings, "max_position_embeddings"))
    value, name = min(limits, key=lambda limit: limit[0])
    return value, f"min(KV capacity less block 0, tokenizer model_max_length, max_position_embeddings): {name}"


def _problems(
    *, blocks: int, max_input: int, max_total: int, prefill: int, batch_total: int, vram_max: int, weights: int,
    memory: float, memory_name: str, ram_needed: int | None, ram_available: int,
) -> tuple[str, ...]:
    """What TGI's launcher or router would refuse to start with (reference §4.3), plus plain misfits."""
    problems = []
    if blocks < 2:
        problems.append(f"the KV cache holds {blocks} blocks per shard; at least 2 are needed (block 0 is reserved)")
    if vram_max <= 0:
        problems.append(f"weights need {weights} bytes per shard; {memory_name} per shard is {int(memory)}")
    if ram_needed is not None and ram_needed > ram_available:
        problems.append(f"weights, KV cache and activations need {ram_needed} bytes; {ram_available} available")
    if max_input >= max_total:
        problems.append(f"--max-input-tokens ({max_input}) must be < --max-total-tokens ({max_total})")
    if prefill > batch_total:
        problems.append(f"--max-batch-prefill-tokens ({prefill}) must be <= --max-batch-total-tokens ({batch_total})")
    if max_total > batch_total:
        problems.append(
            f"Not enough memory to handle --max-total-tokens {max_total}: the KV cache holds {batch_total} tokens"
        )
    return tuple(problems)


def compute_budgets(
    shape: ModelShape, hardware: Hardware, settings: BudgetSettings, tokenizer_max_length: int | None = None,
    gguf_tensor_bytes: int | None = None,
) -> Budgets:
    """Every serving figure for `settings.num_shard` shards on `hardware` (the first N GPUs, else the CPU).
    gguf_tensor_bytes: the tensor bytes of the GGUF file the model is served from, if it is one."""
    n = settings.num_shard
    kv_heads = kv_heads_per_shard(shape, n)  # the model's own limit on num_shard comes first
    on_gpu = bool(hardware.gpus)
    if on_gpu and n > len(hardware.gpus):
        raise ConfigError(f"--num-shard {n} needs {n} GPUs, NVML lists {len(hardware.gpus)}")
    dtype, dtype_source = _dtype(settings, hardware)
    dtype_bytes = DTYPE_BYTES[dtype]
    weights, weights_source = weight_bytes_per_shard(shape, n, dtype_bytes, settings.quantize, gguf_tensor_bytes)
    flops = model_flops_per_token(shape)
    # K and V, every layer, in the cache's format (int8: head_dim bytes and a bf16 scale per token and head)
    kv_token = 2 * shape.num_layers * kv_heads * kv_bytes_per_head(settings.kv_cache_dtype, shape.head_dim, dtype_bytes)
    kv_block = settings.block_size * kv_token
    activations = activation_bytes_per_token(shape, n, dtype_bytes)
    device_flops, device_flops_source = _device_flops(hardware, n, dtype)

    memory, memory_name = _memory_per_shard(hardware, settings)
    vram_max = int((memory - weights) // (kv_token + activations))
    prefill, prefill_source = _prefill_tokens(shape, settings, device_flops, flops, vram_max, memory_name, bool(hardware.gpus))
    kv_memory, kv_memory_source = _kv_memory(hardware, settings, weights, prefill * activations)
    blocks = kv_memory // kv_block
    blocks_source = "KV memory // bytes per block"
    # One request can use every block but block 0 (reserved for health probes), as the shard's warmup
    # computes its default max_total_tokens.
    request_capacity = max(blocks - 1, 0) * settings.block_size
    groups = layer_groups(shape.family.layer_windows, kv_token, settings.block_size)
    if groups is not None and blocks >= 2:  # the shard's warmup split (runtime/shard/warmup.py)
        longest = min(settings.max_total_tokens or shape.max_position_embeddings or request_capacity, request_capacity)
        blocks, local_blocks = split_blocks(kv_memory, groups, settings.block_size, longest)
        request_capacity = (min(blocks, local_blocks) - 1) * settings.block_size
        blocks_source = (f"the global layers' blocks of two KV layer groups ({local_blocks} blocks of the "
                         f"sliding-window layers beside them: kv_groups.py split_blocks)")
    batch_total = blocks * settings.block_size
    max_total, max_total_source = _max_total_tokens(shape, settings, request_capacity, tokenizer_max_length)
    if settings.max_input_tokens is not None:
        max_input, max_input_source = settings.max_input_tokens, "--max-input-tokens"
    else:
        max_input, max_input_source = max(max_total - 1, 0), "max_total_tokens − 1"
    problems = _problems(
        blocks=blocks, max_input=max_input, max_total=max_total, prefill=prefill, batch_total=batch_total,
        vram_max=vram_max, weights=weights, memory=memory, memory_name=memory_name,
        ram_needed=None if on_gpu else n * (weights + kv_memory + prefill * activations),
        ram_available=hardware.cpu.available_memory_bytes,
    )

    if on_gpu:
        names = sorted({gpu.name for gpu in hardware.gpus[:n]})
        target = Figure(f"cuda: {n} × {', '.join(names)}", "NVML")
        graphs = Figure(DEFAULT_CUDA_GRAPHS, "TGI default --cuda-graphs (captured largest first)")
    else:
        cpu = hardware.cpu
        target = Figure(
            f"cpu: {cpu.cores} cores, {cpu.available_memory_bytes / GIB:.1f} GiB available",
            f"no GPU ({hardware.gpu_note or 'none found'})",
        )
        graphs = Figure((), "no CUDA device: decode runs without CUDA graphs")
    return Budgets(
        target=target,
        dtype=Figure(dtype, dtype_source),
        weight_bytes_per_shard=Figure(weights, weights_source),
        model_flops_per_token=Figure(flops, "TGI launcher formula" + (
            f" (the {shape.experts_per_token} routed of {shape.num_experts} experts and the router)"
            if shape.num_experts > 1 else "")),
        attention_heads_per_shard=Figure(
            tuple(split.q_count for split in attention_split(shape, n)),
            "query heads per shard: KV-head groups as evenly as possible, KV heads "
            + "+".join(str(split.kv_count) for split in attention_split(shape, n)),
        ),
        kv_heads_per_shard=Figure(kv_heads, "the most any shard holds (KV heads split by groups, or replicated)"),
        kv_bytes_per_token_per_shard=Figure(
            kv_token, f"2 (K,V) × layers × kv_heads_per_shard × bytes per head ({settings.kv_cache_dtype}: "
            f"{describe_kv_cache_dtype(settings.kv_cache_dtype)})"),
        kv_bytes_per_block_per_shard=Figure(kv_block, f"block_size {settings.block_size} × KV bytes per token"),
        windowed_kv_bytes_per_token_per_shard=Figure(*windowed_kv(shape.family.layer_windows, kv_token, max_total)),
        pooled_kv_bytes_per_token_per_shard=Figure(*pooled_kv(
            shape.family.layer_windows, kv_token, kv_memory, settings.block_size, max_total)),
        activation_bytes_per_token_per_shard=Figure(activations, "(2·hidden + 3·intermediate/N) × dtype"),
        device_flops=Figure(device_flops, device_flops_source),
        max_batch_prefill_tokens=Figure(prefill, prefill_source),
        kv_cache_memory_bytes_per_shard=Figure(kv_memory, kv_memory_source),
        kv_blocks=Figure(blocks, blocks_source),
        max_batch_total_tokens=Figure(batch_total, "kv_blocks × block_size (TGI warmup; block 0 is for health)"),
        max_total_tokens=Figure(max_total, max_total_source),
        max_input_tokens=Figure(max_input, max_input_source),
        cuda_graphs=graphs,
        problems=problems,
    )
