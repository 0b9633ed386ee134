"""Freed heap memory goes back to the OS after the shard's one-off phases (load, warmup)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
