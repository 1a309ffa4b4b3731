"""Built-in plugins and named policies (Profile presets).

``builtin_registry()`` lists every core plugin explicitly (no import-time registration); the
composition root (cli) calls it and may merge out-of-tree plugins. ``PROFILES`` maps the policy
names used on the command line to Profiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kallot.core.framework.profile import Profile
from kallot.core.framework.registry import Registry
from kallot.core.plugins.device_fit import DeviceFit
from kallot.core.plugins.node_resources_fit import NodeResourcesFit
from kallot.core.plugins.node_selector import NodeSelector
from kallot.core.plugins.priority_sort import PrioritySort


def builtin_registry() -> Registry:
    """Every plugin the core ships, by name."""

    def no_args(cls: Any) -> Any:
        def factory(args: Mapping[str, Any]) -> Any:
            if args:
                raise ValueError(f"{cls.name} takes no args, got {dict(args)}")
            return cls()

        return factory

    return Registry(
        {
            PrioritySort.name: no_args(PrioritySort),
            NodeResourcesFit.name: no_args(NodeResourcesFit),
            NodeSelector.name: no_args(NodeSelector),
            DeviceFit.name: no_args(DeviceFit),
        }
    )


FILTERS = ("NodeResourcesFit", "NodeSelector", "DeviceFit")

PROFILES: dict[str, Profile] = {
    # No score plugins: the seeded node order decides (used by tests of the framework itself).
    "first-fit": Profile(name="first-fit", filter=FILTERS),
}
