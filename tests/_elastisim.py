"""ElastiSim, the batch-system simulator of the MEBF study, and the Kassel strategies
(projectwagomu/MalleableJobScheduling), for the tests that run the real thing.

``.ci/install-services`` (as root) builds ElastiSim from the sources in the folder
``shared/elastisim`` beside the project, with Debian's SimGrid, into a cache folder
keyed by the source tarball's sha256::

    /var/cache/apgas-ci/elastisim-<first 12 hex>/
        build/elastisim                the simulator
        elastisim-python-871c191/      elastisim_python, the algorithm's side (PYTHONPATH)
        MalleableJobScheduling/        scheduling_algorithms/, input_files/small/, scripts/
        sources.sha256, build.log

:func:`find` says where that folder is, or why the tests must skip;
``APGAS_ELASTISIM_DIR`` names another folder of that layout instead.
:func:`prepare_input` copies an input (e.g. ``input_files/small``) into a test's
folder, every path in it made absolute there; :func:`run_elastisim` and
:func:`run_strategy` start the simulator and a strategy on it, each in a process
group of its own, and :func:`stop` ends such a group.

The strategies connect to ``ipc:///tmp/elastisim.ipc``, written into each of them;
:func:`run_strategy` loads a strategy's ``schedule`` and connects it to the URL of the
test's configuration instead, so that no two runs share a socket. They need pyzmq
and the standard library only, and write ``data/output/event.csv`` below their
working folder (:func:`prepare_input` makes it point into ``output/``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["CACHE_ROOT", "ELASTISIM", "ELASTISIM_PYTHON", "KASSEL", "SHARED", "find", "prepare_input",
           "run_elastisim", "run_strategy", "stop"]

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "elastisim"  # as .ci/install-services finds it
CACHE_ROOT = Path("/var/cache/apgas-ci")
ELASTISIM = "elastisim-9bc6344"  # the folders (and tarballs) of the three sources
ELASTISIM_PYTHON = "elastisim-python-871c191"
KASSEL = "MalleableJobScheduling"
INSTALL = "run .ci/install-services as root to build it"

#: the files of an ElastiSim input folder
INPUT_FILES = ("configuration.json", "jobs.json", "application_model.json", "crossbar.xml")
#: the keys of configuration.json that name files ElastiSim writes
OUTPUT_KEYS = ("job_statistics", "cpu_utilization", "node_utilization", "network_activity",
               "pfs_utilization", "gpu_utilization")
_SUN_PATH = 107  # bytes of a Unix socket's path, with room for the NUL


def _key(tarball: Path) -> str:
    return hashlib.sha256(tarball.read_bytes()).hexdigest()[:12]


def _trusted(path: Path) -> bool:
    """A real folder owned by root that no one else can write (as the script demands)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return path.is_dir() and not path.is_symlink() and st.st_uid == 0 and not st.st_mode & 0o022


def find() -> tuple[Path | None, str]:
    """``(folder, "")`` of a usable ElastiSim build (the layout above), or ``(None,
    reason)`` saying why the tests that need it must skip."""
    override = os.environ.get("APGAS_ELASTISIM_DIR")
    if override:
        folder = Path(override)
        where = f"APGAS_ELASTISIM_DIR={override}"
    else:
        tarball = SHARED / f"{ELASTISIM}.tar.gz"
        if not SHARED.is_dir():
            return None, f"ElastiSim is not built: {SHARED} is missing (the sources to build it from)"
        if not tarball.is_file():
            return None, f"ElastiSim is not built: {tarball} is missing"
        folder = CACHE_ROOT / f"elastisim-{_key(tarball)}"
        where = str(folder)
        if not folder.exists():
            return None, f"ElastiSim is not built: no {folder} ({INSTALL})"
        for path in (CACHE_ROOT, folder):
            if not _trusted(path):
                return None, f"ElastiSim is not used: {path} is not a folder owned by root that only root can write"
    binary = folder / "build" / "elastisim"
    if not os.access(binary, os.X_OK):
        return None, f"ElastiSim is not built: no {binary} ({where}; {INSTALL})"
    for part in (folder / ELASTISIM_PYTHON / "elastisim_python" / "__init__.py",
                 folder / KASSEL / "scheduling_algorithms" / "extension" / "ElastiSimExtension.py"):
        if not part.is_file():
            return None, f"ElastiSim's build is incomplete: no {part} ({where}; {INSTALL})"
    missing = _missing_libraries(binary)
    if missing:
        name = "SimGrid's library is" if any("simgrid" in m for m in missing) else "libraries are"
        return None, (f"ElastiSim is built, but {name} missing ({', '.join(missing)}): "
                      "run .ci/install-services as root to install them")
    return folder, ""


def _missing_libraries(binary: Path) -> list[str]:
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    out = subprocess.run([ldd, str(binary)], capture_output=True, text=True, timeout=30).stdout
    return [line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line]


def prepare_input(tmp_path: Path, source_dir: Path) -> Path:
    """Copy the input folder ``source_dir`` (configuration.json, jobs.json,
    application_model.json, crossbar.xml) into ``tmp_path`` and return the copy's
    configuration.json, in which every file is an absolute path inside ``tmp_path``
    (the inputs beside it; the outputs in ``tmp_path/output/``, made here) and the
    ZeroMQ URL is ``ipc://<tmp_path>/elastisim.ipc``. The jobs' application models
    are made absolute too. A strategy run in ``tmp_path`` writes its
    ``data/output/event.csv`` into ``output/`` as well."""
    tmp_path = tmp_path.resolve()
    for name in INPUT_FILES:
        shutil.copyfile(source_dir / name, tmp_path / name)
    output = tmp_path / "output"
    output.mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "output").symlink_to("../output")

    def local(path: str) -> str:
        """An input file's relative path (``data/input/jobs.json``): its copy."""
        copy = tmp_path / Path(path).name
        if not copy.is_file():
            raise FileNotFoundError(f"{source_dir} refers to {path}, which it does not hold")
        return str(copy)

    config_file = tmp_path / "configuration.json"
    config = json.loads(config_file.read_text())
    config["jobs_file"] = local(config["jobs_file"])
    config["platform_file"] = local(config["platform_file"])
    for key, value in config.items():
        if key in OUTPUT_KEYS or (isinstance(value, str) and value.startswith("data/output/")):
            config[key] = str(output / Path(value).name)
    url = tmp_path / "elastisim.ipc"
    # Both processes run in tmp_path, so a relative path serves when the absolute one
    # is longer than a Unix socket's path may be.
    config["zmq_url"] = f"ipc://{url}" if len(os.fsencode(url)) < _SUN_PATH else "ipc://elastisim.ipc"
    config_file.write_text(json.dumps(config, indent=4) + "\n")

    jobs_file = Path(config["jobs_file"])
    jobs = json.loads(jobs_file.read_text())
    for job in jobs["jobs"]:
        if "application_model" in job:
            job["application_model"] = local(job["application_model"])
    jobs_file.write_text(json.dumps(jobs, indent=4) + "\n")
    return config_file


def _start(command: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)


def run_elastisim(binary: Path, config: Path) -> subprocess.Popen:
    """Start ElastiSim on ``config`` (made by :func:`prepare_input`) in the config's
    folder, in a process group of its own; its output goes to ``elastisim.log`` there.
    It waits for an algorithm at the config's URL, and ends when every job has."""
    return _start([str(binary), str(config), "--log=root.thresh:warning"], config.parent,
                  config.parent / "elastisim.log")


# Loads a strategy as a module (its ``__main__`` part, which would connect to the URL
# written in it, does not run) and connects its ``schedule`` to the given URL.
_STRATEGY = """\
import runpy, sys
from elastisim_python import pass_algorithm
strategy, url = sys.argv[1:]
pass_algorithm(runpy.run_path(strategy)["schedule"], url)
"""


def run_strategy(folder: Path, strategy: str, config: Path) -> subprocess.Popen:
    """Start the Kassel strategy ``strategy`` (``rigid_easy_backfill``, ...) of the
    build ``folder`` against the ElastiSim of ``config``, with this Python, in the
    config's folder and a process group of its own; its output goes to
    ``<strategy>.log`` there."""
    algorithms = folder / KASSEL / "scheduling_algorithms"
    url = json.loads(config.read_text())["zmq_url"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(folder / ELASTISIM_PYTHON), str(algorithms), env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the build's folders are root's, and read-only to the rest
    return _start([sys.executable, "-c", _STRATEGY, str(algorithms / f"{strategy}.py"), url],
                  config.parent, config.parent / f"{strategy}.log", env)


def stop(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """End ``process`` and its process group (SIGTERM, then SIGKILL), and reap it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            continue
        break
    deadline = time.monotonic() + timeout  # the group's other members, if it had any
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.02)
