"""``kallot sim autoscale`` (sim.autoscale): every pod is bound, consolidation evicts nothing
protected, kallot's plans match the packing optimum and use fewer GPU-hours than integer
counting; and the command writes its JSON and plot."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kallot.cli.main import app
from kallot.sim import autoscale


def test_policies_on_a_small_workload() -> None:
    results = autoscale.compare(3, 120, "shares")
    for r in results.values():
        assert r.bound == r.pods > 0
        assert r.protected_evictions == 0
        assert r.nodes_requested >= r.nodes_optimum > 0
    k, i = results["kallot"], results["integer"]
    assert k.nodes_vs_optimum <= 1.05
    assert k.gpu_hours < i.gpu_hours
    assert results["kallot+consolidate"].evictions > 0  # consolidation did act


def test_optimum_nodes_is_the_lp_bound() -> None:
    pods, _ = autoscale.workload(0, 50, "shares")
    tasks = [p.task for p in pods]
    total = sum(t.gpu.milli for t in tasks if t.gpu is not None)
    n = autoscale.optimum_nodes(tasks, autoscale.SHAPE)
    assert n * autoscale.SHAPE.gpus * 1000 >= total  # no fewer GPUs than the compute asked
    assert autoscale.optimum_nodes([], autoscale.SHAPE) == 0


def test_cli_writes_json_plot_and_report(tmp_path: Path) -> None:
    out, png, page = tmp_path / "a.json", tmp_path / "a.png", tmp_path / "a.html"
    args = ["sim", "autoscale", "--pods", "60", "--seed", "1", "--mix", "shares"]
    result = CliRunner().invoke(
        app, [*args, "--json", str(out), "--plot", str(png), "--report", str(page)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data["by_policy"]) == set(autoscale.POLICIES)
    assert all(v["protected_evictions"] == 0 for v in data["by_policy"].values())
    assert png.stat().st_size > 10_000
    assert "data:image/png;base64," in page.read_text()


def test_cli_rejects_an_unknown_mix() -> None:
    result = CliRunner().invoke(app, ["sim", "autoscale", "--mix", "nope"])
    assert result.exit_code == 2
    assert "--mix: got 'nope', expected one of openb, shares" in result.output
