"""``KallotSchedulerConfiguration``: the live scheduler's configuration document (YAML).

Read by ``kallot scheduler --config FILE`` (cli.scheduler, the composition root), validated here
at the edge and turned into plain values: a core ``Profile`` (plugins per extension point,
score weights, plugin args, built on ``core.policies`` and the plugin ``Registry``), the queue
actions' settings, and the kube shell's settings, which the cli maps onto its own dataclasses.
Modelled on kube-scheduler's ``KubeSchedulerConfiguration`` (profiles with a schedulerName,
``plugins.<point>.enabled/disabled``, ``pluginConfig``); every field is documented in
docs/scheduler-config.md. The policy presets ship as such files (``config/profiles/*.yaml``,
the only place they are written); ``--policy NAME`` loads one, and ``config.presets.framework``
is how the live scheduler and every ``kallot sim`` command build their Framework from one.

Long module: the document's schema, its reading (file, flags) and its mapping onto the core
Profile are one vocabulary of field names and error locations; split, each part would repeat it.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from kallot.config.autoscale import AutoscaleDoc
from kallot.config.errors import expected, location
from kallot.config.files import read_text
from kallot.core import policies
from kallot.core.actions import Action
from kallot.core.errors import ConfigError
from kallot.core.framework.profile import Profile
from kallot.core.framework.registry import Registry
from kallot.core.framework.runner import Framework
from kallot.core.workload import MIN_RUNTIME_MAX_S

if TYPE_CHECKING:
    from kallot.core.queueing.queue_tree import QueueTree

API_VERSION = "kallot.io/v1alpha1"
KIND = "KallotSchedulerConfiguration"
# The profile whose plugins an extension point starts from when the file does not disable
# them with '*' (kube-scheduler's "default plugins"): kallot's default policy.
DEFAULT_POLICY = "kallot"
ALL = "*"
DOCS = "docs/scheduler-config.md"

# Extension point (as spelled in the file) -> the Profile field and the method a plugin at that
# point must have.
POINTS: dict[str, tuple[str, str]] = {
    "queueSort": ("queue_sort", "sort_key"),
    "preFilter": ("pre_filter", "pre_filter"),
    "filter": ("filter", "filter"),
    "score": ("score", "score"),
    "deviceScore": ("device_score", "choose"),
}


class _Doc(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, alias_generator=to_camel
    )


class PluginRef(_Doc):
    """One plugin at an extension point; ``weight`` only for score plugins."""

    name: str = Field(min_length=1)
    weight: int | None = Field(default=None, ge=0)


class PluginSet(_Doc):
    """kube-scheduler's merge: the default plugins minus ``disabled`` ('*': all of them), then
    ``enabled`` in order (one already there keeps its place and takes the new weight)."""

    enabled: tuple[PluginRef, ...] = ()
    disabled: tuple[PluginRef, ...] = ()


class Plugins(_Doc):
    queue_sort: PluginSet | None = None
    pre_filter: PluginSet | None = None
    filter: PluginSet | None = None
    score: PluginSet | None = None
    device_score: PluginSet | None = None


class PluginConfig(_Doc):
    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class ProfileDoc(_Doc):
    # None: the shell's own (kube.translate.SCHEDULER_NAME, which config may not import).
    scheduler_name: str | None = Field(default=None, min_length=1)
    plugins: Plugins = Field(default_factory=Plugins)
    plugin_config: tuple[PluginConfig, ...] = ()
    # The filter that serves MIG requests and the plugin whose gang topology gangs are placed
    # under (core.framework.profile.Profile.mig / gang_topology; "" for none). None: the
    # default policy's, if the merged plugins still include it.
    mig: str | None = None
    gang_topology: str | None = None


class LeaderElection(_Doc):
    leader_elect: bool = True
    lease_namespace: str = Field(default="kube-system", min_length=1)
    lease_name: str = Field(default="kallot-scheduler", min_length=1)
    lease_duration: float = Field(default=10.0, gt=0)
    renew_deadline: float = Field(default=7.0, gt=0)
    retry_period: float = Field(default=2.0, gt=0)
    acquire_period: float = Field(default=1.0, gt=0)
    max_clock_skew: float = 2.0

    @field_validator("lease_namespace", "lease_name")
    @classmethod
    def _object_name(cls, v: str, info: ValidationInfo) -> str:
        # What the API server would refuse when the Lease is first written, said up front.
        label = info.field_name == "lease_namespace"
        limit = 63 if label else 253
        part = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
        pattern = part if label else rf"{part}(\.{part})*"
        if len(v) > limit or not re.fullmatch(pattern, v):
            kind = "namespace name (a DNS label" if label else "Lease name (a DNS subdomain"
            chars = "'-'" if label else "'-' and '.'"
            raise ValueError(
                f"a {kind}: lowercase letters, digits and {chars}, at most {limit} characters)"
            )
        return v

    # kube.ops.leader's rule, checked here so a file or flag that breaks it fails before any
    # connection: retry period < renew deadline < lease duration.
    @field_validator("renew_deadline")
    @classmethod
    def _renew_within_lease(cls, v: float, info: ValidationInfo) -> float:
        lease = info.data.get("lease_duration")
        if lease is not None and not v < lease:
            raise ValueError(f"seconds < leaseDuration ({lease:g}): a leader renews in time")
        return v

    @field_validator("retry_period")
    @classmethod
    def _retry_within_renew(cls, v: float, info: ValidationInfo) -> float:
        renew = info.data.get("renew_deadline")
        if renew is not None and not v < renew:
            raise ValueError(f"seconds < renewDeadline ({renew:g}): a leader retries in time")
        return v


class SessionSizingDoc(_Doc):
    target_seconds: float = Field(default=0.25, gt=0)
    min_pods: int = Field(default=100, ge=1)
    max_pods: int = Field(default=0, ge=0)
    max_wall_seconds: float = Field(default=0.75, ge=0)

    @field_validator("max_pods")
    @classmethod
    def _bound(cls, v: int, info: ValidationInfo) -> int:
        least = info.data.get("min_pods")
        if v and least is not None and v < least:
            raise ValueError(f"0 (no bound) or at least minPods ({least})")
        return v


class QueueDoc(_Doc):
    """The scheduling queue's retry timing (kube.state.cache.CacheTuning), seconds."""

    retry_interval: float = Field(default=1.0, gt=0)
    flush_interval: float = Field(default=60.0, gt=0)
    backoff_initial: float = Field(default=1.0, gt=0)
    backoff_max: float = Field(default=30.0, gt=0)


class ActionsDoc(_Doc):
    """Which disruptive actions run when Queue objects exist. ``allocate`` (without Queues)
    and ``queue-allocate`` (with them) always run: they are how anything gets placed."""

    reclaim: bool = True
    preempt: bool = True
    max_attempts: int = Field(default=64, ge=1)
    # The longest a pod's kallot.io/min-runtime shields it from reclaim and preemption: with
    # Queues, a guarantee lent out comes back at the latest this long after the borrower
    # started (docs/security.md). At most the annotation's own cap (1 hour).
    max_min_runtime_seconds: float = Field(default=MIN_RUNTIME_MAX_S, ge=0, le=MIN_RUNTIME_MAX_S)


class SchedulerConfiguration(_Doc):
    """The whole document; every field has a default, so ``{apiVersion, kind}`` alone is the
    default scheduler (policy kallot)."""

    api_version: Literal["kallot.io/v1alpha1"]
    kind: Literal["KallotSchedulerConfiguration"]
    profiles: tuple[ProfileDoc, ...] = (ProfileDoc(),)
    leader_election: LeaderElection = Field(default_factory=LeaderElection)
    # kube-scheduler's pair: the secure port (TLS, delegated authn/authz for /metrics) on by
    # default, plain HTTP off ("" = off); docs/security.md.
    secure_address: str = "0.0.0.0:10259"
    metrics_address: str = ""
    tls_cert_file: str = ""  # "" (and no key): a self-signed certificate made at start
    tls_private_key_file: str = ""
    bind_workers: int = Field(default=16, ge=1)
    seed: int = Field(default=0, ge=0)
    resync_seconds: float = Field(default=600.0, gt=0)
    scheduled_events: bool = True
    tolerated_taints: tuple[str, ...] | None = None  # None: kube.translate's default set
    disruption_grace_seconds: float = 300.0  # negative: never set do-not-disrupt
    session_sizing: SessionSizingDoc = Field(default_factory=SessionSizingDoc)
    queue: QueueDoc = Field(default_factory=QueueDoc)
    actions: ActionsDoc = Field(default_factory=ActionsDoc)
    autoscale: AutoscaleDoc = Field(default_factory=AutoscaleDoc)  # docs/autoscaling.md

    @field_validator("metrics_address", "secure_address")
    @classmethod
    def _host_port(cls, v: str, info: ValidationInfo) -> str:
        secure = info.field_name == "secure_address"
        metrics_endpoint(v, example="0.0.0.0:10259" if secure else "127.0.0.1:10251")
        return v

    @field_validator("profiles")
    @classmethod
    def _one_profile(cls, v: tuple[ProfileDoc, ...]) -> tuple[ProfileDoc, ...]:
        if len(v) != 1:
            raise ValueError("exactly one profile (one kallot process runs one profile)")
        return v

    @property
    def profile(self) -> ProfileDoc:
        return self.profiles[0]


def metrics_endpoint(address: str, *, example: str = "0.0.0.0:10259") -> tuple[str, int] | None:
    """``host:port`` -> (host, port), ``""`` -> None (off); ValueError says what is wrong
    (port 0: any free one)."""
    if not address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"host:port, for example {example} ('' = off)")
    if int(port) > 65535:
        raise ValueError(f"a port from 0 to 65535 (not {port}; 0 = any free port)")
    return host.strip("[]") or "0.0.0.0", int(port)


# -- reading ----------------------------------------------------------------------------------


def parse(doc: object, *, where: str = "config") -> SchedulerConfiguration:
    """A parsed YAML document -> the validated configuration; ConfigError names the field."""
    if not isinstance(doc, Mapping):
        raise ConfigError(where, doc, f"a {KIND} mapping (apiVersion: {API_VERSION})")
    try:
        return SchedulerConfiguration.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = location(err)
        value = err.get("input") if err.get("type") != "missing" else None
        raise ConfigError(f"{where}: {loc}", value, expected(err, docs=DOCS)) from None


#: Where a command-line flag of ``kallot scheduler`` lands in the document: the flags are
#: written onto the file's values and the result validated by the same rules as the file.
FLAG_FIELDS: dict[str, tuple[str | int, ...]] = {
    "--scheduler-name": ("profiles", 0, "schedulerName"),
    "--leader-elect": ("leaderElection", "leaderElect"),
    "--lease-namespace": ("leaderElection", "leaseNamespace"),
    "--lease-name": ("leaderElection", "leaseName"),
    "--lease-duration": ("leaderElection", "leaseDuration"),
    "--renew-deadline": ("leaderElection", "renewDeadline"),
    "--retry-period": ("leaderElection", "retryPeriod"),
    "--acquire-period": ("leaderElection", "acquirePeriod"),
    "--max-clock-skew": ("leaderElection", "maxClockSkew"),
    "--metrics-address": ("metricsAddress",),
    "--secure-address": ("secureAddress",),
    "--tls-cert-file": ("tlsCertFile",),
    "--tls-private-key-file": ("tlsPrivateKeyFile",),
    "--bind-workers": ("bindWorkers",),
    "--session-target": ("sessionSizing", "targetSeconds"),
    "--min-session-pods": ("sessionSizing", "minPods"),
    "--max-session-pods": ("sessionSizing", "maxPods"),
    "--session-max-wall": ("sessionSizing", "maxWallSeconds"),
    "--seed": ("seed",),
    "--retry-interval": ("queue", "retryInterval"),
    "--resync": ("resyncSeconds",),
    "--scheduled-events": ("scheduledEvents",),
    "--tolerated-taint": ("toleratedTaints",),
    "--disruption-grace": ("disruptionGraceSeconds",),
}


def with_flags(
    config: SchedulerConfiguration, flags: Mapping[str, object], *, where: str = "config"
) -> SchedulerConfiguration:
    """``config`` with the values of the command-line ``flags`` (names in ``FLAG_FIELDS``)
    written over the file's, validated as one document: a flag is held to the rules its field
    has in the file. ConfigError names the flag when the value at fault is one."""
    if not flags:
        return config  # validated already
    doc: dict[str, Any] = config.model_dump(by_alias=True)
    for flag, value in flags.items():
        path = FLAG_FIELDS[flag]
        node: Any = doc
        for key in path[:-1]:
            node = node[key]
        # as the file spells it: a list, a path as text
        written = list(value) if isinstance(value, tuple) else value
        node[path[-1]] = str(written) if isinstance(written, Path) else written
    try:
        return SchedulerConfiguration.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err.get("loc", ()))
        for flag, value in flags.items():
            if loc[: len(FLAG_FIELDS[flag])] == FLAG_FIELDS[flag]:
                raise ConfigError(flag, value, expected(err, docs=DOCS)) from None
        for flag, value in flags.items():  # a rule between fields: the flag that broke it
            if len(loc) > 1 and FLAG_FIELDS[flag][:-1] == loc[:-1]:
                other = f"{location(err)} = {err.get('input')!r}"
                raise ConfigError(
                    flag, value, f"a value that {other} fits ({expected(err, docs=DOCS)})"
                ) from None
        raise ConfigError(
            f"{where}: {location(err)}", err.get("input"), expected(err, docs=DOCS)
        ) from None


def load(path: Path | str) -> SchedulerConfiguration:
    """Read and validate a configuration file."""
    path = Path(path)
    text = read_text(path, "--config")
    try:
        doc = _yaml(text)
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError("--config", str(path), f"YAML ({detail})") from None
    return parse(doc, where=path.name)


def _yaml(text: str) -> Any:
    """The YAML document in ``text``, read by libyaml when PyYAML has it (about a tenth of the
    pure-Python reader's time); on an error the pure-Python reader reads it again, so that the
    message is the one it gives."""
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        with contextlib.suppress(yaml.YAMLError):
            return yaml.load(text, Loader=fast)  # the safe loader, in C
    return yaml.safe_load(text)


def _profiles_dir() -> Traversable:
    return resources.files("kallot.config") / "profiles"


def shipped_names() -> tuple[str, ...]:
    """The policies that ship as configuration files (``config/profiles/NAME.yaml``)."""
    files = _profiles_dir().iterdir()
    return tuple(sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml")))


def shipped(name: str) -> SchedulerConfiguration:
    """The shipped configuration of policy ``name`` (what ``--policy NAME`` runs)."""
    names = shipped_names()
    if name not in names:
        raise ConfigError("--policy", name, f"one of {', '.join(names)}")
    return _shipped(name)


@functools.cache
def _shipped(name: str) -> SchedulerConfiguration:
    """Read and validated once per process: the document is frozen, and the scheduler's start-up
    and every simulator read it more than once (the default plugins are the default policy's)."""
    res = _profiles_dir() / f"{name}.yaml"
    return parse(_yaml(res.read_text()), where=f"{name}.yaml")


# -- the core Profile ---------------------------------------------------------------------------


def _merge(
    where: str,
    defaults: Sequence[tuple[str, int]],
    given: PluginSet | None,
    *,
    weighted: bool,
    registry: Registry,
) -> tuple[tuple[str, int], ...]:
    if given is None:
        return tuple(defaults)
    for key, refs in (("enabled", given.enabled), ("disabled", given.disabled)):
        for i, ref in enumerate(refs):
            if ref.name not in registry and not (key == "disabled" and ref.name == ALL):
                known = ", ".join(registry)
                raise ConfigError(f"{where}.{key}.{i}.name", ref.name, f"a plugin, one of {known}")
    off = {p.name for p in given.disabled}
    merged = [] if ALL in off else [(n, w) for n, w in defaults if n not in off]
    seen: set[str] = set()
    for i, ref in enumerate(given.enabled):
        field = f"{where}.enabled.{i}"
        if ref.name in seen:
            raise ConfigError(f"{field}.name", ref.name, "each plugin once per extension point")
        seen.add(ref.name)
        if ref.weight is not None and not weighted:
            raise ConfigError(f"{field}.weight", ref.weight, "no weight (only score plugins)")
        names = [n for n, _ in merged]
        if ref.name in names:
            at = names.index(ref.name)
            weight = merged[at][1] if ref.weight is None else ref.weight
            merged[at] = (ref.name, weight)
        else:
            merged.append((ref.name, 1 if ref.weight is None else ref.weight))
    return tuple(merged)


def to_profile(
    config: SchedulerConfiguration,
    *,
    name: str = "",
    registry: Registry | None = None,
    where: str = "config",
) -> Profile:
    """The core Profile the configuration's profile describes (plugin names checked against
    ``registry``, by default the core's built-in one). ``name``: the Profile's name (default:
    the profile's schedulerName, else the default policy's); ``where``: the file, for error
    messages."""
    return _profile(config, _defaults(), name=name, registry=registry, where=where)


@functools.cache
def _defaults() -> Profile:
    """The default plugins: the default policy's shipped file (which names every plugin of
    every point itself, so it is read against none)."""
    return _profile(
        shipped(DEFAULT_POLICY), Profile(name="", queue_sort="", filter=()), name=DEFAULT_POLICY
    )


def _profile(
    config: SchedulerConfiguration,
    base: Profile,
    *,
    name: str = "",
    registry: Registry | None = None,
    where: str = "config",
) -> Profile:
    doc = config.profile
    registry = registry or policies.builtin_registry()
    where = f"{where}: profiles.0.plugins"
    points: dict[str, tuple[tuple[str, int], ...]] = {}
    for point, (attr, _) in POINTS.items():
        value = getattr(base, attr)
        if attr == "queue_sort":
            defaults: list[tuple[str, int]] = [(value, 1)] if value else []
        elif attr == "score":
            defaults = list(value)
        else:
            defaults = [(n, 1) for n in value]
        given = getattr(doc.plugins, attr)
        points[point] = _merge(
            f"{where}.{point}", defaults, given, weighted=attr == "score", registry=registry
        )
    sort = points["queueSort"]
    if len(sort) != 1:
        raise ConfigError(f"{where}.queueSort", [n for n, _ in sort], "exactly one plugin")
    enabled = set(_names(points))
    mig = doc.mig if doc.mig is not None else (base.mig if base.mig in enabled else "")
    gang = doc.gang_topology
    if gang is None:
        gang = base.gang_topology if base.gang_topology in enabled else ""
    for field, value in (("mig", mig), ("gangTopology", gang)):
        if value and value not in enabled:
            raise ConfigError(
                f"{where.removesuffix('.plugins')}.{field}", value, "a plugin the profile enables"
            )
    return Profile(
        name=name or doc.scheduler_name or DEFAULT_POLICY,
        queue_sort=sort[0][0],
        mig=mig,
        gang_topology=gang,
        pre_filter=tuple(n for n, _ in points["preFilter"]),
        filter=tuple(n for n, _ in points["filter"]),
        score=points["score"],
        device_score=tuple(n for n, _ in points["deviceScore"]),
        args=_args(doc, set(_names(points)), where.removesuffix(".plugins")),
    )


def _names(points: Mapping[str, Sequence[tuple[str, int]]]) -> list[str]:
    return [n for plugins in points.values() for n, _ in plugins]


def _args(doc: ProfileDoc, enabled: set[str], where: str) -> dict[str, Mapping[str, Any]]:
    args: dict[str, Mapping[str, Any]] = {}
    for i, pc in enumerate(doc.plugin_config):
        field = f"{where}.pluginConfig.{i}.name"
        if pc.name not in enabled:
            raise ConfigError(field, pc.name, "a plugin the profile enables")
        if pc.name in args:
            raise ConfigError(field, pc.name, "one pluginConfig entry per plugin")
        args[pc.name] = dict(pc.args)
    return args


def build_framework(
    profile: Profile, registry: Registry | None = None, *, where: str = "config"
) -> Framework:
    """The profile's Framework, checked: plugin args as each plugin's factory validates them,
    and each plugin implements the extension points the profile lists it at."""
    try:
        framework = Framework(profile, registry or policies.builtin_registry())
    except ConfigError as exc:
        field = f"{where}: profiles.0.pluginConfig: {exc.field}"
        raise ConfigError(field, exc.value, exc.expected) from None
    for point, (attr, method) in POINTS.items():
        value = getattr(profile, attr)
        names = [value] if attr == "queue_sort" else [v[0] if attr == "score" else v for v in value]
        for name in names:
            if not callable(getattr(framework.plugins[name], method, None)):
                raise ConfigError(
                    f"{where}: profiles.0.plugins.{point}.enabled",
                    name,
                    f"a plugin with {method}() (a {point} plugin)",
                )
    return framework


def actions_factory(config: SchedulerConfiguration) -> Callable[[QueueTree], tuple[Action, ...]]:
    """The actions of a session over a queue tree: the core's ``queue_actions`` in their order,
    without the disruptive ones the file turns off."""
    settings = config.actions
    off = {n for n, on in (("reclaim", settings.reclaim), ("preempt", settings.preempt)) if not on}
    attempts = settings.max_attempts
    cap = settings.max_min_runtime_seconds

    def build(tree: QueueTree) -> tuple[Action, ...]:
        # Here, not at the top: the queue actions (preempt, reclaim, quota, the queueing
        # ledger) run once Queue objects exist; ``kallot sim openb`` reads this module and
        # never runs them, and the live scheduler's start-up does not wait for them.
        from kallot.core.actions.queue import queue_actions

        return tuple(
            a
            for a in queue_actions(tree, max_attempts=attempts, max_min_runtime_s=cap)
            if a.name not in off
        )

    return build
