"""Files that are whole or absent after a crash: checkpoints written to disk.

A file is written under a temporary name in its directory, flushed to the disk
(``fsync``), renamed over its final name and the directory flushed too, so a
crash at any moment (SIGKILL, a node losing power) leaves the old file or the
new one, never a torn one. Its contents carry their own length and SHA-256,
so a file damaged later (a full disk, a bad copy) is recognised and refused
as well.

The temporary name is unguessable and made exclusively, never through a link:
in a directory others may write (a sticky ``/tmp``), nobody can take the name
first to make the write fail, or plant a link to read or redirect the data. A
file is read back never through a link and only if it is a regular file (not a
named pipe or a device someone left there).
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import sys
from pathlib import Path

from launcher._trusted_paths import read_trusted

__all__ = ["write_atomically", "read_sealed", "seal", "DamagedFile"]

_MAGIC = b"apgas-sealed 1 "
_TRIES = 8  # unguessable names taken in a row: someone is at it, not chance


class DamagedFile(ValueError):
    """A sealed file whose length or checksum does not match its contents."""


def seal(payload: bytes) -> bytes:
    """``payload`` with a header that says its length and SHA-256."""
    return b"%s%d %s\n" % (_MAGIC, len(payload), hashlib.sha256(payload).hexdigest().encode()) + payload


def _unseal(data: bytes, where: str) -> bytes:
    header, sep, payload = data.partition(b"\n")
    if not sep or not header.startswith(_MAGIC):
        raise DamagedFile(f"{where}: not a sealed file (no header)")
    try:
        length_text, digest = header[len(_MAGIC):].split(b" ")
        length = int(length_text)
    except ValueError:
        raise DamagedFile(f"{where}: its header is damaged") from None
    if len(payload) != length:
        raise DamagedFile(f"{where}: {len(payload)} bytes where its header says {length} (torn)")
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        raise DamagedFile(f"{where}: its checksum does not match its contents")
    return payload


def read_sealed(path: str | os.PathLike[str]) -> bytes:
    """The payload of a file :func:`write_atomically` wrote with ``sealed=True``;
    :class:`DamagedFile` if it is torn or damaged, OSError if it cannot be read (a
    symbolic link, a named pipe or a device are refused, not followed or read)."""
    path = Path(path)
    data = read_trusted(path.parent, path.name, sys.maxsize, "a sealed file")
    return _unseal(data, os.fspath(path))


def write_atomically(path: str | os.PathLike[str], data: bytes, *, sealed: bool = True,
                     mode: int = 0o600) -> None:
    """Write ``data`` (sealed with its length and checksum unless ``sealed=False``) to
    ``path`` so that after a crash ``path`` holds the old contents or the new ones."""
    path = Path(path)
    tmp, fd = _new_temporary(path, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(seal(data) if sealed else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    sync_dir(path.parent)


def _new_temporary(path: Path, mode: int) -> tuple[Path, int]:
    """A new file beside ``path`` (``.NAME.<random>.tmp``), made exclusively and never
    through a link, under a name nobody can guess or take first."""
    for _ in range(_TRIES):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                | os.O_CLOEXEC, mode)
        except FileExistsError:
            continue  # taken (by chance, or by someone in a shared directory): another name
    raise FileExistsError(errno.EEXIST, f"cannot write {path}: {_TRIES} random temporary names "
                          f"beside it were all taken; is another user of {path.parent} "
                          "making them? Write in a directory of your own")


def sync_dir(directory: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (a rename, an unlink) to the disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
