"""cli.sim's convention, run: every ``kallot sim`` command checks all its outputs together
before any work (a missing folder, a wrong extension, two outputs on one path) with one line
naming the flag, and prints tables that read at 80 columns (transposed or wrapped, never cut
with an ellipsis)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kallot.cli.main import app
from kallot.cli.sim import check_outputs
from kallot.core.errors import ConfigError

COMMANDS = ("openb", "compare", "replay", "fleet", "training", "tenants", "rightsize", "serving")

# (the outputs given, the line's start after "kallot sim X: error: ")
BAD = [
    (["--plot", "nodir/x.png"], "--plot: got 'nodir/x.png', expected a path in an existing folder"),
    (["--json", "out/x.json"], "--json: got 'out/x.json', expected a path in an existing folder"),
    (
        ["--plot", "out.txt"],
        "--plot: got 'out.txt', expected a file ending in .png or .svg or .pdf",
    ),
    (["--plot", "x.png", "--report", "x.png"], "--report: got 'x.png', expected a file ending in"),
    (
        ["--json", "same.html", "--report", "same.html"],
        "--json: got 'same.html', expected a file ending in .json",
    ),
    (
        ["--report", "r.html", "--plot", "r-1.png"],
        "--plot: got 'r-1.png', expected a path no other output uses (--report's PNG",
    ),
    (["--json", "a.json", "--plot", "a.json"], "--plot: got 'a.json', expected a file ending in"),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("outputs", "line"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_outputs_are_checked_before_any_work(command: str, outputs: list[str], line: str) -> None:
    res = CliRunner().invoke(app, ["sim", command, *outputs])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"kallot sim {command}: error: {line}"), res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert not Path("kallot-report").exists(), "nothing written"


def test_the_same_path_twice_is_refused_with_the_right_extensions(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--json: got .*, expected a file ending in .json"):
        check_outputs(json_out=tmp_path / "x.html", report=tmp_path / "x.html")
    check_outputs(json_out=tmp_path / "x.json", plot=tmp_path / "x.png", report=tmp_path / "x.html")


def test_tables_read_at_80_columns() -> None:
    """`sim openb` (ten columns, one policy) is transposed; `sim fleet`'s short headers have a
    legend; nothing is cut (no ellipsis) and no line is wider than the terminal."""
    env = {"COLUMNS": "80"}
    runner = CliRunner()
    for args in (
        ["sim", "openb", "--seed", "1", "--jobs", "1"],
        ["sim", "fleet", "--services", "30"],
        ["sim", "compare", "--seeds", "1", "--policy", "fgd", "--policy", "kallot", "--jobs", "1"],
    ):
        res = runner.invoke(app, args, env=env)
        assert res.exit_code == 0, res.output
        assert "…" not in res.output, res.output
        widths = [len(line) for line in res.output.splitlines()]
        assert max(widths) <= 80, res.output
    assert "alloc@80 %" in res.output and "÷ fgd" in res.output
