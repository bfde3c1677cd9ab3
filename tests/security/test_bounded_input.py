"""Bounded input: a scheduler request line (size, nesting, numbers), a job's numbers,
and the number of places a grow order may reach (APGAS_MAX_PLACES)."""

from __future__ import annotations

import json
import time

import pytest
from orders import order

import apgas
from apgas._core.config import load_config
from apgas.errors import ConfigError
from apgas_scheduler.jobs import MAX_NODES, MAX_WALLTIME, JobFileError, parse_job
from apgas_scheduler.live.requests import MAX_DEPTH, RequestError, nesting, parse_request

pytestmark = pytest.mark.timeout(90)

GOOD = {"name": "j", "command": "python x.py", "class": "malleable", "min_nodes": 1,
        "max_nodes": 3, "walltime": 10}


# -- parse_request ------------------------------------------------------------------------

def test_a_good_request():
    assert parse_request('{"op": "status"}\n') == {"op": "status"}
    assert parse_request(b'{"op": "submit", "job": {"walltime": 1.5, "nodes": 2}}') == {
        "op": "submit", "job": {"walltime": 1.5, "nodes": 2}}
    assert parse_request('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}')["a"].startswith("[")


@pytest.mark.parametrize("depth", [200_000, 1000, MAX_DEPTH + 1])
def test_deep_nesting_is_refused_quickly_without_recursion(depth):
    line = '{"op": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    start = time.monotonic()
    with pytest.raises(RequestError, match=f"nested deeper than {MAX_DEPTH} levels .*: {depth}\\)"):
        parse_request(line)
    assert time.monotonic() - start < 5  # linear: a parse per level would take minutes


def test_nesting_at_the_limit_is_taken():
    line = '{"op": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}"
    assert nesting(line) == MAX_DEPTH
    assert isinstance(parse_request(line)["op"], list)


@pytest.mark.parametrize("line, said", [
    ('{"op": "submit", "job": {"walltime": Infinity}}', "request carries Infinity"),
    ('{"walltime": -Infinity}', "request carries -Infinity"),
    ('{"walltime": NaN}', "request carries NaN"),
    ('{"walltime": 1e400}', "the number 1e400, too big for a float"),
    ('{"max_nodes": ' + "9" * 1000 + "}", "an integer of 1000 digits"),
    ("[1, 2]", "a request is a JSON object"),
    ('"status"', "a request is a JSON object"),
    ('{"op": "status"', "not valid JSON"),
    ("", "empty request"),
    ("x" * (2 << 20), "request of 2097152 bytes; at most 1048576"),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_bad_requests_say_what_is_wrong(line, said):
    with pytest.raises(RequestError) as info:
        parse_request(line)
    assert said in str(info.value)
    assert isinstance(info.value, ValueError) and len(str(info.value)) < 200


# -- parse_job's numbers ------------------------------------------------------------------

@pytest.mark.parametrize("change, said", [
    ({"walltime": float("inf")}, f"key 'walltime': must be at most {MAX_WALLTIME:.0f} seconds (a year), got inf"),
    ({"walltime": float("nan")}, "key 'walltime': must be a positive number of seconds, got nan"),
    ({"walltime": 10 ** 1000}, "key 'walltime': must be at most"),
    ({"walltime": MAX_WALLTIME + 1}, "key 'walltime': must be at most"),
    ({"walltime": -1}, "key 'walltime': must be a positive number of seconds, got -1"),
    ({"walltime": True}, "key 'walltime': must be a positive number of seconds, got True"),
    ({"max_nodes": 10 ** 1000}, f"key 'max_nodes': must be a whole number from 1 to {MAX_NODES}, got "),
    ({"max_nodes": MAX_NODES + 1}, f"key 'max_nodes': must be a whole number from 1 to {MAX_NODES}, "
                                   f"got {MAX_NODES + 1}"),
    ({"min_nodes": True}, "key 'min_nodes': must be a whole number >= 1, got True"),
    ({"min_nodes": 2.0}, "key 'min_nodes': must be a whole number >= 1, got 2.0"),
    ({"env": {"A": float("inf")}}, "key 'env': A = inf is not a finite number"),
    ({"env": {"A=B": "1"}}, "key 'env': 'A=B' is not a variable name"),
    ({"env": {"A": "x\0y"}}, "contains a NUL character"),
    ({"env": {"APGAS_HOSTS": "n1,-V"}}, "key 'env': APGAS_HOSTS: host name '-V' starts with '-'"),
    ({"command": ["a\0b"]}, "key 'command': must be a string or a non-empty list of strings"),
])
def test_job_numbers_are_finite_and_in_range(change, said):
    with pytest.raises(JobFileError) as info:
        parse_job({**GOOD, **change}, "jobs/x.toml")
    assert said in str(info.value)
    assert len(str(info.value)) < 250  # a huge value is cut to about 40 characters


def test_job_numbers_at_the_limits_are_taken():
    spec = parse_job({**GOOD, "walltime": MAX_WALLTIME, "max_nodes": MAX_NODES})
    assert (spec.walltime, spec.max_nodes) == (MAX_WALLTIME, MAX_NODES)


def test_a_request_and_its_job_together():
    line = json.dumps({"op": "submit", "job": {**GOOD, "walltime": 1e300}})
    with pytest.raises(JobFileError, match="key 'walltime': must be at most"):
        parse_job(parse_request(line)["job"])


# -- APGAS_MAX_PLACES ---------------------------------------------------------------------

def test_max_places_is_configured():
    assert load_config(environ={}).max_places == 256
    assert load_config(environ={"APGAS_MAX_PLACES": "4"}).max_places == 4
    with pytest.raises(ConfigError, match="APGAS_MAX_PLACES must be an integer >= 1, got '0'"):
        load_config(environ={"APGAS_MAX_PLACES": "0"})


class Handler(apgas.MalleableHandler):
    def __init__(self):
        self.calls = []

    def pre_shrink(self, n):
        return apgas.places()[-n:]

    def pre_grow(self, n):
        self.calls.append(n)


def test_a_grow_past_max_places_is_refused_and_the_job_goes_on(monkeypatch):
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    monkeypatch.setenv("APGAS_MAX_PLACES", "4")
    for var in ("APGAS_SCHEDULER", "APGAS_MALLEABLE_LISTEN", "APGAS_COMMUNICATOR"):
        monkeypatch.delenv(var, raising=False)

    def main():
        handler = Handler()
        address = apgas.define_malleable_handler(handler).address
        big = order(address, "grow 12 " + " ".join(f"n{i}" for i in range(12)))
        huge = order(address, "grow 1000000000 n1")
        after_refusals = len(apgas.places())
        fits = order(address, "grow 2 a b")
        over = order(address, "grow 1 c")
        return big, huge, after_refusals, fits, over, handler.calls, order(address, "status")[0]

    big, huge, after_refusals, fits, over, calls, status = apgas.run(main, places=2)
    assert big == ["error grow 12 refused: the program has 2 place(s) and may have at most 4 "
                   "(APGAS_MAX_PLACES), so 14 is too many; nothing was started"]
    assert huge[0].startswith("error grow 1000000000 refused: the program has 2 place(s) and may "
                              "have at most 4")
    assert after_refusals == 2
    assert fits == ["ok grow 2 places 2 3"]
    assert over[0].startswith("error grow 1 refused: the program has 4 place(s) and may have at most 4")
    assert calls == [2]  # the handler saw the grow that fitted only
    assert status == "status malleable 4"


def test_the_scheduler_leaves_the_place_bound_to_the_job(tmp_path, monkeypatch):
    """A job may run several places per node, so max_nodes does not bound its places;
    the engine bounds the scheduler's grows by max_nodes instead."""
    from apgas_scheduler.live.daemon import Scheduler
    from apgas_scheduler.policies import get_policy

    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    sched = Scheduler(["node0", "node1", "node2", "node3"], get_policy("fcfs"), port=0,
                      output_dir=tmp_path / "out", order_port_base=24000)
    try:
        job_id = sched.submit(parse_job({**GOOD, "max_nodes": 3}))
        env = sched.processes.order_env(sched._jobs[job_id], "node0")
        assert "APGAS_MAX_PLACES" not in env
    finally:
        sched._finish()
