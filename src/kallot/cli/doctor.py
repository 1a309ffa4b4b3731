"""``kallot doctor``: check a cluster for kallot and print what is wrong (kube.ops.doctor).

Exit code 0 when nothing is an error (warnings are printed), 1 when something is, 2 on bad
input (no kubeconfig, a malformed one).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.text import Text

from kallot import __version__
from kallot.cli import ui
from kallot.cli.scheduler import ContextOpt, KubeconfigOpt
from kallot.core.errors import KallotError
from kallot.kube.api.client import KubeClient
from kallot.kube.ops.doctor import Doctor, Finding

MARK = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "error": ("FAIL", "red")}


def doctor_cmd(
    namespace: Annotated[
        str, typer.Option("--namespace", "-n", help="namespace kallot is installed in")
    ] = "kallot-system",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Preflight: CRDs, RBAC, scheduler, agents, other device plugins, MPS daemon, versions."""

    async def main() -> list[Finding]:
        client = await KubeClient.connect(kubeconfig, context=context, pool_size=4)
        try:
            return await Doctor(client, namespace, __version__).diagnose()
        finally:
            await client.close()

    try:
        findings = asyncio.run(main())
    except KallotError as exc:
        typer.echo(f"kallot doctor: {exc}", err=True)
        raise typer.Exit(2) from exc
    out = ui.console()
    for f in findings:
        word, style = MARK[f.level]
        line = Text.assemble((f"{word:>4}", style), f"  {f.check}: ", f.message)
        out.print(line, soft_wrap=True)  # one finding, one line: greppable
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warn" for f in findings)
    out.print(f"{errors} error(s), {warnings} warning(s)")
    raise typer.Exit(1 if errors else 0)


def register(app: typer.Typer) -> None:
    """Add ``doctor`` to ``app``."""
    app.command("doctor")(doctor_cmd)
