"""The device record: which GPUs (and shares, MIG instances) the scheduler gave a pod.

Written by the scheduler as JSON in the pod annotation ``kallot.io/devices`` before it binds
the pod; read by the node agent's device plugin in Allocate, which returns exactly these
devices and refuses when there is no record or the record names another node
(docs/pod-api.md, "Device record").
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kallot.config import wire
from kallot.config.errors import config_error
from kallot.config.inventory import ModeName
from kallot.core.decision import DeviceAssignment, MigInstance, Placement
from kallot.core.errors import ConfigError
from kallot.core.resources import SharingMode

ANNOTATION = wire.ANN_DEVICES
BIND_PHASE = wire.ANN_BIND_PHASE  # "allocating" (set by the scheduler) -> "allocated" (agent)
BIND_TIME = wire.ANN_BIND_TIME  # unix time in nanoseconds, as a string
SCHEMA_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RecordMig(_Strict):
    profile: str
    start: int = Field(ge=0, le=7)


class RecordDevice(_Strict):
    index: int = Field(ge=0, description="GPU index on the node")
    uuid: str = Field(min_length=1)
    milli: int = Field(ge=0, le=16000, description="compute charged, milli-GPU")
    mem_mib: int = Field(alias="memMiB", ge=0)
    mode: ModeName
    mig: RecordMig | None = None


class DeviceRecord(_Strict):
    version: int = Field(default=SCHEMA_VERSION, alias="v")
    node: str = Field(min_length=1)
    devices: tuple[RecordDevice, ...]

    @staticmethod
    def of(placement: Placement) -> DeviceRecord:
        return DeviceRecord(
            node=placement.node,
            devices=tuple(
                RecordDevice(
                    index=d.slot,
                    uuid=d.uuid,
                    milli=d.milli,
                    mem_mib=d.mem_mib,
                    mode=d.mode.label,
                    mig=None
                    if d.mig is None
                    else RecordMig(profile=d.mig.profile, start=d.mig.start),
                )
                for d in placement.devices
            ),
        )

    def assignments(self) -> tuple[DeviceAssignment, ...]:
        return tuple(
            DeviceAssignment(
                slot=d.index,
                uuid=d.uuid,
                milli=d.milli,
                mem_mib=d.mem_mib,
                mode=SharingMode.parse(d.mode),
                mig=None
                if d.mig is None
                else MigInstance(profile=d.mig.profile, start=d.mig.start),
            )
            for d in self.devices
        )

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @staticmethod
    def from_json(text: str) -> DeviceRecord:
        try:
            return DeviceRecord.model_validate(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ConfigError(ANNOTATION, text[:80], f"JSON ({exc.msg} at {exc.pos})") from exc
        except ValidationError as exc:
            raise config_error(exc, prefix=ANNOTATION) from exc
