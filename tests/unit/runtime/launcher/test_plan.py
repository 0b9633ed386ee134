"""The command lines and environments `tgictl launch` gives its children, the router flag mapping
checked against the real `tgictl router` command, and the parsing of children's log lines."""

from __future__ import annotations

import logging
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import typer

from tgictl.commands.router import router as router_command
from tgictl.config import LaunchConfig, LogConfig, RouterConfig
from tgictl.errors import ConfigError
from tgictl.runtime.launcher.child import LogLine, describe_exit, parse_line
from tgictl.runtime.launcher.plan import (
    ROUTER_FIELDS_WITHOUT_FLAG,
    ROUTER_FLAGS,
    ROUTER_SECRETS,
    build_plan,
    router_argv,
)

MODEL = Path("/models/tiny")
BASE = Path("/tmp/tgictl-test/shard")


def router_config(**kwargs: object) -> RouterConfig:
    return RouterConfig(master_shard_uds_path="", tokenizer_name="org/model", **kwargs)  # type: ignore[arg-type]


def router_command_flags() -> set[str]:
    command = typer.main.get_command(_single_command_app())
    # typer may vendor its own click, so options are recognised by kind, not by class.
    return {opt for param in command.params if param.param_type_name == "option" for opt in param.opts}


def _single_command_app() -> typer.Typer:
    app = typer.Typer()
    app.command()(router_command)
    return app


def test_every_router_option_maps_to_a_flag_tgictl_router_accepts() -> None:
    names = {f.name for f in fields(RouterConfig)}
    assert set(ROUTER_FLAGS) | ROUTER_FIELDS_WITHOUT_FLAG == names
    assert not set(ROUTER_FLAGS) & ROUTER_FIELDS_WITHOUT_FLAG
    assert set(ROUTER_FLAGS.values()) <= router_command_flags()
    assert set(ROUTER_SECRETS) <= set(ROUTER_FLAGS)  # `tgictl router` takes them as flags too


def test_router_argv_passes_launcher_owned_flags_and_only_changed_options() -> None:
    default = router_config()
    assert router_argv(default) == [
        "--master-shard-uds-path", "", "--tokenizer-name", "org/model", "--hostname", "127.0.0.1",
        "--port", "8080", "--graceful-termination-timeout", "90.0", "--prefix-caching",
    ]  # fmt: skip
    # The served name is passed whenever it is set (the launcher always sets it).
    assert router_argv(router_config(served_model_name="org/model"))[4:6] == ["--served-model-name", "org/model"]
    changed = router_config(
        port=9000, max_total_tokens=512, max_input_tokens=500, api_key="k", cors_allow_origin=("a", "b"),
        prefix_caching=False,
    )
    assert router_argv(changed)[8:] == [
        "--graceful-termination-timeout", "90.0", "--max-input-tokens", "500", "--max-total-tokens", "512",
        "--no-prefix-caching", "--cors-allow-origin", "a", "--cors-allow-origin", "b",
    ]  # fmt: skip


def test_build_plan_gives_each_rank_its_rendezvous_and_the_router_rank_0s_socket() -> None:
    config = LaunchConfig(
        router=router_config(port=9001, graceful_termination_timeout_s=7.0, hostname="0.0.0.0"),
        model_id="org/model", num_shard=2, dtype="float32", block_size=8, kv_cache_memory=1 << 20,
        master_addr="10.0.0.1",
    )  # fmt: skip
    parent_env = {"PATH": "/bin", "RANK": "5", "MASTER_PORT": "1", "TGICTL_JSON_OUTPUT": "0"}
    plan = build_plan(config, MODEL, BASE, LogConfig(level="debug"), parent_env, master_port=29600, cpu_count=5)

    assert plan.socket_paths == (Path("/tmp/tgictl-test/shard-0"), Path("/tmp/tgictl-test/shard-1"))
    for rank, spec in enumerate(plan.shards):
        assert (spec.role, spec.rank, spec.label) == ("shard", rank, f"shard {rank}")
        assert spec.argv == (
            sys.executable, "-m", "tgictl", "shard", "--model-id", str(MODEL), "--uds-path", str(BASE),
            "--block-size", "8", "--dtype", "float32", "--kv-cache-memory", str(1 << 20),
            # Always explicit: a shard never reads $SPECULATE again.
            "--speculate", "0", "--speculate-ngram-min", "1", "--speculate-ngram-max", "3",
            "--speculate-max-batch", "4",
        )  # fmt: skip
        assert spec.env == {
            "PATH": "/bin", "TGICTL_LOG_LEVEL": "debug", "TGICTL_JSON_OUTPUT": "1", "PYTHONUNBUFFERED": "1",
            "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29600",
            "OMP_NUM_THREADS": "2",  # 5 cores shared by 2 shards
        }  # fmt: skip
    assert plan.router.argv == (
        sys.executable, "-m", "tgictl", "router", "--master-shard-uds-path", "/tmp/tgictl-test/shard-0",
        "--tokenizer-name", str(MODEL), "--served-model-name", "org/model", "--hostname", "0.0.0.0", "--port", "9001",
        "--graceful-termination-timeout", "7.0", "--prefix-caching",
    )  # fmt: skip
    # The router must not join the rendezvous: no RANK/MASTER_* reach it.
    assert plan.router.env == {"PATH": "/bin", "TGICTL_LOG_LEVEL": "debug", "TGICTL_JSON_OUTPUT": "1",
                               "PYTHONUNBUFFERED": "1"}
    assert plan.router_address == ("127.0.0.1", 9001)  # a wildcard bind is probed on loopback
    assert plan.graceful_termination_timeout_s == 7.0


def test_the_router_serves_the_model_under_the_users_name() -> None:
    """The router reads the tokenizer from the resolved directory (a path deep in the HF cache) but
    /info, /v1/models and OpenAI responses name the model as the user asked for it."""
    asked = LaunchConfig(router=router_config(), model_id="HuggingFaceTB/SmolLM2-135M-Instruct")
    plan = build_plan(asked, MODEL, BASE, LogConfig(), {}, master_port=1)
    argv = plan.router.argv
    assert argv[argv.index("--tokenizer-name") + 1] == str(MODEL)
    assert argv[argv.index("--served-model-name") + 1] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    chosen = LaunchConfig(router=router_config(served_model_name="tgi"), model_id="org/model")
    argv = build_plan(chosen, MODEL, BASE, LogConfig(), {}, master_port=1).router.argv
    assert argv[argv.index("--served-model-name") + 1] == "tgi"


def test_the_api_key_reaches_the_router_through_its_environment_never_argv() -> None:
    """`ps` shows every process's command line to every local user; its environment only to its owner."""
    key = "s3cret-key"
    config = LaunchConfig(router=router_config(api_key=key), num_shard=2)
    # An inherited key must not reach the shards, and the router gets the configured one.
    plan = build_plan(config, MODEL, BASE, LogConfig(), {"TGICTL_API_KEY": "inherited"}, master_port=1)
    assert not any(key in arg for arg in plan.router.argv)
    assert "--api-key" not in plan.router.argv
    assert plan.router.env["TGICTL_API_KEY"] == key
    for spec in (*plan.shards, plan.router):
        assert not any(key in arg for arg in spec.argv)
        assert key not in repr(spec)
    assert ["TGICTL_API_KEY" in spec.env for spec in plan.shards] == [False, False]
    # No key configured: none is passed on, whatever this process inherited.
    open_config = LaunchConfig(router=router_config())
    plan = build_plan(open_config, MODEL, BASE, LogConfig(), {"TGICTL_API_KEY": "inherited"}, master_port=1)
    assert "TGICTL_API_KEY" not in plan.router.env and "TGICTL_API_KEY" not in plan.shards[0].env


def test_shard_threads_are_left_alone_for_one_shard_or_when_set() -> None:
    one = LaunchConfig(router=router_config(), num_shard=1)
    two = LaunchConfig(router=router_config(), num_shard=2)
    log_config = LogConfig()
    plan = build_plan(one, MODEL, BASE, log_config, {}, master_port=1, cpu_count=8)
    assert "OMP_NUM_THREADS" not in plan.shards[0].env
    plan = build_plan(two, MODEL, BASE, log_config, {"OMP_NUM_THREADS": "3"}, master_port=1, cpu_count=8)
    assert [spec.env["OMP_NUM_THREADS"] for spec in plan.shards] == ["3", "3"]
    plan = build_plan(two, MODEL, BASE, log_config, {}, master_port=1, cpu_count=1)
    assert [spec.env["OMP_NUM_THREADS"] for spec in plan.shards] == ["1", "1"]
    assert "OMP_NUM_THREADS" not in plan.router.env


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_shard": 0}, "--num-shard must be >= 1, got 0"),
        ({"dtype": "int8"}, "--dtype must be one of float32, bfloat16, float16, got 'int8'"),
        ({"master_port": 70000}, "--master-port must be in 1 .. 65535, got 70000"),
        ({"shard_uds_path": Path("relative/s")}, "--shard-uds-path must be an absolute path, got 'relative/s'"),
        ({"shard_uds_path": Path("/" + "x" * 90)}, "is too long for a Unix socket"),
        ({"model_id": " "}, "--model-id must not be empty"),
    ],
)
def test_launch_config_names_the_bad_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        LaunchConfig(router=router_config(), **kwargs)  # type: ignore[arg-type]


def test_parse_line_keeps_a_json_records_level_and_exception() -> None:
    record = '{"timestamp": "t", "level": "error", "logger": "tgictl.shard", "message": "boom", "pid": 3, ' \
             '"exception": "Traceback...\\nValueError: x"}\n'
    assert parse_line(record, logging.INFO) == LogLine(logging.ERROR, "boom\nTraceback...\nValueError: x")
    # cli.py's one-line error report with --json-output
    assert parse_line('{"level": "error", "error_type": "usage", "message": "bad"}', logging.INFO) == LogLine(
        logging.ERROR, "bad"
    )
    assert parse_line('{"level": "warning", "message": "w"}', logging.INFO) == LogLine(logging.WARNING, "w")


def test_parse_line_falls_back_for_plain_and_odd_lines() -> None:
    assert parse_line("Traceback (most recent call last):\n", logging.WARNING) == LogLine(
        logging.WARNING, "Traceback (most recent call last):"
    )
    assert parse_line("{not json", logging.INFO) == LogLine(logging.INFO, "{not json")
    assert parse_line('{"level": "info"}', logging.INFO) == LogLine(logging.INFO, '{"level": "info"}')
    assert parse_line('{"level": "loud", "message": "m"}', logging.INFO) == LogLine(logging.INFO, "m")


def test_describe_exit() -> None:
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(-15) == "was killed by SIGTERM"


def test_tracing_reaches_the_router_and_every_shard_under_their_service_names() -> None:
    config = LaunchConfig(router=router_config(otlp_endpoint="http://127.0.0.1:4317", otlp_service_name="llm.router"),
                          model_id="org/model", num_shard=2)
    plan = build_plan(config, MODEL, BASE, LogConfig(), {}, master_port=29600)
    assert plan.router.argv[-4:] == ("--otlp-endpoint", "http://127.0.0.1:4317", "--otlp-service-name", "llm.router")
    for spec in plan.shards:
        assert spec.argv[-4:] == ("--otlp-endpoint", "http://127.0.0.1:4317", "--otlp-service-name", "llm.shard")
    untraced = build_plan(LaunchConfig(router=router_config(), model_id="org/model"), MODEL, BASE, LogConfig(), {},
                          master_port=29600)
    assert "--otlp-endpoint" not in untraced.shards[0].argv + untraced.router.argv


def test_every_shard_gets_the_resolved_lora_adapters() -> None:
    from tgictl.config import LoraAdapterSpec

    adapters = (LoraAdapterSpec("sql", "/adapters/sql"), LoraAdapterSpec("org/chat", "/cache/chat"))
    config = LaunchConfig(router=router_config(), model_id="org/model", num_shard=2, lora_adapters=adapters)
    plan = build_plan(config, MODEL, BASE, LogConfig(), {}, master_port=29600)
    for shard in plan.shards:
        flag = shard.argv.index("--lora-adapters")
        assert shard.argv[flag + 1] == "sql=/adapters/sql,org/chat=/cache/chat"


def test_batch_invariance_reaches_every_shard_only_when_asked() -> None:
    config = LaunchConfig(router=router_config(), model_id="org/model", num_shard=2, batch_invariant=True)
    plan = build_plan(config, MODEL, BASE, LogConfig(), {}, master_port=29600)
    assert all("--batch-invariant" in shard.argv for shard in plan.shards)
    default = build_plan(LaunchConfig(router=router_config(), model_id="org/model"), MODEL, BASE, LogConfig(), {},
                         master_port=29600)
    assert "--batch-invariant" not in default.shards[0].argv
