"""ShardConfig: what `tgictl shard` accepts from flags and RANK / WORLD_SIZE / MASTER_*."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgictl.config import ShardConfig, default_uds_path
from tgictl.errors import ConfigError

BASE = Path("/tmp/tgictl-1000/server")


def test_defaults_and_urls() -> None:
    config = ShardConfig(model_id="m", uds_path=BASE, world_size=2, master_addr="10.0.0.1", master_port=29500)
    assert config.socket_path(1) == Path("/tmp/tgictl-1000/server-1")
    assert config.urls == ("unix:///tmp/tgictl-1000/server-0", "unix:///tmp/tgictl-1000/server-1")
    assert (config.block_size, config.dtype, config.kv_cache_memory, config.rank) == (16, None, None, 0)
    assert default_uds_path(1000) == BASE


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_id": " "}, "--model-id must not be empty"),
        ({"dtype": "float64"}, "--dtype must be one of float32, bfloat16, float16, got 'float64'"),
        ({"block_size": 0}, "--block-size must be >= 1, got 0"),
        ({"kv_cache_memory": 0}, "--kv-cache-memory must be >= 1 byte, got 0"),
        ({"rank": 2, "world_size": 2, "master_addr": "h", "master_port": 1}, "RANK must be in 0 .. WORLD_SIZE - 1"),
        ({"world_size": 2}, "MASTER_ADDR and MASTER_PORT must be set when WORLD_SIZE > 1"),
        ({"uds_path": Path("relative/server")}, "--uds-path must be an absolute path"),
        ({"uds_path": Path("/tmp/" + "x" * 100)}, "too long for a Unix socket"),
        ({"shutdown_grace_s": -1.0}, "shutdown_grace_s must be >= 0"),
    ],
)
def test_invalid_values_name_the_field(changes: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"model_id": "m", "uds_path": BASE} | changes
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        ShardConfig(**arguments)  # type: ignore[arg-type]
