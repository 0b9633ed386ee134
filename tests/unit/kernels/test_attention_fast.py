"""The dispatched fast path against the reference (the oracle), on fixed layouts and random batches."""

import pytest
import torch

from tgictl.errors import ConfigError, InvalidRequestError
from tgictl.kernels import (
    ATTENTION_BACKENDS,
    attention,
    attention_reference,
    get_attention_backend,
)

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}  # two bf16 roundings (output of each path) apart at most


def _both(case, softcap=None):
    args = (case.query, case.key_cache, case.value_cache, case.meta, case.scale, softcap)
    return attention(*args), attention_reference(*args)


@pytest.mark.parametrize("softcap", [None, 0.7])
def test_fast_matches_reference_float32(base_spec, make_case, naive, softcap) -> None:
    case = make_case(base_spec)
    fast, ref = _both(case, softcap)
    assert fast.shape == case.query.shape and fast.dtype == torch.float32
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast, naive(case, softcap), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fast_matches_reference_half_precision(base_spec, make_case, dtype) -> None:
    case = make_case(base_spec, dtype)
    fast, ref = _both(case)
    assert fast.dtype == dtype
    torch.testing.assert_close(fast.float(), ref.float(), **BF16_TOL)


@pytest.mark.parametrize("seed", range(24))
def test_fast_matches_reference_on_random_batches(seed, make_random_spec, make_case) -> None:
    spec = make_random_spec(seed)
    for dtype, tol in ((torch.float32, {"atol": 1e-5, "rtol": 1e-5}), (torch.bfloat16, BF16_TOL)):
        case = make_case(spec, dtype)
        fast, ref = _both(case, softcap=None if seed % 3 else 1.5)
        torch.testing.assert_close(
            fast.float(), ref.float(), **tol, msg=lambda m: f"{spec.label()} {dtype}: {m}"
        )


def test_backend_registry() -> None:
    assert get_attention_backend() is attention
    assert get_attention_backend("reference") is attention_reference
    assert set(ATTENTION_BACKENDS) == {"torch", "reference"}
    with pytest.raises(ConfigError, match="unknown attention backend 'flash'; known: reference, torch"):
        get_attention_backend("flash")


def test_fast_path_checks_inputs_and_leaves_the_caches_alone(make_case, base_spec) -> None:
    case = make_case(base_spec)
    key_before, value_before = case.key_cache.clone(), case.value_cache.clone()
    attention(case.query, case.key_cache, case.value_cache, case.meta, case.scale)
    assert torch.equal(case.key_cache.isnan(), key_before.isnan())
    assert torch.equal(case.key_cache.nan_to_num(), key_before.nan_to_num())
    assert torch.equal(case.value_cache.nan_to_num(), value_before.nan_to_num())
    with pytest.raises(InvalidRequestError, match="rows but the metadata describes"):
        attention(case.query[1:], case.key_cache, case.value_cache, case.meta, case.scale)
