"""Score + DeviceScore: FGD, fragmentation gradient descent (Weng et al., USENIX ATC '23), the
openb paper's policy. The score and GPU choice are ``helpers.frag_score.FragScore`` (shared with
kallot's score); this module is the plugin and its args.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from kallot.core import frag
from kallot.core.errors import ConfigError
from kallot.core.framework.plugin import DeviceScorePlugin, ScorePlugin
from kallot.core.helpers.frag_score import FragScore


class FGD(FragScore):
    """FGD's node score and GPU choice. Args: ``target`` (a TargetWorkload; learned from the
    running and pending tasks when absent), ``quantize`` (default true, as the paper)."""

    name: ClassVar[str] = "FGD"

    @staticmethod
    def from_args(args: Mapping[str, Any]) -> FGD:
        unknown = set(args) - {"target", "quantize"}
        if unknown:
            raise ConfigError("FGD args", sorted(unknown), "only 'target' and 'quantize'")
        target = args.get("target")
        if target is not None and not isinstance(target, frag.TargetWorkload):
            raise ConfigError("FGD args.target", type(target).__name__, "a TargetWorkload")
        return FGD(target, quantize=bool(args.get("quantize", True)))


_s: type[ScorePlugin] = FGD
_d: type[DeviceScorePlugin] = FGD
