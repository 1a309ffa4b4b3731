"""The live scheduler's only door to the Kubernetes API (the official ``kubernetes`` client).

Everything else in ``kallot.kube`` talks to ``KubeClient`` in plain dicts (the API's JSON), so
the client library stays confined here (an import-linter contract checks it). Requests go
through the generated client's generic path (``param_serialize`` + ``call_api``): objects stay
dicts end to end, which keeps unknown fields (CRDs, annotations) intact and skips the pydantic
round trip on the hot path (watch events, binds).

Retries live here and nowhere else: an answer of 429 or 5xx is retried with exponential
back-off and jitter, honouring ``Retry-After`` (``RetryPolicy``); a read that got no answer is
retried too. A write that got no answer is not (its outcome is unknown: the caller reads the
object to settle it). What still fails after the retries raises :class:`ApiError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes.aio import client as aio_client
from kubernetes.aio import config as aio_config

from kallot.core.errors import ConfigError, KallotError


def _why(exc: BaseException) -> str:
    """An exception as one short line (the loader's messages span lines)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


# What a request can raise when no answer came: aiohttp's connection errors are not all
# OSErrors (ServerDisconnectedError, ClientPayloadError), timeouts are TimeoutError.
_TRANSPORT_ERRORS = (OSError, TimeoutError, aiohttp.ClientError)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class ApiError(KallotError):
    """A request the API server answered with an error status (or could not be sent).

    ``status`` is the HTTP status (0 when no answer came: connection refused, timeout), so
    callers can tell "certainly not done" (4xx) from "outcome unknown" (0, 5xx).
    """

    def __init__(self, method: str, path: str, status: int, message: str, reason: str = "") -> None:
        self.method = method
        self.path = path
        self.status = status
        self.message = message
        self.reason = reason
        super().__init__(f"{method} {path}: HTTP {status} {reason}: {message}".strip())

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        """410: the resourceVersion is too old for a watch; list again."""
        return self.status == 410

    @property
    def outcome_unknown(self) -> bool:
        """No answer, or a server error: the request may or may not have taken effect."""
        return self.status == 0 or self.status >= 500


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of answers that say "try again" (429, 5xx) and of reads without an answer."""

    attempts: int = 4  # tries in all, the first included
    base_s: float = 0.2  # back-off before the second try; doubles each time
    max_s: float = 5.0
    retry_after_max_s: float = 10.0  # a server's Retry-After is honoured up to this

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait before try ``attempt + 1`` (``attempt`` counts from 0)."""
        if retry_after:
            try:
                return min(self.retry_after_max_s, max(0.0, float(retry_after)))
            except ValueError:
                pass  # an HTTP date: fall back to our own back-off
        full = min(self.max_s, self.base_s * 2.0**attempt)
        return full * (0.5 + random.random() / 2)  # jitter: many clients do not retry in step


RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
NO_RETRY = RetryPolicy(attempts=1)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One line of a watch stream: ``type`` is ADDED, MODIFIED, DELETED or BOOKMARK."""

    type: str
    obj: dict[str, Any]


def _error_from_body(method: str, path: str, status: int, raw: bytes) -> ApiError:
    try:
        body = json.loads(raw)
    except ValueError:
        return ApiError(method, path, status, raw[:300].decode(errors="replace"))
    if isinstance(body, dict):
        return ApiError(
            method, path, status, str(body.get("message", "")), str(body.get("reason", ""))
        )
    return ApiError(method, path, status, raw[:300].decode(errors="replace"))


def _proxy_once(configuration: aio_client.Configuration) -> None:
    """Read the proxy environment (HTTPS_PROXY, NO_PROXY, ...) once, here.

    The generated client turns on aiohttp's ``trust_env``, which looks the proxy environment
    and ``~/.netrc`` up again in a worker thread on every request: two thread hops per bind,
    a measurable share of the scheduler's time when it binds hundreds of pods a second. The
    API server's address does not change, so the answer does not either."""
    if not configuration.proxy:
        url = urllib.parse.urlsplit(str(configuration.host))
        proxy = urllib.request.getproxies().get(url.scheme)
        if proxy and url.hostname and not urllib.request.proxy_bypass(url.hostname):
            configuration.proxy = proxy
    extra = dict(configuration.client_session_kwargs or {})
    extra.setdefault("trust_env", False)
    configuration.client_session_kwargs = extra


class KubeClient:
    """Asynchronous JSON access to one API server. Create with :meth:`connect`; close it."""

    def __init__(
        self,
        api: aio_client.ApiClient,
        *,
        user_agent: str = "kallot",
        retry: RetryPolicy | None = None,
    ) -> None:
        self._api = api
        self._api.user_agent = user_agent
        self.retry = retry or RetryPolicy()
        #: retries done, by HTTP status (0: no answer)
        self.retries: dict[int, int] = {}

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
        configuration = aio_client.Configuration()
        path = os.fspath(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG", "")
        path = path.split(os.pathsep)[0] if path else ""
        default = Path("~/.kube/config").expanduser()
        if not path and default.is_file():
            path = str(default)
        if path:
            try:
                await aio_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=path, context=context, client_configuration=configuration
                )
            # A missing file, YAML that does not parse, or a kubeconfig without the clusters,
            # users or context it names: one line naming the file, not a traceback.
            except (
                aio_config.ConfigException,
                yaml.YAMLError,
                OSError,
                ValueError,
                TypeError,
                KeyError,
                AttributeError,
            ) as exc:
                raise ConfigError(
                    "--kubeconfig", path, f"a valid kubeconfig ({_why(exc)})"
                ) from None
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            aio_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            raise KallotError(
                "no kubeconfig: pass --kubeconfig, set KUBECONFIG, create ~/.kube/config, "
                "or run inside a cluster"
            )
        # aiohttp's connector caps parallel requests (binds, status writes) at this number.
        configuration.connection_pool_maxsize = pool_size
        _proxy_once(configuration)
        return KubeClient(
            aio_client.ApiClient(configuration=configuration), user_agent=user_agent, retry=retry
        )

    async def close(self) -> None:
        await self._api.close()  # type: ignore[no-untyped-call]

    @property
    def server(self) -> str:
        return str(self._api.configuration.host)

    # -- generic requests --------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = JSON,
        timeout: float = 30.0,
    ) -> Any:
        try:
            method_, url, headers, data, post = await self._api.param_serialize(
                method,
                path,
                query_params=list(query) or None,
                header_params={"Content-Type": content_type, "Accept": JSON},
                body=body,
                auth_settings=["BearerToken"],
            )
            return await self._api.call_api(
                method_, url, headers, data, post, _request_timeout=timeout
            )
        except _TRANSPORT_ERRORS as exc:
            raise ApiError(method, path, 0, f"{type(exc).__name__}: {exc}") from exc
        except aio_client.exceptions.ApiException as exc:
            raise ApiError(method, path, int(exc.status or 0), str(exc.reason)) from exc

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = JSON,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """One request, retried per ``retry``; returns the decoded JSON answer or raises
        :class:`ApiError`."""
        attempt = 0
        while True:
            retry_after: str | None = None
            try:
                resp = await self._send(
                    method, path, query=query, body=body, content_type=content_type, timeout=timeout
                )
                try:
                    raw: bytes = await resp.read()
                except _TRANSPORT_ERRORS as exc:
                    raise ApiError(method, path, 0, f"{type(exc).__name__}: {exc}") from exc
                if 200 <= resp.status < 300:
                    result: dict[str, Any] = json.loads(raw) if raw else {}
                    return result
                error = _error_from_body(method, path, resp.status, raw)
                retry_after = resp.getheader("Retry-After")
            except ApiError as exc:
                error = exc
            again = error.status in RETRY_STATUSES or (error.status == 0 and method == "GET")
            if not again or attempt + 1 >= self.retry.attempts:
                raise error
            self.retries[error.status] = self.retries.get(error.status, 0) + 1
            await asyncio.sleep(self.retry.delay(attempt, retry_after))
            attempt += 1

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
        request only (``resourceVersion``: the continue token carries it on)."""

        async def fetch(cont: str) -> dict[str, Any]:
            q = [*query, ("limit", str(page_size))]
            if cont:
                q.append(("continue", cont))
            else:
                q.extend(first_query)
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
        resp = await self._send("GET", path, query=q, timeout=timeout_s + 30.0)
        try:
            if not 200 <= resp.status < 300:
                raise _error_from_body("WATCH", path, resp.status, await resp.read())
            content = resp.response.content
            while True:
                try:
                    line = await content.readline()
                except _TRANSPORT_ERRORS as exc:
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
