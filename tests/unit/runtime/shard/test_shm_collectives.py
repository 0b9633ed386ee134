"""Shared-memory collectives between two real processes: sums and gathers equal to the plain
arithmetic, bit-identical on both ranks, messages larger than a slot, and a dead peer noticed at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tgictl.errors import DeviceError
from tgictl.kernels.native import load_native_kernels
from tgictl.runtime.launcher.plan import free_port
from tgictl.runtime.shard.dist import all_gather, all_reduce, destroy_distributed, init_distributed

TIMEOUT_S = 60.0


def inputs(rank: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)
    return {
        "f32": torch.randn(33, 577, generator=generator),
        "bf16": torch.randn(32, 576, generator=generator).to(torch.bfloat16),
        "f16": torch.randn(7, 9, generator=generator).to(torch.float16),
        "large": torch.randn(3 * 1024 + 5, 1024, generator=generator),  # 12 MiB: two 8 MiB slots
        "gather": torch.randn(4, 1001, generator=generator),
    }


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist = init_distributed(rank, 2, "127.0.0.1", port, torch.device("cpu"), timeout_s=TIMEOUT_S)
    try:
        assert dist.shm is not None
        mine = inputs(rank)
        results = {name: all_reduce(t.clone(), dist) for name, t in mine.items() if name != "gather"}
        results["gather"] = all_gather(mine["gather"], dist, dim=-1)
        results["gather_rows"] = all_gather(mine["large"], dist, dim=0)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
        if rank == 1:
            return  # leaves: rank 0's next collective must notice
        time.sleep(1.0)
        try:
            all_reduce(torch.ones(4), dist)
        except DeviceError as err:
            (Path(out_dir) / "dead-peer.txt").write_text(str(err))
    finally:
        destroy_distributed(dist)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    if load_native_kernels() is None:
        raise RuntimeError("the shared-memory collectives need the native kernels (a C compiler)")
    out_dir = tmp_path_factory.mktemp("shm")
    context = mp.spawn(_worker, args=(free_port(), str(out_dir)), nprocs=2, join=False)
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError("shared-memory workers did not finish")
    return torch.load(out_dir / "rank0.pt"), torch.load(out_dir / "rank1.pt"), out_dir


def test_sums_are_the_float32_sum_and_identical_on_both_ranks(results: tuple[dict, dict, Path]) -> None:
    rank0, rank1, _ = results
    a, b = inputs(0), inputs(1)
    for name in ("f32", "bf16", "f16", "large"):
        assert torch.equal(rank0[name], rank1[name]), name
        expected = (a[name].float() + b[name].float()).to(a[name].dtype)  # one rounding, as gloo's path
        assert rank0[name].dtype == a[name].dtype and torch.equal(rank0[name], expected), name


def test_gathers_concatenate_in_rank_order(results: tuple[dict, dict, Path]) -> None:
    rank0, rank1, _ = results
    a, b = inputs(0), inputs(1)
    assert torch.equal(rank0["gather"], torch.cat([a["gather"], b["gather"]], dim=-1))
    assert torch.equal(rank0["gather_rows"], torch.cat([a["large"], b["large"]], dim=0))  # several slots
    assert torch.equal(rank0["gather"], rank1["gather"]) and torch.equal(rank0["gather_rows"], rank1["gather_rows"])


def test_a_dead_peer_is_an_error_not_a_hang(results: tuple[dict, dict, Path]) -> None:
    *_, out_dir = results
    assert (out_dir / "dead-peer.txt").read_text() == "rank 0: a tensor-parallel peer died during all_reduce"
    assert not list(Path("/dev/shm").glob("tgictl-tp-*"))  # the segment's name was removed at once
