"""Which ``kallot.io/`` keys a pod may carry, and one warning for each it carries that kallot does
not read (issue 16: a typo must not be silently ignored).

The cache (``kube.state.store``) calls ``unknown_key_warnings`` with each new version of a kallot pod;
problem reporting (kube.schedule.problems) writes the warnings as an Event on the pod once. The keys are those of
docs/pod-api.md (``config.wire``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from kallot.config import wire

# -- unknown kallot.io/ keys (issue 16: a typo must not be silently ignored) -------------------

# Every kallot.io/ annotation a pod may carry (docs/pod-api.md), or that kallot writes on it.
POD_ANNOTATION_KEYS = frozenset(
    {
        wire.ANN_GPU_MODEL,
        wire.ANN_SHARING,
        wire.ANN_ISOLATION,
        wire.ANN_TOPOLOGY,
        wire.ANN_DO_NOT_DISRUPT,
        wire.ANN_MIN_RUNTIME,
        wire.ANN_MODEL,
        wire.ANN_MODEL_SIZE,
        wire.ANN_DISRUPTION_GUARD,
        wire.ANN_DEVICES,
        wire.ANN_BIND_PHASE,
        wire.ANN_BIND_TIME,
    }
)
# kallot.io/ keys read from a pod's labels, not its annotations.
POD_LABEL_KEYS = frozenset({wire.LABEL_POD_GROUP, wire.LABEL_QUEUE})


def unknown_key_warnings(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """One sentence per ``kallot.io/`` annotation or label of ``pod`` that kallot does not read,
    naming the closest key it knows (``difflib``), e.g. "annotation kallot.io/topolgy is not a
    kallot key (did you mean kallot.io/topology?); it is ignored"."""
    meta = pod.get("metadata") or {}
    out: list[str] = []
    for where, keys, known, other in (
        ("annotation", meta.get("annotations") or {}, POD_ANNOTATION_KEYS, POD_LABEL_KEYS),
        ("label", meta.get("labels") or {}, POD_LABEL_KEYS, POD_ANNOTATION_KEYS),
    ):
        for key in sorted(str(k) for k in keys):
            if not key.startswith(wire.KALLOT_PREFIX) or key in known:
                continue
            if key in other:
                place = "labels" if where == "annotation" else "annotations"
                out.append(f"kallot reads {key} from {place}, not {where}s; it is ignored")
                continue
            n = len(wire.KALLOT_PREFIX)
            names = sorted(k[n:] for k in known | other)
            close = difflib.get_close_matches(key[n:], names, n=1, cutoff=0.6)
            hint = f" (did you mean {wire.KALLOT_PREFIX}{close[0]}?)" if close else ""
            out.append(f"{where} {key} is not a kallot key{hint}; it is ignored")
    return tuple(out)
