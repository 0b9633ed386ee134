"""Tensor-parallel process group (docs/architecture.md, "Decisions": Tensor parallelism): NCCL on CUDA;
on CPU gloo for the rendezvous, and for the collectives themselves a shared-memory segment when every
rank runs on this host (shm_collectives.py: two per layer and step, far cheaper than gloo's TCP),
gloo otherwise or when the native kernels are unavailable.

The caller passes RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as read by tgictl/env.py; nothing
here reads the environment. At world size 1 there is no process group and every collective is a
no-op, so a single shard never touches torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import logging

import torch
import torch.distributed as torch_dist
from torch import Tensor

from tgictl.errors import ConfigError, DeviceError
from tgictl.kernels.native import load_native_kernels
from tgictl.runtime.shard.shm_collectives import ShmCollectives, all_on_this_host

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    group: Any = None  # torch.distributed.ProcessGroup; None at world size 1
    shm: ShmCollectives | None = None  # the collectives on one CPU host; None: torch.distributed's

    @classmethod
    def single(cls) -> DistContext:
        return cls(rank=0, world_size=1, group=None)

    @property
    def is_sharded(self) -> bool:
        return self.world_size > 1


def init_distributed(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    device: torch.device,
    *,
    timeout_s: float = 120.0,
    shared_memory: bool = True,
) -> DistContext:
    """Join the tensor-parallel group. Blocks until all `world_size` ranks have joined (or times out).
    `shared_memory`: on CPU, use a shared-memory segment for the collectives when all ranks share this
    host (every rank must pass the same value)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(
            f"rank must be in 0 .. world_size - 1 and world_size >= 1, got rank={rank}, world_size={world_size}"
        )
    if world_size == 1:
        return DistContext.single()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if torch_dist.is_initialized():
        # One process serves one rank; joining twice would silently mix two groups.
        raise DeviceError("torch.distributed is already initialised in this process")
    try:
        torch_dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    except (RuntimeError, ValueError) as exc:
        raise DeviceError(
            f"rank {rank}/{world_size} could not join the {backend} group at {master_addr}:{master_port}: {exc}"
        ) from exc
    group = torch_dist.group.WORLD
    shm = None
    if device.type == "cpu" and shared_memory and all_on_this_host(group):
        kernels = load_native_kernels()
        # Every rank decides alike: the same host builds the same kernels (or fails to, alike).
        if kernels is not None:
            shm = ShmCollectives.create(rank, world_size, group, kernels)
    log.info("rank %d/%d: collectives over %s", rank, world_size, "shared memory" if shm else backend)
    return DistContext(rank=rank, world_size=world_size, group=group, shm=shm)


def destroy_distributed(dist: DistContext) -> None:
    if dist.is_sharded and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def _reduce_dtype(tensor: Tensor) -> torch.dtype:
    # gloo sums half-precision tensors in the tensor's own dtype on some builds and rejects them on
    # others; summing in float32 is exact enough and the same on every rank.
    if tensor.device.type == "cpu" and tensor.dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return tensor.dtype


def all_reduce(tensor: Tensor, dist: DistContext) -> Tensor:
    """Sum `tensor` over ranks; returns the summed tensor (the input itself at world size 1)."""
    if not dist.is_sharded:
        return tensor
    if dist.shm is not None:
        return dist.shm.all_reduce(tensor)
    work_dtype = _reduce_dtype(tensor)
    buffer = tensor if work_dtype == tensor.dtype else tensor.to(work_dtype)
    torch_dist.all_reduce(buffer, group=dist.group)
    return buffer.to(tensor.dtype)


def all_gather(tensor: Tensor, dist: DistContext, dim: int = -1) -> Tensor:
    """Concatenate every rank's `tensor` (same shape on every rank) along `dim`, in rank order."""
    if not dist.is_sharded:
        return tensor
    if dist.shm is not None:
        return dist.shm.all_gather(tensor, dim)
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(dist.world_size)]
    torch_dist.all_gather(parts, tensor, group=dist.group)
    return torch.cat(parts, dim=dim)
