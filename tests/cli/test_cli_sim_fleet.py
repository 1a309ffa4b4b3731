"""``kallot sim fleet``: runs, writes the JSON the issue names and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kallot.cli.main import app


def test_sim_fleet_writes_json_plot_and_report(tmp_path: Path) -> None:
    out, png, page = tmp_path / "fleet.json", tmp_path / "fleet.png", tmp_path / "fleet.html"
    args = ["sim", "fleet", "--services", "40", "--seed", "1", "--json", str(out)]
    result = CliRunner().invoke(app, [*args, "--plot", str(png), "--report", str(page)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data["gpus_needed"]) == {
        "integer",
        "time-slicing",
        "mps",
        "mig-static",
        "mig-dynamic",
        "kallot",
    }
    assert data["seed"] == 1
    assert data["memory_overcommit_events"] == 0 and data["isolation_violations"] == 0
    assert png.stat().st_size > 10_000
    assert "kallot needs" in result.output
    text = page.read_text()
    assert "data:image/png;base64," in text and "mig-dynamic" in text


def test_sim_fleet_rejects_an_unknown_policy() -> None:
    result = CliRunner().invoke(app, ["sim", "fleet", "--policy", "nope"])
    assert result.exit_code == 2
    assert "'nope' is not one of" in result.output
