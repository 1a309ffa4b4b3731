#!/usr/bin/env bash
# Builds dra-diff (dra-diff/main.go): the upstream DRA allocator and CEL environment
# (k8s.io/dynamic-resource-allocation at the control plane's version) behind a JSON-lines
# interface, for kallot's differential test (tests/dra/test_dra_differential.py). Its own
# module and its own cache key, so the control plane's key stays untouched.
#
#   bash tools/testenv/build-dra-diff.sh                 build once, then reuse the cached binary
#   bash tools/testenv/build-dra-diff.sh --print-bin-dir print the bin dir, build nothing
#
# Built at nice 10; it shares the Go build cache with build.sh (the same apimachinery, cel-go),
# so after the control plane only the allocator packages compile (~1 min on 2 cores).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${KALLOT_TESTENV_CACHE:-${HOME}/.cache/kallot/testenv}"
die() {
	echo "tools/testenv/build-dra-diff.sh: ERROR: $*" >&2
	exit 1
}
DRA_VERSION="$(awk '$1 == "k8s.io/dynamic-resource-allocation" && $2 ~ /^v/ { print $2; exit }' "${HERE}/dra-diff/go.mod")"
[[ -n "${DRA_VERSION}" ]] || die "cannot read the k8s.io/dynamic-resource-allocation pin from ${HERE}/dra-diff/go.mod"
HASH="$(cat "${HERE}"/dra-diff/go.mod "${HERE}"/dra-diff/go.sum "${HERE}"/dra-diff/main.go | sha256sum | cut -c1-10)"
KEY="dra-diff-${DRA_VERSION}-${HASH}"
OUT="${CACHE_ROOT}/${KEY}"
BIN="${OUT}/bin"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
	echo "${BIN}"
	exit 0
elif [[ $# -gt 0 ]]; then
	die "unknown argument: $1 (usage: build-dra-diff.sh [--print-bin-dir])"
fi
if [[ -x "${BIN}/dra-diff" ]]; then
	echo "testenv: using cached dra-diff in ${BIN}"
	exit 0
fi
command -v go >/dev/null || die "go is not on PATH; install Go >= 1.26"
mkdir -p "${OUT}"
exec 9>"${OUT}/.lock"
if command -v flock >/dev/null; then
	flock 9
	[[ -x "${BIN}/dra-diff" ]] && exit 0
fi
LOG="${OUT}/build.log"
STAGE="${OUT}/bin.partial"
rm -rf "${STAGE}"
mkdir -p "${STAGE}"
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
echo "testenv: building ${KEY} into ${BIN}; log: ${LOG}"
start=${SECONDS}
if ! (cd "${HERE}/dra-diff" && go mod download && nice -n 10 go build -trimpath -ldflags "-s -w" \
	-o "${STAGE}/dra-diff" .) >"${LOG}" 2>&1; then
	tail -n 40 "${LOG}" >&2
	die "build failed after $((SECONDS - start))s; full log: ${LOG}"
fi
echo '{"id":"smoke","cel":"device.driver == \"x\"","device":{"driver":"x"}}' | "${STAGE}/dra-diff" |
	grep -q '"value":true' || die "dra-diff does not answer a smoke case"
rm -rf "${BIN}"
mv "${STAGE}" "${BIN}"
echo "testenv: built dra-diff in $((SECONDS - start))s into ${BIN}"
