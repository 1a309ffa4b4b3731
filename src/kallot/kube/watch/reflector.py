"""List-then-watch for one resource, feeding the cache (after client-go's Reflector).

Lists the collection (paginated: the first list hands each page's objects to ``on_event`` as
``ADDED`` as it arrives, later lists hand all of them to ``on_replace``), then watches from the
list's resourceVersion and hands each event to ``on_event``. A watch that ends, cleanly or cut
(EOF, a reset connection, an error), is resumed from the resourceVersion of the last event it
delivered (bookmarks keep it fresh), never from where it began, so no event is handed over
twice; ``410 Gone`` (the version fell out of the server's window) lists again; other errors
back off and retry. ``fresh`` is clear while a list is being taken and applied, so the
session loop runs no session on a cache that is mid-resync. Every ``resync_s`` seconds,
and whenever ``relist()`` is awaited (a new leader wants the truth before its first session),
it lists again so drift cannot survive.

Pods (``bound_first``): the first list is taken in two parts of one snapshot, so that the
scheduler can start before every pending pod is in. First every *bound* pod (field selector
``spec.nodeName!=``, paginated), which fixes the snapshot's resourceVersion; then the
*pending* pods (``spec.nodeName=``) at exactly that resourceVersion
(``resourceVersionMatch=Exact``), page by page. ``usable`` (and ``fresh``) is set once the
bound pods and the first pending page are in: from then on the cache knows everything that
holds a GPU as of the snapshot (the watch, from that resourceVersion, brings what happened
since, as always), and what is still to come is only pending pods, which hold nothing. The
two parts together are exactly one full list at one resourceVersion.

Nodes (``usable_on_first_page``): the first list is usable from its first page on; the other
pages join the cache as they arrive (``synced`` says when all are in). A node's usage comes
from the pods bound to it, all of which are known before the first session (above), so a
session on the nodes listed so far places pods only where they fit; it may only find fewer
places than the whole list would give (the session loop holds back what that would mislead:
unschedulable reports and evictions, docs/design/003-live-scheduler.md, "Start-up").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from kallot.kube.api.client import ApiError, KubeClient

logger = logging.getLogger(__name__)

FORBIDDEN = 403  # an optional resource kallot may not read is treated as not served

# The first page of a first list that sessions may start from (the pending pods, the nodes): a
# small one, digested at once; the first session takes about this many pods (--min-session-pods).
FIRST_PAGE = 100

DELIVER_CHUNK = 50  # objects of a first list's page digested between yields to the loop

OnReplace = Callable[[Iterable[Mapping[str, Any]]], None]
OnEvent = Callable[[str, Mapping[str, Any]], None]


class Reflector:
    """Keeps one collection (``path``, e.g. ``/api/v1/pods``) mirrored into callbacks."""

    def __init__(
        self,
        client: KubeClient,
        path: str,
        *,
        name: str,
        on_replace: OnReplace,
        on_event: OnEvent,
        watch_timeout_s: int = 300,
        resync_s: float = 600.0,
        backoff_max_s: float = 30.0,
        on_change: Callable[[], None] | None = None,
        optional: bool = False,
        page_size: int = 500,
        bound_first: bool = False,
        rest_after: Callable[[], Awaitable[None]] | None = None,
        usable_on_first_page: bool = False,
    ) -> None:
        self.client = client
        self.path = path
        self.name = name
        self.on_replace = on_replace
        self.on_event = on_event
        self.on_change = on_change
        # A resource that may not be installed (a CRD) or that kallot may not be allowed to
        # read (a workload owner kind): 404 and 403 count as an empty list.
        self.optional = optional
        self.watch_timeout_s = watch_timeout_s
        self.resync_s = resync_s
        self.backoff_max_s = backoff_max_s
        #: set once the first list has been delivered
        self.synced = asyncio.Event()
        self.lists = 0
        self.watch_restarts = 0
        self.gone = 0
        #: events whose handler raised (a bug): logged and skipped, the watch goes on
        self.event_errors = 0
        self.page_size = page_size
        self.bound_first = bound_first
        # With ``bound_first`` or ``usable_on_first_page``: awaited before the pages after
        # the first (the composition root waits for what the first session needs, so that digesting
        # objects it does not need does not delay the ones it does).
        self.rest_after = rest_after
        # Nodes: the first list is usable from its first page on (``usable`` and ``fresh``
        # set then; ``synced`` only once the list is complete): sessions may place pods on the
        # nodes listed so far while the other pages arrive.
        self.usable_on_first_page = usable_on_first_page
        #: set once the cache may be scheduled from: the first list is complete or, with
        #: ``bound_first``, every bound pod and the first page of pending pods are in
        self.usable = asyncio.Event()
        self._delivered = False  # any object handed to on_replace/on_event yet
        self._relist_requested = asyncio.Event()
        self._listed: asyncio.Event = asyncio.Event()
        #: the resourceVersion of the last list or delivered event: where a watch resumes
        self.resource_version = ""
        #: set while the cache holds a complete list plus the events after it
        self.fresh = asyncio.Event()

    async def relist(self) -> None:
        """List again now and return once the fresh list has been applied."""
        done = asyncio.Event()
        self._listed = done
        self._relist_requested.set()
        await done.wait()

    async def run(self) -> None:
        """Forever (until cancelled)."""
        failures = 0
        while True:
            try:
                rv = await self._list()
                failures = 0
                await self._watch_until_relist(rv)
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                failures += 1
                delay = min(self.backoff_max_s, 0.5 * 2 ** min(failures, 6))
                if self.optional and (exc.not_found or exc.status == FORBIDDEN):
                    # Not served (a CRD not installed) or not readable (RBAC): the scheduler
                    # runs without it rather than wait for it, and looks again now and then.
                    if not self.synced.is_set():
                        why = (
                            "not served (CRD not installed?)"
                            if exc.not_found
                            else "forbidden (RBAC does not let kallot list it)"
                        )
                        logger.warning(
                            "resource %s resource=%s: scheduling without it, checking again "
                            "every %.0fs",
                            why,
                            self.name,
                            self.backoff_max_s,
                        )
                    self.on_replace([])
                    self.fresh.set()
                    self.usable.set()
                    self._delivered = True
                    self.synced.set()
                    self._listed.set()
                    delay = self.backoff_max_s
                else:
                    logger.warning(
                        "list failed resource=%s error=%s retry_in=%.1fs", self.name, exc, delay
                    )
                await asyncio.sleep(delay * (0.5 + random.random() / 2))  # jittered

    async def _list(self) -> str:
        self._relist_requested.clear()
        listed = self._listed
        self.fresh.clear()
        # The first list goes to ``on_event`` page by page as the pages arrive: nothing of
        # this resource was delivered before, so there is nothing to delete, the consumer
        # digests page k while page k+1 is on its way, and no list of every object is held.
        # A later list (resync, 410 Gone, relist, or a retry of a first list that failed
        # part-way) is a replace: it must also find what was deleted meanwhile.
        paged = not self._delivered
        items: list[dict[str, Any]] = []
        count = 0
        rv = ""
        if paged and self.bound_first:
            count, rv = await self._list_bound_first()
        else:
            first = [("limit", str(FIRST_PAGE))] if paged and self.usable_on_first_page else []
            async for page, page_rv in self.client.list_pages(
                self.path, page_size=self.page_size, first_query=first
            ):
                rv = page_rv
                count += len(page)
                if paged:
                    self._delivered = True
                    await self._deliver(page)
                    if self.usable_on_first_page and not self.usable.is_set():
                        self._first_page_usable(len(page))
                        if self.rest_after is not None:
                            await self.rest_after()
                else:
                    items.extend(page)
        if not paged:
            self.on_replace(items)
        self._delivered = True
        self.resource_version = rv
        if not self.fresh.is_set():
            self.lists += 1  # counted once: where the cache became usable
        self.fresh.set()
        self.usable.set()
        self.synced.set()
        listed.set()
        if self.on_change is not None:
            self.on_change()
        logger.info("listed resource=%s items=%d resourceVersion=%s", self.name, count, rv)
        return rv

    async def _deliver(self, page: list[dict[str, Any]]) -> None:
        """A page of a first list to ``on_event``, letting the event loop run every
        ``DELIVER_CHUNK`` objects: digesting a page of 500 pods takes 0.1 s of CPU or more,
        and sessions' hand-offs, binds and watch events go on meanwhile."""
        for i, obj in enumerate(page):
            if i and i % DELIVER_CHUNK == 0:
                await asyncio.sleep(0)
            self._handle("ADDED", obj)

    def _first_page_usable(self, count: int) -> None:
        self.lists += 1  # counted once: where the cache became usable
        self.fresh.set()
        self.usable.set()
        logger.info("listed first page resource=%s items=%d", self.name, count)
        if self.on_change is not None:
            self.on_change()

    async def _list_bound_first(self) -> tuple[int, str]:
        """The first list of pods in two parts of one snapshot (see the module docstring);
        returns how many pods and the snapshot's resourceVersion, where the watch starts."""
        count = 0
        rv = ""
        async for page, page_rv in self.client.list_pages(
            self.path, page_size=self.page_size, query=[("fieldSelector", "spec.nodeName!=")]
        ):
            rv = page_rv
            count += len(page)
            self._delivered = True
            await self._deliver(page)
        self._delivered = True
        pending_query = [("fieldSelector", "spec.nodeName=")]
        # Exactly the bound list's snapshot: a pod bound after it is not missed between the
        # two parts (it is pending here, and its bind comes by the watch from ``rv``).
        exact = [("resourceVersion", rv), ("resourceVersionMatch", "Exact")] if rv else []
        exact.append(("limit", str(FIRST_PAGE)))  # the first session takes about as many
        logger.info(
            "listed bound pods resource=%s items=%d resourceVersion=%s", self.name, count, rv
        )
        async for page, _ in self.client.list_pages(
            self.path, page_size=self.page_size, query=pending_query, first_query=exact
        ):
            count += len(page)
            await self._deliver(page)
            if not self.usable.is_set():
                # Every pod holding a GPU as of ``rv`` is in: sessions may start.
                self.lists += 1
                self.fresh.set()
                self.usable.set()
                if self.on_change is not None:
                    self.on_change()
                if self.rest_after is not None:
                    await self.rest_after()
        return count, rv

    async def _watch_until_relist(self, rv: str) -> None:
        """Watch from ``rv``; return when a relist is due (410, resync, or requested)."""
        listed_at = time.monotonic()
        failures = 0
        while True:
            if self._relist_requested.is_set():
                return
            if self.resync_s and time.monotonic() - listed_at >= self.resync_s:
                logger.info("resync resource=%s", self.name)
                return
            watch = asyncio.ensure_future(self._watch_once(rv))
            relist = asyncio.ensure_future(self._relist_requested.wait())
            try:
                done, _ = await asyncio.wait({watch, relist}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                relist.cancel()
                if not watch.done():
                    watch.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ApiError):
                        await watch
            if watch not in done:
                return  # relist requested
            # Resume after the last event delivered, however the watch ended.
            rv = self.resource_version or rv
            try:
                watch.result()
                failures = 0
            except ApiError as exc:
                if exc.gone:
                    self.gone += 1
                    logger.info("watch expired resource=%s (410 Gone): listing again", self.name)
                    return
                failures += 1
                delay = min(self.backoff_max_s, 0.25 * 2 ** min(failures, 7))
                logger.warning(
                    "watch failed resource=%s error=%s retry_in=%.1fs", self.name, exc, delay
                )
                await asyncio.sleep(delay)
            self.watch_restarts += 1

    def _handle(self, kind: str, obj: Mapping[str, Any]) -> None:
        """``on_event``, isolated: a handler that raises on one object (a bug) costs that event
        only. Before, the exception ended this reflector's task, and the scheduler kept running
        on a cache that no longer followed the resource. The next list (resync) applies the
        object again."""
        try:
            self.on_event(kind, obj)
        except Exception:
            self.event_errors += 1
            meta = obj.get("metadata") or {}
            logger.exception(
                "event not applied resource=%s event=%s object=%s/%s",
                self.name,
                kind,
                meta.get("namespace", ""),
                meta.get("name", ""),
            )

    async def _watch_once(self, rv: str) -> None:
        """One watch request from ``rv``; ``resource_version`` follows every event delivered
        (and bookmark), so a watch cut mid-stream resumes after its last event."""
        # Spread the reconnects of many watchers (kube uses a random timeout in [T, 2T)).
        timeout = int(self.watch_timeout_s * (1 + random.random()))
        async for event in self.client.watch(self.path, resource_version=rv, timeout_s=timeout):
            meta = event.obj.get("metadata") or {}
            new_rv = str(meta.get("resourceVersion") or "")
            if event.type != "BOOKMARK":
                self._handle(event.type, event.obj)
            # Taken up once the event is handed over (a handler that raised skips it: _handle).
            if new_rv:
                self.resource_version = new_rv
            if event.type != "BOOKMARK" and self.on_change is not None:
                self.on_change()
