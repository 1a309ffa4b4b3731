"""XID classification and recovery: a pure state machine driven with explicit times."""

from __future__ import annotations

import pytest

from kallot.node.health import HealthTracker, Transition, XidClass, classify, marks_unhealthy


@pytest.mark.parametrize(
    ("xid", "cls"),
    [
        (13, XidClass.APPLICATION),
        (31, XidClass.APPLICATION),
        (43, XidClass.APPLICATION),
        (45, XidClass.APPLICATION),
        (68, XidClass.APPLICATION),
        (48, XidClass.FATAL),
        (63, XidClass.FATAL),
        (64, XidClass.FATAL),
        (74, XidClass.FATAL),
        (79, XidClass.FATAL),
        (92, XidClass.FATAL),
        (94, XidClass.FATAL),
        (95, XidClass.FATAL),
        (119, XidClass.FATAL),
        (120, XidClass.FATAL),
        (999, XidClass.UNKNOWN),
    ],
)
def test_classify(xid: int, cls: XidClass) -> None:
    assert classify(xid) is cls
    assert marks_unhealthy(xid) is (cls is not XidClass.APPLICATION)


def test_application_xid_is_ignored_but_counted() -> None:
    h = HealthTracker(["GPU-a"], recovery_s=300)
    assert h.observe("GPU-a", 13, now=10) is None
    assert h.healthy("GPU-a") and h.xid_count("GPU-a") == 1


def test_fatal_xid_then_recovery_after_a_clean_window() -> None:
    h = HealthTracker(["GPU-a", "GPU-b"], recovery_s=300)
    t = h.observe("GPU-a", 79, now=100)
    assert t == Transition("GPU-a", False, "XID 79: GPU has fallen off the bus", 79)
    assert h.unhealthy() == {"GPU-a"} and h.next_recovery() == 400
    assert h.reasons() == {"GPU-a": "XID 79: GPU has fallen off the bus"}
    assert h.tick(now=399) == []
    # Another fatal XID restarts the window, without a second transition.
    assert h.observe("GPU-a", 48, now=350) is None
    assert h.tick(now=400) == [] and h.next_recovery() == 650
    # Application errors do not restart it.
    assert h.observe("GPU-a", 31, now=600) is None
    (back,) = h.tick(now=650)
    assert back.healthy and back.uuid == "GPU-a" and "300s" in back.reason
    assert h.unhealthy() == set() and h.next_recovery() is None and h.reasons() == {}
    assert h.xid_count("GPU-a") == 3 and h.xid_count("GPU-b") == 0


def test_unknown_xid_is_fatal_and_unknown_device_is_tracked() -> None:
    h = HealthTracker([], recovery_s=0)
    t = h.observe("MIG-x", 4242, now=1)
    assert t is not None and not t.healthy and "unknown XID" in t.reason
    assert [x.uuid for x in h.tick(now=1)] == ["MIG-x"]


def test_negative_recovery_is_rejected() -> None:
    with pytest.raises(ValueError, match="recovery_s"):
        HealthTracker([], recovery_s=-1)
