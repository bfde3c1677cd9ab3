"""The ElasticJobScheduler recipe runs as written (issue 29, part 5).

The job script of ``docs/schedulers.md`` and ``docs/protocol.md`` is read as EJS
reads it (``JobSh.setData``/``parse`` at commit bbc307e82c5f), run with a stand-in
``python`` that shows the command and environment it gets, and its command is
parsed with ``glb.apps``' own argument parser, so a ``-d 14`` drifts no more.
``ejs-env``'s mapping, the warning for a shrink reply later than EJS waits for
it, and the two output lines EJS's ``plotExperiments.py`` reads are tested too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ejs_like import EjsLike, point_job_at
from orders import free_port

import apgas
from apgas import ejs
from apgas.__main__ import main as apgas_main
from apgas.errors import ConfigError
from glb.apps import APPS
from glb.apps.cli import build_parser, load_app

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "schedulers.md", ROOT / "docs" / "protocol.md"]

# The patterns of EJS's scripts/python/plotExperiments.py (apgas_start_time), as it reads
# a job's output files.
STARTUP_PATTERN = r"\[APGAS\] Place startup time: (\d+\.\d+) sec"
INIT_PATTERN = r"Initialization time \(s\); (\d+\.\d+)"


# -- the script as EJS reads it -------------------------------------------------------
def job_scripts(page: Path) -> list[str]:
    """The ``sh`` blocks of ``page`` that carry EJS's ``#JOB_TYPE`` header."""
    blocks = re.findall(r"^```sh\n(.*?)^```", page.read_text(), re.M | re.S)
    return [block for block in blocks if re.search(r"^#JOB_TYPE", block, re.M)]


def java_int(text: str) -> int:
    """``Integer.parseInt``/``Long.parseLong``: a sign and ASCII digits, nothing else."""
    if re.fullmatch(r"[+-]?[0-9]+", text) is None:
        raise ValueError(f"NumberFormatException: For input string: {text!r}")
    return int(text)


def ejs_header(script: str) -> dict:
    """What EJS takes from a job script: ``JobSh.setData`` on every line, then ``parse``.

    A line counts when it starts with ``#``; every ``#`` is removed, and the first key
    of JOB_TYPE, JOB_CLASS, MIN_NODES, MAX_NODES, NODES, JOB_NAME, REQUIRED_TIME that
    occurs anywhere in it takes the rest, trimmed (in that order, so a name holding
    ``NODES`` is read as a node count)."""
    job_type = job_class = None
    low = high = 0
    name, required_ms = "job", 60_000  # Job's defaults (DEFAULT_REQUIRED_TIME_IN_MILLIS)
    for line in re.split(r"\r\n|\r|\n", script):  # BufferedReader.readLine
        if not line.startswith("#"):
            continue
        line = line.replace("#", "")
        for key in ("JOB_TYPE", "JOB_CLASS", "MIN_NODES", "MAX_NODES", "NODES", "JOB_NAME",
                    "REQUIRED_TIME"):
            if key in line:
                value = line.replace(key, "").strip()
                if key == "JOB_TYPE":
                    job_type = value
                elif key == "JOB_CLASS":
                    job_class = value
                elif key == "MIN_NODES":
                    low = java_int(value)
                elif key == "MAX_NODES":
                    high = java_int(value)
                elif key == "NODES":
                    low = high = java_int(value)
                elif key == "JOB_NAME":
                    name = value
                else:
                    required_ms = java_int(value)
                break
    if job_class == "rigid":
        if high > 0:
            low = high
        if high == 0 and low > 0:
            high = low
    low = low or 1
    high = max(high, low)
    return {"type": job_type, "class": job_class, "min": low, "max": high, "name": name,
            "required_ms": required_ms}


def test_the_header_reader_reads_as_ejs_does():
    """The reader has EJS's quirks, so that the docs' script is held to them."""
    assert ejs_header("#!/bin/sh\nexec true\n")["type"] is None  # EJS: "is Overdue", no ssh
    assert ejs_header("#JOB_CLASS rigid\n#NODES 3\n")["min"] == 3
    with pytest.raises(ValueError, match="NumberFormatException"):
        ejs_header("#JOB_TYPE apgas\n# NODES are given by EJS\n")
    assert ejs_header("#JOB_NAME ## x\n")["name"] == "x"
    assert ejs_header("#JOB_CLASS malleable\n#MIN_NODES 2\n")["max"] == 2


def test_the_docs_give_one_complete_ejs_job_script():
    scripts = [job_scripts(page) for page in PAGES]
    assert [len(found) for found in scripts] == [1, 1], "one EJS job script per page"
    assert scripts[0][0] == scripts[1][0], "the two pages give different EJS job scripts"
    script = scripts[0][0]
    assert script.startswith("#!/bin/sh\n")  # EJS's ssh runs the script itself
    job = ejs_header(script)
    assert job["type"] == "apgas", job  # Constants.JOB_TYPE_APGAS: else nothing starts
    assert job["class"] == "malleable", job
    assert "malleable" in str(job["name"]).lower(), job  # else EJS sets ELASTIC=rigid
    assert 1 <= job["min"] < job["max"], job  # room to grow
    assert job["required_ms"] >= 10 * 60_000, job  # EJS kills the job after it
    command = script_command(script)
    assert "--malleable" in command and "--evolving" not in command


# -- the commands, with the real argument parser ------------------------------------
SAMPLE_ENV = {"WORKERS": "2", "NODES": "2"}


def expand(word: str) -> str:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` as sh expands them in SAMPLE_ENV."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return SAMPLE_ENV.get(name) or (m.group(4) if m.group(3) else "")
    return re.sub(r"\$(?:(\w+)|\{(\w+)(:-([^}]*))?\})", one, word)


def glb_commands(text: str) -> list[list[str]]:
    """Every ``python -m glb.apps ...`` command of ``text``: its words after ``glb.apps``."""
    found = []
    for line in text.splitlines():
        if "-m glb.apps " not in line:
            continue
        words = shlex.split(line.split("-m glb.apps ", 1)[1].split("#", 1)[0])
        found.append([expand(word) for word in words])
    return found


def script_command(script: str) -> list[str]:
    (command,) = glb_commands(script)
    return command


@pytest.fixture(scope="module")
def parser():
    return build_parser({name: load_app(name) for name in APPS})


def parse(parser, argv: list[str]):
    """``glb.apps``' parse, and its app's own checks of the values; AssertionError names
    the command and argparse's complaint."""
    try:
        ns = parser.parse_args(argv)
    except SystemExit:
        raise AssertionError(f"python -m glb.apps {shlex.join(argv)}: glb.apps refuses it "
                             f"(see its usage above)") from None
    load_app(ns.app).params(ns)  # ranges, e.g. --depth 1..30
    return ns


def test_the_old_recipe_is_refused_by_the_parser(parser, capsys):
    with pytest.raises(AssertionError, match="glb.apps refuses it"):
        parse(parser, ["uts", "--malleable", "-d", "14"])
    assert "unrecognized arguments: -d 14" in capsys.readouterr().err


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_glb_apps_command_of_the_page_parses(parser, page):
    commands = glb_commands(page.read_text())
    assert commands, f"{page.name} shows no python -m glb.apps command"
    for argv in commands:
        parse(parser, argv)


def test_the_job_scripts_command_is_what_it_means(parser):
    ns = parse(parser, script_command(job_scripts(PAGES[0])[0]))
    assert (ns.app, ns.depth, ns.malleable, ns.workers) == ("uts", 14, True, 2)


# -- the script, run ------------------------------------------------------------------
def run_script(tmp_path: Path, **changes: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the docs' job script as EJS's ssh launcher does, with a stand-in ``python``
    first on PATH: ``-m glb.apps`` records its arguments and environment, anything
    else (``-m apgas ejs-env``) runs for real."""
    script = tmp_path / "UTS_14_malleable_1-4.sh"
    script.write_text(job_scripts(PAGES[0])[0])
    script.chmod(0o755)
    nodes = tmp_path / "UTS_14_malleable_1-4.nodeFile.1"
    nodes.write_text("localhost\nlocalhost\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "record.json"
    stand_in = bin_dir / "python"
    python = shlex.quote(sys.executable)
    show = ('import json, os, sys; json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, '
            'open(os.environ["RECIPE_RECORD"], "w"))')
    stand_in.write_text("#!/bin/sh\n"
                        'if [ "$1 $2" = "-m glb.apps" ]; then\n'
                        f'  exec {python} -c {shlex.quote(show)} "$@"\n'
                        "fi\n"
                        f'exec {python} "$@"\n')
    stand_in.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APGAS_") or k == "APGAS_RUNTIME_DIR"}
    env.update({"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                "RECIPE_RECORD": str(record),
                # what EJS's SshLauncher gives the script
                "NODES": "2", "NODE_FILE": str(nodes), "SCHEDULER_IP": "127.0.0.1",
                "SCHEDULER_PORT": "8081", "SCRIPT_DIR": str(tmp_path),
                "LAUNCHER": "apgas.launcher.SshLauncher", "WORKERS": "2",
                "ELASTIC": "malleable", "JOBNAME": "1", "PORT": "5702", **changes})
    done = subprocess.run([str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=30)
    return done, json.loads(record.read_text()) if record.exists() else {}


def test_the_job_script_runs_as_written(tmp_path, parser):
    done, seen = run_script(tmp_path)
    assert done.returncode == 0, done.stderr
    argv, env = seen["argv"], seen["env"]
    assert argv[:2] == ["-m", "glb.apps"]
    ns = parse(parser, argv[2:])
    assert (ns.app, ns.depth, ns.malleable, ns.workers) == ("uts", 14, True, 2)
    apgas_env = {k: v for k, v in env.items() if k.startswith("APGAS_") and k != "APGAS_RUNTIME_DIR"}
    assert apgas_env == {
        "APGAS_HOSTFILE": str(tmp_path / "UTS_14_malleable_1-4.nodeFile.1"),
        "APGAS_LAUNCHER": "ssh", "APGAS_INTERFACE": "127.0.0.1", "APGAS_LOCAL_HOSTS": "localhost",
        "APGAS_SCHEDULER": "127.0.0.1:8081", "APGAS_MALLEABLE_LISTEN": "127.0.0.1:8081",
        "APGAS_PLAIN_PROTOCOL": "1", "APGAS_THREADS": "2"}
    assert ejs.started_by_ejs(env)  # so the job prints the lines EJS's analysis reads


def test_the_job_script_stops_when_ejs_env_refuses(tmp_path):
    done, seen = run_script(tmp_path, LAUNCHER="apgas.launcher.Telepathy")
    assert done.returncode != 0 and seen == {}  # the program never started
    assert "LAUNCHER 'apgas.launcher.Telepathy' is no launcher apgas knows" in done.stderr


# -- ejs-env's mapping ----------------------------------------------------------------
@pytest.fixture
def node_file(tmp_path):
    path = tmp_path / "nodes"
    path.write_text("localhost\nlocalhost\n")
    return str(path)


def ejs_env(node_file: str, **changes: str) -> dict[str, str]:
    given = {"NODE_FILE": node_file, "SCHEDULER_IP": "10.1.2.3", "SCHEDULER_PORT": "8081",
             "LAUNCHER": "apgas.launcher.SshLauncher", "WORKERS": "4", **changes}
    return ejs.ejs_environment({k: v for k, v in given.items() if v is not None})


def test_ejs_env_maps_launcher_interface_and_scheduler(node_file):
    assert ejs_env(node_file) == {
        "APGAS_HOSTFILE": node_file, "APGAS_LAUNCHER": "ssh", "APGAS_INTERFACE": "127.0.0.1",
        "APGAS_LOCAL_HOSTS": "localhost", "APGAS_SCHEDULER": "10.1.2.3:8081",
        "APGAS_MALLEABLE_LISTEN": "127.0.0.1:8081", "APGAS_PLAIN_PROTOCOL": "1",
        "APGAS_JOB_ID": "", "APGAS_THREADS": "4"}
    assert ejs_env(node_file, LAUNCHER="apgas.launcher.SrunLauncher")["APGAS_LAUNCHER"] == "srun"
    assert ejs_env(node_file, LAUNCHER="local")["APGAS_LAUNCHER"] == "local"  # ours, as is
    assert ejs_env(node_file, LAUNCHER=None)["APGAS_LAUNCHER"] == "ssh"  # EJS's default
    assert "APGAS_THREADS" not in ejs_env(node_file, WORKERS=None)
    merged = ejs_env(node_file, APGAS_LOCAL_HOSTS="a, b")["APGAS_LOCAL_HOSTS"]
    assert merged == "a,b,localhost"


@pytest.mark.parametrize("changes, message", [
    ({"LAUNCHER": "apgas.launcher.MagicLauncher"},
     r"LAUNCHER 'apgas.launcher.MagicLauncher' is no launcher apgas knows: expected "
     r"apgas.launcher.SshLauncher \(ssh\), apgas.launcher.SrunLauncher \(srun\) or one of ours"),
    ({"WORKERS": "four"}, r"WORKERS must be a positive whole number, got 'four'"),
    ({"WORKERS": "0"}, r"WORKERS must be a positive whole number, got '0'"),
    ({"SCHEDULER_IP": "-oProxyCommand=x"}, r"SCHEDULER_IP must be the scheduler's address: host "
                                           r"name '-oProxyCommand=x' starts with '-'"),
    ({"SCHEDULER_PORT": "80810"}, r"SCHEDULER_PORT must be a TCP port, got '80810'"),
    ({"SCHEDULER_IP": ""}, r"not a job of the ElasticJobScheduler: SCHEDULER_IP not set"),
    ({"NODE_FILE": "/nonexistent/nodes"}, r"NODE_FILE: cannot read host file '/nonexistent/nodes'"),
])
def test_ejs_env_names_a_bad_value(node_file, changes, message):
    with pytest.raises(ConfigError, match=message):
        ejs_env(node_file, **changes)


def test_ejs_env_refuses_a_first_node_that_is_not_this_machine(tmp_path):
    if Path("/proc/sys/net/ipv4/ip_nonlocal_bind").read_text().strip() != "0":
        pytest.skip("this machine binds any address (net.ipv4.ip_nonlocal_bind)")
    nodes = tmp_path / "nodes"
    nodes.write_text("192.0.2.7\nlocalhost\n")  # TEST-NET-1: nobody's address
    with pytest.raises(ConfigError, match=r"the first node '192.0.2.7' of NODE_FILE has the "
                                          r"address 192.0.2.7, which is not one of this machine's"):
        ejs_env(str(nodes))


def test_the_ejs_env_command_prints_exports_or_exits_2(node_file, monkeypatch, capsys):
    for name in ("NODE_FILE", "SCHEDULER_IP", "SCHEDULER_PORT", "LAUNCHER", "WORKERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NODE_FILE", node_file)
    monkeypatch.setenv("SCHEDULER_IP", "10.1.2.3")
    monkeypatch.setenv("SCHEDULER_PORT", "8081")
    monkeypatch.setenv("LAUNCHER", "apgas.launcher.SrunLauncher")
    assert apgas_main(["ejs-env"]) == 0
    out = capsys.readouterr().out
    assert "export APGAS_LAUNCHER=srun\n" in out and "export APGAS_INTERFACE=127.0.0.1\n" in out
    assert "unset APGAS_JOB_ID\n" in out
    monkeypatch.setenv("SCHEDULER_PORT", "http")
    assert apgas_main(["ejs-env"]) == 2
    assert capsys.readouterr().err == ("apgas ejs-env: error: SCHEDULER_PORT must be a TCP port, "
                                       "got 'http'\n")


# -- the lines EJS's analysis reads, and the shrink budget ----------------------------
def test_the_output_lines_match_plot_experiments_patterns():
    for seconds in (0.0, 0.00004, 1.5, 12345.678):  # Java would print 4.0E-5 for the second
        startup = re.fullmatch(STARTUP_PATTERN, ejs.startup_line(seconds))
        init = re.fullmatch(INIT_PATTERN, ejs.initialization_line(seconds))
        assert startup and init
        assert abs(float(startup.group(1)) - seconds) < 1e-9
        assert abs(float(init.group(1)) - seconds) < 1e-9


@pytest.fixture
def ejs_job(monkeypatch):
    """An EJS-like scheduler, and this process's environment as ``ejs-env`` sets it up
    (local places)."""
    port = free_port()
    scheduler = EjsLike({"n1": "127.0.0.1"}, "n1", port, cooldown=0.0)
    point_job_at(scheduler, monkeypatch, "127.0.0.1")
    yield scheduler
    scheduler.close()


def test_the_startup_line_is_printed_once_under_ejs_only(ejs_job, monkeypatch, capsys):
    started = time.monotonic()
    apgas.run(lambda: None, places=1)
    took = time.monotonic() - started
    found = re.findall(STARTUP_PATTERN, capsys.readouterr().out)
    assert len(found) == 1 and 0 < float(found[0]) < took, found
    monkeypatch.setenv("APGAS_JOB_ID", "3")  # our scheduler's job: no Java lines
    apgas.run(lambda: None, places=1)
    assert "Place startup time" not in capsys.readouterr().out


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.came = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.came.set()


def test_a_shrink_reply_later_than_ejs_waits_is_warned_of(ejs_job, monkeypatch):
    monkeypatch.setattr(ejs, "SHRINK_BUDGET", 0.3)  # EJS waits 20 s
    slow = threading.Event()
    warnings = _Warnings()
    logger = logging.getLogger("apgas.malleable")
    logger.addHandler(warnings)

    class Leave(apgas.MalleableHandler):
        def pre_shrink(self, n, chosen=None):
            if slow.is_set():
                time.sleep(0.6)
            return apgas.places()[-n:]

    def main():
        apgas.define_malleable_handler(Leave())
        fast_reply = ejs_job.shrink(1)
        slow.set()
        slow_reply = ejs_job.shrink(1)
        return fast_reply, slow_reply

    try:
        fast_reply, slow_reply = apgas.run(main, places=3)
        assert warnings.came.wait(5)
    finally:
        logger.removeHandler(warnings)
    assert len(fast_reply) == len(slow_reply) == 1 and ejs_job.malleable
    budget = [m for m in warnings.messages if "SHRINK_BUDGET" in m]
    assert len(budget) == 1, warnings.messages  # the slow shrink only
    assert re.search(r"the shrink's reply \['.+'\] went out \d+\.\d s after the order, later than "
                     r"the 0\.3 s the ElasticJobScheduler waits for it \(apgas\.ejs\.SHRINK_BUDGET\)",
                     budget[0]), budget


def test_a_glb_app_under_ejs_prints_both_lines(ejs_job, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "glb.apps", "pi", "--samples", "100000", "--places", "1",
               "--malleable"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=45)
    assert done.returncode == 0, done.stderr
    startup = re.search(STARTUP_PATTERN, done.stdout)
    init = re.search(INIT_PATTERN, done.stdout)
    assert startup and init, done.stdout
    assert startup.start() < init.start()  # as the Java job prints them
    assert ejs_job.ready.is_set() and ejs_job.dead is None
    plain = {k: v for k, v in env.items() if not k.startswith("APGAS_") or k == "APGAS_RUNTIME_DIR"}
    done = subprocess.run(command[:-1], cwd=tmp_path, env=plain, capture_output=True, text=True,
                          timeout=45)
    assert done.returncode == 0, done.stderr
    assert "Place startup time" not in done.stdout and "Initialization time" not in done.stdout
