"""A state directory the scheduler cannot use is refused with a message naming it
(in use, not a database, newer), and a restarted scheduler's pool and the line
that tells the operator what it took up (``apgas_scheduler.live.resume``)."""

from __future__ import annotations

import collections
import sqlite3
import types
from pathlib import Path

import pytest

from apgas_scheduler.engine import Engine, Tracked
from apgas_scheduler.live.resume import end_all_left, resumed_line, settle_pool
from apgas_scheduler.live.state import DB_NAME, SCHEMA, StateError, StateStore
from apgas_scheduler.policies import get_policy

# -- the state directory ------------------------------------------------------------------------

def test_a_state_directory_serves_one_scheduler_at_a_time(tmp_path):
    first = StateStore(tmp_path / "state")
    try:
        with pytest.raises(StateError, match=f"^another scheduler uses the state directory "
                                             f"{tmp_path / 'state'} "):
            StateStore(tmp_path / "state")
    finally:
        first.close()
    StateStore(tmp_path / "state").close()  # free again once the first is closed


def test_a_state_file_that_is_not_a_database_is_named(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / DB_NAME).write_bytes(b"not a database at all, " * 100)
    (state / DB_NAME).chmod(0o600)
    with pytest.raises(StateError, match=f"^cannot use {state / DB_NAME}: file is not a database"):
        StateStore(state)
    StateStore(tmp_path / "other").close()


def test_a_database_path_that_is_a_directory_is_refused_and_the_lock_freed(tmp_path):
    state = tmp_path / "state"
    (state / DB_NAME).mkdir(parents=True)
    state.chmod(0o700)
    with pytest.raises(IsADirectoryError):
        StateStore(state)
    (state / DB_NAME).rmdir()
    StateStore(state).close()  # the failed start left the directory unlocked


def test_a_state_of_a_newer_scheduler_is_refused(tmp_path):
    StateStore(tmp_path / "state").close()
    db = sqlite3.connect(tmp_path / "state" / DB_NAME)
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA + 1),))
    db.commit()
    db.close()
    newer = rf"{DB_NAME} was written by a newer scheduler \(schema {SCHEMA + 1}\)"
    with pytest.raises(StateError, match=newer) as first:
        StateStore(tmp_path / "state")
    # the first error's traceback holds the refused store: it let go of the lock anyway,
    # so a second try says the same, not "another scheduler uses the state directory"
    with pytest.raises(StateError, match=newer):
        StateStore(tmp_path / "state")
    assert first.tb is not None


# -- a restarted scheduler's pool ---------------------------------------------------------------

def test_settle_pool_drains_held_nodes_not_asked_and_drops_free_ones():
    engine = Engine([f"n{i}" for i in range(4)], get_policy("easy"))
    job = Tracked(1, "rigid", 2, 2, 10.0, 0.0)
    engine.submit(job)
    engine.start(job, 2, 0.0)
    assert job.nodes == ["n0", "n1"]
    left, draining = settle_pool(engine, ["n1", "n3"])
    assert left == ["n2"] and draining == {"n0": 1}
    assert engine.left == [] and "n2" not in engine.owner and engine.owner["n0"] == 1


def test_resumed_line_tells_the_jobs_the_new_nodes_and_those_that_leave():
    line = resumed_line(Path("/s"), collections.Counter(running=2, ended=1, lost=0),
                        earlier=["n0", "n1", "n2", "n3", "n4"], asked=["n1", "n2", "n5"],
                        left=["n3", "n7"], draining={"n0": 4, "n4": 9})
    assert line.split("; ") == [
        "resumed the state in /s: 3 job(s) (1 ended, 2 running)",
        "pool n[1-2],n5 as asked, 3 node(s) (n5 new)",
        "n3,n7 left (not asked now)",  # n3 once, though both earlier and left
        "n0 drains (job 4 runs on it, not asked now: it leaves the pool when the job gives it back)",
        "n4 drains (job 9 runs on it, not asked now: it leaves the pool when the job gives it back)",
        "a different --state-dir starts afresh"]
    line = resumed_line(Path("/s"), collections.Counter(), earlier=["a", "b", "c"], asked=["d"],
                        left=[], draining={"a": 2, "c": 2})
    assert line.split("; ") == [
        "resumed the state in /s: 0 job(s)", "pool d as asked, 1 node(s) (all new)",
        "b left (not asked now)",
        "a,c drain (job 2 runs on them, not asked now: they leave the pool when the job gives "
        "them back)",
        "a different --state-dir starts afresh"]


def test_jobs_left_without_processes_end_at_once():
    stored = [types.SimpleNamespace(id=3, identity={}), types.SimpleNamespace(id=5, identity=None)]
    assert end_all_left(stored) == {}
    assert end_all_left([]) == {}
