"""``kallot scheduler`` (the live scheduler) and ``kallot explain POD``.

Composition root for the kube shell: picks the policy (a Profile from ``core.policies``), builds
the registry, framework and core Scheduler explicitly, connects the client and runs the
controller until SIGTERM/SIGINT (graceful: in-flight binds finish, the lease is released).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import typer

from kallot.core import policies
from kallot.core.errors import KallotError
from kallot.core.framework.profile import Profile
from kallot.core.framework.runner import Framework
from kallot.core.scheduler import Scheduler
from kallot.kube import disruption, logs, translate
from kallot.kube.cache import CacheTuning
from kallot.kube.client import ApiError, KubeClient
from kallot.kube.controller import Controller, ControllerConfig
from kallot.kube.sizing import SessionSizing

if TYPE_CHECKING:
    from kallot.kube import explain as explain_mod

DEFAULT_POLICY = "kallot"
# Used only until the default policy lands in core.policies.PROFILES (kept explicit so the
# log says which one runs).
FALLBACK_POLICY = "first-fit"

LOG_LEVELS = click.Choice(["debug", "info", "warning", "error"], case_sensitive=False)

KubeconfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
    ),
]
_SIZING = SessionSizing()  # the defaults of the session-size flags

ContextOpt = Annotated[str | None, typer.Option("--context", help="kubeconfig context")]


def resolve_policy(name: str) -> tuple[str, Profile]:
    profile = policies.PROFILES.get(name)
    if profile is not None:
        return name, profile
    if name == DEFAULT_POLICY and FALLBACK_POLICY in policies.PROFILES:
        return FALLBACK_POLICY, policies.PROFILES[FALLBACK_POLICY]
    raise typer.BadParameter(
        f"unknown policy {name!r}, expected one of {', '.join(sorted(policies.PROFILES))}",
        param_hint="--policy",
    )


def build_scheduler(policy: str) -> tuple[str, Scheduler]:
    name, profile = resolve_policy(policy)
    framework = Framework(profile, policies.builtin_registry())
    return name, Scheduler(framework)


def run_scheduler(
    *,
    kubeconfig: Path | None,
    context: str | None,
    policy: str,
    config: ControllerConfig,
    disruption_grace: float | None = disruption.GRACE_S,
) -> int:
    import logging

    log = logging.getLogger("kallot.scheduler")
    name, scheduler = build_scheduler(policy)
    if name != policy:
        log.warning("policy %s is not available yet, running policy=%s", policy, name)
    else:
        log.info("starting policy=%s scheduler_name=%s", name, config.scheduler_name)

    async def main() -> int:
        client = await KubeClient.connect(
            kubeconfig, context=context, pool_size=max(16, config.bind_workers + 16)
        )
        controller = Controller(client, scheduler, config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, controller.stop)
        guard = None
        if disruption_grace is not None:  # model servers' do-not-disrupt (docs/serving.md)
            guard = asyncio.create_task(
                disruption.DisruptionGuard(
                    client,
                    scheduler_name=config.scheduler_name,
                    grace_s=disruption_grace,
                    wanted=controller.serves_models,
                ).run()
            )
        try:
            return await controller.run()
        finally:
            if guard is not None:
                guard.cancel()
            await client.close()

    return asyncio.run(main())


def register(app: typer.Typer) -> None:
    """Add ``scheduler`` and ``explain`` to ``app``."""

    @app.command("scheduler")
    def scheduler_cmd(  # noqa: PLR0917 - typer maps parameters to options
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        policy: Annotated[
            str,
            typer.Option(
                click_type=click.Choice(sorted(policies.PROFILES)),
                help="scheduling policy (core.policies)",
            ),
        ] = DEFAULT_POLICY,
        scheduler_name: Annotated[
            str, typer.Option(help="pods with this spec.schedulerName are scheduled")
        ] = translate.SCHEDULER_NAME,
        leader_elect: Annotated[
            bool, typer.Option(help="elect a leader among replicas with a Lease")
        ] = True,
        lease_namespace: Annotated[
            str, typer.Option(help="namespace of the Lease")
        ] = "kube-system",
        lease_name: Annotated[str, typer.Option(help="name of the Lease")] = "kallot-scheduler",
        lease_duration: Annotated[float, typer.Option(help="seconds a Lease is valid")] = 10.0,
        renew_deadline: Annotated[
            float, typer.Option(help="seconds a leader may fail to renew")
        ] = 7.0,
        retry_period: Annotated[
            float, typer.Option(help="seconds between the leader's Lease renewals")
        ] = 2.0,
        acquire_period: Annotated[
            float, typer.Option(help="seconds between a standby's attempts to take the Lease")
        ] = 1.0,
        max_clock_skew: Annotated[
            float,
            typer.Option(
                help="seconds of clock skew allowed when reading a Lease's renewTime: a Lease "
                "not renewed for lease-duration + this is taken over at once (-1: never trust "
                "renewTime, wait a full lease duration)"
            ),
        ] = 2.0,
        identity: Annotated[str, typer.Option(help="leader identity (default: host_pid)")] = "",
        metrics_address: Annotated[
            str, typer.Option(help="host:port serving /metrics, /healthz, /readyz (port 0 = any)")
        ] = "0.0.0.0:10251",
        bind_workers: Annotated[int, typer.Option(help="concurrent bind requests")] = 16,
        session_target: Annotated[
            float,
            typer.Option(
                help="seconds of CPU one session should take: its size follows from the "
                "measured cost per pod (docs/design/003-live-scheduler.md)"
            ),
        ] = _SIZING.target_s,
        min_session_pods: Annotated[
            int, typer.Option(help="pending pods the first session takes, and the least any takes")
        ] = _SIZING.min_pods,
        max_session_pods: Annotated[
            int, typer.Option(help="most pending pods one session takes (0 = no bound)")
        ] = _SIZING.max_pods,
        seed: Annotated[int, typer.Option(min=0, help="seed of the core's tie-breaking")] = 0,
        retry_interval: Annotated[
            float, typer.Option(help="unschedulable pods are retried at most this often (s)")
        ] = 1.0,
        resync: Annotated[
            float, typer.Option(help="full re-list period of every watch (s)")
        ] = 600.0,
        scheduled_events: Annotated[
            bool, typer.Option(help="post a Scheduled event per bind")
        ] = True,
        tolerated_taint: Annotated[
            list[str] | None,
            typer.Option(help="taint keys ignored on every node (repeatable; none by default)"),
        ] = None,
        log_level: Annotated[str, typer.Option(click_type=LOG_LEVELS, help="log level")] = "info",
        log_format: Annotated[
            str, typer.Option(click_type=click.Choice(["text", "json"]), help="log format")
        ] = "text",
        disruption_grace: Annotated[
            float,
            typer.Option(
                help="model servers keep karpenter.sh/do-not-disrupt this long after Ready "
                "(s; negative: never set it)"
            ),
        ] = disruption.GRACE_S,
    ) -> None:
        """Run the live scheduler: binds pods with spec.schedulerName=kallot."""
        logs.configure(log_level, log_format)
        host, sep, port = metrics_address.rpartition(":")
        if not sep or not port.isdigit() or int(port) > 65535:
            raise typer.BadParameter(
                f"got {metrics_address!r}, expected host:port, for example 0.0.0.0:10251",
                param_hint="--metrics-address",
            )
        try:
            sizing = SessionSizing(
                target_s=session_target, min_pods=min_session_pods, max_pods=max_session_pods
            )
        except KallotError as exc:
            raise typer.BadParameter(str(exc)) from exc
        config = ControllerConfig(
            scheduler_name=scheduler_name,
            identity=identity,
            leader_elect=leader_elect,
            lease_namespace=lease_namespace,
            lease_name=lease_name,
            lease_duration_s=lease_duration,
            renew_deadline_s=renew_deadline,
            retry_period_s=retry_period,
            acquire_period_s=acquire_period,
            max_clock_skew_s=max_clock_skew,
            metrics_host=host or "0.0.0.0",
            metrics_port=int(port),
            bind_workers=bind_workers,
            sizing=sizing,
            seed=seed,
            resync_s=resync,
            scheduled_events=scheduled_events,
            tolerated_taints=(
                frozenset(tolerated_taint)
                if tolerated_taint is not None
                else translate.DEFAULT_TOLERATED_TAINTS
            ),
            tuning=CacheTuning(retry_interval=retry_interval),
        )
        try:
            code = run_scheduler(
                kubeconfig=kubeconfig,
                context=context,
                policy=policy,
                config=config,
                disruption_grace=disruption_grace if disruption_grace >= 0 else None,
            )
        except KallotError as exc:
            typer.echo(f"kallot scheduler: {exc}", err=True)
            raise typer.Exit(2) from exc
        raise typer.Exit(code)

    app.command("explain")(explain_cmd)


def explain_cmd(
    pod: Annotated[str, typer.Argument(help="pod name, or namespace/name")],
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="namespace")] = "",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    scheduler_name: Annotated[
        str, typer.Option(help="kallot's schedulerName")
    ] = translate.SCHEDULER_NAME,
) -> None:
    """Why is POD pending, or which GPUs did it get."""
    from rich.console import Console  # not on `kallot scheduler`'s start-up path

    from kallot.kube import explain as explain_mod

    ns, _, name = pod.rpartition("/")
    ns = ns or namespace or _current_namespace(kubeconfig, context)

    async def main() -> explain_mod.Explanation:
        client = await KubeClient.connect(kubeconfig, context=context, pool_size=4)
        try:
            return await explain_mod.fetch(client, ns, name, scheduler_name=scheduler_name)
        finally:
            await client.close()

    console = Console(highlight=False, soft_wrap=True)
    try:
        result = asyncio.run(main())
    except ApiError as exc:
        if exc.not_found:
            typer.echo(f"kallot explain: pod {ns}/{name} not found", err=True)
        else:
            typer.echo(f"kallot explain: {exc}", err=True)
        raise typer.Exit(1) from exc
    except KallotError as exc:
        typer.echo(f"kallot explain: {exc}", err=True)
        raise typer.Exit(2) from exc
    style = {"bound": "green", "pending": "yellow", "invalid": "red"}.get(result.status, "")
    lines = result.lines()
    console.print(lines[0], style=style or None, markup=False)
    for line in lines[1:]:
        console.print(line, markup=False)


def _current_namespace(kubeconfig: Path | None, context: str | None) -> str:
    """The kubeconfig context's namespace, as kubectl uses it (default 'default')."""
    import os

    import yaml

    path = (
        kubeconfig
        or Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
    )
    with contextlib.suppress(OSError, yaml.YAMLError, AttributeError, TypeError):
        doc = yaml.safe_load(Path(path).read_text())
        name = context or doc.get("current-context")
        for ctx in doc.get("contexts") or []:
            if ctx.get("name") == name:
                return str((ctx.get("context") or {}).get("namespace") or "default")
    ns_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if ns_file.is_file():
        return ns_file.read_text().strip()
    return "default"
