"""`kallot sim openb|compare|replay` end to end on small CSVs: JSON keys, report, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kallot.cli.main import app
from kallot.sim import trace

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("openb")
    nodes = [n for n in trace.read_nodes(trace.bundled(trace.BUNDLED_NODES)) if n.gpus][::60]
    node_csv = d / "nodes.csv"
    node_csv.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpus},{n.model}\n" for n in nodes)
    )
    lines = trace.bundled(trace.BUNDLED_DEFAULT).read_text().splitlines()
    pod_csv = d / "openb_pod_list_tiny.csv"
    pod_csv.write_text("\n".join([lines[0], *lines[1::40]]) + "\n")
    return node_csv, pod_csv


def test_openb_json_has_the_documented_keys(files: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = files
    out, report = tmp_path / "r.json", tmp_path / "rep" / "openb.html"
    report.parent.mkdir()  # an output's folder must exist (cli.sim; kallot-report/ is made)
    args = ["sim", "openb", "--workload", str(pods), "--node-list", str(nodes), "--seeds", "1..2"]
    res = runner.invoke(app, [*args, "--json", str(out), "--report", str(report), "--jobs", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["workload"] == "tiny" and doc["policy"] == "kallot" and doc["seeds"] == [1, 2]
    assert set(doc["unallocated_pct_at_100"]) == {"mean", "sd"}
    assert set(doc["alloc_pct_at"]) == {"80", "90", "100", "130"}
    assert 0 < doc["alloc_pct_at"]["80"] <= 100
    for key in ("frag_pct_at_100", "placements", "wall_s"):
        assert doc[key] >= 0
    assert doc["placements"] <= doc["attempts"]
    html = report.read_text()
    assert html.count("data:image/png;base64,") >= 2  # self-contained: plots inlined
    assert len(list(report.parent.glob("*.png"))) >= 2


def test_compare_ratio_to_fgd(files: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = files
    out = tmp_path / "c.json"
    args = ["sim", "compare", "--workload", str(pods), "--node-list", str(nodes), "--seeds", "3"]
    res = runner.invoke(
        app,
        [
            *args,
            *("--policy", "fgd", "--policy", "bestfit", "--jobs", "2"),
            *("--json", str(out), "--report", str(tmp_path / "c.html")),
        ],
    )
    assert res.exit_code == 0, res.output
    docs = {d["policy"]: d for d in json.loads(out.read_text())}
    assert docs["fgd"]["ratio_to_fgd"] == pytest.approx(1.0)
    want = (
        docs["bestfit"]["unallocated_pct_at_100"]["mean"]
        / docs["fgd"]["unallocated_pct_at_100"]["mean"]
    )
    assert docs["bestfit"]["ratio_to_fgd"] == pytest.approx(want)


def test_compare_several_workloads(files: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = files
    lines = pods.read_text().splitlines()
    other = tmp_path / "openb_pod_list_other.csv"
    other.write_text("\n".join([lines[0], *lines[1::2]]) + "\n")  # every second pod of tiny
    out, rep = tmp_path / "c.json", tmp_path / "c" / "c.html"
    rep.parent.mkdir()
    res = runner.invoke(
        app,
        [
            *("sim", "compare", "--workload", str(pods), "--workload", str(other)),
            *(
                "--node-list",
                str(nodes),
                "--seeds",
                "3..4",
                "--policy",
                "fgd",
                "--policy",
                "kallot",
            ),
            *("--jobs", "2", "--json", str(out), "--report", str(rep)),
        ],
    )
    assert res.exit_code == 0, res.output
    docs = {(d["workload"], d["policy"]): d for d in json.loads(out.read_text())}
    assert set(docs) == {(w, p) for w in ("tiny", "other") for p in ("fgd", "kallot")}
    for w in ("tiny", "other"):  # each ratio is to FGD on the same workload
        fgd, kallot = docs[(w, "fgd")], docs[(w, "kallot")]
        assert kallot["seeds"] == [3, 4]
        want = kallot["unallocated_pct_at_100"]["mean"] / fgd["unallocated_pct_at_100"]["mean"]
        assert kallot["ratio_to_fgd"] == pytest.approx(want)
    # the two workloads really differ (half the pods), so their runs were not mixed up
    assert docs[("tiny", "fgd")]["placements"] != docs[("other", "fgd")]["placements"]
    html = rep.read_text()
    assert html.count("<table>") == 2 and html.count("data:image/png;base64,") == 1


def test_replay_reports_delays(files: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = files
    out = tmp_path / "rp.json"
    res = runner.invoke(
        app,
        [
            *("sim", "replay", "--workload", str(pods), "--node-list", str(nodes)),
            *("--node-fraction", "1", "--speedup", "1000"),
            *("--json", str(out), "--report", str(tmp_path / "rp.html")),
        ],
    )
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "p99" in text and "mean_alloc_pct" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--policy", "best"], "--policy", id="unknown-policy"),
        pytest.param(["--seeds", "9..1"], "--seeds", id="bad-seeds"),
        pytest.param(["--seeds", "1..100000000"], "at most 10,000 seeds", id="too-many-seeds"),
        pytest.param(["--workload", "nope"], "--workload", id="unknown-workload"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str) -> None:
    """Through the console script, as a user runs it (cli.ui.run_app formats usage errors)."""
    import subprocess
    import sys

    kallot = Path(sys.executable).parent / "kallot"
    res = subprocess.run(
        [str(kallot), "sim", "openb", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 2
    (line,) = res.stderr.splitlines()
    assert "error:" in line and message in line
    assert res.stdout == ""


def test_bad_node_file_names_line_and_column(tmp_path: Path, files: tuple[Path, Path]) -> None:
    bad = tmp_path / "nodes.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,96000,1,eight,V100M16\n")
    res = runner.invoke(
        app, ["sim", "compare", "--node-list", str(bad), "--workload", str(files[1])]
    )
    assert res.exit_code == 2
    assert f"{bad}:2: column 'gpu'" in res.output.replace("\n", "")


def test_batch_gc_tunes_the_collector_for_the_run_and_restores_it() -> None:
    import gc

    from kallot.cli.sim_openb import BATCH_GC_THRESHOLD, batch_gc

    before = gc.get_threshold()
    assert before != BATCH_GC_THRESHOLD
    with batch_gc():
        assert gc.get_threshold() == BATCH_GC_THRESHOLD
        assert gc.get_freeze_count() > 0  # what the imports made is out of the collector's way
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
