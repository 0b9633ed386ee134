"""The committed generate_pb2*.py files are what scripts/gen_proto.sh produces from generate.proto now.

Fix a failure by running `scripts/gen_proto.sh` and committing the result.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PROTO_DIR = REPO / "tgictl" / "proto"
GENERATED = ("generate_pb2.py", "generate_pb2.pyi", "generate_pb2_grpc.py")

# Lines that name the generator's own version. They change with grpcio-tools, not with the proto,
# so a newer toolchain alone does not count as stale.
_VERSION_PATTERNS = (
    (re.compile(r"^# Protobuf Python Version: .*$", re.M), "# Protobuf Python Version: <v>"),
    (re.compile(r"ValidateProtobufRuntimeVersion\([^)]*\)", re.S), "ValidateProtobufRuntimeVersion(<v>)"),
    (re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.M), "GRPC_GENERATED_VERSION = <v>"),
)


def _normalized(text: str) -> str:
    for pattern, replacement in _VERSION_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen_proto")
    subprocess.run(
        ["bash", str(REPO / "scripts" / "gen_proto.sh"), str(out)],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        timeout=120,
    )
    return out


@pytest.mark.parametrize("name", GENERATED)
def test_committed_code_matches_the_proto(regenerated: Path, name: str) -> None:
    committed = _normalized((PROTO_DIR / name).read_text())
    fresh = _normalized((regenerated / name).read_text())
    assert committed == fresh, f"tgictl/proto/{name} is stale: run scripts/gen_proto.sh and commit the result"


def test_stub_imports_the_messages_through_the_package(regenerated: Path) -> None:
    stub = (regenerated / "generate_pb2_grpc.py").read_text()
    assert "\nfrom tgictl.proto import generate_pb2 as generate__pb2\n" in stub
    assert "\nimport generate_pb2" not in stub
