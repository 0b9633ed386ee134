"""Giving freed host memory back to the operating system, and keeping it in one malloc arena.

glibc's malloc keeps memory that large temporaries (the weights' fused copies at load, the probe
forward's activations at warmup, a long prompt's activations and logits) gave back, so the shard's RSS
would stay at its peak for good. After the two one-off phases, once the shard has held no batch for
IDLE_TRIM_DELAY_S (servicer.py) and every TRIM_EVERY_STEPS steps under load (runtime.py), it asks malloc
to return its free pages (`malloc_trim`). The shard also keeps malloc to one arena (env.py says why).
Elsewhere than glibc there are no such calls, and nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable

# mallopt's parameter number for the arena limit (glibc's malloc.h M_ARENA_MAX)
_M_ARENA_MAX = -8


@functools.cache
def _glibc_function(name: str, argtypes: tuple[type, ...]) -> Callable[..., int] | None:
    """A glibc malloc function, looked up once (find_library runs ldconfig); None elsewhere."""
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    try:
        function = getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


def release_free_memory(collect_garbage: bool = False) -> bool:
    """Return malloc's free pages to the OS; False where that is not possible.

    collect_garbage: run Python's collector first (about 75 ms with torch loaded: for the one-off
    phases only). The trim itself costs ~15 ms with 240 MB to hand back, microseconds with none.
    """
    if collect_garbage:
        gc.collect()
    trim = _glibc_function("malloc_trim", (ctypes.c_size_t,))
    if trim is None:
        return False
    trim(0)
    return True


def limit_malloc_arenas(count: int) -> bool:
    """Cap glibc's malloc arenas (env.py says why); False where that is not possible. Call before the
    process starts its threads: a thread keeps the arena it already has."""
    mallopt = _glibc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    return mallopt is not None and mallopt(_M_ARENA_MAX, count) == 1
