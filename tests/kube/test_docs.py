"""The examples in docs/pod-api.md and docs/node-inventory.md mean what the pages say: every
YAML object is read by kallot without error (except the one marked rejected, which fails as
shown), and the inventory example parses.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kallot.config.inventory import NodeInventory
from kallot.config.model_cache import ModelCacheInventory
from kallot.core.errors import ConfigError
from kallot.kube import translate

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _blocks(page: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def _objects() -> list[dict[str, Any]]:
    return [d for block in _blocks("pod-api.md", "yaml") for d in yaml.safe_load_all(block) if d]


@pytest.mark.parametrize("obj", _objects(), ids=lambda o: f"{o['kind']}-{o['metadata']['name']}")
def test_pod_api_examples(obj: dict[str, Any]) -> None:
    obj["metadata"].setdefault("namespace", "ml")
    if obj["kind"] == "Pod":
        assert obj["spec"]["schedulerName"] == "kallot"
        if obj["metadata"]["name"] == "too-much":
            with pytest.raises(ConfigError, match=re.escape("[kallot.io/gpu-milli]")):
                translate.pod_to_task(obj)
            return
        task = translate.pod_to_task(obj)
        assert task.gpu is not None
    elif obj["kind"] == "PodGroup":
        assert translate.pod_group_to_job(obj).min_available == obj["spec"]["minAvailable"]
    elif obj["kind"] == "Queue":
        # "16" GPUs = 16 * 1000 milli-GPU
        assert translate.queue_spec(obj).gpu_quota_milli == 16_000
    else:
        pytest.fail(f"unexpected kind {obj['kind']}")


def test_node_inventory_example() -> None:
    block = _blocks("node-inventory.md", "json")[0]
    inv = NodeInventory.from_json(block)
    assert [d.mode for d in inv.devices] == ["mps", "mig"]
    assert [m.start for m in inv.devices[1].mig] == [0, 4]


def test_model_cache_example() -> None:
    block = _blocks("node-inventory.md", "json")[1]
    inv = ModelCacheInventory.from_json(block)
    assert [m.key for m in inv.models] == ["meta-llama/Llama-2-70b-hf@01c7f73d"]
    assert len(inv.errors) == 1
