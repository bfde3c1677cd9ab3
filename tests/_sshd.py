"""A throwaway sshd on 127.0.0.1 so the ssh launcher is tested through real ``ssh``.

Nothing here touches the system's ssh setup (only /run/sshd is created, which sshd needs
when run as root): keys, configs, pid file and log live in a work directory, the client
reads only the config written here (``ssh -F``), and host keys are neither checked nor
remembered. The same sshd answers to several host aliases
(``sshhost1`` ...), so a test can place workers on "different hosts" of one machine.

For the virtual cluster (``tests/vcluster.py``) an sshd can also listen on another
address and a fixed port (``address``, ``port``), be started through a command wrapper
(``wrap``: e.g. ``nsenter --net=...``, to run it inside a network namespace), share one
set of keys with other sshds (``make_keys``, ``keys``), end sessions whose client vanished
(``client_alive``, ``login_grace``) and die with the process that started it
(``die_with_parent``);
``client_config`` writes one client config for several such sshds.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _slurm import _alive
from orders import free_port

__all__ = ["SshServer", "SshUnavailable", "client_config", "make_keys", "start_sshd", "sshd"]

HOSTS = ["sshhost1", "sshhost2", "sshhost3"]
READY_TIMEOUT = 10.0


class SshUnavailable(RuntimeError):
    """sshd, ssh or ssh-keygen is not installed, or sshd lets no one of this account log
    in (e.g. a locked account): the ssh tests cannot run here."""


# sshd refusing the account itself, whatever the key: locked, its shell not executable, ...
_REFUSED = re.compile(r"User \S+ not allowed because .*")


@dataclass
class SshServer:
    """A running sshd and what a client needs to reach it."""

    port: int
    config: str  # ssh client config file (for ``ssh -F``)
    hosts: list[str]  # host aliases that all reach this sshd
    command: list[str]  # ssh client command, e.g. [".../ssh", "-F", config]
    workdir: Path
    log: Path
    process: subprocess.Popen = field(repr=False)
    address: str = "127.0.0.1"  # where sshd listens (ListenAddress)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until a login works (for ``start_sshd(..., wait=False)``); on failure stop
        sshd and raise RuntimeError with the sshd log."""
        try:
            error = _wait_ready(self, timeout)
        except BaseException:
            self.stop()
            raise
        if error:
            self.stop()
            raise RuntimeError(f"sshd on {self.address} port {self.port} is not usable: {error}\n"
                               f"sshd log {self.log}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        """The end of the sshd log, for error messages."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no sshd log: {exc})"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sshd and every process of its sessions, so no test leaves a remote behind.

        sshd puts each connection in its own session (setsid), so killing its process group
        is not enough. The tree under sshd is ended leaves first, so that each parent is
        still there to reap its children (no zombies handed to init); then sshd itself, and
        last any process whose SSH_CONNECTION names this sshd's address and port (a session
        process that was reparented to init). SIGTERM first, SIGKILL after ``timeout``. Idempotent.
        """
        for level in reversed(_levels(self.process.pid)):
            _end(level, timeout)
        _end([self.process.pid], timeout, self.process)
        _end(_session_processes(self.port, self.address), timeout)


def _end(pids: list[int], timeout: float, process: subprocess.Popen | None = None) -> None:
    """SIGTERM ``pids``, SIGKILL those still there after ``timeout``; wait until reaped.

    A zombie counts as done once its parent is init or gone: nobody else will reap it.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_all([p for p in pids if _alive(p)], sig)
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline:
            if process is not None:
                process.poll()  # sshd is our child: reap it
            parents = _parents()
            if not any(p in parents and (_alive(p) or _alive(parents[p]) and parents[p] != 1)
                       for p in pids):
                return
            time.sleep(0.01)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    table[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return table


def _levels(root: int) -> list[list[int]]:
    """The processes below ``root``, by depth: children, grandchildren, ..."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    levels = []
    level = children.get(root, [])
    while level:
        levels.append(level)
        level = [c for p in level for c in children.get(p, [])]
    return levels


def _session_processes(port: int, address: str = "127.0.0.1") -> list[int]:
    """Processes started by a session of the sshd on ``address``:``port`` (found by SSH_CONNECTION)."""
    tail = f" {address} {port}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(b"SSH_CONNECTION=") and v.endswith(tail) for v in env):
            found.append(int(entry))
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _tools() -> tuple[str, str, str]:
    """Paths of sshd, ssh and ssh-keygen; SshUnavailable names whatever is missing."""
    path = os.environ.get("PATH", os.defpath)
    sshd_path = shutil.which("sshd", path=f"/usr/sbin:/usr/local/sbin:{path}")
    ssh = shutil.which("ssh")
    keygen = shutil.which("ssh-keygen")
    missing = [name for name, found in
               (("sshd (/usr/sbin/sshd, package openssh-server)", sshd_path),
                ("ssh (package openssh-client)", ssh),
                ("ssh-keygen (package openssh-client)", keygen)) if not found]
    if missing:
        raise SshUnavailable("ssh tests need " + ", ".join(missing) + ": not found")
    return sshd_path, ssh, keygen  # type: ignore[return-value]


def _quote(path: Path) -> str:
    """A path as one ssh config argument (quoted; % escaped against token expansion)."""
    return '"' + str(path).replace("%", "%%") + '"'


def _sshd_config(workdir: Path, port: int, address: str = "127.0.0.1", keys: Path | None = None,
                 client_alive: tuple[int, int] | None = None, login_grace: int | None = None) -> str:
    keys = keys or workdir
    alive = "" if client_alive is None else (
        "# End sessions whose client vanished: no answer to `count` probes `interval` s apart.\n"
        f"ClientAliveInterval {client_alive[0]}\nClientAliveCountMax {client_alive[1]}\n")
    if login_grace is not None:  # connections still logging in (ClientAlive* starts after)
        alive += f"LoginGraceTime {login_grace}\n"
    return f"""\
ListenAddress {address}
Port {port}
HostKey {_quote(keys / "host_key")}
PidFile {_quote(workdir / "sshd.pid")}
AuthorizedKeysFile {_quote(keys / "authorized_keys")}
{alive}PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PrintMotd no
PrintLastLog no
X11Forwarding no
LogLevel VERBOSE
# Launchers may open many connections at once; the default 10:30:100 drops some.
MaxStartups 200
MaxSessions 200
"""


def _client_config(workdir: Path, port: int, hosts: list[str], address: str = "127.0.0.1") -> str:
    names = hosts + ([] if address in hosts else [address])
    if address == "127.0.0.1":
        names.append("localhost")
    return f"""\
Host {" ".join(names)}
    HostName {address}
    Port {port}
{_client_options(workdir)}"""


def _client_options(keys: Path) -> str:
    return f"""\
    User {pwd.getpwuid(os.geteuid()).pw_name}
    IdentityFile {_quote(keys / "user_key")}
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    GlobalKnownHostsFile /dev/null
    BatchMode yes
    LogLevel ERROR
    ConnectTimeout 5
"""


def client_config(keys: Path, servers: dict[str, tuple[str, int]]) -> str:
    """An ssh client config (for ``ssh -F``) reaching several sshds that share the keys
    made by ``make_keys(keys)``: alias -> (address, port); each address is an alias too."""
    keys = Path(keys).resolve()
    blocks = []
    for alias, (address, port) in servers.items():
        names = [alias] + ([address] if address != alias else [])
        blocks.append(f"Host {' '.join(names)}\n    HostName {address}\n    Port {port}\n")
    names = sorted({n for alias, (address, _) in servers.items() for n in (alias, address)})
    return "".join(blocks) + f"Host {' '.join(names)}\n{_client_options(keys)}"


def make_keys(directory: Path) -> Path:
    """Fresh host and user keys and an authorized_keys in ``directory`` (returned, resolved)."""
    _, _, keygen = _tools()
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    for name, kind in (("host_key", "ed25519"), ("user_key", "ed25519")):
        for old in (directory / name, directory / f"{name}.pub"):
            old.unlink(missing_ok=True)
        subprocess.run([keygen, "-q", "-t", kind, "-N", "", "-C", f"apgas-test-{name}",
                        "-f", str(directory / name)], check=True, stdin=subprocess.DEVNULL)
    (directory / "authorized_keys").write_text((directory / "user_key.pub").read_text())
    (directory / "authorized_keys").chmod(0o600)
    return directory


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Child side of Popen: get SIGTERM when the thread that started us ends."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def start_sshd(workdir: Path, hosts: list[str] | None = None, *, address: str = "127.0.0.1",
               port: int | None = None, wrap: Callable[[list[str]], list[str]] | None = None,
               keys: Path | None = None, client_alive: tuple[int, int] | None = None,
               login_grace: int | None = None, die_with_parent: bool = False,
               wait: bool = True) -> SshServer:
    """Start an sshd on 127.0.0.1 that the current user can log in to with a fresh key.

    Returns once ``ssh -F config <first host> true`` succeeds; RuntimeError (with the sshd
    log) if that does not happen within READY_TIMEOUT seconds, SshUnavailable if the ssh
    programs are not installed or sshd refuses the account (``User x not allowed because
    account is locked``). The caller must call ``stop()``.

    Options (all keyword-only; the defaults are the behaviour above):
    ``address``: listen there instead (the client config's HostName);
    ``port``: listen on this port (e.g. 22 inside a network namespace) instead of a free
    one of 127.0.0.1; ``wrap``: argv -> argv, how to start sshd (e.g. prefix it with
    ``nsenter --net=<ns>``; the wrapper must exec sshd, not fork it);
    ``keys``: a directory made by ``make_keys`` to use instead of fresh keys in ``workdir``;
    ``client_alive``: (ClientAliveInterval, ClientAliveCountMax): a logged-in session whose
    client vanished ends after about 2 * interval * (count + 1) s (OpenSSH 9.2);
    ``login_grace``: LoginGraceTime, the same for a connection still logging in;
    ``die_with_parent``: sshd gets SIGTERM when the calling thread ends (PR_SET_PDEATHSIG:
    start it from a thread that lives as long as it should);
    ``wait=False``: return at once, call ``SshServer.wait_ready()`` later.
    """
    sshd_path, ssh, _ = _tools()
    hosts = list(hosts or HOSTS)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    keys = make_keys(workdir) if keys is None else Path(keys).resolve()
    if os.geteuid() == 0:  # privilege separation directory; sshd refuses to start without
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)

    error = ""
    for _attempt in range(3):  # the free port may be taken before sshd binds it
        listen_port = free_port() if port is None else port
        server_config = workdir / "sshd_config"
        server_config.write_text(_sshd_config(workdir, listen_port, address, keys, client_alive,
                                              login_grace))
        config = workdir / "ssh_config"
        config.write_text(_client_config(keys, listen_port, hosts, address))
        log = workdir / "sshd.log"
        argv = [sshd_path, "-D", "-e", "-f", str(server_config)]
        with open(log, "wb") as out:
            process = subprocess.Popen(wrap(argv) if wrap else argv,
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                       preexec_fn=_die_with_parent if die_with_parent else None)
        server = SshServer(port=listen_port, config=str(config), hosts=hosts,
                           command=[ssh, "-F", str(config)], workdir=workdir, log=log,
                           process=process, address=address)
        if not wait:
            return server
        try:
            error = _wait_ready(server)
        except BaseException:
            server.stop()
            raise
        if not error:
            return server
        server.stop()
        log_tail = server.log_tail()
        if "Address already in use" not in log_tail or port is not None:
            break
    raise RuntimeError(f"sshd on {address} port {listen_port} is not usable: {error}\n"
                       f"sshd log {log}:\n{log_tail}")


def _wait_ready(server: SshServer, timeout: float = READY_TIMEOUT) -> str:
    """Wait until a real login works; "" then, else what went wrong (SshUnavailable when
    sshd refuses the account itself: no login can work).

    First wait for sshd to say it listens (or to die, e.g. on a taken port): an ssh to a
    port someone else holds could hang until ConnectTimeout.
    """
    deadline = time.monotonic() + timeout
    listening = f"Server listening on {server.address} port {server.port}."
    last = f"sshd did not report listening within {timeout} s"
    while listening not in server.log.read_text(errors="replace"):
        if server.process.poll() is not None:
            return f"sshd exited with code {server.process.returncode}"
        if time.monotonic() > deadline:
            return last
        time.sleep(0.01)
    probe = [*server.command, server.hosts[0], "true"]
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return f"sshd exited with code {server.process.returncode}"
        try:
            done = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=5)
            if done.returncode == 0:
                return ""
            if refused := _REFUSED.search(server.log.read_text(errors="replace")):
                raise SshUnavailable("ssh tests need an account that sshd lets log in; sshd says: "
                                     + refused.group(0).strip())
            last = f"{' '.join(probe)} exited with {done.returncode}: {done.stderr.strip()}"
        except subprocess.TimeoutExpired:
            last = f"{' '.join(probe)} took more than 5 s"
        time.sleep(0.05)
    return f"no login within {timeout} s; last try: {last}"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """One sshd for the whole test session (skips the test if ssh is not installed)."""
    try:
        server = start_sshd(tmp_path_factory.mktemp("sshd"))
    except SshUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()
