"""Start-up limits: the warmup batch TGI 1.4 sends and the limits derived from the shard's answer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tgictl.testing.fake_shard import fake_info
from tgictl.config import RouterConfig
from tgictl.errors import ConfigError
from tgictl.proto.messages import WarmupResult
from tgictl.runtime.router.scheduling.scheduler import release_window
from tgictl.runtime.router.scheduling.limits import (
    derive_limits,
    max_batch_prefill_tokens,
    prefill_group_tokens,
    warmup_request,
)


def config(**kwargs: object) -> RouterConfig:
    return RouterConfig(master_shard_uds_path="/tmp/x-0", tokenizer_name="m", **kwargs)  # type: ignore[arg-type]


def test_warmup_batch_fills_max_prefill_tokens_with_repeated_ids() -> None:
    request = warmup_request(config(max_input_tokens=100, max_total_tokens=150), fake_info(), 7, 250)
    lengths = [len(r.input_ids) for r in request.batch.requests]
    assert lengths == [100, 100, 50]  # truncate = min(max_input, what is left)
    assert [r.id for r in request.batch.requests] == [0, 1, 2]
    assert all(set(r.input_ids) == {7} for r in request.batch.requests)
    assert [r.stopping.max_new_tokens for r in request.batch.requests] == [50, 50, 100]
    first = request.batch.requests[0]
    assert first.stopping.ignore_eos and first.prefill_logprobs and first.top_n_tokens == 20
    assert first.blocks == ()  # the shard places the probe itself
    assert first.sampling.repetition_penalty == 1.2 and first.sampling.top_k == 10
    assert (request.max_prefill_tokens, request.max_input_tokens, request.max_total_tokens) == (250, 100, 150)


def test_warmup_batch_without_limits_and_with_max_batch_size() -> None:
    request = warmup_request(config(), fake_info(), 7, 64)
    assert [len(r.input_ids) for r in request.batch.requests] == [64]
    assert request.batch.requests[0].stopping.max_new_tokens == 1
    capped = warmup_request(config(max_input_tokens=10, max_total_tokens=20, max_batch_size=2), fake_info(), 7, 64)
    assert [len(r.input_ids) for r in capped.batch.requests] == [10, 10]


def test_default_max_batch_prefill_tokens() -> None:
    assert max_batch_prefill_tokens(config(), fake_info()) == 2048  # clamped to max_position_embeddings
    assert max_batch_prefill_tokens(config(), replace(fake_info(), max_position_embeddings=10**5)) == 4096
    assert max_batch_prefill_tokens(config(max_batch_prefill_tokens=99), fake_info()) == 99


def test_prefill_group_tokens_default_by_device_and_zero_is_no_limit() -> None:
    assert prefill_group_tokens(config(), fake_info()) == 512  # a CPU shard
    assert prefill_group_tokens(config(), replace(fake_info(), device_type="cuda")) is None
    assert prefill_group_tokens(config(prefill_group_tokens=0), fake_info()) is None
    assert prefill_group_tokens(config(prefill_group_tokens=96), replace(fake_info(), device_type="cuda")) == 96


def test_limits_from_warmup() -> None:
    limits = derive_limits(config(), fake_info(), WarmupResult(8192, 2047, 2048), 4096)
    assert (limits.max_input_tokens, limits.max_total_tokens) == (2047, 2048)
    assert limits.max_batch_total_tokens == 8192 and limits.num_blocks == 512
    assert limits.max_batch_prefill_tokens == 4096
    # A derived prefill default bends to a small cache; a user value would be refused instead.
    small = derive_limits(config(), fake_info(), WarmupResult(1024, 511, 512), 4096)
    assert small.max_batch_prefill_tokens == 1024
    with pytest.raises(ConfigError, match=r"--max-batch-prefill-tokens \(\d+\) must be <= --max-batch-total-tokens"):
        derive_limits(config(max_batch_prefill_tokens=4096), fake_info(), WarmupResult(1024, 511, 512), 4096)


def test_user_limits_win_and_are_checked() -> None:
    limits = derive_limits(config(max_input_tokens=100, max_total_tokens=200, max_batch_total_tokens=4096),
                           fake_info(), WarmupResult(8192, 100, 200), 256)
    assert (limits.max_input_tokens, limits.max_total_tokens, limits.max_batch_total_tokens) == (100, 200, 4096)
    with pytest.raises(ConfigError, match=r"Not enough memory to handle --max-total-tokens 2000"):
        derive_limits(config(max_total_tokens=2000), fake_info(), WarmupResult(1024, 1999, 2000), 256)
    # A larger --max-batch-total-tokens than the shards hold is capped, not trusted.
    capped = derive_limits(config(max_batch_total_tokens=10**6), fake_info(), WarmupResult(8192, 2047, 2048), 256)
    assert capped.max_batch_total_tokens == 8192


def test_router_config_checks() -> None:
    with pytest.raises(ConfigError, match=r"--max-input-tokens \(\d+\) must be < --max-total-tokens"):
        config(max_input_tokens=10, max_total_tokens=10)
    with pytest.raises(ConfigError, match="--validation-workers must be >= 1"):
        config(validation_workers=0)
    assert "s3cret" not in repr(config(api_key="s3cret"))


def test_model_name_is_the_served_name_else_the_tokenizer() -> None:
    assert config().model_name == "m"
    assert config(served_model_name="org/model").model_name == "org/model"
    with pytest.raises(ConfigError, match="--served-model-name must not be empty"):
        config(served_model_name=" ")


def test_max_total_tokens_fits_the_usable_blocks() -> None:
    """4096 KV tokens in blocks of 16 are 256 blocks, 255 usable (block 0 is reserved). A request of
    input + max_new = 4096 needs 4095 slots = 256 blocks: it could never be allocated. At most
    255 * 16 + 1 = 4081 (the last sampled token needs no slot)."""
    derived = derive_limits(config(), fake_info(), WarmupResult(4096, 4095, 4096), 4096)
    assert derived.max_total_tokens == 4081 and derived.max_input_tokens == 4080
    assert derived.num_blocks == 256
    with pytest.raises(ConfigError, match=r"--max-total-tokens 4096.*at most 4081"):
        derive_limits(config(max_batch_total_tokens=4096, max_total_tokens=4096), fake_info(),
                      WarmupResult(4096, 4095, 4096), 4096)
    fits = derive_limits(config(max_batch_total_tokens=4096, max_total_tokens=4081), fake_info(),
                         WarmupResult(4096, 4080, 4081), 4096)
    assert fits.max_total_tokens == 4081


def test_two_layer_groups_from_warmup_bound_a_request_by_the_smaller_group() -> None:
    """A shard with local and global layers reports the local group's blocks: the allocator gets both groups, and a
    request fits the smaller one (its prompt takes all its local blocks before any goes back)."""
    info = replace(fake_info(), layer_windows=(16, 16, 0))
    limits = derive_limits(config(), info, WarmupResult(8192, 8191, 8192, local_blocks=65), 4096)
    assert limits.kv_groups is not None
    assert (limits.kv_groups.global_blocks, limits.kv_groups.local_blocks, limits.kv_groups.window) == (512, 65, 16)
    assert limits.num_blocks == 512 and limits.max_total_tokens == 64 * 16 + 1
    assert release_window(info.layer_windows, limits.kv_groups) == 16
    assert release_window(info.layer_windows) is None  # one group: a global layer needs every position
    one = derive_limits(config(), info, WarmupResult(8192, 8191, 8192), 4096)
    assert one.kv_groups is None and one.max_total_tokens == 511 * 16 + 1
