"""`tgictl profile`: the serving budgets a model would get on this host, from its config.json alone.

Flags → BudgetSettings → discover the hardware → runtime/budgets. Nothing is loaded onto a device, so
the command is safe next to a running server. With `--measure` (one shard only) it also loads the model
in this process and runs the router's warmup probe on it (runtime/profile/measure.py), printing the measured
figures beside the estimates.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tgictl.commands.kv_cache_dtype_option import KV_CACHE_DTYPE_OPTION
from tgictl.commands.quantize_options import GROUP_SIZE_OPTION, QUANTIZE_OPTION
from tgictl.config import DEFAULT_MODEL_ID, LogConfig, check_model_id, check_replicas
from tgictl.env import read_env
from tgictl.errors import ConfigError, TgictlError, UsageError
from tgictl.quantization import quantize_spec
from tgictl.runtime.gguf_reader import read_gguf
from tgictl.runtime.model_files.gguf_model import served_gguf_file
from tgictl.runtime.model_files.resolve import load_model_config, resolve_model
from tgictl.runtime.profile.budgets import (
    DTYPE_BYTES,
    WARMUP_WIGGLE_ROOM,
    Budgets,
    BudgetSettings,
    compute_budgets,
)
from tgictl.runtime.profile.model_shape import ModelShape, kv_heads_per_shard, model_shape
from tgictl.runtime.profile.hardware import (
    Hardware,
    discover_hardware,
    lookup_card_flops,
)
from tgictl.runtime.profile.measure import MeasureSettings, compare, measure
from tgictl.runtime.profile.replicas import replica_budgets
from tgictl.units import parse_size


def read_model_files(model_dir: Path) -> tuple[dict[str, Any], int | None]:
    """config.json, and the tokenizer's model_max_length when tokenizer_config.json states one."""
    config = load_model_config(model_dir)
    max_length = None
    tokenizer_path = model_dir / "tokenizer_config.json"
    if tokenizer_path.is_file():
        try:
            value = json.loads(tokenizer_path.read_text()).get("model_max_length")
        except (OSError, json.JSONDecodeError, AttributeError):
            value = None  # the tokenizer limit is one bound among three; a broken file just drops it
        if isinstance(value, int) and not isinstance(value, bool):
            max_length = value
    return config, max_length


def profile_report(
    model_id: str, model_dir: Path, shape: ModelShape, hardware: Hardware, budgets: Budgets
) -> dict[str, Any]:
    """The JSON document of `tgictl profile --json-output`; the table shows the same fields."""
    gpus = []
    for gpu in hardware.gpus:
        card = lookup_card_flops(gpu.name)
        gpus.append(asdict(gpu) | {
            "dense_16bit_flops": card.dense_16bit_flops if card else None,
            "flops_source": card.source if card else "not in the FLOPs table",
        })
    budget_figures = budgets.to_dict()
    problems = budget_figures.pop("problems")
    return {
        "model": {"model_id": model_id, "path": str(model_dir)} | _lists(asdict(shape)),
        "devices": {
            "gpus": gpus,
            "gpu_note": hardware.gpu_note,
            "cpu": asdict(hardware.cpu),
            "cpu_matmul": [asdict(m) for m in hardware.cpu_matmul],
        },
        "budgets": budget_figures,
        "problems": problems,
    }


def _lists(value: Any) -> Any:
    """JSON's shapes: tuples (a family's layer windows) as lists, inside dicts too."""
    if isinstance(value, dict):
        return {key: _lists(item) for key, item in value.items()}
    return [_lists(item) for item in value] if isinstance(value, (list, tuple)) else value


def _bytes(value: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value:,} ({value / size:.1f} {unit})"
    return f"{value:,}"


def _format(name: str, value: Any) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, list):
        return ", ".join(map(str, value)) if value else "none"
    if isinstance(value, float):
        return f"{value / 1e12:.3g} TFLOP/s" if name == "device_flops" else f"{value:.4g}"
    if isinstance(value, int) and "bytes" in name:
        return _bytes(value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_report(report: dict[str, Any], console: Console | None = None) -> None:
    """Rich tables (on stdout unless a console is given): devices, model, then every budget figure with
    its source."""
    console = console if console is not None else Console()
    devices = report["devices"]
    if devices["gpus"]:
        table = Table(title="GPUs (NVML)")
        for column in ("#", "name", "total", "free", "dense 16-bit", "FLOPs source"):
            table.add_column(column)
        for gpu in devices["gpus"]:
            flops = gpu["dense_16bit_flops"]
            table.add_row(str(gpu["index"]), gpu["name"], _bytes(gpu["total_memory_bytes"]),
                          _bytes(gpu["free_memory_bytes"]), _format("device_flops", flops), gpu["flops_source"])
        console.print(table)
    else:
        cpu = devices["cpu"]
        console.print(f"No GPU ({devices['gpu_note']}): sizing for the CPU.")
        rates = ", ".join(f"{m['dtype']} {m['flops_per_s'] / 1e9:.1f} GFLOP/s" for m in devices["cpu_matmul"])
        console.print(f"CPU: {cpu['cores']} cores, RAM {_bytes(cpu['total_memory_bytes'])} total, "
                      f"{_bytes(cpu['available_memory_bytes'])} available; measured matmul: {rates or 'none'}")
    model = report["model"]
    console.print(
        f"Model {model['model_id']} ({model['model_type'] or 'unknown type'}): {model['num_layers']} layers, "
        f"hidden {model['hidden_size']}, {model['num_heads']} heads / {model['num_kv_heads']} KV heads of "
        f"{model['head_dim']}, intermediate {model['intermediate_size']}, vocab {model['vocab_size']}"
    )
    # Two columns, the source on its own line under each value: readable at 80 columns and piped
    # (a third column for the sources was squeezed to one letter there).
    table = Table(title="Budgets (estimated from config.json; no weights loaded)", show_lines=True)
    table.add_column("figure", no_wrap=True)
    table.add_column("value and where it comes from", overflow="fold")
    for name, figure in report["budgets"].items():
        table.add_row(name, Text(_format(name, figure["value"])) + Text("\n" + figure["source"], style="dim"))
    console.print(table)
    if "measured" in report:
        table = Table(title="Measured (model loaded, the router's warmup probe run) vs estimated", show_lines=True)
        table.add_column("figure", no_wrap=True)
        table.add_column("estimate", no_wrap=True)
        table.add_column("measured and how", overflow="fold")
        for name, figure in report["measured"].items():
            estimate, measured = (
                "—" if figure[key] is None else _format(name, figure[key]) for key in ("estimate", "measured")
            )
            table.add_row(name, estimate, Text(measured) + Text("\n" + figure["source"], style="dim"))
        console.print(table)
    for row in report.get("replicas", ()):
        table = Table(title=f"Replica {row['replica']} (cores {row['cpus']}): its budgets", show_lines=True)
        table.add_column("figure", no_wrap=True)
        table.add_column("value and where it comes from", overflow="fold")
        for name, figure in row["budgets"].items():
            if name != "problems":
                table.add_row(name, Text(_format(name, figure["value"])) + Text("\n" + figure["source"], style="dim"))
        console.print(table)
    for problem in report["problems"]:
        console.print(f"[bold red]problem:[/] {problem}")


def _json_output(ctx: typer.Context) -> bool:
    """The global --json-output choice: cli.py's callback leaves the resolved LogConfig in ctx.obj; without
    it (an app built without that callback) the flag, else the environment, decides the same way."""
    if isinstance(ctx.obj, LogConfig):
        return ctx.obj.json_output
    flag = ctx.find_root().params.get("json_output")
    return bool(flag) if flag is not None else read_env().json_output


def _resolve(model_id: str, revision: str | None) -> Path:
    local = Path(model_id).expanduser()
    if local.is_dir():  # a config.json is all profile needs; resolve_model would insist on weights
        return local
    return resolve_model(model_id, revision)


def _measure_settings(
    model_dir: Path, settings: BudgetSettings, budgets: Budgets, hardware: Hardware
) -> MeasureSettings:
    """The shard the measurement loads: the estimate's dtype, device and prefill size, the same flags."""
    return MeasureSettings(
        model_dir=model_dir,
        dtype=str(budgets.dtype.value),
        device="cuda:0" if hardware.gpus else "cpu",  # the first visible GPU, as a single shard takes it
        block_size=settings.block_size,
        kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
        # The shard's fraction is the share it may fill, TGI's memory fraction × wiggle room.
        cuda_memory_fraction=settings.cuda_memory_fraction * WARMUP_WIGGLE_ROOM,
        max_batch_prefill_tokens=int(budgets.max_batch_prefill_tokens.value or 0),
        max_input_tokens=settings.max_input_tokens,
        max_total_tokens=settings.max_total_tokens,
        quantize=settings.quantize,
        kv_cache_dtype=settings.kv_cache_dtype,
    )


def _gguf_tensor_bytes(model_dir: Path, settings: BudgetSettings) -> int | None:
    """The tensor bytes of the GGUF file the model is served from, if it is one (its header only)."""
    gguf = served_gguf_file(model_dir, settings.quantize)
    return None if gguf is None else sum(t.nbytes for t in read_gguf(gguf).tensors.values())


def profile(
    ctx: typer.Context,
    model_id: str = typer.Option(
        DEFAULT_MODEL_ID, "--model-id",
        help="Hub id, local model directory, a .gguf file, or a hub repository's GGUF as owner/name/FILE.gguf.",
    ),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision (branch, tag or commit)."),
    num_shard: int = typer.Option(1, "--num-shard", help="Tensor-parallel shards (GPUs, or processes on CPU)."),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", help=f"One of {', '.join(DTYPE_BYTES)} (default: from config.json).", show_default=False
    ),
    block_size: int = typer.Option(16, "--block-size", help="Tokens per KV block."),
    max_input_tokens: Optional[int] = typer.Option(None, "--max-input-tokens", show_default=False),
    max_total_tokens: Optional[int] = typer.Option(None, "--max-total-tokens", show_default=False),
    max_batch_prefill_tokens: Optional[int] = typer.Option(None, "--max-batch-prefill-tokens", show_default=False),
    kv_cache_memory: Optional[str] = typer.Option(
        None, "--kv-cache-memory", show_default=False,
        help="KV cache bytes per shard, e.g. 4GiB (CPU: the budget, default min(25% of available RAM, 4 GiB); "
        "CUDA: a cap on what free memory allows).",
    ),
    cuda_memory_fraction: float = typer.Option(1.0, "--cuda-memory-fraction", help="Share of each GPU to use."),
    kv_cache_dtype: str = KV_CACHE_DTYPE_OPTION,
    quantize: Optional[str] = QUANTIZE_OPTION,
    quantize_group_size: Optional[int] = GROUP_SIZE_OPTION,
    replicas: int = typer.Option(
        1, "--replicas", help="Show each replica's budgets for `tgictl launch --replicas N` (its own cores)."
    ),
    replica_cpus: Optional[list[str]] = typer.Option(
        None, "--replica-cpus", show_default=False, help="As `tgictl launch --replica-cpus` (one per replica)."
    ),
    run_measure: bool = typer.Option(
        False, "--measure",
        help="Also load the model here as one shard, run the router's warmup probe and show the measured "
        "figures beside the estimates (--num-shard 1 only).",
    ),
) -> None:
    """Show the budgets (KV blocks, token limits, prefill size) this host gives a model, without loading it
    (unless --measure)."""
    settings = BudgetSettings(
        num_shard=num_shard,
        dtype=dtype,
        block_size=block_size,
        max_input_tokens=max_input_tokens,
        max_total_tokens=max_total_tokens,
        max_batch_prefill_tokens=max_batch_prefill_tokens,
        kv_cache_memory_bytes=parse_size(kv_cache_memory) if kv_cache_memory is not None else None,
        cuda_memory_fraction=cuda_memory_fraction,
        quantize=quantize_spec(quantize, quantize_group_size),
        kv_cache_dtype=kv_cache_dtype,
    )
    check_model_id(model_id)
    check_replicas(replicas, tuple(replica_cpus or ()))
    if run_measure and num_shard != 1:
        raise UsageError(
            f"--measure loads the model in this process as a single shard, so it needs --num-shard 1 "
            f"(got {num_shard}); the estimates alone are available for {num_shard} shards"
        )
    visible_gpus = read_env().cuda_visible_devices
    model_dir = _resolve(model_id, revision)
    config, tokenizer_max_length = read_model_files(model_dir)
    shape = model_shape(config)
    kv_heads_per_shard(shape, num_shard)  # fail on a model/shard mismatch before measuring anything
    hardware = discover_hardware(visible_gpus=visible_gpus)
    budgets = compute_budgets(shape, hardware, settings, tokenizer_max_length, _gguf_tensor_bytes(model_dir, settings))
    report = profile_report(model_id, model_dir, shape, hardware, budgets)
    if replicas > 1:
        rows, problems = replica_budgets(shape, hardware, settings, replicas, replica_cpus or (),
                                         tokenizer_max_length, _gguf_tensor_bytes(model_dir, settings))
        report["replicas"] = rows
        report["problems"] += problems
    measure_error: TgictlError | None = None
    if run_measure:
        try:
            report["measured"] = compare(measure(_measure_settings(model_dir, settings, budgets, hardware)), budgets)
        except TgictlError as err:  # the estimates are still worth printing; the error decides the exit
            measure_error = err
            report["measure_error"] = str(err)
    if _json_output(ctx):
        typer.echo(json.dumps(report))
    else:
        render_report(report)
    if measure_error is not None:
        raise measure_error
    if report["problems"]:  # the figures are printed; the exit code says this setup would not start
        raise ConfigError(f"this configuration would not start: {'; '.join(report['problems'])}")


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
