"""``kallot sim serving``: runs, writes the JSON the issue names and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kallot.cli.main import app


def test_sim_serving_writes_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "serving.json", tmp_path / "serving.png"
    args = ["sim", "serving", "--seed", "1", "--json", str(out), "--plot", str(png)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    for key in ("cold_starts", "ttft_p99_s", "gpu_hours"):
        assert set(data[key]) == {"blind", "cache_aware", "prewarm"}
    assert data["seed"] == 1
    assert data["load_model"]["startup_s"] == 15.0
    assert data["prewarm_budget"] == {"keep_threshold": 1.0, "keep_budget": 0.1}
    kept, hours = data["prewarm_kept_gpu_hours"], data["gpu_hours"]
    assert 0 < kept <= 0.1 * (hours["prewarm"] - kept)
    assert png.stat().st_size > 10_000
    assert "p99 time to first token" in result.output


def test_sim_serving_rejects_a_negative_keep_budget(tmp_path: Path) -> None:
    args = ["sim", "serving", "--keep-budget", "-0.5", "--plot", str(tmp_path / "p.png")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--keep-budget" in result.output and "Traceback" not in result.output
