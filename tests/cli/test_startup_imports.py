"""`kallot scheduler` starts without loading what only other commands use: the plotting stack
(matplotlib, for the sim commands' PNGs) stays out of the process (bench/live.py --drain
measures what the start-up costs)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = (
    "matplotlib",
    "kallot.sim.report",
    "kallot.sim.fleet_plot",
    "kallot.sim.tenants_plot",
    "kallot.sim.rightsize_plot",
    "kallot.sim.serving_plot",
    "kallot.report.plots",
)


def test_the_cli_imports_no_plotting_until_a_command_draws() -> None:
    code = (
        "import sys, kallot.cli.main, kallot.cli.scheduler\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert out == "", f"imported at start-up: {out}"
