"""The node's model cache: scan, measure, watch and publish which model weights the node holds.

Where it sits: the node shell. ``kallot agent run --model-cache DIR`` builds a
``ModelCacheWatcher``; the Agent runs it as one task next to its refresh loop. The watcher scans
the configured caches once, measures the disk's read bandwidth once, publishes the result
(``ModelCachePublisher``: the Node annotation ``kallot.io/model-cache``,
``config.model_cache``), then rescans only when the file system says a cache changed: an
inotify watch (watchdog) on every cache root, or, with ``poll_s`` > 0, watchdog's polling
observer (for file systems without inotify, e.g. NFS). Changes are debounced (a download writes
many files), so the cost is one rescan per burst of changes, never one per pod.

Layouts understood in a cache root (docs/node-inventory.md, "Model caches"):

- the Hugging Face hub cache: ``models--ORG--NAME/snapshots/REV/`` (files are symlinks into
  ``blobs/``; a revision's size is the sum of the files it links, each blob counted once);
- plain directories: a directory holding a ``config.json`` is a model; its path below the root
  is its id (``NAME``, ``ORG/NAME``, optionally ``NAME@REV``);
- a manifest file (``--model-manifest``): JSON ``{"models": [{"id": "ORG/NAME", "revision":
  "REV", "path": "DIR", "bytes": N, "tier": "disk" | "memory"}]}``; ``bytes`` is measured from
  ``path`` when absent; ``tier: memory`` says an operator keeps the weights in host memory
  (a tmpfs or a pre-warm daemon).

Bad input never stops the scan: an unreadable directory, a malformed manifest or a name that is
not ORG/NAME becomes one line in ``errors`` (published too, and logged) and the rest is
published.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from kallot.config import model_cache
from kallot.config.errors import config_error
from kallot.config.model_cache import CachedModel, ModelCacheInventory
from kallot.core.models import parse_model

log = logging.getLogger(__name__)

HF_PREFIX = "models--"
MODEL_MARKER = "config.json"  # every transformers / vLLM model directory has one
MAX_PLAIN_DEPTH = 3  # ORG/NAME@REV at most below a root
MEASURE_BYTES = 256 * 2**20
CHUNK = 16 * 2**20


@dataclass(frozen=True, slots=True)
class ModelCacheConfig:
    """``roots``: cache directories; ``manifests``: manifest files; ``read_bytes_per_s``: the
    disk's bandwidth when the operator states it (0 = measure it); ``poll_s``: 0 = inotify watch,
    else poll every ``poll_s`` seconds; ``debounce_s``: quiet time before a rescan."""

    roots: tuple[Path, ...] = ()
    manifests: tuple[Path, ...] = ()
    read_bytes_per_s: float = 0.0
    poll_s: float = 0.0
    debounce_s: float = 2.0
    measure_bytes: int = MEASURE_BYTES
    retry_s: float = 10.0  # a failed publish is tried again this often


@dataclass(slots=True)
class Scan:
    models: list[CachedModel] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    largest: Path | None = None  # the largest file seen (bandwidth is measured on it)
    largest_size: int = 0

    def add(self, model_id: str, revision: str, size: int, path: Path, tier: str = "disk") -> None:
        try:
            self.models.append(
                CachedModel.model_validate(
                    {
                        "id": model_id,
                        "revision": revision,
                        "bytes": size,
                        "tier": tier,
                        "path": str(path),
                    }
                )
            )
        except ValidationError as exc:
            err = config_error(exc, prefix=str(path))
            self.errors.append(f"{err.field}: got {err.value!r}, expected {err.expected}")

    def error(self, path: Path, what: str) -> None:
        self.errors.append(f"{path}: {what}")


def _size(path: Path, scan: Scan) -> int:
    """Bytes of the files under ``path`` (symlinks followed, each inode once); unreadable
    subdirectories are reported and skipped."""
    seen: set[tuple[int, int]] = set()
    total = 0

    def onerror(exc: OSError) -> None:
        scan.error(Path(exc.filename or path), f"unreadable ({type(exc).__name__}: {exc.strerror})")

    for top, _, files in os.walk(path, onerror=onerror, followlinks=False):
        for name in files:
            file = Path(top) / name
            try:
                st = file.stat()  # follows the hub's symlinks into blobs/
            except OSError as exc:
                scan.error(file, f"unreadable ({type(exc).__name__}: {exc.strerror})")
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += st.st_size
            if st.st_size > scan.largest_size:
                scan.largest, scan.largest_size = file, st.st_size
    return total


def _listdir(path: Path, scan: Scan) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError as exc:
        scan.error(path, f"unreadable ({type(exc).__name__}: {exc.strerror or exc})")
        return []


def _hub_model(entry: Path, scan: Scan) -> None:
    """``models--ORG--NAME``: one model per revision under ``snapshots/``."""
    parts = entry.name[len(HF_PREFIX) :].split("--")
    model_id = "/".join(parts)
    parsed = parse_model(model_id)
    if len(parts) > 2 or parsed is None or parsed[1]:
        scan.error(entry, "not a model name (expected models--ORG--NAME)")
        return
    snapshots = entry / "snapshots"
    if not snapshots.is_dir():
        return  # a download in progress (only blobs/ and refs/ so far)
    for rev in _listdir(snapshots, scan):
        if rev.is_dir():
            scan.add(model_id, rev.name, _size(rev, scan), rev)


def _plain(root: Path, entry: Path, scan: Scan, depth: int = 1) -> None:
    """A directory with a ``config.json`` is a model named by its path below ``root``."""
    if (entry / MODEL_MARKER).is_file():
        rel = entry.relative_to(root).as_posix()
        parsed = parse_model(rel)
        if parsed is None:
            scan.error(entry, "not a model name (expected NAME, ORG/NAME or ORG/NAME@REV)")
            return
        scan.add(parsed[0], parsed[1], _size(entry, scan), entry)
        return
    if depth >= MAX_PLAIN_DEPTH:
        return
    for sub in _listdir(entry, scan):
        if sub.is_dir() and not sub.name.startswith("."):
            _plain(root, sub, scan, depth + 1)


def scan_root(root: Path, scan: Scan) -> None:
    """Every model under one cache root, hub layout and plain directories alike."""
    if not root.is_dir():
        scan.error(root, "not a directory")
        return
    for entry in _listdir(root, scan):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        if entry.name.startswith(HF_PREFIX):
            _hub_model(entry, scan)
        elif "--" in entry.name and entry.name.split("--")[0] in ("datasets", "spaces"):
            continue  # other hub repositories share the cache
        else:
            _plain(root, entry, scan)


class _ManifestEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str
    revision: str = ""
    path: str = ""
    size_bytes: int | None = Field(default=None, ge=0, alias="bytes")
    tier: str = "disk"


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[_ManifestEntry] = []


def scan_manifest(file: Path, scan: Scan) -> None:
    """The models a manifest lists (sizes measured from their paths when not given)."""
    try:
        doc = _Manifest.model_validate(json.loads(file.read_text()))
    except OSError as exc:
        scan.error(file, f"unreadable ({type(exc).__name__}: {exc.strerror or exc})")
        return
    except json.JSONDecodeError as exc:
        scan.error(file, f"not JSON ({exc.msg} at line {exc.lineno})")
        return
    except UnicodeDecodeError as exc:
        scan.error(file, f"not JSON (not UTF-8 text: byte 0x{exc.object[exc.start]:02x})")
        return
    except ValidationError as exc:
        err = config_error(exc, prefix=str(file))
        scan.errors.append(f"{err.field}: got {err.value!r}, expected {err.expected}")
        return
    for i, entry in enumerate(doc.models):
        where = file.parent / entry.path if entry.path else file
        size = entry.size_bytes
        if size is None:
            if not entry.path or not where.exists():
                scan.error(file, f"models[{i}].path: got {entry.path!r}, expected an existing path")
                continue
            size = _size(where, scan)
        before = len(scan.errors)
        scan.add(entry.id, entry.revision, size, where, entry.tier)
        if len(scan.errors) > before:
            scan.errors[-1] = scan.errors[-1].replace(str(where), f"{file} models[{i}]", 1)


def scan(config: ModelCacheConfig) -> Scan:
    """Everything the configured caches hold (models sorted by id, revision, tier)."""
    out = Scan()
    for root in config.roots:
        scan_root(root, out)
    for file in config.manifests:
        scan_manifest(file, out)
    unique = {(m.id, m.revision, m.tier): m for m in out.models}
    out.models = [unique[k] for k in sorted(unique)]
    return out


def measure_read_bandwidth(file: Path | None, max_bytes: int = MEASURE_BYTES) -> float:
    """Bytes per second reading up to ``max_bytes`` of ``file`` with its cached pages dropped
    first (posix_fadvise DONTNEED), so the disk is measured, not the page cache. 0 when there is
    nothing to read."""
    if file is None:
        return 0.0
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError:
        return 0.0
    try:
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        start = time.perf_counter()
        done = 0
        while done < max_bytes:
            chunk = os.read(fd, min(CHUNK, max_bytes - done))
            if not chunk:
                break
            done += len(chunk)
        took = time.perf_counter() - start
    finally:
        os.close(fd)
    return done / took if done and took > 0 else 0.0


def inventory_of(config: ModelCacheConfig, found: Scan, bandwidth: float) -> ModelCacheInventory:
    return ModelCacheInventory(
        read_bytes_per_s=config.read_bytes_per_s or bandwidth,
        models=tuple(found.models),
        errors=tuple(found.errors),
    )


class _Changed(FileSystemEventHandler):
    def __init__(self, notify: Callable[[], None]) -> None:
        self._notify = notify

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type not in ("opened", "closed_no_write"):  # reads change nothing
            self._notify()


Publish = Callable[[ModelCacheInventory], Awaitable[Any]]


class ModelCacheWatcher:
    """Scans, measures once, publishes, and rescans when a cache root changes (module doc)."""

    def __init__(self, config: ModelCacheConfig, publish: Publish) -> None:
        self.config = config
        self.publish = publish
        self.current: ModelCacheInventory | None = None
        self.scans = 0
        self.bandwidth = 0.0
        self.unpublished = False
        self._dirty: asyncio.Event | None = None
        self._observer: Any = None

    async def rescan(self) -> ModelCacheInventory:
        found = await asyncio.to_thread(scan, self.config)
        self.scans += 1
        if not self.config.read_bytes_per_s and not self.bandwidth:
            self.bandwidth = await asyncio.to_thread(
                measure_read_bandwidth, found.largest, self.config.measure_bytes
            )
        inv = inventory_of(self.config, found, self.bandwidth)
        if inv != self.current:
            for err in inv.errors:
                if self.current is None or err not in self.current.errors:
                    log.warning("model cache: %s", err)
            try:
                await self.publish(inv)
            except Exception as exc:  # the API may be briefly away: run() tries again
                log.warning("publishing the model cache failed: %s", exc)
                self.unpublished = True
                return inv
            self.current = inv
        self.unpublished = False
        return inv

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        dirty = self._dirty
        assert dirty is not None
        observer = PollingObserver(timeout=self.config.poll_s) if self.config.poll_s else Observer()

        def notify() -> None:
            loop.call_soon_threadsafe(dirty.set)

        handler = _Changed(notify)
        watched = [*self.config.roots, *(m.parent for m in self.config.manifests)]
        for path in dict.fromkeys(watched):
            try:
                observer.schedule(handler, str(path), recursive=path in self.config.roots)
            except OSError as exc:  # reported by the scan too; the other roots are watched
                log.warning("model cache: cannot watch %s: %s", path, exc)
        observer.start()
        self._observer = observer

    async def run(self) -> None:
        """Scan and publish, then rescan after every (debounced) change, until cancelled."""
        self._dirty = asyncio.Event()
        self._watch(asyncio.get_running_loop())
        try:
            await self.rescan()
            while True:
                if self.unpublished:  # the last publish failed: try again after a while
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._dirty.wait(), self.config.retry_s)
                else:
                    await self._dirty.wait()
                # debounce: a download writes many files; rescan once it has been quiet
                while True:
                    self._dirty.clear()
                    await asyncio.sleep(self.config.debounce_s)
                    if not self._dirty.is_set():
                        break
                await self.rescan()
        finally:
            self.stop()

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None


class NodePatcher(Protocol):
    """What ``ModelCachePublisher`` needs of ``node.k8s.NodeClient``."""

    async def request(
        self, method: str, path: str, *, body: Any = None, content_type: str = ...
    ) -> dict[str, Any]: ...


class ModelCachePublisher:
    """Writes the inventory to the Node annotation ``kallot.io/model-cache`` (merge patch), only
    when it changed."""

    def __init__(self, client: NodePatcher, node: str) -> None:
        self.client = client
        self.node = node
        self.applied = 0
        self._last = ""

    async def __call__(self, inv: ModelCacheInventory) -> bool:
        text = inv.to_json()
        if text == self._last:
            return False
        await self.client.request(
            "PATCH",
            f"/api/v1/nodes/{self.node}",
            body={"metadata": {"annotations": {model_cache.ANNOTATION: text}}},
            content_type="application/merge-patch+json",
        )
        self._last = text
        self.applied += 1
        return True


def describe(inv: ModelCacheInventory) -> Iterable[str]:
    """Lines for ``kallot agent models``."""
    bw = inv.read_bytes_per_s
    yield f"read bandwidth: {bw / 1e9:.2f} GB/s" if bw else "read bandwidth: not measured"
    for m in inv.models:
        yield f"{m.key} {m.size_bytes / 1e9:.2f} GB {m.tier} {m.path}"
    for err in inv.errors:
        yield f"error: {err}"
