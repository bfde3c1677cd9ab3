"""The live scheduler's durable state: an SQLite database under its state directory.

It holds the pool, every job (its spec, owner, key, state, nodes, times, order
address, the identity of its processes, and its requeues with the last reason)
and the event log. Each event is
written together with the job it changed in one transaction (SQLite's WAL
journal, synchronous commits), so a crash loses at most the request being
answered, whose client then sees no reply. A restarted scheduler reads it back
(:meth:`StateStore.load`) and resumes; ids are never reused.

The database holds the jobs' keys: it is made with mode 0600 in a directory of
mode 0700, and a lock file keeps a second scheduler off the same directory.
An output directory serves one state (:func:`claim_output_dir`), so that no
scheduler's ``job-N.out`` overwrites another's of the same number.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from apgas.serving import UntrustedPath, make_trusted_dir, open_new_file, trusted_file

from ..jobs import JobSpec, parse_job

__all__ = ["StateStore", "StoredJob", "StateError", "OutputDirInUse", "DB_NAME", "OUTPUT_MARKER",
           "claim_output_dir", "read_db_events"]

DB_NAME = "scheduler.db"
SCHEMA = 3  # 2: jobs.request, the client's key that makes a repeated submit one job;
# 3: jobs.requeues and jobs.requeue_reason (a job that went back to the queue)
_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (position INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY, spec TEXT NOT NULL, owner INTEGER NOT NULL, secret TEXT NOT NULL,
    state TEXT NOT NULL, submit REAL NOT NULL, start REAL, end_time REAL, reason TEXT NOT NULL,
    nodes TEXT NOT NULL, listen TEXT, reports TEXT NOT NULL, ready INTEGER NOT NULL,
    disabled INTEGER NOT NULL, grows INTEGER NOT NULL, shrinks INTEGER NOT NULL,
    identity TEXT, request TEXT, requeues INTEGER NOT NULL DEFAULT 0,
    requeue_reason TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, record TEXT NOT NULL);
"""


class StateError(RuntimeError):
    """The state directory cannot be used (in use by another scheduler, unreadable, newer)."""


class OutputDirInUse(StateError):
    """The output directory holds the job output of another state's scheduler."""


@dataclasses.dataclass
class StoredJob:
    """One job as the database keeps it."""

    id: int
    spec: JobSpec
    owner: int
    secret: str
    state: str
    submit: float
    start: float | None
    end: float | None
    reason: str
    nodes: list[str]
    listen: tuple[str, int] | None
    reports: str
    ready: bool
    disabled: bool
    grows: int
    shrinks: int
    identity: dict[str, Any] | None
    request: str | None  # the client's key of the submit that made it (None: none given)
    requeues: int = 0  # times it went back to the queue
    requeue_reason: str = ""  # why, the last time


class StateStore:
    """The database of one scheduler; thread-safe (one connection, one lock)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        # the state says whom each job runs as: nobody else may write it (a planted
        # database would run its jobs as root)
        self.directory = make_trusted_dir(directory, "the state directory", 0o700)
        lock = os.open(self.directory / "lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o600)
        self._lock_file = os.fdopen(lock, "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise StateError(f"another scheduler uses the state directory {self.directory} "
                             "(give this one its own: --state-dir)") from None
        self.path = self.directory / DB_NAME
        self._mutex = threading.Lock()  # one transaction at a time, and no close during one
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.close(fd)  # made private before any secret
            trusted_file(self.path, "the state database")
        except OSError:
            self.close()
            raise
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_TABLES)
        except sqlite3.DatabaseError as e:
            self.close()
            raise StateError(f"cannot use {self.path}: {e}") from None
        try:
            self._check_schema()
        except BaseException:
            self.close()  # the lock too: the next try says what was wrong, not "in use"
            raise

    def _check_schema(self) -> None:
        """Mark a new state with our schema; upgrade an older one; refuse a newer one."""
        version = self._meta("schema")
        if version is None:
            self._set_meta("schema", str(SCHEMA))
            self._set_meta("started", repr(time.time()))
        elif int(version) > SCHEMA:
            raise StateError(f"{self.path} was written by a newer scheduler (schema {version})")
        elif int(version) < SCHEMA:  # an older scheduler's state: columns it did not have
            self._upgrade(int(version))

    def _upgrade(self, version: int) -> None:
        """Add the columns an older scheduler's state lacks, in one transaction."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if version < 2:  # no request key
                self._db.execute("ALTER TABLE jobs ADD COLUMN request TEXT")
            self._db.execute("ALTER TABLE jobs ADD COLUMN requeues INTEGER NOT NULL DEFAULT 0")
            self._db.execute("ALTER TABLE jobs ADD COLUMN requeue_reason TEXT NOT NULL DEFAULT ''")
            self._set_meta("schema", str(SCHEMA))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    # -- reading -----------------------------------------------------------------------
    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    @property
    def started(self) -> float:
        """The wall-clock time of the first start: the scheduler's clock counts from it."""
        return float(self._meta("started") or time.time())

    def nodes(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT name FROM nodes ORDER BY position")]

    def jobs(self) -> list[StoredJob]:
        """Every job, in id order (the order they were submitted)."""
        return [_stored(row) for row in self._db.execute("SELECT * FROM jobs ORDER BY id")]

    def last_id(self) -> int:
        """The highest job id ever given (0 for none): no job row is ever deleted,
        so ids are never reused."""
        return self._db.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0]

    def events(self) -> Iterator[dict[str, Any]]:
        for (record,) in self._db.execute("SELECT record FROM events ORDER BY seq"):
            yield json.loads(record)

    # -- writing (each call is one transaction) ------------------------------------------
    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def record(self, event: dict[str, Any], job: Any = None, nodes: list[str] | None = None) -> None:
        """Log ``event`` and, in the same transaction, the job it changed (a
        :class:`~.records.Job`) or the pool."""
        with self._mutex:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT INTO events (record) VALUES (?)", (json.dumps(event),))
                if job is not None:
                    self._db.execute("INSERT OR REPLACE INTO jobs VALUES "
                                     "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", _row(job))
                if nodes is not None:
                    self._db.execute("DELETE FROM nodes")
                    self._db.executemany("INSERT INTO nodes VALUES (?, ?)", enumerate(nodes))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            # not under a transaction another thread is writing (a job's late message while
            # the daemon shuts down): closing it there crashed the process (SIGSEGV); a
            # record after this raises sqlite3.ProgrammingError instead
            with self._mutex:
                db.close()
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        finally:
            self._lock_file.close()


def _row(job: Any) -> tuple:
    identity = getattr(job, "identity", None)
    return (job.id, json.dumps(job.spec.to_dict()), job.owner, job.secret, job.state, job.submit,
            job.start, job.end, job.reason, json.dumps([*job.nodes, *job.reserved]),
            json.dumps(list(job.listen)) if job.listen else None, job.reports, int(job.ready),
            int(job.disabled), job.grows, job.shrinks,
            json.dumps(identity) if identity is not None else None, job.request,
            getattr(job, "requeues", 0), getattr(job, "requeue_reason", ""))


def _stored(row: tuple) -> StoredJob:
    (jid, spec, owner, secret, state, submit, start, end, reason, nodes, listen, reports, ready,
     disabled, grows, shrinks, identity, request, requeues, requeue_reason) = row
    return StoredJob(
        jid, parse_job(json.loads(spec), f"stored job {jid}", stored=True),  # an older one's: kept
        owner, secret, state, submit, start, end, reason, json.loads(nodes),
        tuple(json.loads(listen)) if listen else None, reports, bool(ready),
        bool(disabled), grows, shrinks, json.loads(identity) if identity else None, request,
        requeues or 0, requeue_reason or "")


OUTPUT_MARKER = ".apgas-state"
"""The file in an output directory that names the state directory it serves."""


def claim_output_dir(output_fd: int, output_dir: Path, state_dir: Path) -> None:
    """Make sure the output directory (open as ``output_fd``) serves the state in
    ``state_dir`` alone: its :data:`OUTPUT_MARKER` names that state's real path,
    written at its first use (an output directory of an older scheduler, without
    a marker, goes to the first state that uses it). :class:`OutputDirInUse` if it
    names another state: job ids are the state's, so two states' schedulers in
    one directory would overwrite each other's ``job-N.out``, whether they run
    at once or one after the other. The marker is read and made never through a
    link, and must be ours (or root's) and nobody else's to write."""
    mine = os.path.realpath(state_dir)
    marker = output_dir / OUTPUT_MARKER
    for _ in range(3):
        try:
            fd = os.open(OUTPUT_MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=output_fd)
        except FileNotFoundError:
            if _made_marker(output_fd, mine):
                return
            continue  # another scheduler made it meanwhile: read what it says
        except OSError as e:  # ELOOP: a symbolic link
            raise UntrustedPath(f"the output directory's marker {marker}: {e.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0) \
                    or st.st_mode & 0o022:
                raise UntrustedPath(f"the output directory's marker {marker} is not a regular "
                                    "file of ours that only we may write")
            theirs = f.read(4096).decode(errors="backslashreplace").strip()
        if theirs != mine:
            raise OutputDirInUse(
                f"the output directory {output_dir} holds the job output of the scheduler "
                f"whose state is {theirs!r} ({marker} says so), not of this state {mine!r}: "
                "give this scheduler an output directory of its own (--output-dir) or serve "
                "it on that state (--state-dir)")
        return
    raise StateError(f"cannot claim the output directory {output_dir}: {marker} keeps changing")


def _made_marker(output_fd: int, state: str) -> bool:
    """Write the marker naming ``state`` whole, under a name of this process, then
    link it into place; False if a marker came meanwhile (it stays as it is)."""
    tmp = f"{OUTPUT_MARKER}.{os.getpid()}.tmp"
    fd = open_new_file(output_fd, tmp, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(state + "\n")
        os.link(tmp, OUTPUT_MARKER, src_dir_fd=output_fd, dst_dir_fd=output_fd,
                follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp, dir_fd=output_fd)


def read_db_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The event log of a scheduler's database (read only; the scheduler may run)."""
    uri = f"file:{Path(path).resolve()}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True)
        try:
            return [json.loads(r[0]) for r in db.execute("SELECT record FROM events ORDER BY seq")]
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        raise ValueError(f"{path}: not a scheduler database: {e}") from None
