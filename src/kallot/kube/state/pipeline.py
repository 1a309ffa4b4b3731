"""The session-input pipeline: one order of stages builds what each session runs on.

Where it sits: the session loop (``kube.schedule.loop``) calls ``SessionPipeline.build`` once
per session, before the core. The source, the cache (``Cache.session_input``), makes the
``SessionInput``: the Snapshot of rows and usage, the eligible Tasks in priority order with
their Jobs, and the pods held back before the core (``waiting``). Each stage after it rewrites
its own part of that input and nothing else:

1. ``MigStage`` (``kube.schedule.migplan.MigPlanner.adjust``): the snapshot's MIG columns:
   GPUs with a re-layout in flight (or one just failed) are not reconfigurable, and the
   instances a plan destroys are given to nobody;
2. ``DraStage`` (``kube.dra.cache.DraCache.attach``): the tasks whose pods have
   ResourceClaims carry them (``PodInfo.dra``), and a pod whose extended resources DRA serves
   this session carries its special claim instead of the request.

The composition root (``kube.app``) gives the stages; this module imports none of them (each
is a small Protocol here), so a stage is added by writing one class with ``name`` and
``__call__`` and listing it there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kallot.core.snapshot import Snapshot
from kallot.core.workload import Task
from kallot.kube.state.cache import SessionInput


class Source(Protocol):
    """The first stage: what the cache lets into the session (``Cache.session_input``)."""

    def session_input(
        self, *, max_tasks: int = 0, exclude: frozenset[str] = frozenset()
    ) -> SessionInput: ...


class Stage(Protocol):
    """A stage after the source: returns ``inp`` with its own part rewritten, the rest as it
    came (``SessionInput`` is immutable: a stage cannot write another's part by accident).
    Runs on the event loop, once per session; must not raise for one pod's sake."""

    @property
    def name(self) -> str: ...

    def __call__(self, inp: SessionInput) -> SessionInput: ...


class SnapshotAdjuster(Protocol):
    def adjust(self, snapshot: Snapshot) -> Snapshot: ...


class ClaimAttacher(Protocol):
    def attach(self, tasks: Sequence[Task]) -> list[Task]: ...


@dataclass(frozen=True, slots=True)
class MigStage:
    """The MIG re-layouts in flight, in the snapshot (owns ``gpu_mig_dynamic`` and
    ``mig.used`` of ``SessionInput.snapshot``)."""

    planner: SnapshotAdjuster
    name: str = "mig"

    def __call__(self, inp: SessionInput) -> SessionInput:
        return dataclasses.replace(inp, snapshot=self.planner.adjust(inp.snapshot))


@dataclass(frozen=True, slots=True)
class DraStage:
    """Each pod's ResourceClaims on its task (owns ``Task.k8s.dra`` and, for extended
    resources DRA serves, the task's GPU request and scalars)."""

    dra: ClaimAttacher
    name: str = "dra"

    def __call__(self, inp: SessionInput) -> SessionInput:
        return dataclasses.replace(inp, tasks=tuple(self.dra.attach(inp.tasks)))


_: type[Stage] = MigStage
_ = DraStage


class SessionPipeline:
    """The source, then the stages in order."""

    def __init__(self, source: Source, stages: Sequence[Stage]) -> None:
        self.source = source
        self.stages = tuple(stages)

    def build(self, *, max_tasks: int = 0, exclude: frozenset[str] = frozenset()) -> SessionInput:
        """One session's input: at most ``max_tasks`` tasks outside gangs (0: all), without
        the pods in ``exclude`` (they sit this session out)."""
        inp = self.source.session_input(max_tasks=max_tasks, exclude=exclude)
        for stage in self.stages:
            inp = stage(inp)
        return inp
