"""A discrete-event simulator that runs the live scheduler's policies.

Jobs arrive, start, are resized and end as events on a simulated clock (no
sleeping). Every batch of events at one instant is followed by one call of
the policy's ``decide`` with the same views the live scheduler builds, and
its decisions are applied the same way: a start takes free nodes at once; a
grow takes them at once and the job stalls for the reconfiguration cost; a
shrink stalls the job too and its nodes come back when the reconfiguration
is over (until then they are "in transit", as in the live scheduler).

A job's run time on k nodes comes from its model: ``rho`` (run time at the
requested size times ``(pref / k) ** (1 - rho)``) or Amdahl's law with the
job's serial fraction. A malleable job's progress is kept as the fraction of
its work left, so a resize changes the speed of the rest. Policies see only
the user's estimate, scaled the same way, never the real run time.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from .._model import Grow, Start
from ..engine import Engine, Tracked
from ..policies.planning import Policy
from ..stats import TAU, JobTimes, summarize, summarize_by_class  # noqa: F401 (TAU: where it was)

__all__ = ["Reconfig", "Simulator", "SimResult", "runtime_on"]

log = logging.getLogger("apgas_scheduler.sim.simulator")

MAX_PASSES_PER_INSTANT = 1000


@dataclasses.dataclass(frozen=True)
class Reconfig:
    """Cost in seconds of going from ``old`` to ``new`` nodes:
    ``alpha * dN + beta / N + b * dN`` (data redistribution, a per-size term
    and the cost of starting or stopping processes), as in the MEBF study."""

    alpha: float = 0.0
    beta: float = 0.0
    b: float = 0.0

    def cost(self, old: int, new: int) -> float:
        if old == new:
            return 0.0
        change = abs(new - old)
        return self.alpha * change + self.beta / new + self.b * change

    def __call__(self, job: Any, old: int, new: int) -> float:
        """The same cost as a policy's model (``MEBF(reconfig_cost=...)``), so
        that its feasibility test counts what the simulator charges."""
        return self.cost(old, new)


def runtime_on(job: Any, k: int, seconds: float, model: str = "rho") -> float:
    """``seconds`` (a time at the job's requested size) scaled to ``k`` nodes."""
    pref = job.preferred or job.max_nodes
    if model == "amdahl":
        s = job.serial or 0.0
        return seconds * (s + (1 - s) / k) / (s + (1 - s) / pref)
    return seconds * (pref / k) ** (1.0 - job.rho)


class _State:
    """The simulator's side of a job; the engine's record is ``track``."""

    __slots__ = ("job", "track", "nodes", "left", "anchor", "version", "reconfigs",
                 "reconfig_seconds")

    def __init__(self, job: Any, track: Tracked) -> None:
        self.job, self.track = job, track
        self.nodes = 0
        self.left = 1.0  # fraction of the work still to do, as of `anchor`
        self.anchor = 0.0  # progress resumes here (after a reconfiguration)
        self.version = 0
        self.reconfigs = 0
        self.reconfig_seconds = 0.0


@dataclasses.dataclass
class SimResult:
    """``metrics``: the run's figures (``stats.summarize``), with ``by_class``
    the same per job class present (``stats.summarize_by_class``, over every
    job submitted and not left out); a run in which no job ended has only
    ``jobs`` (0) and ``rejected``. ``jobs``: id -> submit, start, end, reconfigs."""

    metrics: dict[str, Any]
    jobs: dict[int, dict[str, Any]]
    decisions: list[tuple[float, Any]]
    events: list[dict[str, Any]]
    timeline: list[tuple[float, int]]  # (time, busy nodes) steps


class Simulator:
    """Simulate ``nodes`` nodes under ``policy``; ``run(jobs)`` returns the result."""

    def __init__(self, nodes: int, policy: Policy, *, reconfig: Reconfig = Reconfig(),
                 model: str = "rho", interval: float | None = None,
                 record_events: bool = False) -> None:
        if nodes < 1:
            raise ValueError(f"the cluster needs at least one node, got {nodes}")
        if model not in ("rho", "amdahl"):
            raise ValueError(f"model must be 'rho' or 'amdahl', got {model!r}")
        self.total = nodes
        self.policy = policy
        self.reconfig = reconfig
        self.model = model
        self.interval = interval
        self.record = record_events

    def run(self, jobs: Sequence[Any]) -> SimResult:
        self._heap: list[tuple[float, int, str, int, int]] = []
        self._seq = itertools.count()
        self._states: dict[int, _State] = {}
        self.engine: Engine[int] = Engine(range(self.total), self.policy, log)
        self._busy = 0  # nodes held by jobs, in transit included
        self._busy_area = 0.0
        self._clock = 0.0
        self.events: list[dict[str, Any]] = []
        self.decisions: list[tuple[float, Any]] = []
        self.timeline: list[tuple[float, int]] = []
        rejected = 0
        if self.record:
            self._event(0.0, "pool", nodes=[f"n{i}" for i in range(self.total)])
        for job in sorted(jobs, key=lambda j: (j.submit, j.id)):
            if job.min_nodes > self.total:
                rejected += 1
                log.warning("job %s needs %d nodes, the cluster has %d: left out",
                            job.id, job.min_nodes, self.total)
                continue
            self._push(job.submit, "submit", job.id)
        if self.interval:
            first = self._heap[0][0] if self._heap else 0.0
            self._push(first + self.interval, "tick", -1)
        first_submit = self._heap[0][0] if self._heap else 0.0
        job_by_id = {j.id: j for j in jobs}
        while self._heap:
            now = self._heap[0][0]
            self._advance(now)
            while self._heap and self._heap[0][0] == now:
                _, _, kind, jid, version = heapq.heappop(self._heap)
                self._handle(now, kind, jid, version, job_by_id)
            if not self.engine.queue and not self.engine.running and all(k == "tick" for _, _, k, _, _ in self._heap):
                self._note(now)
                break
            self._decide(now)
            self._note(now)
        return self._result(first_submit, rejected)

    # -- events ------------------------------------------------------------------------
    def _push(self, t: float, kind: str, jid: int, version: int = 0) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, jid, version))

    def _event(self, t: float, kind: str, **fields: Any) -> None:
        self.events.append({"t": t, "event": kind, **fields})

    def _note(self, now: float) -> None:
        """The busy-node step function, for plots of utilization over time."""
        if not self.timeline or self.timeline[-1][1] != self._busy:
            self.timeline.append((now, self._busy))

    def _advance(self, now: float) -> None:
        self._busy_area += self._busy * (now - self._clock)
        self._clock = now

    def _handle(self, now: float, kind: str, jid: int, version: int, jobs: dict[int, Any]) -> None:
        if kind == "tick":
            if self.engine.queue or self.engine.running or len(self._heap) > 0:
                self._push(now + self.interval, "tick", -1)  # type: ignore[operator]
            return
        if kind == "submit":
            job = jobs[jid]
            track = Tracked(job.id, job.cls, job.min_nodes, job.max_nodes, job.estimate,
                            job.submit, preferred=job.preferred, rho=job.rho,
                            serial=(job.serial or 0.0) if self.model == "amdahl" else None)
            self._states[jid] = _State(job, track)
            self.engine.submit(track)
            if self.record:
                self._event(now, "submit", job=jid, name=job.name or str(jid), **{"class": job.cls})
            return
        state = self._states[jid]
        track = state.track
        if track.end is not None:
            return  # its nodes all came back when it ended
        if kind == "end":
            if version != state.version:
                return  # an end that a resize moved
            self._busy -= track.held
            self.engine.end(track, "done", now)
            state.nodes = 0
            if self.record:
                self._event(now, "end", job=jid, state="done", reason="")
        elif kind == "reconfigured":
            self.engine.finish_grow(track, list(track.reserved), True)
        elif kind.startswith("release:"):
            count = int(kind.split(":")[1])  # the most recently taken nodes go back
            freed = self.engine.finish_shrink(track, count, track.nodes[len(track.nodes) - count:])
            self._busy -= len(freed)
            if self.record:
                self._event(now, "shrink", job=jid, nodes=[f"n{i}" for i in freed],
                            duration=self.reconfig.cost(state.nodes + len(freed), state.nodes))

    # -- the policy ----------------------------------------------------------------------
    def _decide(self, now: float) -> None:
        engine = self.engine
        for _ in range(MAX_PASSES_PER_INSTANT):
            decisions = engine.decide(now)
            if not decisions:
                return
            applied = False
            for d in decisions:
                self.decisions.append((now, d))
                if engine.admit(d, now):
                    self._apply(now, d)
                    applied = True
            if not applied or not any(isinstance(d, Start) for d in decisions):
                return  # resizes complete later; a new pass then
        log.warning("policy %s kept deciding at t=%.1f; moving on", self.policy.name, now)

    def _apply(self, now: float, d: Any) -> None:
        """Carry out a decision the engine admitted."""
        state = self._states[d.job]
        track = state.track
        if isinstance(d, Start):
            names = self.engine.start(track, d.nodes, now)
            track.ready = track.malleable  # simulated jobs register at once (touched below)
            self._busy += d.nodes
            state.nodes, state.anchor = d.nodes, now
            self._schedule_end(state, now)
            if self.record:
                self._event(now, "start", job=d.job, nodes=[f"n{i}" for i in names])
            return
        old = state.nodes
        new = old + d.nodes if isinstance(d, Grow) else old - d.nodes
        self._settle(state, now)
        cost = self.reconfig.cost(old, new)
        state.nodes, state.anchor = new, now + cost
        hold = state.anchor > now  # reconfiguring: no other order until it is over
        state.reconfigs += 1
        state.reconfig_seconds += cost
        if isinstance(d, Grow):
            added, _ = self.engine.begin_grow(track, d.nodes, now, hold)
            self._busy += d.nodes
            if self.record:
                self._event(now, "grow", job=d.job, nodes=[f"n{i}" for i in added], duration=cost)
            self._push(now + cost, "reconfigured", d.job)
        else:
            self.engine.begin_shrink(track, d.nodes, now, hold)
            self._push(now + cost, f"release:{d.nodes}", d.job)
        self._schedule_end(state, now)

    def _settle(self, state: _State, now: float) -> None:
        """Bring the work left up to ``now`` at the current size."""
        if now > state.anchor:
            state.left -= (now - state.anchor) / runtime_on(state.job, state.nodes,
                                                            state.job.runtime, self.model)
            state.left = max(state.left, 0.0)
            state.anchor = now

    def _schedule_end(self, state: _State, now: float) -> None:
        state.version += 1
        real = runtime_on(state.job, state.nodes, state.job.runtime, self.model)
        self._push(state.anchor + state.left * real, "end", state.job.id, state.version)
        # what policies see: the estimate scaled to the current size, no real run time
        estimate = runtime_on(state.job, state.nodes, state.job.estimate, self.model)
        state.track.expected_end = state.anchor + state.left * estimate
        state.track.cached = None

    # -- results ---------------------------------------------------------------------------
    def _result(self, first_submit: float, rejected: int) -> SimResult:
        states = list(self._states.values())
        records = {s.job.id: {"submit": s.job.submit, "start": s.track.start, "end": s.track.end,
                              "reconfigs": s.reconfigs} for s in states}
        times = [JobTimes(s.job.submit, s.track.start, s.track.end, cls=s.job.cls,
                          reconfigs=s.reconfigs) for s in states]
        done = [s for s in states if s.track.end is not None]
        if not done:
            metrics: dict[str, Any] = {"jobs": 0, "rejected": rejected}
            return SimResult(metrics, records, self.decisions, self.events, self.timeline)
        summary = summarize(times, used=self._busy_area, nodes=self.total)
        metrics = {
            "jobs": len(done), "rejected": rejected, "nodes": self.total,
            "policy": self.policy.name, **summary,
            "reconfigurations": sum(s.reconfigs for s in done),
            "reconfiguration_seconds": sum(s.reconfig_seconds for s in done),
            "by_class": summarize_by_class(times),
        }
        return SimResult(metrics, records, self.decisions, self.events, self.timeline)
