"""The model-cache inventory: which model weights a node holds, and how fast its disk reads them
(docs/node-inventory.md, "Model caches").

Published by the node agent (``node.models``) as JSON in the Node annotation
``kallot.io/model-cache``; read by the scheduler's kube shell (``kube.translate.models``) into a
``core.models.ModelCache`` per node. Separate from ``kallot.io/gpu-inventory``: caches change
while GPUs do not, and a node can publish one without the other.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kallot.config import wire
from kallot.config.errors import config_error
from kallot.core.errors import ConfigError
from kallot.core.models import ModelCache, parse_model

ANNOTATION = wire.ANN_MODEL_CACHE
SCHEMA_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class CachedModel(_Strict):
    """One model revision present on the node."""

    id: str = Field(description="ORG/NAME as on the Hugging Face hub")
    revision: str = Field(default="", description="commit hash or branch; '' = unknown")
    size_bytes: int = Field(default=0, ge=0, alias="bytes")
    tier: Literal["disk", "memory"] = "disk"
    path: str = ""

    @field_validator("id")
    @classmethod
    def _parses(cls, v: str) -> str:
        parsed = parse_model(v)
        if parsed is None or parsed[1]:
            raise ValueError("ORG/NAME (letters, digits, '.', '_', '-'; one '/')")
        return v

    @property
    def key(self) -> str:
        return f"{self.id}@{self.revision}" if self.revision else self.id


class ModelCacheInventory(_Strict):
    """Everything the scheduler needs to know about one node's model cache."""

    version: int = Field(default=SCHEMA_VERSION, alias="v")
    read_bytes_per_s: float = Field(default=0.0, ge=0, alias="readBytesPerSecond")
    models: tuple[CachedModel, ...] = ()
    errors: tuple[str, ...] = Field(default=(), description="what the agent could not read")

    def to_core(self) -> ModelCache:
        return ModelCache.of(
            disk=[m.key for m in self.models if m.tier == "disk"],
            memory=[m.key for m in self.models if m.tier == "memory"],
            read_bytes_per_s=self.read_bytes_per_s,
            sizes={m.key: m.size_bytes for m in self.models},
        )

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @staticmethod
    def from_json(text: str, *, where: str = ANNOTATION) -> ModelCacheInventory:
        """Parse the annotation; raises ConfigError naming the bad field."""
        try:
            return ModelCacheInventory.model_validate(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ConfigError(where, text[:80], f"JSON ({exc.msg} at {exc.pos})") from exc
        except ValidationError as exc:
            raise config_error(exc, prefix=where) from exc
