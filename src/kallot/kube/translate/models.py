"""Model weights in the pod API and the node's model cache, for the scheduler's kube shell
(docs/pod-api.md, "Serving: the model a pod loads"; docs/serving.md).

Where it sits: inside ``kube.translate`` (it reads only what the pod and node
translations read: quantities, annotations): ``translate.pod_to_task`` calls ``task_model`` for
``Task.model`` and ``translate.node_info`` calls ``node_cache`` for ``NodeSpec.model_cache``;
the ModelCache score plugin (core.plugins.model_cache) reads both.

A pod names its model with the annotation ``kallot.io/model: ORG/NAME@REV`` (revision optional)
and optionally its size, ``kallot.io/model-size: 140Gi`` (a quantity; without it the size the
nodes measured is used). Without the annotation the model is taken from the first container that
sets the environment variable ``MODEL_ID`` (text-generation-inference) or ``HF_MODEL_ID``
(Hugging Face inference containers) to a literal value, with ``REVISION`` as its revision.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kallot.config import model_cache, wire
from kallot.core.errors import ConfigError
from kallot.core.models import ModelCache, ModelRef, parse_model
from kallot.kube.translate.quantity import ceil_int, parse_quantity

log = logging.getLogger(__name__)

ANN_MODEL = wire.ANN_MODEL
ANN_MODEL_SIZE = wire.ANN_MODEL_SIZE
ENV_MODEL = ("MODEL_ID", "HF_MODEL_ID")
ENV_REVISION = "REVISION"


def _env_model(spec: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(text, revision, field) from the first container naming its model in its env."""
    for i, c in enumerate(spec.get("containers") or []):
        env = {e.get("name"): e.get("value") for e in c.get("env") or [] if "value" in e}
        for name in ENV_MODEL:
            if env.get(name):
                field = f"spec.containers[{i}].env[{name}]"
                return str(env[name]), str(env.get(ENV_REVISION) or ""), field
    return None


def task_model(pod: Mapping[str, Any]) -> ModelRef | None:
    """The model a pod loads (module docstring), None if it names none; ConfigError names the
    bad annotation or env var."""
    meta = pod.get("metadata") or {}
    ann: Mapping[str, str] = meta.get("annotations") or {}
    size = 0
    if ANN_MODEL_SIZE in ann:
        where = f"metadata.annotations[{ANN_MODEL_SIZE}]"
        size = ceil_int(parse_quantity(ann[ANN_MODEL_SIZE], where))
        if size < 0:
            raise ConfigError(where, ann[ANN_MODEL_SIZE], "a size >= 0 such as 140Gi")
    if ANN_MODEL in ann:
        text, revision, where = ann[ANN_MODEL], "", f"metadata.annotations[{ANN_MODEL}]"
    else:
        found = _env_model(pod.get("spec") or {})
        if found is None:
            return None
        text, revision, where = found
    parsed = parse_model(text)
    if parsed is None:
        raise ConfigError(where, text, "ORG/NAME or ORG/NAME@REVISION (a Hugging Face model id)")
    if parsed[1] and revision and parsed[1] != revision:
        raise ConfigError(where, text, f"the revision {ENV_REVISION} names ({revision!r})")
    return ModelRef(parsed[0], parsed[1] or revision, size)


def node_cache(node: Mapping[str, Any]) -> ModelCache | None:
    """The node's published model cache, None when it publishes none or it does not parse
    (logged: the node still takes pods, it only gets no credit for its cache)."""
    meta = node.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(model_cache.ANNOTATION)
    if not text:
        return None
    where = f"Node {meta.get('name', '')}: metadata.annotations[{model_cache.ANNOTATION}]"
    try:
        return model_cache.ModelCacheInventory.from_json(text, where=where).to_core()
    except ConfigError as exc:
        log.warning("%s", exc)
        return None


def node_signature(node: Mapping[str, Any]) -> str:
    """What of the node's model cache the scheduler reads (a change rebuilds its snapshot)."""
    meta = node.get("metadata") or {}
    return str((meta.get("annotations") or {}).get(model_cache.ANNOTATION, ""))
