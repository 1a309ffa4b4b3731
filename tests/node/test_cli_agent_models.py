"""``kallot agent models``: prints what the agent would publish about its model caches."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kallot.cli.main import app


def test_agent_models_prints_the_annotation_and_fails_on_errors(tmp_path: Path) -> None:
    (tmp_path / "org" / "m@r1").mkdir(parents=True)
    (tmp_path / "org" / "m@r1" / "config.json").write_text("{}")
    args = ["agent", "models", "--model-cache", str(tmp_path), "--model-read-gbps", "2"]
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["readBytesPerSecond"] == 2e9
    assert [(m["id"], m["revision"], m["bytes"]) for m in doc["models"]] == [("org/m", "r1", 2)]
    (tmp_path / "bad name").mkdir()
    (tmp_path / "bad name" / "config.json").write_text("{}")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "org/m@r1" in result.output and "bad name: not a model name" in result.output
    assert CliRunner().invoke(app, ["agent", "models"]).exit_code == 2
