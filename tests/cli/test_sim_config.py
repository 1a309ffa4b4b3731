"""``kallot sim ... --config FILE`` (issue 37, item 6): every sim command takes it, a shipped file
given as --config gives exactly what its --policy gives (one composition), and a bad file is one
line naming the field, the value and what was expected."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import click
import pytest
import typer.main
from typer.testing import CliRunner

from kallot.cli.main import app

SHIPPED = resources.files("kallot.config") / "profiles"


def _sim_commands() -> list[str]:
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    ctx = click.Context(group)
    sim = group.get_command(ctx, "sim")
    assert isinstance(sim, click.Group)
    return list(sim.list_commands(click.Context(sim)))


@pytest.mark.parametrize("command", _sim_commands())
def test_every_sim_command_takes_config(command: str) -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    sim = group.get_command(click.Context(group), "sim")
    assert isinstance(sim, click.Group)
    cmd = sim.get_command(click.Context(sim), command)
    assert cmd is not None
    assert any("--config" in p.opts for p in cmd.params), f"kallot sim {command} has no --config"


def test_a_shipped_file_as_config_gives_what_its_policy_gives(tmp_path: Path) -> None:
    mine = tmp_path / "bestfit.yaml"
    mine.write_text((SHIPPED / "bestfit.yaml").read_text())
    docs: list[object] = []
    for flags in (["--policy", "bestfit"], ["--config", str(mine)]):
        out = tmp_path / f"{len(docs)}.json"
        args = ["sim", "fleet", "--services", "30", "--seed", "2", "--json", str(out), *flags]
        result = CliRunner().invoke(app, [*args, "--report", str(tmp_path / "r.html")])
        assert result.exit_code == 0, result.output
        docs.append(json.loads(out.read_text()))
    assert docs[0] == docs[1]


def test_a_bad_config_is_one_line_naming_field_value_and_expectation(tmp_path: Path) -> None:
    bad = tmp_path / "mine.yaml"
    bad.write_text(
        "apiVersion: kallot.io/v1alpha1\nkind: KallotSchedulerConfiguration\n"
        "profiles:\n  - plugins:\n      score:\n        enabled: [{name: Nope, weight: 1}]\n"
    )
    result = CliRunner().invoke(app, ["sim", "openb", "--config", str(bad)])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert (
        "mine.yaml: profiles.0.plugins.score.enabled.0.name: got 'Nope', expected a plugin" in line
    )
    both = CliRunner().invoke(app, ["sim", "openb", "--policy", "fgd", "--config", str(bad)])
    assert both.exit_code == 2 and "no --policy with --config" in both.output
