"""Score + DeviceScore: kallot's default policy (work in progress: FGD without quantization)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from kallot.core import frag
from kallot.core.errors import ConfigError
from kallot.core.framework.plugin import DeviceScorePlugin, ScorePlugin
from kallot.core.plugins.fgd import FGD


class KallotScore(FGD):
    name: ClassVar[str] = "KallotScore"

    @staticmethod
    def from_args(args: Mapping[str, Any]) -> KallotScore:
        unknown = set(args) - {"target"}
        if unknown:
            raise ConfigError("KallotScore args", sorted(unknown), "only 'target'")
        target = args.get("target")
        if target is not None and not isinstance(target, frag.TargetWorkload):
            raise ConfigError("KallotScore args.target", type(target).__name__, "a TargetWorkload")
        return KallotScore(target, quantize=False)


_s: type[ScorePlugin] = KallotScore
_d: type[DeviceScorePlugin] = KallotScore
