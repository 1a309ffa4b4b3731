"""VolumeBinding's PreBind: the writes that hold a pod's WaitForFirstConsumer claims to the node
it is bound to (``prebind``), and their undo (``unbind``).

Where it sits: the binding cycle's volume step (``kube.bind.steps.VolumeStep``) calls them with
the cache's ``VolumeIndex`` (``kube.state.volumes``: which claims, PVs and StorageClasses exist
and where each claim lets the pod run).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kallot.core import k8s
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.state.volumes import ANN_SELECTED_NODE, VolumeIndex

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Written:
    """One PreBind write: the claim ``namespace/claim`` (uid ``claim_uid``) got the node in
    its selected-node annotation (``pv`` ""), or the static PV ``pv`` got it in claimRef."""

    namespace: str
    claim: str
    claim_uid: str
    pv: str = ""


async def prebind(
    client: KubeClient,
    index: VolumeIndex,
    namespace: str,
    provision: Iterable[tuple[str, k8s.NodeSelector | None]],
    *,
    node: str,
    node_labels: Mapping[str, str],
    wrote: list[Written] | None = None,
) -> str:
    """VolumeBinding's PreBind for the WaitForFirstConsumer claims of a pod placed on ``node``:
    a static PV that fits there gets the claim in ``spec.claimRef`` (the PV controller then
    completes the bind); otherwise the claim gets ``volume.kubernetes.io/selected-node`` (the
    provisioner creates the volume there). Returns "" or why it failed (the bind is retried).
    Each write is appended to ``wrote`` as it succeeds (what ``unbind`` takes back)."""
    for claim_name, _ in provision:
        claim = index.claim(namespace, claim_name)
        if claim is None:
            return f'persistentvolumeclaim "{claim_name}" not found'
        if (claim.get("spec") or {}).get("volumeName"):
            continue  # bound meanwhile
        meta = claim.get("metadata") or {}
        static = next(
            (
                m
                for m in index.static_matches(claim)
                if m.nodes is None or m.nodes.matches(node_labels, node)
            ),
            None,
        )
        try:
            if static is not None:
                await client.patch(
                    f"/api/v1/persistentvolumes/{static.pv}",
                    {
                        "spec": {
                            "claimRef": {
                                "apiVersion": "v1",
                                "kind": "PersistentVolumeClaim",
                                "namespace": namespace,
                                "name": claim_name,
                                "uid": meta.get("uid", ""),
                            }
                        }
                    },
                )
            else:
                await client.patch(
                    f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim_name}",
                    {"metadata": {"annotations": {ANN_SELECTED_NODE: node}}},
                )
        except ApiError as exc:
            return f'persistentvolumeclaim "{claim_name}": {exc.message or exc.status}'
        if wrote is not None:
            uid = str(meta.get("uid", ""))
            wrote.append(Written(namespace, claim_name, uid, static.pv if static else ""))
    return ""


ATTEMPTS = 5


async def unbind(client: KubeClient, wrote: Iterable[Written], *, node: str) -> None:
    """Take back PreBind writes for a pod that was not bound, newest first, while nothing has
    acted on them: a claim still unbound loses the selected-node annotation naming ``node``
    (its provisioner has not created the volume); a static PV still Available and not yet
    bound by the PV controller loses the claimRef to the claim. Each write carries the
    object's resourceVersion, so a change meanwhile (the PV controller binding) is read again
    and then left alone. Best effort: an error is logged."""
    for w in reversed(list(wrote)):
        if w.pv:
            path = f"/api/v1/persistentvolumes/{w.pv}"
        else:
            path = f"/api/v1/namespaces/{w.namespace}/persistentvolumeclaims/{w.claim}"
        for _ in range(ATTEMPTS):
            try:
                obj = await client.get(path)
                if not _take_back(obj, w, node):
                    break
                await client.replace(path, obj)
                break
            except ApiError as exc:
                if exc.conflict:
                    continue
                if not exc.not_found:
                    logger.warning("cannot undo volume prebind path=%s error=%s", path, exc)
                break


def _take_back(obj: dict[str, Any], w: Written, node: str) -> bool:
    """Change ``obj`` to what it was before the write ``w``; False when there is nothing to
    take back (already gone, or acted on)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if w.pv:
        ref = spec.get("claimRef") or {}
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Bound" or ref.get("uid") != w.claim_uid or ref.get("name") != w.claim:
            return False
        spec.pop("claimRef", None)
        return True
    annotations = meta.get("annotations") or {}
    if w.claim_uid and str(meta.get("uid", "")) != w.claim_uid:
        return False
    if spec.get("volumeName") or annotations.get(ANN_SELECTED_NODE) != node:
        return False
    del annotations[ANN_SELECTED_NODE]
    return True
