"""node.models: scanning model caches (hub layout, plain directories, manifests), bad input, the
inotify watch, and publishing to a real kube-apiserver."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from kallot.config import model_cache
from kallot.config.model_cache import ModelCacheInventory
from kallot.node import models
from kallot.node.k8s import NodeClient

BLOB = 1000


def hub_model(root: Path, org: str, name: str, revs: dict[str, dict[str, int]]) -> Path:
    """A hub cache entry: blobs/ holds the files, snapshots/REV/ links to them."""
    repo = root / f"models--{org}--{name}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for rev, files in revs.items():
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        for fname, size in files.items():
            blob = repo / "blobs" / f"sha-{fname}-{size}"
            if not blob.exists():
                blob.write_bytes(b"\0" * size)
            (snap / fname).symlink_to(os.path.relpath(blob, snap))
    return repo


def config_of(*roots: Path, manifests: tuple[Path, ...] = ()) -> models.ModelCacheConfig:
    return models.ModelCacheConfig(roots=roots, manifests=manifests, debounce_s=0.2)


def test_hub_layout_sizes_follow_the_links(tmp_path: Path) -> None:
    hub_model(
        tmp_path,
        "meta-llama",
        "Llama-2-7b-hf",
        {"abc123": {"config.json": 10, "model.safetensors": 5000}, "def456": {"config.json": 10}},
    )
    found = models.scan(config_of(tmp_path))
    assert found.errors == []
    got = {(m.id, m.revision, m.size_bytes) for m in found.models}
    assert got == {
        ("meta-llama/Llama-2-7b-hf", "abc123", 5010),
        ("meta-llama/Llama-2-7b-hf", "def456", 10),
    }
    assert found.largest is not None and found.largest.stat().st_size == 5000


def test_plain_directories_and_manifest(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "mistralai" / "Mistral-7B-v0.1").mkdir(parents=True)
    (cache / "mistralai" / "Mistral-7B-v0.1" / "config.json").write_text("{}")
    (cache / "mistralai" / "Mistral-7B-v0.1" / "w.bin").write_bytes(b"\0" * BLOB)
    (cache / "gpt2@main").mkdir()
    (cache / "gpt2@main" / "config.json").write_text("{}")
    (cache / "notes").mkdir()  # no config.json anywhere: not a model, not an error
    (cache / "notes" / "readme.txt").write_text("x")
    manifest = tmp_path / "models.json"
    (tmp_path / "llama70").mkdir()
    (tmp_path / "llama70" / "w.bin").write_bytes(b"\0" * 3 * BLOB)
    manifest.write_text(
        json.dumps(
            {
                "models": [
                    {"id": "meta-llama/Llama-2-70b-hf", "revision": "r1", "path": "llama70"},
                    {"id": "org/pinned", "revision": "r2", "bytes": 7, "tier": "memory"},
                ]
            }
        )
    )
    found = models.scan(config_of(cache, manifests=(manifest,)))
    assert found.errors == []
    got = {(m.id, m.revision, m.size_bytes, m.tier) for m in found.models}
    assert got == {
        ("mistralai/Mistral-7B-v0.1", "", BLOB + 2, "disk"),
        ("gpt2", "main", 2, "disk"),
        ("meta-llama/Llama-2-70b-hf", "r1", 3 * BLOB, "disk"),
        ("org/pinned", "r2", 7, "memory"),
    }
    core = models.inventory_of(config_of(cache), found, 2e9).to_core()
    assert core.memory == {"org/pinned": frozenset({"r2"})}
    assert core.read_bytes_per_s == 2e9


def test_bad_input_is_reported_and_the_rest_published(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    hub_model(cache, "good", "model", {"r1": {"config.json": 10}})
    (cache / "models--a--b--c" / "snapshots" / "r").mkdir(parents=True)  # three parts
    (cache / "bad name!").mkdir()
    (cache / "bad name!" / "config.json").write_text("{}")
    broken = hub_model(cache, "org", "broken", {"r1": {"config.json": 10}})
    (broken / "snapshots" / "r1" / "model.safetensors").symlink_to("../../blobs/missing")
    manifest = tmp_path / "m.json"
    manifest.write_text('{"models": [{"id": "org/x"')  # truncated
    bad_entry = tmp_path / "m2.json"
    bad_entry.write_text(
        json.dumps({"models": [{"id": "not/a/model", "bytes": 1}, {"id": "ok/one", "bytes": 5}]})
    )
    binary = tmp_path / "m3.json"
    binary.write_bytes(b'{"models": [{"id": "ok/two", "bytes": 5}]}\xff')  # not UTF-8
    found = models.scan(
        config_of(cache, tmp_path / "missing", manifests=(manifest, bad_entry, binary))
    )
    keys = {m.key for m in found.models}
    assert keys == {"good/model@r1", "org/broken@r1", "ok/one"}
    errors = "\n".join(found.errors)
    assert f"{cache / 'models--a--b--c'}: not a model name (expected models--ORG--NAME)" in errors
    assert "bad name!: not a model name" in errors
    assert "model.safetensors: unreadable (FileNotFoundError" in errors
    assert f"{manifest}: not JSON" in errors
    assert f"{binary}: not JSON (not UTF-8 text: byte 0xff)" in errors
    assert f"{bad_entry} models[0]" in errors and "'not/a/model'" in errors
    assert f"{tmp_path / 'missing'}: not a directory" in errors
    assert all("\n" not in e for e in found.errors)  # one line each
    inv = models.inventory_of(config_of(cache), found, 0.0)
    assert ModelCacheInventory.from_json(inv.to_json()) == inv  # errors are published too


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_unreadable_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        found = models.scan(config_of(tmp_path))
    finally:
        locked.chmod(0o755)
    assert any("locked: unreadable (PermissionError" in e for e in found.errors)


def test_annotation_errors_name_the_field() -> None:
    with pytest.raises(Exception, match=r"kallot.io/model-cache\.models\.0\.id"):
        ModelCacheInventory.from_json('{"v": 1, "models": [{"id": "a b", "bytes": 1}]}')
    with pytest.raises(Exception, match="JSON"):
        ModelCacheInventory.from_json("{")


def test_read_bandwidth_is_measured(tmp_path: Path) -> None:
    f = tmp_path / "w.bin"
    f.write_bytes(os.urandom(4 * 2**20))
    assert models.measure_read_bandwidth(f) > 0
    assert models.measure_read_bandwidth(None) == 0.0


async def test_watch_follows_the_cache_without_rescanning_per_change(tmp_path: Path) -> None:
    published: list[ModelCacheInventory] = []
    changed = asyncio.Event()

    async def publish(inv: ModelCacheInventory) -> None:
        published.append(inv)
        changed.set()

    async def next_inventory() -> set[str]:
        await asyncio.wait_for(changed.wait(), 60)
        changed.clear()
        return {m.key for m in published[-1].models}

    hub_model(tmp_path, "org", "first", {"r1": {"config.json": 10}})
    watcher = models.ModelCacheWatcher(config_of(tmp_path), publish)
    task = asyncio.create_task(watcher.run())
    try:
        assert await next_inventory() == {"org/first@r1"}
        scans = watcher.scans
        # a download: many files in a burst -> one (debounced) rescan or very few
        hub_model(tmp_path, "org", "second", {"r9": {f"part-{i}": 10 for i in range(30)}})
        assert await next_inventory() == {"org/first@r1", "org/second@r9"}
        assert watcher.scans - scans <= 3
        # eviction
        for p in sorted((tmp_path / "models--org--first").rglob("*"), reverse=True):
            p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
        (tmp_path / "models--org--first").rmdir()
        assert await next_inventory() == {"org/second@r9"}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert watcher._observer is None  # the watch thread is stopped


@pytest.mark.controlplane
async def test_publisher_writes_the_annotation_on_change_only(client: NodeClient) -> None:
    await client.request(
        "POST",
        "/api/v1/nodes",
        body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "mc-pub"}},
    )
    pub = models.ModelCachePublisher(client, "mc-pub")
    inv = ModelCacheInventory.model_validate(
        {"readBytesPerSecond": 2e9, "models": [{"id": "org/m", "revision": "r", "bytes": 5}]}
    )
    assert await pub(inv)
    assert not await pub(inv)
    node = await client.request("GET", "/api/v1/nodes/mc-pub")
    got = ModelCacheInventory.from_json(node["metadata"]["annotations"][model_cache.ANNOTATION])
    assert got == inv
    await client.request("DELETE", "/api/v1/nodes/mc-pub")


async def test_the_agent_runs_the_watch_and_stops_it(tmp_path: Path) -> None:
    from kallot.node.agent import Agent, AgentConfig
    from kallot.node.deviceplugin import StaticRecordSource
    from kallot.node.fake import FakeBackend

    data = Path(__file__).parent / "data"
    sockdir = tmp_path / "plugins"
    sockdir.mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    hub_model(cache, "org", "m", {"r1": {"config.json": 10}})
    got: asyncio.Queue[ModelCacheInventory] = asyncio.Queue()
    watcher = models.ModelCacheWatcher(config_of(cache), got.put)
    backend = FakeBackend.from_file(data / "hgx-h100-8.yaml")
    config = AgentConfig(
        node="gpu-1",
        plugin_dir=sockdir,
        sharing=backend.sharing(),
        refresh_s=3600,
        metrics_address="127.0.0.1:0",
    )
    agent = Agent(config, backend, StaticRecordSource(), models=watcher)
    await agent.start(serve_metrics=False)
    try:
        first = await asyncio.wait_for(got.get(), 30)
        assert [m.key for m in first.models] == ["org/m@r1"]
    finally:
        await agent.stop()
    assert watcher._observer is None


async def test_a_failed_publish_is_tried_again_without_a_change(tmp_path: Path) -> None:
    hub_model(tmp_path, "org", "m", {"r1": {"config.json": 10}})
    attempts: list[ModelCacheInventory] = []
    done = asyncio.Event()

    async def flaky(inv: ModelCacheInventory) -> None:
        attempts.append(inv)
        if len(attempts) == 1:
            raise OSError("API server away")
        done.set()

    config = models.ModelCacheConfig(roots=(tmp_path,), debounce_s=0.1, retry_s=0.2)
    watcher = models.ModelCacheWatcher(config, flaky)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(attempts) == 2 and attempts[0] == attempts[1]
    assert watcher.current == attempts[1] and not watcher.unpublished
