"""Every option of every command, given a bad value, is refused in one line that names the flag the user
typed (`Error: --num-shard must be >= 1, got 0`), with exit code 2, before anything is loaded or started.

The walk covers every option the commands declare: an option needs a bad case below, or the reason no
value of it is refused up front (checked later by what uses it, with the test that covers that). The
runtime entry points are replaced by a function that fails the test: a bad value that got through the
flag checks is reported as such instead of starting servers.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import typer

from tgictl.cli import build_app, main

# Arguments every case of a command starts with (its required ones).
BASE_ARGS: dict[str, list[str]] = {"download": ["owner/model"], "convert": ["model.gguf"],
                                   "bench": ["--url", "http://127.0.0.1:9"]}

# Flag -> the arguments that give it a bad value (the flag first), for every command that has it; a str
# says why no value is refused before the command runs.
CASES: dict[str, list[str] | str] = {
    "--model-id": ["--model-id", " "],
    "--revision": "any revision is asked of the hub (tests/unit/runtime/model_files/test_resolve.py)",
    "--num-shard": ["--num-shard", "0"],
    "--dtype": ["--dtype", "float64"],
    "--block-size": ["--block-size", "0"],
    "--max-input-tokens": ["--max-input-tokens", "0"],
    "--max-total-tokens": ["--max-total-tokens", "0"],
    "--max-batch-prefill-tokens": ["--max-batch-prefill-tokens", "0"],
    "--max-batch-total-tokens": ["--max-batch-total-tokens", "0"],
    "--max-batch-size": ["--max-batch-size", "0"],
    "--kv-cache-memory": ["--kv-cache-memory", "lots"],
    "--kv-cache-dtype": ["--kv-cache-dtype", "int4"],
    "--cuda-memory-fraction": ["--cuda-memory-fraction", "1.5"],
    "--quantize": ["--quantize", "int3"],
    "--quantize-group-size": ["--quantize-group-size", "48", "--quantize", "int4"],
    "--replicas": ["--replicas", "0"],
    "--replica-cpus": ["--replica-cpus", "0-3"],  # without --replicas 2 or more
    "--uds-path": ["--uds-path", "relative/server"],
    "--shard-uds-path": ["--shard-uds-path", "relative/server"],
    "--otlp-endpoint": ["--otlp-endpoint", " "],
    "--otlp-service-name": ["--otlp-service-name", " "],
    "--speculate": ["--speculate", "17"],
    "--speculate-ngram-min": ["--speculate-ngram-min", "0"],
    "--speculate-ngram-max": ["--speculate-ngram-max", "17"],
    "--speculate-max-batch": ["--speculate-max-batch", "0"],
    "--health-step-timeout": ["--health-step-timeout", "0"],
    "--lora-adapters": ["--lora-adapters", "tgi=/adapters/a"],
    "--master-shard-uds-path": "connected to at start-up (tests/unit/commands/test_router_command.py)",
    "--tokenizer-name": "resolved like a model id at start-up (tests/unit/runtime/model_files/test_resolve.py)",
    "--served-model-name": ["--served-model-name", " "],
    "--model-path": ["--model-path", " "],
    "--hostname": "resolved and bound before the shards start (tests/unit/runtime/launcher/test_supervisor.py)",
    "--port": ["--port", "70000"],
    "--graceful-termination-timeout": ["--graceful-termination-timeout", "-1"],
    "--max-concurrent-requests": ["--max-concurrent-requests", "0"],
    "--decode-steps": ["--decode-steps", "0"],
    "--decode-call-ms": ["--decode-call-ms", "-1"],
    "--prefill-group-tokens": ["--prefill-group-tokens", "-1"],
    "--max-best-of": ["--max-best-of", "0"],
    "--max-stop-sequences": ["--max-stop-sequences", "-1"],
    "--max-top-n-tokens": ["--max-top-n-tokens", "-1"],
    "--max-client-batch-size": ["--max-client-batch-size", "0"],
    "--api-key": ["--api-key", ""],
    "--cors-allow-origin": "any origin text is compared with the request's Origin header",
    "--payload-limit": ["--payload-limit", "0"],
    "--http-header-timeout": ["--http-header-timeout", "0"],
    "--http-body-timeout": ["--http-body-timeout", "0"],
    "--max-connections": ["--max-connections", "0"],
    "--validation-workers": ["--validation-workers", "0"],
    "--kv-events-endpoint": "bound or connected by ZMQ at start-up (tests/unit/runtime/router/test_kv_event_publisher.py)",
    "--kv-events-replay-endpoint": ["--kv-events-replay-endpoint", "tcp://*:5558"],  # without --kv-events-endpoint
    "--kv-events-topic": ["--kv-events-topic", "kv"],  # without --kv-events-endpoint
    "--reasoning-parser": ["--reasoning-parser", "o1"],
    "--master-addr": ["--master-addr", " "],
    "--master-port": ["--master-port", "70000"],
    "--gateway-policy": ["--gateway-policy", "fastest"],
    "--scheduling-policy": ["--scheduling-policy", "lifo"],
    "--local-dir": "any directory; created when the download writes",
    "--output": "written when the command ends; an unwritable path fails then, naming --output",
    "--url": ["--url", "127.0.0.1:8080"],
    "--shard": ["--shard", "/tmp/tgictl-bench/s-0"],  # beside the base --url: exactly one is allowed
    "--api": ["--api", "grpc"],
    "--tokenizer": "loaded when the workload is built (tests/integration/test_bench_http.py)",
    "--workload": ["--workload", "zipf"],
    "--input-len": ["--input-len", "5:4"],
    "--output-len": ["--output-len", "0"],
    "--prefix-len": ["--prefix-len", "0"],
    "--groups": ["--groups", "0"],
    "--prompts-per-group": ["--prompts-per-group", "0"],
    "--dataset": ["--dataset", "prompts.jsonl"],  # without --workload file
    "--concurrency": ["--concurrency", "1,0"],
    "--request-rate": ["--request-rate", "0"],
    "--num-requests": ["--num-requests", "0"],
    "--duration": ["--duration", "0"],
    "--warmup": ["--warmup", "-1"],
    "--slo": ["--slo", "itl=1"],
    "--seed": "any integer seeds the workload",
    "--report": "written when the runs end; an unwritable path fails then, naming --report",
    "--request-timeout": ["--request-timeout", "0"],
    "--batch-size": ["--batch-size", "4,0"],
    "--sequence-length": ["--sequence-length", "0"],
    "--decode-length": ["--decode-length", "0"],
    "--runs": ["--runs", "0"],
    "--warmups": ["--warmups", "-1"],
}
# Where one command reads a flag differently from the others.
COMMAND_CASES: dict[tuple[str, str], list[str] | str] = {
    ("bench", "--model-id"): "names the tokenizer, loaded when the workload is built",
    ("bench", "--api-key"): "sent as the Bearer token; the server judges it",
    # launch makes a relative path absolute: too long is what it refuses.
    ("launch", "--shard-uds-path"): ["--shard-uds-path", "/tmp/" + "s" * 100],
}

# What each command runs once its flags are checked (patched: the walk must never get there).
RUNTIME_ENTRY_POINTS: tuple[tuple[str, str], ...] = (
    ("tgictl.runtime.model_files.resolve", "resolve_model"),
    ("tgictl.runtime.model_files.resolve", "download_model"),
    ("tgictl.runtime.model_files.convert", "convert"),
    ("tgictl.commands.profile", "_resolve"),
    ("tgictl.runtime.shard.server", "serve"),
    ("tgictl.runtime.router.http.serve", "run_router"),
    ("tgictl.runtime.launcher.supervisor", "launch"),
    ("tgictl.runtime.bench.load_test", "run_http_bench"),
    ("tgictl.runtime.bench.static_batches", "run_shard_bench"),
)


def _options() -> list[tuple[str, str]]:
    """(command, flag) for every option that takes a value (on/off flags take none that could be bad)."""
    group = typer.main.get_command(build_app())
    return [(name, param.opts[0]) for name, command in group.commands.items()  # type: ignore[attr-defined]
            for param in command.params if param.param_type_name == "option" and not param.is_flag]


def _case(command: str, flag: str) -> list[str] | str | None:
    return COMMAND_CASES.get((command, flag), CASES.get(flag))


OPTIONS = _options()
BAD_CASES = [(command, flag, case) for command, flag in OPTIONS
             if isinstance(case := _case(command, flag), list)]


class ReachedTheRuntime(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _no_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TGICTL_LOG_LEVEL", "info")  # main() exports these; monkeypatch restores them
    monkeypatch.setenv("TGICTL_JSON_OUTPUT", "0")
    for variable in ("SPECULATE", "LORA_ADAPTERS", "TGICTL_API_KEY", "PREFIX_CACHING"):
        monkeypatch.delenv(variable, raising=False)

    def reached(*args: Any, **kwargs: Any) -> None:
        raise ReachedTheRuntime("the flags were accepted and the command started its work")

    # Every module first: one imported while another's function is patched would keep the patch for good.
    modules = [importlib.import_module(module) for module, _ in RUNTIME_ENTRY_POINTS]
    for module, (_, name) in zip(modules, RUNTIME_ENTRY_POINTS):
        monkeypatch.setattr(module, name, reached)


def test_every_option_has_a_bad_case_or_a_reason() -> None:
    missing = [f"{command} {flag}" for command, flag in OPTIONS if _case(command, flag) is None]
    assert not missing, f"add a bad value (or the reason there is none) to CASES for: {', '.join(missing)}"
    assert len(BAD_CASES) > 100  # every command's checks, the shared flags once per command


@pytest.mark.parametrize(("command", "flag", "case"), BAD_CASES, ids=[f"{c} {f}" for c, f, _ in BAD_CASES])
def test_a_bad_value_is_one_line_naming_the_flag(
    command: str, flag: str, case: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([command, *BASE_ARGS.get(command, []), *case])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("Error: "), captured.err
    assert flag in lines[0], f"the error does not name {flag}: {lines[0]}"
    assert captured.out == ""


def test_the_values_the_cases_change_are_accepted_otherwise(capsys: pytest.CaptureFixture[str]) -> None:
    """The base arguments alone pass every check: each case above fails for its own flag only."""
    for command in ("download", "convert", "profile", "shard", "router", "launch", "bench"):
        with pytest.raises(ReachedTheRuntime):
            main([command, *BASE_ARGS.get(command, [])])
