"""`kallot scheduler` starts without loading what only other commands use: the plotting stack
(matplotlib, for the sim commands' PNGs) stays out of the process (bench/live.py --drain
measures what the start-up costs); neither do the modules it needs only later or never before
its first bind (rich, HiGHS, the CEL package's shell, the queue actions, the autoscaling loops,
the synchronous Kubernetes client: bench/dra.py measures pods/s from the process start); the
openb simulator reads a configuration document without the live scheduler's queue actions and
consolidation planner."""

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


def _imported(code: str, modules: tuple[str, ...], env: dict[str, str] | None = None) -> str:
    """Which of ``modules`` a fresh interpreter has imported after running ``code``
    (comma-separated, "" when none)."""
    probe = f"import sys\nprint(','.join(m for m in {modules!r} if m in sys.modules))\n"
    out = subprocess.run(
        [sys.executable, "-c", code + probe], check=True, capture_output=True, text=True, env=env
    ).stdout.splitlines()
    return out[-1]


def test_the_cli_imports_no_plotting_until_a_command_draws() -> None:
    out = _imported("import kallot.cli.main, kallot.cli.scheduler\n", HEAVY)
    assert out == "", f"imported at start-up: {out}"


#: What the live scheduler's process must not import up to its first bind (BENCHMARKS.md, "Issue
#: 36 item 4, from process start"): each was on that path once, 0.01-0.2 s of CPU each.
NOT_BEFORE_FIRST_BIND = (
    "rich",  # cli.ui draws tables and errors; the scheduler draws none
    "highspy",  # core.packing's LPs: kallot's score prices shares with one when it needs to
    "prompt_toolkit",  # the CEL package's interactive shell (config.dra_cel_crate)
    "pygments",
    "cel.cli",
    "kallot.core.actions.queue",  # once Queue objects exist
    "kallot.core.actions.preempt",
    "kallot.kube.autoscale.scaleup",  # when the configuration turns autoscaling on
    "kallot.kube.autoscale.consolidate",
    "kallot.core.provision.plan",
    "requests",  # the synchronous kubernetes package's (cli.main._without_sync_kubernetes)
    "oauthlib",
    "websocket",
)


def test_the_scheduler_imports_nothing_it_does_not_need_before_its_first_bind() -> None:
    """The scheduler's own start-up (``kallot scheduler``, validated with ``--check``), then a
    DeviceClass selector compiled as the DRA cache compiles it."""
    code = (
        "import sys\n"
        "from kallot.cli import main\n"
        "sys.argv = ['kallot', 'scheduler', '--check']\n"
        "try:\n"
        "    main.main()\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "from kallot.config import dra_cel\n"
        "dra_cel.compile_selector('device.driver == \"gpu.nvidia.com\"', 'x')\n"
    )
    out = _imported(code, NOT_BEFORE_FIRST_BIND, env=_env())
    assert out == "", f"imported by the scheduler's start-up: {out}"


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "HOME": "/nonexistent"}  # no kubeconfig is read by --check


#: The live scheduler's machinery that reading a configuration document must not pull in: the
#: openb simulator reads the shipped YAML (config.scheduler, config.autoscale) and runs none of it.
LIVE_ONLY = (
    "kallot.core.actions.queue",
    "kallot.core.actions.preempt",
    "kallot.core.actions.reclaim",
    "kallot.core.provision.consolidate",
)


def test_the_openb_simulator_imports_no_live_only_machinery() -> None:
    code = (
        "import kallot.cli.sim_openb\n"
        "from kallot.config import presets\n"
        "presets.framework(presets.document('kallot', None), name='kallot')\n"
    )
    out = _imported(code, LIVE_ONLY)
    assert out == "", f"imported by the openb simulator's start-up: {out}"


def test_help_imports_no_command_module() -> None:
    """`kallot --help` and `kallot sim --help` list the commands from cli.main's tables: numpy,
    the core and the commands' modules stay out (their import is about a second of CPU; the
    help takes about 0.12 s of CPU, BENCHMARKS.md "Issue 39")."""
    code = (
        "import sys\n"
        "from kallot.cli import main\n"
        "for args in (['--help'], ['sim', '--help'], ['report', '--help']):\n"
        "    sys.argv = ['kallot', *args]\n"
        "    try:\n"
        "        main.main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('numpy', 'kallot.core.policies', 'kallot.sim', 'kubernetes', 'pydantic')\n"
        "print(','.join(m for m in sys.modules if m.startswith(heavy)), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stderr.strip() == "", f"imported by --help: {out.stderr.strip()}"
    for name in ("openb", "fleet", "serving", "scheduler", "doctor", "waste"):
        assert name in out.stdout


def test_the_help_tables_say_what_the_commands_say() -> None:
    """Each short help in cli.main's tables is the start of its command's own help."""
    import click
    import typer.main

    from kallot.cli import main

    root = typer.main.get_command(main.build())
    assert isinstance(root, click.Group)
    ctx = click.Context(root)
    for group, table in (
        (root, main.ROOT_COMMANDS),
        (root.get_command(ctx, "sim"), main.SIM_COMMANDS),
        (root.get_command(ctx, "report"), main.REPORT_COMMANDS),
    ):
        assert isinstance(group, click.Group)
        for name, (_, short) in table.items():
            cmd = group.get_command(ctx, name)
            assert cmd is not None, name
            words = " ".join((cmd.help or "").split())
            assert words.startswith(short.removesuffix(".")), (name, short, words)
