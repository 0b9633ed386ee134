"""LoRA adapter resolution, as models are resolved (resolve.py): a local PEFT directory is used as it
is; a hub id comes from the HF cache, or is downloaded (adapter_config.json and
adapter_model.safetensors only) unless HF_HUB_OFFLINE=1. Whether the files fit the base model is the
shard's check at load (runtime/shard/lora/adapter_files.py)."""

from __future__ import annotations

from pathlib import Path

from tgictl.config import HubConfig, LoraAdapterSpec
from tgictl.errors import ModelNotFoundError
from tgictl.log import get_logger
from tgictl.runtime.model_files.resolve import _REPO_ID, _at, _hub_error

log = get_logger(__name__)

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def resolve_adapter(spec: LoraAdapterSpec, hub: HubConfig) -> Path:
    """The local directory of one adapter; ModelNotFoundError naming the adapter otherwise."""
    local = Path(spec.source).expanduser()
    if local.is_dir():
        return local.absolute()
    if not _REPO_ID.match(spec.source):
        raise ModelNotFoundError(
            f"LoRA adapter {spec.name!r}: {spec.source!r} is neither a directory nor a hub id (owner/name)"
        )
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    cached = try_to_load_from_cache(spec.source, ADAPTER_FILES[0], cache_dir=hub.hub_cache_dir, revision=spec.revision)
    if isinstance(cached, str) and (Path(cached).parent / ADAPTER_FILES[1]).is_file():
        return Path(cached).parent
    if hub.offline:
        raise ModelNotFoundError(
            f"LoRA adapter {spec.source!r}{_at(spec.revision)} is not in the Hugging Face cache "
            f"({hub.hub_cache_dir}) and HF_HUB_OFFLINE=1 forbids downloading it"
        )
    log.info("downloading LoRA adapter %s", spec.source)
    try:
        return Path(
            snapshot_download(
                spec.source, revision=spec.revision, cache_dir=hub.hub_cache_dir, allow_patterns=list(ADAPTER_FILES),
                token=hub.token, endpoint=hub.endpoint, etag_timeout=hub.timeout_s,
            )
        )
    except Exception as err:  # noqa: BLE001 - every hub failure becomes one readable error
        raise _hub_error(spec.source, spec.revision, hub, err) from None


def resolve_adapters(specs: tuple[LoraAdapterSpec, ...], hub: HubConfig) -> tuple[LoraAdapterSpec, ...]:
    """Every adapter with its source replaced by its local directory."""
    return tuple(LoraAdapterSpec(s.name, str(resolve_adapter(s, hub))) for s in specs)
