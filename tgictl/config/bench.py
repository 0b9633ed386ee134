"""`tgictl bench`: an HTTP load test or a shard's static-batch benchmark."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tgictl.errors import ConfigError

BENCH_APIS: tuple[str, ...] = ("tgi", "openai-chat", "openai-completions")
BENCH_WORKLOADS: tuple[str, ...] = ("random", "shared-prefix", "file")


@dataclass(frozen=True)
class BenchConfig:
    """`tgictl bench`: an HTTP load test of a server (`url`) or TGI's static-batch benchmark straight
    through a shard's gRPC socket (`shard_uds_path`); exactly one is set. Lengths are tokens, times
    seconds; ranges are inclusive (low, high)."""

    url: str | None = None
    shard_uds_path: str | None = None
    api: str = "tgi"
    model_id: str | None = None  # the tokenizer (exact prompt lengths) and the OpenAI `model` field
    tokenizer: str | None = None  # overrides model_id's tokenizer
    api_key: str | None = field(default=None, repr=False)  # never printed
    workload: str = "random"
    input_len: tuple[int, int] = (256, 256)  # shared-prefix: the tokens after the prefix
    output_len: tuple[int, int] | None = None  # None: 128, or the dataset's reference replies
    prefix_len: int = 1024
    groups: int = 4
    prompts_per_group: int = 8
    dataset: Path | None = None
    concurrency: tuple[int, ...] = (1,)  # closed loop: one run per value
    request_rate: tuple[float, ...] = ()  # open loop (Poisson, requests/s): one run per value
    num_requests: int | None = None  # None: the workload's size (random: 100) unless duration_s is set
    duration_s: float | None = None
    warmup: int = 0  # requests sent once before the first run, left out of every figure
    ignore_eos: bool = False
    slo: tuple[tuple[str, float], ...] = ()  # (key, seconds) with key in ttft, tpot, e2e
    seed: int = 0
    output: Path | None = None
    report: Path | None = None  # an HTML page of the HTTP runs (inline SVG plots)
    request_timeout_s: float = 600.0
    metrics_interval_s: float = 0.5
    # Shard micro-benchmark (TGI's benchmark defaults).
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    sequence_length: int = 10
    decode_length: int = 8
    runs: int = 10
    warmups: int = 1

    def __post_init__(self) -> None:
        if (self.url is None) == (self.shard_uds_path is None):
            raise ConfigError("give exactly one of --url (HTTP load test) and --shard (gRPC micro-benchmark)")
        if self.report is not None and self.url is None:
            raise ConfigError("--report plots HTTP load tests: it needs --url")
        if self.api not in BENCH_APIS:
            raise ConfigError(f"--api must be one of {', '.join(BENCH_APIS)}, got {self.api!r}")
        if self.workload not in BENCH_WORKLOADS:
            raise ConfigError(f"--workload must be one of {', '.join(BENCH_WORKLOADS)}, got {self.workload!r}")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"--url must be an http:// or https:// URL, got {self.url!r}")
        if self.workload == "file" and self.dataset is None:
            raise ConfigError("--workload file needs --dataset PATH")
        if self.dataset is not None and self.workload != "file":
            raise ConfigError(f"--dataset needs --workload file (the {self.workload} workload makes its own prompts)")
        for name, bounds in (("--input-len", self.input_len), ("--output-len", self.output_len)):
            if bounds is not None and not 1 <= bounds[0] <= bounds[1]:
                raise ConfigError(f"{name} must satisfy 1 <= MIN <= MAX, got {bounds[0]}:{bounds[1]}")
        positive = {"--prefix-len": self.prefix_len, "--groups": self.groups, "--prompts-per-group": self.prompts_per_group,
                    "--sequence-length": self.sequence_length, "--decode-length": self.decode_length,
                    "--runs": self.runs}
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        for name, values in (("--concurrency", self.concurrency), ("--batch-size", self.batch_sizes)):
            if not values or any(v < 1 for v in values):
                raise ConfigError(f"{name} must be one or more integers >= 1, got {list(values)}")
        if any(not r > 0 for r in self.request_rate):
            raise ConfigError(f"--request-rate must be > 0 requests/s, got {list(self.request_rate)}")
        if self.num_requests is not None and self.num_requests < 1:
            raise ConfigError(f"--num-requests must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ConfigError(f"--duration must be > 0 seconds, got {self.duration_s}")
        for name, value in (("--warmup", self.warmup), ("--warmups", self.warmups)):
            if value < 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        for name, seconds in (("--request-timeout", self.request_timeout_s),
                              ("metrics_interval_s", self.metrics_interval_s)):
            if not seconds > 0:
                raise ConfigError(f"{name} must be > 0, got {seconds}")
        if any(key not in ("ttft", "tpot", "e2e") or not seconds > 0 for key, seconds in self.slo):
            raise ConfigError(f"--slo entries must be ttft, tpot or e2e with seconds > 0, got {dict(self.slo)}")
