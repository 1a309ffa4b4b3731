#!/usr/bin/env bash
# Regenerate the node agent's gRPC modules from src/kallot/node/proto/*.proto.
# Run from the repository root: bash tools/gen_protos.sh  (needs grpcio-tools, in the dev extra)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -m grpc_tools.protoc -I src --python_out=src --pyi_out=src --grpc_python_out=src \
  src/kallot/node/proto/*.proto
echo "generated: $(ls src/kallot/node/proto/*_pb2*.py* | tr '\n' ' ')"
