"""Commits of ``apgas.steps`` on disk (``checkpoint=DIR``): the directory, atomically.

What DIR holds (``K`` is the step a resume goes on with: the commit was taken
after step ``K - 1``, before step ``K``; ``K = n`` once the loop is done)::

    DIR/.lock                    flock()ed by the loop that uses DIR (one at a time)
    DIR/commit-<K, 12 digits>/   a complete commit; at most two are kept
        manifest.json            written last: the problem, K, each file's size and CRC-32s
        state.pickle             the loop's ``state``, pickled (absent without state)
        a<k>.<start>-<stop>.bin  rows start .. stop of array k, raw (apgas.arrays._disk)
    DIR/.tmp-<K>-<pid>-<i>/      a commit being written (left by a killed program)
    DIR/.old-<K>-<pid>-<i>/      a torn commit of the same K, being replaced

A commit is written into a ``.tmp-`` folder: the block files (each fsynced),
``state.pickle`` (fsynced), then ``manifest.json`` (fsynced); then the folder is
fsynced, renamed to ``commit-K``, and DIR is fsynced. Only then is any older commit
removed, but the one before (the one loaded or written last), which is kept
until the next commit is complete. A resume takes the newest ``commit-`` folder
whose manifest reads, whose checksum matches, and whose files are all there with
their sizes and checksums; a torn one (a file missing, short or damaged, the
manifest missing) is passed over with a warning, and the one before is loaded.

DIR must be the user's own, and nobody else may write it or a directory above it
(``apgas.serving.make_trusted_dir``): a commit's state is unpickled when it is
loaded, and its checksums are no seal, so a DIR another user made first (in
``/tmp``) would run their pickle. Its commits must be the user's directories too,
and their files are read never through a link, only if regular, and bounded
(``apgas.serving.read_trusted``): a manifest or state someone made a link to
``/dev/zero`` or a named pipe is refused, neither read nor waited on.

This module runs at place 0 and knows the arrays only through their
``_steps_write`` / ``_steps_read`` (``apgas.arrays._disk``): ``import apgas`` does not
import numpy.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import logging
import os
import pickle
import re
import shutil
import stat
import time
import zlib
from collections.abc import Sequence
from typing import Any, Protocol

from launcher._trusted_paths import UntrustedPath, make_trusted_dir, owner_name, read_trusted

from .._core.durable import sync_dir
from ..errors import ApgasError, MultipleException
from .problem_steps import KEY, differences

__all__ = ["Disk", "TornCommit", "MODES", "torn", "test_delay"]

log = logging.getLogger("apgas.steps")
FORMAT = "apgas.steps checkpoint 1"
MODES = ("parallel", "gathered")
_COMMIT = re.compile(r"commit-(\d{12})")
_serial = itertools.count(1)
_MANIFEST_MAX = 64 << 20  # far more than the manifest of any loop: its arrays' file list
_WHAT = "the apgas.steps checkpoint directory"


class TornCommit(ApgasError):
    """A commit on disk that is not whole: a file missing, short or failing its checksum."""


class _OnDisk(Protocol):
    """What a commit on disk needs of an array (``apgas.arrays.BlockArray`` keeps it)."""

    shape: tuple[int, ...]
    dtype: Any

    def _steps_write(self, folder: str, k: int, mode: str) -> list[dict[str, Any]]: ...

    def _steps_read(self, folder: str, files: list[dict[str, Any]], mode: str) -> None: ...


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while len(view):
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_lock(path: str) -> int:
    """The lock file, made if missing: never through a link, never a named pipe."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UntrustedPath(f"{_WHAT}: {path} is not a regular file; remove it")
    return fd


def _check_folder(folder: str) -> None:
    """A commit is a directory of the user's own that nobody else may write (not a
    link): its state is unpickled."""
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UntrustedPath(f"{_WHAT}: {folder} (owned by {owner_name(st.st_uid)}, mode "
                            f"{stat.S_IMODE(st.st_mode):04o}) is not a directory of "
                            f"{owner_name(os.geteuid())}'s that only they may write; remove it")


def torn(e: BaseException) -> TornCommit | None:
    """The TornCommit ``e`` is, or all the exceptions of a MultipleException are."""
    if isinstance(e, TornCommit):
        return e
    if isinstance(e, MultipleException):
        inner = [torn(x) for x in e.exceptions]
        if inner and all(inner):
            return inner[0]
    return None


def test_delay() -> None:
    """``APGAS_TEST_CHECKPOINT_DELAY`` seconds of sleep (a test hook, never for production
    use): after the first chunk of each block file and before the manifest, so that a
    test can kill a program in the middle of a commit."""
    delay = os.environ.get("APGAS_TEST_CHECKPOINT_DELAY")
    if delay:
        time.sleep(float(delay))


class Disk:
    """The checkpoint directory of one loop, locked while the loop runs."""

    def __init__(self, path: str | os.PathLike[str], mode: str, n: int,
                 arrays: Sequence[_OnDisk], fingerprint: dict[str, str] | None = None) -> None:
        """``fingerprint``: what else defines the problem (``problem_steps``)."""
        self.path = os.path.abspath(os.fspath(path))
        self.mode = mode
        self.problem: dict[str, Any] = {"n": n, "arrays": [{"shape": list(a.shape), "dtype": str(a.dtype)}
                                           for a in arrays], "fingerprint": fingerprint or {}}
        self.kept: str | None = None  # the newest complete commit: loaded, or written last
        self.step: int | None = None  # its K
        try:
            self.path = os.fspath(make_trusted_dir(self.path, _WHAT))
            self._lock = _open_lock(os.path.join(self.path, ".lock"))
        except UntrustedPath:
            raise  # says what to do
        except OSError as e:
            raise ApgasError(f"apgas.steps: cannot use the checkpoint directory {self.path}: "
                             f"{e.strerror or e}") from e
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self._lock)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise ApgasError(f"apgas.steps: the checkpoint directory {self.path} is used by "
                                 "another running loop; a directory serves one loop at a time"
                                 ) from None
            raise

    def close(self) -> None:
        os.close(self._lock)  # and the lock with it

    # -- resume -------------------------------------------------------------------------
    def load(self, arrays: Sequence[_OnDisk], state: dict[str, Any] | None) -> int | None:
        """Load the newest whole commit into ``arrays`` and ``state``; its K, or None if
        DIR holds none. ApgasError if it is a commit of another problem."""
        names = sorted((e for e in os.listdir(self.path) if _COMMIT.fullmatch(e)), reverse=True)
        touched = False
        for name in names:
            folder = os.path.join(self.path, name)
            _check_folder(folder)
            try:
                m = self._manifest(folder)
                self._check_problem(folder, m)
                saved = self._read_state(folder, m)
                for a, entry in zip(arrays, m["arrays"], strict=True):
                    a._steps_read(folder, entry["files"], self.mode)  # all or nothing
                    touched = True
            except (TornCommit, MultipleException) as e:
                bad = torn(e)
                if bad is None:
                    raise
                log.warning("the commit %s is torn and is not loaded (%s)", folder,
                            bad)
                continue
            if saved is not None and state is not None:
                state.clear()
                state.update(pickle.loads(saved))
            self.kept, self.step = name, int(m["next_step"])
            log.info("resumed from %s, at step %d of %d", folder, self.step,
                     self.problem["n"])
            return self.step
        if touched:
            raise ApgasError(f"apgas.steps: every commit in {self.path} is torn, and reading them "
                             "overwrote some of the arrays: make them again, and remove the "
                             "directory to start afresh")
        return None

    def _manifest(self, folder: str) -> dict[str, Any]:
        path = os.path.join(folder, "manifest.json")
        try:
            outer = json.loads(read_trusted(folder, "manifest.json", _MANIFEST_MAX, _WHAT))
            body = outer["manifest"]
            ok = zlib.crc32(json.dumps(body, sort_keys=True).encode()) == outer["crc32"]
        except FileNotFoundError:
            raise TornCommit(f"{path} is missing") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TornCommit(f"{path} cannot be read: {e}") from None
        if not ok or not isinstance(body, dict):
            raise TornCommit(f"{path} fails its checksum")
        return body

    def _check_problem(self, folder: str, m: dict[str, Any]) -> None:
        there, here = m.get("problem", {}), self.problem
        if m.get("format") != FORMAT:
            raise ApgasError(f"apgas.steps: the checkpoint directory {self.path} holds {folder}, "
                             f"of format {m.get('format')!r}, not {FORMAT!r}")
        diffs = []
        if there.get("n") != here["n"]:
            diffs.append(f"n is {there.get('n')} there, {here['n']} here")
        a, b = there.get("arrays", []), here["arrays"]
        if len(a) != len(b):
            diffs.append(f"{len(a)} arrays there, {len(b)} here")
        for k, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                diffs.append(f"array {k} is {tuple(x['shape'])} {x['dtype']} there, "
                             f"{tuple(y['shape'])} {y['dtype']} here")
        if "fingerprint" not in there:
            log.warning("the commit %s keeps no fingerprint of its problem (an older version "
                        "wrote it): only n and the arrays' shapes and dtypes were compared", folder)
        found = differences(there.get("fingerprint"), here["fingerprint"])
        if diffs or found:
            same = "" if not found or KEY in here["fingerprint"] else (
                " (if it is the same problem all the same, name it: checkpoint_key=...)")
            raise ApgasError(f"apgas.steps: the checkpoint directory {self.path} holds a commit of "
                             f"another problem ({os.path.basename(folder)}): "
                             + "; ".join(diffs + found)
                             + f". Use another directory, or remove this one to start afresh{same}")

    @staticmethod
    def _read_state(folder: str, m: dict[str, Any]) -> bytes | None:
        entry = m.get("state")
        if entry is None:
            return None
        path = os.path.join(folder, entry["name"])
        try:
            data = read_trusted(folder, entry["name"], entry["size"], _WHAT)
        except FileNotFoundError:
            raise TornCommit(f"{path} is missing") from None
        except OSError as e:  # a link, a pipe, a device, or larger than its manifest says
            raise TornCommit(f"{path} cannot be read: {e}") from None
        if len(data) != entry["size"] or zlib.crc32(data) != entry["crc32"]:
            raise TornCommit(f"{path} is {len(data)} bytes, or fails its checksum")
        return data

    # -- commit -------------------------------------------------------------------------
    def write(self, next_step: int, arrays: Sequence[_OnDisk], state: bytes | None,
              places: int) -> None:
        """Write the commit before step ``next_step``, atomically; nothing if DIR holds it
        already (a roll-back or a resume goes on from there)."""
        if next_step == self.step:
            return
        tag = f"{next_step:012d}-{os.getpid()}-{next(_serial)}"
        tmp = os.path.join(self.path, f".tmp-{tag}")
        os.mkdir(tmp, 0o700)
        try:
            files = [a._steps_write(tmp, k, self.mode) for k, a in enumerate(arrays)]
            body: dict[str, Any] = {
                "format": FORMAT, "problem": self.problem, "next_step": next_step,
                "after_step": next_step - 1, "mode": self.mode, "places": places,
                "arrays": [{"files": f} for f in files], "state": None}
            if state is not None:
                _write_file(os.path.join(tmp, "state.pickle"), state)
                body["state"] = {"name": "state.pickle", "size": len(state),
                                 "crc32": zlib.crc32(state)}
            test_delay()
            crc = zlib.crc32(json.dumps(body, sort_keys=True).encode())
            _write_file(os.path.join(tmp, "manifest.json"),
                        json.dumps({"manifest": body, "crc32": crc}, indent=1).encode())
            sync_dir(tmp)
            final = os.path.join(self.path, f"commit-{next_step:012d}")
            if os.path.exists(final):  # a torn one, passed over at the resume
                os.rename(final, os.path.join(self.path, f".old-{tag}"))
            os.rename(tmp, final)
            sync_dir(self.path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        keep = {os.path.basename(final), self.kept}
        for e in os.listdir(self.path):
            if e not in keep and (_COMMIT.fullmatch(e) or e.startswith((".tmp-", ".old-"))):
                shutil.rmtree(os.path.join(self.path, e), ignore_errors=True)
        self.kept, self.step = os.path.basename(final), next_step
