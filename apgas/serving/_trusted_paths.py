"""Files and directories a daemon may trust: nobody else can change them.

A path is trusted when it and every directory above it belong to this
process's user (or root) and nobody else can write them, OpenSSH's
``StrictModes`` rule: a directory that others can write lets them swap what
lies in it. An ancestor others may write is allowed only with the sticky bit
(``/tmp``), where nobody can rename or remove another's entries. Symbolic links
are resolved first and the real path is checked and returned, so the caller
goes on with what was checked, not with a link someone could point elsewhere.

A refusal is :class:`UntrustedPath` (a ``PermissionError``) naming the path,
its owner and its mode, and saying what to do.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

__all__ = ["UntrustedPath", "trusted_dir", "trusted_file", "trusted_location", "make_trusted_dir",
           "open_new_file", "open_append", "owner_name"]


class UntrustedPath(PermissionError):
    """A path others could change (or read, for a private file); the message says which and why."""


def owner_name(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a uid with no account."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _describe(path: Path, st: os.stat_result) -> str:
    return f"{path} (owned by {owner_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})"


def _check_ancestors(path: Path, what: str) -> None:
    """Every directory above ``path`` (real, resolved) is root's or ours and not
    writable by others, unless sticky."""
    me = os.geteuid()
    for parent in path.parents:
        st = parent.stat()
        if st.st_uid not in (0, me):
            raise UntrustedPath(f"{what}: {_describe(parent, st)}, a directory above {path}, "
                                f"belongs to another user, who could replace what lies in it")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UntrustedPath(f"{what}: {_describe(parent, st)}, a directory above {path}, "
                                "may be written by others (and has no sticky bit), who could "
                                "replace what lies in it")


def _check_own(path: Path, st: os.stat_result, what: str, private: bool) -> None:
    me = os.geteuid()
    if st.st_uid != me:
        raise UntrustedPath(f"{what}: {_describe(path, st)} belongs to another user, not to "
                            f"{owner_name(me)}, who runs this; use one of your own")
    loose = st.st_mode & (0o077 if private else 0o022)
    if loose:
        need = "chmod go= it" if private else "chmod go-w it"
        kind = "read or written" if private else "written"
        raise UntrustedPath(f"{what}: {_describe(path, st)} may be {kind} by others; {need}")


def trusted_dir(path: str | os.PathLike[str], what: str) -> Path:
    """The real path of the existing directory ``path``, checked (see the module):
    ours, and nobody else may write it or a directory above it. ``what`` names it
    in a refusal."""
    real = Path(os.path.realpath(path))
    st = real.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{what}: {real} is not a directory")
    _check_ancestors(real, what)
    _check_own(real, st, what, private=False)
    return real


def trusted_file(path: str | os.PathLike[str], what: str, *, private: bool = True) -> Path:
    """The real path of the existing regular file ``path``, ours, in trusted
    directories, and (``private``) readable by nobody else."""
    real = Path(os.path.realpath(path))
    st = real.stat()
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedPath(f"{what}: {real} is not a regular file")
    _check_ancestors(real, what)
    _check_own(real, st, what, private)
    return real


def make_trusted_dir(path: str | os.PathLike[str], what: str, mode: int = 0o700) -> Path:
    """:func:`trusted_dir` of ``path``, made with ``mode`` first if missing (and
    the directories missing above it, with ``mode`` but never less than 0o700);
    an existing one keeps its mode if nobody else may write it."""
    path = Path(os.path.abspath(path))
    missing = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = probe.parent
    for made in reversed(missing):
        try:
            os.mkdir(made, 0o700)
        except FileExistsError:
            continue  # made meanwhile by someone: checked below like any other
        os.chmod(made, (mode & 0o755) | 0o700)  # exact, whatever the umask
    return trusted_dir(path, what)


def open_new_file(directory: int, name: str, mode: int = 0o600) -> int:
    """A new file ``name`` in the directory open as ``directory``: whatever was there
    (a link someone planted, an old file with other links) is unlinked first, and
    the new one is made exclusively, never through a link. The descriptor is
    not inherited."""
    try:
        os.unlink(name, dir_fd=directory)
    except FileNotFoundError:
        pass
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                   mode, dir_fd=directory)


def trusted_location(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` with its directory resolved, for a file or socket of ours to be
    made there: every directory above it is root's or ours and not writable by
    others unless sticky (``/tmp`` will do: nobody can move our entry there)."""
    real = Path(os.path.realpath(Path(path).parent)) / Path(path).name
    _check_ancestors(real, what)
    return real


def open_append(path: str | os.PathLike[str], what: str) -> int:
    """``path`` opened to append (made 0600 if missing), never through a symbolic
    link, refused unless it is ours and not writable by others, in a
    :func:`trusted_location`."""
    real = trusted_location(path, what)
    fd = os.open(real, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPath(f"{what}: {real} is not a regular file")
        _check_own(real, st, what, private=False)
    except BaseException:
        os.close(fd)
        raise
    return fd
