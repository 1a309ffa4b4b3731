"""``Registry``: plugin name -> factory. Built explicitly by the composition root (cli), never at
import time, so the set of plugins and their order are visible in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kallot.core.errors import ConfigError

PluginFactory = Callable[[Mapping[str, Any]], Any]


class Registry:
    """Maps plugin names to factories taking the plugin's args mapping."""

    def __init__(self, factories: Mapping[str, PluginFactory] | None = None) -> None:
        self._factories: dict[str, PluginFactory] = dict(factories or {})

    def register(self, name: str, factory: PluginFactory) -> None:
        if name in self._factories:
            raise ConfigError("registry", name, "a plugin name not registered yet")
        self._factories[name] = factory

    def merge(self, other: Registry) -> Registry:
        merged = Registry(self._factories)
        for name, factory in other._factories.items():
            merged.register(name, factory)
        return merged

    def create(self, name: str, args: Mapping[str, Any] | None = None) -> Any:
        if name not in self._factories:
            raise ConfigError("plugin", name, f"one of {sorted(self._factories)}")
        return self._factories[name](args or {})

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._factories))
