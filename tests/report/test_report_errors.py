"""``kallot report waste`` / ``kallot rightsize`` errors, one line each, against a real
Prometheus (built by tools/testenv/build-prometheus.sh): unreachable, no kallot metrics, an
empty window; and the waste arithmetic on hand-made series (no Prometheus)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kallot.cli.main import app
from kallot.config.device_record import DeviceRecord, RecordDevice
from kallot.node.allocate import PodRecord
from kallot.node.discovery import MIB, GpuProcess, build_inventory
from kallot.node.exporter import ExporterState, GpuCollector, make_registry, serve
from kallot.node.fake import FakeBackend
from kallot.report import waste
from kallot.report.prices import load_prices
from kallot.testing.prometheus import Prometheus

DATA = Path(__file__).parents[1] / "node" / "data"
DASHBOARD = Path(__file__).parents[2] / "charts" / "kallot" / "dashboards" / "rightsizing.json"


def _run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.output


def test_unreachable_and_bad_arguments(tmp_path: Path) -> None:
    code, out = _run("report", "waste", "--prometheus", "http://127.0.0.1:9", "--since", "1h")
    assert code == 2 and "Prometheus at http://127.0.0.1:9 is unreachable" in out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1
    code, out = _run("rightsize", "--prometheus", "localhost:9090")
    assert code == 2 and "--prometheus: got 'localhost:9090', expected an http(s)" in out
    bad = tmp_path / "p.yaml"
    bad.write_text("perGpuHour: {H100-80GB: cheap}\n")
    code, out = _run("report", "waste", "--prometheus", "http://127.0.0.1:9", "--prices", str(bad))
    assert code == 2 and "perGpuHour.H100-80GB: got 'cheap'" in out


@pytest.fixture
def exporter() -> Iterator[int]:
    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    inv = build_inventory(backend.raw(), backend.sharing())
    gpu = inv.devices[0].uuid
    rec = DeviceRecord(
        node="n1", devices=(RecordDevice(index=0, uuid=gpu, milli=1000, mem_mib=81559, mode="mps"),)
    )
    uid = "11111111-2222-3333-4444-555555555555"
    collector = GpuCollector(ExporterState(node="n1", inventory=inv), pod_of_pid={7: uid}.get)
    collector.update(
        pods=[PodRecord(namespace="ml", name="a", uid=uid, record=rec)],
        processes=[GpuProcess(gpu, 7, 1024 * MIB, sm_util_pct=5.0)],
    )
    httpd, port = serve(make_registry(collector), "127.0.0.1:0")
    yield port
    httpd.shutdown()


@pytest.mark.controlplane
def test_missing_metrics_and_empty_window(exporter: int) -> None:
    with Prometheus([]) as empty:
        code, out = _run("report", "waste", "--prometheus", empty.url, "--since", "1h")
        assert code == 2
        assert "has no kallot_pod_gpu_compute_allocated_milli" in out and "scraped?" in out
    with Prometheus([f"127.0.0.1:{exporter}"]) as prom:
        prom.wait_for("kallot_pod_gpu_compute_used_milli")
        # a window long before anything was scraped
        code, out = _run(
            "rightsize", "--prometheus", prom.url, "--since", "1h", "--end", "1000000000"
        )
        assert code == 2 and "the window is empty" in out and "2001-09-09T01:46:40Z" in out
        # the dashboard's queries are valid PromQL and find the agent's series
        board = json.loads(DASHBOARD.read_text())
        for panel in board["panels"]:
            for target in panel["targets"]:
                assert prom.query(target["expr"]), target["expr"]


def test_waste_arithmetic_on_hand_made_series() -> None:
    window = waste.Window(0.0, 3.0, 1.0)  # 4 points
    nan = np.nan
    mig = waste.PodDevice(
        labels={
            "cluster": "c1",
            "namespace": "ml",
            "pod": "m",
            "UUID": "MIG-1",
            "Hostname": "n",
            "GPU_I_PROFILE": "3g.40gb",
            "modelName": "NVIDIA A100-SXM4-80GB",
            "workload": "Job/train",
        },
        # a 3g.40gb: 428 milli, 40960 MiB allocated for 3 of 4 points; no compute samples
        alloc_milli=np.array([nan, 428, 428, 428]),
        alloc_mem_mib=np.array([nan, 40960, 40960, 40960]),
        used_milli=np.full(4, nan),
        used_mem_mib=np.array([nan, 8192, 81920, 0]),
        gpu_mem_mib=81920,
    )
    w = waste.waste([mig], window, {"A100-80GB": 3.6})
    row = w.workloads["ml/Job/train"]
    # allocated max(0.428, 0.5) = 0.5 x 3 s; used by memory 0.1, 1.0 (capped at 0.5), 0
    assert row.allocated_h == pytest.approx(1.5 / 3600)
    assert row.used_h == pytest.approx((0.1 + 0.5 + 0) / 3600)
    assert row.idle_h == pytest.approx((0.4 + 0 + 0.5) / 3600)
    assert row.cost == pytest.approx(3.6 * 1.5 / 3600)
    assert waste.request_of(mig).mig_profile == "3g.40gb"
    (u,) = waste.usages([mig], window)
    assert u.usage.samples == 3 and u.usage.milli.size == 0


def test_docs_price_example_loads(tmp_path: Path) -> None:
    page = (Path(__file__).parents[2] / "docs" / "rightsizing.md").read_text()
    (block,) = [b for b in page.split("```yaml\n")[1:] if "perGpuHour" in b]
    path = tmp_path / "prices.yaml"
    path.write_text(block.split("```")[0])
    prices = load_prices(path)
    assert prices.currency == "USD"
    assert prices.table() == {"H100-80GB": 4.0, "A100-80GB": 2.5}
