"""Past 256 places (issue 32): the ZeroMQ socket limit follows the descriptor limit,
a start that would pass a limit of the machine fails at once with one clear
LimitError and leaves nothing behind, and place 0's descriptors and sockets grow
in proportion to the places while the places' own stay flat."""

from __future__ import annotations

import functools
import os
import resource
import subprocess
import sys
import time

import pytest
import zmq
from conftest import ROOT, place_processes, wait_gone

import apgas
from apgas._core import limits as _limits
from apgas.errors import ApgasError, LimitError
from benchmarks._footprint import proc_sample, tcp_inodes


def test_max_sockets_follows_the_descriptor_limit():
    assert _limits.max_sockets(256) == 1023            # never below libzmq's default
    assert _limits.max_sockets(1023) == 1023
    assert _limits.max_sockets(20_000) == 20_000       # every socket holds a descriptor
    assert _limits.max_sockets(1 << 20) == 65535       # libzmq's ZMQ_SOCKET_LIMIT
    assert _limits.max_sockets(resource.RLIM_INFINITY) == 65535


def test_a_place_context_takes_the_socket_limit():
    ctx = _limits.zmq_context()
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert ctx.max_sockets == _limits.max_sockets(soft)
        assert ctx.get(zmq.IO_THREADS) == 1
        assert ctx.max_sockets >= 1023
    finally:
        ctx.term()


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one():
    code = """if True:
        import resource
        from apgas._core import limits as _limits
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, 4000))
        print(_limits.raise_soft_nofile(), resource.getrlimit(resource.RLIMIT_NOFILE)[0],
              _limits.zmq_context().max_sockets)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=60, check=True).stdout.split()
    assert out == ["4000", "4000", "4000"]


def test_limit_error_pickles_with_its_fields():
    import pickle

    err = pickle.loads(pickle.dumps(LimitError("RLIMIT_NOFILE", 256, "too many")))
    assert (err.limit, err.value, str(err)) == ("RLIMIT_NOFILE", 256, "too many")
    assert isinstance(err, ApgasError)


def test_check_start_names_the_limit_its_value_and_the_remedy(monkeypatch):
    monkeypatch.setattr(_limits, "_nofile", lambda: (300, 300))
    with pytest.raises(LimitError) as caught:
        _limits.check_start(100, 101, 100, 3)
    err = caught.value
    assert err.limit == "RLIMIT_NOFILE" and err.value == 300
    assert "ulimit -n" in str(err) and "300" in str(err) and "100 more place(s)" in str(err)
    monkeypatch.setattr(_limits, "_nofile", lambda: (1 << 20, 1 << 20))
    monkeypatch.setattr(_limits, "max_sockets", lambda nofile=None: 1023)
    with pytest.raises(LimitError, match="ZMQ_MAX_SOCKETS"):
        _limits.check_start(400, 401, 0, 3)
    monkeypatch.setattr(_limits, "_mem_available", lambda: 100 << 20)
    with pytest.raises(LimitError, match="MemAvailable") as caught:
        _limits.check_start(20, 21, 20, 3)  # 20 forked places of 12 MiB in 100 MiB
    assert caught.value.limit == "MemAvailable"
    _limits.check_start(20, 21, 0, 3)  # places elsewhere take no memory here


def test_too_many_threads_for_the_kernel_is_named(monkeypatch):
    monkeypatch.setattr(_limits, "_tasks_running", lambda: 1000)
    monkeypatch.setattr(_limits, "_read_int", lambda path: 2000 if "threads-max" in path else None)
    with pytest.raises(LimitError, match=r"kernel\.threads-max of 2,000") as caught:
        _limits.check_start(150, 151, 150, 3)
    assert "sysctl -w kernel.threads-max" in str(caught.value)


LOW_LIMIT_PROGRAM = """if True:
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))  # soft and hard: nothing to raise
    import apgas
    from apgas.errors import LimitError
    try:
        apgas.run(lambda: None, places=60, threads=1)
    except LimitError as e:
        print("LIMIT", e.limit, e.value, "|", e, flush=True)
        sys.exit(3)
"""


@pytest.mark.timeout(60)
def test_a_start_past_the_descriptor_limit_fails_at_once_and_leaves_nothing():
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", LOW_LIMIT_PROGRAM], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 3, (out, err)
    assert out.startswith("LIMIT RLIMIT_NOFILE 256 |"), out
    assert "ulimit -n" in out and "60 in all" in out
    assert "could not be killed" not in err and "of SIGKILL" not in err and "Traceback" not in err, err
    assert time.monotonic() - began < 30  # before any place started: no join timeout waited
    assert not wait_gone(place_processes(proc.pid), 3.0)
    try:
        os.killpg(proc.pid, 0)  # the run's process group: the fork template went too
        group_left = True
    except ProcessLookupError:
        group_left = False
    assert not group_left


#: two sizes: what place 0 holds per place is the difference between them, whatever it
#: holds besides; 8 more places tell three sockets a place from a constant
SIZES = (8, 16)
#: place 0's eventfds beside its links: the mailboxes of its ROUTER, stop socket and ZAP
#: handler (a socket and a pipe pair: the five sockets check_start counts beside
#: SOCKETS_PER_PLACE) and its ZeroMQ context's own three (the context's mailbox, its I/O
#: thread's and its reaper's)
PLACE_ZERO_EVENTFDS = 5 + 3
OWN = ("fds", "tcp", "eventfds")


@pytest.mark.timeout(180)
def test_place_zero_grows_in_proportion_and_the_places_stay_flat():
    """Place 0 holds three ZeroMQ sockets (an eventfd each), two TCP ends and at most
    FDS_PER_PLACE descriptors per place; a place, linked to place 0 only, the same few
    whatever the count.

    Place 0 is this test process, which holds descriptors that are not the run's:
    pytest's, its fixtures', and those of pyzmq's garbage-collector thread (its own
    context and two sockets: five eventfds, from the first zero-copy send of the
    process to its end). What the process held just before ``apgas.run`` is taken
    off, so the run's own are counted, and the slope between two sizes is compared."""

    def main(tcp_before: float):
        # links carry messages over Unix streams on one host (apgas._core.local_links):
        # the TCP ends are the heartbeats' own, which ZeroMQ connects in the background
        wanted = tcp_before + 2 * (len(apgas.places()) - 1)
        deadline = time.monotonic() + 30
        zero = proc_sample(os.getpid(), tcp_inodes())
        while zero["tcp"] < wanted and time.monotonic() < deadline:
            time.sleep(0.01)
            zero = proc_sample(os.getpid(), tcp_inodes())
        pids = [apgas.at(p, os.getpid) for p in apgas.places()]
        others = [apgas.at(p, lambda: proc_sample(os.getpid(), tcp_inodes()))
                  for p in apgas.places()[1:]]
        return zero, pids, others

    own: dict[int, dict[str, float]] = {}
    most: dict[int, dict[str, float]] = {}  # per size, the most a place held of each
    for n in SIZES:
        before = proc_sample(os.getpid(), tcp_inodes())
        zero, pids, others = apgas.run(functools.partial(main, before["tcp"]), places=n, threads=1)
        assert len(set(pids)) == n
        own[n] = {key: zero[key] - before[key] for key in OWN}
        assert 2 * (n - 1) <= own[n]["tcp"] <= 2 * (n - 1) + 1, own  # both ends of each link, a listener
        assert own[n]["eventfds"] <= _limits.SOCKETS_PER_PLACE * (n - 1) + PLACE_ZERO_EVENTFDS, own
        assert own[n]["fds"] <= _limits.FDS_PER_PLACE * (n - 1) + _limits.RESERVE_FDS, own
        for sample in others:  # an at() from place 0 opens no link to other places
            assert sample["tcp"] <= 4 and sample["fds"] <= 40, sample
            assert sample["threads"] <= 1 + _limits.THREADS_BESIDE_WORKERS + 2, sample
        most[n] = {key: max(sample[key] for sample in others) for key in OWN}
    small, big = SIZES
    added = big - small
    grown = {key: own[big][key] - own[small][key] for key in OWN}
    # place 0: in proportion, as check_start counts it
    assert grown["eventfds"] == _limits.SOCKETS_PER_PLACE * added, own
    # two TCP ends a place; one more may be held at either size, by timing (the bound
    # above), so the slope is exact to within that one
    assert abs(grown["tcp"] - 2 * added) <= 1, own
    assert 2 * added <= grown["fds"] <= _limits.FDS_PER_PLACE * added, own
    # a place: flat (place 0's reply channel may connect to it or not, by timing: one more)
    for key in OWN:
        assert most[big][key] - most[small][key] <= 1, (key, most)
