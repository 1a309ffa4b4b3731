#!/usr/bin/env bash
# Builds kallot's test node: containerd v2 (daemon, ctr, runc shim) and the kubelet from their
# published Go modules, a pause binary, and two OCI image archives written by hand (the pause
# sandbox image and busybox from Debian's busybox-static), into a cache key of its own next to
# the control plane's. runc is Debian's (apt). See tools/testenv/README.md, "The test node".
#
#   bash tools/testenv/build-node.sh                 build once, then reuse the cached files
#   bash tools/testenv/build-node.sh --print-dir     print the key's directory, build nothing
#   bash tools/testenv/build-node.sh --print-images  print the images' directory, build nothing
#
# The kubelet shares the control plane's Go build cache (same k8s.io/kubernetes pin), so after
# `make controlplane` only its own packages compile. src/kallot/testing/node.py asks --print-dir.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NODE="${HERE}/node"
CACHE_ROOT="${KALLOT_TESTENV_CACHE:-${HOME}/.cache/kallot/testenv}"
BINARIES=(containerd ctr containerd-shim-runc-v2 kubelet)

die() {
	echo "tools/testenv/build-node.sh: ERROR: $*" >&2
	exit 1
}

mod_version() {
	awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"
}
K8S_VERSION="$(mod_version "${NODE}/kubelet/go.mod" k8s.io/kubernetes)"
CTRD_VERSION="$(mod_version "${NODE}/containerd/go.mod" github.com/containerd/containerd/v2)"
[[ -n "${K8S_VERSION}" && -n "${CTRD_VERSION}" ]] || die "cannot read the pins from ${NODE}/{kubelet,containerd}/go.mod"
K8S_MINOR="$(echo "${K8S_VERSION}" | cut -d. -f2)"
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	K8S_LDFLAGS+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1"
	K8S_LDFLAGS+=" -X ${pkg}.gitMinor=${K8S_MINOR} -X ${pkg}.gitTreeState=clean"
done
CTRD_LDFLAGS="-s -w -X github.com/containerd/containerd/v2/version.Version=${CTRD_VERSION}"
CTRD_LDFLAGS+=" -X github.com/containerd/containerd/v2/version.Revision=kallot-testenv"
CTRD_TAGS="no_btrfs"

# busybox's Debian version is part of the key: a new package makes a new image archive.
BUSYBOX_VERSION="$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo none)"
# Two hashes: the binaries' (Go pins, flags) names the directory; the images' (the archive
# writer, pause's source, busybox's package version) names images-<hash>/ inside it, so editing
# the archive writer never rebuilds containerd and the kubelet.
HASH="$(cat "${NODE}"/kubelet/go.mod "${NODE}"/kubelet/go.sum "${NODE}"/containerd/go.mod \
	"${NODE}"/containerd/go.sum <(echo "${K8S_LDFLAGS}|${CTRD_LDFLAGS}|${CTRD_TAGS}") | sha256sum | cut -c1-10)"
IMAGES_HASH="$(cat "${NODE}"/pause/go.mod "${NODE}"/pause/main.go "${NODE}"/oci_archive.py \
	<(echo "${BUSYBOX_VERSION}") | sha256sum | cut -c1-10)"
KEY="node-containerd-${CTRD_VERSION}-kubelet-${K8S_VERSION}-${HASH}"
OUT="${CACHE_ROOT}/${KEY}"
IMAGES="images-${IMAGES_HASH}"

if [[ "${1:-}" == "--print-dir" ]]; then
	echo "${OUT}"
	exit 0
elif [[ "${1:-}" == "--print-images" ]]; then
	echo "${OUT}/${IMAGES}"
	exit 0
elif [[ $# -gt 0 ]]; then
	die "unknown argument: $1 (usage: build-node.sh [--print-dir])"
fi

complete() {
	local b
	for b in "${BINARIES[@]}"; do [[ -x "${OUT}/bin/${b}" ]] || return 1; done
	images_complete
}
images_complete() {
	[[ -f "${OUT}/${IMAGES}/pause.tar" && -f "${OUT}/${IMAGES}/busybox.tar" ]]
}
if complete; then
	echo "testenv: using cached node in ${OUT}"
	exit 0
fi

# What the node needs from Debian: runc (the OCI runtime containerd's shim runs), busybox-static
# (the test pods' image) and the CNI loopback plugin. A fresh CI machine gets them here.
need_apt=()
command -v runc >/dev/null || need_apt+=(runc)
[[ "${BUSYBOX_VERSION}" != none ]] || need_apt+=(busybox-static)
[[ -x /usr/lib/cni/loopback ]] || need_apt+=(containernetworking-plugins) # the pods' loopback
if ((${#need_apt[@]})); then
	command -v apt-get >/dev/null || die "install ${need_apt[*]} (no apt-get here)"
	echo "testenv: apt-get install ${need_apt[*]}"
	# A fresh machine's package lists may be stale or empty: update once if the install fails.
	{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null 2>&1 ||
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null; }; } ||
		die "apt-get install ${need_apt[*]} failed"
	exec bash "$0" "$@" # the busybox version is part of the key
fi
command -v go >/dev/null || die "go is not on PATH; install Go >= 1.26"

mkdir -p "${OUT}"
exec 9>"${OUT}/.lock"
if command -v flock >/dev/null; then
	flock 9
	if complete; then
		echo "testenv: using cached node in ${OUT} (built by a concurrent run)"
		exit 0
	fi
fi
LOG="${OUT}/build.log"
STAGE="${OUT}/partial"
rm -rf "${STAGE}"
mkdir -p "${STAGE}/bin" "${STAGE}/images"
echo "# $(date -u +%FT%TZ) build of ${KEY} (${IMAGES})" >>"${LOG}"
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
echo "testenv: building ${KEY} into ${OUT} ($(go version | cut -d' ' -f3), $(nproc) cores); log: ${LOG}"

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

bins_complete() {
	local b
	for b in "${BINARIES[@]}"; do [[ -x "${OUT}/bin/${b}" ]] || return 1; done
}
if ! bins_complete; then
	step "download modules (kubelet)" in_dir "${NODE}/kubelet" go mod download
	step "build kubelet ${K8S_VERSION}" in_dir "${NODE}/kubelet" nice -n 10 \
		go build -trimpath -ldflags "${K8S_LDFLAGS}" -o "${STAGE}/bin/" k8s.io/kubernetes/cmd/kubelet
	step "download modules (containerd)" in_dir "${NODE}/containerd" go mod download
	step "build containerd ${CTRD_VERSION} + ctr + containerd-shim-runc-v2" in_dir "${NODE}/containerd" nice -n 10 \
		go build -trimpath -tags "${CTRD_TAGS}" -ldflags "${CTRD_LDFLAGS}" -o "${STAGE}/bin/" \
		github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
	step "check versions" "${STAGE}/bin/kubelet" --version
	"${STAGE}/bin/kubelet" --version | grep -qx "Kubernetes ${K8S_VERSION}" ||
		die "kubelet reports '$("${STAGE}/bin/kubelet" --version)', expected ${K8S_VERSION}"
	"${STAGE}/bin/containerd" --version | grep -q " ${CTRD_VERSION} " ||
		die "containerd reports '$("${STAGE}/bin/containerd" --version)', expected ${CTRD_VERSION}"
	rm -rf "${OUT}/bin"
	mv "${STAGE}/bin" "${OUT}/bin"
fi

# Images: pause is the sandbox image (containerd's sandbox setting names it); busybox is what
# the test pods run (imagePullPolicy: Never). Every applet busybox lists gets a /bin symlink.
if ! images_complete; then
	step "build pause" in_dir "${NODE}/pause" go build -trimpath -ldflags "-s -w" -o "${STAGE}/pause" .
	step "image pause" python3 "${NODE}/oci_archive.py" "${STAGE}/images/pause.tar" \
		kallot.invalid/testenv/pause:1 --file "${STAGE}/pause:/pause" --cmd /pause --user 65535
	links=()
	for applet in $(/bin/busybox --list); do
		[[ "${applet}" == busybox ]] || links+=(--link "/bin/${applet}:busybox")
	done
	step "image busybox ${BUSYBOX_VERSION}" python3 "${NODE}/oci_archive.py" "${STAGE}/images/busybox.tar" \
		kallot.invalid/testenv/busybox:1 --file /bin/busybox:/bin/busybox "${links[@]}" \
		--dir /tmp --dir /etc --dir /dev --dir /proc --dir /sys --cmd /bin/sh
	rm -rf "${OUT:?}/${IMAGES}"
	mv "${STAGE}/images" "${OUT}/${IMAGES}"
fi
rm -rf "${STAGE}"
echo "# $(date -u +%FT%TZ) done, total ${SECONDS}s" >>"${LOG}"
echo "testenv: built in ${SECONDS}s: $(cd "${OUT}/bin" && echo *) + ${IMAGES}/ in ${OUT}"
