"""How many pending pods the live scheduler's next session takes (the controller asks before
each session, and tells it how long the session took).

The model: a session of n pods takes ``a + b * n`` seconds of CPU (input, core, assume and
hand-off to the binder; the controller measures the CPU time of the threads doing that work,
not wall time, which binds and watch events running alongside on the same interpreter inflate
by a varying amount): ``a`` is its fixed cost (the snapshot copy, the passes over the cache, the core's
per-session set-up), ``b`` the cost of one more pod. Both are fitted to the recent sessions
(least squares, older sessions weighing less and less).

The rule: **a session lasts about ``target_s`` seconds**, n = (target_s - a) / b, **unless the
fixed cost is more than half of that**; then the session is made long enough that the fixed
cost is half of it, n = a / b, so throughput never falls below half of what unbounded sessions
would give. The size is kept between ``min_pods`` and ``max_pods`` (0: no upper bound), and
at most doubles the largest session measured (the fit says little far beyond its points). The
first session has no measurement and takes ``min_pods``, so the first binds go out as soon as
a small session is done; until sessions of two sizes were measured, the whole cost counts as
per pod (an undersize when part of it is fixed) and the size at least doubles, so that the
next session gives the fit a second point.

Keeping the binder fed: after each session the controller tells the sizer how many binds
completed per second while it ran (wall clock) and whether the binder had run dry by its end.
The next session takes at least the pods the binder completes in one such session and a
quarter, and at least twice the last one when the binder ran dry, so that the binds of one
session cover the next session's decision time (on a loaded machine the wall time of a session
is several times its CPU time, and sessions sized by CPU alone left the binder idle for
seconds); but never more than twice the size the CPU rule gives: when it is the cost per pod
that makes sessions slow (it grows as the cluster fills), a larger session does not decide
faster, it only makes a longer pause before its binds (a floor without this bound fed on
itself, up to a 2,000-pod session and an 89 s pause on a nearly full cluster).

Bounding the pause: while the binder runs dry during sessions (``fed``'s ``dry``: the sessions,
not the binds, are the limit), a session's wall time is also kept under ``max_wall_s`` (0.75 s
by default); with binds still queued at a session's end a longer session makes no pause:
the size is cut to what the fitted cost, times the recent ratio of wall time to CPU time
(``observe``'s ``wall_s``: the machine's load and the binds sharing the interpreter), says fits
in it, the floor above included, but never below ``min_pods`` nor below ``a / b`` (where the
fixed cost is half the session: a tighter cut would make sessions mostly overhead; at 50,000
pending pods the fixed cost was 0.23 s and sessions cut to 100 pods drained at a third of
the rate). When sessions, not binds, are
the limit (the cost per pod grows as the cluster fills), the binder runs dry for about the
length of a session, so a shorter session is a shorter time without a bind; with the fixed
cost small, the throughput lost to more sessions is small too.

Why it serves latency and throughput together: binds run while the next session decides (the
controller starts it as soon as the previous one's placements are handed to the binder), so a
queued pod waits for at most the session in progress plus its own, about ``2 * target_s``,
whatever the backlog; and the fixed cost is paid once per ``target_s`` of work rather than once
per handful of pods. Pods outside gangs are cut; a gang is never split (the cache keeps it
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
    memory: float = 0.7  # weight of the previous sessions in the fit, per new session
    max_wall_s: float = 0.75  # a session's wall time at most about this (0: no bound)

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
        if self.max_wall_s < 0:
            raise ConfigError("--session-max-wall", self.max_wall_s, "0 (no bound) or seconds > 0")
        if not 0 <= self.memory < 1:
            raise ConfigError("session size memory", self.memory, "a number in [0, 1)")


class SessionSizer:
    """The size of the next session, from how long the previous ones took."""

    def __init__(self, sizing: SessionSizing) -> None:
        self.sizing = sizing
        # Exponentially weighted sums for the least-squares fit of t = a + b * n.
        self._w = 0.0
        self._n = 0.0
        self._nn = 0.0
        self._t = 0.0
        self._nt = 0.0
        self._fit: tuple[float, float] | None = None
        self._largest = 0  # the largest session measured
        self._last = 0  # the last session's size
        self._floor = 0  # at least this many: what keeps the binder fed (``fed``)
        self._wall_per_cpu = 0.0  # recent sessions' wall time per CPU second (``observe``)
        self._dry = False  # the binder ran dry during the last session (``fed``)

    def cost(self) -> tuple[float, float] | None:
        """The fitted (a, b): fixed seconds per session, seconds per pod; None until sessions
        of different sizes were measured. While the recent sizes are too alike to tell the two
        apart (a steady backlog), the last fit stands."""
        if self._w == 0:
            return self._fit
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var_n = self._nn / self._w - mean_n * mean_n
        if var_n > 1e-4 * mean_n * mean_n:
            b = (self._nt / self._w - mean_n * mean_t) / var_n
            a = mean_t - b * mean_n
            # Noise (a loaded machine) can tip the line through or below the origin: then the
            # whole cost counts as per pod.
            self._fit = (a, b) if b > 0 and a >= 0 else (0.0, mean_t / mean_n)
        return self._fit

    def next_size(self) -> int:
        s = self.sizing
        fitted = self.cost()
        if fitted is not None:
            a, b = fitted
            # A line fitted to the recent sizes says little far beyond them: at most double.
            size = max(s.min_pods, min(int(max(s.target_s - a, a) / b), 2 * self._largest))
        elif self._w == 0:
            size = s.min_pods  # nothing measured: a small first session, the first binds soon
        else:
            # One size seen so far: count the whole cost per pod (an undersize when part of
            # it is fixed), and at least double, so that the next session is a second point.
            mean_n, mean_t = self._n / self._w, self._t / self._w
            size = max(s.min_pods, int(s.target_s * mean_n / mean_t), int(2 * mean_n))
        # Fed, but at most twice the CPU rule's size: when the cost per pod is what makes a
        # session slow (a nearly full cluster), a bigger session is only a longer pause.
        size = max(size, min(self._floor, 2 * size))
        if s.max_wall_s and self._dry and self._wall_per_cpu > 0 and fitted is not None:
            # Only with a fit: until sessions of two sizes were measured, the whole cost counts
            # per pod, and a cut on that would keep every session at the same size, never
            # giving the fit its second point.
            a, b = fitted
            if b > 0:
                # Never below the size whose fixed cost is half the session (the CPU rule's
                # own floor): with a large fixed cost (tens of thousands of pods pending) a
                # tighter cut would make sessions mostly overhead.
                fits = max(int((s.max_wall_s / self._wall_per_cpu - a) / b), int(a / b))
                size = max(s.min_pods, min(size, fits))
        return min(size, s.max_pods) if s.max_pods else size

    def fed(self, binds_per_s: float, session_s: float, *, dry: bool) -> None:
        """While the last session ran (``session_s`` seconds, wall clock) the binder completed
        ``binds_per_s``; ``dry``: it had nothing left to bind by the session's end."""
        floor = int(1.25 * binds_per_s * session_s)
        self._dry = dry
        if dry:
            floor = max(floor, 2 * self._last)
        self._floor = floor

    def observe(self, pods: int, seconds: float, wall_s: float = 0.0) -> None:
        """A session of ``pods`` pods took ``seconds`` of CPU (and ``wall_s`` of wall time, if
        known). Sessions smaller than the minimum are not counted: a trickle of single pods
        says little about the cost of a backlog."""
        self._last = pods
        if pods < self.sizing.min_pods or seconds <= 0:
            return
        if wall_s > 0:
            ratio = max(1.0, wall_s / seconds)
            k = self.sizing.memory
            self._wall_per_cpu = (
                ratio if not self._wall_per_cpu else k * self._wall_per_cpu + (1 - k) * ratio
            )
        self._largest = max(self._largest, pods)
        k = self.sizing.memory
        self._w = k * self._w + 1
        self._n = k * self._n + pods
        self._nn = k * self._nn + pods * pods
        self._t = k * self._t + seconds
        self._nt = k * self._nt + pods * seconds
