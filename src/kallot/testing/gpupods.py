"""GPU pods on the test node (``kallot.testing.node``): a busybox pod that prints what it was
given of its GPUs, and what it must print for its device record.

Where it sits: test support for the node tier (tests/realnode/): the device-plugin tests run
the agent as a process, the chart test runs it from the chart; both check each container's view
with these.
"""

from __future__ import annotations

from typing import Any

from kallot.config.device_record import ANNOTATION as DEVICES_ANNOTATION
from kallot.config.device_record import DeviceRecord
from kallot.config.inventory import NodeInventory
from kallot.node import cdi
from kallot.testing.live import pod_body
from kallot.testing.node import BUSYBOX_IMAGE, Node

__all__ = ["SCRIPT", "expected_view", "gpu_pod", "run_gpu_pod"]

# What the container shows of its GPUs: the NVIDIA/CUDA/kallot environment and /dev/nvidia*.
SCRIPT = (
    "env | grep -E '^(NVIDIA_|CUDA_|KALLOT_)' | sort; "
    "for f in /dev/nvidia*; do [ -c $f ] && echo dev=$f; done; "
    "echo done; exec sleep 3600"
)


def gpu_pod(name: str, resources: dict[str, str]) -> dict[str, Any]:
    """A pod for kallot asking ``resources`` that prints its GPUs, then sleeps."""
    body = pod_body(name, resources=resources)
    c = body["spec"]["containers"][0]
    c.update(image=BUSYBOX_IMAGE, imagePullPolicy="Never", command=["sh", "-c", SCRIPT])
    body["spec"]["automountServiceAccountToken"] = False
    return body


def run_gpu_pod(
    node: Node, v1: Any, body: dict[str, Any], namespace: str = "default", timeout: float = 90
) -> tuple[DeviceRecord | None, set[str]]:
    """Create the pod; once it printed its devices, its device record (None for a pod without
    one, e.g. a DRA claim's) and what it printed."""
    name = body["metadata"]["name"]
    v1.create_namespaced_pod(namespace, body)

    def printed() -> str | None:
        pod = v1.read_namespaced_pod(name, namespace)
        if pod.status.phase == "Failed":
            raise AssertionError(f"pod {name} failed: {pod.status}")
        if pod.status.phase != "Running":
            return None
        text = node.pod_log(namespace, name, "main")
        return text if text.endswith("done\n") else None

    text = node.wait_for(printed, timeout, f"pod {name} running and printing its devices")
    pod = v1.read_namespaced_pod(name, namespace)
    raw = (pod.metadata.annotations or {}).get(DEVICES_ANNOTATION)
    record = DeviceRecord.from_json(raw) if raw else None
    return record, set(text.splitlines()) - {"done"}


def expected_view(record: DeviceRecord, inv: NodeInventory) -> set[str]:
    """What the container must show for its record: NVIDIA_VISIBLE_DEVICES with the record's
    devices (MIG instances by MIG UUID), each GPU's /dev/nvidiaN and the control nodes, and the
    MPS limits for an MPS share."""
    by_uuid = {d.uuid: d for d in inv.devices}
    visible, nodes = [], {f"dev=/dev/{n}" for n in cdi.CONTROL_NODES}
    extra: set[str] = set()
    for d in record.devices:
        gpu = by_uuid[d.uuid]
        mig = [m for m in gpu.mig if d.mig is not None and m.start == d.mig.start]
        visible.append(mig[0].uuid if mig else d.uuid)
        nodes.add(f"dev=/dev/nvidia{gpu.index}")
        if d.mode == "mps":
            extra.add(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={max(1, -(-d.milli // 10))}")
            extra.add(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={d.mem_mib}M")
    return {f"NVIDIA_VISIBLE_DEVICES={','.join(visible)}", *nodes, *extra}
