"""Finding the control-plane binaries. No cluster needed: these run in `make unit` too."""

from __future__ import annotations

from pathlib import Path

import pytest

from kallot.testing.controlplane import (
    BinariesMissingError,
    ControlPlane,
    controlplane_bin_dir,
    find_binaries,
)


def test_missing_binaries_fail_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KALLOT_TESTENV_BIN", str(tmp_path))
    with pytest.raises(BinariesMissingError, match="make controlplane") as err:
        ControlPlane()
    assert "etcd, kube-apiserver, kube-scheduler" in str(err.value)


def test_bin_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("etcd", "kube-apiserver"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("KALLOT_TESTENV_BIN", str(tmp_path))
    assert find_binaries(["etcd", "kube-apiserver"]) == {
        "etcd": tmp_path / "etcd",
        "kube-apiserver": tmp_path / "kube-apiserver",
    }


def test_bin_dir_comes_from_build_sh_and_its_cache_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KALLOT_TESTENV_BIN", raising=False)
    monkeypatch.setenv("KALLOT_TESTENV_CACHE", str(tmp_path))
    bin_dir = controlplane_bin_dir()
    assert bin_dir.parent.parent == tmp_path
    assert bin_dir.name == "bin"
    # The key names the pinned versions (read from tools/testenv/*/go.mod).
    assert bin_dir.parent.name.startswith("k8s-v1.36.3-etcd-v3.6.8-helm-v4.3.2-")
