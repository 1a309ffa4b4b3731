"""How many pending pods the live scheduler's next session takes (the controller asks before
each session, and tells it how long the session took).

The rule: **a session lasts about ``target_s`` seconds.** The size is the core's measured rate
(pods decided per second of a whole session: input, core, assume and hand-off to the binder; an
exponentially weighted average over the last sessions) times ``target_s``, kept between
``min_pods`` and ``max_pods`` (0: no upper bound). The first session has no measurement and
takes ``min_pods``, so the first binds go out as soon as the first small session is done.

Why it serves latency and throughput together: binds run while the next session decides
(the controller starts it as soon as the previous one's placements are handed to the binder),
so a queued pod waits for at most the session in progress plus its own, about ``2 * target_s``,
whatever the backlog; and each session's fixed cost (the snapshot copy, the pass over the
cache) is paid once per ``target_s`` of work instead of once per handful of pods. When the
measured rate is dominated by the fixed cost (small sessions), the size grows until the session
does take ``target_s``: a session of n pods costs ``a + b * n``, and the rule settles where
``a + b * n = target_s``. Pods outside gangs are cut; a gang is never split (the cache keeps it
whole), so a session with a large gang can be longer.
"""

from __future__ import annotations

from dataclasses import dataclass

from kallot.core.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionSizing:
    """The rule's settings (see the module docstring)."""

    target_s: float = 0.25
    min_pods: int = 100
    max_pods: int = 0  # 0: no upper bound
    smoothing: float = 0.5  # weight of the latest session in the rate estimate

    def __post_init__(self) -> None:
        if not self.target_s > 0:
            raise ConfigError("--session-target", self.target_s, "a positive number of seconds")
        if self.min_pods < 1:
            raise ConfigError("--min-session-pods", self.min_pods, "at least 1")
        if self.max_pods < 0 or (self.max_pods and self.max_pods < self.min_pods):
            raise ConfigError(
                "--max-session-pods",
                self.max_pods,
                f"0 (no bound) or at least --min-session-pods ({self.min_pods})",
            )
        if not 0 < self.smoothing <= 1:
            raise ConfigError("session size smoothing", self.smoothing, "a number in (0, 1]")


class SessionSizer:
    """The size of the next session, from how long the previous ones took."""

    def __init__(self, sizing: SessionSizing) -> None:
        self.sizing = sizing
        #: pods per second of session, smoothed; None until a session was measured
        self.rate: float | None = None

    def next_size(self) -> int:
        s = self.sizing
        if self.rate is None:
            return s.min_pods
        size = max(s.min_pods, int(self.rate * s.target_s))
        return min(size, s.max_pods) if s.max_pods else size

    def observe(self, pods: int, seconds: float) -> None:
        """A session of ``pods`` pods took ``seconds``. Sessions smaller than the minimum say
        little about the rate (their time is mostly fixed cost) and are not counted, so a
        trickle of single pods does not shrink the sessions of the next backlog."""
        if pods < self.sizing.min_pods or seconds <= 0:
            return
        rate = pods / seconds
        if self.rate is None:
            self.rate = rate
        else:
            w = self.sizing.smoothing
            self.rate = w * rate + (1 - w) * self.rate
