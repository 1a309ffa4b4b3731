"""One meaning per flag name across every ``kallot`` subcommand: the same option name has the
same type everywhere (``--nodes`` is always a number of nodes, ``--node-list`` always a CSV,
``--jobs`` always worker processes, ``--seed`` one seed >= 0, ``--seeds`` a list or range), and
options with a fixed set of values list them in ``--help``. And every ``kallot sim`` command
follows the convention of ``kallot.cli.sim`` (seed, policy, outputs, report folder).
"""

from __future__ import annotations

from collections.abc import Iterator

import click
import typer.main

from kallot.cli.main import app


def _commands(group: click.Command, path: str = "kallot") -> Iterator[tuple[str, click.Command]]:
    if isinstance(group, click.Group):
        ctx = click.Context(group)
        for name in group.list_commands(ctx):  # the lazily loaded ones too (cli.main)
            sub = group.get_command(ctx, name)
            assert sub is not None, f"{path} {name}"
            yield from _commands(sub, f"{path} {name}")
    else:
        yield path, group


def _options() -> dict[str, dict[str, click.Option]]:
    """Option name -> {command path -> the option}."""
    out: dict[str, dict[str, click.Option]] = {}
    for path, cmd in _commands(typer.main.get_command(app)):
        for p in cmd.params:
            if isinstance(p, click.Option):
                for name in [*p.opts, *p.secondary_opts]:
                    out.setdefault(name, {})[path] = p
    return out


def _kind(p: click.Option) -> str:
    t = p.type
    if isinstance(t, click.Choice):
        return "choice"
    name = type(t).__name__  # repeatable or not, the same meaning (compare's --workload)
    # A path is typed text: str and Path options agree (their help says what the text is).
    return "text" if name in ("StringParamType", "Path", "TyperPath") else name


def test_each_flag_name_has_one_type_everywhere() -> None:
    for name, where in _options().items():
        kinds = {path: _kind(p) for path, p in where.items()}
        assert len(set(kinds.values())) == 1, f"{name} means different things: {kinds}"


def test_the_flags_the_issue_named_mean_one_thing() -> None:
    opts = _options()
    for p in opts["--jobs"].values():
        assert "worker" in (p.help or "").lower()
    for p in opts["--nodes"].values():
        assert isinstance(p.type, click.types.IntRange), "--nodes is a number of nodes"
    for p in opts["--node-list"].values():
        assert "csv" in (p.help or "").lower()
    for path, p in opts["--seed"].items():
        assert isinstance(p.type, click.types.IntRange) and p.type.min == 0, path
    assert set(opts["--seeds"]) == {"kallot sim openb", "kallot sim compare"}
    assert "--training-jobs" in {o for o in opts if "training" in o}


def test_policy_sharing_and_log_choices_are_listed() -> None:
    opts = _options()
    for name in ("--policy", "--sharing", "--log-level", "--gang"):
        for path, p in opts[name].items():
            assert isinstance(p.type, click.Choice), f"{path} {name}"
            assert "kallot" in p.type.choices or name != "--policy"


def _sim_commands() -> dict[str, dict[str, click.Option]]:
    out: dict[str, dict[str, click.Option]] = {}
    for path, cmd in _commands(typer.main.get_command(app)):
        if path.startswith("kallot sim "):
            out[path] = {
                name: p
                for p in cmd.params
                if isinstance(p, click.Option)
                for name in [*p.opts, *p.secondary_opts]
            }
    return out


def test_every_sim_command_follows_the_convention() -> None:
    """kallot.cli.sim's convention: --seed (one seed >= 0), --json, --plot and --report (by
    default kallot-report/<command>.html), --policy defaulting to kallot, --jobs where
    experiments run in parallel."""
    commands = _sim_commands()
    assert {"kallot sim openb", "kallot sim fleet", "kallot sim serving"} <= set(commands)
    for path, opts in commands.items():
        name = path.rsplit(" ", 1)[1]
        for flag in ("--seed", "--json", "--plot", "--report"):
            assert flag in opts, f"{path} lacks {flag}"
        seed = opts["--seed"].type
        assert isinstance(seed, click.types.IntRange) and seed.min == 0, path
        assert opts["--json"].default is None and opts["--plot"].default is None, path
        assert str(opts["--report"].default) == f"kallot-report/{name}.html", path
        if "--policy" in opts:
            policy = opts["--policy"]
            assert isinstance(policy.type, click.Choice), path
            assert policy.default in ("kallot", None), f"{path} --policy defaults to kallot"
        if "--seeds" in opts or name in ("openb", "compare"):
            assert "--jobs" in opts, f"{path}: several experiments, run in --jobs processes"
