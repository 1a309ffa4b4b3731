"""Fluent builders for tests, after kube-scheduler's ``st.MakeNode()`` / ``st.MakePod()``.

snap = snapshot(make_node("n1").gpus(8, model="H100-80GB"), make_node("n2").cpu(32_000))
task = make_task("t1").gpu(milli=500).obj()
"""

from __future__ import annotations

from collections.abc import Iterable

from kallot.core.resources import ALL_MODES, GPU_MODELS, MILLI, Isolation, SharingMode
from kallot.core.snapshot import GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.topology import NodeTopology
from kallot.core.workload import DeviceRequest, Task, TopologyConstraint


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._spec = NodeSpec(name=name, cpu_milli=64_000, mem_mib=256 * 1024, gpus=[])

    def cpu(self, milli: int, used: int = 0) -> NodeBuilder:
        self._spec.cpu_milli, self._spec.cpu_used = milli, used
        return self

    def mem(self, mib: int, used: int = 0) -> NodeBuilder:
        self._spec.mem_mib, self._spec.mem_used = mib, used
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self._spec.labels = {**self._spec.labels, key: value}
        return self

    def unschedulable(self) -> NodeBuilder:
        self._spec.schedulable = False
        return self

    def gpus(
        self,
        count: int,
        *,
        model: str = "H100-80GB",
        mode: SharingMode = SharingMode.MPS,
        used_milli: Iterable[int] = (),
        replicas: int = 1,
        oversubscription: float = 1.0,
    ) -> NodeBuilder:
        mem = GPU_MODELS[model].memory_mib if model in GPU_MODELS else 16384
        used = list(used_milli)
        specs = list(self._spec.gpus)
        for i in range(count):
            u = used[i] if i < len(used) else 0
            specs.append(
                GpuSpec(
                    model=model,
                    mem_mib=mem,
                    uuid=f"GPU-{self._spec.name}-{len(specs)}",
                    mode=mode,
                    replicas=replicas,
                    oversubscription=oversubscription,
                    used_milli=u,
                    used_mem=(u * mem) // MILLI,
                    clients=1 if u else 0,
                )
            )
        self._spec.gpus = specs
        return self

    def topology(self, topo: NodeTopology, *, model: str = "H100-80GB") -> NodeBuilder:
        """Add the preset's GPUs (NUMA node and NVLink island per GPU) and its link matrix."""
        first = len(self._spec.gpus)
        self.gpus(topo.gpus, model=model)
        islands = topo.islands()
        for i, gpu in enumerate(self._spec.gpus[first:]):
            gpu.numa, gpu.island = topo.numa[i], int(islands[i])
        self._spec.link = topo.link.tolist()
        return self

    def spec(self) -> NodeSpec:
        return self._spec


class TaskBuilder:
    def __init__(self, task_id: str) -> None:
        self._id = task_id
        self._cpu = 0
        self._mem = 0
        self._gpu: DeviceRequest | None = None
        self._priority = 0
        self._created = 0.0
        self._job = ""
        self._queue = ""
        self._selector: dict[str, str] = {}

    def cpu(self, milli: int) -> TaskBuilder:
        self._cpu = milli
        return self

    def mem(self, mib: int) -> TaskBuilder:
        self._mem = mib
        return self

    def gpu(
        self,
        count: int = 1,
        *,
        milli: int = MILLI,
        mem_mib: int = 0,
        models: Iterable[str] = (),
        modes: Iterable[SharingMode] = ALL_MODES,
        isolation: Isolation = Isolation.NONE,
        mig_profile: str = "",
        topology: TopologyConstraint | None = None,
    ) -> TaskBuilder:
        self._gpu = DeviceRequest(
            count=count,
            milli=milli,
            mem_mib=mem_mib,
            models=frozenset(models),
            modes=frozenset(modes),
            isolation=isolation,
            mig_profile=mig_profile,
            **({"topology": topology} if topology is not None else {}),
        )
        return self

    def priority(self, p: int) -> TaskBuilder:
        self._priority = p
        return self

    def created(self, t: float) -> TaskBuilder:
        self._created = t
        return self

    def job(self, job_id: str) -> TaskBuilder:
        self._job = job_id
        return self

    def queue(self, name: str) -> TaskBuilder:
        self._queue = name
        return self

    def selector(self, key: str, value: str) -> TaskBuilder:
        self._selector[key] = value
        return self

    def obj(self) -> Task:
        return Task(
            id=self._id,
            cpu_milli=self._cpu,
            mem_mib=self._mem,
            gpu=self._gpu,
            priority=self._priority,
            created=self._created,
            job=self._job,
            queue=self._queue,
            node_selector=dict(self._selector),
        )


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def make_task(task_id: str) -> TaskBuilder:
    return TaskBuilder(task_id)


def snapshot(*nodes: NodeBuilder | NodeSpec) -> Snapshot:
    b = SnapshotBuilder()
    for node in nodes:
        b.add(node.spec() if isinstance(node, NodeBuilder) else node)
    return b.build()
