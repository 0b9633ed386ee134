"""The serving dtype: bfloat16 where bf16 math is native (CUDA, AVX512-BF16/AMX CPUs), else float32."""

from pathlib import Path

import torch

from tgictl.runtime.hardware import cpu_has_native_bf16, default_serving_dtype, discover_cpu
from tgictl.runtime.shard.runtime import default_dtype

FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw {extra}\nbogomips\t: 4000\n"


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(FLAGS.format(extra="avx512_bf16 avx512_vnni"))
    assert cpu_has_native_bf16(cpuinfo) is True
    assert discover_cpu(cpuinfo_path=cpuinfo).native_bf16 is True
    cpuinfo.write_text(FLAGS.format(extra="amx_tile amx_bf16"))
    assert cpu_has_native_bf16(cpuinfo) is True
    cpuinfo.write_text(FLAGS.format(extra="avx512_vnni"))  # bf16 only emulated: float32 is as fast
    assert cpu_has_native_bf16(cpuinfo) is False
    assert discover_cpu(cpuinfo_path=cpuinfo).native_bf16 is False
    assert cpu_has_native_bf16(tmp_path / "missing") is False


def test_serving_dtype_per_device() -> None:
    assert default_serving_dtype(on_gpu=True, native_bf16=False)[0] == "bfloat16"
    assert default_serving_dtype(on_gpu=False, native_bf16=True)[0] == "bfloat16"
    assert default_serving_dtype(on_gpu=False, native_bf16=False)[0] == "float32"
    assert default_dtype(torch.device("cuda")) == "bfloat16"
    # the shard on this CPU follows the same rule as profile's estimate
    expected = "bfloat16" if cpu_has_native_bf16() else "float32"
    assert default_dtype(torch.device("cpu")) == expected
