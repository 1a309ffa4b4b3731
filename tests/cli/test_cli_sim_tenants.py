"""``kallot sim tenants`` end to end: issue 7's JSON keys, PNG written, bad input named."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kallot.cli.main import app


def test_sim_tenants_writes_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    args = ["sim", "tenants", "--nodes", "6", "--hours", "1", "--period", "120", "--seed", "3"]
    result = CliRunner().invoke(app, [*args, "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data["jain_index"]) == {"fifo", "kallot"}
    assert all(0.0 < v <= 1.0 for v in data["jain_index"].values())
    assert data["quota_violations"] == 0
    assert data["do_not_disrupt_evictions"] == 0
    assert data["partial_gang_evictions"] == 0
    assert data["min_runtime_evictions"] == 0
    assert data["preempted_gpu_hours"] >= 0
    assert data["seed"] == 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "FIFO + static quotas vs kallot queues" in result.output


def test_sim_tenants_names_bad_input() -> None:
    result = CliRunner().invoke(app, ["sim", "tenants", "--nodes", "5000", "--hours", "0.1"])
    assert result.exit_code == 2
    assert "nodes: got 5000" in result.output
