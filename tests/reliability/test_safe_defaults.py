"""Safe defaults, on one `tgictl launch` started as a careless user would (no --hostname,
no --shard-uds-path, the default log level) plus an API key:

- the HTTP server listens on 127.0.0.1 only;
- the API key is required on every route that generates or reveals the model, and compared in
  constant time (hmac.compare_digest, checked in the source);
- the shards' Unix sockets live in a private directory (mode 0700, ours), removed on exit, and a
  shard refuses a socket directory others can write to;
- the payload limit holds with its default value;
- weights are never unpickled (torch.load(weights_only=True) only; .bin directories are refused
  until converted) and remote code is never trusted;
- prompts and outputs never reach the logs at info level.
"""

from __future__ import annotations

import ast
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.launch_procs import REPO_ROOT, LaunchProc, pid_alive
from tests.reliability.support import GREEDY, assert_error_json
from tgictl.config import RouterConfig
from tgictl.runtime.launcher.plan import free_port

KEY = "reliability-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
CANARY_PROMPT = "canary prompt quokka narwhal axolotl 8c1f"
PACKAGE = REPO_ROOT / "tgictl"
GENERATING_POSTS = {
    "/generate": {"inputs": CANARY_PROMPT, "parameters": {**GREEDY, "max_new_tokens": 24}},
    "/generate_stream": {"inputs": CANARY_PROMPT, "parameters": {**GREEDY, "max_new_tokens": 24}},
    "/": {"inputs": CANARY_PROMPT, "parameters": {**GREEDY, "max_new_tokens": 24}},
    "/tokenize": {"inputs": CANARY_PROMPT},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": CANARY_PROMPT}], "max_tokens": 24,
                             "temperature": 0, "ignore_eos": True},
    "/v1/completions": {"prompt": CANARY_PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True},
}
REVEALING_GETS = ("/info", "/v1/models")
OPEN_GETS = ("/health", "/metrics")


@pytest.fixture(scope="module")
def launched(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchProc]:
    work = tmp_path_factory.mktemp("safe-defaults")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("TGICTL_LOG_LEVEL", "LOG_LEVEL", "TGICTL_JSON_OUTPUT")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    command = [sys.executable, "-m", "tgictl", "--json-output", "launch", "--model-id", str(tiny_model_dir),
               "--port", str(port), "--kv-cache-memory", "8MiB", "--max-total-tokens", "512", "--api-key", KEY]
    log_path = work / "launch.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    # The socket base is the launcher's own choice; found below from the shard's command line.
    running = LaunchProc(proc, port, Path("/nonexistent/s"), log_path, num_shard=1)
    try:
        with httpx.Client() as probe:
            running.wait_healthy(probe)
        running.uds_base = Path(shard_arg(running, "--uds-path"))
        yield running
    finally:
        running.stop()


def shard_arg(running: LaunchProc, flag: str) -> str:
    argv = Path(f"/proc/{running.child_pids()['shard 0']}/cmdline").read_bytes().decode().split("\0")
    return argv[argv.index(flag) + 1]


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket in LISTEN state on `port`, from /proc/net/tcp{,6}."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if int(port_hex, 16) == port and state == "0A":  # 0A = LISTEN
                raw = bytes.fromhex(address)
                # /proc prints each 32-bit word in host (little-endian) order.
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, width // 2, 4))
                family = socket.AF_INET if width == 8 else socket.AF_INET6
                found.add(socket.inet_ntop(family, words))
    return found


def test_http_listens_on_loopback_only(launched: LaunchProc) -> None:
    assert listening_addresses(launched.port) == {"127.0.0.1"}
    assert RouterConfig(master_shard_uds_path="x", tokenizer_name="y").hostname == "127.0.0.1"


def test_api_key_guards_every_generating_or_revealing_route(launched: LaunchProc) -> None:
    url = launched.url
    wrong_keys = [{}, {"Authorization": "Bearer"}, {"Authorization": KEY}, {"Authorization": f"Bearer {KEY[:-1]}"},
                  {"Authorization": f"Bearer {KEY}x"}, {"Authorization": f"bearer {KEY}"},
                  {"Authorization": f"Basic {KEY}"}, {"Authorization": "Bearer " + "k" * 10_000},
                  {"Authorization": f"Bearer {KEY}".encode().replace(b"0", b"\xc3\xa9")}]
    sent = 0
    with httpx.Client(base_url=url, timeout=30) as http:
        for headers in wrong_keys:
            for path, body in GENERATING_POSTS.items():
                answer = http.post(path, json=body, headers=headers)
                assert answer.status_code == 401, (path, headers, answer.text)
                assert assert_error_json(401, answer.content, path=path)["error_type"] == "unauthorized"
                sent += 1
            for path in REVEALING_GETS:
                answer = http.get(path, headers=headers)
                assert answer.status_code == 401 and "tiny" not in answer.text, (path, answer.text)
                sent += 1
            # A body of the wrong shape is not validated (which would reveal the limits) before the key.
            wrong_shape = {"inputs": 5, "parameters": {"max_new_tokens": 10**9}}
            answer = http.post("/generate", json=wrong_shape, headers=headers)
            assert answer.status_code == 401, answer.text
            sent += 1
        for path in OPEN_GETS:  # probes and monitoring reveal nothing about the model
            answer = http.get(path)
            assert answer.status_code == 200 and str(launched.log_path.parent) not in answer.text
        for path, body in GENERATING_POSTS.items():
            assert http.post(path, json=body, headers=AUTH).status_code == 200, path
        for path in REVEALING_GETS:
            assert http.get(path, headers=AUTH).status_code == 200, path
    print(f"\napi key: {sent} requests with a missing or wrong key, all 401")


def test_api_key_is_compared_in_constant_time() -> None:
    """The router's key check goes through hmac.compare_digest and nothing compares a key with ==."""
    source = (PACKAGE / "runtime" / "router" / "http" / "app.py").read_text()
    assert "hmac.compare_digest(" in source
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                text = ast.unparse(node)
                assert not re.search(r"api_key|authorization|bearer", text, re.IGNORECASE) or "is None" in text, (
                    f"{path}: {text}"
                )


def test_shard_sockets_live_in_a_private_directory(launched: LaunchProc) -> None:
    directory = launched.uds_base.parent
    info = directory.lstat()
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
    assert info.st_uid == os.getuid()
    assert stat.S_ISSOCK(Path(f"{launched.uds_base}-0").lstat().st_mode)


def test_a_shard_refuses_a_socket_directory_others_can_write(tiny_model_dir: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "tgictl", "shard", "--model-id", str(tiny_model_dir), "--uds-path", str(shared / "s")],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "writable by group or others" in result.stdout + result.stderr
    assert list(shared.iterdir()) == []


def test_the_default_payload_limit_holds(launched: LaunchProc) -> None:
    limit = RouterConfig(master_shard_uds_path="x", tokenizer_name="y").payload_limit
    assert limit == 2_000_000
    body = b'{"inputs": "' + b"a" * limit + b'"}'
    answer = httpx.post(f"{launched.url}/generate", content=body, headers={**AUTH, "content-type": "application/json"},
                        timeout=30)
    assert answer.status_code == 413 and assert_error_json(413, answer.content)["error_type"] == "payload_too_large"


def test_no_prompt_or_output_in_the_logs_at_info_level(launched: LaunchProc) -> None:
    outputs = []
    with httpx.Client(base_url=launched.url, timeout=60, headers=AUTH) as http:
        outputs.append(http.post("/generate", json=GENERATING_POSTS["/generate"]).json()["generated_text"])
        chat = http.post("/v1/chat/completions", json=GENERATING_POSTS["/v1/chat/completions"]).json()
        outputs.append(chat["choices"][0]["message"]["content"])
        # A refused request's error message must not be logged with its input either.
        http.post("/generate", json={"inputs": CANARY_PROMPT, "parameters": {"max_new_tokens": 10_000}})
    log = launched.log()
    assert '"level": "info"' in log and "router" in log, "no info-level records from the children"
    # Both children log into the launcher's stream (router and shard records carry their pid).
    assert {"shard 0", "router"} <= set(launched.child_pids())
    assert CANARY_PROMPT not in log and "quokka" not in log
    for text in outputs:
        assert len(text.strip()) >= 8, f"output too short to search for: {text!r}"
        assert text not in log and text.strip() not in log, text


# --- weights and code ---------------------------------------------------------------------------------


def test_torch_load_is_always_weights_only_and_nothing_unpickles() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
                if name.endswith("torch.load") and keywords.get("weights_only") != "True":
                    offenders.append(f"{path}: {ast.unparse(node)}")
                if name in ("pickle.load", "pickle.loads", "joblib.load", "dill.load"):
                    offenders.append(f"{path}: {ast.unparse(node)}")
                if keywords.get("allow_pickle") == "True" or keywords.get("trust_remote_code") not in (None, "False"):
                    offenders.append(f"{path}: {ast.unparse(node)}")
                if keywords.get("use_safetensors") == "False":
                    offenders.append(f"{path}: {ast.unparse(node)}")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                if any(n in ("pickle", "cPickle", "dill", "joblib") for n in names):
                    offenders.append(f"{path}: imports {names}")
    assert not offenders, offenders


def _evil_checkpoint(path: Path, marker: Path) -> None:
    import torch

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    torch.save({"model.embed_tokens.weight": torch.zeros(2, 2), "boom": Payload()}, path)


def test_a_pickle_checkpoint_never_runs_its_code(tiny_model_dir: Path, tmp_path: Path) -> None:
    from tgictl.errors import ConversionError, ModelNotFoundError
    from tgictl.runtime.model_files.convert_torch import load_state_dict
    from tgictl.runtime.model_files.resolve import resolve_model

    marker = tmp_path / "pwned"
    model = tmp_path / "evil-model"
    model.mkdir()
    (model / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    _evil_checkpoint(model / "pytorch_model.bin", marker)
    with pytest.raises(ModelNotFoundError, match="convert"):  # serving refuses .bin until converted
        resolve_model(str(model))
    with pytest.raises(ConversionError, match="not a PyTorch checkpoint"):  # converting refuses the pickle
        load_state_dict(model / "pytorch_model.bin")
    assert not marker.exists()


def test_remote_code_is_never_trusted(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A model asking for its own code (auto_map + a modeling file) is refused; the file never runs."""
    import json
    import shutil

    import torch

    from tgictl.errors import UnsupportedModelError
    from tgictl.runtime.router.text.tokenizer import RouterTokenizer
    from tgictl.runtime.shard.dist import DistContext
    from tgictl.runtime.shard.models.registry import load_model

    marker = tmp_path / "pwned"
    model = tmp_path / "custom-code-model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="custom_evil", auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
                                                      "AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    (model / "config.json").write_text(json.dumps(config))
    for name in ("modeling_evil.py", "tokenization_evil.py"):
        (model / name).write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = config["auto_map"]
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))

    with pytest.raises(UnsupportedModelError, match="custom_evil"):
        load_model(model, dtype=torch.float32, device=torch.device("cpu"), dist=DistContext.single())
    RouterTokenizer(model).encode("hello")  # the router's tokenizer ignores auto_map
    assert not marker.exists()


def test_nothing_is_left_after_the_launcher_exits(launched: LaunchProc) -> None:
    """Last: the private socket directory goes away with the launcher."""
    directory = launched.uds_base.parent
    pids = launched.child_pids()
    launched.proc.terminate()
    assert launched.wait_exit(timeout_s=120) == 0, launched.log()
    assert not [label for label, pid in pids.items() if pid_alive(pid)]
    assert not directory.exists(), f"{directory} left behind"
