"""Ray beside the runtime: the Ray side of ``benchmarks.micro``, ``.peers`` and ``.balancing``.

Why a module of its own: Ray is optional (the ``bench`` extra), and the three
harnesses start it the same way, which must not be got wrong on a shared
machine: local only, on the loopback, without the dashboard's web server or
usage statistics (``RAY_USAGE_STATS_ENABLED=0``), with its logs and sockets in
a temporary directory, shut down on every way out and checked for processes
left behind (:func:`local_ray`). Without Ray the module still imports: the
``@ray.remote`` below then leaves functions as they are, and :data:`SKIPPED`
says why the harnesses report their Ray rows as skipped.

The tasks are written as Ray users write them: ``@ray.remote`` functions and
actors, ``ray.get`` and ``ray.wait``.

- micro: an actor method's round trip (``ray.get(a.noop.remote())``), a
  task's (``ray.get(noop.remote())``), task throughput
  (``ray.get([noop.remote(i) for i in range(N)])``) with 2 and with 4 tasks at
  a time, and start-up until 4 actors (4 worker processes) answered.
- peers and balancing: a tree is counted by tasks that each expand up to a
  cutoff of nodes of their stack inline, split what is left as GLB splits a
  bag into up to ``fanout`` stacks, submit one task per stack and return
  ``(nodes, refs of those tasks)``; the driver follows the refs with
  ``ray.wait`` (:func:`count_tree`). Static splits run the peers' pieces as
  tasks.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks._common import Samples, add_sample, fmt, median, percentile
from benchmarks._harness import Column, Table

log = logging.getLogger("benchmarks.ray")

SKIPPED: str | None = None
"""Why the Ray rows are left out (None: Ray can be used)."""

# Read by Ray when imported: no usage statistics, and Ray's switch for running
# without a cluster (meant for macOS and Windows, read everywhere): the node's
# address is the loopback, and Ray's gRPC servers listen on it alone.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
os.environ.update(RAY_ENV)

try:
    import ray
except ImportError as e:  # the bench extra is missing
    SKIPPED = f'skipped: ray is not importable ({e}); it is in the bench extra: .venv/bin/pip install -e ".[bench]"'

    class _NoRay:
        """Stands in for ``ray`` so that this module imports: ``remote`` changes nothing."""

        @staticmethod
        def remote(fn: Any) -> Any:
            return fn

    ray = _NoRay()  # type: ignore[assignment]

OBJECT_STORE_BYTES = 256 << 20     # Ray takes 30% of the memory by default; this is a shared machine
LEFTOVER_WAIT_S = 15.0
UTS_CUTOFF, UTS_FANOUT = 1 << 18, 8   # peers' dynamic UTS: nodes a task counts inline, tasks it spawns


# -- a local Ray, and nothing left behind --------------------------------------------------------

def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ray_processes() -> list[int]:
    """Ray's processes below this one (GCS, raylet, agents, workers), found in /proc."""
    tree, out, todo = _children(), [], [os.getpid()]
    while todo:
        for child in tree.get(todo.pop(), []):
            cmd = _cmdline(child)
            if cmd.startswith("ray::") or "/ray/" in cmd or "ray_" in cmd:
                out.append(child)
            todo.append(child)
    return sorted(out)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def local_ray(num_cpus: int) -> Iterator[None]:
    """A local Ray of ``num_cpus`` CPUs on the loopback for the block; shut down on every way
    out, and any of its processes still there after ``LEFTOVER_WAIT_S`` killed by pid (logged)."""
    if SKIPPED:
        raise RuntimeError(SKIPPED)
    os.environ.update(RAY_ENV)
    tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")   # short: Ray's unix sockets live under it
    started: set[int] = set()
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 _temp_dir=tmp, object_store_memory=OBJECT_STORE_BYTES, log_to_driver=False,
                 logging_level=logging.ERROR)
        started.update(ray_processes())
        if (where := {n["NodeManagerAddress"] for n in ray.nodes()}) != {"127.0.0.1"}:
            raise RuntimeError(f"Ray is on {where}, not on the loopback alone (was ray imported before "
                               f"benchmarks._ray_peers set {RAY_ENV}?)")
        yield
    finally:
        started.update(ray_processes())
        ray.shutdown()
        end = time.monotonic() + LEFTOVER_WAIT_S
        while (left := [p for p in started if _alive(p)]) and time.monotonic() < end:
            time.sleep(0.1)
        for pid in left:
            log.warning("ray process %d (%s) outlived ray.shutdown(): killed", pid, _cmdline(pid)[:80])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


# -- micro: round trips, throughput, start-up -------------------------------------------------------

@ray.remote
def noop(*args: Any) -> None:
    """Do nothing."""


@ray.remote
class Noop:
    """An actor that does nothing, or says which process it is."""

    def noop(self, *args: Any) -> None:
        pass

    def pid(self) -> int:
        return os.getpid()


def startup_once(workers: int) -> tuple[float, float]:
    """(Seconds until ``workers`` actors, each a worker process, answered; seconds incl. shutdown)."""
    start = time.perf_counter()
    with local_ray(workers):
        actors = [Noop.remote() for _ in range(workers)]
        pids = ray.get([a.pid.remote() for a in actors])
        ready = time.perf_counter()
        if len(set(pids)) != workers:
            raise RuntimeError(f"{workers} actors answered from {len(set(pids))} processes")
    return ready - start, time.perf_counter() - start


def startup_samples(repeats: int, workers: int) -> Samples:
    """``ray_startup_first_task_s`` and ``ray_startup_total_s`` of ``repeats`` starts (none if skipped)."""
    samples: Samples = {}
    for _ in range([repeats, 0][bool(SKIPPED)]):
        ready_s, total_s = startup_once(workers)
        add_sample(samples, "ray_startup_first_task_s", ready_s)
        add_sample(samples, "ray_startup_total_s", total_s)
        log.info("ray startup: %.3f s to %d actors, %.3f s in all", ready_s, workers, total_s)
    return samples


def _latency(samples: Samples, name: str, times: list[float]) -> None:
    add_sample(samples, f"{name}_median_us", statistics.median(times) * 1e6)
    add_sample(samples, f"{name}_p99_us", percentile(times, 99) * 1e6)


class MicroRay:
    """A Ray of ``workers`` CPUs that lives through the micro run; each :meth:`repeat` adds
    its samples beside the runtime's. Does nothing when Ray is skipped."""

    def __init__(self, workers: int, warmup_calls: int) -> None:
        self.workers, self.warmup_calls = workers, warmup_calls
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> MicroRay:
        if not SKIPPED:
            try:
                self._stack.enter_context(local_ray(self.workers))
                self.actor = Noop.remote()
                ray.get(self.actor.pid.remote())
                self.repeat(self.warmup_calls, 10 * self.warmup_calls, {})   # workers started, caches warm
            except BaseException:
                self._stack.close()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def repeat(self, calls: int, tasks: int, samples: Samples) -> None:
        """Round trips of the actor and of a task, then task throughput 2 and ``workers`` at a time."""
        if SKIPPED:
            return
        for name, call in (("ray_actor", lambda: ray.get(self.actor.noop.remote())),
                           ("ray_task", lambda: ray.get(noop.remote()))):
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            _latency(samples, name, times)
        for width in (2, self.workers):   # a task asking for workers/width CPUs: width at a time
            task = noop.options(num_cpus=self.workers // width)
            start = time.perf_counter()
            ray.get([task.remote(i) for i in range(tasks)])
            add_sample(samples, f"ray{width}_tasks_s", tasks / (time.perf_counter() - start))


def micro_rows(places: int) -> list[tuple[str, str, str, str, str]]:
    """(Ray's label, its key, the reference's label, its key, unit) of each row of Ray's table."""
    return [
        ("actor method round trip, median", "ray_actor_median_us", "at(), median", "rtt_median_us", "us"),
        ("actor method round trip, p99", "ray_actor_p99_us", "at(), p99", "rtt_p99_us", "us"),
        ("task round trip, median", "ray_task_median_us", "at(), median", "rtt_median_us", "us"),
        ("task round trip, p99", "ray_task_p99_us", "at(), p99", "rtt_p99_us", "us"),
        ("tasks, 2 at a time", "ray2_tasks_s", "finish, 2 places", "batch2_tasks_s", "tasks/s"),
        ("tasks, 2 at a time", "ray2_tasks_s", "Pool(2).map", "pool2_tasks_s", "tasks/s"),
        (f"tasks, {places} at a time", f"ray{places}_tasks_s", f"finish, {places} places", "batch_tasks_s",
         "tasks/s"),
        (f"tasks, {places} at a time", f"ray{places}_tasks_s", f"Pool({places}).map", f"pool{places}_tasks_s",
         "tasks/s"),
        (f"start-up, {places} actors answered", "ray_startup_first_task_s",
         f"apgas.run, {places} places", "startup_first_task_s", "s"),
        ("start-up incl. shutdown", "ray_startup_total_s", "apgas.run incl. shutdown", "startup_total_s", "s"),
    ]


def micro_summary(samples: Samples, places: int) -> dict[str, Any]:
    """Ray's medians and samples, and each row's ratio Ray / reference (time: > 1 is Ray slower;
    tasks/s: < 1 is Ray slower). Every value None when skipped, with the reason."""
    rows = []
    for label, key, ref_label, ref_key, unit in micro_rows(places):
        ray_v, ref_v = median(samples.get(key)), median(samples.get(ref_key))
        rows.append({"ray": label, "ray_key": key, "reference": ref_label, "reference_key": ref_key,
                     "unit": unit, "ray_median": ray_v, "reference_median": ref_v,
                     "ray_over_reference": ray_v / ref_v if ray_v and ref_v else None})
    keys = {r["ray_key"] for r in rows}
    return {"skipped": SKIPPED, "workers": places, "rows": rows,
            "samples": {k: samples.get(k, []) for k in sorted(keys)}}


def render_micro(summary: dict[str, Any]) -> str:
    """Ray's table: each Ray figure beside its reference from the same run, and the ratio."""
    table = Table([Column("Ray (same run)", 36, left=True), Column("ray", 12, gap=" "),
                   Column("reference", 26, left=True, gap="   "), Column("value", 12, gap=" "),
                   Column("ray / ref", 10, gap=" ")], rule=True)
    if summary["skipped"]:
        return "\n".join([table.render([]), f"Ray rows {summary['skipped']}"])
    lines = [table.render(
        [r["ray"], fmt(r["ray_median"], r["unit"]), r["reference"], fmt(r["reference_median"], r["unit"]),
         "-" if r["ray_over_reference"] is None else f"{r['ray_over_reference']:.3g}x"] for r in summary["rows"])]
    lines.append(f"Ray: ray.init(num_cpus={summary['workers']}) on the loopback, one actor for the round trips; "
                 f"'k at a time': tasks asking for {summary['workers']}/k CPUs each")
    return "\n".join(lines)


# -- peers and balancing: trees of tasks, static pieces ------------------------------------------------

def _stacks(bag: Any, fanout: int, rows: Any) -> list[Any]:
    """What is left of ``bag``, split as GLB splits it into up to ``fanout`` stacks (``rows(bag)`` each)."""
    stacks = []
    while len(stacks) < fanout - 1 and bag.is_splittable():
        piece = bag.split(False)
        if piece is None:
            break
        stacks.append(rows(piece))
    if not bag.is_empty():
        stacks.append(rows(bag))
    return stacks


@ray.remote
def uts_expand(params: dict, stack: Any, cutoff: int, fanout: int) -> tuple[int, list]:
    """Count up to ``cutoff`` nodes of ``stack`` depth first; the rest as up to ``fanout`` new
    tasks; (nodes counted here, refs of the new tasks)."""
    from glb.apps import uts
    bag = uts.UTSBag(uts.tree_of(params), stack)
    done = bag.process(cutoff)
    return done, [uts_expand.remote(params, s, cutoff, fanout) for s in _stacks(bag, fanout, uts.UTSBag.rows)]


@ray.remote
def synthetic_expand(expand: Callable[..., tuple[int, list]], stack: Any, params: dict, cutoff: int,
                     fanout: int) -> tuple[int, list]:
    """``uts_expand`` for the sleeping tree of ``benchmarks.balancing``, whose Dask task's
    expansion ``expand`` is (passed in: this module imports no harness)."""
    done, stacks = expand(stack, params, cutoff, fanout)
    return done, [synthetic_expand.remote(expand, s, params, cutoff, fanout) for s in stacks]


def count_tree(first: Any, timeout: float | None = None) -> tuple[int, int]:
    """Follow a tree of tasks that each return ``(nodes, refs of their child tasks)``
    from its first task's ref; (nodes, tasks). TimeoutError after ``timeout`` s."""
    end = None if timeout is None else time.monotonic() + timeout
    pending, nodes, tasks = [first], 0, 0
    while pending:
        wait = None if end is None else max(0.0, end - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=wait)
        if not ready:
            raise TimeoutError(f"{len(pending)} tasks still running after {timeout} s")
        if pending:   # and whatever else is done already
            more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
            ready += more
        for done, children in ray.get(ready):
            nodes, tasks = nodes + done, tasks + 1
            pending.extend(children)
    return nodes, tasks


@ray.remote
def warm(load: Callable[[], Any], hold_s: float) -> int:
    """Load kernels in this worker (``load()``: a harness's warm-up), hold it ``hold_s`` s
    so that the other warm tasks go to other workers; its pid."""
    load()
    time.sleep(hold_s)
    return os.getpid()


def warm_workers(load: Callable[[], Any], workers: int, limit_s: float = 300.0) -> int:
    """Rounds of ``workers`` warm tasks until that many worker processes ran one (Ray starts
    2 at a time here: 64 take a minute on 2 busy cores), or for ``limit_s`` s; how many did."""
    pids: set[int] = set()
    end = time.monotonic() + limit_s
    while len(pids) < workers and time.monotonic() < end:
        pids.update(ray.get([warm.remote(load, 0.5) for _ in range(workers)]))
    return len(pids)


@ray.remote
def run_share(share: Callable[..., Any], app_name: str, params: dict, index: int, count: int) -> Any:
    """Static piece ``index`` of ``count``, run to its end by ``share``
    (``benchmarks.peers.run_share``, passed in: this module imports no harness)."""
    return share(app_name, params, index, count)


def peer_runs(harness: Any, app_name: str, params: dict, splits: tuple[int, ...], cores: int,
              cutoff: int = UTS_CUTOFF, fanout: int = UTS_FANOUT) -> list[tuple[str, str, float, Any, dict]]:
    """Ray's runs of one peers case on a Ray of ``cores`` CPUs: the static splits as tasks,
    and for UTS the tree of dynamic tasks; (system, kind, seconds, result, extra) each.
    ``harness`` is ``benchmarks.peers`` (its ``warm``, ``run_share`` and ``fold_all``)."""
    out = []
    with local_ray(cores):
        warm_workers(functools.partial(harness.warm, app_name), cores)
        for pieces in splits:
            start = time.perf_counter()
            parts = ray.get([run_share.remote(harness.run_share, app_name, params, i, pieces)
                             for i in range(pieces)])
            out.append((f"Ray ({pieces} static pieces)", "static", time.perf_counter() - start,
                        harness.fold_all(app_name, params, parts), {}))
        if app_name == "uts":
            from glb.apps import uts
            root = uts.make_bag(params).rows()
            start = time.perf_counter()
            nodes, tasks = count_tree(uts_expand.remote(params, root, cutoff, fanout))
            out.append(("Ray, dynamic", "dynamic", time.perf_counter() - start, uts.NodeCount(nodes),
                        {"tasks": tasks, "cutoff": cutoff, "fanout": fanout}))
    return out


def balancing_run(harness: Any, params: dict, workers: int, cutoff: int, fanout: int,
                  limit: float) -> tuple[float, int, int]:
    """The sleeping tree as dynamic tasks on a Ray of ``workers`` CPUs; (seconds, nodes, tasks),
    0 nodes if it took longer than ``limit`` s. ``harness`` is ``benchmarks.balancing``
    (its ``warm`` and ``expand``)."""
    from glb.apps import synthetic
    with local_ray(workers):
        warmed = warm_workers(harness.warm, workers)
        if warmed < workers:
            log.warning("Ray: %d of %d workers warmed before the run", warmed, workers)
        root = synthetic.make_bag(params).inner.rows()
        start = time.perf_counter()
        try:
            nodes, tasks = count_tree(synthetic_expand.remote(harness.expand, root, params, cutoff, fanout),
                                      limit)
        except TimeoutError:
            log.warning("Ray, dynamic: no result after %.0f s; counted as 0 nodes", limit)
            nodes, tasks = 0, 0
        return time.perf_counter() - start, nodes, tasks
