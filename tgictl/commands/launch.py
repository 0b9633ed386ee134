"""`tgictl launch`: one command that serves a model: N `tgictl shard` processes and a `tgictl router`
(with --replicas: that many of them behind the SGLang Model Gateway, docs/replicas.md).

Flags → LaunchConfig (the router options in a RouterConfig, validated before anything starts) →
runtime/launcher.launch. Shard options and every router option pass through unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tgictl.commands import speculation_options as spec
from tgictl.commands.batch_invariant_option import BATCH_INVARIANT_OPTION
from tgictl.commands.health_option import HEALTH_STEP_TIMEOUT_OPTION
from tgictl.commands.kv_cache_dtype_option import KV_CACHE_DTYPE_OPTION
from tgictl.commands.quantize_options import GROUP_SIZE_OPTION, QUANTIZE_OPTION
from tgictl.commands.router_options import RouterFlags, with_router_options
from tgictl.config import (
    DEFAULT_MODEL_ID,
    GATEWAY_POLICIES,
    SHARD_DTYPES,
    LaunchConfig,
    LogConfig,
    parse_lora_adapters,
)
from tgictl.env import inherited_environ, read_env
from tgictl.quantization import quantize_spec
from tgictl.units import parse_size


@with_router_options
def launch(
    ctx: typer.Context,
    model_id: str = typer.Option(
        DEFAULT_MODEL_ID, "--model-id",
        help="Hub id, local model directory, a .gguf file, or a hub repository's GGUF as owner/name/FILE.gguf.",
    ),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision (branch, tag or commit)."),
    num_shard: int = typer.Option(1, "--num-shard", help="Tensor-parallel shards (GPUs, or processes on CPU)."),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", show_default=False,
        help=f"One of {', '.join(SHARD_DTYPES)} (default: bfloat16 on CUDA and on CPUs with native bf16 math, else float32).",
    ),
    block_size: int = typer.Option(16, "--block-size", help="Tokens per KV block."),
    kv_cache_memory: Optional[str] = typer.Option(
        None, "--kv-cache-memory", show_default=False,
        help="KV cache bytes per shard, e.g. 4GiB (CPU: the budget, default min(25% of available RAM, 4 GiB); "
        "CUDA: a cap on what free memory allows).",
    ),
    kv_cache_dtype: str = KV_CACHE_DTYPE_OPTION,
    quantize: Optional[str] = QUANTIZE_OPTION,
    quantize_group_size: Optional[int] = GROUP_SIZE_OPTION,
    batch_invariant: bool = BATCH_INVARIANT_OPTION,
    health_step_timeout: float = HEALTH_STEP_TIMEOUT_OPTION,
    shard_uds_path: Optional[Path] = typer.Option(
        None, "--shard-uds-path", show_default=False,
        help="Socket base path; shard r listens on BASE-r (default: a fresh private directory in /tmp, "
        "removed on exit). Its directory must be writable by you alone.",
    ),
    master_addr: str = typer.Option("127.0.0.1", "--master-addr", help="torch.distributed rendezvous address."),
    master_port: Optional[int] = typer.Option(
        None, "--master-port", show_default=False, help="torch.distributed rendezvous port (default: a free port)."
    ),
    speculate: Optional[int] = spec.SPECULATE,
    speculate_ngram_min: int = spec.NGRAM_MIN,
    speculate_ngram_max: int = spec.NGRAM_MAX,
    speculate_max_batch: int = spec.MAX_BATCH,
    lora_adapters: Optional[str] = typer.Option(
        None, "--lora-adapters", show_default=False,
        help="LoRA adapters to serve beside the model: name=PATH (a PEFT directory) or a hub id[@revision], "
        "comma-separated (default: LORA_ADAPTERS). Requests choose one with TGI's parameters.adapter_id "
        "or OpenAI's model.",
    ),
    replicas: int = typer.Option(
        1, "--replicas",
        help="Replicas of the model (each its shards and router, on its own cores) behind the SGLang Model "
        "Gateway on --port; 1: one replica serving --port itself. Needs pip install 'tgictl[gateway]'.",
    ),
    replica_cpus: Optional[list[str]] = typer.Option(
        None, "--replica-cpus", show_default=False,
        help="One per replica (repeat it), the cores it runs on, e.g. --replica-cpus 0-15 --replica-cpus 16-31 "
        "(default: one NUMA node each when there are as many, else the usable cores split evenly).",
    ),
    gateway_policy: str = typer.Option(
        "cache_aware", "--gateway-policy",
        help=f"How the gateway picks a replica: {', '.join(GATEWAY_POLICIES)} (SMG's policies).",
    ),
    *,
    router_flags: RouterFlags,
) -> None:
    """Serve a model: resolve it, start the shards and the router, stop them all on SIGTERM/Ctrl-C."""
    from tgictl.runtime.launcher.supervisor import launch as run_launch

    env = read_env()
    config = LaunchConfig(
        # The launcher replaces both placeholders: rank 0's socket, the resolved model directory.
        router=router_flags.config(master_shard_uds_path="", tokenizer_name=model_id, env=env),
        model_id=model_id,
        revision=revision,
        num_shard=num_shard,
        dtype=dtype,
        block_size=block_size,
        kv_cache_memory=parse_size(kv_cache_memory) if kv_cache_memory is not None else None,
        kv_cache_dtype=kv_cache_dtype,
        quantize=quantize_spec(quantize, quantize_group_size),
        batch_invariant=batch_invariant,
        shard_uds_path=shard_uds_path.expanduser().absolute() if shard_uds_path is not None else None,
        master_addr=master_addr,
        master_port=master_port,
        speculation=spec.speculation_config(
            speculate, speculate_ngram_min, speculate_ngram_max, speculate_max_batch, env
        ),
        lora_adapters=parse_lora_adapters(lora_adapters if lora_adapters is not None else env.lora_adapters),
        health_step_timeout_s=health_step_timeout,
        replicas=replicas,
        replica_cpus=tuple(replica_cpus or ()),
        gateway_policy=gateway_policy,
    )
    log_config = ctx.obj if isinstance(ctx.obj, LogConfig) else LogConfig()
    # The children start from this process's environment (cli.py exported the logging setup into it).
    run_launch(config, log_config, env, inherited_environ())


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)
