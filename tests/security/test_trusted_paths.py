"""Issue 52: paths the system trusts are walked with ``lstat``, never judged by a
link's target. Each two-user test plants something as the user ``nobody`` in a
sticky shared directory (as ``/tmp`` is) and shows the victim (root) refuse it,
with what it says:

1. a link another user made where the scheduler's output directory goes;
2. a step-checkpoint directory another user made first, holding a pickle;
8. such a directory whose manifest is ``/dev/zero`` or a named pipe, or whose
   lock is held; and, in the user's own directory, files read never through a
   link, never from a pipe or device, bounded;
12. ``write_atomically``'s temporary name taken first;
13. a GLB checkpoint directory that is another user's link.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from test_authentication import SYSTEM_PY

import apgas
from apgas import serving
from apgas.lowlevel import read_sealed, write_atomically
from apgas.serving import UntrustedPath, make_trusted_dir, trusted_dir, trusted_file, trusted_location

pytestmark = pytest.mark.timeout(90)
AS_ROOT = os.geteuid() == 0
NOBODY = 65534
needs_root = pytest.mark.skipif(not AS_ROOT, reason="needs root: the attack comes from the user "
                                                    "nobody against root's files")
LINK_OF_NOBODY = r"is a symbolic link owned by nobody \(uid 65534\), another user"


def as_nobody(code: str, *args: str) -> None:
    """Run ``code`` (system Python, no apgas) as the user nobody: the attacker's move."""
    subprocess.run([SYSTEM_PY, "-c", code, *args], user="nobody", check=True, capture_output=True,
                   text=True, timeout=30, cwd="/")


def link_as_nobody(link: Path, target: Path) -> None:
    as_nobody("import os, sys; os.symlink(sys.argv[2], sys.argv[1])", str(link), str(target))
    assert link.lstat().st_uid == NOBODY


@pytest.fixture
def roots_dir(tmp_path) -> Path:
    """A directory of the victim's that the old check accepted: its own, 0755."""
    path = tmp_path / "victims"
    path.mkdir(mode=0o755)
    return path


# -- the rule, on links of one's own (any user) --------------------------------------------------

def test_a_link_of_ones_own_in_a_trusted_directory_is_followed_to_the_real_path(tmp_path):
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True, mode=0o700)
    (real / "key").write_text("k")
    (real / "key").chmod(0o600)
    (tmp_path / "link").symlink_to("real")
    (tmp_path / "up").symlink_to("real/sub/..")  # relative, with .. resolved on the real path
    assert trusted_dir(tmp_path / "link", "d") == real.resolve()
    assert trusted_dir(tmp_path / "up" / "sub", "d") == (real / "sub").resolve()
    assert trusted_file(tmp_path / "link" / "key", "k") == (real / "key").resolve()
    assert trusted_location(tmp_path / "link" / "s.sock", "s") == (real / "s.sock").resolve()
    assert make_trusted_dir(tmp_path / "link" / "new" / "dir", "m") == (real / "new/dir").resolve()


def test_a_link_of_ones_own_in_a_directory_others_may_write_is_refused(tmp_path):
    """Others could replace the link there (no sticky bit) with one to anywhere."""
    (tmp_path / "real").mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UntrustedPath, match=rf"d: {shared} .*mode 0777.*a directory above "
                                            rf"{shared / 'link'}, may be written by others"):
        trusted_dir(shared / "link", "d")


def test_a_loop_of_links_is_an_error_not_a_hang(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError, match="too many symbolic links"):
        trusted_dir(tmp_path / "a", "d")


# -- 1. the output directory through another user's link ---------------------------------------

@needs_root
def test_an_output_directory_beside_the_state_that_another_user_linked_is_refused(
        shared_dir, roots_dir, make_scheduler):
    """``--state-dir S`` in /tmp: the output goes to ``S.jobs``, which nobody made first."""
    link_as_nobody(shared_dir / "S.jobs", roots_dir)
    with pytest.raises(UntrustedPath, match=rf"the output directory: {shared_dir / 'S.jobs'} "
                                            rf"{LINK_OF_NOBODY}.*not followed"):
        make_scheduler(nodes=1, policy="fcfs", state_dir=shared_dir / "S", output_dir=None)
    assert list(roots_dir.iterdir()) == []


CHECKS = {"trusted_dir": trusted_dir, "make_trusted_dir": make_trusted_dir,
          "trusted_file": trusted_file, "trusted_location": trusted_location}


@needs_root
@pytest.mark.parametrize(("check", "target", "below"), [
    ("trusted_dir", "", ""), ("trusted_dir", "", "sub"),
    ("make_trusted_dir", "", ""), ("make_trusted_dir", "", "new/dir"),
    ("trusted_file", "key", ""), ("trusted_file", "", "key"),
    ("trusted_location", "", "socket")])
def test_a_link_another_user_owns_is_never_followed(shared_dir, roots_dir, check, target, below):
    """The state, output and key paths all pass these checks: nobody's link (``below``
    it, a component above) to a directory of root's was judged by its target, root's,
    and followed."""
    (roots_dir / "sub").mkdir(mode=0o700)
    (roots_dir / "key").write_text("secret")
    (roots_dir / "key").chmod(0o600)
    before = sorted(roots_dir.rglob("*"))
    link = shared_dir / "planted"
    link_as_nobody(link, roots_dir / target)
    with pytest.raises(UntrustedPath, match=rf"the path: {link} {LINK_OF_NOBODY}.*not followed"):
        CHECKS[check](link / below, "the path")
    assert sorted(roots_dir.rglob("*")) == before


# -- 2 and 8. a step-checkpoint directory another user made first --------------------------------

def count(folder: Path, n: int, stop: int | None = None) -> tuple[list[int], dict]:
    """A loop with only ``state``, committed every 2 steps to ``folder``."""
    st: dict = {"sum": 0}
    ran = []
    for step in apgas.steps(n, commit_every=2, state=st, checkpoint=folder):
        with step:
            ran.append(step.index)
            st["sum"] += step.index
        if step.index == stop:
            break
    return ran, st


class Mark:
    """Unpickled, it leaves a file: the attacker's code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({str(self.path)!r}, 'w').close()",))


def poison(folder: Path, payload: bytes) -> None:
    """Every commit's state replaced by ``payload``, its manifest's size and CRCs made to
    match, as anyone can: they are checksums, not a seal."""
    for commit in folder.glob("commit-*"):
        (commit / "state.pickle").write_bytes(payload)
        outer = json.loads((commit / "manifest.json").read_text())
        body = outer["manifest"]
        body["state"].update(size=len(payload), crc32=zlib.crc32(payload))
        outer["crc32"] = zlib.crc32(json.dumps(body, sort_keys=True).encode())
        (commit / "manifest.json").write_text(json.dumps(outer))


def hand_to_nobody(folder: Path) -> None:
    for p in [folder, *folder.rglob("*")]:
        os.chown(p, NOBODY, NOBODY, follow_symlinks=False)


@pytest.fixture
def planted_steps_dir(shared_dir, tmp_path) -> Path:
    """A checkpoint directory nobody made in the shared directory before the victim ran."""
    made = tmp_path / "made"
    apgas.run(lambda: count(made, 6, stop=3), places=1)
    folder = shared_dir / "ckpt"
    shutil.move(made, folder)
    return folder


@needs_root
def test_a_step_checkpoint_directory_another_user_made_is_refused_its_pickle_not_loaded(
        planted_steps_dir, tmp_path):
    marker = tmp_path / "attacker-code-ran"
    poison(planted_steps_dir, pickle.dumps(Mark(marker)))
    hand_to_nobody(planted_steps_dir)
    with pytest.raises(UntrustedPath, match=rf"the apgas.steps checkpoint directory: "
                                            rf"{planted_steps_dir} \(owned by nobody \(uid 65534\), "
                                            r"mode 0\d+\) belongs to another user"):
        apgas.run(lambda: count(planted_steps_dir, 6), places=1)
    assert not marker.exists()


@needs_root
@pytest.mark.parametrize("plant", ["manifest to /dev/zero", "manifest a named pipe", "lock held"])
def test_a_planted_step_directory_is_refused_at_once_not_read_waited_on_or_locked(
        planted_steps_dir, plant):
    commit = sorted(planted_steps_dir.glob("commit-*"))[-1]
    holder = None
    if plant == "lock held":
        holder = subprocess.Popen([SYSTEM_PY, "-c", "import fcntl, os, sys\n"
                                   "fd = os.open(sys.argv[1], os.O_RDWR)\n"
                                   "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\n"
                                   "sys.stdin.read()", str(planted_steps_dir / ".lock")],
                                  user="nobody", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, cwd="/")
    else:
        (commit / "manifest.json").unlink()
        if plant == "manifest to /dev/zero":
            (commit / "manifest.json").symlink_to("/dev/zero")
        else:
            os.mkfifo(commit / "manifest.json")
    hand_to_nobody(planted_steps_dir)
    try:
        if holder is not None:
            assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UntrustedPath, match="belongs to another user.*use one of your own"):
            apgas.run(lambda: count(planted_steps_dir, 6), places=1)
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.stdout.close()
            holder.wait(10)


@pytest.mark.parametrize("plant", ["manifest to /dev/zero", "manifest a named pipe",
                                   "state a named pipe", "state larger than its manifest says"])
def test_in_ones_own_directory_a_commit_that_is_no_regular_file_is_passed_over(
        tmp_path, plant, apgas_caplog):
    """Even where only the user could have put it: a link, a pipe or a device is neither
    followed, waited on nor read; the commit is torn, and the loop starts afresh."""
    folder = tmp_path / "ckpt"
    apgas.run(lambda: count(folder, 6, stop=1), places=1)
    commits = sorted(folder.glob("commit-*"))
    name = "manifest.json" if plant.startswith("manifest") else "state.pickle"
    for commit in commits:
        if plant == "state larger than its manifest says":
            with open(commit / name, "ab") as f:
                f.write(b"x" * 100)
        else:
            (commit / name).unlink()
            if plant == "manifest to /dev/zero":
                (commit / name).symlink_to("/dev/zero")
            else:
                os.mkfifo(commit / name)
    said = {"manifest to /dev/zero": "is a symbolic link; it is not followed",
            "manifest a named pipe": "is a named pipe, not a regular file",
            "state a named pipe": "is a named pipe, not a regular file",
            "state larger than its manifest says": "more than the"}[plant]
    with apgas_caplog.at_level(logging.WARNING, logger="apgas.steps"):
        ran, st = apgas.run(lambda: count(folder, 6), places=1)
    assert ran == list(range(6)) and st["sum"] == 15
    assert commits and all(f"{commit / name}" in apgas_caplog.text for commit in commits)
    assert said in apgas_caplog.text, apgas_caplog.text


def test_read_trusted_refuses_what_is_not_a_small_regular_file(tmp_path):
    read_trusted = serving.read_trusted
    (tmp_path / "ok").write_bytes(b"12345")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_trusted(fd, "ok", 5, "w") == b"12345"
    finally:
        os.close(fd)
    assert read_trusted(tmp_path, "ok", 5, "w") == b"12345"
    with pytest.raises(OSError, match=rf"w: {tmp_path / 'ok'} is 5 bytes, more than the 4"):
        read_trusted(tmp_path, "ok", 4, "w")
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(UntrustedPath, match="is a symbolic link; it is not followed"):
        read_trusted(tmp_path, "zero", 1 << 20, "w")
    with pytest.raises(ValueError, match="is not a name of a file"):
        read_trusted(tmp_path, "../ok", 5, "w")


# -- 12. write_atomically's temporary name taken first ------------------------------------------

@needs_root
@pytest.mark.parametrize("squat", ["a file", "a link"])
def test_write_atomically_in_a_shared_directory_cannot_be_squatted_or_read(shared_dir, squat):
    """nobody makes the temporary name first (it was ``.NAME.<pid>.tmp``): a file it
    can read (root wrote into it, and renamed it in place), or a link (the write failed)."""
    target = shared_dir / "result"
    guessed = shared_dir / f".result.{os.getpid()}.tmp"
    as_nobody("import os, sys\n"
              "if sys.argv[2] == 'a file':\n    os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o666))\n"
              "else:\n    os.symlink('/nonexistent', sys.argv[1])", str(guessed), squat)
    write_atomically(target, b"root's secret")
    st = target.lstat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert read_sealed(target) == b"root's secret"
    assert guessed.lstat().st_uid == NOBODY  # left as it was, and empty
    assert squat == "a link" or guessed.read_bytes() == b""


def test_write_atomically_takes_another_name_when_one_is_taken(tmp_path, monkeypatch):
    from apgas._core import durable

    names = iter(["taken", "free"])
    monkeypatch.setattr(durable.secrets, "token_hex", lambda n: next(names))
    (tmp_path / ".f.taken.tmp").write_bytes(b"someone's")
    write_atomically(tmp_path / "f", b"mine")
    assert read_sealed(tmp_path / "f") == b"mine"
    assert sorted(os.listdir(tmp_path)) == [".f.taken.tmp", "f"]
    monkeypatch.setattr(durable.secrets, "token_hex", lambda n: "taken")
    with pytest.raises(FileExistsError, match=rf"cannot write {tmp_path / 'f'}: 8 random "
                                              "temporary names beside it were all taken"):
        write_atomically(tmp_path / "f", b"again")
    assert read_sealed(tmp_path / "f") == b"mine"


def test_read_sealed_never_waits_on_a_named_pipe(tmp_path):
    os.mkfifo(tmp_path / "snapshot")
    with pytest.raises(UntrustedPath, match=rf"{tmp_path / 'snapshot'} is a named pipe"):
        read_sealed(tmp_path / "snapshot")


# -- 13. a GLB checkpoint directory that is another user's link ---------------------------------

@needs_root
def test_a_glb_checkpoint_directory_another_user_linked_is_refused(shared_dir, roots_dir):
    from glb._checkpoint import SnapshotDir

    link_as_nobody(shared_dir / "glb-ckpt", roots_dir)
    with pytest.raises(UntrustedPath, match=rf"the GLB checkpoint directory: "
                                            rf"{shared_dir / 'glb-ckpt'} {LINK_OF_NOBODY}"):
        SnapshotDir(shared_dir / "glb-ckpt")
    assert list(roots_dir.iterdir()) == []


def test_the_lock_of_a_step_directory_is_never_a_pipe(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir(mode=0o700)
    os.mkfifo(folder / ".lock")
    with pytest.raises(UntrustedPath, match=rf"{folder / '.lock'} is not a regular file"):
        apgas.run(lambda: count(folder, 2), places=1)
