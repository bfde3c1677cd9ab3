"""Who is asking, and what they may do: the scheduler's clients and their rights.

Two doors lead in. The **Unix socket** (on the scheduler's machine) names the
client by the peer's uid, which the kernel vouches for (``SO_PEERCRED``); its
file mode says who may connect (0600: the operator only; 0666: every user of
the machine). The **TCP port** takes only requests signed (:mod:`apgas.auth`)
with the operator's key, a file only the operator can read, so whoever signs
is the operator. Nothing else is answered. The **dashboard** (``serve
--dashboard``, off by default) only shows, and only to a browser that brings
the token derived from the operator's key (:func:`dashboard_token`).

The rules: the operator (the scheduler's own user, or root) may do everything;
another user may submit jobs (they run as that user), see the status, and
cancel and requeue their own jobs; adding nodes, bringing nodes that are down back
(``node-up``) and shutting down are the operator's (:data:`OPERATOR_ONLY`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import pwd
import socket
import tempfile
from pathlib import Path

from apgas import auth
from apgas.serving import make_trusted_dir, peer_uid, trusted_location

__all__ = ["Client", "authorize", "default_key_file", "default_socket_path",
           "socket_candidates", "socket_dir", "state_home", "default_output_dir",
           "output_dir_beside", "listen_unix",
           "dashboard_token", "OPERATOR_ONLY"]

OPERATOR_ONLY = ("add-nodes", "node-up", "shutdown")


@dataclasses.dataclass(frozen=True)
class Client:
    """An authenticated client: its uid, and whether it is the operator."""

    uid: int
    operator: bool
    via: str  # "unix" or "tcp" (the Python API counts as the operator's "tcp")

    @property
    def user(self) -> str:
        return _user_name(self.uid)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def operator_uids() -> set[int]:
    return {os.geteuid(), 0}


def unix_client(conn: socket.socket) -> Client:
    """The client at the other end of a Unix socket, as the kernel names it
    (``SO_PEERCRED``); OSError if it cannot."""
    uid = peer_uid(conn)
    if uid is None:
        raise OSError("the kernel gave no credentials for the connection")
    return Client(uid, uid in operator_uids(), "unix")


def operator() -> Client:
    """The client that signed with the operator's key (or calls the Python API)."""
    return Client(os.geteuid(), True, "tcp")


def authorize(client: Client, op: str, owner: int | None = None) -> None:
    """PermissionError, saying why, unless ``client`` may do ``op`` (on a job of ``owner``)."""
    if client.operator:
        return
    if op in OPERATOR_ONLY:
        raise PermissionError(f"{op} is for the scheduler's operator, not {client.user}")
    if op in ("cancel", "requeue") and owner is not None and owner != client.uid:
        raise PermissionError(f"{client.user} may {op} only their own jobs; this one is "
                              f"{_user_name(owner)}'s")


def run_as(client: Client) -> int:
    """The uid a job of ``client`` runs as: the client's own. PermissionError if
    this scheduler cannot run jobs as that user (it is not root)."""
    if client.uid != os.geteuid() and os.geteuid() != 0:
        raise PermissionError(f"this scheduler runs as {_user_name(os.geteuid())} and "
                              f"can run jobs only as that user, not as {client.user}; to serve "
                              "several users it must run as root")
    return client.uid


def default_key_file() -> Path:
    """The operator's key: ``~/.apgas/scheduler.key`` (``$APGAS_RUNTIME_DIR`` overrides ``~/.apgas``)."""
    return auth.runtime_dir() / "scheduler.key"


ROOT_STATE_HOME = Path("/var/lib/apgas-scheduler")
ROOT_SOCKET_DIR = Path("/run/apgas-scheduler")


def state_home() -> Path:
    """Where a scheduler keeps its job output (``jobs``) and state (``jobs.state``)
    by default: root's ``/var/lib/apgas-scheduler``, another user's
    ``$XDG_STATE_HOME/apgas-scheduler`` (``~/.local/state/apgas-scheduler``);
    never the current directory, which may be shared."""
    if os.geteuid() == 0:
        return ROOT_STATE_HOME
    xdg = os.environ.get("XDG_STATE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state") / "apgas-scheduler"


def default_output_dir() -> Path:
    """Where job output goes when neither an output nor a state directory is given
    (the state then goes beside it, in ``jobs.state``)."""
    return state_home() / "jobs"


def output_dir_beside(state_dir: str | os.PathLike[str]) -> Path:
    """Where the job output of the state in ``state_dir`` goes when no output
    directory is given: ``STATE_DIR.jobs``, its sibling, so that each state has
    its own (two schedulers with their own states once both wrote
    ``jobs/job-1.out``). Not inside it: the state directory is 0700 (it holds
    the jobs' keys), and each user must be able to pass through every directory
    above their ``job-N.out`` to open it by name; the sibling is made 0711."""
    state = Path(os.path.abspath(state_dir))
    if not state.name:
        raise ValueError(f"the state directory {state_dir} has no name to put an output "
                         "directory beside; give --output-dir")
    return state.with_name(state.name + ".jobs")


def socket_dir() -> Path:
    """The directory of this user's schedulers' Unix sockets, where only this user
    can make entries: root's ``/run/apgas-scheduler``, another user's
    ``$XDG_RUNTIME_DIR/apgas-scheduler``, else ``/tmp/apgas-scheduler-UID``
    (refused if someone else made it first, as tmux does)."""
    if os.geteuid() == 0:
        return ROOT_SOCKET_DIR
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg) and os.path.isdir(xdg):
        return Path(xdg) / "apgas-scheduler"
    return Path(tempfile.gettempdir()) / f"apgas-scheduler-{os.geteuid()}"


def default_socket_path(port: int) -> Path:
    """Where the scheduler serving TCP ``port`` listens on its Unix socket."""
    return socket_dir() / f"{port}.sock"


def socket_candidates(port: int) -> list[Path]:
    """Where a client looks for the Unix socket of the scheduler on ``port``: its
    own user's (:func:`default_socket_path`), then root's."""
    own = default_socket_path(port)
    root = ROOT_SOCKET_DIR / f"{port}.sock"
    return [own] if own == root else [own, root]


def listen_unix(path: Path, mode: int) -> socket.socket:
    """The Unix socket at ``path`` with file mode ``mode``. Its directory is
    checked first (:func:`apgas.serving.trusted_location`; the default one is
    made 0711: others may reach a socket whose mode lets them in, and list or
    make nothing there); a stale socket there is replaced, anything else refused."""
    if path.parent == socket_dir():  # ours: its mode is ours to set
        os.chmod(make_trusted_dir(path.parent, "the socket's directory", 0o711), 0o711)
    elif not path.parent.exists():  # a given one is not made: a typo would go unnoticed
        raise OSError(f"the Unix socket {path}: its directory {path.parent} does not exist; "
                      f"make it (mkdir -m 0711 {path.parent}) or give --socket a path in an "
                      "existing directory")
    path = trusted_location(path, "the Unix socket")
    if path.is_socket() or path.is_symlink():
        path.unlink()
    elif path.exists():
        raise OSError(f"{path} exists and is not a socket; refusing to replace it")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o777)  # no moment in which others could connect
    try:
        server.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, mode)
    server.listen(128)
    return server


def dashboard_token(key: str) -> str:
    """The dashboard's password: derived from the operator's key, so whoever can
    read the key can open the page and nobody else; not the key itself, which a
    browser would then keep in its history."""
    return hmac.new(key.encode(), b"apgas-scheduler dashboard v1", hashlib.sha256).hexdigest()[:32]
