"""Files and directories a daemon may trust: nobody else can change them.

A path is trusted when it and every directory above it belong to this
process's user (or root) and nobody else can write them, OpenSSH's
``StrictModes`` rule: a directory that others can write lets them swap what
lies in it. An ancestor others may write is allowed only with the sticky bit
(``/tmp``), where nobody can rename or remove another's entries.

A path is walked one component at a time with ``lstat``, never resolved first
and judged by its target: a symbolic link on the way is followed only when the
link itself is root's or ours and lies in a directory trusted as above (one
another user owns could be pointed at any directory of ours, which the target
alone would not show). The real path is returned, so the caller goes on with
what was checked, not with a link. Files in a trusted directory are read with
:func:`read_trusted`: never through a link, only a regular file, at most a
bounded size.

A refusal is :class:`UntrustedPath` (a ``PermissionError``) naming the path,
its owner and its mode, and saying what to do.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path

__all__ = ["UntrustedPath", "trusted_dir", "trusted_file", "trusted_location", "make_trusted_dir",
           "open_new_file", "open_append", "read_trusted", "owner_name"]

_MAX_LINKS = 40  # as the kernel: more is a loop


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
    """Every directory above ``path`` (real: no links) is root's or ours and not
    writable by others, unless sticky."""
    me = os.geteuid()
    for parent in path.parents:
        st = os.lstat(parent)
        if st.st_uid not in (0, me):
            raise UntrustedPath(f"{what}: {_describe(parent, st)}, a directory above {path}, "
                                f"belongs to another user, who could replace what lies in it")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UntrustedPath(f"{what}: {_describe(parent, st)}, a directory above {path}, "
                                "may be written by others (and has no sticky bit), who could "
                                "replace what lies in it")


def _check_link(link: Path, st: os.stat_result, what: str) -> None:
    """A symbolic link may be followed only if it is root's or ours, in a trusted
    directory: another user's could point at any directory of ours."""
    if st.st_uid not in (0, os.geteuid()):
        raise UntrustedPath(f"{what}: {link} is a symbolic link owned by {owner_name(st.st_uid)}, "
                            f"another user, who could point it anywhere (at {os.readlink(link)} "
                            "now); it is not followed: remove it, or give a path of your own")
    _check_ancestors(link, what)


def _resolve(path: str | os.PathLike[str], what: str) -> Path:
    """The real path of ``path``, walked one component at a time with ``lstat``;
    each symbolic link on the way is checked (:func:`_check_link`) before it is
    followed. FileNotFoundError if a component is missing."""
    given = Path(path)
    todo = list(reversed((given if given.is_absolute() else Path(os.getcwd(), given)).parts[1:]))
    done, followed = Path("/"), 0
    while todo:
        name = todo.pop()
        if name == "..":
            done = done.parent
            continue
        here = done / name
        st = os.lstat(here)
        if not stat.S_ISLNK(st.st_mode):
            done = here
            continue
        followed += 1
        if followed > _MAX_LINKS:
            raise OSError(errno.ELOOP, f"{what}: too many symbolic links in {path}")
        _check_link(here, st, what)
        target = Path(os.readlink(here))
        if target.is_absolute():
            done = Path("/")
        todo.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
    return done


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
    ours, and nobody else may write it, a directory above it or a link on the way.
    ``what`` names it in a refusal."""
    real = _resolve(path, what)
    st = os.lstat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{what}: {real} is not a directory")
    _check_ancestors(real, what)
    _check_own(real, st, what, private=False)
    return real


def trusted_file(path: str | os.PathLike[str], what: str, *, private: bool = True) -> Path:
    """The real path of the existing regular file ``path``, ours, in trusted
    directories, and (``private``) readable by nobody else."""
    real = _resolve(path, what)
    st = os.lstat(real)
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedPath(f"{what}: {real} is not a regular file")
    _check_ancestors(real, what)
    _check_own(real, st, what, private)
    return real


def make_trusted_dir(path: str | os.PathLike[str], what: str, mode: int = 0o700) -> Path:
    """:func:`trusted_dir` of ``path``, made with ``mode`` first if missing (and
    the directories missing above it, with ``mode`` but never less than 0o700);
    an existing one keeps its mode if nobody else may write it. The missing ones
    are made under the checked real path of the part that exists, never through
    a link another user owns."""
    path = Path(os.path.abspath(path))
    missing = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe.name)
        probe = probe.parent
    made = _resolve(probe, what)
    for name in reversed(missing):
        made = made / name
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
    """``path`` with its directory resolved (links checked, see the module), for a
    file or socket of ours to be made there: every directory above it is root's
    or ours and not writable by others unless sticky (``/tmp`` will do: nobody
    can move our entry there)."""
    real = _resolve(Path(path).parent, what) / Path(path).name
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


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def read_trusted(directory: int | str | os.PathLike[str], name: str, max_bytes: int,
                 what: str) -> bytes:
    """The contents of the regular file ``name`` in ``directory`` (a path or an open
    descriptor, already trusted): never through a symbolic link, never blocking on
    a named pipe or reading a device, and at most ``max_bytes`` (an OSError if it
    is larger), so a file planted or grown by mistake cannot hang or exhaust us."""
    where = os.path.join(directory if not isinstance(directory, int) else f"<fd {directory}>", name)
    if name in ("", ".", "..") or os.sep in name:
        raise ValueError(f"{what}: {name!r} is not a name of a file in {directory}")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=directory) if isinstance(directory, int) \
            else os.open(where, flags)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise UntrustedPath(f"{what}: {where} is a symbolic link; it is not followed") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPath(f"{what}: {where} is {_kind(st.st_mode)}, not a regular file; "
                                "remove it")
        if st.st_size > max_bytes:
            raise OSError(f"{what}: {where} is {st.st_size} bytes, more than the {max_bytes} "
                          "it may hold; remove it")
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break  # shrunk meanwhile: the caller's checksum tells
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
