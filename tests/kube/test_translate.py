"""Pods as the API returns them -> the core's Task (kube.translate), as tables: what each way of
asking for GPUs (docs/pod-api.md) becomes, and the field every bad request is blamed on.
"""

from __future__ import annotations

from typing import Any

import pytest

from kallot.core.errors import ConfigError
from kallot.core.resources import Isolation, SharingMode
from kallot.core.workload import TopologyMode
from kallot.kube import translate
from kallot.kube.ops import explain
from kallot.testing.live import pod_body


def _pod(
    resources: dict[str, str], annotations: dict[str, str] | None = None, **labels: str
) -> dict[str, Any]:
    body = pod_body("p", resources=resources, annotations=annotations, labels=labels)
    body["metadata"].update(namespace="ml", uid="u-1", creationTimestamp="2026-12-03T08:00:00Z")
    return body


@pytest.mark.parametrize(
    ("resources", "annotations", "count", "milli", "mem_mib", "mig"),
    [
        pytest.param({"nvidia.com/gpu": "2"}, {}, 2, 1000, 0, "", id="two-whole-gpus"),
        # 20Gi = 20 * 1024 MiB = 20480 MiB
        pytest.param(
            {"kallot.io/gpu-milli": "250", "kallot.io/gpu-memory": "20Gi"},
            {},
            1,
            250,
            20480,
            "",
            id="quarter-share-with-memory",
        ),
        pytest.param(
            {"kallot.io/gpu-milli": "500"}, {}, 1, 500, 0, "", id="share-memory-in-proportion"
        ),
        pytest.param({"nvidia.com/mig-3g.40gb": "1"}, {}, 1, 1000, 0, "3g.40gb", id="mig-instance"),
        # 1000 milli with memory is a full-compute share that still shares the GPU's memory.
        pytest.param(
            {"kallot.io/gpu-milli": "1000", "kallot.io/gpu-memory": "8Gi"},
            {},
            1,
            1000,
            8192,
            "",
            id="full-compute-share",
        ),
    ],
)
def test_gpu_requests(  # noqa: PLR0917 - pytest passes the table columns positionally
    resources: dict[str, str],
    annotations: dict[str, str],
    count: int,
    milli: int,
    mem_mib: int,
    mig: str,
) -> None:
    task = translate.pod_to_task(_pod(resources, annotations))
    assert task.gpu is not None
    assert (task.gpu.count, task.gpu.milli, task.gpu.mem_mib, task.gpu.mig_profile) == (
        count,
        milli,
        mem_mib,
        mig,
    )
    assert task.id == "u-1" and task.cpu_milli == 100 and task.mem_mib == 128


def test_refinements_gang_and_queue() -> None:
    task = translate.pod_to_task(
        _pod(
            {"kallot.io/gpu-milli": "300"},
            {
                "kallot.io/gpu-model": "H100, A100-80GB",
                "kallot.io/sharing": "mps",
                "kallot.io/isolation": "memory-isolated",
                "kallot.io/topology": "preferred:nvlink",
            },
            **{"kallot.io/pod-group": "train", "kallot.io/queue": "research"},
        )
    )
    assert task.gpu is not None
    assert task.gpu.modes == frozenset({SharingMode.MPS})
    assert task.gpu.isolation is Isolation.MEMORY
    assert (task.gpu.topology.mode, task.gpu.topology.level) == (TopologyMode.PREFERRED, "nvlink")
    assert len(task.gpu.models) == 2
    assert (task.job, task.queue) == ("ml/train", "research")
    assert "models" in explain.describe_request(
        task
    ) and "gang ml/train" in explain.describe_request(task)


@pytest.mark.parametrize(
    ("annotations", "modes", "mig_ok"),
    [
        # no kallot.io/sharing: every mechanism its isolation allows, MIG included
        ({}, set(SharingMode), True),
        ({"kallot.io/sharing": "mig,mps"}, {SharingMode.MIG, SharingMode.MPS}, True),
        # a list without mig keeps the share off MIG
        (
            {"kallot.io/sharing": "mps,time-slicing"},
            {SharingMode.MPS, SharingMode.TIMESLICE},
            False,
        ),
        # memory-isolated: MPS or MIG (time-slicing has no memory limit)
        ({"kallot.io/isolation": "memory-isolated"}, set(SharingMode), True),
        # untrusted: every mode listed, isolation leaves MIG only for a share
        ({"kallot.io/isolation": "untrusted"}, set(SharingMode), True),
    ],
)
def test_share_may_ask_for_a_mig_instance(
    annotations: dict[str, str], modes: set[SharingMode], mig_ok: bool
) -> None:
    task = translate.pod_to_task(
        _pod({"kallot.io/gpu-milli": "100", "kallot.io/gpu-memory": "30Gi"}, annotations)
    )
    assert task.gpu is not None and task.gpu.modes == frozenset(modes)
    assert task.gpu.accepts(SharingMode.MIG) is mig_ok
    assert (task.gpu.milli, task.gpu.mem_mib, task.gpu.mig_profile) == (100, 30 * 1024, "")


def test_no_gpu_request_is_a_cpu_task() -> None:
    assert translate.pod_to_task(_pod({})).gpu is None


@pytest.mark.parametrize(
    ("resources", "annotations", "field"),
    [
        pytest.param(
            {"kallot.io/gpu-milli": "1500"},
            {},
            "resources.limits[kallot.io/gpu-milli]",
            id="share-above-one-gpu",
        ),
        pytest.param(
            {"kallot.io/gpu-milli": "1000"},
            {},
            "resources.limits[kallot.io/gpu-milli]",
            id="whole-gpu-as-share",
        ),
        pytest.param(
            {"kallot.io/gpu-memory": "8Gi"},
            {},
            "resources.limits[kallot.io/gpu-memory]",
            id="memory-without-compute",
        ),
        pytest.param(
            {"nvidia.com/mig-9g.99gb": "1"},
            {},
            "spec.containers[0].resources.limits",
            id="unknown-mig-profile",
        ),
        pytest.param(
            {"nvidia.com/mig-1g.10gb": "2"},
            {},
            "resources.limits[nvidia.com/mig-1g.10gb]",
            id="two-mig-instances",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1", "kallot.io/gpu-milli": "500"},
            {},
            "resources.limits[kallot.io/gpu-milli]",
            id="whole-and-share",
        ),
        pytest.param(
            {"kallot.io/gpu-milli": "500"},
            {"kallot.io/sharing": "sometimes"},
            "metadata.annotations[kallot.io/sharing]",
            id="bad-sharing",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/sharing": "mps"},
            "metadata.annotations[kallot.io/sharing]",
            id="whole-gpu-shared",
        ),
        pytest.param(
            {"kallot.io/gpu-milli": "500"},
            {"kallot.io/sharing": "exclusive"},
            "metadata.annotations[kallot.io/sharing]",
            id="share-only-exclusive",
        ),
        pytest.param(
            {"kallot.io/gpu-milli": "500"},
            {"kallot.io/sharing": "time-slicing", "kallot.io/isolation": "untrusted"},
            "metadata.annotations[kallot.io/isolation]",
            id="untrusted-share-without-mig",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/topology": "x:y"},
            "metadata.annotations[kallot.io/topology]",
            id="bad-topology",
        ),
        pytest.param(
            {},
            {"kallot.io/gpu-model": "H100"},
            "metadata.annotations[kallot.io/gpu-model]",
            id="refines-nothing",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/min-runtime": "soon"},
            "metadata.annotations[kallot.io/min-runtime]",
            id="bad-duration",
        ),
        # A tenant's own annotation buys bounded protection only (docs/security.md).
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/min-runtime": "inf"},
            "metadata.annotations[kallot.io/min-runtime]",
            id="min-runtime-inf",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/min-runtime": "nan"},
            "metadata.annotations[kallot.io/min-runtime]",
            id="min-runtime-nan",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/min-runtime": "1e308"},
            "metadata.annotations[kallot.io/min-runtime]",
            id="min-runtime-exponent",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/min-runtime": "-60"},
            "metadata.annotations[kallot.io/min-runtime]",
            id="min-runtime-negative",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/min-runtime": "-1m"},
            "metadata.annotations[kallot.io/min-runtime]",
            id="min-runtime-negative-unit",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/min-runtime": "2h"},
            "metadata.annotations[kallot.io/min-runtime]",
            id="min-runtime-over-cap",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/min-runtime": "3601"},
            "metadata.annotations[kallot.io/min-runtime]",
            id="min-runtime-over-cap-seconds",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"kallot.io/min-runtime": "99999999999h"},
            "metadata.annotations[kallot.io/min-runtime]",
            id="min-runtime-huge",
        ),
    ],
)
def test_bad_requests_name_the_field(
    resources: dict[str, str], annotations: dict[str, str], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        translate.pod_to_task(_pod(resources, annotations))
    assert field in str(err.value)
    assert "expected" in str(err.value)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("15m", 900.0), ("1h", 3600.0), ("600", 600.0), ("59.5", 59.5), ("", 0.0)],
)
def test_min_runtime_within_the_cap(text: str, seconds: float) -> None:
    task = translate.pod_to_task(_pod({"nvidia.com/gpu": "1"}, {"kallot.io/min-runtime": text}))
    assert task.min_runtime_s == seconds


def test_min_runtime_refusal_names_the_cap() -> None:
    with pytest.raises(ConfigError, match="at most 1h"):
        translate.pod_to_task(_pod({"nvidia.com/gpu": "1"}, {"kallot.io/min-runtime": "inf"}))


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        # 1.5 CPU = 1500 milli-CPU; 100m = 100; 1Gi = 1024 MiB; 1G = 10^9 B = 953.67 MiB -> 954
        pytest.param("1.5", "cpu", 1500, id="cpu-decimal"),
        pytest.param("100m", "cpu", 100, id="cpu-milli"),
        pytest.param("1Gi", "mem", 1024, id="mem-binary"),
        pytest.param("1G", "mem", 954, id="mem-decimal-rounds-up"),
    ],
)
def test_quantities(text: str, field: str, value: int) -> None:
    convert = translate.cpu_milli if field == "cpu" else translate.mem_mib
    assert convert(text, field) == value


def test_bad_node_inventory_is_reported_not_raised() -> None:
    from kallot.testing.live import inventory_node_body

    body = inventory_node_body("n0", 2)
    body["metadata"]["annotations"]["kallot.io/gpu-inventory"] = '{"devices": [{"index": 3}]}'
    info = translate.node_info(body)
    assert info.inventory_error is not None and info.spec.gpus == []
    assert "kallot.io/gpu-inventory" in str(info.inventory_error)


@pytest.mark.parametrize(
    ("annotations", "protected"),
    [
        pytest.param({}, False, id="unmarked"),
        pytest.param({"kallot.io/do-not-disrupt": "true"}, True, id="kallot"),
        pytest.param({"karpenter.sh/do-not-disrupt": "true"}, True, id="karpenter"),
        pytest.param({"karpenter.sh/do-not-disrupt": "false"}, False, id="karpenter-false"),
    ],
)
def test_do_not_disrupt_follows_either_convention(
    annotations: dict[str, str], protected: bool
) -> None:
    task = translate.pod_to_task(_pod({"nvidia.com/gpu": "1"}, annotations))
    assert task.do_not_disrupt is protected


def test_bad_karpenter_annotation_names_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        translate.pod_to_task(_pod({}, {"karpenter.sh/do-not-disrupt": "maybe"}))
    assert err.value.field == "metadata.annotations[karpenter.sh/do-not-disrupt]"


def test_started_is_the_bind_time_then_the_kubelets_start_time() -> None:
    pod = _pod({})
    assert translate.pod_started(pod) == 0.0
    pod["status"] = {"startTime": "2026-12-03T08:00:10Z"}
    assert translate.pod_started(pod) == translate.parse_time("2026-12-03T08:00:10Z")
    # The scheduler's bind time (ns) wins: that is when the devices were taken.
    pod["metadata"]["annotations"]["kallot.io/bind-time"] = "1780000000500000000"
    assert translate.pod_started(pod) == 1780000000.5


def test_queue_tree_from_queue_objects() -> None:
    specs = [
        translate.queue_spec(
            {
                "metadata": {"name": "research"},
                "spec": {
                    "resources": {
                        "gpu": {"quota": "4", "limit": 6, "overQuotaWeight": 2},
                        "gpuMemory": {"limit": "320Gi"},
                        "cpu": {"quota": "500m"},
                        "memory": {"limit": "1Ti"},
                        "models": {"H100-80GB": {"limit": 2}, "T4": {"quota": "0.5"}},
                    }
                },
            }
        ),
        translate.queue_spec(
            {"metadata": {"name": "nlp"}, "spec": {"parent": "research", "priority": 5}}
        ),
    ]
    tree = translate.queue_tree(specs)
    # Sorted by name, plus the implicit leaf for pods that name no queue.
    assert tree.names == ("nlp", "research", "default")
    assert tree.default_queue == "default"
    research = tree.index["research"]

    def claim(resource: str) -> tuple[int, int]:
        return int(tree.guaranteed[research, tree.axis[resource]]), int(
            tree.limit[research, tree.axis[resource]]
        )

    # 4 GPUs guaranteed = 4000 milli, limit 6 GPUs = 6000 milli, weight 2.
    assert claim("gpu") == (4000, 6000)
    assert tree.weight[research, tree.axis["gpu"]] == 2.0
    assert claim("gpu_memory")[1] == 320 * 1024  # 320Gi = 327,680 MiB
    assert claim("cpu")[0] == 500  # 500m = 500 milli-CPU
    assert claim("memory")[1] == 1024 * 1024  # 1Ti = 1,048,576 MiB
    assert claim("gpu/H100-80GB")[1] == 2000  # 2 GPUs = 2000 milli
    assert claim("gpu/T4")[0] == 500
    assert tree.queues[tree.index["nlp"]].priority == 5
    assert tree.parent[tree.index["nlp"]] == research


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        pytest.param(
            {"gpu": {"quota": "lots"}}, "Queue q: spec.resources.gpu.quota", id="bad-quantity"
        ),
        pytest.param(
            {"cpu": {"overQuotaWeight": -1}},
            "Queue q: spec.resources.cpu.overQuotaWeight",
            id="negative-weight",
        ),
        pytest.param(
            {"models": {"H100": {"limit": "x"}}},
            "Queue q: spec.resources.models[H100].limit",
            id="bad-model-limit",
        ),
        pytest.param({"gpus": {"quota": 1}}, "Queue q: spec.resources.gpus", id="unknown-key"),
    ],
)
def test_bad_queue_names_the_field(resources: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        translate.queue_spec({"metadata": {"name": "q"}, "spec": {"resources": resources}})
    assert err.value.field == field


def test_queue_tree_with_a_missing_parent_names_it() -> None:
    with pytest.raises(ConfigError) as err:
        translate.queue_tree([translate.QueueSpec(name="nlp", parent="research")])
    assert (err.value.field, err.value.value) == ("queues[nlp].parent", "research")


@pytest.mark.parametrize(
    ("status", "usable"),
    [pytest.param(None, True, id="absent"), ("True", True), ("False", False)],
)
def test_no_gpu_is_placed_while_the_agent_says_its_plugins_are_not_ready(
    status: str | None, usable: bool
) -> None:
    """``kallot.io/DevicePluginsReady`` False (node.kubelet_checkpoint: the kubelet would give a
    GPU pod other devices than its record's, or none): every GPU unusable to the core, the rest of
    the node as before, and the node's signature changes so the cache takes it in."""
    from kallot.config import wire
    from kallot.testing.live import inventory_node_body

    body = inventory_node_body("n0", 2)
    if status is not None:
        body["status"].setdefault("conditions", []).append(
            {"type": wire.CONDITION_DEVICE_PLUGINS_READY, "status": status, "message": "why"}
        )
    info = translate.node_info(body)
    plain = translate.node_info(inventory_node_body("n0", 2))
    assert [g.healthy for g in info.spec.gpus] == [usable, usable]
    assert info.spec.cpu_milli == plain.spec.cpu_milli and info.spec.schedulable
    assert (info.signature == plain.signature) is usable
    assert translate.plugins_not_serving(body) == ("" if usable else "why")
