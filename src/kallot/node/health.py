"""GPU health from XID errors, with recovery: a pure state machine (the caller passes ``now``).

NVIDIA's device plugin marks a GPU unhealthy on any non-ignored XID and never marks it healthy
again until the plugin restarts (NVIDIA/k8s-device-plugin#1014). kallot classifies each XID:

- **application** errors are caused by the program running on the GPU (an illegal address, a
  watchdog timeout of a kernel, a context being torn down). The GPU is fine; ignored.
- **fatal** errors are the GPU's or the driver's (uncorrectable ECC, fallen off the bus, NVLink
  or GSP failures). The GPU is marked Unhealthy.
- **unknown** XIDs are treated as fatal, as NVIDIA's plugin does.

A device that stays free of fatal XIDs for ``recovery_s`` seconds after its last one returns to
Healthy. Every change is a ``Transition`` the agent turns into an Event, a metric and a
ListAndWatch update.

Sources: NVIDIA "XID Errors" (docs.nvidia.com/deploy/xid-errors/, the catalog of causes), and
the application-level XIDs NVIDIA/k8s-device-plugin ignores by default
(internal/rm/health.go: 13, 31, 43, 45, 68, 109).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class XidClass(enum.Enum):
    APPLICATION = "application"
    FATAL = "fatal"
    UNKNOWN = "unknown"


# XID -> (class, what it means). docs/node-agent.md renders this table.
XID_TABLE: dict[int, tuple[XidClass, str]] = {
    13: (
        XidClass.APPLICATION,
        "graphics engine exception (illegal instruction/address in a kernel)",
    ),
    31: (XidClass.APPLICATION, "GPU memory page fault (illegal address in an application)"),
    43: (XidClass.APPLICATION, "GPU stopped processing (application reset the channel)"),
    45: (XidClass.APPLICATION, "preemptive cleanup (context torn down, e.g. process killed)"),
    68: (XidClass.APPLICATION, "video processor exception"),
    109: (XidClass.APPLICATION, "context switch timeout (application)"),
    48: (XidClass.FATAL, "double-bit ECC error"),
    61: (XidClass.FATAL, "internal micro-controller breakpoint/warning"),
    62: (XidClass.FATAL, "internal micro-controller halt"),
    63: (XidClass.FATAL, "ECC page retirement or row remapping recorded"),
    64: (XidClass.FATAL, "ECC page retirement or row remapping failure"),
    74: (XidClass.FATAL, "NVLink error"),
    79: (XidClass.FATAL, "GPU has fallen off the bus"),
    92: (XidClass.FATAL, "high single-bit ECC error rate"),
    94: (XidClass.FATAL, "contained ECC error (the affected memory needs a GPU reset)"),
    95: (XidClass.FATAL, "uncontained ECC error"),
    119: (XidClass.FATAL, "GSP RPC timeout"),
    120: (XidClass.FATAL, "GSP error"),
}


def classify(xid: int) -> XidClass:
    """The class of one XID; unknown XIDs are UNKNOWN (and count as fatal)."""
    entry = XID_TABLE.get(xid)
    return XidClass.UNKNOWN if entry is None else entry[0]


def marks_unhealthy(xid: int) -> bool:
    return classify(xid) is not XidClass.APPLICATION


@dataclass(frozen=True, slots=True)
class Transition:
    """A device's health changed. ``xid`` is the XID that made it unhealthy (0 on recovery)."""

    uuid: str
    healthy: bool
    reason: str
    xid: int = 0


@dataclass(slots=True)
class _State:
    healthy: bool = True
    last_fatal: float | None = None
    xids: int = 0
    reason: str = ""  # why it is unhealthy (the XID that made it so)


class HealthTracker:
    """Health per device UUID. ``observe`` an XID, ``tick`` to let clean devices recover."""

    def __init__(self, uuids: Iterable[str], recovery_s: float) -> None:
        if recovery_s < 0:
            raise ValueError(f"recovery_s: got {recovery_s}, expected >= 0")
        self.recovery_s = recovery_s
        self._state = {u: _State() for u in uuids}

    def add(self, uuid: str) -> None:
        self._state.setdefault(uuid, _State())

    def healthy(self, uuid: str) -> bool:
        state = self._state.get(uuid)
        return state is None or state.healthy

    def xid_count(self, uuid: str) -> int:
        state = self._state.get(uuid)
        return 0 if state is None else state.xids

    def unhealthy(self) -> set[str]:
        return {u for u, s in self._state.items() if not s.healthy}

    def reasons(self) -> dict[str, str]:
        """Why each unhealthy device is unhealthy (``XID 79: ...``), by UUID."""
        return {u: s.reason for u, s in self._state.items() if not s.healthy}

    def observe(self, uuid: str, xid: int, now: float) -> Transition | None:
        """Record one XID on ``uuid`` at ``now``; returns the transition it causes, if any."""
        state = self._state.setdefault(uuid, _State())
        state.xids += 1
        cls = classify(xid)
        if cls is XidClass.APPLICATION:
            return None
        state.last_fatal = now
        if not state.healthy:
            return None  # already unhealthy: the recovery window restarts
        state.healthy = False
        what = XID_TABLE[xid][1] if xid in XID_TABLE else "unknown XID, treated as fatal"
        state.reason = f"XID {xid}: {what}"
        return Transition(uuid=uuid, healthy=False, reason=state.reason, xid=xid)

    def tick(self, now: float) -> list[Transition]:
        """Devices whose last fatal XID is at least ``recovery_s`` old become healthy again."""
        out = []
        for uuid, state in sorted(self._state.items()):
            if state.healthy or state.last_fatal is None:
                continue
            if now - state.last_fatal >= self.recovery_s:
                state.healthy, state.reason = True, ""
                out.append(
                    Transition(
                        uuid=uuid,
                        healthy=True,
                        reason=f"no fatal XID for {self.recovery_s:g}s",
                    )
                )
        return out

    def next_recovery(self) -> float | None:
        """When the earliest unhealthy device may recover (None if all are healthy)."""
        times = [
            s.last_fatal + self.recovery_s
            for s in self._state.values()
            if not s.healthy and s.last_fatal is not None
        ]
        return min(times) if times else None
