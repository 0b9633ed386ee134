#!/usr/bin/env bash
# Regenerates the committed Python code for tgictl/proto/generate.proto.
#
# Usage: scripts/gen_proto.sh [OUT_DIR]   (default: tgictl/proto, i.e. overwrite the committed files)
# PYTHON selects the interpreter (default: python); it needs grpcio-tools.
# tests/unit/proto/test_generated_up_to_date.py runs this into a temp dir and diffs the result.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
proto_dir="${repo_root}/tgictl/proto"
out_dir="${1:-${proto_dir}}"
python_bin="${PYTHON:-python}"

mkdir -p "${out_dir}"
"${python_bin}" -m grpc_tools.protoc \
  --proto_path="${proto_dir}" \
  --python_out="${out_dir}" \
  --pyi_out="${out_dir}" \
  --grpc_python_out="${out_dir}" \
  generate.proto

# protoc writes a top-level `import generate_pb2`, which only works with tgictl/proto on sys.path;
# the package-absolute import works wherever tgictl is importable.
stub="${out_dir}/generate_pb2_grpc.py"
sed -i 's/^import generate_pb2 as generate__pb2$/from tgictl.proto import generate_pb2 as generate__pb2/' "${stub}"
if ! grep -q '^from tgictl.proto import generate_pb2 as generate__pb2$' "${stub}"; then
  echo "gen_proto.sh: the import fix-up did not match; protoc's output format changed" >&2
  exit 1
fi
