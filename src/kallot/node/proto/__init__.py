"""Generated gRPC modules for the kubelet APIs (see tools/gen_protos.sh)."""
