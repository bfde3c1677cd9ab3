"""Issue 29: the README's two commands pass on a machine without the services.

Every test that needs sshd, Slurm (slurmctld, slurmd, ..., srun, salloc), munge,
MariaDB (for slurmdbd accounting), Chromium or root must skip, saying what is
missing, where they are not there; none may fail. CI installs the services
(``.ci/install-services``), so it would never see such a failure: here pytest runs
again, in a child process, on a machine made to lack them.

How: ``unshare --mount --propagation private`` gives the child a mount namespace of
its own, where the programs are hidden from it alone: every directory holding one
(``/usr/bin``, ``/usr/sbin``, ...) is covered by an overlay whose upper layer has a
whiteout for each (so the name is gone: ``which`` finds nothing and ``exec`` fails
with ENOENT, as on a machine without the package); without overlayfs, /dev/null is
bind-mounted over each program instead (found by no ``which``, but an ``exec``
fails with EACCES). The child runs pytest on the tests that need a service (found
by the fixtures they use, ``sshd``, ``slurm_cluster``, ``vcluster``, ``browser``, or
the helpers they call) and writes a JUnit report, which the test reads: every test
passed or skipped, and every skip names a hidden program. As a user other than root
(``nobody``, no capabilities) the tests that need root must skip saying so.

Run it by hand (as root) on any test files, with any programs hidden::

    unshare --mount --propagation private .venv/bin/python tests/test_without_services.py \\
        --hide sshd,slurmctld --scratch /tmp/hide -- tests/test_launcher_ssh.py
"""

from __future__ import annotations

import argparse
import inspect
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")

# The programs of each service, by every name they go by (MariaDB keeps MySQL's names).
SERVICES = {
    "sshd": ("sshd",),
    "slurm": ("slurmctld", "slurmd", "slurmdbd", "slurmstepd", "srun", "salloc", "squeue",
              "scontrol", "sinfo", "scancel", "sbatch"),
    "munge": ("munged",),
    "mariadb": ("mariadbd", "mysqld", "mariadb-install-db", "mysql_install_db"),
    "chromium": ("chromium", "chromium-browser", "google-chrome", "chromedriver"),
}
EVERY_SERVICE = tuple(name for names in SERVICES.values() for name in names)
ACCOUNTING = ("slurmdbd", *SERVICES["mariadb"])  # Slurm stays, slurmdbd on MariaDB goes

# A test needs a service when it uses one of these fixtures (directly or through another
# fixture) or its code starts the service itself.
SERVICE_FIXTURES = {"sshd", "slurm_cluster", "vcluster", "browser"}
SERVICE_CALLS = ("start_sshd", "start_slurm", "start_vcluster", "_own_cluster", "vcluster.py",
                 "headless_chromium")

INNER_TIMEOUT = 120  # s for the whole child run (the outer timeout leaves room for cleanup)


# -- the child: runs in the private mount namespace -----------------------------------------

def _source(item) -> str:
    try:
        return inspect.getsource(item.function)
    except (AttributeError, OSError, TypeError):
        return ""


def needs_service(item) -> bool:
    if Path(str(item.path)).resolve() == Path(__file__).resolve():
        return False
    if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    source = _source(item)
    return any(call in source for call in SERVICE_CALLS)


def needs_root(item) -> bool:
    if Path(str(item.path)).resolve() == Path(__file__).resolve():
        return False
    if any("root" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif")):
        return True
    if "vcluster" in getattr(item, "fixturenames", ()):
        return True  # network namespaces
    source = _source(item)
    return any(call in source for call in ("geteuid", "start_vcluster", "_own_cluster", "vcluster.py"))


class Select:
    """pytest plugin: keep only the collected tests ``wanted(item)`` says need the thing."""

    def __init__(self, wanted) -> None:
        self.wanted = wanted

    def pytest_collection_modifyitems(self, config, items) -> None:
        keep = [item for item in items if self.wanted(item)]
        dropped = [item for item in items if not self.wanted(item)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True, timeout=30)


def _directories() -> list[str]:
    """The directories programs are looked up in (PATH and the sbin ones), resolved, once each."""
    found: list[str] = []
    for directory in [*os.environ.get("PATH", os.defpath).split(os.pathsep), *SBIN]:
        real = os.path.realpath(directory) if directory else ""
        if real and os.path.isdir(real) and real not in found:
            found.append(real)
    return found


def hide(names: list[str], scratch: Path) -> str:
    """Make the programs ``names`` vanish from this mount namespace; says how."""
    where = {d: [n for n in names if os.path.lexists(os.path.join(d, n))] for d in _directories()}
    where = {d: found for d, found in where.items() if found}
    if not where:
        return "nothing to hide"
    scratch.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=700", "tmpfs", str(scratch))  # overlay's upper layers
    try:
        for k, (directory, found) in enumerate(sorted(where.items())):
            upper, work = scratch / f"upper{k}", scratch / f"work{k}"
            upper.mkdir()
            work.mkdir()
            for name in found:  # a whiteout: the lower layer's file is gone
                os.mknod(upper / name, stat.S_IFCHR | 0o600, os.makedev(0, 0))
            _mount("-t", "overlay", "overlay", "-o",
                   f"lowerdir={directory},upperdir={upper},workdir={work}", directory)
        return "overlay whiteouts in " + ", ".join(sorted(where))
    except subprocess.CalledProcessError as exc:  # no overlayfs here
        done = sorted({os.path.realpath(os.path.join(d, n)) for d, found in where.items() for n in found})
        for path in done:
            _mount("--bind", "/dev/null", path)
        return f"/dev/null over {', '.join(done)} (no overlay: {exc.stderr.strip()})"


def open_for_others(paths: list[str], scratch: Path) -> None:
    """Let any user reach ``paths`` (e.g. a Python under /root, mode 700): each directory
    on the way that others may not search is covered by a tmpfs (mode 755) holding only
    the entries on the way, bind-mounted from the original. Nothing else is opened."""
    wanted = [Path(os.path.realpath(p)) for p in paths if os.path.exists(p)]
    for count in range(100):
        closed: dict[Path, set[str]] = {}
        for path in wanted:
            for depth in range(1, len(path.parts)):
                above = Path(*path.parts[:depth])
                if not os.stat(above).st_mode & stat.S_IXOTH:
                    closed.setdefault(above, set()).add(path.parts[depth])
                    break
        if not closed:
            return
        above = min(closed, key=lambda p: len(p.parts))  # the outermost first, then look again
        cover = scratch / f"open{count}"
        cover.mkdir(parents=True)
        _mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", str(cover))
        for entry in sorted(closed[above]):
            if (above / entry).is_dir():
                (cover / entry).mkdir()
            else:
                (cover / entry).touch()
            _mount("--bind", str(above / entry), str(cover / entry))
        _mount("--move", str(cover), str(above))
    raise RuntimeError(f"could not open the way to {paths}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pytest with programs hidden (run under "
                                                 "unshare --mount --propagation private)")
    parser.add_argument("--hide", default="", help="programs to hide, comma-separated")
    parser.add_argument("--scratch", required=True, help="an empty directory for the mounts")
    parser.add_argument("--select", choices=["services", "root", "all"], default="all")
    parser.add_argument("--user", help="run pytest as this user (e.g. nobody)")
    parser.add_argument("--keep", default="", help="test files whose every test is kept too "
                                                  "(comma-separated, relative to the repository)")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    mine, parent = (os.readlink(f"/proc/{pid}/ns/mnt") for pid in ("self", os.getppid()))
    if mine == parent:  # the mounts would change the machine for everyone
        print("refusing: not in a mount namespace of its own (run under unshare --mount "
              "--propagation private)", file=sys.stderr)
        return 2
    print(f"mount namespace {mine}", file=sys.stderr, flush=True)
    scratch = Path(args.scratch)
    names = [n for n in args.hide.split(",") if n]
    try:  # what this machine may not allow (a container): said as CANNOT, the test skips
        if names:
            print(f"hidden: {', '.join(names)}: {hide(names, scratch / 'hide')}", file=sys.stderr)
        if args.user:
            user = pwd.getpwnam(args.user)
            open_for_others([sys.executable, sys.base_prefix, sys.prefix, str(ROOT),
                             *(p for p in sys.path if p)], scratch / "open")
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)  # from root to another uid: every capability goes too
            os.environ.update(USER=user.pw_name, LOGNAME=user.pw_name)
    except (OSError, KeyError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        print(f"CANNOT: {exc!r} {detail.strip()}", file=sys.stderr)
        return 4
    path = os.pathsep.join([os.environ.get("PATH", os.defpath), *SBIN])
    if still := [n for n in names if shutil.which(n, path=path)]:
        print(f"still found: {still}", file=sys.stderr)
        return 3
    for prefix in ("APGAS_", "PYTEST_", "SLURM_"):  # nothing of the outer test run leaks in
        for key in [k for k in os.environ if k.startswith(prefix)]:
            del os.environ[key]
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.dont_write_bytecode = True
    os.chdir(ROOT)
    select = {"services": needs_service, "root": needs_root, "all": lambda item: True}[args.select]
    keep = {(ROOT / path).resolve() for path in args.keep.split(",") if path}

    def wanted(item) -> bool:
        return select(item) or Path(str(item.path)).resolve() in keep

    # in this process (-n 0): the selection is a plugin of this process, which xdist's
    # workers would not have
    return int(pytest.main(["-p", "no:cacheprovider", "-n", "0", *args.pytest_args],
                           plugins=[Select(wanted)]))


# -- the tests: run the child, read its report ----------------------------------------------

UNSHARE = shutil.which("unshare")
pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to make a mount namespace where "
                                                 "the services are hidden)"),
    pytest.mark.skipif(UNSHARE is None or shutil.which("mount") is None,
                       reason="needs unshare and mount (package util-linux)"),
]


@pytest.fixture(scope="module", autouse=True)
def private_mounts(tmp_path_factory):
    """Skip where this root may not make a mount namespace and mount in it (a container
    without CAP_SYS_ADMIN): what the tests here are made of."""
    where = tmp_path_factory.mktemp("probe")
    done = subprocess.run([UNSHARE, "--mount", "--propagation", "private", "--", "mount", "-t",
                           "tmpfs", "tmpfs", str(where)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot make a private mount namespace here: {done.stderr.strip()}")


def _search_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", os.defpath), *SBIN])


def _mount_namespace_processes(namespace: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") == namespace:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def run_without(tmp: Path, hidden: tuple[str, ...], select: str, paths: list[str],
                user: str | None = None, keep: tuple[str, ...] = ()) -> tuple[dict[str, tuple[str, str]], str]:
    """Run pytest on ``paths`` in a private mount namespace without the programs ``hidden``
    (as ``user``), keeping the tests ``select`` names and those of the files ``keep``;
    return {test: (outcome, message)}
    from its JUnit report, and its output. Fails if it exits with an error, takes more
    than INNER_TIMEOUT s or leaves a process running in its namespace."""
    if user:  # its own files: a directory it owns (/tmp/pytest-of-root is root's alone)
        tmp = Path(tempfile.mkdtemp(prefix="apgas-as-user-"))
        shutil.chown(tmp, user, pwd.getpwnam(user).pw_gid)
    report = tmp / "report.xml"
    argv = [UNSHARE, "--mount", "--propagation", "private", "--", sys.executable, __file__,
            "--hide", ",".join(hidden), "--scratch", str(tmp / "scratch"), "--select", select,
            *(["--user", user] if user else []), "--keep", ",".join(keep), "--",
            "-q", "-rs", f"--timeout={INNER_TIMEOUT // 2}", f"--junitxml={report}",
            f"--basetemp={tmp / 'basetemp'}", *paths]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("APGAS_", "PYTEST_"))}
    if user:
        env["HOME"] = str(tmp)
    try:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=INNER_TIMEOUT)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            timed_out = True
        namespace = next((line.split()[-1] for line in out.splitlines()
                          if line.startswith("mount namespace ")), None)
        left = _mount_namespace_processes(namespace) if namespace else []
        for pid in left:  # daemons in sessions of their own: killpg missed them
            os.kill(pid, signal.SIGKILL)
        assert not timed_out, f"more than {INNER_TIMEOUT} s:\n{out[-6000:]}"
        assert not left, f"processes left running in the namespace: {left}\n{out[-6000:]}"
        if proc.returncode == 4 and (cannot := [line for line in out.splitlines()
                                                if line.startswith("CANNOT: ")]):
            pytest.skip(f"cannot hide the services here: {cannot[0]}")
        assert namespace and namespace != os.readlink("/proc/self/ns/mnt"), out[-6000:]
        assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-6000:]}"
        results: dict[str, tuple[str, str]] = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome, message = child.tag, child.get("message", "")
            results[f"{case.get('classname')}::{case.get('name')}"] = (outcome, message)
        return results, out
    finally:
        if user:
            shutil.rmtree(tmp, ignore_errors=True)


def _find(results: dict[str, tuple[str, str]], test: str) -> tuple[str, str]:
    """The outcome of the one test whose name ends with ``test``."""
    found = [r for name, r in results.items() if name.endswith(test)]
    assert len(found) == 1, (test, sorted(results))
    return found[0]


def test_without_the_services_their_tests_skip_naming_what_is_missing(tmp_path):
    """Issue 29, part 1: with sshd, Slurm, munge, MariaDB and Chromium gone, every test that
    needs one of them (about 45) passes or skips, and each skip names a missing program."""
    before = {name: shutil.which(name, path=_search_path()) for name in EVERY_SERVICE}
    results, out = run_without(tmp_path, EVERY_SERVICE, "services", ["tests"])
    failed = {name: r for name, r in results.items() if r[0] not in ("passed", "skipped")}
    assert not failed, f"{failed}\n{out[-6000:]}"
    unnamed = {name: r[1] for name, r in results.items()
               if r[0] == "skipped" and not any(p in r[1] for p in EVERY_SERVICE)}
    assert not unnamed, f"skips that name no missing program: {unnamed}"
    # the run held the tests of every service (a selection that lost them would prove nothing)
    said = " ".join(message for _, message in results.values())
    assert all(p in said for p in ("sshd", "slurmctld", "munged", "chromium")), said
    for module in ("test_vcluster", "test_cross_host", "test_launcher_ssh", "test_launcher_srun",
                   "test_slurm_resize", "test_slurm_communicator", "test_dashboard",
                   "test_timeline", "test_authentication", "test_scheduler_containment",
                   "test_scheduler_live"):
        assert any(f"{module}::" in name for name in results), (module, sorted(results))
    # the test that failed here before (it ran `vcluster.py up` without looking for sshd)
    assert _find(results, "test_vcluster::test_command_line_up_and_ctrl_c") == (
        "skipped", "ssh tests need sshd (/usr/sbin/sshd, package openssh-server): not found")
    # the machine itself still has them (the mounts stayed in the namespace)
    assert {name: shutil.which(name, path=_search_path()) for name in EVERY_SERVICE} == before


def test_without_mariadb_the_tests_that_resize_slurm_jobs_skip_naming_it(tmp_path):
    """Slurm without slurmdbd on MariaDB resizes a job only once: the tests that resize
    repeatedly skip saying that slurmdbd is missing, on a real Slurm started without it."""
    if not shutil.which("slurmctld", path=_search_path()):
        pytest.skip("Slurm is not installed here: slurmctld not found (nothing to show)")
    results, out = run_without(tmp_path, ACCOUNTING, "services",
                               ["tests/test_slurm_resize.py", "tests/test_slurm_communicator.py"])
    assert results and all(r[0] in ("passed", "skipped") for r in results.values()), results
    skipped = {name: r[1] for name, r in results.items() if r[0] == "skipped"}
    assert skipped and all("slurmdbd" in message for message in skipped.values()), skipped


def test_as_another_user_than_root_the_tests_that_need_root_skip_saying_so(tmp_path):
    """As ``nobody`` (a real other user: no capabilities; only the way to this Python,
    under /root here, is opened to it), every test that needs root skips, saying so, and
    the rest of the two files of attacks between users passes."""
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    both = ("tests/security/test_multi_user.py", "tests/security/test_fair_service.py")
    results, out = run_without(tmp_path, (), "root", ["tests"], user="nobody", keep=both)
    failed = {name: r for name, r in results.items() if r[0] not in ("passed", "skipped")}
    assert not failed, f"{failed}\n{out[-6000:]}"
    unsaid = {name: r[1] for name, r in results.items() if r[0] == "skipped" and "root" not in r[1]}
    assert not unsaid, f"skips that do not say root is needed: {unsaid}"
    for module in ("test_multi_user", "test_fair_service", "test_authentication",
                   "test_vcluster", "test_cross_host"):
        assert any(f"{module}::" in name and r[0] == "skipped" for name, r in results.items()), (
            module, sorted(results))
    assert _find(results, "test_vcluster::test_command_line_up_and_ctrl_c") == (
        "skipped", "virtual cluster needs root (network namespaces)")
    passed = [name for name, r in results.items() if r[0] == "passed"]
    assert passed and all("test_fair_service::" in name for name in passed), passed


if __name__ == "__main__":
    sys.exit(main())
