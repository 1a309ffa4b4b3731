"""One composition: a configuration document -> the scheduler's Framework, and the presets.

Where it sits: between ``config.scheduler`` (the ``KallotSchedulerConfiguration`` document and
its shipped files, ``config/profiles/*.yaml``, the only place the policy presets are written) and
everything that schedules: the live scheduler (cli.scheduler) and every simulator (sim.*, for
``kallot sim ...`` with ``--policy NAME`` or ``--config FILE``) build their Framework through
``framework`` from a document, so a file behaves the same in a simulation and in a cluster.
``PROFILES`` and ``profile`` are the shipped documents' Profiles, for code that reads or varies
a preset's plugins (tests, benchmarks).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping

from kallot.config import scheduler as sc
from kallot.core import frag, policies
from kallot.core.framework.profile import Profile
from kallot.core.framework.registry import Registry
from kallot.core.framework.runner import Framework

#: The policies the openb experiments compare (``kallot sim compare``) and the simulators'
#: ``--policy`` choices, in the comparison's order: the openb paper's six and kallot's default.
POLICY_NAMES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", "kallot")


def framework(
    config: sc.SchedulerConfiguration,
    *,
    name: str = "",
    target: frag.TargetWorkload | None = None,
    registry: Registry | None = None,
    where: str = "config",
    adjust: Callable[[Profile], Profile] | None = None,
) -> Framework:
    """The Framework a configuration document describes: its Profile (``name``: the Profile's,
    default the profile's schedulerName), with ``target`` handed to the plugins that read a
    target workload (the simulators know theirs), checked as ``config.scheduler.build_framework``
    checks it. ``where`` names the file in errors. ``adjust``: what an experiment varies on the
    document's Profile (a plugin's weight, a score left out), applied before the checks."""
    profile = sc.to_profile(config, name=name, registry=registry, where=where)
    if target is not None:
        profile = policies.with_target(profile, target)
    if adjust is not None:
        profile = adjust(profile)
    return sc.build_framework(profile, registry, where=where)


def document(
    policy: str, config: sc.SchedulerConfiguration | None = None
) -> sc.SchedulerConfiguration:
    """``config`` when given (a ``--config FILE``), else the shipped file of ``policy``."""
    return config if config is not None else sc.shipped(policy)


class _Shipped(Mapping[str, Profile]):
    """name -> the shipped file's Profile (named after the file), each file read when first
    asked for: a command that runs one policy reads one file."""

    def __getitem__(self, name: str) -> Profile:
        if name not in sc.shipped_names():
            raise KeyError(name)
        return _shipped_profile(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sc.shipped_names())

    def __len__(self) -> int:
        return len(sc.shipped_names())


@functools.cache
def _shipped_profile(name: str) -> Profile:
    return sc.to_profile(sc.shipped(name), name=name, where=f"{name}.yaml")


#: name -> the shipped file's Profile, for every shipped policy.
PROFILES: Mapping[str, Profile] = _Shipped()


def profile(name: str, *, target: frag.TargetWorkload | None = None) -> Profile:
    """The shipped policy's Profile; ``target`` goes to its fragmentation-aware plugins."""
    if name not in PROFILES:
        sc.shipped(name)  # raises the one-line error naming the shipped policies
    base = PROFILES[name]
    return base if target is None else policies.with_target(base, target)
