"""kallot's copies of the kubelet's gRPC APIs against the upstream definitions themselves.

The .proto files under ``src/kallot/node/proto`` are written from the kubelet's
``pkg/apis/*/api.proto``. This test takes those files from the published ``k8s.io/kubelet``
module (``go mod download``: the Go module proxy or Go's module cache, checked against the
checksum database) at the release of the control plane the tests build
(``tools/testenv/k8s/go.mod``), and at the first release with the v1 health API, and compares
what reaches the wire: packages, service and method names, message and field names, field
numbers, types and labels, enum values. The APIs the agent serves must be identical; the one it
only calls (pod resources) may be a subset.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "src" / "kallot" / "node" / "proto"
# The first k8s.io/kubelet release with pkg/apis/dra-health/v1.
HEALTH_V1_RELEASE = "v0.37.2"

Shape = dict[str, object]


def _control_plane_release() -> str:
    text = (ROOT / "tools" / "testenv" / "k8s" / "go.mod").read_text()
    found = re.search(r"^replace k8s\.io/kubelet => k8s\.io/kubelet (v\S+)$", text, re.M)
    assert found, "tools/testenv/k8s/go.mod: no replace line for k8s.io/kubelet"
    return found.group(1)


def _module_dir(version: str, tmp: Path) -> Path:
    go = shutil.which("go")
    assert go, "go: not on PATH (the test suite builds the control plane with it)"
    out = subprocess.run(
        [go, "mod", "download", "-json", f"k8s.io/kubelet@{version}"],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return Path(json.loads(out.stdout)["Dir"])


def _shapes(files: list[Path], include: Path, tmp: Path) -> Shape:
    """Wire shape of every message, enum and service in ``files``, by full name."""
    out = tmp / f"set-{len(list(tmp.iterdir()))}.pb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            str(include),
            f"--descriptor_set_out={out}",
            *map(str, files),
        ],
        check=True,
        timeout=120,
    )
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(out.read_bytes())
    shapes: Shape = {}

    def messages(items: Any, prefix: str) -> None:
        for m in items:
            name = f"{prefix}.{m.name}"
            shapes[name] = {
                f.name: (f.number, f.type, f.label, f.type_name.rsplit(".", 1)[-1]) for f in m.field
            }
            messages(m.nested_type, name)
            for e in m.enum_type:
                shapes[f"{name}.{e.name}"] = {v.name: v.number for v in e.value}

    for f in fds.file:
        messages(f.message_type, f.package)
        for e in f.enum_type:
            shapes[f"{f.package}.{e.name}"] = {v.name: v.number for v in e.value}
        for s in f.service:
            shapes[f"{f.package}.{s.name}"] = {
                m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                for m in s.method
            }
    return shapes


def _upstream(tmp: Path, release: str, apis: list[str]) -> Shape:
    module = _module_dir(release, tmp)
    copies = tmp / f"upstream-{release}"
    copies.mkdir()
    files = []
    for api in apis:
        target = copies / f"{api.replace('/', '_').replace('-', '_')}.proto"
        target.write_bytes((module / "pkg" / "apis" / api / "api.proto").read_bytes())
        files.append(target)
    return _shapes(files, copies, tmp)


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Shape:
    tmp = tmp_path_factory.mktemp("ours")
    return _shapes(sorted(PROTO.glob("*.proto")), ROOT / "src", tmp)


SERVED = ["dra/v1", "dra-health/v1alpha1", "pluginregistration/v1", "deviceplugin/v1beta1"]


def test_served_apis_are_the_control_plane_releases(
    ours: Shape, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("served")
    upstream = _upstream(tmp, _control_plane_release(), SERVED)
    assert len(upstream) > 20  # every API file was read
    assert {k: ours.get(k) for k in upstream} == upstream


def test_health_v1_is_the_first_release_with_it(
    ours: Shape, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("health")
    upstream = _upstream(tmp, HEALTH_V1_RELEASE, ["dra-health/v1"])
    assert "v1.DRAResourceHealth" in upstream
    assert {k: ours.get(k) for k in upstream} == upstream


def test_pod_resources_is_a_subset(ours: Shape, tmp_path_factory: pytest.TempPathFactory) -> None:
    # The agent only calls List and reads names and devices: fields it leaves out are skipped
    # on the wire, but each one it has must be the kubelet's.
    tmp = tmp_path_factory.mktemp("podresources")
    upstream = _upstream(tmp, _control_plane_release(), ["podresources/v1"])
    mine = {k: v for k, v in ours.items() if k in upstream}
    assert "v1.PodResourcesLister" in mine
    for name, fields in mine.items():
        theirs = upstream[name]
        assert isinstance(fields, dict) and isinstance(theirs, dict)
        assert {f: theirs.get(f) for f in fields} == fields, name
