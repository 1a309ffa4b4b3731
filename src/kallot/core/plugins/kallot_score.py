"""Score + DeviceScore: KallotScore, kallot's default policy (FGD's gradient plus three terms FGD
cannot see). The score is ``helpers.kallot_frag.KallotFrag`` (also weighed by the Topology
plugin); this module is the plugin and its args.

Where it sits: the ``kallot`` profile's main score plugin (``core.policies``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from kallot.core import frag
from kallot.core.errors import ConfigError
from kallot.core.framework.plugin import DeviceScorePlugin, ScorePlugin
from kallot.core.helpers.kallot_frag import (
    CPU_WEIGHT,
    MODEL_WEIGHT,
    TAIL_MODELS,
    TAIL_WEIGHTS,
    KallotFrag,
)


class KallotScore(KallotFrag):
    """Args: ``target`` (TargetWorkload; learned when absent), ``cpu_weight`` (4),
    ``tail_weight`` (12 for the "lp" tail, 4 for the others), ``model_weight`` (1.0), ``tail``
    ("lp", "learned" or "closed"), ``quantize`` (true)."""

    name: ClassVar[str] = "KallotScore"

    @staticmethod
    def from_args(args: Mapping[str, Any]) -> KallotScore:
        allowed = {"target", "cpu_weight", "tail_weight", "model_weight", "tail", "quantize"}
        unknown = set(args) - allowed
        if unknown:
            raise ConfigError("KallotScore args", sorted(unknown), f"only {sorted(allowed)}")
        target = args.get("target")
        if target is not None and not isinstance(target, frag.TargetWorkload):
            raise ConfigError("KallotScore args.target", type(target).__name__, "a TargetWorkload")
        tail = args.get("tail", "lp")
        if tail not in TAIL_MODELS:
            raise ConfigError("KallotScore args.tail", tail, f"one of {', '.join(TAIL_MODELS)}")
        weights: dict[str, float] = {}
        defaults = (
            ("cpu_weight", CPU_WEIGHT),
            ("tail_weight", TAIL_WEIGHTS[str(tail)]),
            ("model_weight", MODEL_WEIGHT),
        )
        for key, default in defaults:
            value = args.get(key, default)
            # not (value >= 0): NaN compares false both ways, and a NaN or infinite weight
            # would make every score NaN
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (0 <= value < math.inf)
            ):
                raise ConfigError(f"KallotScore args.{key}", value, "a finite number >= 0")
            weights[key] = float(value)
        return KallotScore(
            target, tail=str(tail), quantize=bool(args.get("quantize", True)), **weights
        )


_s: type[ScorePlugin] = KallotScore
_d: type[DeviceScorePlugin] = KallotScore
