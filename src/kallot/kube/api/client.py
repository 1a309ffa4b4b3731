"""The live scheduler's client of the Kubernetes API: ``KubeClient``, on the one request wrapper
of ``kallot.k8sclient`` (the official ``kubernetes`` client's generic path).

Everything else in ``kallot.kube`` talks to ``KubeClient`` in plain dicts (the API's JSON), so
the client library stays confined to ``kallot.k8sclient`` (an import-linter contract checks
it). Requests go through the generated client's generic path (``param_serialize`` +
``call_api``): objects stay dicts end to end, which keeps unknown fields (CRDs, annotations)
intact and skips the pydantic round trip on the hot path (watch events, binds).

Retries live here and nowhere else: an answer of 429 or 5xx is retried with exponential
back-off and jitter, honouring ``Retry-After`` (``RetryPolicy``); a read that got no answer is
retried too. A write that got no answer is not (its outcome is unknown: the caller reads the
object to settle it). What still fails after the retries raises :class:`ApiError`
(``k8sclient.errors``). Lists (``list_pages``, ``list_all``) and watches (``watch``) are here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kallot.k8sclient import api as k8s
from kallot.k8sclient.api import APPLY_PATCH, JSON, MERGE_PATCH, STRATEGIC_PATCH
from kallot.k8sclient.client import NO_RETRY, RETRY_STATUSES, JsonClient, RetryPolicy
from kallot.k8sclient.errors import ApiError, error_from_body

__all__ = [
    "APPLY_PATCH",
    "JSON",
    "MERGE_PATCH",
    "NO_RETRY",
    "RETRY_STATUSES",
    "STRATEGIC_PATCH",
    "ApiError",
    "KubeClient",
    "RetryPolicy",
]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One line of a watch stream: ``type`` is ADDED, MODIFIED, DELETED or BOOKMARK."""

    type: str
    obj: dict[str, Any]


class KubeClient(JsonClient):
    """Asynchronous JSON access to one API server. Create with :meth:`connect`; close it."""

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        user_agent: str = "kallot",
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(api, user_agent=user_agent, retry=retry)

    @staticmethod
    async def connect(
        kubeconfig: str | os.PathLike[str] | None = None,
        *,
        context: str | None = None,
        pool_size: int = 64,
        user_agent: str = "kallot",
        retry: RetryPolicy | None = None,
    ) -> KubeClient:
        """Client for ``kubeconfig`` (default: $KUBECONFIG, ~/.kube/config, then in-cluster)."""
        configuration = await k8s.load_configuration(kubeconfig, context=context)
        k8s.proxy_once(configuration)
        # aiohttp's connector caps parallel requests (binds, status writes) at this number.
        api = k8s.api_client(configuration, pool_size=pool_size)
        return KubeClient(api, user_agent=user_agent, retry=retry)

    # -- generic requests (``request`` is JsonClient's, retried) -----------------------------

    async def get(self, path: str, *, timeout: float = 30.0) -> dict[str, Any]:
        return await self.request("GET", path, timeout=timeout)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body=dict(body))

    async def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("PUT", path, body=dict(body))

    async def patch(
        self, path: str, patch: Any, *, content_type: str = MERGE_PATCH
    ) -> dict[str, Any]:
        return await self.request("PATCH", path, body=patch, content_type=content_type)

    async def delete(self, path: str) -> dict[str, Any]:
        return await self.request("DELETE", path)

    async def list_all(
        self, path: str, *, page_size: int = 500, query: Sequence[tuple[str, str]] = ()
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object at collection ``path`` (paginated), and the list's resourceVersion.

        The list is served from the watch cache at a consistent snapshot; the returned
        resourceVersion is where a watch continues without missing an event.
        """
        items: list[dict[str, Any]] = []
        rv = ""
        async for page, page_rv in self.list_pages(path, page_size=page_size, query=query):
            items.extend(page)
            rv = page_rv
        return items, rv

    async def list_pages(
        self,
        path: str,
        *,
        page_size: int = 500,
        query: Sequence[tuple[str, str]] = (),
        first_query: Sequence[tuple[str, str]] = (),
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """The pages of collection ``path`` (``limit``/``continue``) as they arrive, each with
        the list's resourceVersion (the same for every page: one consistent snapshot).

        The next page is already requested while the caller works on the current one, so
        the server's work and the transfer overlap with the caller's (a scheduler's cache
        digests page k while page k+1 is on its way). ``first_query`` goes with the first
        request only (``resourceVersion``: the continue token carries it on); a ``limit`` in
        it caps the first page (a small first page the caller can use at once)."""
        first_limit = min([page_size, *(int(v) for k, v in first_query if k == "limit")])
        first_rest = [(k, v) for k, v in first_query if k != "limit"]

        async def fetch(cont: str) -> dict[str, Any]:
            q = [*query, ("limit", str(page_size if cont else first_limit))]
            if cont:
                q.append(("continue", cont))
            else:
                q.extend(first_rest)
            return await self.request("GET", path, query=q, timeout=120.0)

        pending: asyncio.Future[dict[str, Any]] | None = asyncio.ensure_future(fetch(""))
        try:
            while pending is not None:
                page = await pending
                meta = page.get("metadata") or {}
                cont = str(meta.get("continue") or "")
                pending = asyncio.ensure_future(fetch(cont)) if cont else None
                yield list(page.get("items") or []), str(meta.get("resourceVersion", ""))
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, ApiError):
                    await pending

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_s: int = 300,
        query: Sequence[tuple[str, str]] = (),
    ) -> AsyncIterator[WatchEvent]:
        """Events at ``path`` after ``resource_version`` until the server closes the stream
        (after ``timeout_s``). Raises :class:`ApiError` with status 410 when the version is
        too old (the caller lists again) and for any other error line or status.
        """
        q = [
            *query,
            ("watch", "1"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        # The server ends the stream after timeout_s; the client-side limit only catches a
        # connection that went silent without closing.
        resp = await k8s.send(self._api, "GET", path, query=q, timeout=timeout_s + 30.0)
        try:
            if not 200 <= resp.status < 300:
                raise error_from_body("WATCH", path, resp.status, await resp.read())
            content = resp.response.content
            while True:
                try:
                    line = await content.readline()
                except k8s.TRANSPORT_ERRORS as exc:
                    raise ApiError("WATCH", path, 0, f"{type(exc).__name__}: {exc}") from exc
                if not line:
                    return
                try:
                    event = json.loads(line)
                except ValueError as exc:  # a stream cut mid-line
                    raise ApiError("WATCH", path, 0, f"truncated event: {exc}") from exc
                kind = str(event.get("type", ""))
                obj = event.get("object") or {}
                if kind == "ERROR":
                    raise ApiError(
                        "WATCH",
                        path,
                        int(obj.get("code", 0)),
                        str(obj.get("message", "")),
                        str(obj.get("reason", "")),
                    )
                yield WatchEvent(kind, obj)
        finally:
            resp.response.release()

    # -- pods --------------------------------------------------------------------------

    async def bind(
        self,
        namespace: str,
        name: str,
        *,
        uid: str,
        node: str,
        annotations: Mapping[str, str],
    ) -> None:
        """Bind a pod through ``pods/binding``, setting ``annotations`` in the same write.

        The API server applies the Binding's annotations to the pod in the update that sets
        ``spec.nodeName`` (BindingREST.setPodNodeAndMetadata), so a pod is never bound
        without its device record. ``uid`` is a precondition: a pod deleted and re-created
        under the same name is not bound by mistake.
        """
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "annotations": dict(annotations),
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body=body)

    async def evict(self, namespace: str, name: str, *, uid: str) -> None:
        """Evict a pod through ``pods/eviction`` (the Eviction API): PodDisruptionBudgets hold
        (a 429 answer when one forbids it) and the pod keeps its own termination grace period.
        ``uid`` is a precondition, so a re-created pod of the same name is not evicted."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        await self.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body
        )

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    async def patch_pod_status(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Strategic merge patch of ``pods/status`` (conditions merge by ``type``).

        A conflict re-reads the pod and applies the patch again while it is the same pod
        (``metadata.uid`` in the patch); a pod replaced under the same name answers 404."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
        uid = str((patch.get("metadata") or {}).get("uid", ""))
        for _ in range(self.retry.attempts - 1):
            try:
                return await self.patch(path, dict(patch), content_type=STRATEGIC_PATCH)
            except ApiError as exc:
                if not exc.conflict:
                    raise
            pod = await self.get_pod(namespace, name)
            if uid and str((pod.get("metadata") or {}).get("uid", "")) != uid:
                raise ApiError("PATCH", path, 404, f"pod {namespace}/{name} was replaced")
        return await self.patch(path, dict(patch), content_type=STRATEGIC_PATCH)

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.create(f"/api/v1/namespaces/{namespace}/events", body)

    async def list_events_for(self, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.name={name},involvedObject.kind=Pod"
        if uid:
            selector += f",involvedObject.uid={uid}"
        answer = await self.request(
            "GET", f"/api/v1/namespaces/{namespace}/events", query=[("fieldSelector", selector)]
        )
        return list(answer.get("items") or [])
