"""Where models come from: the hub, `tgictl download` and `tgictl convert`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tgictl.env import Env
from tgictl.errors import ConfigError

CONVERT_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def check_model_id(model_id: str) -> None:
    """--model-id as every command that takes one checks it before resolving it."""
    if not model_id.strip():
        raise ConfigError("--model-id must not be empty")


@dataclass(frozen=True)
class HubConfig:
    """Where and how models are resolved and fetched from the Hugging Face hub."""

    hub_cache_dir: Path  # huggingface_hub's repository cache (HF_HUB_CACHE / HF_HOME/hub)
    cache_dir: Path  # tgictl's own cache (converted models)
    offline: bool = False
    endpoint: str | None = None
    token: str | None = None
    # Seconds to wait for the hub's metadata answer. Short on purpose: an unreachable hub must turn
    # into an error within seconds, never a hang.
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError(f"HF_HUB_ETAG_TIMEOUT must be > 0 seconds, got {self.timeout_s}")

    def __repr__(self) -> str:  # keep the token out of logs and tracebacks
        return (
            f"HubConfig(hub_cache_dir={self.hub_cache_dir!r}, cache_dir={self.cache_dir!r}, "
            f"offline={self.offline}, endpoint={self.endpoint!r}, token={'***' if self.token else None}, "
            f"timeout_s={self.timeout_s})"
        )

    @classmethod
    def from_env(cls, env: Env) -> HubConfig:
        return cls(
            hub_cache_dir=env.hub_cache_dir,
            cache_dir=env.cache_dir,
            offline=env.hf_hub_offline,
            endpoint=env.hf_endpoint,
            token=env.hf_token,
            timeout_s=env.hf_hub_etag_timeout if env.hf_hub_etag_timeout is not None else 5.0,
        )


@dataclass(frozen=True)
class DownloadConfig:
    model_id: str
    revision: str | None = None
    local_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.model_id.strip():
            raise ConfigError("MODEL_ID must not be empty")


@dataclass(frozen=True)
class ConvertConfig:
    """`dtype` None keeps a PyTorch checkpoint's own dtypes; GGUF (quantized) then becomes float32."""

    path: Path
    dtype: str | None = None
    output: Path | None = None  # None: next to the input, or under cache_dir when that is an installed package
    force: bool = False
    cache_dir: Path | None = None  # tgictl's cache (Env.cache_dir); where outputs go that must not go next to the input

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in CONVERT_DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(CONVERT_DTYPES)}, got {self.dtype!r}")
