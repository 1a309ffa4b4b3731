#!/usr/bin/env bash
# Builds Prometheus (cmd/prometheus only: no UI assets, no cloud service discovery) from its Go
# module for the waste-report e2e tests (tests/report). Its own cache key next to the control
# plane's, so building it never touches the k8s binaries. See tools/testenv/README.md.
#
#   bash tools/testenv/build-prometheus.sh                 build once, then reuse the binary
#   bash tools/testenv/build-prometheus.sh --print-bin-dir print the bin dir, build nothing
#
# The pin is prometheus/go.mod (github.com/prometheus/prometheus v0.3XX.Y = Prometheus 3.XX.Y).
# Build tag remove_all_sd leaves out the cloud service discoveries (AWS, Azure, GCE, k8s, ...):
# the tests scrape static targets, and the build is about a third of the full one.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${KALLOT_TESTENV_CACHE:-${HOME}/.cache/kallot/testenv}"
MOD="github.com/prometheus/prometheus"

die() {
	echo "tools/testenv/build-prometheus.sh: ERROR: $*" >&2
	exit 1
}

MOD_VERSION="$(awk -v m="${MOD}" '$1 == m && $2 ~ /^v/ { print $2; exit }' "${HERE}/prometheus/go.mod")"
[[ -n "${MOD_VERSION}" ]] || die "cannot read the pinned ${MOD} version from ${HERE}/prometheus/go.mod"
# v0.316.0 -> 3.16.0 (Prometheus tags its Go module v0.<major><minor 2 digits>.<patch>)
MINORS="$(echo "${MOD_VERSION}" | cut -d. -f2)"
PROM_VERSION="${MINORS:0:1}.$((10#${MINORS:1})).$(echo "${MOD_VERSION}" | cut -d. -f3)"
TAGS="remove_all_sd"
LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=${PROM_VERSION}"
LDFLAGS+=" -X github.com/prometheus/common/version.Branch=kallot-testenv"

HASH="$(cat "${HERE}/prometheus/go.mod" "${HERE}/prometheus/go.sum" <(echo "${TAGS}|${LDFLAGS}") |
	sha256sum | cut -c1-10)"
KEY="prometheus-v${PROM_VERSION}-${HASH}"
OUT="${CACHE_ROOT}/${KEY}"
BIN="${OUT}/bin"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
	echo "${BIN}"
	exit 0
elif [[ $# -gt 0 ]]; then
	die "unknown argument: $1 (usage: build-prometheus.sh [--print-bin-dir])"
fi

if [[ -x "${BIN}/prometheus" ]]; then
	echo "testenv: using cached prometheus in ${BIN}"
	exit 0
fi
command -v go >/dev/null || die "go is not on PATH; install Go >= 1.26"
mkdir -p "${OUT}"
exec 9>"${OUT}/.lock"
if command -v flock >/dev/null; then
	flock 9
	if [[ -x "${BIN}/prometheus" ]]; then
		echo "testenv: using cached prometheus in ${BIN} (built by a concurrent run)"
		exit 0
	fi
fi

LOG="${OUT}/build.log"
STAGE="${OUT}/bin.partial"
rm -rf "${STAGE}"
mkdir -p "${STAGE}"
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
echo "testenv: building ${KEY} into ${BIN} ($(go version | cut -d' ' -f3), $(nproc) cores); log: ${LOG}"
echo "# $(date -u +%FT%TZ) build of ${KEY}" >"${LOG}"
start=${SECONDS}
if ! (cd "${HERE}/prometheus" && go mod download && go build -trimpath -tags "${TAGS}" \
	-ldflags "${LDFLAGS}" -o "${STAGE}/prometheus" "${MOD}/cmd/prometheus") >>"${LOG}" 2>&1; then
	tail -n 40 "${LOG}" >&2
	die "build failed after $((SECONDS - start))s; full log: ${LOG}"
fi
"${STAGE}/prometheus" --version 2>&1 | grep -q "version ${PROM_VERSION}" ||
	die "prometheus reports '$("${STAGE}/prometheus" --version 2>&1 | head -1)', expected ${PROM_VERSION}"
rm -rf "${BIN}"
mv "${STAGE}" "${BIN}"
echo "# $(date -u +%FT%TZ) done, total $((SECONDS - start))s" >>"${LOG}"
echo "testenv: built prometheus ${PROM_VERSION} in $((SECONDS - start))s into ${BIN}"
