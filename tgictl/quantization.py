"""What `--quantize` means, as the shard, the launcher and `tgictl profile` all need it: the methods, their
group sizes and how many bytes a parameter takes. Pure Python, no torch (docs/architecture.md, "Weight
formats"); the formats themselves live in tgictl/kernels/linear_methods/.

- int8: every output row of a projection scaled into [-127, 127] (symmetric, one scale per row).
- int4: groups of `group_size` weights along the input dimension mapped onto 0..15 between the group's
  minimum and maximum, or a narrower range about their middle where that reconstructs the group with
  less squared error (asymmetric: one scale and one zero per group).

The embedding and the LM head (one matrix when tied) are int8 under both: they hold a fifth of a small
model's weights, and llama.cpp's 4-bit files keep them at 6-8 bits as well.
"""

from __future__ import annotations

from dataclasses import dataclass

from tgictl.errors import ConfigError

QUANTIZE_METHODS: tuple[str, ...] = ("int8", "int4")
# torch's int4 kernel takes these group sizes; the C kernels take any multiple of 32.
INT4_GROUP_SIZES: tuple[int, ...] = (32, 64, 128, 256)
DEFAULT_INT4_GROUP_SIZE = 32
# The vocabulary matrices' method under every --quantize (see the module docstring).
VOCAB_METHOD = "int8"


@dataclass(frozen=True)
class QuantizeSpec:
    """`--quantize METHOD [--quantize-group-size G]`: how a safetensors model is quantized at load."""

    method: str
    group_size: int = DEFAULT_INT4_GROUP_SIZE  # int4 only

    def __post_init__(self) -> None:
        if self.method not in QUANTIZE_METHODS:
            raise ConfigError(f"--quantize must be one of {', '.join(QUANTIZE_METHODS)}, got {self.method!r}")
        if self.group_size not in INT4_GROUP_SIZES:
            raise ConfigError(
                f"--quantize-group-size must be one of {', '.join(map(str, INT4_GROUP_SIZES))}, got {self.group_size}"
            )

    @property
    def label(self) -> str:
        """How logs and reports name it: `int8`, `int4/g64`."""
        return f"int4/g{self.group_size}" if self.method == "int4" else self.method

    def projection_bytes(self, in_features: int, scale_bytes: int) -> float:
        """Bytes per weight of a projection with `in_features` inputs, scales in `scale_bytes` each."""
        if self.method == "int8":
            return 1.0 + scale_bytes / in_features  # one scale per output row
        groups = -(-in_features // self.group_size)
        return groups * self.group_size / (2 * in_features) + 2 * scale_bytes * groups / in_features

    def vocab_bytes(self, hidden_size: int, scale_bytes: int) -> float:
        """Bytes per weight of the embedding / LM head (int8 rows)."""
        return 1.0 + scale_bytes / hidden_size


def quantize_spec(method: str | None, group_size: int | None) -> QuantizeSpec | None:
    """The spec of the `--quantize` / `--quantize-group-size` flags; a group size needs int4."""
    if method is None:
        if group_size is not None:
            raise ConfigError("--quantize-group-size needs --quantize int4")
        return None
    if group_size is not None and method != "int4":
        raise ConfigError(f"--quantize-group-size applies to int4 only, not {method}")
    return QuantizeSpec(method, group_size if group_size is not None else DEFAULT_INT4_GROUP_SIZE)
