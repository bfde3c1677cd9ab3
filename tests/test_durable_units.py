"""Sealed files (``apgas.lowlevel.write_atomically`` / ``read_sealed``): the payload
comes back as written; a file torn, damaged or never sealed is refused naming the
file and what is wrong; a failed write leaves the old file and no temporary one."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

from apgas._core.durable import seal
from apgas.lowlevel import DamagedFile, read_sealed, write_atomically


@pytest.mark.parametrize("payload", [b"", b"one line\n", bytes(range(256)) * 3])
def test_sealed_payload_round_trips_privately(tmp_path, payload):
    """What is written sealed reads back byte for byte, in a file only its owner reads."""
    path = tmp_path / "snap"
    write_atomically(path, payload)
    assert read_sealed(path) == payload
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == seal(payload)
    assert os.listdir(tmp_path) == ["snap"]


def test_seal_header_names_length_and_sha256():
    """The header is the magic, the payload's length and its SHA-256, then a newline."""
    payload = b"abc"
    assert seal(payload) == (b"apgas-sealed 1 3 " + hashlib.sha256(payload).hexdigest().encode()
                             + b"\nabc")


def test_rewrite_replaces_whole_and_unsealed_is_raw(tmp_path):
    """A second write replaces the first whole; ``sealed=False`` writes the bytes as
    they are, with the mode asked for, and reading them as sealed is refused."""
    path = tmp_path / "f"
    write_atomically(path, b"old contents, longer")
    write_atomically(path, b"new")
    assert read_sealed(path) == b"new"
    write_atomically(path, b"raw bytes", sealed=False, mode=0o644)
    assert path.read_bytes() == b"raw bytes"
    with pytest.raises(DamagedFile, match=f"{path}: not a sealed file .no header."):
        read_sealed(path)


@pytest.mark.parametrize("damage, reason", [
    (lambda data: data[:-1], "bytes where its header says"),
    (lambda data: data + b"x", "bytes where its header says"),
    (lambda data: data[:-1] + bytes([data[-1] ^ 1]), "its checksum does not match its contents"),
    (lambda data: data.replace(b"apgas-sealed 1 5 ", b"apgas-sealed 1 five "), "its header is damaged"),
    (lambda data: data.replace(b"\n", b" "), "not a sealed file"),
    (lambda data: b"", "not a sealed file"),
])
def test_damaged_files_are_refused(tmp_path, damage, reason):
    """A torn, grown, flipped or garbled file is a DamagedFile naming it and the damage,
    never a wrong payload; DamagedFile is a ValueError."""
    path = tmp_path / "f"
    write_atomically(path, b"hello")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DamagedFile, match=reason) as e:
        read_sealed(path)
    assert str(path) in str(e.value) and isinstance(e.value, ValueError)


def test_missing_file_is_an_os_error(tmp_path):
    """A file that is not there is an OSError, not a DamagedFile."""
    with pytest.raises(FileNotFoundError):
        read_sealed(tmp_path / "absent")


def test_failed_write_keeps_nothing_half_done(tmp_path):
    """A write whose rename fails (a directory holds the name) raises, and leaves the
    directory as it was: no temporary file."""
    target = tmp_path / "taken"
    target.mkdir()
    (target / "inside").write_text("kept")
    with pytest.raises(OSError):
        write_atomically(target, b"data")
    assert sorted(os.listdir(tmp_path)) == ["taken"]
    assert (target / "inside").read_text() == "kept"
