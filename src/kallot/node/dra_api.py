"""The DRA driver's API objects: ResourceSlices it publishes, ResourceClaims it prepares.

Where it sits: the node agent's DRA side, on ``k8s.NodeClient`` (the agent's one door to the
API). ``SlicePublisher`` applies the pool's slices (``dra.resource_slices``) by server-side
apply with the field manager ``kallot-agent``, only when their content changed, bumping
``spec.pool.generation`` on every change and deleting slices the pool no longer has; at start it
reads the pool's slices already in the API, so a restarted agent continues their generation and
sends nothing when nothing changed. ``ApiClaimSource`` reads a ResourceClaim for prepare.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from kallot.k8sclient.api import APPLY_PATCH
from kallot.k8sclient.errors import ApiError
from kallot.node import dra
from kallot.node.k8s import FIELD_MANAGER, NodeClient

log = logging.getLogger(__name__)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


def _content(slices: list[dict[str, Any]]) -> str:
    """What a change means: the slices without their generation."""
    bare = sorted(copy.deepcopy(slices), key=lambda s: s["metadata"]["name"])
    for s in bare:
        s["spec"]["pool"].pop("generation", None)
    return hashlib.sha256(json.dumps(bare, sort_keys=True).encode()).hexdigest()


class SlicePublisher:
    """Publishes one node's pool; ``publish`` is a no-op when the content did not change."""

    def __init__(self, client: NodeClient, node: str) -> None:
        self.client = client
        self.node = node
        self.generation = 0
        self._last = ""
        self._names: set[str] = set()
        self._read = False
        self.applied = 0  # slices written (tests check "only on change")

    async def _existing(self) -> list[dict[str, Any]]:
        answer = await self.client.request(
            "GET",
            SLICES,
            query=[("fieldSelector", f"spec.nodeName={self.node},spec.driver={dra.DRIVER}")],
        )
        return [
            s
            for s in answer.get("items") or []
            if (s.get("spec") or {}).get("pool", {}).get("name") == self.node
        ]

    async def publish(self, slices: list[dict[str, Any]]) -> bool:
        """Apply ``slices`` (from ``dra.resource_slices``) if they differ from what the pool
        holds; True if anything was written."""
        content = _content(slices)
        if not self._read:
            existing = await self._existing()
            self._names = {s["metadata"]["name"] for s in existing}
            gens = [int(s["spec"]["pool"].get("generation", 0)) for s in existing]
            self.generation = max(gens, default=0)
            same = [
                {
                    "apiVersion": dra.API_VERSION,
                    "kind": "ResourceSlice",
                    "metadata": {
                        "name": s["metadata"]["name"],
                        "labels": s["metadata"].get("labels") or {},
                    },
                    "spec": s["spec"],
                }
                for s in sorted(existing, key=lambda s: s["metadata"]["name"])
            ]
            if len(set(gens)) == 1 and _content(same) == content:
                self._last = content
            self._read = True
        if content == self._last:
            return False
        self.generation += 1
        names = set()
        for s in slices:
            body = copy.deepcopy(s)
            body["spec"]["pool"]["generation"] = self.generation
            name = body["metadata"]["name"]
            names.add(name)
            await self.client.request(
                "PATCH",
                f"{SLICES}/{name}",
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                body=body,
                content_type=APPLY_PATCH,
            )
            self.applied += 1
        for stale in sorted(self._names - names):
            try:
                await self.client.request("DELETE", f"{SLICES}/{stale}")
            except ApiError as exc:
                if exc.status != 404:
                    raise
        self._names = names
        self._last = content
        log.info(
            "published %d ResourceSlices of pool %s, generation %d",
            len(slices),
            self.node,
            self.generation,
        )
        return True


class ApiClaimSource:
    """``draplugin.ClaimSource`` on the API server."""

    def __init__(self, client: NodeClient) -> None:
        self.client = client

    async def claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        return await self.client.request(
            "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        )
