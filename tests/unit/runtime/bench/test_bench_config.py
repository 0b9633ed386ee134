"""BenchConfig refuses what cannot run, naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tgictl.config import BenchConfig
from tgictl.errors import ConfigError
from tgictl.runtime.bench.load_test import plans

URL = "http://127.0.0.1:8080"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "exactly one of --url"),
        ({"url": URL, "shard_uds_path": "/tmp/s-0"}, "exactly one of --url"),
        ({"url": URL, "api": "grpc"}, "--api must be one of tgi, openai-chat, openai-completions"),
        ({"url": URL, "workload": "zipf"}, "--workload must be one of random, shared-prefix, file"),
        ({"url": URL, "workload": "file"}, "needs --dataset"),
        ({"url": URL, "input_len": (5, 4)}, "--input-len must satisfy 1 <= MIN <= MAX, got 5:4"),
        ({"url": URL, "output_len": (0, 4)}, "--output-len must satisfy"),
        ({"url": URL, "groups": 0}, "--groups must be >= 1, got 0"),
        ({"url": URL, "concurrency": ()}, "--concurrency must be one or more integers >= 1"),
        ({"url": URL, "concurrency": (1, 0)}, "--concurrency must be one or more integers >= 1, got [1, 0]"),
        ({"shard_uds_path": "/s", "batch_sizes": (0,)}, "--batch-size must be one or more integers >= 1"),
        ({"url": URL, "request_rate": (0.0,)}, "--request-rate must be > 0"),
        ({"url": URL, "num_requests": 0}, "--num-requests must be >= 1"),
        ({"url": URL, "duration_s": 0.0}, "--duration must be > 0"),
        ({"url": URL, "warmup": -1}, "--warmup must be >= 0"),
        ({"url": URL, "slo": (("itl", 1.0),)}, "--slo entries must be ttft, tpot or e2e"),
        ({"shard_uds_path": "/s", "decode_length": 0}, "--decode-length must be >= 1"),
    ],
)
def test_bad_configs_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        BenchConfig(**fields)


def test_api_key_is_never_printed() -> None:
    assert "secret" not in repr(BenchConfig(url=URL, api_key="secret"))


def test_plans_sweep_concurrency_or_rates() -> None:
    sweep = plans(BenchConfig(url=URL, concurrency=(1, 8, 32), num_requests=5), workload_size=100)
    assert [(p.concurrency, p.num_requests) for p in sweep] == [(1, 5), (8, 5), (32, 5)]
    rates = plans(BenchConfig(url=URL, request_rate=(0.5, 2.0), duration_s=30.0), workload_size=100)
    assert [(p.request_rate, p.num_requests, p.duration_s) for p in rates] == [(0.5, None, 30.0), (2.0, None, 30.0)]
    # Neither a count nor a duration: the workload once.
    once = plans(BenchConfig(url=URL, workload="file", dataset=Path("x.jsonl")), workload_size=17)
    assert [p.num_requests for p in once] == [17]
