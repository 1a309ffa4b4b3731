"""The CDI specs the node agent writes, so the container runtime can resolve the CDI device
names the agent hands it (containerd/CRI-O refuse a name no spec defines: ``unresolvable CDI
devices``).

Where it sits: the node shell. The device plugin (``node.deviceplugin``, Allocate) and the DRA
driver (``node.draplugin``, NodePrepareResources) both answer CDI device names; this module says
which device nodes those names stand for and writes the device plugin's spec. Pure apart from
:func:`write_spec` and :func:`make_fake_device_nodes`.

What the device plugin answers (``--cdi-devices``, docs/node-agent.md):

- ``kallot`` (default): the agent's own spec, ``<cdi-dir>/k8s.device-plugin.kallot.io-gpu.json``,
  kind ``k8s.device-plugin.kallot.io/gpu``, one device per GPU UUID and per MIG UUID, each the
  GPU's ``/dev/nvidiaN`` plus the control nodes. Its own vendor name, so it never collides with
  the spec NVIDIA's toolkit generates (``nvidia.com/gpu``) when that is installed too; the
  ``NVIDIA_VISIBLE_DEVICES`` environment Allocate also sets is what the toolkit's runtime hook
  reads to mount the driver's libraries.
- ``nvidia``: NVIDIA's toolkit is installed and generated its spec with UUID names
  (``nvidia-ctk cdi generate --device-name-strategy=uuid``): the agent answers
  ``nvidia.com/gpu=<UUID>`` and writes nothing.
- ``none``: no CDI names at all, only the environment (a runtime without CDI, the toolkit's
  legacy hook).

``dev_root`` is where the device nodes are on the host: ``/dev`` on a GPU node; with the fake
backend, a directory of stand-in character devices (:func:`make_fake_device_nodes`), named by
``hostPath`` so the runtime stats those while the container still sees ``/dev/nvidia*``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kallot.config.inventory import NodeInventory
from kallot.core.errors import ConfigError, KallotError
from kallot.node.allocate import instance_id

CDI_VERSION = "0.6.0"
DEVICE_PLUGIN_VENDOR = "k8s.device-plugin.kallot.io"
DEVICE_PLUGIN_CLASS = "gpu"
DEVICE_PLUGIN_KIND = f"{DEVICE_PLUGIN_VENDOR}/{DEVICE_PLUGIN_CLASS}"
NVIDIA_KIND = "nvidia.com/gpu"  # the kind of the spec NVIDIA's toolkit generates
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
DEV = Path("/dev")


def kind_for(mode: str) -> str:
    """The CDI kind Allocate names devices with for a ``--cdi-devices`` mode ('' = none)."""
    kinds = {"kallot": DEVICE_PLUGIN_KIND, "nvidia": NVIDIA_KIND, "none": ""}
    if mode not in kinds:
        raise ConfigError("--cdi-devices", mode, f"one of {', '.join(kinds)}")
    return kinds[mode]


def device_nodes(gpu_index: int, dev_root: Path = DEV) -> list[dict[str, str]]:
    """The CDI ``deviceNodes`` of one GPU: its ``/dev/nvidiaN`` and the control nodes, with
    ``hostPath`` under ``dev_root`` when that is not ``/dev``."""
    out = []
    for name in (f"nvidia{gpu_index}", *CONTROL_NODES):
        node = {"path": f"/dev/{name}"}
        if dev_root != DEV:
            node["hostPath"] = str(dev_root / name)
        out.append(node)
    return out


def device_plugin_spec(inv: NodeInventory, dev_root: Path = DEV) -> dict[str, Any]:
    """The device plugin's spec: a device per GPU UUID and per MIG instance UUID (the names
    ``allocate.grant`` answers), whatever resource they are advertised under."""
    devices: list[dict[str, Any]] = []
    for gpu in inv.devices:
        edits = {"deviceNodes": device_nodes(gpu.index, dev_root)}
        devices.append({"name": gpu.uuid, "containerEdits": edits})
        for m in gpu.mig:
            # The MIG UUID, or <GPU UUID>::mig<start> without one (CDI names allow "_.:-").
            devices.append({"name": instance_id(gpu, m), "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": DEVICE_PLUGIN_KIND, "devices": devices}


def device_plugin_spec_path(cdi_dir: Path) -> Path:
    return cdi_dir / f"{DEVICE_PLUGIN_VENDOR}-{DEVICE_PLUGIN_CLASS}.json"


def write_spec(path: Path, spec: dict[str, Any]) -> None:
    """Atomically (a runtime reading the directory never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(spec, indent=1))
    os.replace(tmp, path)


def write_device_plugin_spec(cdi_dir: Path, inv: NodeInventory, dev_root: Path = DEV) -> None:
    """:func:`device_plugin_spec` into ``cdi_dir``; a failure is one line naming the file."""
    path = device_plugin_spec_path(cdi_dir)
    try:
        write_spec(path, device_plugin_spec(inv, dev_root))
    except OSError as exc:
        raise KallotError(
            f"writing the device plugin's CDI spec {path} failed ({exc.strerror or exc}); "
            f"expected a writable CDI directory (--cdi-dir)"
        ) from None


def make_fake_device_nodes(dev_root: Path, gpu_indices: list[int]) -> None:
    """Stand-in device nodes for the fake backend: character devices with /dev/null's numbers
    (1:3, harmless to open), named like the driver's. Needs CAP_MKNOD (root)."""
    dev_root.mkdir(parents=True, exist_ok=True)
    for name in (*(f"nvidia{i}" for i in gpu_indices), *CONTROL_NODES):
        path = dev_root / name
        if not path.exists():
            os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))  # S_IFCHR
