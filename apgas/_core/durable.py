"""Files that are whole or absent after a crash: checkpoints written to disk.

A file is written under a temporary name in its directory, flushed to the disk
(``fsync``), renamed over its final name and the directory flushed too, so a
crash at any moment (SIGKILL, a node losing power) leaves the old file or the
new one, never a torn one. Its contents carry their own length and SHA-256,
so a file damaged later (a full disk, a bad copy) is recognised and refused
as well.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["write_atomically", "read_sealed", "seal", "DamagedFile"]

_MAGIC = b"apgas-sealed 1 "


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
    :class:`DamagedFile` if it is torn or damaged, OSError if it cannot be read."""
    return _unseal(Path(path).read_bytes(), os.fspath(path))


def write_atomically(path: str | os.PathLike[str], data: bytes, *, sealed: bool = True,
                     mode: int = 0o600) -> None:
    """Write ``data`` (sealed with its length and checksum unless ``sealed=False``) to
    ``path`` so that after a crash ``path`` holds the old contents or the new ones."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
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


def sync_dir(directory: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (a rename, an unlink) to the disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
