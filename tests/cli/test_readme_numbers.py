"""The README's figures are what the commands print: each is read from the README and compared
with the command's JSON (or, for the openb headline over 8 workloads x 10 seeds, with the JSON
``bench/openb_quality.py`` wrote for BENCHMARKS.md). A number that drifts fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from kallot.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
README = " ".join((ROOT / "README.md").read_text().split())


def _json(args: list[str], out: Path) -> dict[str, object]:
    res = CliRunner().invoke(app, [*args, "--json", str(out), "--report", "r.html"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert isinstance(doc, dict)
    return doc


def test_openb_headline_ratios_are_the_benchmark_run() -> None:
    doc = json.loads((ROOT / "bench" / "out" / "openb_quality.json").read_text())
    ratios = {w: r["kallot"]["ratio_to_fgd"] for w, r in doc["results"].items()}
    assert len(ratios) == 8
    lo, hi = min(ratios.values()), max(ratios.values())
    assert f"leaves {lo:.2f}-{hi:.2f} × FGD's unallocated GPUs" in README
    under = sum(r <= 0.85 for r in ratios.values())
    assert f"at or under 0.85 × on {under} of the 8 workloads" in README
    assert f"gpushare40 at the edge with {ratios['gpushare40']:.3f}" in README
    assert f"gpushare80 at {ratios['gpushare80']:.3f}" in README


def test_the_readme_headline_command_runs_on_a_fresh_checkout() -> None:
    """`sim compare --workload default --workload gpushare40` with no $KALLOT_OPENB_DIR (one
    seed and two policies here: the README's ten seeds of every policy take minutes)."""
    assert "kallot sim compare --workload default --workload gpushare40 --seeds 42..51" in README
    args = ["sim", "compare", "--workload", "default", "--workload", "gpushare40", "--seed", "42"]
    res = CliRunner().invoke(
        app,
        [*args, "--policy", "fgd", "--policy", "kallot", "--jobs", "2"],
        env={"KALLOT_OPENB_DIR": None},
    )
    assert res.exit_code == 0, res.output
    assert "openb gpushare40: 1 seed(s)" in res.output
    assert Path("kallot-report/compare.html").is_file()


def test_fleet_figures(tmp_path: Path) -> None:
    doc = _json(["sim", "fleet", "--seed", "0", "--services", "300"], tmp_path / "f.json")
    need = doc["gpus_needed"]
    assert isinstance(need, dict)
    ratio = need["kallot"] / need["integer"]
    want = (
        f"On seed 0 with 300 services, integer allocation needs {need['integer']} GPUs and kallot "
        f"needs {need['kallot']} ({ratio:.3f})"
    )
    assert want in README
    m = re.search(
        r"Time-slicing needs (\d+) GPUs, but (\d+) of them run out of memory and (\d+)", README
    )
    assert m is not None
    assert int(m[1]) == need["time-slicing"]
    by = doc["by_strategy"]
    assert isinstance(by, dict)
    ts = by["time-slicing"]
    assert (int(m[2]), int(m[3])) == (ts["memory_overcommit_events"], ts["isolation_violations"])
    assert "with 0 memory over-commit and 0 isolation violations" in README
    assert (doc["memory_overcommit_events"], doc["isolation_violations"]) == (0, 0)


def test_tenants_figures(tmp_path: Path) -> None:
    args = ["sim", "tenants", "--seed", "0", "--policy", "bestfit"]
    doc = _json(args, tmp_path / "t.json")
    jain = doc["jain_index"]
    assert isinstance(jain, dict)
    assert (
        f"Jain's index is {jain['fifo']:.3f} for FIFO and {jain['kallot']:.3f} for kallot, with "
        f"{doc['quota_violations']} quota violations"
    ) in README
