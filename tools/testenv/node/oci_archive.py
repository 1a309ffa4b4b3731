"""Writes a one-layer OCI image archive (oci-layout, index, manifest, config, layer) by hand.

Part of the test node build (tools/testenv/build-node.sh): the node's images come from files on
this machine, never from a registry. `ctr -n k8s.io images import` reads the archive and names
the image from the index's `io.containerd.image.name` annotation. The output is byte-for-byte
reproducible (sorted entries, mtime 0, uid/gid 0), so the cache key of the build covers it.

    python3 oci_archive.py OUT.tar NAME:TAG --file SRC:DEST[:MODE] --link DEST:TARGET \
        --cmd /bin/sh --cmd -c ... [--env K=V] [--user UID]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
import tarfile
from typing import cast


def _add_dirs(tar: tarfile.TarFile, path: str, seen: set[str]) -> None:
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in seen:
            seen.add(d)
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)


def layer(
    files: list[tuple[str, str, int]], links: list[tuple[str, str]], dirs: list[str]
) -> bytes:
    """The layer as an uncompressed tar: real files, symlinks and empty dirs, sorted."""
    buf = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries: list[tuple[str, str, object]] = (
            [(d.strip("/"), "dir", None) for d in dirs]
            + [(dest.strip("/"), "file", (src, mode)) for src, dest, mode in files]
            + [(dest.strip("/"), "link", target) for dest, target in links]
        )
        for name, kind, arg in sorted(entries, key=lambda e: e[0]):
            _add_dirs(tar, name + "/x" if kind == "dir" else name, seen)
            if kind == "dir":
                continue
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if kind == "file":
                src, mode = cast("tuple[str, int]", arg)
                with open(src, "rb") as f:
                    data = f.read()
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, str(arg), 0o777
                tar.addfile(info)
    return buf.getvalue()


def blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mode, info.mtime = len(data), 0o444, 0
    tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("name", help="image reference, e.g. docker.io/library/busybox:1.35")
    p.add_argument("--file", action="append", default=[], help="SRC:DEST[:OCTAL_MODE]")
    p.add_argument("--link", action="append", default=[], help="DEST:TARGET (a symlink)")
    p.add_argument("--dir", action="append", default=[], help="an empty directory")
    p.add_argument("--cmd", action="append", default=[], help="one argv element of the image's Cmd")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--user", default="")
    a = p.parse_args(argv)
    files = []
    for spec in a.file:
        src, dest, *mode = spec.split(":")
        files.append((src, dest, int(mode[0], 8) if mode else 0o755))
    links = [(dest, target) for dest, target in (s.split(":", 1) for s in a.link)]
    raw = layer(files, links, a.dir)
    gz = gzip.compress(raw, mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": a.cmd, "Env": a.env or ["PATH=/bin:/usr/bin"], "User": a.user},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(raw).hexdigest()}"]},
        "history": [{"created_by": "tools/testenv/node/oci_archive.py"}],
    }
    with tarfile.open(a.out, "w", format=tarfile.PAX_FORMAT) as tar:
        config_bytes = json.dumps(config, sort_keys=True).encode()
        layer_digest = blob(tar, gz)
        config_digest = blob(tar, config_bytes)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config_bytes),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": layer_digest,
                    "size": len(gz),
                }
            ],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        manifest_digest = blob(tar, manifest_bytes)
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": len(manifest_bytes),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": a.name,
                        "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
        for name, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps(index, sort_keys=True).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o444, 0
            tar.addfile(info, io.BytesIO(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
