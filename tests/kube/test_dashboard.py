"""The chart's Grafana dashboards (charts/kallot/dashboards/: kallot.json and rightsizing.json):
each loads, has the shape
Grafana's dashboard schema requires (ids, grid positions on the 24-column grid, a Prometheus
query per target, template variables), shows what operators ask for, and every metric it
queries is one the scheduler or the agent really exports (names taken from their registries).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kallot.kube.ops.metrics import Metrics
from kallot.kube.state.cache import Cache
from kallot.node.discovery import build_inventory
from kallot.node.exporter import ExporterState, GpuCollector, make_registry
from kallot.node.fake import FakeBackend

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "charts" / "kallot" / "dashboards"
DASHBOARD = DASHBOARDS / "kallot.json"
ALL = sorted(DASHBOARDS.glob("*.json"))
INVENTORY = ROOT / "tests" / "node" / "data" / "hgx-h100-8.yaml"

PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "table", "bargauge", "heatmap"}
METRIC = re.compile(r"\b(kallot_[a-z_]+|DCGM_FI_[A-Z_]+)\b")


def _exported(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry exposes (a counter X as X_total, a histogram's parts)."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gauge": ("",),
    }
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names


def exported_metrics() -> set[str]:
    scheduler = _exported(Metrics(Cache).registry)
    backend = FakeBackend.from_file(INVENTORY)
    inv = build_inventory(backend.raw(), backend.sharing())
    agent = _exported(make_registry(GpuCollector(ExporterState(node="n", inventory=inv))))
    return scheduler | agent


def _panels() -> list[dict[str, Any]]:
    return list(json.loads(DASHBOARD.read_text())["panels"])


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_dashboard_has_grafana_s_dashboard_shape(path: Path) -> None:
    dash = json.loads(path.read_text())
    for key, kind in {
        "uid": str,
        "title": str,
        "schemaVersion": int,
        "panels": list,
        "templating": dict,
        "time": dict,
        "tags": list,
    }.items():
        assert isinstance(dash.get(key), kind), key
    assert 8 <= len(dash["uid"]) <= 40
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        assert p["type"] in PANEL_TYPES, p["type"]
        g = p["gridPos"]
        assert all(isinstance(g[k], int) and g[k] >= 0 for k in ("x", "y", "w", "h"))
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"].strip()
            # every $variable used is defined (Grafana's own $__ variables aside)
            for var in re.findall(r"\$(\w+)", t["expr"]):
                assert var.startswith("__") or var in variables, var


def test_dashboard_shows_what_operators_ask_for() -> None:
    exprs = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in _panels()}

    def has(title_part: str, *needles: str) -> None:
        title = next(t for t in exprs if title_part in t)
        for n in needles:
            assert n in exprs[title], (title, n)

    has("by node", "kallot_gpu_allocated_milli", "by (node)")
    has("by model", "kallot_gpu_allocated_milli", "by (model)")
    has("by queue", "kallot_gpu_allocated_milli", "by (queue)")
    has("Pending pods by reason", "kallot_pending_pods", "by (reason)")
    has("Pod scheduling latency", "histogram_quantile", "kallot_pod_scheduling_duration_seconds")
    has("Unhealthy GPUs by node", "kallot_gpu_healthy")
    has("XID", "kallot_gpu_xid_errors_total")


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_every_queried_metric_is_exported(path: Path) -> None:
    exported = exported_metrics()
    dash = json.loads(path.read_text())
    queried = {
        m for p in dash["panels"] for t in p.get("targets", []) for m in METRIC.findall(t["expr"])
    }
    for v in dash["templating"]["list"]:
        queried |= set(METRIC.findall(json.dumps(v.get("query", ""))))
    assert queried, "the dashboard queries kallot's metrics"
    assert queried <= exported, sorted(queried - exported)
    assert "kallot_scheduling_attempts_total" in exported
    assert "kallot_no_such_metric" not in exported
