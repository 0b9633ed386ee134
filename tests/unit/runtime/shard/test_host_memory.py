"""Freed heap memory goes back to the OS (after the shard's one-off phases, when idle); one malloc arena."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tgictl.env import SHARD_MALLOC_ARENAS, shard_malloc_arenas

SCRIPT = textwrap.dedent('''
    import re
    import torch
    from tgictl.runtime.shard.host_memory import release_free_memory

    def rss_mib():
        status = open("/proc/self/status").read()
        return int(re.search(r"^VmRSS:\\s+(\\d+) kB", status, re.M).group(1)) / 1024

    keep = torch.zeros(1)
    # 256 MiB in 64 KiB pieces: below glibc's mmap threshold, so they live on the heap
    parts = [torch.ones(16384) for _ in range(4096)]
    keep = torch.zeros(8)  # allocated last: the freed pieces are not all at the heap's top
    before = rss_mib()
    del parts
    freed = rss_mib()
    assert release_free_memory() is True
    after = rss_mib()
    print(before, freed, after)
''')


def test_release_returns_freed_heap_pages() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before, freed, after = map(float, done.stdout.split())
    assert freed > before - 64  # free() alone keeps most of the 256 MiB
    assert after < freed - 200  # malloc_trim hands it back


ARENA_SCRIPT = textwrap.dedent('''
    import sys
    import threading
    import torch
    from tgictl.runtime.shard.host_memory import limit_malloc_arenas

    def main_heap_kib():
        rss, in_heap = 0, False
        for line in open("/proc/self/smaps"):
            if "-" in line.split(" ", 1)[0]:
                in_heap = line.rstrip().endswith("[heap]")
            elif in_heap and line.startswith("Rss:"):
                rss += int(line.split()[1])
        return rss

    if sys.argv[1] == "limit":
        assert limit_malloc_arenas(1) is True
    kept = []
    before = main_heap_kib()
    # 64 MiB in 64 KiB pieces from a new thread: below the mmap threshold, so from the thread's arena
    thread = threading.Thread(target=lambda: kept.extend(torch.ones(16384) for _ in range(1024)))
    thread.start()
    thread.join()
    print((main_heap_kib() - before) / 1024)
''')


def _thread_allocations_on_main_heap_mib(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", ARENA_SCRIPT, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


def test_one_arena_puts_every_threads_allocations_on_the_main_heap() -> None:
    assert _thread_allocations_on_main_heap_mib("limit") > 56
    assert _thread_allocations_on_main_heap_mib("default") < 8  # the thread got an arena of its own


def test_a_users_malloc_arena_max_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert shard_malloc_arenas() == SHARD_MALLOC_ARENAS
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert shard_malloc_arenas() is None
