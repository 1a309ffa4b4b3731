#!/usr/bin/env bash
# Read-only check of kallot's node agent on a real GPU machine: NVML discovery (the inventory and
# node labels the agent would publish), the DRA ResourceSlices the driver would publish (printed,
# not published; no MIG instance is created), NVML's MIG placements next to kallot.core.mig's, a
# dry run of the live MIG re-layout (what --mig-reconfigure would destroy and create; nothing is
# changed) and one scrape of the exporter's /metrics.
#
#   bash scripts/gpu-check.sh            # uses .venv/bin/kallot if present, else `kallot` on PATH
#
# It changes no GPU setting: no MIG changes, no resets, no clocks or power limits, no
# persistence mode. It only reads through NVML (nvidia-ml-py) and serves /metrics on a loopback
# port for the one scrape. Exit status: 0 ok, 2 no NVIDIA driver / NVML.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KALLOT="${KALLOT:-${ROOT}/.venv/bin/kallot}"
if [[ ! -x "${KALLOT}" ]]; then
	KALLOT="$(command -v kallot || true)"
fi
if [[ -z "${KALLOT}" ]]; then
	echo "gpu-check: kallot is not installed (make venv, or pip install -e .)" >&2
	exit 2
fi
if ! { ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1'; } && ! command -v nvidia-smi >/dev/null 2>&1; then
	echo "gpu-check: no NVIDIA driver found (libnvidia-ml.so.1 / nvidia-smi); run this on a GPU machine" >&2
	exit 2
fi
if command -v nvidia-smi >/dev/null 2>&1; then
	echo "== nvidia-smi (for comparison; read-only queries)"
	nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,mig.mode.current --format=csv || true
	nvidia-smi topo -m || true
fi
echo "== kallot agent inventory (NVML discovery)"
"${KALLOT}" agent inventory --format json
echo "== kallot agent inventory (summary)"
"${KALLOT}" agent inventory
echo "== kallot agent inventory --dra (the ResourceSlices the DRA driver would publish; nothing is published)"
"${KALLOT}" agent inventory --dra --node-name "$(hostname)"
"${KALLOT}" agent inventory --dra --format json --node-name "$(hostname)"
echo "== kallot agent inventory --dra --dra-mig static (existing MIG instances only)"
"${KALLOT}" agent inventory --dra --dra-mig static --node-name "$(hostname)"
echo "== MIG placements: NVML's possible placements vs kallot.core.mig (the DRA counters' source; read-only)"
PY="${ROOT}/.venv/bin/python"
[[ -x "${PY}" ]] || PY=python3
"${PY}" -m kallot.node.nvml_mig || echo "gpu-check: some MIG placements differ from kallot.core.mig (see above)"
echo "== MIG re-layout dry run: what --mig-reconfigure would do for one more instance of each profile (busy = a process runs on it; nothing is changed)"
"${PY}" -m kallot.node.nvml_mig --relayout-dry-run || echo "gpu-check: the MIG re-layout dry run failed (see above)"
echo "== one /metrics scrape"
"${KALLOT}" agent metrics
echo "== gpu-check: done (nothing was changed)"
