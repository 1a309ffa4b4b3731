#!/usr/bin/env bash
# Builds kube-controller-manager for the test control plane (Jobs create their pods for real)
# from the k8s.io/kubernetes version build.sh pins, as its own module (kcm/: it needs modules
# the main set does not, kubelet and volume plugins), into its OWN cache key, so the main
# control-plane key (etcd, kube-apiserver, kube-scheduler, kubectl, helm) stays untouched.
#
#   bash tools/testenv/build-kcm.sh                 build once, then reuse the cached binary
#   bash tools/testenv/build-kcm.sh --print-bin-dir print the bin dir, build nothing
#
# Built at nice 10: it shares the Go build cache with build.sh, so after the main build only the
# controller packages compile. src/kallot/testing/controlplane.py asks --print-bin-dir.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${KALLOT_TESTENV_CACHE:-${HOME}/.cache/kallot/testenv}"

die() {
	echo "tools/testenv/build-kcm.sh: ERROR: $*" >&2
	exit 1
}

K8S_VERSION="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' "${HERE}/kcm/go.mod")"
[[ -n "${K8S_VERSION}" ]] || die "cannot read the k8s.io/kubernetes pin from ${HERE}/kcm/go.mod"
K8S_MINOR="$(echo "${K8S_VERSION}" | cut -d. -f2)"
LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	LDFLAGS+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1"
	LDFLAGS+=" -X ${pkg}.gitMinor=${K8S_MINOR} -X ${pkg}.gitTreeState=clean"
done
HASH="$(cat "${HERE}"/kcm/go.mod "${HERE}"/kcm/go.sum "${HERE}"/kcm/tools.go <(echo "kcm|${LDFLAGS}") | sha256sum | cut -c1-10)"
KEY="kcm-${K8S_VERSION}-${HASH}"
OUT="${CACHE_ROOT}/${KEY}"
BIN="${OUT}/bin"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
	echo "${BIN}"
	exit 0
elif [[ $# -gt 0 ]]; then
	die "unknown argument: $1 (usage: build-kcm.sh [--print-bin-dir])"
fi
if [[ -x "${BIN}/kube-controller-manager" ]]; then
	echo "testenv: using cached kube-controller-manager in ${BIN}"
	exit 0
fi
command -v go >/dev/null || die "go is not on PATH; install Go >= 1.26"
mkdir -p "${OUT}"
exec 9>"${OUT}/.lock"
if command -v flock >/dev/null; then
	flock 9
	[[ -x "${BIN}/kube-controller-manager" ]] && exit 0
fi
LOG="${OUT}/build.log"
STAGE="${OUT}/bin.partial"
rm -rf "${STAGE}"
mkdir -p "${STAGE}"
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
echo "testenv: building ${KEY} into ${BIN}; log: ${LOG}"
start=${SECONDS}
if ! (cd "${HERE}/kcm" && go mod download && nice -n 10 go build -trimpath -ldflags "${LDFLAGS}" -o "${STAGE}/" \
	k8s.io/kubernetes/cmd/kube-controller-manager) >"${LOG}" 2>&1; then
	tail -n 40 "${LOG}" >&2
	die "build failed after $((SECONDS - start))s; full log: ${LOG}"
fi
"${STAGE}/kube-controller-manager" --version | grep -qx "Kubernetes ${K8S_VERSION}" ||
	die "kube-controller-manager reports '$("${STAGE}/kube-controller-manager" --version)', expected ${K8S_VERSION}"
rm -rf "${BIN}"
mv "${STAGE}" "${BIN}"
echo "testenv: built kube-controller-manager in $((SECONDS - start))s into ${BIN}"
