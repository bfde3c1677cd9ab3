"""Places forked from a warmed template (``start_method`` ``fork``, :mod:`launcher._forkserver`):
they behave like fresh interpreters, and nothing of them or of the template stays behind."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import pytest
from conftest import alive, eventually, wait_gone
from orders import order

import apgas
from apgas import DeadPlaceError
from apgas._core.config import load_config
from apgas.errors import ConfigError
from launcher import _forkserver

pytestmark = pytest.mark.timeout(60)


def whoami() -> tuple[int, int, int, tuple[list[bytes], bytes]]:
    """This place's id, pid, parent pid, and its interpreter's command line (a forked
    place's is the template's) with the title ``ps`` shows (launcher._proctitle)."""
    with open("/proc/self/cmdline", "rb") as f:
        title = f.read().rstrip(b"\0")
    return apgas.here().id, os.getpid(), os.getppid(), ([a.encode() for a in sys.orig_argv], title)


def descriptors() -> dict[int, str]:
    """What this process's descriptors point to (``pipe:[inode]``, ``socket:[...]``, ...)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # the directory listing's own descriptor
    return found


def report_home(ref: apgas.GlobalRef) -> None:
    """Append this place's id to the list at the reference's home."""
    mine = apgas.here().id
    apgas.at(ref.home, lambda: ref.get().append(mine))


def surroundings() -> tuple[str, str, str, float]:
    """What a place inherits from the launching place, and a draw of numpy's global stream."""
    import numpy.random

    return (os.environ.get("FORK_MARK", ""), os.environ.get("FORK_LATE", ""), os.getcwd(),
            numpy.random.random())


def check_forked(infos) -> None:
    """Every place but 0 was forked from the template, and is place 0's child all the same.
    Its title (launcher._proctitle) says which place it is, as a fresh place's does."""
    for place, _, ppid, (argv, title) in infos:
        if place != 0:
            assert b"--fork-server" in argv and ppid == os.getpid(), infos
            assert title.startswith(f"apgas place {place} (".encode()), infos
            assert title.endswith(f"--parent {os.getpid()} --place {place}]".encode()), infos


def check_fresh(infos) -> None:
    """Every place but 0 is a fresh interpreter, started by place 0."""
    for place, _, ppid, (argv, title) in infos[1:]:
        assert ppid == os.getpid() and b"--fork-server" not in argv, infos
        assert argv[argv.index(b"--place") + 1] == str(place).encode()
        assert title.startswith(f"apgas place {place} (".encode()), infos


def subreaper() -> bool:
    """Whether this process adopts orphans now (PR_GET_CHILD_SUBREAPER): only while place
    starts are in flight."""
    flag = ctypes.c_int(0)
    assert ctypes.CDLL(None).prctl(37, ctypes.c_ulong(ctypes.addressof(flag)), 0, 0, 0) == 0
    return bool(flag.value)


def template() -> int:
    """At place 0: the pid of this run's template."""
    server = _forkserver._shared
    assert server is not None and not server.lost
    return server.proc.pid


class Newest(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]


def test_forked_places_run_tasks_and_at(monkeypatch, tmp_path):
    monkeypatch.setenv("APGAS_START_METHOD", "fork")
    monkeypatch.setenv("FORK_MARK", "given")
    monkeypatch.chdir(tmp_path)

    def main():
        infos = [apgas.at(p, whoami) for p in apgas.places()]
        seen = [template()]
        ref = apgas.GlobalRef(seen)
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, report_home, ref)
        fds = {p.id: apgas.at(p, descriptors) for p in apgas.places()[1:]}
        assert not subreaper()
        return infos, seen, fds, [apgas.at(p, surroundings) for p in apgas.places()[1:]]

    infos, seen, fds, where = apgas.run(main, places=4, threads=1)
    forker = seen.pop(0)
    assert [i for i, *_ in infos] == [0, 1, 2, 3] and sorted(seen) == [0, 1, 2, 3]
    check_forked(infos)
    assert len({pid for _, pid, _, _ in infos}) == 4
    assert [w[:3] for w in where] == [("given", "", str(tmp_path))] * 3
    assert len({w[3] for w in where}) == 3  # each place its own random stream
    for place, mine in fds.items():  # a place holds its own pipes, none of another place's
        own = {mine[0], mine[2]}
        others = {link for other, theirs in fds.items() if other != place
                  for link in (theirs[0], theirs[2])}
        assert own.isdisjoint(others) and not (set(mine.values()) & others), (place, fds)
    assert wait_gone([forker, *(pid for _, pid, _, _ in infos[1:])], 30.0) == []


def test_grow_and_shrink_with_forked_places(malleable_address, monkeypatch):
    monkeypatch.setenv("APGAS_START_METHOD", "fork")

    def main():
        address = apgas.define_malleable_handler(Newest()).address
        os.environ["FORK_LATE"] = "set in main"  # a grow's places get the environment of now
        grown = order(address, "grow 3 hostA hostB hostC")
        infos = [apgas.at(p, whoami) for p in apgas.places()]
        late = [apgas.at(p, surroundings)[1] for p in apgas.places()[2:]]
        shrunk = order(address, "shrink 2")
        gone = wait_gone([pid for _, pid, _, _ in infos[3:]], 30.0)
        return grown, infos, late, shrunk, gone, [p.id for p in apgas.places()], template()

    try:
        grown, infos, late, shrunk, gone, left, forker = apgas.run(main, places=2, threads=1)
    finally:
        os.environ.pop("FORK_LATE", None)
    assert grown == ["ok grow 3 places 2 3 4"] and shrunk == ["hostB", "hostC"] and gone == []
    check_forked(infos)
    assert late == ["set in main"] * 3 and left == [0, 1, 2]
    assert wait_gone([forker, *(pid for _, pid, _, _ in infos[1:])], 30.0) == []


def sleep_long() -> None:
    time.sleep(60)


def test_forked_place_that_dies_is_a_dead_place(monkeypatch):
    monkeypatch.setenv("APGAS_START_METHOD", "fork")

    def main():
        infos = [apgas.at(p, whoami) for p in apgas.places()]
        victim = infos[1][1]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(DeadPlaceError, match="place 1"):
            apgas.at(apgas.place(1), sleep_long)
        eventually(lambda: 1 not in [p.id for p in apgas.places()], "place 1 declared dead", 30)
        return infos, apgas.at(apgas.place(2), lambda: apgas.here().id)

    infos, two = apgas.run(main, places=3, threads=1)
    assert two == 2
    check_forked(infos)
    assert not alive(infos[1][1])


def test_dead_place_reports_its_signal_as_exit_code(monkeypatch):
    monkeypatch.setenv("APGAS_START_METHOD", "fork")

    def main():
        rt = apgas._core.runtime.current()
        place = rt._children[1]
        pid = apgas.at(apgas.place(1), os.getpid)
        assert place.pid == pid and place.poll() is None
        place.kill()
        return place.wait(30), place.poll()

    assert apgas.run(main, places=2, threads=1) == (-signal.SIGKILL, -signal.SIGKILL)


def test_spawn_start_method_uses_fresh_interpreters(monkeypatch):
    monkeypatch.setenv("APGAS_START_METHOD", "spawn")
    infos = apgas.run(lambda: [apgas.at(p, whoami) for p in apgas.places()], places=3, threads=1)
    check_fresh(infos)
    assert _forkserver._shared is None


@pytest.mark.parametrize("overrides, environ", [
    ({}, {"APGAS_START_METHOD": "vfork"}),
    ({"start_method": "forkserver"}, {}),
])
def test_bad_start_method_is_named(overrides, environ):
    bad = overrides.get("start_method") or environ["APGAS_START_METHOD"]
    with pytest.raises(ConfigError, match=rf"must be one of \['fork', 'spawn'\], got '{bad}'"):
        load_config(overrides, environ)
    assert load_config({}, {}).start_method == "fork"  # Linux


def preloaded() -> tuple[bool, bool]:
    """Whether this place came with xml.dom.minidom imported and marked_module's mark() called."""
    marked = sys.modules.get("marked_module")
    return "xml.dom.minidom" in sys.modules, getattr(marked, "MARKED", False)


@pytest.mark.parametrize("preload", [
    None, "xml.dom.minidom, no_such_module_here, json:nothing, marked_module:mark"])
def test_preloaded_modules_come_with_every_forked_place(preload, monkeypatch, tmp_path, capfd):
    """``APGAS_PRELOAD``: the template imports the modules (and calls a function named
    with one) once, for every place it forks; an entry that fails is named and skipped."""
    (tmp_path / "marked_module.py").write_text("MARKED = False\n\n\ndef mark():\n"
                                               "    global MARKED\n    MARKED = True\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("APGAS_START_METHOD", "fork")
    if preload:
        monkeypatch.setenv("APGAS_PRELOAD", preload)

    def main():
        infos = [apgas.at(p, whoami) for p in apgas.places()]
        return infos, [apgas.at(p, preloaded) for p in apgas.places()[1:]]

    infos, found = apgas.run(main, places=3, threads=1)
    check_forked(infos)
    assert found == [(bool(preload), bool(preload))] * 2
    err = capfd.readouterr().err
    assert ("'no_such_module_here' failed: ModuleNotFoundError" in err) == bool(preload)
    assert ("'json:nothing' failed: AttributeError" in err) == bool(preload)


def test_a_preloaded_module_that_starts_a_thread_means_fresh_interpreters(monkeypatch, tmp_path,
                                                                          capfd):
    (tmp_path / "threaded_module.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), name='busy', daemon=True).start()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("APGAS_START_METHOD", "fork")
    monkeypatch.setenv("APGAS_PRELOAD", "threaded_module")
    infos = apgas.run(lambda: [apgas.at(p, whoami) for p in apgas.places()], places=3, threads=1)
    check_fresh(infos)
    err = capfd.readouterr().err
    assert "started threads (busy), which a fork cannot copy" in err
    assert "places start as fresh interpreters" in err


def test_a_bad_preload_is_named():
    for bad in ("1bad", "m:", "m:f:g", "a b"):
        with pytest.raises(ConfigError, match=rf"APGAS_PRELOAD must be comma-separated module "
                                              rf"names, .* got '{bad}'"):
            load_config({}, {"APGAS_PRELOAD": f"glb.apps.uts, {bad}"})
    assert load_config({}, {"APGAS_PRELOAD": " glb.apps.uts:warm_up ,numba "}).preload == \
        "glb.apps.uts:warm_up,numba"


def test_a_dead_template_falls_back_to_spawn(malleable_address, monkeypatch, capfd):
    monkeypatch.setenv("APGAS_START_METHOD", "fork")

    def main():
        address = apgas.define_malleable_handler(Newest()).address
        forker = template()
        os.kill(forker, signal.SIGKILL)
        assert wait_gone([forker], 30.0) == []
        grown = order(address, "grow 1 hostA")
        return grown, [apgas.at(p, whoami) for p in apgas.places()]

    grown, infos = apgas.run(main, places=2, threads=1)
    assert grown == ["ok grow 1 places 2"]
    check_forked(infos[:2])  # it lived on, and was stopped at the end
    check_fresh([infos[0], infos[2]])
    assert "places start as fresh interpreters" in capfd.readouterr().err
    assert wait_gone([pid for _, pid, _, _ in infos[1:]], 30.0) == []


def test_a_hanging_template_is_replaced_by_fresh_interpreters(malleable_address, monkeypatch,
                                                              capfd):
    monkeypatch.setenv("APGAS_START_METHOD", "fork")
    monkeypatch.setattr(_forkserver, "REPLY_TIMEOUT_S", 1.0)

    def main():
        address = apgas.define_malleable_handler(Newest()).address
        forker = template()
        os.kill(forker, signal.SIGSTOP)  # the grow's requests stay unanswered
        grown = order(address, "grow 2 hostA hostB")
        return forker, grown, [apgas.at(p, whoami) for p in apgas.places()]

    forker, grown, infos = apgas.run(main, places=2, threads=1)
    assert grown == ["ok grow 2 places 2 3"]
    check_forked(infos[:2])
    check_fresh([infos[0], *infos[2:]])
    assert "did not answer in time" in capfd.readouterr().err
    assert wait_gone([forker, *(pid for _, pid, _, _ in infos[1:])], 30.0) == []


def test_a_template_that_cannot_start_means_fresh_interpreters(monkeypatch, capfd):
    monkeypatch.setenv("APGAS_START_METHOD", "fork")

    def refuse(self, python="", preload=""):
        raise OSError("no template today")

    monkeypatch.setattr(_forkserver.ForkServer, "__init__", refuse)
    infos = apgas.run(lambda: [apgas.at(p, whoami) for p in apgas.places()], places=3, threads=1)
    check_fresh(infos)
    assert "the fork server could not start (no template today)" in capfd.readouterr().err


PROGRAM = """
import os, sys, time
import apgas
from launcher import _forkserver

def main():
    pids = [apgas.at(p, os.getpid) for p in apgas.places()[1:]]
    print("PIDS", _forkserver._shared.proc.pid, *pids, flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(60)

apgas.run(main, places=3, threads=1)
"""


def started(proc) -> list[int]:
    """The template's pid, then the places'."""
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return [int(x) for x in line.split()[1:]]


def test_nothing_stays_when_place_0_exits(script):
    proc = script(PROGRAM.replace("sys.argv[1]", "'return'"), APGAS_START_METHOD="fork")
    pids = started(proc)
    assert proc.wait(60) == 0, proc.stderr.read()
    assert wait_gone(pids, 30.0) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_nothing_stays_when_place_0_is_killed(script, sig):
    proc = script(PROGRAM.replace("sys.argv[1]", "'sleep'"), APGAS_START_METHOD="fork")
    pids = started(proc)
    os.kill(proc.pid, sig)
    proc.wait(30)
    assert wait_gone(pids, 30.0) == []
