"""The example communicator plugin (``examples/file_communicator.py``) of
``docs/communicators.md``: a real program takes grow and shrink orders from a
file, a bad order gets a clear error in the reply file and the program goes on;
asks are answered through the file; ``module:Class`` chooses a communicator."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
from conftest import eventually, install_distribution

import apgas
from apgas.malleable import MalleableCommunicator, SocketMalleableCommunicator, communicator_class

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
import file_communicator  # noqa: E402  (the example, from examples/)
from file_communicator import FileCommunicator, send  # noqa: E402

pytestmark = pytest.mark.timeout(60)

CHOSEN = "file_communicator:FileCommunicator"

PROGRAM = """
import os, time
from pathlib import Path
import apgas

stop = Path(os.environ["TEST_STOP_FILE"])
replies = Path(os.environ["FILE_COMMUNICATOR_DIR"]) / "replies"

class Newest(apgas.MalleableHandler):
    def pre_shrink(self, n, chosen=None):
        return apgas.places()[-n:]
    def post_shrink(self, n, removed):  # the hosts went back before this runs
        print("post_shrink saw released:", "released" in replies.read_text(), flush=True)

def main():
    apgas.define_malleable_handler(Newest())
    seen, rounds = None, 0
    while not stop.exists():
        try:
            now = [apgas.at(p, lambda: apgas.here().id) for p in apgas.places()]
        except (apgas.DeadPlaceError, apgas.MultipleException):
            continue  # a place left between places() and at: look again
        rounds += 1
        if now != seen:
            print("places", now, flush=True)
            seen = now
        time.sleep(0.02)
    apgas.disable_malleable_handler()
    print("rounds", rounds, "final", [p.id for p in apgas.places()], flush=True)

apgas.run(main, places=2)
"""


@pytest.fixture
def jobdir(tmp_path):
    path = tmp_path / "jobdir"
    path.mkdir(mode=0o700)
    return path


def test_a_program_takes_orders_from_the_file(script, jobdir, tmp_path):
    stop, replies = tmp_path / "stop", jobdir / "replies"
    path = os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")])
    proc = script(PROGRAM, APGAS_COMMUNICATOR=CHOSEN, FILE_COMMUNICATOR_DIR=str(jobdir),
                  APGAS_LOCAL_HOSTS="*", PYTHONPATH=path, TEST_STOP_FILE=str(stop))
    eventually(lambda: replies.exists() and "report APGAS-Ready" in replies.read_text(),
               "the job's ready report", 20)

    assert send(jobdir, "grow 1 nodeA", 20) == ["ok grow 1 places 2"]
    assert send(jobdir, "shrink 1", 20) == ["released nodeA", "ok shrink 1"]
    # bad orders: a clear error each, nothing changes, and the program goes on
    assert send(jobdir, "frobnicate 3", 20) == [
        "error unknown order 'frobnicate'; expected grow, shrink, status, refuse or answer"]
    assert send(jobdir, "grow 2 nodeB", 20) == [
        "error grow 2 needs 2 host name(s), got 1: ['nodeB']"]
    assert send(jobdir, "shrink 2", 20)[-1].startswith("error cannot shrink by 2: the program has 2")
    assert send(jobdir, "grow 1 -oProxyCommand=x", 20)[-1].startswith("error grow: host name")
    assert send(jobdir, "answer 7 ok", 20) == [
        "error no ask 7 is waiting for an answer (answered already, or not answered within 10 s)"]
    with open(jobdir / "orders", "ab") as orders:  # lines 8 and 9, as a broken scheduler writes
        orders.write(b"grow 1 \xffnode\n" + b"shrink " * 1000 + b"1\n")
    eventually(lambda: "9 error order line longer than 4096 bytes" in replies.read_text(),
               "the replies to two broken lines")
    assert "8 error order line is not UTF-8" in replies.read_text()
    assert send(jobdir, "grow 2 nodeB nodeC", 20) == ["ok grow 2 places 3 4"]
    status = send(jobdir, "status", 20)
    assert len(status) == 1 and status[0].startswith("ok status malleable 4 0@"), status
    assert status[0].endswith(" 3@nodeB 4@nodeC"), status

    stop.touch()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "places [0, 1]" in out and "places [0, 1, 2]" in out and "places [0, 1, 3, 4]" in out
    assert "post_shrink saw released: True" in out
    assert "final [0, 1, 3, 4]" in out
    lines = replies.read_text().splitlines()
    numbered = [line for line in lines if line[0].isdigit()]
    assert [line.split()[0] for line in numbered if " ok " in line or " error " in line] == \
        [str(k) for k in range(1, 12)], "one final reply per order line, in order"
    assert lines[0] == "report APGAS-Ready" and lines[-1] == "report APGAS-NotMalleable"
    assert any(line.startswith("report growTimeAPGAS;2;") for line in lines)
    assert "refused" in err and "frobnicate" in err  # logged at place 0 as well


def test_asks_are_answered_through_the_file(jobdir, monkeypatch):
    monkeypatch.setenv("APGAS_COMMUNICATOR", CHOSEN)
    monkeypatch.setenv("FILE_COMMUNICATOR_DIR", str(jobdir))
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    monkeypatch.setattr(FileCommunicator, "ANSWER_TIMEOUT", 1.0)
    replies = jobdir / "replies"

    def scheduler():
        """Answer the request, then grant it with a grow order."""
        eventually(lambda: "ask 1 Evolving;Request;1" in replies.read_text(), "the request", 20)
        assert send(jobdir, "answer 1 ok 1", 20) == ["ok answer 1"]
        assert send(jobdir, "grow 1 nodeA", 20) == ["ok grow 1 places 1"]

    def main():
        communicator = apgas.define_malleable_handler(Newest())
        request = apgas.request_grow(1)
        helper = threading.Thread(target=scheduler)
        helper.start()
        added = request.result(timeout=20)
        helper.join(20)
        with pytest.raises(apgas.ApgasError, match="did not answer ask 2 .*within 1 s"):
            apgas.check_status(1, 4, None, 1)  # nobody answers this one
        return type(communicator).__name__, communicator.address, [p.id for p in added]

    assert apgas.run(main, places=1) == ("FileCommunicator", None, [1])
    assert "ask 2 Evolving;Check;1;4;0;1" in replies.read_text()


class Newest(apgas.MalleableHandler):
    def pre_shrink(self, n, chosen=None):
        return apgas.places()[-n:]


def test_an_order_directory_others_can_write_is_refused(jobdir, monkeypatch):
    jobdir.chmod(0o777)
    monkeypatch.setenv("APGAS_COMMUNICATOR", CHOSEN)
    monkeypatch.setenv("FILE_COMMUNICATOR_DIR", str(jobdir))
    with pytest.raises(apgas.ConfigError, match="may be written by others"):
        apgas.run(lambda: apgas.define_malleable_handler(Newest()), places=1)
    monkeypatch.delenv("FILE_COMMUNICATOR_DIR")
    with pytest.raises(apgas.ConfigError, match="needs FILE_COMMUNICATOR_DIR"):
        apgas.run(lambda: apgas.define_malleable_handler(Newest()), places=1)


def test_a_communicator_is_chosen_as_module_colon_class(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    assert communicator_class(CHOSEN) is file_communicator.FileCommunicator
    assert communicator_class("socket") is SocketMalleableCommunicator
    with pytest.raises(apgas.ConfigError, match="cannot import 'no_such_module_here'"):
        communicator_class("no_such_module_here:Communicator")
    with pytest.raises(apgas.ConfigError, match="has no 'Missing'"):
        communicator_class("file_communicator:Missing")
    with pytest.raises(apgas.ConfigError, match="not a subclass of apgas.malleable.MalleableCommunicator"):
        communicator_class("file_communicator:order_dir")
    with pytest.raises(apgas.ConfigError, match="must be a name, or module:Class"):
        communicator_class("file communicator:x")
    with pytest.raises(apgas.ConfigError, match="known: .*or module:Class"):
        communicator_class("carrier-pigeon")


def test_an_entry_point_that_cannot_be_loaded_is_a_config_error(tmp_path, monkeypatch):
    """A registered communicator whose class is missing or whose module does not
    import: ConfigError naming the entry point, its value and its distribution."""
    install_distribution(tmp_path, "pigeon-post", "pigeon_post", "X = 1\n",
                         "[apgas.communicators]\nghost = pigeon_post:Missing\n"
                         "gone = no_such_pigeon_module:Post\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(apgas.ConfigError, match=r"the communicator 'ghost' \(APGAS_COMMUNICATOR\): "
                       r"entry point 'ghost' of apgas.communicators \(pigeon_post:Missing\) cannot "
                       r"be loaded: AttributeError: .*declared by pigeon-post"):
        communicator_class("ghost")
    with pytest.raises(apgas.ConfigError, match=r"\(no_such_pigeon_module:Post\) cannot be loaded: "
                       r"ModuleNotFoundError.*declared by pigeon-post"):
        communicator_class("gone")
    sys.modules.pop("pigeon_post", None)


class Quiet(MalleableCommunicator):
    """The least a communicator implements."""

    def start(self):
        pass

    def report(self, message):
        pass

    def stop(self):
        pass


def test_a_communicator_listens_nowhere_unless_it_says_where():
    quiet = Quiet(None, None)  # the runtime would give its Orders and Config
    assert quiet.address is None and not quiet.attached and quiet.answers_asks
    with pytest.raises(apgas.ApgasError, match="the Quiet cannot ask the scheduler anything"):
        quiet.ask("Evolving;Request;1")
