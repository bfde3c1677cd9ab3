"""Shared fixtures. Every test must leave nothing behind (``_leaks``), and tests that
share a daemon run in one pytest-xdist worker (:func:`pytest_itemcollected`)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from _browser import browser  # noqa: F401  (module fixture: headless Chromium, or a skip)
from _leaks import alive, leak_check, place_processes, private_tempdir, remove_tempdir  # noqa: F401
from _slurm import slurm_cluster  # noqa: F401  (session fixture: a 3-node Slurm on 127.0.0.1)
from _sshd import sshd  # noqa: F401  (session fixture: a real sshd on 127.0.0.1)
from hypothesis import settings
from orders import free_address, order_port_base
from vcluster import vcluster  # noqa: F401  (session fixture: hosts in network namespaces)

from apgas.testing import FakeScheduler, Script

pytest_plugins = ["_areas"]  # area markers and --changed
ROOT = Path(__file__).resolve().parent.parent

# CI replays the same examples every run, so a red CI is reproducible; a developer's
# run draws new ones and keeps hunting (a failure found that way is saved and replayed).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path factory is made
def pytest_configure(config):
    """Keys (the scheduler's, those of jobs started by hand) go to a directory of this
    run, not to ~/.apgas; jobs and CLIs started by the tests inherit it. A process
    that runs tests has a temporary directory of its own (``_leaks``)."""
    distributing = getattr(config, "workerinput", None) is None and config.getoption("dist", "no") != "no"
    if not distributing:
        config._tmp_path_factory.getbasetemp()  # pytest's own stays where it was, short
        private_tempdir(config)
    config._apgas_runtime = tempfile.mkdtemp(prefix="apgas-runtime-")
    os.environ["APGAS_RUNTIME_DIR"] = config._apgas_runtime


def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "_apgas_runtime", ""), ignore_errors=True)
    remove_tempdir(config)


#: a test that uses one of these fixtures (directly or through another) runs in the
#: pytest-xdist worker of its group, so the daemons behind it start once per run and two
#: never compete for the cores; the first that a test uses decides (the virtual cluster
#: uses sshd, and two of its kind would claim the same addresses)
SHARED_SERVICES = {"vcluster": "vcluster", "slurm_cluster": "slurm", "sshd": "sshd", "browser": "browser"}


#: single tests that take long (a build, a type check): started first, not last
LONG_FIRST = ("tests/test_docs.py", "tests/test_static_checks.py", "tests/security/test_fair_service.py")


def pytest_itemcollected(item):
    """Put each test that uses a shared daemon in that daemon's group (here, as it is
    collected: xdist reads the groups before any other hook may reorder the items)."""
    groups = [group for name, group in SHARED_SERVICES.items() if name in item.fixturenames]
    if groups and item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(groups[0]))


def pytest_collection_modifyitems(config, items):
    """Start the groups and the long tests first: xdist hands out work in this order,
    and a long group started last would leave the other workers idle at the end."""
    items.sort(key=lambda item: not (item.get_closest_marker("xdist_group")
                                     or item.nodeid.startswith(LONG_FIRST)))


@pytest.fixture(scope="session", autouse=True)
def lasting_singletons():
    """Start what a process keeps from its first use to its end, before any test, so
    that the leak check does not blame the first test that uses it: the one thread
    that copies forked places' stderr (``launcher._base.stderr_hub``) and pyzmq's
    thread (with its context and socket) that frees buffers sent without a copy.
    tqdm's monitor thread is turned off instead: it lives until the last bar of the
    whole process is collected, not closed."""
    import tqdm
    import zmq

    from launcher._base import stderr_hub

    stderr_hub()
    tqdm.tqdm.monitor_interval = 0
    with zmq.Context() as context, context.socket(zmq.PAIR) as a, context.socket(zmq.PAIR) as b:
        a.copy_threshold = 0
        a.bind("inproc://warm")
        b.connect("inproc://warm")
        sent = a.send(b"x", copy=False, track=True)
        b.recv()
    sent.wait()  # freed by pyzmq's thread: it and its socket are up


def fast_first(values, fast: int) -> list:
    """``values`` as test parameters: the first ``fast`` run in the README's command, the
    rest only in the slow group (``pytest -m slow``, which CI runs too), so a property
    keeps its whole sweep of seeds or cases without every run paying for it."""
    return [v if i < fast else pytest.param(v, marks=pytest.mark.slow) for i, v in enumerate(values)]


def group_alive(pgid: int) -> bool:
    """True while a process of the process group ``pgid`` runs."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def install_distribution(directory: Path, name: str, module: str, source: str,
                         entry_points: str) -> None:
    """Make ``directory`` hold a distribution as pip would install it: the module
    ``module`` (with ``source``) and a ``dist-info`` whose ``entry_points.txt`` is
    ``entry_points``. Put ``directory`` on the path to install it."""
    (directory / f"{module}.py").write_text(source)
    info = directory / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def eventually(predicate, what: str, timeout: float = 30.0):
    """The first true value of ``predicate()``, polled every 0.05 s; AssertionError
    naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_gone(pids, timeout: float) -> list[int]:
    """Wait until none of ``pids`` runs; return those still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


@pytest.fixture
def no_scheduler(monkeypatch):
    """A run of the test's own, not a job of a scheduler the environment names
    (``pytestmark = pytest.mark.usefixtures("no_scheduler")``)."""
    for var in ("APGAS_SCHEDULER", "APGAS_COMMUNICATOR"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def script(tmp_path):
    """Write a Python program to a file and start it in its own process."""
    procs: list[subprocess.Popen] = []

    def start(code: str, *args: str, **env: str) -> subprocess.Popen:
        path = tmp_path / "prog.py"
        path.write_text(textwrap.dedent(code))
        environ = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        proc = subprocess.Popen([sys.executable, *args, str(path)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=environ, cwd=ROOT)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pid in place_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()


@pytest.fixture
def apgas_caplog(caplog):
    """pytest's ``caplog``, also fed by the loggers of ``apgas``, ``glb`` and
    ``launcher``, which :func:`apgas.run` keeps from propagating to the root (their
    lines go to stderr, prefixed with the place)."""
    loggers = [logging.getLogger(name) for name in ("apgas", "glb", "launcher")]
    for logger in loggers:
        logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        for logger in loggers:
            logger.removeHandler(caplog.handler)


@pytest.fixture
def malleable_address(monkeypatch):
    """Every host name is local and the next job listens for orders on a free loopback port."""
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    address = free_address()
    monkeypatch.setenv("APGAS_MALLEABLE_LISTEN", "{}:{}".format(*address))
    return address


@pytest.fixture
def fake_scheduler(monkeypatch, malleable_address):
    """Make a FakeScheduler from a script and point the next job at it (APGAS_SCHEDULER)."""
    made: list[FakeScheduler] = []

    def make(script: Script) -> FakeScheduler:
        fake = FakeScheduler(script, malleable_address)
        monkeypatch.setenv("APGAS_SCHEDULER", "{}:{}".format(*fake.address))
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.close()


@pytest.fixture
def make_scheduler(tmp_path):
    """Start a scheduler in this process on ``nodes`` fake node names (all this machine)."""
    from apgas_scheduler.live.daemon import Scheduler
    from apgas_scheduler.policies import get_policy

    running: list[Scheduler] = []

    def start(nodes: int = 4, policy: str = "malleable", **options) -> Scheduler:
        monkey_hosts = [f"node{i}" for i in range(nodes)]
        sched = Scheduler(monkey_hosts, get_policy(policy, resize_interval=options.pop("resize", 0.5)),
                          port=0, events=tmp_path / "events.jsonl", interval=0.2,
                          # each its own state, so each its own output directory
                          **{"output_dir": tmp_path / ("out" if not running else f"out-{len(running)}"),
                             "state_dir": tmp_path / f"state-{len(running)}",
                                "order_port_base": order_port_base(), **options})
        running.append(sched.start())
        return sched

    old = os.environ.get("APGAS_LOCAL_HOSTS")
    os.environ["APGAS_LOCAL_HOSTS"] = "*"
    yield start
    for sched in running:
        sched.shutdown()
    for sched in running:
        for t in list(sched._threads):
            t.join(10)
        for job in sched._jobs.values():
            assert job.proc is None or job.proc.poll() is not None, f"job {job.id} left running"
    if old is None:
        os.environ.pop("APGAS_LOCAL_HOSTS", None)
    else:
        os.environ["APGAS_LOCAL_HOSTS"] = old


@pytest.fixture
def shared_dir():
    """A directory every user may write, sticky as /tmp is (jobs of other users leave
    their marks there, attackers plant things)."""
    path = Path(tempfile.mkdtemp(prefix="apgas-sec-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)
