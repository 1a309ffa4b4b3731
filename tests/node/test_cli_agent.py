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


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["agent", "run", "--node-name", "n1", *args])
    return result.exit_code, result.output


def _bad_flag_cases(tmp_path: Path, busy_port: int) -> list[tuple[list[str], str]]:
    plugin_dir = tmp_path / "dp"
    plugin_dir.mkdir()
    not_yaml = tmp_path / "kubeconfig-broken"
    not_yaml.write_text("apiVersion: v1\nclusters: [\n")
    empty = tmp_path / "kubeconfig-empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    inv = str(DATA / "hgx-h100-8.yaml")  # has a sharing section (mps)
    base = [f"--inventory-file={inv}", f"--device-plugin-dir={plugin_dir}"]
    local = "--metrics-address=127.0.0.1:0"
    return [
        (
            [*base, local, f"--kubeconfig={not_yaml}"],
            f"--kubeconfig: got '{not_yaml}', expected a valid kubeconfig (",
        ),
        (
            [*base, local, f"--kubeconfig={empty}"],
            "expected a valid kubeconfig (no clusters, users, contexts)",
        ),
        (
            [*base, local, f"--kubeconfig={tmp_path / 'nope'}"],
            "--kubeconfig: got",
        ),
        (
            [
                f"--inventory-file={inv}",
                f"--device-plugin-dir={tmp_path / 'missing'}",
                local,
                "--no-kube",
            ],
            "--device-plugin-dir: got",
        ),
        (
            [*base, "--metrics-address=9400", "--no-kube"],
            "--metrics-address: got '9400', expected host:port",
        ),
        (
            [*base, f"--metrics-address=127.0.0.1:{busy_port}", "--no-kube"],
            "expected an address this node can listen on (in use)",
        ),
        ([*base, local, "--no-kube", "--sharing=time-slicing"], "--sharing: got 'time-slicing'"),
        ([*base, local, "--no-kube", "--replicas=4"], "--replicas: got 4"),
        ([*base, local, "--no-kube", "--mig-reconfigure"], "--mig-reconfigure needs the API"),
    ]


def test_bad_run_flags_are_one_line_and_exit_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        for args, expected in _bad_flag_cases(tmp_path, busy.getsockname()[1]):
            code, out = _run(*args)
            print(out.strip())
            assert code == 2, (args, out)
            assert "Traceback" not in out and out.count("\n") == 1, out
            assert expected in out, out


def test_sharing_flags_apply_to_a_file_without_a_sharing_section(tmp_path: Path) -> None:
    import yaml

    doc = yaml.safe_load((DATA / "hgx-h100-8.yaml").read_text())
    del doc["sharing"]
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(
        app,
        [
            "agent",
            "inventory",
            f"--inventory-file={path}",
            "--sharing=time-slicing",
            "--replicas=4",
            "--format=json",
        ],
    )
    assert result.exit_code == 0, result.output
    devices = json.loads(result.output)["inventory"]["devices"]
    assert {(d["mode"], d["replicas"]) for d in devices} == {("time-slicing", 4)}


def test_inventory_refuses_sharing_flags_the_file_overrides() -> None:
    result = CliRunner().invoke(
        app,
        ["agent", "inventory", f"--inventory-file={DATA / 'hgx-h100-8.yaml'}", "--replicas=4"],
    )
    assert result.exit_code == 2
    assert "--replicas: got 4, expected not set together with an --inventory-file" in result.output
