"""The differential check of kallot's DRA allocator against upstream's.

Where it sits: test and benchmark support (tests/dra/test_dra_differential.py,
bench/dra_diff.py). ``Upstream`` runs ``tools/testenv/dra-diff`` (the upstream allocator and CEL
environment, k8s.io/dynamic-resource-allocation at the control plane's version, built and cached
by ``tools/testenv/build-dra-diff.sh``) and answers cases as JSON lines. ``run_kallot`` runs one
case (``kallot.testing.dra_cases``) through kallot as the live scheduler does: the JSON through
``config.dra`` (CEL compiled by ``config.dra_cel``), then ``core.dra.allocator.allocate`` with
the default policy. ``check`` compares one case: kallot and upstream agree on feasibility, unless
upstream is wrong in a documented class (``UPSTREAM_WRONG``, docs/dra.md "Differential test");
and kallot's allocation, re-run through upstream pinned to kallot's devices (``pinned``), is
accepted with the same devices and consumed capacity.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kallot.config.dra import claim_from_json, device_class_from_json, slice_from_json
from kallot.core.dra.allocator import Inventory, Outcome, allocate
from kallot.core.dra.model import ClaimAllocation, assemble_pools, incomplete_pools, parse_quantity
from kallot.core.dra.policy import KallotPolicy
from kallot.core.errors import ConfigError

Json = dict[str, Any]
_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = _ROOT / "tools" / "testenv" / "build-dra-diff.sh"
PIN = "pin.kallot.io"

# Classes of cases where upstream (v0.36.3) is wrong and kallot right; ``check`` names them.
UPSTREAM_WRONG = {
    # incubating/constraint.go, distinctAttributeConstraint.add: ``m.attributes[requestName] =
    # *attribute`` keys the values by request name, so a request's second device overwrites its
    # first and ``remove`` forgets both: devices of one request may repeat the attribute.
    "distinct-per-request": "distinctAttribute compared per request name (constraint.go)",
    # incubating/allocator_incubating.go, allocateDevice: with ``must`` (allocationMode All) a
    # device that breaks a constraint returns an error, which aborts the whole Allocate instead
    # of backtracking to the next firstAvailable subrequest or an earlier choice.
    "all-constraint-aborts": "an All request breaking a constraint aborts (allocateDevice, must)",
}


def binary() -> Path:
    """The dra-diff binary, built once and cached (``build-dra-diff.sh``)."""
    subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True)
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-bin-dir"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip()) / "dra-diff"


class Upstream:
    """One dra-diff process; ``ask`` sends a case and reads its answer."""

    def __init__(self, path: Path | None = None) -> None:
        self._proc = subprocess.Popen(
            [str(path or binary())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def ask(self, case: Json) -> Json:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(case) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"dra-diff exited (rc {self._proc.poll()}) on case {case.get('id')}")
        got: Json = json.loads(line)
        return got

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        self._proc.wait(timeout=30)

    def __enter__(self) -> Upstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class KallotAnswer:
    status: str  # ok | unschedulable | error (bad input)
    reason: str = ""
    allocations: dict[str, ClaimAllocation] = field(default_factory=dict)
    seconds: float = 0.0  # parse + allocate
    outcome: Outcome | None = None
    allocate_seconds: float = 0.0  # ``allocate`` alone (upstream's timing has no parsing)
    allocate_cpu_seconds: float = 0.0  # the same in this process's CPU time


def run_kallot(case: Json) -> KallotAnswer:
    """The case through kallot: parse (CEL compiled) and allocate, timed together."""
    start = time.perf_counter()
    try:
        slices = [slice_from_json(s) for s in case["slices"]]
        classes = {c.name: c for c in (device_class_from_json(o) for o in case["classes"])}
        claims = [claim_from_json(c) for c in case["claims"]]
        held = [claim_from_json(c).allocation for c in case["allocated"]]
    except ConfigError as exc:
        return KallotAnswer("error", str(exc), seconds=time.perf_counter() - start)
    pools, _ = assemble_pools(slices)
    inventory = Inventory(
        pools, classes, tuple(a for a in held if a is not None), incomplete_pools(slices)
    )
    node = case["node"]
    parsed, cpu = time.perf_counter(), time.process_time()
    out = allocate(claims, node["name"], node["labels"], inventory, policy=KallotPolicy())
    end, cpu = time.perf_counter(), time.process_time() - cpu
    took, alone = end - start, end - parsed
    return KallotAnswer(
        "ok" if out.ok else "unschedulable",
        out.reason,
        allocations=out.allocations if out.ok else {},
        seconds=took,
        outcome=out,
        allocate_seconds=alone,
        allocate_cpu_seconds=cpu,
    )


def pinned(case: Json, got: KallotAnswer) -> Json:
    """The case with every request held to the devices kallot chose for it: each device gets
    the attribute ``pin.kallot.io/id``, each ExactCount request a selector on it, the
    firstAvailable subrequests kallot did not choose a ``false`` selector; All requests stay
    (their device set is compared instead)."""
    out = copy.deepcopy(case)
    out["id"] = f"{case['id']}-pinned"
    for s in out["slices"]:
        spec = s["spec"]
        for dev in spec.get("devices", []):
            name = f"{spec['driver']}/{spec['pool']['name']}/{dev['name']}"
            dev.setdefault("attributes", {})[f"{PIN}/id"] = {"string": name}
    for claim in out["claims"]:
        key = f"{claim['metadata'].get('namespace', 'default')}/{claim['metadata']['name']}"
        alloc = got.allocations[key]
        chosen: dict[str, list[str]] = {}
        for r in alloc.results:
            chosen.setdefault(r.request, []).append(f"{r.driver}/{r.pool}/{r.device}")
        for req in claim["spec"]["devices"]["requests"]:
            if req.get("exactly") is not None:
                _pin(req["exactly"], chosen.get(req["name"], []))
                continue
            for sub in req["firstAvailable"]:
                name = f"{req['name']}/{sub['name']}"
                if name in chosen:
                    _pin(sub, chosen[name])
                else:
                    sub.setdefault("selectors", []).append({"cel": {"expression": "false"}})
    return out


def _pin(body: Json, devices: list[str]) -> None:
    if body.get("allocationMode") == "All":
        return
    expr = f"device.attributes['{PIN}'].id in {json.dumps(sorted(set(devices)))}"
    body.setdefault("selectors", []).append({"cel": {"expression": expr}})


_Row = tuple[str, str, tuple[tuple[str, Any], ...], bool, tuple[str, ...], tuple[str, ...]]


def _results(alloc: Json) -> Counter[_Row]:
    out: Counter[_Row] = Counter()
    for r in alloc.get("devices", {}).get("results", []):
        consumed = tuple(
            sorted((k, parse_quantity(v)) for k, v in (r.get("consumedCapacity") or {}).items())
        )
        dev = f"{r['driver']}/{r['pool']}/{r['device']}"
        bc = tuple(r.get("bindingConditions") or ())
        bfc = tuple(r.get("bindingFailureConditions") or ())
        out[(r["request"], dev, consumed, bool(r.get("shareID")), bc, bfc)] += 1
    return out


def _kallot_results(alloc: ClaimAllocation) -> Counter[_Row]:
    out: Counter[_Row] = Counter()
    for r in alloc.results:
        consumed = tuple(
            sorted(
                (k.split("/", 1)[1] if k.startswith(f"{r.driver}/") else k, v)
                for k, v in r.consumed.items()
            )
        )
        dev = f"{r.driver}/{r.pool}/{r.device}"
        bc, bfc = r.binding_conditions, r.binding_failure_conditions
        out[(r.request, dev, consumed, bool(r.share_id), bc, bfc)] += 1
    return out


def _violates_distinct(case: Json, answer: Json) -> bool:
    """Whether upstream's allocation repeats a distinctAttribute value within a claim."""
    devices = {}
    for s in case["slices"]:
        spec = s["spec"]
        for d in spec.get("devices", []):
            devices[(spec["driver"], spec["pool"]["name"], d["name"])] = (spec["driver"], d)
    for claim, alloc in zip(case["claims"], answer.get("allocations") or [], strict=False):
        for con in claim["spec"]["devices"].get("constraints", []):
            attr = con.get("distinctAttribute")
            if not attr:
                continue
            names = set(con.get("requests") or [])
            seen = []
            for r in alloc["devices"]["results"]:
                if names and r["request"] not in names and r["request"].split("/")[0] not in names:
                    continue
                driver, dev = devices[(r["driver"], r["pool"], r["device"])]
                attrs = dev.get("attributes", {})
                value = attrs.get(attr) or (
                    attrs.get(attr.split("/", 1)[1]) if attr.startswith(f"{driver}/") else None
                )
                if value in seen:
                    return True
                seen.append(value)
    return False


def _alternatives(case: Json, allocations: Any) -> tuple[int, ...]:
    """The index of the firstAvailable subrequest chosen per request (0 for ``exactly``), in
    claim and request order; ``allocations`` is kallot's mapping or upstream's answer."""
    out = []
    for k, claim in enumerate(case["claims"]):
        key = f"{claim['metadata'].get('namespace', 'default')}/{claim['metadata']['name']}"
        if isinstance(allocations, dict) and "allocations" in allocations:
            names = {r["request"] for r in allocations["allocations"][k]["devices"]["results"]}
        else:
            names = {r.request for r in allocations[key].results}
        for req in claim["spec"]["devices"]["requests"]:
            subs = [s["name"] for s in req.get("firstAvailable") or []]
            out.append(
                next((j for j, sub in enumerate(subs) if f"{req['name']}/{sub}" in names), 0)
            )
    return tuple(out)


def check(case: Json, got: KallotAnswer, upstream: Json, pin: Json | None) -> tuple[str, str]:
    """``("agree" | "upstream-wrong:<class>" | "disagree", detail)`` for one case; ``pin`` is
    upstream's answer to ``pinned(case, got)`` (None when kallot found nothing)."""
    up_ok = upstream["status"] == "ok"
    if up_ok != (got.status == "ok"):
        err = upstream.get("error", "")
        if not up_ok and "because a claim constraint would not be satisfied" in err:
            return "upstream-wrong:all-constraint-aborts", err
        if up_ok and _violates_distinct(case, upstream):
            return "upstream-wrong:distinct-per-request", ""
        return (
            "disagree",
            f"kallot {got.status} ({got.reason}); upstream {upstream['status']} ({err})",
        )
    if not up_ok:
        return "agree", ""
    # kallot takes the lowest firstAvailable subrequests that fit (by claim and request
    # order); upstream the first it meets depth-first, subrequests nested inside the devices
    # of earlier requests: feasible, so never lower than kallot's.
    mine, theirs = _alternatives(case, got.allocations), _alternatives(case, upstream)
    if mine > theirs:
        if _violates_distinct(case, upstream):
            return "upstream-wrong:distinct-per-request", ""
        return "disagree", f"kallot chose subrequests {mine}, upstream lower ones {theirs}"
    assert pin is not None
    if pin["status"] != "ok":
        return (
            "disagree",
            f"upstream refuses kallot's allocation: {pin.get('error', pin['status'])}",
        )
    for claim, alloc in zip(case["claims"], pin["allocations"], strict=True):
        key = f"{claim['metadata'].get('namespace', 'default')}/{claim['metadata']['name']}"
        ours, pinned_up = _kallot_results(got.allocations[key]), _results(alloc)
        if ours != pinned_up:
            return (
                "disagree",
                f"claim {key}: kallot {sorted(ours)} vs upstream pinned {sorted(pinned_up)}",
            )
    return "agree", ""


def differ(seeds: range, upstream: Upstream) -> list[tuple[int, str, str]]:
    """Every case of ``seeds`` that does not agree: (seed, verdict, detail)."""
    from kallot.testing.dra_cases import case as make

    out = []
    for seed in seeds:
        c = make(seed)
        got = run_kallot(c)
        up = upstream.ask(c)
        pin = upstream.ask(pinned(c, got)) if got.status == "ok" else None
        verdict, detail = check(c, got, up, pin)
        if verdict != "agree":
            out.append((seed, verdict, detail))
    return out
