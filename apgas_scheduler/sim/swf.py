"""Standard Workload Format (SWF) traces as the Parallel Workloads Archive ships
them: plain, gzip, bzip2 or xz compressed (told by the first bytes, not the
name), streamed line by line, and every problem reported with the file, the
line and its cause (:class:`WorkloadError`).

:func:`job_records` turns the job lines into rigid job records, which
:func:`apgas_scheduler.sim.workload.read_swf` makes ``SimJob`` s of;
:func:`swf_header` reads the ``; Key: value`` comments and
:func:`trace_cluster` the cluster size they give (``MaxNodes``, ``MaxProcs``).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import math
import os
import zlib
from collections.abc import Iterator
from os import PathLike

from apgas.protocol import ascii_int

__all__ = ["WorkloadError", "SWF_FIELDS", "open_binary", "trace_lines", "swf_header",
           "trace_cluster", "job_records", "compression_of"]

SWF_FIELDS = 18

# (name, first bytes, opener) of the compressions the archive uses
_MAGIC = (("gzip", b"\x1f\x8b", gzip.open), ("bzip2", b"BZh", bz2.open),
          ("xz", b"\xfd7zXZ\x00", lzma.open))
_SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bzip2", ".xz": "xz"}


class WorkloadError(ValueError):
    """A trace that cannot be read; the message names the file and the line
    (0: the file as a whole, e.g. its compression)."""

    def __init__(self, path: str | PathLike[str], line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = str(path)
        self.line = line


def compression_of(path: str | PathLike[str]) -> str:
    """"gzip", "bzip2", "xz" or "" (plain), by the file's first bytes."""
    with open(path, "rb") as f:
        head = f.read(6)
    return next((name for name, magic, _ in _MAGIC if head.startswith(magic)), "")


def open_binary(path: str | PathLike[str]) -> io.BufferedIOBase:
    """The file's bytes, decompressed as they are read. A name that promises a
    compression (``.gz``, ``.bz2``, ``.xz``) the content lacks is an error."""
    kind = compression_of(path)
    promised = _SUFFIXES.get(os.path.splitext(str(path))[1].lower(), "")
    if promised and kind != promised:
        raise WorkloadError(path, 0, f"named as {promised}-compressed, but its first bytes are "
                                     f"{'plain text' if not kind else kind + ' data'}")
    opener = next((o for name, _, o in _MAGIC if name == kind), open)
    return opener(path, "rb")


def trace_lines(path: str | PathLike[str]) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of the trace, decompressed and decoded
    as UTF-8 (SWF is ASCII); a corrupt stream or a byte that is not UTF-8 is a
    :class:`WorkloadError` at the line where it shows."""
    number = 0
    with open_binary(path) as f:
        kind = compression_of(path) or "plain"
        try:
            for number, raw in enumerate(f, start=1):
                try:
                    yield number, raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise WorkloadError(path, number, f"not UTF-8 (nor ASCII) text: byte "
                                        f"0x{raw[e.start]:02x} at column {e.start + 1}; "
                                        "is it a trace?") from None
        except (OSError, EOFError, zlib.error, lzma.LZMAError) as e:
            # gzip.BadGzipFile is an OSError; a truncated stream ends in EOFError
            raise WorkloadError(path, number + 1, f"bad {kind} compression: "
                                f"{e or type(e).__name__}") from None


def swf_header(path: str | PathLike[str]) -> dict[str, str]:
    """The ``; Key: value`` lines of an SWF header (e.g. ``MaxNodes``, ``MaxProcs``),
    read up to the first job line."""
    header: dict[str, str] = {}
    for _, text in trace_lines(path):
        stripped = text.strip()
        if stripped and not stripped.startswith(";"):
            break
        key, sep, value = stripped.lstrip(";").partition(":")
        if sep and key.strip():
            header.setdefault(key.strip(), value.strip())
    return header


def _positive(header: dict[str, str], key: str) -> int | None:
    value = ascii_int(header.get(key, ""))
    return value if value is not None and value > 0 else None


def trace_cluster(header: dict[str, str], procs_per_node: int | None = None
                  ) -> tuple[int | None, int]:
    """(nodes, processors per node) of the machine a header describes.

    ``procs_per_node`` None: ``MaxProcs / MaxNodes`` when that is a whole
    number (SDSC-BLUE: 1152 / 144 = 8), else 1, and ``MaxNodes`` nodes. Given:
    ``ceil(MaxProcs / procs_per_node)`` nodes (HPC2N, 240 processors, as the
    archive suggests with 2 per node: 120). Nodes None: the header has neither
    field."""
    max_nodes, max_procs = _positive(header, "MaxNodes"), _positive(header, "MaxProcs")
    if procs_per_node is None:
        if max_nodes and max_procs and max_procs % max_nodes == 0:
            return max_nodes, max_procs // max_nodes
        return max_nodes or max_procs, 1
    if max_procs:
        return math.ceil(max_procs / procs_per_node), procs_per_node
    return max_nodes, procs_per_node


def _fields(path: str | PathLike[str], number: int, text: str) -> list[float]:
    parts = text.split()
    if len(parts) != SWF_FIELDS:
        raise WorkloadError(path, number, f"expected {SWF_FIELDS} fields, found {len(parts)}")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise WorkloadError(path, number, f"not a number in {text.strip()!r}") from None
    if not all(math.isfinite(v) for v in values):
        raise WorkloadError(path, number, "fields must be finite numbers")
    return values


def job_records(path: str | PathLike[str], procs_per_node: int = 1, max_jobs: int | None = None
                ) -> tuple[list[tuple[float, int, float, float, int]], int]:
    """The kept jobs as (submit, id, runtime, estimate, nodes), in file order,
    and how many job lines were skipped; see ``workload.read_swf``."""
    if procs_per_node < 1:
        raise ValueError("procs_per_node must be >= 1")
    kept: list[tuple[float, int, float, float, int]] = []
    skipped = 0
    for number, text in trace_lines(path):
        stripped = text.strip()
        if not stripped or stripped.startswith(";"):
            continue
        if max_jobs is not None and len(kept) >= max_jobs:
            break
        v = _fields(path, number, stripped)
        if not v[0].is_integer():
            raise WorkloadError(path, number, f"job number {v[0]} is not an integer")
        runtime, procs = v[3], (v[7] if v[7] > 0 else v[4])
        if runtime <= 0 or procs <= 0:
            skipped += 1
            continue
        if v[1] < 0:
            raise WorkloadError(path, number, "submit time unknown")
        estimate = v[8] if v[8] > 0 else runtime
        kept.append((v[1], int(v[0]), runtime, estimate, math.ceil(procs / procs_per_node)))
    return kept, skipped
