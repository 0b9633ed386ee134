"""The shard's default dtype: bfloat16 where bf16 math is native (CUDA, AVX512-BF16/AMX CPUs), else float32."""

from pathlib import Path

import torch

from tgictl.runtime.shard import runtime
from tgictl.runtime.shard.runtime import _cpu_has_native_bf16, default_dtype

FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw {extra}\nbogomips\t: 4000\n"


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(FLAGS.format(extra="avx512_bf16 avx512_vnni"))
    assert _cpu_has_native_bf16(cpuinfo) is True
    cpuinfo.write_text(FLAGS.format(extra="amx_tile amx_bf16"))
    assert _cpu_has_native_bf16(cpuinfo) is True
    cpuinfo.write_text(FLAGS.format(extra="avx512_vnni"))  # bf16 only emulated: float32 is as fast
    assert _cpu_has_native_bf16(cpuinfo) is False
    assert _cpu_has_native_bf16(tmp_path / "missing") is False


def test_default_dtype_per_device(monkeypatch) -> None:  # noqa: ANN001
    assert default_dtype(torch.device("cuda")) == "bfloat16"
    monkeypatch.setattr(runtime, "_cpu_has_native_bf16", lambda: True)
    assert default_dtype(torch.device("cpu")) == "bfloat16"
    monkeypatch.setattr(runtime, "_cpu_has_native_bf16", lambda: False)
    assert default_dtype(torch.device("cpu")) == "float32"
