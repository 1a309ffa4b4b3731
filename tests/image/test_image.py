"""The container image (Dockerfile, requirements.lock, ``make image``), checked without a
container runtime or a registry (none is reachable here): the build stage's RUN steps run the
same way in a clean virtual environment and install exactly the lock plus kallot; the lock is the
closure of pyproject.toml's pins; hadolint passes; the entrypoint starts each component with
``--help``; the chart and deploy/ name the tag ``make image`` produces.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"
HADOLINT = Path(sys.executable).parent / "hadolint"
VENV_IN_IMAGE = "/opt/kallot"


@dataclass(frozen=True)
class Instruction:
    op: str
    args: str


def parse(text: str) -> list[list[Instruction]]:
    """The Dockerfile's stages, each a list of instructions (continuations joined, comments and
    parser directives dropped): enough of the format for the instructions used here."""
    stages: list[list[Instruction]] = []
    preamble: list[Instruction] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        op, _, args = logical.partition(" ")
        ins = Instruction(op.upper(), " ".join(args.split()))
        logical = ""
        if ins.op == "FROM":
            stages.append([ins])
        elif stages:
            stages[-1].append(ins)
        else:
            preamble.append(ins)
    assert all(i.op == "ARG" for i in preamble), preamble
    return stages


def _env(ins: Instruction) -> dict[str, str]:
    return {k: v for k, _, v in (p.partition("=") for p in shlex.split(ins.args))}


def _requirement(line: str) -> tuple[str, str]:
    name, _, version = line.partition("==")
    return re.sub(r"[-_.]+", "-", name).lower(), version


def lock_pins() -> dict[str, str]:
    lines = [ln.strip() for ln in LOCK.read_text().splitlines()]
    return dict(_requirement(ln) for ln in lines if ln and not ln.startswith("#"))


def pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_dockerfile_is_multi_stage_slim_non_root_with_oci_labels() -> None:
    stages = parse(DOCKERFILE.read_text())
    assert len(stages) == 2
    build, runtime = stages
    for stage in stages:
        assert re.fullmatch(r"\$\{BASE_IMAGE\}( AS build)?", stage[0].args)
    assert build[0].args.endswith(" AS build")
    # The base is a build argument (a locally made base where no registry is reachable:
    # tools/image/base.sh), by default the official slim Python of PYTHON_VERSION's minor.
    base = re.search(r"^ARG BASE_IMAGE=python:(\d+\.\d+)-slim-\w+$", DOCKERFILE.read_text(), re.M)
    assert base is not None
    assert re.search(
        rf"^ARG PYTHON_VERSION={re.escape(base.group(1))}$", DOCKERFILE.read_text(), re.M
    )
    default = re.search(r"^ARG PYTHON_VERSION=(\d+)\.(\d+)$", DOCKERFILE.read_text(), re.M)
    assert default is not None
    requires = pyproject()["project"]["requires-python"]  # type: ignore[index]
    low, high = re.fullmatch(r">=(\d+\.\d+),<(\d+\.\d+)", requires).groups()  # type: ignore[union-attr]
    minor = (int(default.group(1)), int(default.group(2)))
    assert tuple(map(int, low.split("."))) <= minor < tuple(map(int, high.split(".")))

    ops = [i.op for i in runtime]
    # Only the built environment crosses into the runtime stage.
    copies = [i.args for i in runtime if i.op == "COPY"]
    assert copies == [f"--from=build {VENV_IN_IMAGE} {VENV_IN_IMAGE}"]
    user = [i.args for i in runtime if i.op == "USER"]
    assert user == ["65532:65532"], "the runtime stage runs as the chart's non-root uid"
    assert ops.index("USER") > max(k for k, op in enumerate(ops) if op in ("RUN", "COPY"))
    useradd = next(i.args for i in runtime if i.op == "RUN")
    assert "--uid 65532" in useradd and "--gid 65532" in useradd
    entry = next(i.args for i in runtime if i.op == "ENTRYPOINT")
    assert json.loads(entry) == ["kallot"]
    path = _env(next(i for i in runtime if i.op == "ENV" and "PATH=" in i.args))["PATH"]
    assert path.split(":")[0] == f"{VENV_IN_IMAGE}/bin"

    labels = " ".join(i.args for i in runtime if i.op == "LABEL")
    keys = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", labels))
    assert {
        f"org.opencontainers.image.{k}"
        for k in ("title", "description", "version", "revision", "created", "source", "licenses")
    } <= keys
    assert 'licenses="' + str(pyproject()["project"]["license"]) + '"' in labels  # type: ignore[index]


def test_lock_is_the_closure_of_the_pyproject_pins() -> None:
    pins = lock_pins()
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", v) for v in pins.values()), pins
    deps = pyproject()["project"]["dependencies"]  # type: ignore[index]
    for dep in deps:
        name, version = _requirement(dep)
        assert version, f"pyproject.toml: {dep!r} is not pinned with =="
        assert pins.get(name) == version, (
            f"requirements.lock has {name}=={pins.get(name)}, pyproject.toml pins {version}: "
            "run make lock"
        )
    assert "kallot" not in pins


@pytest.mark.slow
def test_build_stage_installs_exactly_the_lock_and_the_entrypoint_starts(tmp_path: Path) -> None:
    """Every RUN of the build stage, in order, with the image's paths mapped into tmp_path: the
    environment ends up holding the lock and kallot and nothing else; then the ENTRYPOINT, from
    that environment, starts the scheduler and the agent (``--help``)."""
    build = parse(DOCKERFILE.read_text())[0]
    venv = tmp_path / "opt-kallot"
    work = tmp_path / "src"
    work.mkdir()
    shims = tmp_path / "bin"
    shims.mkdir()
    # `python` and `pip` of the base image: this interpreter and its pip.
    (shims / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (shims / "pip").write_text(f'#!/bin/sh\nexec {sys.executable} -m pip "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    ran = []
    for ins in build[1:]:
        if ins.op == "ENV":
            # The pip cache only changes how fast, not what is installed: keep this machine's.
            env.update({k: v for k, v in _env(ins).items() if k != "PIP_NO_CACHE_DIR"})
        elif ins.op == "COPY":
            *sources, _dest = shlex.split(ins.args)
            for s in sources:
                src = ROOT / s
                if src.is_dir():
                    shutil.copytree(src, work / s, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(src, work / s)
        elif ins.op == "RUN":
            cmd = ins.args.replace(VENV_IN_IMAGE, str(venv))
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", cmd],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            assert done.returncode == 0, f"RUN {ins.args}\n{done.stdout}\n{done.stderr}"
            ran.append(ins.args)
        else:
            assert ins.op == "WORKDIR", f"the test does not know how to run {ins.op}"
    assert any("requirements.lock" in r for r in ran)

    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    listed = subprocess.run(
        [*pip, "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    installed = dict(_requirement(f"{p['name']}=={p['version']}") for p in json.loads(listed))
    version = str(pyproject()["project"]["version"])  # type: ignore[index]
    assert installed == {**lock_pins(), "kallot": version}

    runtime = parse(DOCKERFILE.read_text())[1]
    entry = json.loads(next(i.args for i in runtime if i.op == "ENTRYPOINT"))
    exe = str(venv / "bin" / entry[0])
    clean_env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    for component in (["scheduler", "--help"], ["agent", "run", "--help"], ["--version"]):
        out = subprocess.run(
            [exe, *entry[1:], *component],
            capture_output=True,
            text=True,
            env=clean_env,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        if component[-1] == "--help":
            assert "Usage:" in out.stdout
        else:
            assert out.stdout.strip() == f"kallot {version}"


def test_hadolint_passes_and_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    ok = subprocess.run(
        [str(HADOLINT), "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install kallot\n")
    caught = subprocess.run(
        [str(HADOLINT), str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert caught.returncode != 0
    assert "DL3007" in caught.stdout and "DL3013" in caught.stdout


def _make_image_tag() -> str:
    dry = subprocess.run(
        ["make", "-s", "-n", "image"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    tags: list[str] = re.findall(r"-t (\S+)", dry)
    assert len(tags) == 1, dry
    return tags[0]


def test_chart_and_manifests_run_the_tag_make_image_builds() -> None:
    tag = _make_image_tag()
    repo, _, version = tag.rpartition(":")
    assert version == pyproject()["project"]["version"]  # type: ignore[index]
    chart = yaml.safe_load((ROOT / "charts" / "kallot" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts" / "kallot" / "values.yaml").read_text())
    assert chart["appVersion"] == version
    assert values["image"]["repository"] == repo
    assert values["image"]["tag"] in ("", version)
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "kallot.yaml").read_text()) if d]
    images = {
        c["image"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {tag}
