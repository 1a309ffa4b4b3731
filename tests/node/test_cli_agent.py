"""``kallot agent inventory``: the fake backend through the CLI, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from kallot.cli.main import app

DATA = Path(__file__).parent / "data"


def test_inventory_json_from_file() -> None:
    result = CliRunner().invoke(
        app,
        [
            "agent",
            "inventory",
            "--inventory-file",
            str(DATA / "mig-a100-mixed.yaml"),
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [d["mode"] for d in doc["inventory"]["devices"]] == ["mig", "exclusive"]
    assert doc["labels"]["nvidia.com/mig.strategy"] == "mixed"


def test_bad_inventory_file_is_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text((DATA / "pcie-l40s-8.yaml").read_text().replace("numa: 1", "numa: -7", 1))
    result = CliRunner().invoke(app, ["agent", "inventory", "--inventory-file", str(bad)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert f"{bad}: gpus.4.numa: got -7, expected" in result.output


def test_metrics_prints_one_scrape() -> None:
    result = CliRunner().invoke(
        app,
        [
            "agent",
            "metrics",
            "--inventory-file",
            str(DATA / "hgx-h100-8.yaml"),
            "--node-name",
            "n1",
        ],
    )
    assert result.exit_code == 0, result.output
    families = {f.name: f for f in text_string_to_metric_families(result.output)}
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert [s.value for s in util] == [10.0 * i for i in range(8)]
    assert {s.labels["Hostname"] for s in util} == {"n1"}


def test_no_nvidia_driver_is_a_clear_error() -> None:
    result = CliRunner().invoke(app, ["agent", "inventory"])
    # On a machine with a GPU this prints the inventory instead.
    if result.exit_code != 0:
        assert result.exit_code == 2
        assert "--inventory-file" in result.output and "Traceback" not in result.output
