"""The only module that reads environment variables. Everything else receives an `Env` (or values
taken from it), so configuration is explicit, typed and testable without touching os.environ.

Parsing fails loudly: a malformed value raises ConfigError naming the variable, never a silent default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tgictl.errors import ConfigError

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})

# Names of the variables tgictl itself sets for its child processes (see tgictl.log.child_environ).
LOG_LEVEL_VAR = "TGICTL_LOG_LEVEL"
JSON_OUTPUT_VAR = "TGICTL_JSON_OUTPUT"
# The router's API key: read by `tgictl router`/`launch` when --api-key is not given, and how the
# launcher hands the key to its router (a command line is visible to every local user in `ps`; a
# process's environment only to its owner).
API_KEY_VAR = "TGICTL_API_KEY"
# The OpenMP variables that place threads on CPUs (the standard's and libgomp's own).
OMP_AFFINITY_VARS = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")
# Test-only: make a shard fail chosen generation steps (see FaultInjection).
FAULT_INJECT_VAR = "TGICTL_FAULT_INJECT"


def _text(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    return value if value not in (None, "") else None


def _bool(environ: Mapping[str, str], name: str) -> bool:
    raw = environ.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"{name} must be a boolean (1/0, true/false, yes/no, on/off), got {environ[name]!r}")


def _auto_on_off(environ: Mapping[str, str], name: str) -> str:
    """auto (unset or "auto"), on or off (any boolean spelling)."""
    raw = environ.get(name, "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    return "on" if _bool(environ, name) else "off"


def _int(environ: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    raw = _text(environ, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def _float(environ: Mapping[str, str], name: str) -> float | None:
    raw = _text(environ, name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value}")
    return value


def _path(environ: Mapping[str, str], name: str) -> Path | None:
    raw = _text(environ, name)
    return Path(raw).expanduser() if raw is not None else None


def _visible_devices(environ: Mapping[str, str], name: str) -> tuple[int, ...] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: unset → None (every GPU); "" → no GPU; "1,0" → those
    indices in that order. Negative or missing indices are kept: CUDA ends the list at the first index
    that does not exist (so "-1" hides every GPU), and hardware.discover_gpus applies that rule."""
    raw = environ.get(name)
    if raw is None:
        return None
    text = raw.strip()
    if text == "":
        return ()
    if text.upper().startswith(("GPU-", "MIG-")):
        # UUID and MIG forms name devices NVML would have to look up; discovery then lists every GPU
        # rather than guessing which ones these are.
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"{name} must be a comma-separated list of GPU indices such as 0,1, got {raw!r}") from None


@dataclass(frozen=True)
class FaultInjection:
    """Test-only (TGICTL_FAULT_INJECT="fail_batch:STEPS", STEPS a comma list of N or N-M): the shard's
    Prefill and Decode steps, counted together from 1 in the order the shard runs them, fail with a
    recoverable generation error on those steps. Unset, nothing is injected."""

    steps: tuple[tuple[int, int], ...]  # inclusive ranges

    def fails(self, step: int) -> bool:
        return any(first <= step <= last for first, last in self.steps)


def _fault_injection(environ: Mapping[str, str]) -> FaultInjection | None:
    raw = _text(environ, FAULT_INJECT_VAR)
    if raw is None:
        return None
    kind, _, spec = raw.strip().partition(":")
    ranges = []
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        if kind != "fail_batch" or not first.isdigit() or not (last == "" or last.isdigit()):
            raise ConfigError(f"{FAULT_INJECT_VAR} must be fail_batch:N[-M][,N[-M]...], got {raw!r}")
        start, end = int(first), int(last or first)
        if not 1 <= start <= end:
            raise ConfigError(f"{FAULT_INJECT_VAR} steps must satisfy 1 <= N <= M, got {raw!r}")
        ranges.append((start, end))
    return FaultInjection(tuple(ranges))


@dataclass(frozen=True)
class Env:
    """A typed snapshot of the environment variables tgictl understands."""

    home: Path
    # Hugging Face hub settings (the same names huggingface_hub uses, passed to it explicitly).
    hf_home: Path | None = None
    hf_hub_cache: Path | None = None
    hf_hub_offline: bool = False
    hf_endpoint: str | None = None
    hf_token: str | None = field(default=None, repr=False)  # never printed
    hf_hub_etag_timeout: float | None = None
    # tgictl's own cache (converted models); default ~/.cache/tgictl.
    tgictl_cache_dir: Path | None = None
    # Logging: TGICTL_LOG_LEVEL wins over LOG_LEVEL (the latter is what TGI reads).
    log_level: str | None = None
    json_output: bool = False
    # The router's API key (TGICTL_API_KEY); --api-key wins over it.
    api_key: str | None = field(default=None, repr=False)  # never printed
    # TGI's PREFIX_CACHING: the router's radix prefix cache on or off; --[no-]prefix-caching wins.
    prefix_caching: bool = True
    # TGI's SPECULATE: draft tokens per step for the shards; --speculate wins.
    speculate: int | None = None
    # TGI's LORA_ADAPTERS (`name=PATH` or hub `id[@revision]`, comma-separated); --lora-adapters wins.
    lora_adapters: str | None = None
    # torch.distributed rendezvous, set by the launcher for each shard.
    rank: int | None = None
    world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    # CUDA_VISIBLE_DEVICES as NVML indices in CUDA's order; None: unset, or a UUID/MIG form.
    cuda_visible_devices: tuple[int, ...] | None = None
    # Test-only fault injection for the shard (None unless TGICTL_FAULT_INJECT is set).
    fault_injection: FaultInjection | None = None
    # The shard's compiled CPU kernels (tgictl/kernels/native.py): TGICTL_NATIVE_KERNELS=0 turns them
    # off (pure torch); CC names the C compiler that builds them (default: cc).
    native_kernels: bool = True
    # Tensor-parallel collectives through shared memory between the shards of one CPU host
    # (runtime/shard/shm_collectives.py); TGICTL_SHM_COLLECTIVES=0 keeps gloo's.
    shm_collectives: bool = True
    c_compiler: str | None = None
    # A second copy of the bf16 weights in oneDNN's layout (kernels/prepacked.py): TGICTL_PREPACK_WEIGHTS
    # auto (while the copy takes <= 25% of the memory available after loading; on AMX machines none of
    # the weights the AMX kernels read as stored), on, or off.
    prepack_weights: str = "auto"
    # The shard steps a decoding batch ahead while the router handles the last step (runtime/shard/lookahead.py):
    # TGICTL_LOOKAHEAD=0 turns it off.
    lookahead: bool = True
    # Each of the shard's OpenMP threads bound to a core of its own (runtime/shard/cpu_threads.py says why):
    # TGICTL_BIND_THREADS=0 leaves them to the scheduler. Off as well where the user placed the threads
    # (OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY set): their setting wins.
    bind_threads: bool = True
    user_thread_affinity: bool = False
    # OMP_NUM_THREADS as the user (or the launcher, for tensor-parallel shards) set it: the shard's thread count,
    # which then wins over the cgroup CPU limit the shard otherwise fits its threads to.
    omp_num_threads: int | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Env:
        """Parse `environ` (default: os.environ). Raises ConfigError on a malformed value."""
        env = os.environ if environ is None else environ
        home = _path(env, "HOME") or Path(os.path.expanduser("~"))
        master_port = _int(env, "MASTER_PORT", minimum=1)
        if master_port is not None and master_port > 65535:
            raise ConfigError(f"MASTER_PORT must be <= 65535, got {master_port}")
        return cls(
            home=home,
            hf_home=_path(env, "HF_HOME"),
            hf_hub_cache=_path(env, "HF_HUB_CACHE"),
            hf_hub_offline=_bool(env, "HF_HUB_OFFLINE"),
            hf_endpoint=_text(env, "HF_ENDPOINT"),
            hf_token=_text(env, "HF_TOKEN"),
            hf_hub_etag_timeout=_float(env, "HF_HUB_ETAG_TIMEOUT"),
            tgictl_cache_dir=_path(env, "TGICTL_CACHE_DIR"),
            log_level=_text(env, LOG_LEVEL_VAR) or _text(env, "LOG_LEVEL"),
            json_output=_bool(env, JSON_OUTPUT_VAR),
            api_key=_text(env, API_KEY_VAR),
            prefix_caching=_bool(env, "PREFIX_CACHING") if _text(env, "PREFIX_CACHING") else True,
            speculate=_int(env, "SPECULATE"),
            lora_adapters=_text(env, "LORA_ADAPTERS"),
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE", minimum=1),
            master_addr=_text(env, "MASTER_ADDR"),
            master_port=master_port,
            cuda_visible_devices=_visible_devices(env, "CUDA_VISIBLE_DEVICES"),
            fault_injection=_fault_injection(env),
            native_kernels=_bool(env, "TGICTL_NATIVE_KERNELS") if _text(env, "TGICTL_NATIVE_KERNELS") else True,
            shm_collectives=_bool(env, "TGICTL_SHM_COLLECTIVES") if _text(env, "TGICTL_SHM_COLLECTIVES") else True,
            c_compiler=_text(env, "CC"),
            prepack_weights=_auto_on_off(env, "TGICTL_PREPACK_WEIGHTS"),
            lookahead=_bool(env, "TGICTL_LOOKAHEAD") if _text(env, "TGICTL_LOOKAHEAD") else True,
            bind_threads=_bool(env, "TGICTL_BIND_THREADS") if _text(env, "TGICTL_BIND_THREADS") else True,
            user_thread_affinity=any(_text(env, name) for name in OMP_AFFINITY_VARS),
            # OpenMP allows a list (one count per nesting level): the first is the shard's.
            omp_num_threads=_int({"OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "").split(",")[0].strip()},
                                 "OMP_NUM_THREADS", minimum=1),
        )

    @property
    def hub_cache_dir(self) -> Path:
        """Where huggingface_hub keeps repositories: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
        if self.hf_hub_cache is not None:
            return self.hf_hub_cache
        if self.hf_home is not None:
            return self.hf_home / "hub"
        return self.home / ".cache" / "huggingface" / "hub"

    @property
    def cache_dir(self) -> Path:
        """tgictl's own cache: TGICTL_CACHE_DIR, else ~/.cache/tgictl."""
        return self.tgictl_cache_dir if self.tgictl_cache_dir is not None else self.home / ".cache" / "tgictl"


def read_env() -> Env:
    """The current process environment as an Env."""
    return Env.from_environ()


def inherited_environ() -> dict[str, str]:
    """A copy of this process's environment for the processes it starts: they inherit variables
    tgictl never interprets (PATH, CUDA_VISIBLE_DEVICES, ...), and the caller edits the copy, never
    os.environ."""
    return dict(os.environ)


# oneDNN (torch's CPU matmuls) keeps up to 1024 compiled kernels, one per matmul shape; a server
# sees ever new shapes (every prefill length, every batch size), so its RSS grew by ~190 MiB under
# 90 s of 16-client load. 32 kept the same throughput (scripts/soak.py, scripts/bench_vs_servers.py);
# 64 leaves room for the prepacked weights' decode kernels (kernels/prepacked.py: at most 8 row counts per
# weight shape, 5 shapes for a llama) beside the prefill shapes.
ONEDNN_CACHE_VAR = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
SHARD_ONEDNN_CACHE_CAPACITY = 64


# torch backs CPU allocations of 2 MiB and more with transparent huge pages when this is 1 (it asks with
# madvise; Linux's default THP mode, "madvise", then grants them). A decode step reads every weight and
# the batch's whole KV cache: with 4 KiB pages that is a TLB miss per page. On 2 cores of an AMX Xeon a
# batch-32 step at 256 cached tokens took 37.9-39.1 ms with it against 40.1-40.5 ms without.
THP_VAR = "THP_MEM_ALLOC_ENABLE"


# glibc gives each thread that allocates under contention an arena of its own (up to 8 per core), and
# memory freed in one arena serves no other. The shard's allocations come from its device thread and
# a few gRPC threads, so whichever thread happened to touch a buffer first decided where ~35 MiB of
# free memory stayed: its RSS when ready was 671 or 685-708 MiB from run to run (bf16 SmolLM2, 128 MiB
# KV cache). With one arena it is 671 in every run. A user's MALLOC_ARENA_MAX wins.
MALLOC_ARENA_VAR = "MALLOC_ARENA_MAX"
SHARD_MALLOC_ARENAS = 1


def shard_malloc_arenas() -> int | None:
    """The arena limit the shard sets for glibc's malloc; None where the user set MALLOC_ARENA_MAX."""
    return None if MALLOC_ARENA_VAR in os.environ else SHARD_MALLOC_ARENAS


def apply_shard_library_defaults() -> None:
    """Set the shard's defaults for the libraries it loads (a user's own setting wins). Call before
    the first matmul and before the model and KV cache are allocated: oneDNN reads its variable when it
    creates its cache, torch its huge-page switch at its first large allocation."""
    os.environ.setdefault(ONEDNN_CACHE_VAR, str(SHARD_ONEDNN_CACHE_CAPACITY))
    os.environ.setdefault(THP_VAR, "1")


# libgomp (torch's OpenMP runtime, which the C kernels share) spins 300,000 times (~3 ms) at a barrier before its
# thread sleeps. A decode step is hundreds of barriers; on cores another process shares, the spin holds the core
# while the thread it waits for cannot run. 30,000 spins: SmolLM2 with both of 2 cores shared kept 0.36-0.37 of
# its quiet tok/s against 0.10-0.11, quiet 0.98x at one client and 1.02x at four (medians of 3 rounds);
# docs/benchmarks.md, "Sharing the cores". Read once, when libgomp loads (with torch), so the shard sets it before
# it imports torch. A user's GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.
SPIN_COUNT_VAR = "GOMP_SPINCOUNT"
WAIT_POLICY_VAR = "OMP_WAIT_POLICY"
SHARD_SPIN_COUNT = 30_000


def apply_shard_openmp_defaults() -> bool:
    """Set the shard's OpenMP spin count unless the user chose one or a wait policy; call before torch is imported.
    False where the user's setting stands."""
    if SPIN_COUNT_VAR in os.environ or WAIT_POLICY_VAR in os.environ:
        return False
    os.environ[SPIN_COUNT_VAR] = str(SHARD_SPIN_COUNT)
    return True


# Progress bars of the libraries tgictl uses: huggingface_hub and transformers read the first (TGI's
# launcher sets it for its shards too), tqdm itself the second (any other tqdm bar).
PROGRESS_BAR_VARS = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}


def disable_library_progress_bars() -> None:
    """For output that is no terminal; a user's own setting wins. Effective for libraries imported
    after this call, and in every child process."""
    for name, value in PROGRESS_BAR_VARS.items():
        os.environ.setdefault(name, value)
