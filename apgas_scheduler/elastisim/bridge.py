"""One of our policies as ElastiSim's scheduling algorithm (``apgas-scheduler elastisim``).

ElastiSim (TU Darmstadt, on SimGrid) simulates a batch system and leaves every
decision to an external algorithm, over a ZeroMQ PAIR socket that it binds (its
``zmq_url``). At each invocation it sends ``{"code": 0xFFEC4400, "time",
"invocation_type", "job_id", "jobs": [...], "nodes": [...], "pfs_*"}`` with every job
it ever received, and waits for ``{"code": 0xFFEC4401, "jobs": [{"id",
"assigned_node_ids", "assigned_num_gpus_per_node", "kill_flag"}]}`` naming the jobs
whose node set changes; ``0xFFEC44FF`` ends the run. This module connects to it,
turns each invocation into the state our engine holds (:class:`Engine`, built
afresh each time, since ElastiSim's word is the truth), lets the policy decide,
checks each decision as the engine does (a refused one is logged, counted and not
sent) and answers with node sets.

What ElastiSim accepts, from its source (``SchedulingInterface::handleSchedule``,
``Job::assignNode``/``updateState``/``checkConfigurationValidity``, ``Node::expectJob``):

* a listed job's nodes are replaced by the list; a pending job then starts on
  them; a running *malleable* job whose list differs from the nodes it runs on (a
  vector: order counts) gets a reconfiguration at its next scheduling point, so
  grows append free nodes and shrinks drop the job's last ones, keeping the order;
  a running rigid or moldable job must never be listed (ElastiSim aborts);
* the count must lie in ``[num_nodes_min, num_nodes_max]`` and, for non-rigid jobs,
  ``assigned_num_gpus_per_node`` in its GPU range;
* a node given to a grow must be free: neither running another job (not yet
  deallocated after an end counts) nor expected by one. A node is therefore free
  here only if ElastiSim calls it free, lists no job on it, and no active job holds
  it; the busy nodes no active job holds are on their way back (a shrink's, an
  ended job's), which policies count as in transit;
* a job ``PENDING_RECONFIGURATION`` or ``IN_RECONFIGURATION`` lists its new set
  already and takes no other order until it runs again: it is not ``resizable``.

Run times. A policy wants a job's run time at its preferred size (``walltime``).
ElastiSim's ``walltime`` is used when positive (it kills the job there). Without
one, the job's arguments give it, as the Kassel strategies' extension reads them
(``MalleableJobScheduling``, ``ElastiSimExtension.get_estimated_runtime``): an
argument ``runtime`` in seconds, else ``flops`` (times ``iterations`` if given)
under the application model of their inputs and generator, where each node
computes ``flops * ((1 - p) + p / n)`` with ``p`` the ``parallel_percentage``:
that over ``node_speed`` (flop/s of a node, which the protocol does not carry) is
the run time on ``n`` nodes, and ``serial = 1 - p`` makes the views'
``runtime_on`` follow the same Amdahl law. Otherwise ``default_runtime``.
``num_nodes_pref`` is the preferred size (as theirs; without it, the maximum, as
ours). A running job's expected end is tracked across invocations from the share
of its work done at each size, so that a resized job's end moves with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from .._model import Grow, JobView, Start
from ..engine import Engine, Tracked
from ..policies import Policy, get_policy, policy_names

__all__ = ["DEFAULT_URL", "MAX_MESSAGE", "NODE_SPEED", "INVOKE_SCHEDULING", "SCHEDULED",
           "FINALIZE", "ProtocolError", "Bridge", "serve", "add_arguments", "main", "HELP",
           "DESCRIPTION"]

log = logging.getLogger("apgas_scheduler.elastisim")

DEFAULT_URL = "ipc:///tmp/elastisim.ipc"  # ElastiSim's and elastisim_python's default
MAX_MESSAGE = 256 << 20  # an invocation lists every job ever submitted: ~0.4 kB each
NODE_SPEED = 1e12  # flop/s of a node in the Kassel inputs' crossbar.xml
INVOKE_SCHEDULING, SCHEDULED, FINALIZE = 0xFFEC4400, 0xFFEC4401, 0xFFEC44FF
_RIGID, _MOLDABLE, _MALLEABLE = 0, 1, 2
_CLASSES = {_RIGID: "rigid", _MOLDABLE: "moldable", _MALLEABLE: "malleable"}
_PENDING, _PENDING_KILL, _RUNNING = 1, 3, 4
_ACTIVE = {2, _PENDING_KILL, _RUNNING, 5, 6}  # PENDING_ALLOCATION ... IN_RECONFIGURATION
_NODE_FREE = 0
_TRANSIT = -1  # the engine's holder of the nodes on their way back


class ProtocolError(ValueError):
    """ElastiSim sent what the protocol does not allow, or went away."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _get(obj: Mapping[str, Any], key: str, kind: str, where: str) -> Any:
    """``obj[key]`` if it is of ``kind`` (int, number, list, dict), else a ProtocolError
    that names the value."""
    if key not in obj:
        raise ProtocolError(f"{where} has no {key!r}")
    value = obj[key]
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "number": isinstance(value, int | float) and not isinstance(value, bool)
          and math.isfinite(value),
          "list": isinstance(value, list), "dict": isinstance(value, dict)}[kind]
    if not ok:
        raise ProtocolError(f"{where}: {key!r} is {_show(value)}, not {'an' if kind == 'int' else 'a'} "
                            f"{'integer' if kind == 'int' else kind}")
    return value


def _in(value: int, allowed: range | set[int], key: str, where: str) -> int:
    if value not in allowed:
        raise ProtocolError(f"{where}: {key!r} is {value}, not one of {sorted(allowed)}")
    return value


@dataclasses.dataclass
class _Job:
    """A job of an invocation, checked (``Job::toJson``)."""

    id: int
    type: int
    state: int
    walltime: float
    low: int
    high: int
    gpus: tuple[int, int]  # its GPUs per node: the range (rigid: the number twice)
    submit: float
    start: float
    nodes: list[int]
    gpus_given: int
    args: dict[str, Any]

    @classmethod
    def parse(cls, raw: Any, where: str) -> _Job:
        if not isinstance(raw, dict):
            raise ProtocolError(f"{where} is {_show(raw)}, not an object")
        jid = _get(raw, "id", "int", where)
        if jid < 0:
            raise ProtocolError(f"{where}: 'id' is {jid}, not a job id (0, 1, ...)")
        where = f"{where} (job {jid})"
        kind = _in(_get(raw, "type", "int", where), range(3), "type", where)
        if kind == _RIGID:
            low = high = _get(raw, "num_nodes", "int", where)
            gpus = (_get(raw, "num_gpus_per_node", "int", where),) * 2
        else:
            low, high = _get(raw, "num_nodes_min", "int", where), _get(raw, "num_nodes_max", "int", where)
            gpus = (_get(raw, "num_gpus_per_node_min", "int", where),
                    _get(raw, "num_gpus_per_node_max", "int", where))
        if not 1 <= low <= high:
            raise ProtocolError(f"{where}: its nodes [{low}, {high}] are no range of at least 1")
        nodes = _get(raw, "assigned_nodes", "list", where)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in nodes):
            raise ProtocolError(f"{where}: 'assigned_nodes' is {_show(nodes)}, not a list of node ids")
        args = raw.get("arguments", {})
        if not isinstance(args, dict):
            raise ProtocolError(f"{where}: 'arguments' is {_show(args)}, not an object")
        return cls(jid, kind, _in(_get(raw, "state", "int", where), range(9), "state", where),
                   _get(raw, "walltime", "number", where), low, high, gpus,
                   _get(raw, "submit_time", "number", where), _get(raw, "start_time", "number", where),
                   list(nodes), _get(raw, "assigned_num_gpus_per_node", "int", where), args)

    def number(self, key: str) -> float | None:
        """The argument ``key`` as a number (ElastiSim sends arguments as strings)."""
        if key not in self.args:
            return None
        try:
            value = float(self.args[key])
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            raise ProtocolError(f"job {self.id}: argument {key!r} is {_show(self.args[key])}, "
                                "not a number")
        return value


class Bridge:
    """The policy's side of the protocol, without the socket: :meth:`handle` takes a
    message and returns the answer (None at finalize). It keeps what ElastiSim does
    not say: the policy (its promises, say), each job's last resize and progress."""

    def __init__(self, policy: Policy, *, node_speed: float = NODE_SPEED,
                 default_runtime: float = 3600.0, log: logging.Logger = log) -> None:
        if not node_speed > 0 or not default_runtime > 0:
            raise ValueError(f"node_speed and default_runtime must be > 0, got {node_speed} "
                             f"and {default_runtime}")
        self.policy, self.node_speed, self.default_runtime, self.log = (
            policy, node_speed, default_runtime, log)
        self.stats: dict[str, Any] = {"policy": policy.name or type(policy).__name__,
                                      "invocations": 0,
                                      "decisions": {"start": 0, "grow": 0, "shrink": 0},
                                      "refused": 0, "finalized": False}
        self._resized: dict[int, float] = {}  # job -> time of its last grow or shrink
        self._progress: dict[int, tuple[float, float, int]] = {}  # job -> (when, work left, size)
        self._warned: set[int] = set()

    def handle(self, raw: bytes) -> dict[str, Any] | None:
        """The answer to one message of ElastiSim, or None after its finalize."""
        try:
            message = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as e:
            raise ProtocolError(f"a message that is not JSON ({e}): {_show(raw[:200])}") from None
        if not isinstance(message, dict):
            raise ProtocolError(f"a message that is not an object: {_show(message)}")
        code = _get(message, "code", "int", "the message")
        if code == FINALIZE:
            self.stats["finalized"] = True
            return None
        if code != INVOKE_SCHEDULING:
            raise ProtocolError(f"a message with code {code:#x}, neither {INVOKE_SCHEDULING:#x} "
                                f"(invoke scheduling) nor {FINALIZE:#x} (finalize)")
        return {"code": SCHEDULED, "jobs": self.schedule(message)}

    def schedule(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """The jobs to change for one invocation (ZMQ_INVOKE_SCHEDULING)."""
        where = "the invocation"
        now = _get(message, "time", "number", where)
        kind = _in(_get(message, "invocation_type", "int", where), range(5), "invocation_type", where)
        if kind != 0:
            _get(message, "job_id", "int", where)
        jobs = [_Job.parse(j, f"jobs[{i}]") for i, j in enumerate(_get(message, "jobs", "list", where))]
        nodes = self._nodes(_get(message, "nodes", "list", where))
        if len({j.id for j in jobs}) != len(jobs):
            raise ProtocolError(f"{where} lists a job id twice")
        self.stats["invocations"] += 1
        engine, tracked = self._engine(now, jobs, nodes)
        byid = {j.id: j for j in jobs}
        changed: dict[int, list[int]] = {}
        for d in engine.decide(now):
            if not engine.admit(d, now):
                self.stats["refused"] += 1
                continue
            job = tracked[d.job]
            if isinstance(d, Start):
                changed[d.job] = engine.start(job, d.nodes, now)
            elif isinstance(d, Grow):
                changed[d.job] = list(job.nodes) + engine.begin_grow(job, d.nodes, now)[0]
            else:
                engine.begin_shrink(job, d.nodes, now)
                changed[d.job] = list(job.nodes)[:-d.nodes]
            if not isinstance(d, Start):
                self._resized[d.job] = now
            self.stats["decisions"][type(d).__name__.lower()] += 1
        answer = []
        for jid, ids in changed.items():
            given, gpus = byid[jid], byid[jid].gpus_given
            if given.state == _PENDING:  # what every node has, within the job's range
                have = min((nodes[n][1] for n in ids), default=0)
                low, high = given.gpus
                gpus = low if given.type == _RIGID else max(low, min(high, have))
            answer.append({"id": jid, "assigned_node_ids": ids, "assigned_num_gpus_per_node": gpus,
                           "kill_flag": False})
        if answer:
            self.log.debug("t=%.1f: %s", now, answer)
        return answer

    @staticmethod
    def _nodes(raw: list[Any]) -> dict[int, tuple[bool, int]]:
        """{node id: (whether ElastiSim has it busy, its GPUs)}."""
        out: dict[int, tuple[bool, int]] = {}
        for i, node in enumerate(raw):
            where = f"nodes[{i}]"
            if not isinstance(node, dict):
                raise ProtocolError(f"{where} is {_show(node)}, not an object")
            nid = _get(node, "id", "int", where)
            where = f"{where} (node {nid})"
            state = _in(_get(node, "state", "int", where), range(3), "state", where)
            busy = state != _NODE_FREE or bool(_get(node, "assigned_jobs", "list", where))
            gpus = len(_get(node, "gpus", "list", where))
            if nid in out:
                raise ProtocolError(f"{where}: node id {nid} is listed twice")
            out[nid] = busy, gpus
        return out

    def _engine(self, now: float, jobs: list[_Job], nodes: dict[int, tuple[bool, int]]
                ) -> tuple[Engine[int], dict[int, Tracked]]:
        """The engine's state at this invocation: queued and running jobs, free nodes,
        and the nodes on their way back held by a job that policies do not see."""
        engine: Engine[int] = Engine(sorted(nodes), self.policy, self.log)
        tracked: dict[int, Tracked] = {}
        held: dict[int, int] = {}
        for job in jobs:
            if job.state != _PENDING and job.state not in _ACTIVE:  # ended: forget it
                self._progress.pop(job.id, None)
                self._resized.pop(job.id, None)
                continue
            t = self._tracked(job)
            tracked[job.id] = t
            engine.submit(t)
            if job.state == _PENDING:
                if job.low > len(nodes) and job.id not in self._warned:
                    self._warned.add(job.id)
                    self.log.warning("job %d needs %d node(s), the platform has %d: it never starts",
                                     job.id, job.low, len(nodes))
                continue
            if len(set(job.nodes)) != len(job.nodes):
                raise ProtocolError(f"job {job.id} lists a node twice: {_show(job.nodes)}")
            for n in job.nodes:
                if n not in nodes:
                    raise ProtocolError(f"job {job.id} is assigned node {n}, which is not listed")
                if held.setdefault(n, job.id) != job.id:
                    raise ProtocolError(f"node {n} is assigned to job {held[n]} and job {job.id}")
            engine.resume(t, job.nodes, job.start)
            t.ready = job.state == _RUNNING
            t.busy = not t.ready
            t.stopping = "being killed" if job.state == _PENDING_KILL else ""
            t.expected_end = self._expected_end(now, t)
            t.touch()
        transit = sorted(n for n, (busy, _) in nodes.items() if busy and n not in held)
        if transit:
            phantom = Tracked(_TRANSIT, "rigid", len(transit), len(transit), 0.0, now)
            engine.submit(phantom)
            engine.resume(phantom, transit, now)
            phantom.stopping = "nodes on their way back"
        return engine, tracked

    def _tracked(self, job: _Job) -> Tracked:
        pref = job.number("num_nodes_pref")
        preferred = int(pref) if pref is not None and job.low <= pref <= job.high else 0
        p = job.number("parallel_percentage")
        if p is not None and not 0 <= p <= 1:
            raise ProtocolError(f"job {job.id}: argument 'parallel_percentage' is {p}, not in [0, 1]")
        t = Tracked(job.id, _CLASSES[job.type], job.low, job.high, 0.0, job.submit,
                    preferred=preferred, serial=None if p is None else 1 - p)
        t.walltime = self._walltime(job, t.preferred or t.max_nodes, p)
        t.last_resize = self._resized.get(job.id)
        return t

    def _walltime(self, job: _Job, pref: int, p: float | None) -> float:
        """The run time at ``pref`` nodes (see the module docstring)."""
        if job.walltime > 0:
            return float(job.walltime)
        runtime = job.number("runtime")
        if runtime is not None and runtime > 0:
            return runtime
        flops = job.number("flops")
        if flops is not None and flops > 0:
            work = flops * (job.number("iterations") or 1.0) / self.node_speed
            share = 1.0 if p is None else p
            return max(work * ((1 - share) + share / pref), 1e-9)
        if job.id not in self._warned:
            self._warned.add(job.id)
            self.log.warning("job %d has no walltime, runtime or flops: taken to run %g s",
                             job.id, self.default_runtime)
        return self.default_runtime

    def _expected_end(self, now: float, t: Tracked) -> float:
        """When ``t`` should end: the share of its work left is carried over from the
        last invocation, at the size it held then (ElastiSim applies a resize at the
        job's next scheduling point, after the invocation that sent it)."""
        view = JobView(t.id, t.cls, t.min_nodes, t.max_nodes, t.walltime, t.submit,  # type: ignore[arg-type]
                       preferred=t.preferred, serial=t.serial)
        size = max(1, len(t.nodes))
        when, left, before = self._progress.get(t.id, (t.start if t.start is not None and t.start >= 0
                                                       else now, 1.0, size))
        left = max(0.0, left - max(0.0, now - when) / view.runtime_on(before))
        self._progress[t.id] = (now, left, size)
        return now + left * view.runtime_on(size)


def serve(bridge: Bridge, url: str = DEFAULT_URL, *, max_message: int = MAX_MESSAGE,
          idle_timeout: float | None = None) -> dict[str, Any]:
    """Connect to ElastiSim at ``url`` and answer it until it finalizes; returns the
    bridge's counts. A message over ``max_message`` bytes makes ZeroMQ drop the
    connection, and a connection dropped before the finalize is a ProtocolError (a
    crashed ElastiSim too), so that this never waits for ever on a dead peer; as is
    ``idle_timeout`` seconds without a message, if given."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    try:
        sock.setsockopt(zmq.MAXMSGSIZE, max_message)
        sock.connect(url)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        connected, last = False, time.monotonic()
        while True:
            ready = dict(poller.poll(200))
            if sock in ready or (monitor in ready and sock.poll(100)):
                answer = bridge.handle(sock.recv())
                if answer is None:
                    return bridge.stats
                sock.send(json.dumps(answer).encode())
                last = time.monotonic()
            elif monitor in ready:
                event = recv_monitor_message(monitor)["event"]
                connected = connected or event == zmq.EVENT_CONNECTED
                if event == zmq.EVENT_DISCONNECTED and connected:
                    raise ProtocolError(f"ElastiSim at {url} closed the connection before its "
                                        f"finalize: it stopped, or sent a message over "
                                        f"{max_message} bytes")
            elif idle_timeout is not None and time.monotonic() - last > idle_timeout:
                raise ProtocolError(f"no message from ElastiSim at {url} for {idle_timeout:g} s")
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()


HELP = "be ElastiSim's scheduling algorithm: one of our policies decides in its simulation"
DESCRIPTION = ("Connect to ElastiSim (the batch-system simulator of TU Darmstadt) at --url and "
               "answer its scheduling invocations with one of our policies, until its run ends. "
               "Start ElastiSim first or after: it binds the URL and waits. A job without a "
               "walltime is estimated from its arguments (runtime, or flops and "
               "parallel_percentage at --node-speed). Decisions that ElastiSim's state does not "
               "allow are logged and not sent.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``elastisim`` subcommand's options (``p``: its argparse parser)."""
    p.add_argument("--policy", required=True, help="one of: " + ", ".join(policy_names()))
    p.add_argument("--url", default=DEFAULT_URL,
                   help=f"ElastiSim's zmq_url, which it binds (default: {DEFAULT_URL})")
    p.add_argument("--stats", default=None, metavar="FILE",
                   help="write the counts (invocations, decisions by kind, refused) here as JSON")
    p.add_argument("--node-speed", type=float, default=NODE_SPEED, metavar="FLOPS",
                   help="flop/s of a node, for run times estimated from a job's flops "
                        f"(default: {NODE_SPEED:g}, the Kassel inputs' platform)")
    p.add_argument("--resize-interval", type=float, default=10.0, metavar="SECONDS",
                   help="minimum seconds between two resizes of one job")
    p.add_argument("--max-message", type=int, default=MAX_MESSAGE, metavar="BYTES",
                   help=f"the largest message taken from ElastiSim (default: {MAX_MESSAGE})")


def main(ns: argparse.Namespace) -> int:
    """Run the subcommand: 0 after ElastiSim's finalize, 1 on a protocol error, 2 on bad
    options, 130 on Ctrl-C."""

    try:
        bridge = Bridge(get_policy(ns.policy, resize_interval=ns.resize_interval),
                        node_speed=ns.node_speed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    code, error = 0, None
    try:
        serve(bridge, ns.url, max_message=ns.max_message)
    except zmq.ZMQError as e:
        print(f"error: --url {ns.url!r}: {e}", file=sys.stderr)
        return 2
    except ProtocolError as e:
        print(f"error: {e}", file=sys.stderr)
        code, error = 1, str(e)
    except KeyboardInterrupt:  # the socket is closed; ElastiSim waits for another algorithm
        code, error = 130, "interrupted"
    stats = dict(bridge.stats, policy=ns.policy, url=ns.url, **({"error": error} if error else {}))
    log.info("%s", json.dumps(stats))
    if ns.stats:
        with open(ns.stats, "w", encoding="utf-8") as f:
            json.dump(stats, f, indent=2)
            f.write("\n")
    return code
