"""NvmlBackend.processes on a stand-in for the pynvml module (no GPU on the test machines; the
calls and return shapes are pynvml's): per-process SM samples averaged since the last read,
NOT_FOUND (no new sample) read as idle, and processes inside MIG instances reported under the
instance's UUID without SM samples. The NVML calls themselves are untested on hardware here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kallot.node.discovery import GpuProcess
from kallot.node.nvml import NvmlBackend


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value


class StubNvml:
    NVMLError = NVMLError
    NVML_ERROR_NOT_FOUND = 6
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self) -> None:
        self.samples: dict[str, list[tuple[int, int, int]]] = {}  # uuid -> (pid, ts, sm)
        self.seen: list[int] = []

    def nvmlDeviceGetMigMode(self, h: Any) -> tuple[int, int]:  # noqa: N802 (pynvml's name)
        return (1, 1) if h == "gpu1" else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:  # noqa: N802
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, k: int) -> str:  # noqa: N802
        if k == 1:
            raise NVMLError(6)  # an empty slot
        return f"{h}-mig{k}"

    def nvmlDeviceGetUUID(self, h: Any) -> str:  # noqa: N802
        return f"MIG-{h}"

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:  # noqa: N802
        procs: dict[str, list[tuple[int, int | None]]] = {
            "gpu0": [(10, 1 << 30), (11, None)],
            "gpu1-mig0": [(20, 2 << 30)],
        }
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in procs.get(h, [])]

    def nvmlDeviceGetProcessUtilization(self, h: Any, last: int) -> list[Any]:  # noqa: N802
        self.seen.append(last)
        new = [s for s in self.samples.get(h, []) if s[1] > last]
        if not new:
            raise NVMLError(self.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=p, timeStamp=t, smUtil=sm) for p, t, sm in new]


def backend(nv: StubNvml) -> NvmlBackend:
    b = object.__new__(NvmlBackend)
    b._nv = nv
    b._handles = ["gpu0", "gpu1"]
    b._uuids = ["GPU-0", "GPU-1"]
    b._util_seen = {}
    return b


def test_processes_sm_samples_and_mig_instances() -> None:
    nv = StubNvml()
    nv.samples["gpu0"] = [(10, 100, 30), (10, 200, 50), (11, 150, 4)]
    b = backend(nv)
    got = b.processes()
    assert got == [
        # pid 10: mean of 30 and 50; pid 11: 4; usedGpuMemory None (no accounting) -> 0
        GpuProcess("GPU-0", 10, 1 << 30, sm_util_pct=40.0),
        GpuProcess("GPU-0", 11, 0, sm_util_pct=4.0),
        # GPU 1 is in MIG mode: its instance 0's process, under the instance's UUID, no samples
        GpuProcess("MIG-gpu1-mig0", 20, 2 << 30, sm_util_pct=None),
    ]
    # the next read asks only for samples after the last one seen; none new: idle, not unknown
    got = b.processes()
    assert nv.seen == [0, 200]
    assert [p.sm_util_pct for p in got] == [0.0, 0.0, None]
