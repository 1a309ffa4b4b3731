#!/usr/bin/env bash
# Fetches the owners' CRDs (JobSet, LeaderWorkerSet, Kubeflow training-operator and Trainer,
# KubeRay, Kueue) from their projects' published Go modules at the versions pinned in
# crds/crds.txt, into their OWN cache key (the control-plane, kcm and Prometheus keys stay
# untouched). No hand-written copies: each file is the one the module ships.
#
#   bash tools/testenv/fetch-crds.sh                 fetch once, then reuse the cached files
#   bash tools/testenv/fetch-crds.sh --print-dir     print the directory, fetch nothing
#
# `go mod download` takes each module from the Go module proxy (or Go's module cache) and
# checks it against the checksum database; the script also checks it against the h1 sum pinned
# in crds.txt. Nothing is built. src/kallot/testing/controllers.py asks --print-dir.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${KALLOT_TESTENV_CACHE:-${HOME}/.cache/kallot/testenv}"
PINS="${HERE}/crds/crds.txt"

die() {
	echo "tools/testenv/fetch-crds.sh: ERROR: $*" >&2
	exit 1
}

HASH="$(sha256sum "${PINS}" | cut -c1-10)"
OUT="${CACHE_ROOT}/crds-${HASH}"
DIR="${OUT}/crds"

if [[ "${1:-}" == "--print-dir" ]]; then
	echo "${DIR}"
	exit 0
elif [[ $# -gt 0 ]]; then
	die "unknown argument: $1 (usage: fetch-crds.sh [--print-dir])"
fi

names() { awk '!/^#/ && NF == 5 { print $1 }' "${PINS}"; }
complete() {
	local n
	for n in $(names); do [[ -s "${DIR}/${n}.yaml" ]] || return 1; done
}

if complete; then
	echo "testenv: using cached CRDs in ${DIR}"
	exit 0
fi
command -v go >/dev/null || die "go is not on PATH; install Go >= 1.26"
mkdir -p "${OUT}"
exec 9>"${OUT}/.lock"
if command -v flock >/dev/null; then
	flock 9
	complete && exit 0
fi
STAGE="${OUT}/crds.partial"
rm -rf "${STAGE}"
mkdir -p "${STAGE}"
start=${SECONDS}
# Outside any module: `go mod download mod@version` needs no go.mod.
cd "${OUT}"
declare -A dirs=()
while read -r name module version sum path; do
	key="${module}@${version}"
	if [[ -z "${dirs[${key}]:-}" ]]; then
		json="$(GOFLAGS=-mod=mod go mod download -json "${key}")" ||
			die "go mod download ${key} failed: ${json}"
		got="$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"${json}")"
		[[ "${got}" == "${sum}" ]] || die "${key}: module sum ${got}, crds.txt pins ${sum}"
		dirs[${key}]="$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"${json}")"
	fi
	src="${dirs[${key}]}/${path}"
	[[ -s "${src}" ]] || die "${key} has no ${path}"
	cp "${src}" "${STAGE}/${name}.yaml"
	chmod 0644 "${STAGE}/${name}.yaml"
done < <(awk '!/^#/ && NF == 5' "${PINS}")
rm -rf "${DIR}"
mv "${STAGE}" "${DIR}"
echo "testenv: fetched $(names | wc -l) CRDs in $((SECONDS - start))s into ${DIR}"
