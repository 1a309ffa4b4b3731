#!/usr/bin/env bash
# Builds kallot's test control plane: etcd, kube-apiserver and kube-scheduler from the
# published Go modules, plus kubectl (the `kubectl kallot` plugin tests) and helm (chart
# rendering tests). See tools/testenv/README.md.
#
#   bash tools/testenv/build.sh                 build once, then reuse the cached binaries
#   bash tools/testenv/build.sh --print-bin-dir print the bin dir for the current pins, build nothing
#
# The pins live in the go.mod/go.sum files next to this script (k8s/ and helm/). The cache
# key is derived from those files and the build flags, so changing a pin builds into a new
# directory and never reuses stale binaries. src/kallot/testing/controlplane.py asks this
# script (--print-bin-dir) for the directory, so the key logic exists once.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${KALLOT_TESTENV_CACHE:-${HOME}/.cache/kallot/testenv}"
BINARIES=(etcd kube-apiserver kube-scheduler kubectl helm)

die() {
	echo "tools/testenv/build.sh: ERROR: $*" >&2
	exit 1
}

# Reads the version a go.mod requires for one module, without running go (fast, and
# --print-bin-dir must work where Go is not installed).
mod_version() {
	awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"
}

K8S_VERSION="$(mod_version "${HERE}/k8s/go.mod" k8s.io/kubernetes)"
ETCD_VERSION="$(mod_version "${HERE}/k8s/go.mod" go.etcd.io/etcd/server/v3)"
HELM_VERSION="$(mod_version "${HERE}/helm/go.mod" helm.sh/helm/v4)"
[[ -n "${K8S_VERSION}" && -n "${ETCD_VERSION}" && -n "${HELM_VERSION}" ]] ||
	die "cannot read the pinned versions from ${HERE}/{k8s,helm}/go.mod"

# k8s v1.36.3 -> staging v0.36.3, gitMinor 36. The k8s binaries read their version from
# these ldflags; without them they report v0.0.0-master and kubectl/clients complain.
K8S_MINOR="$(echo "${K8S_VERSION}" | cut -d. -f2)"
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	K8S_LDFLAGS+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1"
	K8S_LDFLAGS+=" -X ${pkg}.gitMinor=${K8S_MINOR} -X ${pkg}.gitTreeState=clean"
done
HELM_LDFLAGS="-s -w -X helm.sh/helm/v4/internal/version.version=${HELM_VERSION}"
HELM_LDFLAGS+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"

# The key names the versions for humans and hashes everything that changes the output.
HASH="$(cat "${HERE}"/k8s/go.mod "${HERE}"/k8s/go.sum "${HERE}"/k8s/cmd/etcd/main.go \
	"${HERE}"/helm/go.mod "${HERE}"/helm/go.sum <(echo "${K8S_LDFLAGS}|${HELM_LDFLAGS}") |
	sha256sum | cut -c1-10)"
KEY="k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}-${HASH}"
OUT="${CACHE_ROOT}/${KEY}"
BIN="${OUT}/bin"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
	echo "${BIN}"
	exit 0
elif [[ $# -gt 0 ]]; then
	die "unknown argument: $1 (usage: build.sh [--print-bin-dir])"
fi

complete() {
	local b
	for b in "${BINARIES[@]}"; do [[ -x "${BIN}/${b}" ]] || return 1; done
}

if complete; then
	echo "testenv: using cached binaries in ${BIN}"
	exit 0
fi

command -v go >/dev/null || die "go is not on PATH; install Go >= 1.26 (the k8s ${K8S_VERSION} modules need it)"
mkdir -p "${OUT}"

# Two builds on one machine (parallel CI jobs, two terminals) would race on bin/; the
# second waits and then finds the binaries complete.
exec 9>"${OUT}/.lock"
if command -v flock >/dev/null; then
	flock 9
	if complete; then
		echo "testenv: using cached binaries in ${BIN} (built by a concurrent run)"
		exit 0
	fi
fi

LOG="${OUT}/build.log"
STAGE="${OUT}/bin.partial"
rm -rf "${STAGE}"
mkdir -p "${STAGE}"
: >"${LOG}"

# CGO off: static binaries and no C toolchain needed (upstream releases build these the
# same way). -mod=readonly: build exactly the committed go.sum, fail rather than edit it.
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
echo "testenv: building ${KEY} into ${BIN} ($(go version | cut -d' ' -f3), $(nproc) cores); log: ${LOG}"
{
	echo "# $(date -u +%FT%TZ) build of ${KEY}"
	go version
	go env GOCACHE GOMODCACHE GOPROXY
} >>"${LOG}" 2>&1

step() {
	local name="$1" start=${SECONDS}
	shift
	echo "testenv: ${name} ..."
	echo "# ${name}: $*" >>"${LOG}"
	if ! "$@" >>"${LOG}" 2>&1; then
		echo "---- last 40 lines of ${LOG} ----" >&2
		tail -n 40 "${LOG}" >&2
		die "${name} failed after $((SECONDS - start))s; full log: ${LOG}"
	fi
	echo "testenv: ${name} done in $((SECONDS - start))s"
	echo "# ${name} done in $((SECONDS - start))s" >>"${LOG}"
}

in_dir() {
	local dir="$1"
	shift
	(cd "${dir}" && "$@")
}

# One go build for all four so the packages they share (apimachinery, client-go, grpc,
# etcd client, otel) compile once.
step "download modules (k8s)" in_dir "${HERE}/k8s" go mod download
step "build etcd ${ETCD_VERSION} + kube-apiserver + kube-scheduler + kubectl ${K8S_VERSION}" \
	in_dir "${HERE}/k8s" go build -trimpath -ldflags "${K8S_LDFLAGS}" -o "${STAGE}/" \
	./cmd/etcd k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kubectl
# helm is its own module: it needs newer client-go/otel than k8s v1.36 and would drag
# k8s's dependency graph forward if it shared the module.
step "download modules (helm)" in_dir "${HERE}/helm" go mod download
step "build helm ${HELM_VERSION}" in_dir "${HERE}/helm" \
	go build -trimpath -ldflags "${HELM_LDFLAGS}" -o "${STAGE}/helm" helm.sh/helm/v4/cmd/helm

step "check versions" "${STAGE}/kube-apiserver" --version
"${STAGE}/kube-apiserver" --version | grep -qx "Kubernetes ${K8S_VERSION}" ||
	die "kube-apiserver reports '$("${STAGE}/kube-apiserver" --version)', expected Kubernetes ${K8S_VERSION}"
# Captured first: grep -q exits at its first match, and with pipefail the writer's SIGPIPE
# would fail the check.
KUBECTL_VERSION="$("${STAGE}/kubectl" version --client)"
grep -qx "Client Version: ${K8S_VERSION}" <<<"${KUBECTL_VERSION}" ||
	die "kubectl reports '${KUBECTL_VERSION%%$'\n'*}', expected ${K8S_VERSION}"
"${STAGE}/etcd" --version | grep -q "etcd Version: ${ETCD_VERSION#v}" ||
	die "etcd reports '$("${STAGE}/etcd" --version | head -1)', expected ${ETCD_VERSION#v}"
"${STAGE}/helm" version --short | grep -q "^${HELM_VERSION}" ||
	die "helm reports '$("${STAGE}/helm" version --short)', expected ${HELM_VERSION}"

# Publish atomically: bin/ only ever holds a complete set.
rm -rf "${BIN}"
mv "${STAGE}" "${BIN}"
echo "# $(date -u +%FT%TZ) done, total ${SECONDS}s" >>"${LOG}"
echo "testenv: built in ${SECONDS}s: $(cd "${BIN}" && echo *) in ${BIN}"
