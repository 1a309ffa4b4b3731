"""``kallot sim training`` end to end: JSON keys, PNG written, bad input gets a clear error."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kallot.cli.main import app


def test_sim_training_writes_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    args = ["sim", "training", "--training-jobs", "10", "--racks", "2", "--nodes-per-rack", "2"]
    result = CliRunner().invoke(app, [*args, "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    for key in ("gangs", "est_job_time_ratio", "partial_gangs_after_session", "seed"):
        assert key in data
    assert set(data["in_one_island_pct"]) == {"blind", "kallot"}
    assert set(data["in_one_rack_pct"]) == {"blind", "kallot"}
    assert data["partial_gangs_after_session"] == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "topology-blind vs kallot" in result.output


def test_sim_training_rejects_bad_input_by_name() -> None:
    result = CliRunner().invoke(app, ["sim", "training", "--locality", "2"])
    assert result.exit_code == 2
    assert "--locality" in result.output


def test_sim_training_names_a_bad_gang_mode() -> None:
    result = CliRunner().invoke(app, ["sim", "training", "--training-jobs", "2", "--gang", "hard"])
    assert result.exit_code == 2
    assert "'hard'" in result.output and "--gang" in result.output
