"""Model weights and where they are cached: ``ModelRef`` (what a serving task loads), ``ModelCache``
(what one node holds) and the load-time model the ``ModelCache`` score plugin and the serving
simulator share.

Where it sits: shells fill these in at the edge (``kube/translate/models.py`` from a pod's
``kallot.io/model`` annotation and the node's inventory annotation, ``sim/serving.py`` from its
services); ``SnapshotBuilder`` puts one ``ModelCache`` per node into the Snapshot;
``core.plugins.model_cache`` scores nodes by the load time they save.

Load-time model (docs/serving.md): a replica is ready after a fixed start-up (container, CUDA
context, engine warm-up) plus its weights read at the bandwidth of the fastest tier holding them:

    load_s = startup_s + size_bytes / bandwidth(tier)

tiers: host memory (page cache or a pre-warmed copy), the node's local disk (its measured read
bandwidth, published by the node agent), and remote storage (object storage or a model hub)
when the node holds nothing. A tensor-parallel server reads the model once per node and shards
it over its GPUs, so the node's bandwidth, not the GPU count, sets its load time.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

GB = 10**9

# Defaults of the load-time model (bytes per second; seconds). Published cold starts of LLM
# servers: ~30-100 s from local disk, minutes from object storage (ServerlessLLM, OSDI'24).
STARTUP_S = 15.0
REMOTE_BYTES_PER_S = 0.25 * GB  # object storage / hub pull, effective
DISK_BYTES_PER_S = 1.5 * GB  # local NVMe, effective safetensors load, when a node measured none
MEMORY_BYTES_PER_S = 10.0 * GB  # host memory to GPU (pinned copies over PCIe)

# ORG/NAME@REV: an id as the Hugging Face hub spells it (one optional org), a revision of
# letters, digits and . _ - (a commit hash or a branch/tag name).
_ID = r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?"
_REV = r"[A-Za-z0-9][A-Za-z0-9._-]*"
MODEL_RE = re.compile(rf"(?P<id>{_ID})(@(?P<rev>{_REV}))?")


class Tier(enum.IntEnum):
    """Where a node holds a model's weights (higher is faster)."""

    REMOTE = 0
    DISK = 1
    MEMORY = 2


@dataclass(frozen=True, slots=True)
class ModelRef:
    """The weights a task loads: ``id`` ("ORG/NAME"), ``revision`` ("" = whichever the node
    has) and ``size_bytes`` (0 = unknown: the cache still counts, the load time is start-up)."""

    id: str
    revision: str = ""
    size_bytes: int = 0

    def __post_init__(self) -> None:
        if not MODEL_RE.fullmatch(self.id + (f"@{self.revision}" if self.revision else "")):
            raise ValueError(f"ModelRef: got {self.id!r}@{self.revision!r}, expected ORG/NAME@REV")
        if self.size_bytes < 0:
            raise ValueError(f"ModelRef.size_bytes: got {self.size_bytes}, expected >= 0")

    @property
    def key(self) -> str:
        return f"{self.id}@{self.revision}" if self.revision else self.id


def parse_model(text: str) -> tuple[str, str] | None:
    """``(id, revision)`` of "ORG/NAME@REV" (revision "" when absent), None if it does not parse."""
    m = MODEL_RE.fullmatch(text.strip())
    if m is None:
        return None
    return m.group("id"), m.group("rev") or ""


@dataclass(frozen=True, slots=True)
class ModelCache:
    """What one node holds: per model id, the revisions on its disk and in host memory, the
    disk's read bandwidth (0 = not measured: ``DISK_BYTES_PER_S`` is assumed) and the sizes the
    node measured (per "ORG/NAME@REV" key), for tasks that do not state theirs."""

    disk: Mapping[str, frozenset[str]] = field(default_factory=dict)
    memory: Mapping[str, frozenset[str]] = field(default_factory=dict)
    read_bytes_per_s: float = 0.0
    sizes: Mapping[str, int] = field(default_factory=dict)

    @staticmethod
    def of(
        disk: Iterable[str] = (),
        memory: Iterable[str] = (),
        read_bytes_per_s: float = 0.0,
        sizes: Mapping[str, int] | None = None,
    ) -> ModelCache:
        """From "ORG/NAME@REV" keys (unparsable keys are dropped: the shell reports them)."""

        def index(keys: Iterable[str]) -> dict[str, frozenset[str]]:
            out: dict[str, set[str]] = {}
            for key in keys:
                parsed = parse_model(key)
                if parsed is not None:
                    out.setdefault(parsed[0], set()).add(parsed[1])
            return {k: frozenset(v) for k, v in out.items()}

        return ModelCache(index(disk), index(memory), read_bytes_per_s, dict(sizes or {}))

    def size_of(self, model: ModelRef) -> int:
        """The size this node measured for ``model`` (any revision when it names none), or 0."""
        if model.revision:
            return self.sizes.get(model.key, 0)
        prefix = f"{model.id}@"
        return max(
            (v for k, v in self.sizes.items() if k == model.id or k.startswith(prefix)), default=0
        )

    def tier(self, model: ModelRef) -> Tier:
        """The fastest tier holding ``model`` (any revision when the ref names none)."""
        for tier, where in ((Tier.MEMORY, self.memory), (Tier.DISK, self.disk)):
            revs = where.get(model.id)
            if revs and (not model.revision or model.revision in revs or "" in revs):
                return tier
        return Tier.REMOTE


NO_CACHE = ModelCache()


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadModel:
    """The stated load-time model (module docstring); every field is configurable."""

    startup_s: float = STARTUP_S
    remote_bytes_per_s: float = REMOTE_BYTES_PER_S
    disk_bytes_per_s: float = DISK_BYTES_PER_S
    memory_bytes_per_s: float = MEMORY_BYTES_PER_S

    def bandwidth(self, tier: Tier, node_disk_bytes_per_s: float = 0.0) -> float:
        if tier is Tier.MEMORY:
            return self.memory_bytes_per_s
        if tier is Tier.DISK:
            return node_disk_bytes_per_s if node_disk_bytes_per_s > 0 else self.disk_bytes_per_s
        return self.remote_bytes_per_s

    def load_s(self, size_bytes: int, tier: Tier, node_disk_bytes_per_s: float = 0.0) -> float:
        """Seconds from start to ready for ``size_bytes`` of weights read from ``tier``."""
        return self.startup_s + size_bytes / self.bandwidth(tier, node_disk_bytes_per_s)

    def on(self, model: ModelRef, cache: ModelCache) -> float:
        """Load time of ``model`` on a node holding ``cache``."""
        return self.load_s(model.size_bytes, cache.tier(model), cache.read_bytes_per_s)

    def saved_s(self, model: ModelRef, cache: ModelCache) -> float:
        """Seconds a node holding ``cache`` saves over a node that must pull ``model``."""
        cold = self.load_s(model.size_bytes, Tier.REMOTE)
        return max(0.0, cold - self.on(model, cache))


DEFAULT_LOAD_MODEL = LoadModel()
