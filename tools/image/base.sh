#!/usr/bin/env bash
# Makes the image's base locally, where no container registry can be reached: a Debian bookworm
# `mmdebstrap --variant=minbase` root with python3.11, venv, pip and ca-certificates, imported into
# the container tool's storage under the official base's name (python:3.11-slim-bookworm), so the
# Dockerfile builds unchanged with `--pull=never`. Cached: the rootfs tarball lives under
# ~/.cache/kallot/image/<key>/ and the import is skipped when the tool already has the name.
# See docs/install.md, "Building the image without a registry".
#
#   bash tools/image/base.sh            CONTAINER_TOOL=buildah|podman (default: buildah)
#   bash tools/image/base.sh --print-name
set -euo pipefail

TOOL="${CONTAINER_TOOL:-buildah}"
SUITE=bookworm
NAME="docker.io/library/python:3.11-slim-bookworm"
PACKAGES="python3.11,python3.11-venv,python3-pip,python-is-python3,ca-certificates"
CACHE="${KALLOT_IMAGE_CACHE:-${HOME}/.cache/kallot/image}"
# The build host's own CAs (a TLS-intercepting proxy's, say) go into the base, so pip in the
# build stage trusts what the host trusts; they are part of the key.
LOCAL_CAS=(/usr/local/share/ca-certificates/*.crt)
[[ -e "${LOCAL_CAS[0]}" ]] || LOCAL_CAS=()
KEY="base-${SUITE}-$({ echo "${SUITE}|${PACKAGES}|v2"; cat "${LOCAL_CAS[@]}" /dev/null; } | sha256sum | cut -c1-10)"
OUT="${CACHE}/${KEY}"

die() {
	echo "tools/image/base.sh: ERROR: $*" >&2
	exit 1
}
if [[ "${1:-}" == "--print-name" ]]; then
	echo "${NAME}"
	exit 0
fi
for pkg in mmdebstrap buildah; do
	if ! command -v "${pkg}" >/dev/null; then
		command -v apt-get >/dev/null || die "install ${pkg}"
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkg}" >/dev/null 2>&1 ||
			{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkg}" >/dev/null; }; } ||
			die "apt-get install ${pkg} failed"
	fi
done
mkdir -p "${OUT}"
exec 9>"${OUT}/.lock"
flock 9
if [[ ! -f "${OUT}/rootfs.tar" ]]; then
	echo "base: mmdebstrap ${SUITE} minbase + ${PACKAGES} -> ${OUT}/rootfs.tar"
	# No apt lists, docs, man pages or caches in the base: what the slim image leaves out too.
	mmdebstrap --variant=minbase --include="${PACKAGES}" \
		--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
		${LOCAL_CAS[@]:+--customize-hook="copy-in ${LOCAL_CAS[*]} /usr/local/share/ca-certificates/"} \
		${LOCAL_CAS[@]:+--customize-hook='chroot "$1" update-ca-certificates'} \
		--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
		"${SUITE}" "${OUT}/rootfs.partial.tar" >"${OUT}/mmdebstrap.log" 2>&1 ||
		{
			tail -n 30 "${OUT}/mmdebstrap.log" >&2
			die "mmdebstrap failed; log: ${OUT}/mmdebstrap.log"
		}
	mv "${OUT}/rootfs.partial.tar" "${OUT}/rootfs.tar"
fi
# The same key already imported: keep that image (a new import would be a new image ID, and
# every layer built on it would miss the cache).
case "${TOOL}" in
buildah) have="$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "io.kallot.base.key"}}' "${NAME}" 2>/dev/null || true)" ;;
*) have="$("${TOOL}" image inspect --format '{{index .Labels "io.kallot.base.key"}}' "${NAME}" 2>/dev/null || true)" ;;
esac
if [[ "${have}" == "${KEY}" ]]; then
	echo "base: ${NAME} already in ${TOOL}'s storage"
	exit 0
fi
case "${TOOL}" in
buildah)
	ctr="$(buildah from --pull=never scratch)"
	buildah add --quiet "${ctr}" "${OUT}/rootfs.tar" / >/dev/null
	buildah config --label "io.kallot.base.key=${KEY}" \
		--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--env LANG=C.UTF-8 --cmd python3 "${ctr}"
	buildah commit --quiet --rm "${ctr}" "${NAME}" >/dev/null
	;;
podman)
	podman import --change "LABEL io.kallot.base.key=${KEY}" --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "${OUT}/rootfs.tar" "${NAME}" >/dev/null
	;;
*) die "CONTAINER_TOOL=${TOOL}: expected buildah or podman" ;;
esac
echo "base: imported ${NAME} into ${TOOL} ($(du -h "${OUT}/rootfs.tar" | cut -f1) rootfs)"
