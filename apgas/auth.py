"""Signed lines: how a job, its scheduler and the scheduler's clients know who speaks.

Every line of the malleability protocol (the job's messages, the scheduler's
orders) and every request to the scheduler over TCP travels signed::

    A1 <time ns> <nonce> <mac> <line>

``mac`` is HMAC-SHA256 (first 128 bits, hex) of ``"<time ns> <nonce> <line>"``
under a shared secret: the job's secret (``APGAS_JOB_SECRET``, which the
scheduler gives each job) or the operator's (the scheduler's key file). A
:class:`ReplayGuard` accepts a line once, within :data:`MAX_SKEW` seconds of
its time (clocks of a cluster agree that well, as Kerberos assumes), and
remembers what it accepted for as long, so a captured line cannot be sent
again. Replies on the same connection are not signed: only the process that
holds the listening port can send them.

Plain lines (no signature) are what the ElasticJobScheduler of APGAS for
Java speaks; they are accepted only where compatibility is asked for
explicitly (see ``docs/security.md``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections import OrderedDict
from pathlib import Path

from launcher._digits import ascii_int
from launcher._trusted_paths import make_trusted_dir, trusted_file

__all__ = ["AuthError", "ReplayGuard", "Signed", "sign", "parse_signed", "is_signed", "accept",
           "new_secret",
           "load_or_create_secret", "read_secret", "write_key_file", "order_key_path", "runtime_dir",
           "MAX_SKEW"]

TAG = "A1"
#: seconds a signed line stays valid, either side of the receiver's clock
MAX_SKEW = 300.0
_MAC_HEX = 32


class AuthError(ValueError):
    """A line was not signed, not signed right, too old, or seen before."""


def new_secret() -> str:
    """A fresh secret: 256 random bits, hex."""
    return secrets.token_hex(32)


def _mac(secret: str, t: int, nonce: str, line: str) -> str:
    return hmac.new(secret.encode(), f"{t} {nonce} {line}".encode(),
                    hashlib.sha256).hexdigest()[:_MAC_HEX]


def sign(secret: str, line: str) -> str:
    """``line`` signed with ``secret``, valid once and for :data:`MAX_SKEW` s.
    Surrounding white space is not signed (receivers strip it)."""
    line = line.strip()
    t, nonce = time.time_ns(), secrets.token_hex(8)
    return f"{TAG} {t} {nonce} {_mac(secret, t, nonce, line)} {line}"


def is_signed(line: str) -> bool:
    return line.startswith(TAG + " ")


class Signed:
    """A signed line taken apart; :meth:`ReplayGuard.check` verifies it."""

    __slots__ = ("t", "nonce", "mac", "line")

    def __init__(self, t: int, nonce: str, mac: str, line: str) -> None:
        self.t, self.nonce, self.mac, self.line = t, nonce, mac, line


def parse_signed(text: str) -> Signed:
    """Take a signed line apart (AuthError if it is not one)."""
    parts = text.split(" ", 4)
    if len(parts) == 4:
        parts.append("")  # an empty line, its space stripped
    if len(parts) != 5 or parts[0] != TAG:
        raise AuthError(f"not a signed line (expected '{TAG} <time> <nonce> <mac> <line>'): "
                        f"{text[:60]!r}")
    _, t, nonce, mac, line = parts
    when = ascii_int(t, max_digits=20)
    if when is None or len(nonce) != 16 or len(mac) != _MAC_HEX:
        raise AuthError(f"malformed signature on {line[:60]!r}")
    return Signed(when, nonce, mac, line)


def accept(text: str, secret: str | None, guard: ReplayGuard, unsigned: str) -> str:
    """The line in ``text``. With ``secret``: only if signed with it, recent and
    new (AuthError naming what failed; ``unsigned`` says why a plain line is
    refused). Without (plain mode): any line, a signature, if any, dropped unchecked."""
    if is_signed(text):
        signed = parse_signed(text)
        return signed.line if secret is None else guard.check(secret, signed)
    if secret is not None:
        raise AuthError(f"{unsigned}: {text[:60]!r}")
    return text


class ReplayGuard:
    """Verifies signed lines and accepts each one once. Thread-safe; remembers
    at most ``capacity`` lines (only correctly signed ones enter, so nobody
    without the secret can fill it)."""

    def __init__(self, max_skew: float = MAX_SKEW, capacity: int = 200_000) -> None:
        self.max_skew = max_skew
        self.capacity = capacity
        self._seen: OrderedDict[tuple[int, str], float] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, secret: str, signed: Signed) -> str:
        """The line, if ``signed`` carries a valid MAC under ``secret``, is
        recent and was not seen before; AuthError saying which check failed."""
        if not hmac.compare_digest(signed.mac, _mac(secret, signed.t, signed.nonce, signed.line)):
            raise AuthError(f"bad signature on {signed.line[:60]!r}")
        now = time.time()
        age = now - signed.t / 1e9
        if abs(age) > self.max_skew:
            raise AuthError(f"signed line is {age:+.0f} s old (more than {self.max_skew:g} s "
                            f"either way; are the clocks apart?): {signed.line[:60]!r}")
        key = (signed.t, signed.nonce)
        with self._lock:
            while self._seen and (next(iter(self._seen.values())) < now - 2 * self.max_skew
                                  or len(self._seen) >= self.capacity):
                self._seen.popitem(last=False)
            if key in self._seen:
                raise AuthError(f"replayed line refused: {signed.line[:60]!r}")
            self._seen[key] = now
        return signed.line


def read_secret(path: str | os.PathLike[str]) -> str:
    """The secret in a key file (OSError if unreadable, AuthError if empty)."""
    text = Path(path).read_text().strip()
    if not text:
        raise AuthError(f"the key file {path} is empty")
    return text


def load_or_create_secret(path: str | os.PathLike[str]) -> str:
    """The secret in ``path``; a new one (mode 0600, directory 0700) if the
    file does not exist. Refuses (:class:`~apgas.serving.UntrustedPath`)
    a key file that another user owns, that others may read, or that lies in a
    directory others could change: whoever can write it chooses the key."""
    path = Path(path)
    if os.path.lexists(path):
        return read_secret(trusted_file(path, "the key file"))
    secret = new_secret()
    _write_private(path, secret, os.O_EXCL)
    return secret


def write_key_file(path: Path, secret: str) -> Path:
    """Write ``secret`` to ``path`` (mode 0600, its directory 0700), replacing any old file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    _write_private(tmp, secret, os.O_TRUNC)
    os.replace(tmp, path)
    return path


def _write_private(path: Path, secret: str, flags: int) -> None:
    """A new file only its owner may read (in a trusted directory, made 0700), holding ``secret``."""
    directory = make_trusted_dir(path.parent, "the key file's directory")
    fd = os.open(directory / path.name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | flags, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")


def runtime_dir() -> Path:
    """Where this user's keys live: ``$APGAS_RUNTIME_DIR``, else ``~/.apgas``."""
    return Path(os.environ.get("APGAS_RUNTIME_DIR") or Path.home() / ".apgas")


def order_key_path(port: int) -> Path:
    """The key file of a job started by hand that takes orders on ``port``:
    the order CLI (``python -m apgas.order``) of the same user finds it there."""
    return runtime_dir() / "orders" / f"{port}.key"
