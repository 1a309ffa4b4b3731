"""What the kubelet's device manager has taken in, read from its checkpoint: whether a GPU pod
bound to this node now would get the devices its record names. Pure: parsing and the verdict;
the agent (``node.agent``) reads the file and publishes the verdict as the Node condition
``kallot.io/DevicePluginsReady`` that the scheduler reads (``kube.translate.node``).

The kubelet writes ``kubelet_internal_checkpoint`` in the device-plugin directory
(pkg/kubelet/cm/devicemanager/checkpoint) whenever a plugin's ListAndWatch delivers devices and
after every allocation: ``Data.PodDeviceEntries`` (pod UID, container, resource, device IDs per
NUMA node) and ``Data.RegisteredDevices`` (the healthy IDs per resource).

Two windows in which the real kubelet hands a pod other devices than its record's, or none
(tools/testenv/README.md, "Findings"), and how the checkpoint shows each:

- **not listed**: after the agent (re)registers, until the plugin's ListAndWatch was processed,
  the resource has no healthy devices (``UnexpectedAdmissionError``). Shown by a checkpoint not
  rewritten since the registration, or one whose ``RegisteredDevices`` lack an advertised ID.
- **stale charges**: a restarted kubelet restores the entries of pods deleted while it was away
  and frees them (``UpdateAllocatedDevices``) only once all its pod sources are ready; a pod
  admitted before that finds the record's GPU still charged to a pod that is gone, and the
  kubelet picks another GPU, which Allocate refuses. Shown by entries of pods the API no longer
  has. The pod-resources API's List frees them (it calls ``UpdateAllocatedDevices`` too) and
  the next ListAndWatch writes the result, so the agent asks both and reads again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path

FILE = "kubelet_internal_checkpoint"


@dataclass(frozen=True, slots=True)
class Charge:
    """One PodDeviceEntry: the devices of ``resource`` the kubelet charges to a container."""

    pod_uid: str
    container: str
    resource: str
    ids: frozenset[str]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    charges: tuple[Charge, ...] = ()
    registered: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @staticmethod
    def parse(text: str | bytes) -> Checkpoint:
        """The checkpoint's data; ValueError naming what is wrong when it is not the kubelet's
        format (the checksum is the kubelet's business: a torn file fails to parse)."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{FILE}: not JSON ({exc.msg} at {exc.pos})") from None
        data = doc.get("Data") if isinstance(doc, dict) else None
        if not isinstance(data, dict):
            raise ValueError(f"{FILE}: Data is {type(data).__name__}, expected an object")
        charges = []
        for i, e in enumerate(data.get("PodDeviceEntries") or ()):
            per_numa = e.get("DeviceIDs") if isinstance(e, dict) else None
            if not isinstance(per_numa, dict):
                raise ValueError(f"{FILE}: Data.PodDeviceEntries[{i}].DeviceIDs is not an object")
            ids = frozenset(str(d) for devs in per_numa.values() for d in devs or ())
            charges.append(
                Charge(
                    pod_uid=str(e.get("PodUID", "")),
                    container=str(e.get("ContainerName", "")),
                    resource=str(e.get("ResourceName", "")),
                    ids=ids,
                )
            )
        registered = data.get("RegisteredDevices")
        if registered is None:
            registered = {}
        if not isinstance(registered, dict):
            raise ValueError(f"{FILE}: Data.RegisteredDevices is not an object")
        return Checkpoint(
            charges=tuple(charges),
            registered={str(r): frozenset(map(str, ids or ())) for r, ids in registered.items()},
        )


def identity(path: Path) -> tuple[int, ...]:
    """What tells two writes of the checkpoint apart (the kubelet writes a new file and renames
    it over the old one); () when there is none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return ()
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def not_listed(cp: Checkpoint, advertised: Mapping[str, Set[str]]) -> str:
    """The first resource whose healthy advertised IDs the kubelet has not taken in, described
    ("" when it has all of them)."""
    for resource, ids in sorted(advertised.items()):
        missing = set(ids) - cp.registered.get(resource, frozenset())
        if missing:
            return (
                f"the kubelet has not listed {len(missing)} of the {len(ids)} healthy "
                f"{resource} devices yet"
            )
    return ""


def stale(cp: Checkpoint, live_uids: Set[str], resources: Set[str]) -> list[Charge]:
    """Charges of ``resources`` (the agent's) to pods that are not live on this node."""
    return [c for c in cp.charges if c.resource in resources and c.pod_uid not in live_uids]


def describe_stale(charges: list[Charge]) -> str:
    pods = sorted({c.pod_uid for c in charges})
    ids = sorted({i for c in charges for i in c.ids})
    shown = ", ".join(ids[:4]) + (f" and {len(ids) - 4} more" if len(ids) > 4 else "")
    return (
        f"the kubelet still charges {len(ids)} devices ({shown}) to {len(pods)} pods that are "
        "gone; it frees them once its pod sources are ready"
    )
