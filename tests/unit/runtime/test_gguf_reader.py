"""The GGUF header reader against gguf-py's own GGUFReader on the real SmolLM2 file and on a tiny file of
every value type; damaged files are one clear error."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from tgictl.runtime.gguf_reader import GGUFFormatError, read_gguf


def test_matches_gguf_py_on_the_packaged_file(smollm2_gguf: Path) -> None:
    ours = read_gguf(smollm2_gguf, arrays=("tokenizer.ggml.merges",))
    theirs = gguf.GGUFReader(str(smollm2_gguf))
    assert [t.name for t in theirs.tensors] == list(ours.tensors)
    for tensor in theirs.tensors:
        info = ours.tensors[tensor.name]
        assert info.ggml_type == int(tensor.tensor_type) and info.dims == tuple(int(d) for d in tensor.shape)
        assert info.nbytes == int(tensor.n_bytes) and np.array_equal(ours.array(tensor.name), tensor.data)
    for key, field in theirs.fields.items():
        value = field.contents()
        if key.startswith("GGUF."):
            continue  # the header's own counts, not key-values
        if field.types[0] == gguf.GGUFValueType.ARRAY and key != "tokenizer.ggml.merges":
            assert ours.fields[key] == len(value), key  # arrays not asked for: their length
        else:
            assert ours.fields[key] == value, key
    assert ours.fields["tokenizer.ggml.merges"][:2] == theirs.fields["tokenizer.ggml.merges"].contents()[:2]


def test_every_value_type_and_float_tensors(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint8("a.u8", 7)
    writer.add_int32("a.i32", -5)
    writer.add_float64("a.f64", 2.5)
    writer.add_bool("a.bool", True)
    writer.add_string("a.str", "héllo")
    writer.add_array("a.ints", [1, 2, 3])
    writer.add_array("a.strs", ["x", "yz"])
    writer.add_tensor("f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("f16", np.arange(8, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_gguf(path, arrays=("a.strs",))
    expected = {"a.u8": 7, "a.i32": -5, "a.f64": 2.5, "a.bool": True, "a.str": "héllo", "a.ints": 3,
                "a.strs": ["x", "yz"], "general.architecture": "llama"}
    assert {k: header.fields[k] for k in expected} == expected
    assert header.tensors["f32"].shape == (3, 4) and np.array_equal(header.array("f32"), np.arange(12).reshape(3, 4))
    assert header.array("f16").dtype == np.float16 and header.array("f16").shape == (8,)


@pytest.mark.parametrize(("content", "message"), [
    (b"", "cannot read"),
    (b"GGML" + bytes(40), "does not start with the GGUF magic"),
    (b"GGUF" + (9).to_bytes(4, "little") + bytes(16), "GGUF version 9"),
    (b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little") + b"\x05",
     "cut short or damaged"),
])
def test_damaged_files_are_format_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFFormatError, match=message):
        read_gguf(path)


def test_truncated_tensor_data(smollm2_gguf: Path, tmp_path: Path) -> None:
    path = tmp_path / "short.gguf"
    path.write_bytes(smollm2_gguf.read_bytes()[:5_000_000])
    with pytest.raises(GGUFFormatError, match="shorter than its tensors say"):
        read_gguf(path)
