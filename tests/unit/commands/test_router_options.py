"""The router options declared once: `tgictl router` and `tgictl launch` show the same flags with the
same defaults and help, and the parsed values become exactly the RouterConfig they describe."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tgictl.commands.launch import launch
from tgictl.commands.router import router
from tgictl.commands.router_options import RouterFlags, with_router_options
from tgictl.config import RouterConfig, SchedulingPolicy
from tgictl.env import Env
from tgictl.runtime.launcher.plan import ROUTER_FLAGS

LAUNCHER_OWNED = {"--master-shard-uds-path", "--tokenizer-name"}
NO_ENV = Env.from_environ({"HOME": "/h"})


def options(command: Any) -> dict[str, Any]:
    """Flag → the click option a command built from `command` accepts."""
    app = typer.Typer()
    app.command()(command)
    params = typer.main.get_command(app).params
    # typer may vendor its own click, so options are recognised by kind, not by class.
    return {param.opts[0]: param for param in params if param.param_type_name == "option"}


def parse(args: list[str]) -> RouterFlags:
    """What a decorated command receives for `args`."""
    received: list[RouterFlags] = []

    @with_router_options
    def probe(*, router_flags: RouterFlags) -> None:
        received.append(router_flags)

    app = typer.Typer()
    app.command()(probe)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return received[0]


def test_both_commands_share_every_router_option_with_the_same_default_and_help() -> None:
    router_options, launch_options = options(router), options(launch)
    shared = set(ROUTER_FLAGS.values()) - LAUNCHER_OWNED
    assert shared <= set(router_options) and shared <= set(launch_options)
    for flag in shared:
        mine, theirs = router_options[flag], launch_options[flag]
        assert (mine.default, mine.help, mine.multiple) == (theirs.default, theirs.help, theirs.multiple), flag
    # Launcher-owned flags stay the router's own; launch's own flags stay launch's.
    assert LAUNCHER_OWNED <= set(router_options) and not LAUNCHER_OWNED & set(launch_options)
    assert "--num-shard" in launch_options and "--num-shard" not in router_options


def test_defaults_are_routerconfigs_own() -> None:
    config = parse([]).config(master_shard_uds_path="/s-0", tokenizer_name="org/model", env=NO_ENV)
    assert config == RouterConfig(master_shard_uds_path="/s-0", tokenizer_name="org/model")


def test_every_flag_reaches_its_field() -> None:
    args = [
        "--served-model-name", "tgi", "--hostname", "0.0.0.0", "--port", "9000",
        "--graceful-termination-timeout", "3.5",
        "--max-concurrent-requests", "7", "--max-input-tokens", "100", "--max-total-tokens", "200",
        "--max-batch-prefill-tokens", "300", "--max-batch-total-tokens", "400", "--max-batch-size", "8",
        "--prefill-group-tokens", "256", "--decode-steps", "2", "--decode-call-ms", "12.5", "--no-prefix-caching",
        "--scheduling-policy", "priority", "--max-best-of", "3",
        "--max-stop-sequences", "6", "--max-top-n-tokens", "10", "--max-client-batch-size", "11",
        "--api-key", "k", "--cors-allow-origin", "https://a.example", "--cors-allow-origin", "https://b.example",
        "--payload-limit", "1000", "--validation-workers", "4", "--http-header-timeout", "3",
        "--http-body-timeout", "4.5", "--max-connections", "50",
        "--otlp-endpoint", "http://127.0.0.1:4317", "--otlp-service-name", "llm.router",
        "--reasoning-parser", "qwen3", "--allow-lora-loading",
        "--kv-events-endpoint", "tcp://*:5557", "--kv-events-replay-endpoint", "tcp://*:5558",
        "--kv-events-topic", "kv@pod@m", "--model-path", "models/m.gguf", "--no-request-log",
    ]  # fmt: skip
    config = parse(args).config(master_shard_uds_path="/s-0", tokenizer_name="t", env=NO_ENV)
    assert config == RouterConfig(
        master_shard_uds_path="/s-0", tokenizer_name="t", served_model_name="tgi", hostname="0.0.0.0", port=9000,
        graceful_termination_timeout_s=3.5, max_concurrent_requests=7, max_input_tokens=100, max_total_tokens=200,
        max_batch_prefill_tokens=300, max_batch_total_tokens=400, max_batch_size=8, prefill_group_tokens=256, decode_steps=2,
        decode_call_ms=12.5, prefix_caching=False, scheduling_policy=SchedulingPolicy.PRIORITY,
        max_best_of=3, max_stop_sequences=6, max_top_n_tokens=10,
        max_client_batch_size=11,
        api_key="k", cors_allow_origin=("https://a.example", "https://b.example"), payload_limit=1000,
        validation_workers=4, otlp_endpoint="http://127.0.0.1:4317", otlp_service_name="llm.router",
        http_header_timeout_s=3.0, http_body_timeout_s=4.5, max_connections=50,
        reasoning_parser="qwen3", allow_lora_loading=True,
        kv_events_endpoint="tcp://*:5557", kv_events_replay_endpoint="tcp://*:5558", kv_events_topic="kv@pod@m",
        model_path="models/m.gguf", request_log=False,
    )  # fmt: skip
    # Every field a flag sets differs from its default above, so none was silently dropped.
    defaults = RouterConfig(master_shard_uds_path="/s-0", tokenizer_name="t")
    flagged = set(ROUTER_FLAGS) - {"master_shard_uds_path", "tokenizer_name"}
    assert {f.name for f in fields(RouterConfig) if getattr(config, f.name) != getattr(defaults, f.name)} == flagged


def test_the_api_key_comes_from_the_environment_unless_the_flag_gives_one() -> None:
    env = Env.from_environ({"HOME": "/h", "TGICTL_API_KEY": "from-env"})
    assert parse([]).config(master_shard_uds_path="/s-0", tokenizer_name="t", env=env).api_key == "from-env"
    flagged = parse(["--api-key", "from-flag"])
    assert "from-flag" not in repr(flagged)
    assert flagged.config(master_shard_uds_path="/s-0", tokenizer_name="t", env=env).api_key == "from-flag"
    assert parse([]).config(master_shard_uds_path="/s-0", tokenizer_name="t", env=NO_ENV).api_key is None


def test_prefix_caching_comes_from_tgis_variable_unless_the_flag_gives_it() -> None:
    off = Env.from_environ({"HOME": "/h", "PREFIX_CACHING": "0"})
    assert parse([]).config(master_shard_uds_path="/s-0", tokenizer_name="t", env=off).prefix_caching is False
    assert parse(["--prefix-caching"]).config(master_shard_uds_path="/s-0", tokenizer_name="t", env=off).prefix_caching
    assert parse([]).config(master_shard_uds_path="/s-0", tokenizer_name="t", env=NO_ENV).prefix_caching is True
    assert not parse(["--no-prefix-caching"]).config(master_shard_uds_path="/s-0", tokenizer_name="t", env=NO_ENV).prefix_caching


def test_a_command_without_router_flags_is_refused() -> None:
    def plain(name: str = typer.Option("x", "--name")) -> None:
        pass

    with pytest.raises(TypeError, match="plain must take a `router_flags: RouterFlags` parameter"):
        with_router_options(plain)
