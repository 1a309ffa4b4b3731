#!/usr/bin/env bash
# Builds Karpenter's KWOK provider (sigs.k8s.io/karpenter, kwok/: a cloud provider that creates
# Node objects instead of machines) from its published Go module, for the autoscaling e2e tests
# (tests/kube/test_karpenter_live.py). Its own cache key; the CRDs it needs ship in the same
# module and are read from the module cache. See tools/testenv/README.md, "Karpenter".
#
#   bash tools/testenv/build-karpenter.sh                 build once, then reuse the binary
#   bash tools/testenv/build-karpenter.sh --print-bin-dir print the bin dir, build nothing
#   bash tools/testenv/build-karpenter.sh --print-module-dir  print the module's source dir
#
# The module's own go.mod/go.sum pin every dependency (built as the main module, read-only in
# the module cache). Karpenter v1.15.0 asks for go >= 1.26.9: GOTOOLCHAIN fetches that
# toolchain from the Go module proxy (golang.org/toolchain) when the local Go is older.
set -euo pipefail

CACHE_ROOT="${KALLOT_TESTENV_CACHE:-${HOME}/.cache/kallot/testenv}"
MOD="sigs.k8s.io/karpenter"
VERSION="v1.15.0"
SUM="h1:5SEptlAvsOZbNg4qg8OSdF1qi6BEZHZLA020nXY7jGw="
TOOLCHAIN="go1.26.9"
LDFLAGS="-s -w"

die() {
	echo "tools/testenv/build-karpenter.sh: ERROR: $*" >&2
	exit 1
}

HASH="$(echo "${MOD}@${VERSION}|${SUM}|${TOOLCHAIN}|${LDFLAGS}" | sha256sum | cut -c1-10)"
OUT="${CACHE_ROOT}/karpenter-${VERSION}-${HASH}"
BIN="${OUT}/bin"

module_dir() {
	local json
	json="$(GOTOOLCHAIN="${TOOLCHAIN}" GOFLAGS=-mod=mod go mod download -json "${MOD}@${VERSION}")" ||
		die "go mod download ${MOD}@${VERSION} failed: ${json}"
	local got
	got="$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"${json}")"
	[[ "${got}" == "${SUM}" ]] || die "${MOD}@${VERSION}: module sum ${got}, expected ${SUM}"
	sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"${json}"
}

case "${1:-}" in
--print-bin-dir)
	echo "${BIN}"
	exit 0
	;;
--print-module-dir)
	module_dir
	exit 0
	;;
"") ;;
*) die "unknown argument: $1 (usage: build-karpenter.sh [--print-bin-dir|--print-module-dir])" ;;
esac

if [[ -x "${BIN}/kwok-controller" ]]; then
	echo "testenv: using cached karpenter kwok-controller in ${BIN}"
	exit 0
fi
command -v go >/dev/null || die "go is not on PATH; install Go >= 1.26"
mkdir -p "${OUT}"
exec 9>"${OUT}/.lock"
if command -v flock >/dev/null; then
	flock 9
	[[ -x "${BIN}/kwok-controller" ]] && exit 0
fi
LOG="${OUT}/build.log"
STAGE="${OUT}/bin.partial"
rm -rf "${STAGE}"
mkdir -p "${STAGE}"
DIR="$(module_dir)"
echo "testenv: building ${MOD}@${VERSION}/kwok into ${BIN} (${TOOLCHAIN}, $(nproc) cores); log: ${LOG}"
start=${SECONDS}
if ! (cd "${DIR}" && CGO_ENABLED=0 GOTOOLCHAIN="${TOOLCHAIN}" nice -n 10 go build -trimpath \
	-ldflags "${LDFLAGS}" -o "${STAGE}/kwok-controller" ./kwok) >"${LOG}" 2>&1; then
	tail -n 40 "${LOG}" >&2
	die "build failed (full log: ${LOG})"
fi
rm -rf "${BIN}"
mv "${STAGE}" "${BIN}"
echo "testenv: built karpenter kwok-controller in $((SECONDS - start))s"
