"""kube.translate.models: the model a pod names (annotation or env), and the node's published model cache,
as translate hands them to the core."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kallot.config import model_cache
from kallot.core.errors import ConfigError
from kallot.core.models import ModelRef
from kallot.kube import translate
from kallot.kube.translate import models
from kallot.testing.live import inventory_node_body, pod_body


def pod(
    ann: dict[str, str] | None = None, env: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    body = pod_body("p", resources={"nvidia.com/gpu": "1"}, annotations=ann)
    body["metadata"]["namespace"] = "ml"
    if env is not None:
        body["spec"]["containers"][0]["env"] = env
    return body


def test_annotation_names_the_model() -> None:
    task = translate.pod_to_task(
        pod(
            {"kallot.io/model": "meta-llama/Llama-2-70b-hf@abc123", "kallot.io/model-size": "140Gi"}
        )
    )
    assert task.model == ModelRef("meta-llama/Llama-2-70b-hf", "abc123", 140 * 2**30)
    assert translate.pod_to_task(pod({"kallot.io/model": "gpt2"})).model == ModelRef("gpt2")
    assert translate.pod_to_task(pod()).model is None


def test_env_convention() -> None:
    env = [{"name": "MODEL_ID", "value": "Qwen/Qwen2-7B"}, {"name": "REVISION", "value": "main"}]
    assert models.task_model(pod(env=env)) == ModelRef("Qwen/Qwen2-7B", "main")
    env = [{"name": "HF_MODEL_ID", "value": "org/m@r2"}]
    assert models.task_model(pod(env=env)) == ModelRef("org/m", "r2")
    # a reference to a Secret or ConfigMap is not read: the scheduler sees no model
    ref = [{"name": "MODEL_ID", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    assert models.task_model(pod(env=ref)) is None
    # the annotation wins over the env
    assert models.task_model(pod({"kallot.io/model": "a/b"}, env=env)) == ModelRef("a/b")


@pytest.mark.parametrize(
    ("ann", "env", "message"),
    [
        (
            {"kallot.io/model": "not a model"},
            None,
            "metadata.annotations[kallot.io/model]: got 'not a model', expected ORG/NAME",
        ),
        ({"kallot.io/model": "a/b/c"}, None, "metadata.annotations[kallot.io/model]"),
        (
            {"kallot.io/model": "a/b", "kallot.io/model-size": "lots"},
            None,
            "metadata.annotations[kallot.io/model-size]: got 'lots'",
        ),
        ({"kallot.io/model": "a/b", "kallot.io/model-size": "-1Gi"}, None, "kallot.io/model-size"),
        (
            None,
            [{"name": "MODEL_ID", "value": "x@1"}, {"name": "REVISION", "value": "2"}],
            "spec.containers[0].env[MODEL_ID]",
        ),
    ],
)
def test_bad_model_names_the_field(
    ann: dict[str, str] | None, env: list[dict[str, Any]] | None, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        translate.pod_to_task(pod(ann, env))
    assert message in str(err.value)


def test_node_cache_reaches_the_node_spec() -> None:
    node = inventory_node_body("n1", 8)
    inv = model_cache.ModelCacheInventory.model_validate(
        {
            "readBytesPerSecond": 3e9,
            "models": [
                {"id": "org/m", "revision": "r1", "bytes": 100},
                {"id": "org/hot", "revision": "r1", "bytes": 5, "tier": "memory"},
            ],
        }
    )
    before = translate.node_info(node)
    assert before.spec.model_cache is None
    node["metadata"]["annotations"][model_cache.ANNOTATION] = inv.to_json()
    info = translate.node_info(node)
    cache = info.spec.model_cache
    assert cache is not None and cache.read_bytes_per_s == 3e9
    assert cache.disk == {"org/m": frozenset({"r1"})} and cache.memory == {
        "org/hot": frozenset({"r1"})
    }
    assert cache.size_of(ModelRef("org/m")) == 100
    assert info.signature != before.signature  # a cache change rebuilds the snapshot
    # a broken annotation: no cache credit, the node's GPUs are still used
    node["metadata"]["annotations"][model_cache.ANNOTATION] = json.dumps({"models": [{"id": 3}]})
    broken = translate.node_info(node)
    assert broken.spec.model_cache is None and broken.inventory_error is None
    assert len(broken.spec.gpus) == 8
