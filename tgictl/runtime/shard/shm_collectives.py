"""All-reduce and all-gather between the tensor-parallel ranks of one host through shared memory, as
vLLM's CPU backend does: gloo's TCP all-reduce costs two network round trips per call, and a decode
step makes two calls per layer. The arithmetic is in C (kernels/csrc/shm_collectives.c, which also
explains the segment's layout and why one barrier per call suffices).

Rank 0 creates the segment in /dev/shm, tells the other ranks its name over the gloo group, every
rank maps it, and rank 0 removes the name once all have: the memory lives exactly as long as the
mappings, so a crashed shard leaves nothing behind. A rank that waits for a dead peer fails within
milliseconds (the peer's pid is gone) instead of hanging.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import Tensor

from tgictl.errors import DeviceError
from tgictl.kernels.native import NativeKernels

SLOT_BYTES = 8 << 20  # per rank and parity; larger messages go in several calls
WAIT_TIMEOUT_S = 600.0  # a live but stuck peer; a dead one is noticed at once
_LINE = 64
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_SHM_DIR = Path("/dev/shm")


def host_identity() -> str:
    """Equal for processes on one machine (and boot), different across machines."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def all_on_this_host(group: Any) -> bool:
    """True when every rank of `group` runs on this machine (a collective call on every rank)."""
    identities: list[str | None] = [None] * torch_dist.get_world_size(group)
    torch_dist.all_gather_object(identities, host_identity(), group=group)
    return len(set(identities)) == 1


@dataclass
class ShmCollectives:
    rank: int
    world_size: int
    kernels: NativeKernels
    segment: mmap.mmap  # kept alive: `base` points into it
    base: int
    slot_bytes: int
    seq: int = 0

    @classmethod
    def create(cls, rank: int, world_size: int, group: Any, kernels: NativeKernels,
               slot_bytes: int = SLOT_BYTES) -> ShmCollectives:
        """Collective: every rank of `group` calls it."""
        size = world_size * _LINE + 2 * world_size * slot_bytes
        names: list[str | None] = [None]
        if rank == 0:
            path = _SHM_DIR / f"tgictl-tp-{os.getpid()}-{secrets.token_hex(4)}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, size)  # zero-filled: every sequence number starts at 0
            names[0] = str(path)
        torch_dist.broadcast_object_list(names, src=0, group=group)
        if rank != 0:
            fd = os.open(str(names[0]), os.O_RDWR)
        try:
            segment = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        torch_dist.barrier(group=group)
        if rank == 0:
            os.unlink(str(names[0]))  # every rank has it mapped
        base = ctypes.addressof(ctypes.c_char.from_buffer(segment))
        kernels.shm_register(base, rank, os.getpid())
        torch_dist.barrier(group=group)  # every pid is registered before the first wait
        return cls(rank, world_size, kernels, segment, base, slot_bytes)

    def _check(self, status: int, what: str) -> None:
        if status == -2:
            raise DeviceError(f"rank {self.rank}: a tensor-parallel peer died during {what}")
        if status != 0:
            raise DeviceError(f"rank {self.rank}: no answer from a tensor-parallel peer within "
                              f"{WAIT_TIMEOUT_S:.0f} s during {what}")

    def all_reduce(self, tensor: Tensor) -> Tensor:
        """The sum over ranks, identical on every rank (float32 arithmetic, rank order)."""
        code = _DTYPES.get(tensor.dtype)
        if code is None:  # float16: summed in float32 like gloo's path
            return self.all_reduce(tensor.float()).to(tensor.dtype)
        out = tensor.contiguous()
        flat = out.view(-1)
        per_call = self.slot_bytes // out.element_size()
        for start in range(0, flat.numel(), per_call):
            part = flat[start : start + per_call]
            self.seq += 1
            self._check(self.kernels.shm_all_reduce(self.base, self.rank, self.world_size, self.slot_bytes, self.seq,
                                                    part.data_ptr(), part.numel(), code, WAIT_TIMEOUT_S),
                        "all_reduce")
        return out

    def all_gather(self, tensor: Tensor, dim: int) -> Tensor:
        """Every rank's `tensor` (same shape everywhere) concatenated along `dim`, in rank order."""
        local = tensor.contiguous()
        flat = local.view(-1).view(torch.uint8)
        gathered = torch.empty((self.world_size, flat.numel()), dtype=torch.uint8)  # [world, bytes]
        for start in range(0, flat.numel(), self.slot_bytes):
            part = flat[start : start + self.slot_bytes]
            target = gathered if part.numel() == flat.numel() else torch.empty((self.world_size, part.numel()),
                                                                               dtype=torch.uint8)
            self.seq += 1
            self._check(self.kernels.shm_all_gather(self.base, self.rank, self.world_size, self.slot_bytes, self.seq,
                                                    part.data_ptr(), part.numel(), target.data_ptr(), WAIT_TIMEOUT_S),
                        "all_gather")
            if target is not gathered:
                gathered[:, start : start + part.numel()] = target
        parts = gathered.view(local.dtype).view(self.world_size, *local.shape)
        return torch.cat(list(parts.unbind(0)), dim=dim)
