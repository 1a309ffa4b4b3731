"""Wiring of autoscaling into the live scheduler: the scale-up loop (``kube.autoscale.scaleup``) and
consolidation (``kube.autoscale.consolidate``) next to a Controller, from ``autoscale`` of the scheduler
configuration (docs/autoscaling.md).

Where it sits: the kube shell, called by ``kallot scheduler`` (``cli.scheduler``) once the
Controller exists. Each loop gets a Framework of its own (``framework()``): they run the core
in worker threads while the controller's session runs in another.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from kallot.config.autoscale import AutoscaleDoc
from kallot.core.framework.runner import Framework
from kallot.kube.api.client import KubeClient
from kallot.kube.app import Controller


def loops(
    client: KubeClient,
    controller: Controller,
    doc: AutoscaleDoc,
    framework: Callable[[], Framework],
    *,
    grace_s: float,
) -> list[Coroutine[Any, Any, None]]:
    """The loops ``doc`` turns on (none by default)."""
    out: list[Coroutine[Any, Any, None]] = []

    def leading() -> bool:
        return controller.is_leader and controller.ready()

    shapes = doc.shapes()
    # The loops' modules are imported when the file turns them on: autoscaling is off by
    # default, and the scheduler's start-up does not pay for the planner and the loops.
    if doc.provisioner != "none" and shapes:
        from kallot.core.provision.plan import Planner
        from kallot.kube.autoscale.scaleup import ScaleUp

        scale = ScaleUp(
            client,
            controller.cache,
            Planner(framework(), shapes, seed=controller.config.seed),
            provisioner=doc.provisioner,
            namespace=doc.placeholder_namespace,
            is_leader=leading,
            timeout_s=doc.scale_up_timeout_seconds,
        )
        controller.session_observers.append(scale.observe)
        out.append(scale.run())
    cons = doc.consolidation.config()
    if cons.enabled:
        from kallot.kube.autoscale.consolidate import Consolidator

        out.append(
            Consolidator(
                client,
                controller.cache,
                framework(),
                cons,
                controller.reporter,
                scheduler_name=controller.config.scheduler_name,
                grace_s=max(0.0, grace_s),
                is_leader=leading,
                on_evict=controller.metrics.evictions.labels("consolidate").inc,
            ).run()
        )
    return out
