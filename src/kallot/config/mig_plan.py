"""Live MIG re-layout (issue 21): the plan the scheduler writes on a Node and the status the
node agent writes back (docs/node-agent.md, "Live MIG reconfiguration").

Where it sits: between ``kube.schedule.migplan`` (the scheduler plans a new layout of an idle GPU and
writes ``kallot.io/mig-plan``) and ``node.migapply`` (the agent applies it through NVML,
re-advertises, publishes the inventory, and writes ``kallot.io/mig-plan-status``). Both are
JSON in Node annotations; the plan names the *target* layout of each GPU, not the steps, so
applying it again after a partial run (an agent killed mid-apply) does only what is left.
"""

from __future__ import annotations

import json
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kallot.config import wire
from kallot.config.errors import config_error
from kallot.core.errors import ConfigError

ANNOTATION = wire.ANN_MIG_PLAN
STATUS_ANNOTATION = wire.ANN_MIG_PLAN_STATUS

State = Literal["Applied", "Refused", "Failed"]
_M = TypeVar("_M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class PlanInstance(_Strict):
    profile: str = Field(min_length=1, description="MIG profile, e.g. '2g.20gb'")
    start: int = Field(ge=0, le=7, description="placement start (memory slice)")


class PlanGpu(_Strict):
    """The layout one GPU must have: every instance, the kept ones included."""

    uuid: str = Field(min_length=1, description="the GPU's UUID")
    layout: tuple[PlanInstance, ...] = ()

    def instances(self) -> tuple[tuple[str, int], ...]:
        return tuple((i.profile, i.start) for i in self.layout)


class PlanPod(_Strict):
    """A pod that waits for the plan (the agent's Events name it too)."""

    namespace: str
    name: str
    uid: str = ""


class MigPlan(_Strict):
    generation: int = Field(ge=1, description="increases with every plan written on the node")
    gpus: tuple[PlanGpu, ...] = ()
    pods: tuple[PlanPod, ...] = ()

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @staticmethod
    def from_json(text: str, *, where: str = ANNOTATION) -> MigPlan:
        return _parse(MigPlan, text, where)


class MigPlanStatus(_Strict):
    """What the agent did with plan ``generation``."""

    generation: int = Field(ge=0)
    state: State
    message: str = ""

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @staticmethod
    def from_json(text: str, *, where: str = STATUS_ANNOTATION) -> MigPlanStatus:
        return _parse(MigPlanStatus, text, where)


def _parse(cls: type[_M], text: str, where: str) -> _M:
    try:
        return cls.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ConfigError(where, text[:80], f"JSON ({exc.msg} at {exc.pos})") from None
    except ValidationError as exc:
        raise config_error(exc, prefix=where) from None
