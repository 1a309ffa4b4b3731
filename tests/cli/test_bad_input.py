"""Every bad input documented in docs/install.md ("Bad input and what kallot says") gives one
line on stderr and a non-zero exit, never a traceback or a box, before any long work; and the
table in the docs shows exactly the line each input really gets. The commands run as a user
runs them: the installed console scripts, in a scratch directory, without a kubeconfig unless
the case gives one.
"""

from __future__ import annotations

import gzip
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "install.md"
BIN = Path(sys.executable).parent
INVENTORY = ROOT / "tests" / "node" / "data" / "hgx-h100-8.yaml"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")

# (command as documented, with {busy}: a port in use); run in a scratch directory that holds
# bad.kubeconfig, unreachable.kubeconfig, header.csv, nodes-header.csv, file.txt, plugins/,
# bad-config.yaml.
CASES = [
    "kallot explain my-pod",
    "kallot explain my-pod --kubeconfig bad.kubeconfig",
    "kubectl-kallot explain my-pod",
    "KUBECONFIG=bad.kubeconfig kubectl-kallot explain my-pod",
    "kallot doctor",
    "kallot doctor --kubeconfig bad.kubeconfig",
    "kallot doctor --kubeconfig missing.kubeconfig",
    "kallot scheduler",
    "kallot scheduler --kubeconfig bad.kubeconfig",
    "kallot scheduler --policy fastest",
    "kallot scheduler --metrics-address 0.0.0.0",
    "kallot scheduler --kubeconfig unreachable.kubeconfig --metrics-address 127.0.0.1:{busy}",
    "kallot scheduler --config missing.yaml",
    "kallot scheduler --config bad-config.yaml",
    "kallot scheduler --config bad-config.yaml --policy fgd",
    "kallot sim openb --workload missing.csv",
    "kallot sim openb --workload header.csv",
    "kallot sim openb --node-list nodes-header.csv",
    "kallot sim openb --node-list no-gpus.csv",
    "kallot sim openb --workload bad-gpus.csv",
    "kallot sim openb --seeds=-1",
    "kallot sim fleet --seed -1",
    "kallot sim rightsize --trace missing.csv",
    "kallot sim openb --json file.txt/out.json",
    "kallot sim fleet --plot plugins",
    "kallot sim serving --plot nodir/x.png",
    "kallot sim openb --jobs 1 --json out/x.json",
    "kallot sim fleet --plot out.txt",
    "kallot sim fleet --plot x.png --report x.png",
    "kallot sim openb --json same.html --report same.html",
    "kallot sim tenants --report r.html --plot r-1.png",
    "kallot sim openb --seeds 51..42",
    "kallot sim openb --seed 3 --seeds 4",
    "kallot sim compare --workload default --workload cpu050",
    "KALLOT_OPENB_DIR=nowhere kallot sim compare --workload cpu050",
    "KALLOT_OPENB_DIR=plugins kallot sim compare --workload cpu050",
    "kallot sim openb --workload h100-pods.csv",
    "kallot sim openb --node-list x100-nodes.csv",
    "kallot sim replay --workload late.csv",
    "kallot sim rightsize --trace cut.csv.gz",
    "kallot sim serving --startup-s nan",
    "kallot sim tenants --hours inf",
    "kallot sim replay --speedup 0.5",
    "kallot sim replay --node-fraction 2",
    "kallot sim compare --policy fgd --policy fgd",
    "kallot sim compare --workload default --workload default",
    "kallot scheduler --check --bind-workers 0",
    "kallot scheduler --check --lease-duration 1 --renew-deadline 5",
    "kallot scheduler --check --metrics-address 0.0.0.0:99999",
    "kallot scheduler --check --min-session-pods 50 --max-session-pods 10",
    "kallot scheduler --check --lease-name Kallot_Lease",
    "kallot scheduler --config no-kind.yaml --check",
    "kallot scheduler --config list.yaml --check",
    f"kallot agent inventory --inventory-file {INVENTORY.name} --dra --node-name GPU_7",
    "kallot agent inventory --inventory-file not-a-mapping.yaml",
    "kallot sim training --gang hard",
    "kallot agent run --device-plugin-dir /nonexistent/device-plugins",
    "kallot agent run --sharing mig",
    f"kallot agent run --inventory-file {INVENTORY.name} --device-plugin-dir plugins "
    "--kubeconfig bad.kubeconfig",
    f"kallot agent run --no-kube --inventory-file {INVENTORY.name} --device-plugin-dir plugins "
    "--metrics-address 0.0.0.0",
    f"kallot agent run --no-kube --inventory-file {INVENTORY.name} --device-plugin-dir plugins "
    "--metrics-address 127.0.0.1:{busy}",
]

UNREACHABLE = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""

BAD_CONFIG = """apiVersion: kallot.io/v1alpha1
kind: KallotSchedulerConfiguration
profiles:
  - plugins:
      score:
        enabled: [{name: FGD, weight: -1}]
"""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad-input")
    (d / "bad.kubeconfig").write_text("apiVersion: v1\nclusters: [oops\n")
    (d / "unreachable.kubeconfig").write_text(UNREACHABLE)
    pods = (ROOT / "src" / "kallot" / "data" / "openb" / "openb_pod_list_default.csv").read_text()
    (d / "header.csv").write_text(pods.splitlines()[0] + "\n")
    (d / "nodes-header.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n")
    (d / "no-gpus.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\ncpu-1,64000,262144,0,\n")
    header = pods.splitlines()[0]
    (d / "bad-gpus.csv").write_text(f"{header}\np,1000,100,-1,500{',' * (header.count(',') - 4)}\n")
    (d / "file.txt").write_text("not a directory\n")
    (d / "plugins").mkdir()
    (d / "bad-config.yaml").write_text(BAD_CONFIG)
    (d / "no-kind.yaml").write_text("apiVersion: kallot.io/v1alpha1\n")
    (d / "list.yaml").write_text("- FGD\n")
    (d / "not-a-mapping.yaml").write_text("- 1\n")
    blank = "," * (header.count(",") - 5)
    (d / "h100-pods.csv").write_text(f"{header}\np,1000,100,1,1000,H100-80GB{blank}\n")
    (d / "late.csv").write_text(f"{header}\np,1000,100,1,1000,,LS,Running,500,100,500\n")
    (d / "x100-nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,8,X100\n")
    (d / "cut.csv.gz").write_bytes(gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n")[:20])
    (d / INVENTORY.name).write_text(INVENTORY.read_text())
    return d


@pytest.fixture(scope="module")
def busy() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def run(case: str, cwd: Path, busy: int) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env["HOME"] = str(cwd)  # no ~/.kube/config
    words = case.replace("{busy}", str(busy)).split()
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return subprocess.run(
        [str(BIN / words[0]), *words[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def error_line(out: subprocess.CompletedProcess[str]) -> str:
    """The one line a bad input gets (start-up log lines aside)."""
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and not LOG_LINE.match(ln)]
    assert "Traceback" not in out.stderr, out.stderr
    assert len(lines) == 1, out.stderr
    return lines[0]


def documented() -> dict[str, str]:
    """Command -> error line, from the table in docs/install.md."""
    section = DOC.read_text().split("## Bad input and what kallot says", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(.+?)` \| `(.+?)` \|$", section, flags=re.M)
    return dict(rows)


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_documented(case: str, scratch: Path, busy: int) -> None:
    out = run(case, scratch, busy)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert out.stdout == "", "failed before any work (no table, no progress)"
    line = error_line(out).replace(str(scratch), "<dir>").replace(str(busy), "{busy}")
    doc = documented()
    assert case in doc, f"docs/install.md lacks a row for `{case}`; it prints `{line}`"
    assert doc[case] == line


def test_doctor_says_once_that_the_api_server_is_unreachable(scratch: Path, busy: int) -> None:
    """Every check needs the API server: one finding says it cannot be reached (the checks
    used to repeat the same connection error seven times)."""
    out = run("kallot doctor --kubeconfig unreachable.kubeconfig", scratch, busy)
    assert out.returncode == 1, out.stderr
    findings = [ln for ln in out.stdout.splitlines() if ln.strip()]
    assert len(findings) == 2, out.stdout  # the finding and the count
    assert "cannot reach the API server" in findings[0]
    assert findings[1] == "1 error(s), 0 warning(s)"
