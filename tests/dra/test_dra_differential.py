"""kallot's DRA allocator against upstream's, on seeded random cases (kallot.testing.dra_cases).

Upstream is k8s.io/dynamic-resource-allocation at the control plane's version, built once and
cached (tools/testenv/build-dra-diff.sh). Every case must agree (kallot.testing.dra_diff.check):
the same feasibility and the same firstAvailable subrequests, except the documented classes
where upstream is wrong (docs/dra.md "Differential test"), and every kallot allocation must be
accepted by an upstream re-run pinned to kallot's devices, with the same consumed capacity.
CI runs ``KALLOT_DRA_DIFF_CASES`` cases (default 400); the long mode is
``KALLOT_DRA_DIFF_CASES=10000`` (``KALLOT_DRA_DIFF_SEED`` moves the window: held-back seeds).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import replace

import pytest

from kallot.testing.dra_cases import case
from kallot.testing.dra_diff import UPSTREAM_WRONG, Upstream, check, pinned, run_kallot

CASES = int(os.environ.get("KALLOT_DRA_DIFF_CASES", "400"))
SEED = int(os.environ.get("KALLOT_DRA_DIFF_SEED", "0"))
CHUNK = 100

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="needs Go to build dra-diff")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as up:
        yield up


@pytest.mark.parametrize("chunk", range(SEED, SEED + CASES, CHUNK))
def test_kallot_agrees_with_upstream(upstream: Upstream, chunk: int) -> None:
    problems = []
    for seed in range(chunk, min(chunk + CHUNK, SEED + CASES)):
        c = case(seed)
        got = run_kallot(c)
        up = upstream.ask(c)
        pin = upstream.ask(pinned(c, got)) if got.status == "ok" else None
        verdict, detail = check(c, got, up, pin)
        if verdict.startswith("upstream-wrong:"):
            assert verdict.split(":", 1)[1] in UPSTREAM_WRONG
        elif verdict != "agree":
            problems.append(f"seed {seed}: {detail}")
    assert not problems, "\n".join(problems)


def test_cases_exercise_both_outcomes(upstream: Upstream) -> None:
    """The generator is not degenerate: many cases fit, many do not, some fail in CEL."""
    seen: dict[str, int] = {}
    for seed in range(200):
        got = upstream.ask(case(seed))
        seen[got["status"]] = seen.get(got["status"], 0) + 1
    assert seen.get("ok", 0) >= 40 and seen.get("unschedulable", 0) >= 40
    assert seen.get("error", 0) >= 5


def test_same_seed_same_case() -> None:
    assert case(7) == case(7) and case(7) != case(8)


def test_pinned_rerun_catches_a_wrong_device(upstream: Upstream) -> None:
    """The check can fail: kallot's allocation with one device swapped for one that does not
    exist is refused by the pinned upstream re-run."""
    for seed in range(200):
        c = case(seed)
        got = run_kallot(c)
        if got.status != "ok" or any(
            "firstAvailable" in r or r["exactly"].get("allocationMode") == "All"
            for cl in c["claims"]
            for r in cl["spec"]["devices"]["requests"]
        ):
            continue
        key = next(iter(got.allocations))
        alloc = got.allocations[key]
        first = alloc.results[0]
        swapped = replace(first, device="no-such-device")
        got.allocations[key] = replace(alloc, results=(swapped, *alloc.results[1:]))
        verdict, detail = check(c, got, upstream.ask(c), upstream.ask(pinned(c, got)))
        assert verdict == "disagree", detail
        return
    pytest.fail("no case to swap a device in")
