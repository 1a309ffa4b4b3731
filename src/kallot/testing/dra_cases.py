"""Seeded random DRA allocation cases for the differential test against upstream.

Where it sits: test support for ``kallot.testing.dra_diff`` (which runs each case through
kallot's allocator and through upstream's, ``tools/testenv/dra-diff``). ``case(seed)`` builds
one single-node case as ``resource.k8s.io/v1`` JSON, shaped like NVIDIA's DRA driver and
mixing every feature the allocators implement: whole GPUs, dynamic-MIG partitions with counter
sets, shared GPUs (``allowMultipleAllocations``, request policies, capacity requests), device
taints and tolerations, CEL selectors (some failing at run time on some devices, optional
syntax, ``allowMultipleAllocations``), ``matchAttribute`` / ``distinctAttribute`` (optionally
naming requests), ``firstAvailable``, ``allocationMode: All``, admin access, claims already
allocated by others (whole devices, shares, partitions, admin results), several pools and
drivers (a NIC driver, a network-attached pool with a node selector, ``allNodes``,
``perDeviceNodeSelection``, a pool on another node), incomplete and outdated pools, list-type
attributes, binding conditions and the special claim of DRA-backed extended resources (built
as kube-scheduler builds it). The same seed always gives the same case.
"""

from __future__ import annotations

import copy
import random
from typing import Any

NVIDIA = "gpu.nvidia.com"
NIC = "nic.example.com"
STD = "resource.kubernetes.io"
NODE = "n1"
A = f"device.attributes['{NVIDIA}']"
C = f"device.capacity['{NVIDIA}']"

Json = dict[str, Any]

# Selector expressions a request may add (None: no selector). Some fail at run time on some
# devices (a missing attribute is an error), in the order the search meets them.
SELECTORS: tuple[str, ...] = (
    f"{A}.productName.startsWith('NVIDIA')",
    f"{A}.architecture == 'Hopper'",
    f"{A}.driverVersion.isGreaterThan(semver('570.0.0'))",
    f"{A}.cudaComputeCapability.compareTo(semver('8.0.0')) >= 0",
    f"{C}.memory.compareTo(quantity('40Gi')) >= 0",
    f"{C}.memory.isLessThan(quantity('30Gi'))",
    f"{A}.?profile.orValue('') != '7g.40gb'",
    f"{A}.?profile.orValue('none') == 'none'",
    "device.allowMultipleAllocations",
    "!device.allowMultipleAllocations",
    f"'{STD}' in device.attributes && device.attributes['{STD}'].pcieRoot == 'pci0000:00'",
    f"device.capacity['{NVIDIA}'].exists(k, k == 'multiprocessors')",
    f"{C}.?multiprocessors.orValue(quantity('0')).isGreaterThan(quantity('20'))",
    f"{A}.brand in ['Nvidia', 'Tesla']",
)
# Selectors that fail on some devices: a missing attribute is a runtime error.
FAILING: tuple[str, ...] = (
    f"{A}.profile == '1g.5gb'",  # fails on a whole GPU (no profile)
    f"{A}.uuid.endsWith('1') || {A}.uuid.endsWith('2')",  # fails on partitions (no uuid)
    f"{C}.multiprocessors.isGreaterThan(quantity('20'))",  # fails on whole GPUs
)
LIST_SELECTORS: tuple[str, ...] = (
    f"{A}.?features.hasValue() && {A}.features.includes('nvlink')",
    f"{A}.?features.orValue([]).exists(f, f == 'fp8')",
)
TOLERATIONS: tuple[Json, ...] = (
    {"key": "nvidia.com/unhealthy", "operator": "Exists"},
    {"key": "nvidia.com/unhealthy", "operator": "Equal", "value": "xid", "effect": "NoSchedule"},
    {"operator": "Exists", "effect": "NoExecute"},
    {"operator": "Exists"},
)
TAINTS: tuple[Json, ...] = (
    {"key": "nvidia.com/unhealthy", "value": "xid", "effect": "NoSchedule"},
    {"key": "nvidia.com/unhealthy", "value": "ecc", "effect": "NoExecute"},
    {"key": "example.com/maintenance", "effect": "NoSchedule"},
    {"key": "example.com/info", "effect": "None"},
)
# (profile, memory slices, multiprocessors, GiB, starts): a reduced A100 geometry.
MIG = (("1g.5gb", 1, 14, 5, (0, 1, 2, 3)), ("2g.10gb", 2, 28, 10, (0, 2)),
       ("4g.20gb", 4, 56, 20, (0,)))  # fmt: skip


def _obj(kind: str, name: str, spec: Json, **meta: Any) -> Json:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, **meta},
        "spec": spec,
    }


class _Case:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.seed = seed
        self.list_types = self.r.random() < 0.15
        self.devices: list[tuple[str, str, Json]] = []  # (driver, pool, device), for claims
        self.slices: list[Json] = []

    # --- devices -------------------------------------------------------------------------

    def _gpu_attrs(self, i: int, root: int) -> Json:
        r = self.r
        attrs: Json = {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{self.seed}-{i}"},
            "productName": {"string": r.choice(("NVIDIA H100 80GB HBM3", "NVIDIA A100 40GB"))},
            "brand": {"string": r.choice(("Nvidia", "Nvidia", "Tesla", "Quadro"))},
            "architecture": {"string": r.choice(("Hopper", "Ampere"))},
            "cudaComputeCapability": {"version": r.choice(("9.0.0", "8.0.0", "7.5.0"))},
            "driverVersion": {"version": r.choice(("570.124.6", "550.54.15"))},
            f"{STD}/pciBusID": {"string": f"0000:{0x18 + i:02x}:00.0"},
            f"{STD}/pcieRoot": {"string": f"pci0000:{root * 0x40:02x}"},
        }
        if self.list_types and r.random() < 0.6:
            attrs["features"] = {"strings": r.sample(["nvlink", "fp8", "mig", "mps"], 2)}
        if r.random() < 0.2:
            attrs["numaNode"] = {"int": r.randrange(2)}
        return attrs

    def _taints(self) -> list[Json]:
        if self.r.random() < 0.18:
            return [dict(t) for t in self.r.sample(TAINTS, self.r.choice((1, 1, 2)))]
        return []

    def _nvidia_pool(self, pool: str, placement: Json, *, offset: int) -> None:
        r = self.r
        roots = r.choice((1, 2, 2, 3))
        devices: list[Json] = []
        counter_sets: list[Json] = []
        gpus, migs, shared = r.randrange(1, 7), r.choice((0, 0, 1, 1, 2)), r.choice((0, 0, 1, 2))
        for i in range(gpus):
            dev: Json = {
                "name": f"gpu-{i}",
                "attributes": self._gpu_attrs(offset + i, i % roots),
                "capacity": {"memory": {"value": r.choice(("80Gi", "40Gi"))}},
            }
            if taints := self._taints():
                dev["taints"] = taints
            devices.append(dev)
        for g in range(gpus, gpus + migs):
            counters = {"memory": {"value": "40Gi"}, "multiprocessors": {"value": "98"}}
            counters.update({f"memory-slice-{k}": {"value": "1"} for k in range(4)})
            counter_sets.append({"name": f"gpu-{g}-counter-set", "counters": counters})
            for profile, slices, sms, gib, starts in MIG:
                for start in starts:
                    attrs = self._gpu_attrs(offset + g, g % roots)
                    attrs["type"] = {"string": "mig"}
                    attrs["parentUUID"] = attrs.pop("uuid")
                    attrs["profile"] = {"string": profile}
                    mem = {
                        f"memory-slice-{k}": {"value": "1"} for k in range(start, start + slices)
                    }
                    dev = {
                        "name": f"gpu-{g}-mig-{profile.replace('.', '')}-{start}",
                        "attributes": attrs,
                        "capacity": {
                            "memory": {"value": f"{gib}Gi"},
                            "multiprocessors": {"value": str(sms)},
                        },
                        "consumesCounters": [
                            {
                                "counterSet": f"gpu-{g}-counter-set",
                                "counters": {
                                    "memory": {"value": f"{gib}Gi"},
                                    "multiprocessors": {"value": str(sms)},
                                    **mem,
                                },
                            }
                        ],
                    }
                    if taints := self._taints() if r.random() < 0.3 else []:
                        dev["taints"] = taints
                    devices.append(dev)
        for s in range(gpus + migs, gpus + migs + shared):
            policy = r.choice(
                (
                    None,
                    {"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
                    {"default": "10Gi", "validRange": {"min": "5Gi", "max": "40Gi", "step": "5Gi"}},
                    {"default": "20Gi", "validValues": ["10Gi", "20Gi", "40Gi", "80Gi"]},
                )
            )
            cap: Json = {"value": "80Gi"}
            if policy:
                cap["requestPolicy"] = policy
            dev = {
                "name": f"gpu-{s}",
                "attributes": self._gpu_attrs(offset + s, s % roots),
                "allowMultipleAllocations": True,
                "capacity": {"memory": cap},
            }
            if r.random() < 0.3:
                counter_sets.append(
                    {"name": f"gpu-{s}-counter-set", "counters": {"memory": {"value": "80Gi"}}}
                )
                dev["consumesCounters"] = [
                    {
                        "counterSet": f"gpu-{s}-counter-set",
                        "counters": {"memory": {"value": "80Gi"}},
                    }
                ]
            if taints := self._taints():
                dev["taints"] = taints
            devices.append(dev)
        if r.random() < 0.1 and devices:
            for dev in devices:
                dev["bindingConditions"] = ["example.com/attached"]
                dev["bindingFailureConditions"] = ["example.com/failed"]
        elif devices and (side := random.Random(f"binding-{self.seed}-{pool}")).random() < 0.2:
            # Some devices of the pool only (its own generator: the other draws stay as they
            # were): upstream tries such a pool after the pools without binding conditions.
            for dev in devices:
                if side.random() < 0.5:
                    dev["bindingConditions"] = ["example.com/attached"]
                    if side.random() < 0.5:
                        dev["bindingFailureConditions"] = ["example.com/failed"]
        self._publish(NVIDIA, pool, placement, devices, counter_sets)

    def _nic_pool(self, pool: str, placement: Json) -> None:
        devices = [
            {
                "name": f"nic-{i}",
                "attributes": {
                    "kind": {"string": "rdma"},
                    f"{STD}/pcieRoot": {"string": f"pci0000:{(i % 2) * 0x40:02x}"},
                },
                "capacity": {"bandwidth": {"value": "200G"}},
            }
            for i in range(self.r.randrange(1, 4))
        ]
        self._publish(NIC, pool, placement, devices, [])

    def _publish(
        self, driver: str, pool: str, placement: Json, devices: list[Json], counters: list[Json]
    ) -> None:
        r = self.r
        generation = r.choice((1, 1, 2))
        specs: list[Json] = []
        if counters:
            specs.append({"sharedCounters": counters})
        per_device = placement == {"perDeviceNodeSelection": True}
        if per_device:
            for dev in devices:
                dev.update(r.choice(({"nodeName": NODE}, {"allNodes": True}, {"nodeName": "n2"})))
        if devices and r.random() < 0.25 and not counters:
            cut = r.randrange(1, len(devices) + 1)
            specs.append({**placement, "devices": devices[:cut]})
            if cut < len(devices):
                specs.append({**placement, "devices": devices[cut:]})
        else:
            specs.append({**placement, "devices": devices})
        count = len(specs)
        missing = r.random() < 0.06 and count > 1
        for k, spec in enumerate(specs):
            if missing and k == count - 1:
                continue  # an incomplete pool: resourceSliceCount says more
            name = f"{pool}-{driver}-{k}"
            self.slices.append(
                _obj(
                    "ResourceSlice",
                    name,
                    {
                        "driver": driver,
                        "pool": {
                            "name": pool,
                            "generation": generation,
                            "resourceSliceCount": count,
                        },
                        **spec,
                    },
                )
            )
        if generation > 1 and r.random() < 0.5:  # an outdated slice, ignored by both
            old = [{**copy.deepcopy(d), "name": f"old-{d['name']}"} for d in devices[:1]]
            self.slices.append(
                _obj(
                    "ResourceSlice",
                    f"{pool}-{driver}-old",
                    {
                        "driver": driver,
                        "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                        **placement,
                        "devices": old,
                    },
                )
            )
        for dev in devices:
            self.devices.append((driver, pool, dev))

    # --- classes and claims --------------------------------------------------------------

    def classes(self) -> list[Json]:
        def cls(name: str, exprs: list[str], **spec: Any) -> Json:
            sel = [{"cel": {"expression": e}} for e in exprs]
            return _obj("DeviceClass", name, {"selectors": sel, **spec})

        base = f"device.driver == '{NVIDIA}'"
        out = [
            cls(
                "gpu.nvidia.com",
                [f"{base} && {A}.type == 'gpu'"],
                extendedResourceName="nvidia.com/gpu",
            ),
            cls("mig.nvidia.com", [f"{base} && {A}.type == 'mig'"]),
            cls("any.nvidia.com", [base]),
            cls("nic.example.com", [f"device.driver == '{NIC}'"]),
            cls("big.nvidia.com", [base, f"{C}.memory.compareTo(quantity('40Gi')) >= 0"]),
            cls("shared.nvidia.com", [f"{base} && device.allowMultipleAllocations"]),
        ]
        if self.r.random() < 0.05:  # a class whose selector fails at run time on most devices
            out.append(cls("profiled.nvidia.com", [base, f"{A}.profile != '4g.20gb'"]))
        return out

    def _exact(self, class_names: list[str], *, sub: bool) -> Json:
        r = self.r
        weights = {"gpu.nvidia.com": 6, "mig.nvidia.com": 3, "any.nvidia.com": 3}
        cls = r.choices(class_names, [weights.get(n, 1) for n in class_names])[0]
        body: Json = {"deviceClassName": cls}
        if r.random() < 0.12:
            body["allocationMode"] = "All"
        else:
            body["allocationMode"] = "ExactCount"
            body["count"] = r.choice((1, 1, 1, 1, 2, 2, 3))
        pool = SELECTORS + (LIST_SELECTORS if self.list_types else ())
        exprs = r.sample(pool, r.choice((1, 1, 2))) if r.random() < 0.3 else []
        if r.random() < 0.06:
            exprs.append(r.choice(FAILING))
        if exprs:
            body["selectors"] = [{"cel": {"expression": e}} for e in exprs]
        if r.random() < 0.25:
            body["tolerations"] = [dict(t) for t in r.sample(TOLERATIONS, r.choice((1, 2)))]
        if cls in ("shared.nvidia.com", "any.nvidia.com") and r.random() < 0.6:
            body["capacity"] = {
                "requests": {"memory": r.choice(("1Gi", "7Gi", "10Gi", "33Gi", "40Gi", "81Gi"))}
            }
        if not sub and r.random() < 0.08:
            body["adminAccess"] = True
        return body

    def claim(self, name: str, class_names: list[str]) -> Json:
        r = self.r
        requests: list[Json] = []
        for i in range(r.choice((1, 1, 1, 2, 2, 3))):
            rname = f"r{i}"
            if r.random() < 0.25:
                subs = [
                    {"name": f"s{j}", **self._exact(class_names, sub=True)}
                    for j in range(r.choice((2, 2, 3)))
                ]
                requests.append({"name": rname, "firstAvailable": subs})
            else:
                requests.append({"name": rname, "exactly": self._exact(class_names, sub=False)})
        devices: Json = {"requests": requests}
        if r.random() < 0.3:
            constraints = []
            for _ in range(r.choice((1, 1, 2))):
                attr = r.choice(
                    (
                        f"{STD}/pcieRoot",
                        f"{STD}/pcieRoot",
                        f"{NVIDIA}/architecture",
                        f"{NVIDIA}/numaNode",
                        f"{NVIDIA}/features",
                    )
                )
                c: Json = {r.choice(("matchAttribute", "distinctAttribute")): attr}
                names = [q["name"] for q in requests]
                if len(names) > 1 and r.random() < 0.4:
                    c["requests"] = r.sample(names, 2)
                constraints.append(c)
            devices["constraints"] = constraints
        if r.random() < 0.15:
            devices["config"] = [
                {"opaque": {"driver": NVIDIA, "parameters": {"kind": "GpuConfig"}}}
            ]
        body = _obj("ResourceClaim", name, {"devices": devices}, namespace="default")
        body["metadata"]["uid"] = f"uid-{self.seed}-{name}"
        return body

    def extended_claim(self) -> Json:
        """The special claim kube-scheduler makes for a pod asking ``nvidia.com/gpu: n``
        (one request per container, ``container-<i>-request-<j>``)."""
        requests = [
            {
                "name": f"container-{i}-request-0",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "allocationMode": "ExactCount",
                    "count": self.r.choice((1, 1, 2)),
                },
            }
            for i in range(self.r.choice((1, 2)))
        ]
        body = _obj("ResourceClaim", "pod-extended-resources", {"devices": {"requests": requests}})
        body["metadata"].update(
            namespace="default",
            uid=f"uid-{self.seed}-ext",
            annotations={"resource.kubernetes.io/extended-resource-claim": "true"},
        )
        return body

    def allocated(self) -> list[Json]:
        """Claims others hold: results on random devices of this node's pools."""
        r = self.r
        out: list[Json] = []
        pool_devices = [d for d in self.devices if r.random() < 0.3]
        sets: set[tuple[str, str]] = set()  # one partition per counter set: a consistent state
        for k, (driver, pool, dev) in enumerate(pool_devices[: r.randrange(0, 4)]):
            used = {(pool, c["counterSet"]) for c in dev.get("consumesCounters", [])}
            if used & sets:
                continue
            sets |= used
            result: Json = {"request": "r", "driver": driver, "pool": pool, "device": dev["name"]}
            if r.random() < 0.15:
                result["adminAccess"] = True
            elif dev.get("allowMultipleAllocations"):
                result["shareID"] = f"00000000-0000-4000-8000-{k:012d}"
                result["consumedCapacity"] = {"memory": r.choice(("10Gi", "40Gi", "70Gi"))}
            body = _obj("ResourceClaim", f"other-{k}", {"devices": {"requests": []}})
            body["metadata"].update(namespace="default", uid=f"uid-other-{k}")
            body["status"] = {"allocation": {"devices": {"results": [result]}}}
            out.append(body)
        return out

    def build(self) -> Json:
        r = self.r
        self._nvidia_pool(NODE, {"nodeName": NODE}, offset=0)
        if r.random() < 0.3:
            self._nvidia_pool("fabric", r.choice(
                ({"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]}]}]}},
                 {"allNodes": True}, {"perDeviceNodeSelection": True})), offset=20)  # fmt: skip
        if r.random() < 0.15:
            self._nvidia_pool("n2", {"nodeName": "n2"}, offset=40)
        if r.random() < 0.3:
            self._nic_pool(f"{NODE}-nic", {"nodeName": NODE})
        classes = self.classes()
        names = [c["metadata"]["name"] for c in classes]
        claims = [self.claim(f"c{i}", names) for i in range(r.choice((1, 1, 1, 1, 2, 2, 3)))]
        if r.random() < 0.1:
            claims.append(self.extended_claim())
        r.shuffle(self.slices)  # the allocators must not depend on input order
        return {
            "id": str(self.seed),
            "listTypes": self.list_types,
            "node": {"name": NODE, "labels": {"zone": r.choice(("a", "b"))}},
            "slices": self.slices,
            "classes": classes,
            "claims": claims,
            "allocated": self.allocated(),
        }


def case(seed: int) -> Json:
    """One random case (see the module docstring); the same seed, the same case."""
    return _Case(seed).build()
