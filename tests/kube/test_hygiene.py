"""Bad input in the live scheduler's edges (issue 16): long values cut, typo'd kallot.io/ keys
named with the closest known key, device records naming GPUs a node lacks charged
conservatively."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from kallot.cli.scheduler import build_scheduler
from kallot.config import device_record
from kallot.core.errors import ConfigError
from kallot.kube import translate
from kallot.kube.state.cache import Cache
from kallot.testing.live import inventory_node_body, pod_body

_, CORE = build_scheduler("kallot")


def test_a_60kb_annotation_is_cut_in_the_error() -> None:
    body = pod_body("p", resources={"nvidia.com/gpu": "1"})
    body["metadata"]["annotations"][translate.ANN_ISOLATION] = "x" * 60_000
    try:
        translate.pod_to_task(body)
    except ConfigError as exc:
        text = str(exc)
    else:
        raise AssertionError("a 60 KB isolation annotation was accepted")
    assert translate.ANN_ISOLATION in text and "(60002 characters)" in text
    assert len(text) < 600


def test_unknown_kallot_keys_name_the_closest_known_one() -> None:
    body = pod_body("p", labels={"kallot.io/podgroup": "g"})
    body["metadata"]["annotations"].update(
        {
            "kallot.io/topolgy": "required:nvlink",
            "kallot.io/queue": "team-a",
            "kallot.io/zzzz": "1",
            "example.com/other": "1",
            translate.ANN_GPU_MODEL: "H100-80GB",
        }
    )
    assert translate.unknown_key_warnings(body) == (
        "kallot reads kallot.io/queue from labels, not annotations; it is ignored",
        "annotation kallot.io/topolgy is not a kallot key (did you mean kallot.io/topology?); "
        "it is ignored",
        "annotation kallot.io/zzzz is not a kallot key; it is ignored",
        "label kallot.io/podgroup is not a kallot key (did you mean kallot.io/pod-group?); it "
        "is ignored",
    )
    clean = pod_body("q", labels={translate.LABEL_QUEUE: "a"})
    clean["metadata"]["annotations"][translate.ANN_TOPOLOGY] = "required:nvlink"
    # What model servers carry (docs/serving.md) and what the disruption guard writes on them.
    clean["metadata"]["annotations"].update(
        {
            "kallot.io/model": "org/m",
            "kallot.io/model-size": "1Gi",
            "kallot.io/disruption-guard": "loading",
        }
    )
    assert translate.unknown_key_warnings(clean) == ()


def _bound(cache: Cache, name: str, uid: str, gpus: str) -> dict[str, Any]:
    body = pod_body(name, resources={"nvidia.com/gpu": gpus})
    body["metadata"].update(uid=uid, namespace="ns", resourceVersion="1")
    cache.apply_pod("ADDED", copy.deepcopy(body))
    inp = cache.session_input()
    d = CORE.run_session(inp.snapshot, list(inp.tasks), now=0.0, rng=np.random.default_rng(0))
    (p,) = d.placements
    assert cache.assume(p) is not None
    record = translate.record_annotations(device_record.DeviceRecord.of(p), 0)
    body["spec"]["nodeName"] = p.node
    body["metadata"]["annotations"].update(record)
    body["metadata"]["resourceVersion"] = "2"
    cache.apply_pod("MODIFIED", copy.deepcopy(body))
    return body


def test_a_record_naming_a_gpu_the_node_lacks_is_charged_an_idle_gpu() -> None:
    cache = Cache()
    cache.apply_node("ADDED", inventory_node_body("n0", 4))
    body = _bound(cache, "a", "u1", "2")
    assert int((cache.snapshot().gpu_clients[0] > 0).sum()) == 2
    # the record is edited to name a GPU n0 does not have instead of its first one
    text = body["metadata"]["annotations"][translate.ANN_DEVICES]
    uuid = device_record.DeviceRecord.from_json(text).devices[0].uuid
    body["metadata"]["annotations"][translate.ANN_DEVICES] = text.replace(uuid, "GPU-elsewhere")
    body["metadata"]["resourceVersion"] = "3"
    cache.apply_pod("MODIFIED", copy.deepcopy(body))
    entry = cache.pod("u1")
    assert entry is not None and entry.missing_devices == ("GPU-elsewhere",)
    snap = cache.snapshot()
    # still two whole GPUs charged: the one the record names that exists, and an idle one
    assert int((snap.gpu_clients[0] > 0).sum()) == 2
    assert int(snap.gpu_used_milli[0].sum()) == 2000
    cache.check_invariants()
    # so a 3-GPU pod does not fit where only 2 are really free
    more = pod_body("b", resources={"nvidia.com/gpu": "3"})
    more["metadata"].update(uid="u2", namespace="ns", resourceVersion="1")
    cache.apply_pod("ADDED", more)
    inp = cache.session_input()
    d = CORE.run_session(inp.snapshot, list(inp.tasks), now=0.0, rng=np.random.default_rng(0))
    assert not d.placements
    cache.apply_pod("DELETED", body)
    assert int(cache.snapshot().gpu_used_milli.sum()) == 0
