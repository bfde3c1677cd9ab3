"""Micro-benchmarks of the APGAS runtime against its floors, Dask, Ray and Charm4py.

    python -m benchmarks.micro [--repeats R] [--json FILE] [--quick]

Measures startup, ``at`` round trips, uncounted-task throughput and one
``finish`` over a batch of counted tasks; then the Dask equivalents on a
``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)``. Every
figure is the median of R repeats. Prints a table (with the APGAS/Dask
speedups) on stdout and writes every sample to a JSON file. Times are
reported, never asserted on: the targets are informational.

The floor (``benchmarks._floor``) is measured in the same run, repeat by
repeat beside ``at``: a bare pyzmq DEALER/ROUTER ping-pong of 100 bytes with
a second process, the same ping-pong carrying a pickled call and its pickled
result, and ``multiprocessing.Pool.map(chunksize=1)`` over the batch's tasks
with 2 and with 4 workers. The second table gives ``at`` over the bare
ping-pong (target: at most 1.5x, median and p99) and the batch over the pool
with as many processes (target: at least 2x): the batch on places 0 and 1
against ``Pool(2)``, and on all 4 places against ``Pool(4)``.

Ray (``benchmarks._ray_peers``) is measured in the same run too: a local Ray
of 4 CPUs lives through the measurement run, and each repeat times, beside
``at`` and the finish, an actor method's round trip (``ray.get(a.noop.remote())``),
a task's (``ray.get(noop.remote())``) and task throughput 2 and 4 at a time;
Ray's start-up (until 4 actors answered) is timed beside ``apgas.run``. A third
table gives each as Ray / the runtime's figure. Without Ray, its rows say skipped.

The peers' table (issue 54, ``benchmarks._socketpair_floor``) puts each round trip
over the lowest floor, measured repeat by repeat beside ``at``: 1 byte each way over
a Unix socketpair with a second process echoing it. Charm4py (``benchmarks._charm_peers``)
runs once per repeat under its launcher (``charmrun +p2 ... ++local``): ``ret=True``
calls of a method of a chare on the other PE, then the batch's count of one-way no-op
calls to both PEs until quiescence. The task rates on 2 processes follow, over
``Pool(2)``; then issue 54's goals, met or missed: ``at`` median at most 3x the
floor's and below Charm4py's, p99 at most 2 ms, the finish on 2 places at least
200,000 tasks/s (8x ``Pool(2)``). Charm4py missing or failing: its rows say skipped.

Code that waits on the runtime runs under a deadline, so that a lost
message makes one run fail (it is retried and counted) instead of hanging
the benchmark.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import apgas
from benchmarks import _charm_peers, _ray_peers
from benchmarks._common import (
    Metric,
    Samples,
    add_sample,
    fmt,
    fmt_target,
    median,
    meets,
    percentile,
)
from benchmarks._floor import Echo, floor_summary, pool_rate, render_floor
from benchmarks._harness import Column, Run, Table, harness, show
from benchmarks._socketpair_floor import SocketpairEcho, floor_samples, peers_summary, render_peers

log = logging.getLogger("benchmarks.micro")

T = TypeVar("T")

PLACES = 4                 # places of every APGAS run
DASK_WORKERS = 2
JOIN_TIMEOUT_S = 3.0       # a start that fails should fail fast; a good one takes ~0.2 s
STARTUP_DEADLINE_S = 5.0   # main's finish of a startup run
HEALTH_DEADLINE_S = 5.0    # first contact with every place of the measurement run
PHASE_DEADLINE_S = 300.0   # one measurement phase of one repeat
POLL_INTERVAL_S = 0.002
MEASURE_ATTEMPTS = 10      # apgas.run attempts for the measurement run


# -- parameters ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Params:
    """Sizes of one benchmark session."""

    repeats: int
    warmup_calls: int
    rtt_calls: int
    uncounted_tasks: int
    batch_tasks: int
    dask_rtt_calls: int
    dask_tasks: int
    dask_batch_tasks: int
    ray_rtt_calls: int
    ray_tasks: int

    @property
    def startup_attempts(self) -> int:
        """Startup runs allowed (failed ones included) to collect ``repeats`` samples."""
        return 3 * self.repeats + 3


def make_params(repeats: int | None, quick: bool) -> Params:
    """Full sizes, or small ones for a smoke test (``--quick``)."""
    if quick:
        return Params(repeats=repeats or 1, warmup_calls=20, rtt_calls=200, uncounted_tasks=2_000,
                      batch_tasks=1_000, dask_rtt_calls=50, dask_tasks=500, dask_batch_tasks=1_000,
                      ray_rtt_calls=200, ray_tasks=1_000)
    # Dask does ~10 ms per round trip and < 1,000 tasks/s here: its counts are smaller
    return Params(repeats=repeats or 5, warmup_calls=200, rtt_calls=2_000, uncounted_tasks=50_000,
                  batch_tasks=50_000, dask_rtt_calls=300, dask_tasks=5_000, dask_batch_tasks=10_000,
                  ray_rtt_calls=2_000, ray_tasks=10_000)


# -- metrics --------------------------------------------------------------------------

METRICS = [
    Metric("startup_first_task_s", "startup: first task at every place", "s", False, 1.0),
    Metric("startup_total_s", "startup: whole run incl. shutdown", "s", False),
    Metric("rtt_median_us", "round trip: median", "us", False, 150.0),
    Metric("rtt_p99_us", "round trip: p99", "us", False),
    Metric("throughput_tasks_s", "fire and forget: throughput", "tasks/s", True, 20_000.0),
    Metric("send_rate_tasks_s", "fire and forget: send rate at place 0", "tasks/s", True),
    Metric("batch_tasks_s", "batch of counted tasks: throughput", "tasks/s", True),
]


def latency_samples(samples: Samples, latencies_s: list[float], name: str = "rtt") -> None:
    """Record median and p99 (in µs) of one repeat's round trips, as ``<name>_median_us``
    and ``<name>_p99_us``."""
    add_sample(samples, f"{name}_median_us", statistics.median(latencies_s) * 1e6)
    add_sample(samples, f"{name}_p99_us", percentile(latencies_s, 99) * 1e6)


# -- tasks (module level: they pickle by reference) -------------------------------------

_count = 0
_count_lock = threading.Lock()


def noop(*args: Any) -> None:
    """Do nothing."""


def count_task() -> None:
    """Add one to this place's counter."""
    global _count
    with _count_lock:
        _count += 1


def get_count() -> int:
    """This place's counter."""
    return _count


def reset_count() -> None:
    """Set this place's counter to zero."""
    global _count
    with _count_lock:
        _count = 0


# -- deadlines -----------------------------------------------------------------------

class DeadlineExceeded(BaseException):
    """A guarded block overran. Not an ``Exception``: a ``finish`` does not wait on it."""


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`DeadlineExceeded` in the main thread if the block takes longer (not nestable)."""
    def expire(signum: int, frame: Any) -> None:
        raise DeadlineExceeded(f"{what} took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_apgas(main: Callable[[], T]) -> T:
    """``apgas.run(main)`` on the benchmark's places."""
    return apgas.run(main, places=PLACES, join_timeout=JOIN_TIMEOUT_S)


# -- APGAS: startup --------------------------------------------------------------------

def _startup_main() -> float:
    """One counted no-op at every place under a finish; the time it completed."""
    with deadline(STARTUP_DEADLINE_S, "the startup finish"):
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, noop)
    return time.perf_counter()


def apgas_startup(params: Params) -> tuple[Samples, int]:
    """Startup samples of ``repeats`` good runs, and the number of failed runs."""
    samples: Samples = {}
    failures = 0
    for attempt in range(params.startup_attempts):
        if len(samples.get("startup_total_s", [])) == params.repeats:
            break
        start = time.perf_counter()
        try:
            ready = run_apgas(_startup_main)
        except (apgas.ApgasError, DeadlineExceeded) as e:
            failures += 1
            log.warning("apgas startup run %d failed: %s", attempt + 1, e)
            continue
        end = time.perf_counter()
        add_sample(samples, "startup_first_task_s", ready - start)
        add_sample(samples, "startup_total_s", end - start)
        log.info("apgas startup: %.3f s to first tasks, %.3f s in all", ready - start, end - start)
    return samples, failures


# -- APGAS: one run for the other measurements -------------------------------------------

def _check_places() -> None:
    """Reach every place both ways, so that a broken start fails here, quickly."""
    with deadline(HEALTH_DEADLINE_S, "first contact with every place"):
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, noop)
        for p in apgas.places():
            apgas.at(p, noop)


def _round_trips(target: apgas.Place, calls: int) -> list[float]:
    """Seconds taken by each of ``calls`` ``at(target, noop)``."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        apgas.at(target, noop)
        times.append(time.perf_counter() - start)
    return times


def _uncounted(target: apgas.Place, tasks: int) -> tuple[float, float]:
    """Send ``tasks`` uncounted counter tasks; (seconds to send, seconds until all ran)."""
    apgas.at(target, reset_count)
    start = time.perf_counter()
    for _ in range(tasks):
        apgas.uncounted_async_at(target, count_task)
    sent = time.perf_counter()
    while apgas.at(target, get_count) < tasks:  # an at() queues behind the tasks sent before it
        time.sleep(POLL_INTERVAL_S)
    return sent - start, time.perf_counter() - start


def _batch(tasks: int, places: int = PLACES) -> float:
    """Seconds for one finish over ``tasks`` no-op tasks dealt round robin to the first places."""
    ps = apgas.places()[:places]
    start = time.perf_counter()
    with apgas.finish():
        for i in range(tasks):
            apgas.async_at(ps[i % len(ps)], noop, i)  # the pool's tasks: noop(i)
    return time.perf_counter() - start


def _warm_up(target: apgas.Place, params: Params) -> None:
    """A little of each measurement: imports, connections and caches at every place."""
    _round_trips(target, params.warmup_calls)
    _uncounted(target, params.warmup_calls)
    _batch(params.warmup_calls)


def _floor_repeat(echo: Echo, pair: SocketpairEcho, params: Params, samples: Samples) -> None:
    """The floor of one repeat: ping-pongs and the pools, beside the runtime's figures."""
    with deadline(PHASE_DEADLINE_S, "the ping-pongs"):
        floor_samples(samples, pair.round_trips(params.rtt_calls))
        for name, times in (("bare", echo.bare(params.rtt_calls)),
                            ("pickled", echo.pickled(params.rtt_calls, noop))):
            latency_samples(samples, times, name)
    for workers in (2, PLACES):
        [rate] = pool_rate(noop, params.batch_tasks, workers, 1)
        add_sample(samples, f"pool{workers}_tasks_s", rate)


def _repeat(target: apgas.Place, params: Params, samples: Samples, echo: Echo, pair: SocketpairEcho,
            ray: _ray_peers.MicroRay, charm: _charm_peers.MicroCharm) -> None:
    """One repeat of every measurement."""
    _floor_repeat(echo, pair, params, samples)
    with deadline(PHASE_DEADLINE_S, "Ray's round trips and tasks"):
        ray.repeat(params.ray_rtt_calls, params.ray_tasks, samples)
    charm.repeat(params.rtt_calls, params.batch_tasks, samples)   # a program of its own, with its own timeout
    with deadline(PHASE_DEADLINE_S, "the round trips"):
        latency_samples(samples, _round_trips(target, params.rtt_calls))
    with deadline(PHASE_DEADLINE_S, "the uncounted tasks"):
        send_s, total_s = _uncounted(target, params.uncounted_tasks)
    add_sample(samples, "send_rate_tasks_s", params.uncounted_tasks / send_s)
    add_sample(samples, "throughput_tasks_s", params.uncounted_tasks / total_s)
    with deadline(PHASE_DEADLINE_S, "the batch"):
        add_sample(samples, "batch_tasks_s", params.batch_tasks / _batch(params.batch_tasks))
        add_sample(samples, "batch2_tasks_s", params.batch_tasks / _batch(params.batch_tasks, 2))


def _measure_main(params: Params, charm: _charm_peers.MicroCharm) -> Samples:
    """Main of the measurement run: check, warm up, then every repeat."""
    _check_places()
    target = apgas.place(1)
    with deadline(PHASE_DEADLINE_S, "the warm-up"):
        _warm_up(target, params)
    samples: Samples = {}
    with Echo() as echo, SocketpairEcho() as pair, _ray_peers.MicroRay(PLACES, params.warmup_calls) as ray:
        echo.bare(params.warmup_calls)
        echo.pickled(params.warmup_calls, noop)
        pair.round_trips(params.warmup_calls)
        for i in range(params.repeats):
            _repeat(target, params, samples, echo, pair, ray, charm)
            log.info("apgas repeat %d/%d: %s", i + 1, params.repeats, _latest(samples))
    return samples


def apgas_measure(params: Params, charm: _charm_peers.MicroCharm) -> tuple[Samples, int]:
    """Round trips, throughput and batch in one good run (the peers' figures of each repeat
    beside them); also the failed runs before it."""
    for attempt in range(1, MEASURE_ATTEMPTS + 1):
        try:
            return run_apgas(functools.partial(_measure_main, params, charm)), attempt - 1
        except (apgas.ApgasError, DeadlineExceeded) as e:
            log.warning("apgas measurement run %d failed: %s", attempt, e)
    return {}, MEASURE_ATTEMPTS


def _latest(samples: Samples) -> str:
    """The last sample of every metric, for the progress log."""
    return ", ".join(f"{key}={values[-1]:.4g}" for key, values in samples.items())


# -- Dask ---------------------------------------------------------------------------------

def _dask_cluster() -> Any:
    from distributed import LocalCluster
    return LocalCluster(n_workers=DASK_WORKERS, threads_per_worker=1, processes=True,
                        dashboard_address=None)


def _dask_ready(client: Any) -> None:
    """Wait until a first task has run on each worker."""
    from distributed import wait
    client.wait_for_workers(DASK_WORKERS)
    workers = list(client.scheduler_info()["workers"])
    wait([client.submit(noop, pure=False, workers=[w]) for w in workers])


def dask_startup_once() -> tuple[float, float]:
    """(Seconds until a first task ran on each worker, seconds including shutdown)."""
    from distributed import Client
    start = time.perf_counter()
    cluster = _dask_cluster()
    try:
        with Client(cluster) as client:
            _dask_ready(client)
            ready = time.perf_counter()
    finally:
        cluster.close()
    return ready - start, time.perf_counter() - start


def _dask_round_trips(client: Any, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        client.submit(noop, pure=False).result()
        times.append(time.perf_counter() - start)
    return times


def _dask_map(client: Any, tasks: int) -> float:
    """Seconds to submit ``tasks`` no-op futures and wait for all of them."""
    from distributed import wait
    start = time.perf_counter()
    futures = client.map(noop, range(tasks), pure=False)
    wait(futures)
    elapsed = time.perf_counter() - start
    del futures
    return elapsed


def _dask_repeat(client: Any, params: Params, samples: Samples) -> None:
    latency_samples(samples, _dask_round_trips(client, params.dask_rtt_calls))
    add_sample(samples, "throughput_tasks_s", params.dask_tasks / _dask_map(client, params.dask_tasks))
    add_sample(samples, "batch_tasks_s",
               params.dask_batch_tasks / _dask_map(client, params.dask_batch_tasks))


def dask_measure(params: Params) -> Samples:
    """Dask startup repeats, then the other measurements on one cluster."""
    from distributed import Client
    samples: Samples = {}
    for _ in range(params.repeats):
        ready_s, total_s = dask_startup_once()
        add_sample(samples, "startup_first_task_s", ready_s)
        add_sample(samples, "startup_total_s", total_s)
        log.info("dask startup: %.3f s to first tasks, %.3f s in all", ready_s, total_s)
    with _dask_cluster() as cluster, Client(cluster) as client:
        _dask_ready(client)
        _dask_round_trips(client, params.warmup_calls // 10)
        _dask_map(client, params.warmup_calls)
        for i in range(params.repeats):
            _dask_repeat(client, params, samples)
            log.info("dask repeat %d/%d: %s", i + 1, params.repeats, _latest(samples))
    return samples


# -- report ---------------------------------------------------------------------------------

def summarize(apgas_samples: Samples, dask_samples: Samples) -> list[dict[str, Any]]:
    """One JSON-ready record per metric: medians, samples, speedup, target."""
    rows = []
    for m in METRICS:
        ours = median(apgas_samples.get(m.key))
        theirs = median(dask_samples.get(m.key))
        rows.append({
            "metric": m.key, "label": m.label, "unit": m.unit,
            "higher_is_better": m.higher_is_better, "target": m.target,
            "apgas": ours, "dask": theirs, "speedup": _speedup(m, ours, theirs),
            "meets_target": meets(m, ours),
            "apgas_samples": apgas_samples.get(m.key, []), "dask_samples": dask_samples.get(m.key, []),
        })
    return rows


def _speedup(m: Metric, ours: float | None, theirs: float | None) -> float | None:
    """How many times APGAS beats Dask (> 1: APGAS is better)."""
    if not ours or not theirs:
        return None
    return ours / theirs if m.higher_is_better else theirs / ours


def render_table(rows: list[dict[str, Any]], failures: dict[str, int], params: Params) -> str:
    """The table printed at the end."""
    table = Table([Column("metric", 40, left=True), Column("apgas", 14, gap=" "), Column("dask", 14, gap=" "),
                   Column("speedup", 9, gap=" "), Column("target", 0, left=True, gap="  ")], rule=True)
    lines = [table.render([m.label, fmt(row["apgas"], m.unit), fmt(row["dask"], m.unit),
                           f"{row['speedup']:.1f}x" if row["speedup"] else "-",
                           fmt_target(m, row["meets_target"])] for m, row in zip(METRICS, rows, strict=True))]
    lines += [
        "",
        f"medians of {params.repeats} repeat(s); apgas: {PLACES} places, round trips place 0 -> 1 "
        f"({params.rtt_calls} calls), {params.uncounted_tasks:,} uncounted tasks to place 1, "
        f"finish over {params.batch_tasks:,} tasks round robin",
        f"dask: LocalCluster({DASK_WORKERS} worker processes x 1 thread), {params.dask_rtt_calls} "
        f"round trips, map+wait of {params.dask_tasks:,} and {params.dask_batch_tasks:,} tasks",
        f"failed apgas runs (retried): startup {failures['apgas_startup']}, "
        f"measurement {failures['apgas_measure']}",
    ]
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------------------

@harness("benchmarks.micro", __doc__, Path("bench-results/micro.json"),
         "small sizes: a smoke test of < 30 s", needs=lambda args: ["distributed"],
         loggers=("benchmarks.micro",))
def main(run: Run) -> int:
    params = make_params(run.args.repeats, run.args.quick)
    log.info("apgas startup (%d repeats)", params.repeats)
    startup, startup_failures = apgas_startup(params)
    charm = _charm_peers.MicroCharm(params.warmup_calls)
    log.info("apgas round trips, throughput, batch (%d repeats in one run)%s", params.repeats,
             f"; charm4py {charm.skipped}" if charm.skipped else "")
    measured, measure_failures = apgas_measure(params, charm)
    log.info("dask (%d repeats)", params.repeats)
    dask_samples = dask_measure(params)
    log.info("ray startup (%d repeats)%s", params.repeats, f": {_ray_peers.SKIPPED}" if _ray_peers.SKIPPED else "")
    ray = _ray_peers.micro_summary({**startup, **measured, **_ray_peers.startup_samples(params.repeats, PLACES)},
                                   PLACES)
    failures = {"apgas_startup": startup_failures, "apgas_measure": measure_failures}
    rows = summarize({**startup, **measured}, dask_samples)
    floor = floor_summary(measured, PLACES)
    peers = peers_summary(measured, {"charm": charm.skipped, "ray": _ray_peers.SKIPPED})
    peers["charm_program_s"] = charm.runs   # each Charm4py run, charmrun's start included
    run.report.update({"params": dataclasses.asdict(params), "failures": failures, "results": rows,
                       "floor": floor, "ray": ray, "peers": peers})
    show(render_table(rows, failures, params), "", render_floor(floor, PLACES), "", _ray_peers.render_micro(ray),
         "", render_peers(peers))
    return 0


if __name__ == "__main__":
    # run the functions of the importable module, so that tasks pickle by reference
    from benchmarks import micro
    sys.exit(micro.main())
