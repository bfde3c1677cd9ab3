"""Many small messages to one place as one: the body of a transport message of kind
:data:`BATCH`.

A stream of tasks (or of finish reports) to one place would otherwise cost a
message each: a MAC, a send, a receive and a check at the other end. The
transport gathers them per link while they come in a burst and sends them as
one message (:mod:`apgas._core.transport`), which the receiver checks once and
hands on entry by entry, in order. This is what Charm++'s TRAM and Ray's
batched task submission do.

An entry is ``kind (uint8), a (int64), b (int64), length (uint32)`` and
``length`` bytes of body. :func:`entries` checks the whole body before it
returns anything, so a malformed batch is dropped whole and nothing of it is
unpickled.
"""

from __future__ import annotations

import struct

__all__ = ["BATCH", "ENTRY", "MAX_ENTRIES", "encode_entry", "entries", "MalformedBatch"]

#: the transport's kind for a batch; the runtime's kinds start at 1
BATCH = 0
ENTRY = struct.Struct("!BqqI")
MAX_ENTRIES = 4096  # a receiver refuses more in one batch


class MalformedBatch(ValueError):
    """A batch's body does not parse as its header says."""


def encode_entry(kind: int, a: int, b: int, body: bytes | memoryview) -> bytes:
    """One entry of a batch (its body copied: the caller may reuse its buffer)."""
    return ENTRY.pack(kind, a, b, len(body)) + body


def entries(body: memoryview, count: int) -> list[tuple[int, int, int, memoryview]]:
    """The ``count`` entries of a batch's body, each (kind, a, b, body), or
    :class:`MalformedBatch` if the body is not exactly that."""
    if not 0 < count <= MAX_ENTRIES:
        raise MalformedBatch(f"a batch of {count} entries (1 to {MAX_ENTRIES} allowed)")
    out = []
    at, end = 0, body.nbytes
    for _ in range(count):
        if end - at < ENTRY.size:
            raise MalformedBatch("a batch ends inside an entry's header")
        kind, a, b, length = ENTRY.unpack_from(body, at)
        at += ENTRY.size
        if kind == BATCH or length > end - at:
            raise MalformedBatch("a batch holds a batch, or an entry longer than the batch")
        out.append((kind, a, b, body[at:at + length]))
        at += length
    if at != end:
        raise MalformedBatch(f"{end - at} bytes after a batch's last entry")
    return out
