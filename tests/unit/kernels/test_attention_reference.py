import torch

from tgictl.kernels import attention_reference


def test_reference_matches_naive_dense_attention(base_spec, make_case, naive) -> None:
    case = make_case(base_spec)
    out = attention_reference(case.query, case.key_cache, case.value_cache, case.meta, case.scale)
    assert out.shape == case.query.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, naive(case), atol=1e-5, rtol=0)


def test_reference_applies_softcap(base_spec, make_case, naive) -> None:
    case = make_case(base_spec)
    args = (case.query, case.key_cache, case.value_cache, case.meta, case.scale)
    soft = attention_reference(*args, softcap=0.5)
    torch.testing.assert_close(soft, naive(case, softcap=0.5), atol=1e-5, rtol=0)
    plain = attention_reference(*args)
    assert not torch.allclose(soft, plain, atol=1e-3)


def test_reference_keeps_bf16_dtype_and_matches_float32_math(base_spec, make_case, naive) -> None:
    case = make_case(base_spec, torch.bfloat16)
    out = attention_reference(case.query, case.key_cache, case.value_cache, case.meta, case.scale)
    assert out.dtype == torch.bfloat16
    # naive() upcasts the same bf16 inputs, so the only difference is the final rounding to bf16
    torch.testing.assert_close(out.float(), naive(case), atol=1e-2, rtol=1e-2)
