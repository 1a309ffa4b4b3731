"""Kubernetes semantics beyond resources, through the live scheduler's path (translate -> cache
-> core k8s plugins) without a cluster: each case says where kube-scheduler's rules allow the
pod, worked out by hand in the comments. The differential suite (test_conformance.py) checks
the same rules against the real kube-scheduler on random clusters."""

from __future__ import annotations

from typing import Any

import pytest

from kallot.core import k8s
from kallot.core.errors import ConfigError
from kallot.core.status import Diagnosis
from kallot.kube import translate
from kallot.kube.api import k8s_fields
from kallot.kube.state.volumes import ANN_BIND_COMPLETED, VolumeIndex
from kallot.testing.k8s_objects import kallot_decide, node_obj, pod_obj

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def where(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], **kw: Any) -> dict[str, str]:
    """pod -> node, or '' when it fits nowhere."""
    return {
        k: ("" if isinstance(v, Diagnosis) else v)
        for k, v in kallot_decide(nodes, pods, **kw).items()
    }


# -- tolerations --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerates"),
    [
        (k8s.Toleration("a", "Equal", "x", "NoSchedule"), k8s.Taint("a", "x", "NoSchedule"), True),
        (k8s.Toleration("a", "Equal", "y", "NoSchedule"), k8s.Taint("a", "x", "NoSchedule"), False),
        (k8s.Toleration("a", "Exists", "", ""), k8s.Taint("a", "x", "NoExecute"), True),
        (k8s.Toleration("a", "Exists", "", "NoSchedule"), k8s.Taint("a", "x", "NoExecute"), False),
        (k8s.Toleration("", "Exists", "", ""), k8s.Taint("b", "x", "NoSchedule"), True),
        (k8s.Toleration("b", "Exists", "", ""), k8s.Taint("a", "", "NoSchedule"), False),
        # Equal with an empty value tolerates only a taint without a value.
        (k8s.Toleration("a", "Equal", "", ""), k8s.Taint("a", "", "NoSchedule"), True),
        (k8s.Toleration("a", "Equal", "", ""), k8s.Taint("a", "v", "NoSchedule"), False),
    ],
)
def test_toleration_matching(toleration: k8s.Toleration, taint: k8s.Taint, tolerates: bool) -> None:
    assert toleration.tolerates(taint) is tolerates


def test_gpu_taint_admits_only_tolerating_pods() -> None:
    nodes = [node_obj("gpu", taints=[GPU_TAINT]), node_obj("cpu", cpu="1")]
    pods = [
        pod_obj("plain", cpu="2"),  # too big for "cpu", and no toleration for "gpu"
        pod_obj("tolerant", cpu="2", tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]),
        pod_obj(
            "wrong-value",
            cpu="2",
            tolerations=[{"key": "nvidia.com/gpu", "value": "absent", "effect": "NoSchedule"}],
        ),
    ]
    got = where(nodes, pods)
    assert got == {"plain": "", "tolerant": "gpu", "wrong-value": ""}


def test_prefer_no_schedule_is_a_preference() -> None:
    nodes = [
        node_obj("a", taints=[{"key": "soft", "effect": "PreferNoSchedule"}]),
        node_obj("b"),
    ]
    for seed in range(5):
        assert where(nodes, [pod_obj("p")], seed=seed) == {"p": "b"}
    # Only the tainted node fits: the preference gives way.
    nodes[1] = node_obj("b", cpu="50m")
    assert where(nodes, [pod_obj("p")]) == {"p": "a"}


def test_cordoned_node_takes_only_pods_tolerating_unschedulable() -> None:
    nodes = [node_obj("a", unschedulable=True)]
    pods = [
        pod_obj("p"),
        pod_obj(
            "q",
            tolerations=[
                {"key": k8s.TAINT_UNSCHEDULABLE, "operator": "Exists", "effect": "NoSchedule"}
            ],
        ),
    ]
    assert where(nodes, pods) == {"p": "", "q": "a"}


# -- node affinity ------------------------------------------------------------------------------


def _required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


@pytest.mark.parametrize(
    ("term", "allowed"),
    [
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1", "z2"]}]}, "ab"),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z1"]}]}, "bc"),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, "ab"),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, "c"),
        ({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]}]}, "b"),
        ({"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["4"]}]}, "a"),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}, "c"),
    ],
)
def test_required_node_affinity_operators(term: dict[str, Any], allowed: str) -> None:
    nodes = [
        node_obj("a", labels={"zone": "z1", "gen": "3"}),
        node_obj("b", labels={"zone": "z2", "gen": "5"}),
        node_obj("c", labels={"gen": "x"}),  # not an integer: Gt/Lt never match
    ]
    ok = set()
    for name in "abc":
        # Pin each candidate by capacity: only node `name` has room for the pod.
        sized = [
            node_obj(
                n["metadata"]["name"],
                cpu="4" if n["metadata"]["name"] == name else "10m",
                labels={
                    k: v
                    for k, v in n["metadata"]["labels"].items()
                    if k != "kubernetes.io/hostname"
                },
            )
            for n in nodes
        ]
        if where(sized, [pod_obj("p", affinity=_required(term))])["p"]:
            ok.add(name)
    assert ok == set(allowed)


def test_node_selector_terms_are_ored_and_expressions_anded() -> None:
    nodes = [node_obj("a", labels={"x": "1"}), node_obj("b", labels={"y": "1", "z": "1"})]
    t1 = {"matchExpressions": [{"key": "x", "operator": "In", "values": ["2"]}]}
    t2 = {
        "matchExpressions": [
            {"key": "y", "operator": "Exists"},
            {"key": "z", "operator": "In", "values": ["1"]},
        ]
    }
    assert where(nodes, [pod_obj("p", affinity=_required(t1, t2))]) == {"p": "b"}


def test_preferred_node_affinity_scores() -> None:
    nodes = [node_obj("a", labels={"disk": "ssd"}), node_obj("b", labels={"disk": "hdd"})]
    pref = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "preference": {
                        "matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]
                    },
                }
            ]
        }
    }
    for seed in range(5):
        assert where(nodes, [pod_obj("p", affinity=pref)], seed=seed) == {"p": "b"}


# -- inter-pod affinity ---------------------------------------------------------------------------


def _anti(
    selector: dict[str, Any], key: str = "kubernetes.io/hostname", **extra: Any
) -> dict[str, Any]:
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": selector, "topologyKey": key, **extra}
            ]
        }
    }


def test_anti_affinity_spreads_replicas_in_one_session() -> None:
    nodes = [node_obj(f"n{i}") for i in range(3)]
    anti = _anti({"matchLabels": {"app": "web"}})
    pods = [pod_obj(f"web-{i}", labels={"app": "web"}, affinity=anti) for i in range(4)]
    got = where(nodes, pods)
    placed = [v for v in got.values() if v]
    assert sorted(placed) == ["n0", "n1", "n2"]  # one per node; the fourth has nowhere to go
    assert list(got.values()).count("") == 1


def test_existing_pods_anti_affinity_repels_matching_pods() -> None:
    nodes = [
        node_obj("a", labels={"zone": "z1"}),
        node_obj("b", labels={"zone": "z1"}),
        node_obj("c", labels={"zone": "z2"}),
    ]
    # A bound pod of another scheduler on "a" refuses app=db anywhere in its zone.
    guard = pod_obj(
        "guard",
        scheduler="default-scheduler",
        node="a",
        affinity=_anti({"matchLabels": {"app": "db"}}, key="zone"),
    )
    got = where(
        nodes,
        [
            guard,
            pod_obj("db", labels={"app": "db"}),
            pod_obj("web", labels={"app": "web"}, cpu="3900m"),
        ],
    )
    assert got["db"] == "c"
    assert got["web"] in {"a", "b", "c"}


def test_required_affinity_needs_a_match_in_the_domain_or_is_first_of_its_kind() -> None:
    nodes = [
        node_obj("a", labels={"zone": "z1"}),
        node_obj("b", labels={"zone": "z2"}),
        node_obj("c"),
    ]
    aff = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}
            ]
        }
    }
    # No cache pod anywhere and the pod is not one itself: nowhere.
    assert where(nodes, [pod_obj("p", affinity=aff)]) == {"p": ""}
    # The first pod of a group with affinity to itself goes to any node with the key.
    first = where(nodes, [pod_obj("p", labels={"app": "cache"}, affinity=aff)])["p"]
    assert first in {"a", "b"}
    # A cache pod in z2: only z2.
    cache = pod_obj("cache", labels={"app": "cache"}, scheduler="default-scheduler", node="b")
    assert where(nodes, [cache, pod_obj("p", affinity=aff, cpu="3950m")]) == {"p": ""}  # b full
    assert where(nodes, [cache, pod_obj("p", affinity=aff)]) == {"p": "b"}


def test_affinity_namespaces_and_namespace_selector() -> None:
    nodes = [node_obj("a"), node_obj("b")]
    other = pod_obj(
        "x", namespace="team-b", labels={"app": "x"}, scheduler="default-scheduler", node="a"
    )
    # Own namespace only: the pod in team-b does not count.
    assert where(nodes, [other, pod_obj("p", affinity=_anti({"matchLabels": {"app": "x"}}))])[
        "p"
    ] in {"a", "b"}
    listed = _anti({"matchLabels": {"app": "x"}}, namespaces=["team-b"])
    by_selector = _anti(
        {"matchLabels": {"app": "x"}},
        namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": "team-b"}},
    )
    every_ns = _anti({"matchLabels": {"app": "x"}}, namespaceSelector={})
    for aff in (listed, by_selector, every_ns):
        assert where(nodes, [other, pod_obj("p", affinity=aff)]) == {"p": "b"}


def test_namespace_selector_reads_namespace_labels() -> None:
    nodes = [node_obj("a"), node_obj("b")]
    other = pod_obj("x", namespace="team-b", labels={"app": "x"}, scheduler="s", node="a")
    aff = _anti({"matchLabels": {"app": "x"}}, namespaceSelector={"matchLabels": {"env": "prod"}})
    namespaces = [{"metadata": {"name": "team-b", "labels": {"env": "prod"}}}]
    got = where(nodes, [other, pod_obj("p", affinity=aff)], namespaces=namespaces)
    assert got == {"p": "b"}
    # team-b is not prod: "a" is allowed (and the only node with room).
    namespaces = [{"metadata": {"name": "team-b", "labels": {"env": "dev"}}}]
    small = [node_obj("a"), node_obj("b", cpu="10m")]
    got = where(small, [other, pod_obj("p", affinity=aff)], namespaces=namespaces)
    assert got == {"p": "a"}


def test_match_expressions_in_pod_selectors() -> None:
    nodes = [node_obj("a"), node_obj("b")]
    bound = pod_obj("x", labels={"tier": "gold"}, scheduler="default-scheduler", node="a")
    sel = {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["silver"]}]}
    assert where(nodes, [bound, pod_obj("p", affinity=_anti(sel))]) == {"p": "b"}
    sel = {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}
    assert where(nodes, [bound, pod_obj("p", affinity=_anti(sel), cpu="3900m")])["p"] in {"a", "b"}


# -- topology spread --------------------------------------------------------------------------------


def _spread(
    max_skew: int = 1, key: str = "zone", when: str = "DoNotSchedule", **extra: Any
) -> dict[str, Any]:
    return {
        "maxSkew": max_skew,
        "topologyKey": key,
        "whenUnsatisfiable": when,
        "labelSelector": {"matchLabels": {"app": "s"}},
        **extra,
    }


def test_spread_keeps_skew_in_one_session() -> None:
    nodes = [
        node_obj("a", labels={"zone": "z1"}),
        node_obj("b", labels={"zone": "z2"}),
        node_obj("c", labels={"zone": "z2"}),
    ]
    pods = [pod_obj(f"s{i}", labels={"app": "s"}, spread=[_spread()]) for i in range(6)]
    got = where(nodes, pods)
    zones = {"a": "z1", "b": "z2", "c": "z2"}
    counts = {"z1": 0, "z2": 0}
    for node in got.values():
        counts[zones[node]] += 1
    assert counts == {"z1": 3, "z2": 3}


def test_spread_rejects_nodes_without_the_key_and_respects_min_domains() -> None:
    nodes = [node_obj("a", labels={"zone": "z1"}), node_obj("nokey")]
    bound = pod_obj("b0", labels={"app": "s"}, scheduler="default-scheduler", node="a")
    # One domain, minDomains 2: the global minimum counts as 0, so z1 (1 pod + self) has skew 2.
    got = where(nodes, [bound, pod_obj("p", labels={"app": "s"}, spread=[_spread(minDomains=2)])])
    assert got == {"p": ""}
    got = where(nodes, [bound, pod_obj("p", labels={"app": "s"}, spread=[_spread()])])
    assert got == {"p": "a"}  # one domain: skew 0; the node without the key never qualifies


def test_spread_honours_node_affinity_when_counting_domains() -> None:
    nodes = [
        node_obj("a", labels={"zone": "z1", "pool": "x"}),
        node_obj("b", labels={"zone": "z2", "pool": "y"}),
    ]
    bound = [
        pod_obj(f"b{i}", labels={"app": "s"}, scheduler="default-scheduler", node="a")
        for i in range(2)
    ]
    pod = pod_obj("p", labels={"app": "s"}, node_selector={"pool": "x"}, spread=[_spread()])
    # Honor (default): z2 is not a domain for this pod, so z1 alone has skew 0.
    assert where(nodes, [*bound, pod]) == {"p": "a"}
    pod = pod_obj(
        "p",
        labels={"app": "s"},
        node_selector={"pool": "x"},
        spread=[_spread(nodeAffinityPolicy="Ignore")],
    )
    assert where(nodes, [*bound, pod]) == {"p": ""}  # z1 has 2 + 1, z2 has 0: skew 3


# -- host ports, extended resources, pods limit, overhead ------------------------------------------------


def test_host_ports_conflict_by_port_protocol_and_ip() -> None:
    nodes = [node_obj("a")]
    bound = pod_obj(
        "x",
        scheduler="default-scheduler",
        node="a",
        host_ports=[{"hostPort": 80, "protocol": "TCP", "hostIP": "10.0.0.1"}],
    )
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "same": ({"hostPort": 80}, ""),  # 0.0.0.0 overlaps every address
        "udp": ({"hostPort": 80, "protocol": "UDP"}, "a"),
        "other-ip": ({"hostPort": 80, "hostIP": "10.0.0.2"}, "a"),
        "same-ip": ({"hostPort": 80, "hostIP": "10.0.0.1"}, ""),
        "other-port": ({"hostPort": 81}, "a"),
    }
    for name, (port, expected) in cases.items():
        assert where(nodes, [bound, pod_obj(name, host_ports=[port])]) == {name: expected}, name
    # Two pods of one session asking the same port: only one fits.
    got = where(
        nodes,
        [
            pod_obj("p1", host_ports=[{"hostPort": 9000}]),
            pod_obj("p2", host_ports=[{"hostPort": 9000}]),
        ],
    )
    assert sorted(got.values()) == ["", "a"]


def test_extended_resources_and_ephemeral_storage_fit() -> None:
    nodes = [node_obj("a", extra={"example.com/dongle": "2", "ephemeral-storage": "10Gi"})]

    def with_req(name: str, reqs: dict[str, str]) -> dict[str, Any]:
        p = pod_obj(name)
        p["spec"]["containers"][0]["resources"]["requests"].update(reqs)
        return p

    got = where(
        nodes,
        [with_req("d1", {"example.com/dongle": "2"}), with_req("d2", {"example.com/dongle": "1"})],
    )
    assert sorted(got.values()) == ["", "a"]
    assert where(nodes, [with_req("e", {"ephemeral-storage": "20Gi"})]) == {"e": ""}
    assert where(nodes, [with_req("f", {"example.com/other": "1"})]) == {"f": ""}


def test_pod_count_limit_counts_every_pod() -> None:
    nodes = [node_obj("a", pods=2)]
    bound = pod_obj("x", scheduler="default-scheduler", node="a")
    got = where(nodes, [bound, pod_obj("p1"), pod_obj("p2")])
    assert sorted(got.values()) == ["", "a"]


def test_pod_overhead_adds_to_requests() -> None:
    nodes = [node_obj("a", cpu="1")]
    p = pod_obj("p", cpu="900m")
    p["spec"]["overhead"] = {"cpu": "200m"}
    assert where(nodes, [p]) == {"p": ""}


def test_nominated_node_is_preferred() -> None:
    nodes = [node_obj(f"n{i}") for i in range(4)]
    for target in ("n1", "n3"):
        p = pod_obj("p")
        p["status"] = {"nominatedNodeName": target}
        assert where(nodes, [p]) == {"p": target}


# -- volumes -----------------------------------------------------------------------------------------


def _pv(
    name: str,
    node: str | None = None,
    cls: str = "local",
    size: str = "1Gi",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "capacity": {"storage": size},
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": cls,
        "hostPath": {"path": "/tmp"},
    }
    if node:
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                        ]
                    }
                ]
            }
        }
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"phase": "Available"},
    }


def _pvc(
    name: str, *, volume: str = "", cls: str = "local", size: str = "1Gi", bound: bool = True
) -> dict[str, Any]:
    ann = {ANN_BIND_COMPLETED: "yes"} if volume and bound else {}
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
        "storageClassName": cls,
    }
    if volume:
        spec["volumeName"] = volume
    return {"metadata": {"name": name, "namespace": "default", "annotations": ann}, "spec": spec}


def _class(
    name: str,
    mode: str = "WaitForFirstConsumer",
    provisioner: str = "kubernetes.io/no-provisioner",
    topologies: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": mode,
    }
    if topologies:
        out["allowedTopologies"] = topologies
    return out


def test_bound_claim_pins_the_pod_to_its_volume_node() -> None:
    nodes = [node_obj(f"n{i}") for i in range(3)]
    got = kallot_decide(
        nodes,
        [pod_obj("p", claims=["data"])],
        claims=[_pvc("data", volume="pv1")],
        volumes=[_pv("pv1", node="n2")],
    )
    assert got == {"p": "n2"}
    nodes[2] = node_obj("n2", cpu="10m")  # the volume's node is full: pending, with the reason
    got = kallot_decide(
        nodes,
        [pod_obj("p", claims=["data"])],
        claims=[_pvc("data", volume="pv1")],
        volumes=[_pv("pv1", node="n2")],
    )
    assert isinstance(got["p"], Diagnosis)


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ([], 'persistentvolumeclaim "data" not found'),
        ([_pvc("data")], "pod has unbound immediate PersistentVolumeClaims"),
        ([_pvc("data", volume="gone")], 'bound to non-existent persistentvolume "gone"'),
    ],
)
def test_claim_problems_keep_the_pod_pending_with_a_reason(
    claims: list[dict[str, Any]], message: str
) -> None:
    got = kallot_decide(
        [node_obj("a")],
        [pod_obj("p", claims=["data"])],
        claims=claims,
        classes=[_class("local", mode="Immediate")],
    )
    diagnosis = got["p"]
    assert isinstance(diagnosis, Diagnosis)
    assert message in diagnosis.message()


def test_wait_for_first_consumer_static_and_dynamic() -> None:
    nodes = [node_obj("a", labels={"zone": "z1"}), node_obj("b", labels={"zone": "z2"})]
    claim = _pvc("data")
    # Static: only node b has an available local PV big enough.
    got = where(
        nodes,
        [pod_obj("p", claims=["data"])],
        claims=[claim],
        volumes=[_pv("small", node="a", size="100Mi"), _pv("big", node="b")],
        classes=[_class("local")],
    )
    assert got == {"p": "b"}
    # Dynamic, restricted to z1.
    topo = [{"matchLabelExpressions": [{"key": "zone", "values": ["z1"]}]}]
    got = where(
        nodes,
        [pod_obj("p", claims=["data"])],
        claims=[claim],
        classes=[_class("local", provisioner="csi.example.com", topologies=topo)],
    )
    assert got == {"p": "a"}
    # No provisioner and no PV: nowhere.
    assert where(
        nodes, [pod_obj("p", claims=["data"])], claims=[claim], classes=[_class("local")]
    ) == {"p": ""}


def test_volume_zone_labels() -> None:
    nodes = [
        node_obj("a", labels={"topology.kubernetes.io/zone": "z1"}),
        node_obj("b", labels={"topology.kubernetes.io/zone": "z2"}),
        node_obj("c"),
    ]
    pv = _pv("pv1", labels={"topology.kubernetes.io/zone": "z2__z3"})
    index = VolumeIndex()
    index.replace_claims([_pvc("data", volume="pv1")])
    index.replace_volumes([pv])
    got = kallot_decide(
        nodes,
        [pod_obj("p", claims=["data"], cpu="3")],
        claims=[_pvc("data", volume="pv1")],
        volumes=[pv],
    )
    assert got["p"] in {"b", "c"}  # a node without zone labels is not constrained (VolumeZone)


# -- translation errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"tolerations": [{"key": "a", "operator": "Gt"}]}, "spec.tolerations[0].operator"),
        (
            {
                "topologySpreadConstraints": [
                    {"maxSkew": 0, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}
                ]
            },
            "spec.topologySpreadConstraints[0].maxSkew",
        ),
        (
            {
                "affinity": {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]
                    }
                }
            },
            "topologyKey",
        ),
        (
            {"affinity": _required({"matchExpressions": [{"key": "a", "operator": "Near"}]})},
            "matchExpressions[0].operator",
        ),
    ],
)
def test_bad_fields_name_the_field(spec: dict[str, Any], field: str) -> None:
    pod = pod_obj("p")
    pod["spec"].update(spec)
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        translate.pod_to_task(pod)


def test_pods_without_k8s_fields_have_empty_info() -> None:
    info = k8s_fields.pod_info(pod_obj("p"))
    assert info.tolerations == () and info.required_nodes is None and not info.has_pod_affinity
    assert info.spread == () and info.host_ports == () and info.claims == ()


def test_rolled_back_placements_no_longer_count() -> None:
    """A what-if (a gang, a preemption) that is rolled back leaves no trace in the pods the
    inter-pod rules see: the core's pod log pops its entries and the index is rebuilt."""
    import numpy as np

    from kallot.config import presets
    from kallot.core import policies
    from kallot.core.decision import Placement
    from kallot.core.framework.runner import Framework
    from kallot.core.session.session import Session
    from kallot.kube.state.cache import Cache

    cache = Cache()
    cache.replace_nodes([node_obj("a"), node_obj("b")])
    anti = _anti({"matchLabels": {"app": "web"}})
    cache.replace_pods(
        [pod_obj(f"w{i}", labels={"app": "web"}, affinity=anti, uid=f"u{i}") for i in range(3)]
    )
    inp = cache.session_input()
    fw = Framework(presets.profile("first-fit"), policies.builtin_registry())
    session = Session(fw, inp.snapshot, now=0.0, rng=np.random.default_rng(0), jobs={})
    t0, t1, t2 = inp.tasks
    first = session.place(t0)
    assert isinstance(first, Placement)
    mark = session.statement.checkpoint()
    second = session.place(t1)
    assert isinstance(second, Placement) and second.node != first.node
    assert not isinstance(session.place(t2), Placement)  # both nodes hold a web pod
    session.statement.rollback(mark)
    again = session.place(t2)
    assert isinstance(again, Placement) and again.node == second.node


def test_nominated_pod_holds_its_node_from_lower_priority_pods() -> None:
    nodes = [node_obj("a"), node_obj("b", cpu="1")]
    nominee = pod_obj("nominee", cpu="3")
    nominee["spec"]["priority"] = 10
    nominee["spec"]["schedulingGates"] = [{"name": "waiting-for-victims"}]  # out of the session
    nominee["status"] = {"nominatedNodeName": "a"}
    low = pod_obj("low", cpu="2")
    high = pod_obj("high", cpu="2")
    high["spec"]["priority"] = 20
    assert where(nodes, [nominee, low]) == {"low": ""}  # 4 - 3 held < 2
    assert where(nodes, [nominee, high]) == {"high": "a"}  # higher priority: not held from it
    assert where(nodes, [low]) == {"low": "a"}  # without the nominee, it fits
