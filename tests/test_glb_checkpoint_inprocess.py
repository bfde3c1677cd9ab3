"""GLB checkpoints and GLB's small parts, in this process: a checkpointed run keeps
the two newest snapshots, the last one final; a run resumes from the older when
the newest is damaged and still gets the exact result; a directory of another
problem is refused; RangeBag, the contract's checks, the configuration and the
statistics keep their documented rules."""

from __future__ import annotations

import pickle
import time

import pytest
from glb_bags import Total

import apgas
from glb import GLB, BagContractError, GLBConfig
from glb._checkpoint import Snapshot, SnapshotDir, fingerprint
from glb._contract import submit
from glb._stats import SAMPLES, PlaceStats
from glb.bags import RangeBag

pytestmark = pytest.mark.timeout(60)

N = 120


class SlowSquares(RangeBag):
    """The squares of a range, slowly enough that snapshots fall in the middle."""

    def work(self, lo: int, hi: int) -> Total:
        time.sleep(0.004 * (hi - lo))
        return Total(sum(i * i for i in range(lo, hi)), hi - lo)


SQUARES = sum(i * i for i in range(N))


def run_checkpointed(directory, bag: RangeBag) -> tuple[int, int, object]:
    def main():
        glb = GLB(GLBConfig(n=2, workers=1, checkpoint=directory, checkpoint_interval=0.03))
        total = glb.compute_dynamic(bag, Total())
        return total.value, total.count, glb.checkpoints
    return apgas.run(main, places=1, threads=2)


def read(path) -> Snapshot:
    from apgas.lowlevel import read_sealed
    return pickle.loads(read_sealed(path))


def test_checkpointed_run_resumes_exactly_from_the_older_snapshot(tmp_path):
    """Mid-run snapshots hold work left; only the two newest stay, the last final. With
    the newest damaged, a new run resumes from the one before and counts every index
    exactly once; a bag of another problem is refused, naming both."""
    directory = tmp_path / "ckpt"
    total, count, stats = run_checkpointed(directory, SlowSquares(0, N))
    assert (total, count) == (SQUARES, N)
    assert stats.written >= 2 and stats.resumed_from is None and stats.pause_s >= 0
    files = sorted(directory.glob("glb-*.snapshot"))
    assert len(files) == 2
    older, newest = read(files[0]), read(files[1])
    assert newest.final and not newest.pieces and newest.seq == older.seq + 1
    assert not older.final
    assert older.fingerprint == newest.fingerprint == fingerprint((SlowSquares(0, N), Total()))

    files[1].write_bytes(files[1].read_bytes()[:-5])  # torn
    total, count, stats = run_checkpointed(directory, SlowSquares(0, N))
    assert (total, count) == (SQUARES, N)
    assert stats.resumed_from == older.seq

    with pytest.raises(apgas.ApgasError, match="holds a snapshot of another problem"):
        run_checkpointed(directory, SlowSquares(0, N + 1))


def test_snapshot_dir_keeps_two_and_refuses_foreign_files(tmp_path):
    """A directory drops the leftovers of a cut-short write, numbers snapshots on,
    keeps the two newest, and refuses a sealed file that is no snapshot."""
    from apgas.lowlevel import write_atomically

    (tmp_path / ".glb-00000004.snapshot.1.tmp").write_bytes(b"half")
    snaps = SnapshotDir(tmp_path)
    assert list(tmp_path.iterdir()) == [] and snaps.next_seq() == 1
    assert snaps.load("f", "p") is None
    for seq in (1, 2, 3):
        assert snaps.write(Snapshot("f", "p", seq, 0.0, [], b"")) > 0
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["glb-00000002.snapshot",
                                                           "glb-00000003.snapshot"]
    assert snaps.next_seq() == 4 and snaps.load("f", "p").seq == 3
    write_atomically(tmp_path / "glb-00000009.snapshot", pickle.dumps({"not": "a snapshot"}))
    with pytest.raises(apgas.ApgasError, match="is not a GLB snapshot this version reads"):
        snaps.load("f", "p")


# -- RangeBag and the contract -------------------------------------------------------------------


class Plain(RangeBag):
    pass


class Wrong(RangeBag):
    def work(self, lo: int, hi: int):
        return Total(lo, 1) if lo % 2 == 0 else lo


def test_range_bag_rules():
    """Ranges must be integer pairs; ``work`` must be defined; single indices split by
    halves of the list; a ``work`` that returns no result is named."""
    with pytest.raises(ValueError, match=r"a range is a pair of integers \(lo, hi\), got \(1, 2.0\)"):
        RangeBag(ranges=[(1, 2.0)])
    with pytest.raises(NotImplementedError, match="Plain must define work"):
        Plain(0, 3).process(1)
    bag = Plain(ranges=[(0, 1), (5, 6), (9, 10), (12, 13)])
    piece = bag.split(False)
    assert (bag.ranges, piece.ranges, bag.remaining(), piece.remaining()) == (
        [(0, 1), (5, 6)], [(9, 10), (12, 13)], 2, 2)
    assert repr(piece) == "Plain(ranges=[(9, 10), (12, 13)], partial=None)"
    wrong = Wrong(ranges=[(1, 2), (0, 1)])  # a Total for index 0, then an int for index 1
    with pytest.raises(BagContractError, match="Wrong.work.lo, hi. returned int 1"):
        wrong.process(2)


class Same(RangeBag):
    def work(self, lo: int, hi: int) -> Total:
        return Broken()


class Broken:
    def fold(self, other) -> None:
        raise TypeError("broken fold")


def test_a_result_type_that_breaks_its_own_fold_is_not_blamed_on_the_bag():
    """A fold that fails between two results of the same type is the result's error,
    raised as it is."""
    with pytest.raises(TypeError, match="broken fold"):
        Same(ranges=[(0, 1), (1, 2)]).process(2)


class HandsOverAnInt:
    def submit(self, result: Total) -> None:
        result.fold(7)


def test_submit_of_a_non_result_is_a_contract_error():
    """A ``submit`` that folds something other than a result into the result is a
    broken contract naming the bag and what it folded."""
    with pytest.raises(BagContractError, match=r"HandsOverAnInt.submit\(result\) folded int 7 into the Total"):
        submit(HandsOverAnInt(), Total())


# -- configuration and statistics ----------------------------------------------------------------


@pytest.mark.parametrize("checkpoint", ["", 3])
def test_config_refuses_a_checkpoint_that_is_no_path(checkpoint):
    """``checkpoint`` must be a non-empty path, and the error shows what was given."""
    with pytest.raises(ValueError, match=f"GLBConfig.checkpoint must be a directory path, got {checkpoint!r}"):
        GLBConfig(checkpoint=checkpoint)


def test_config_checkpoint_path_is_kept_as_text(tmp_path):
    """A path object is kept as its text; a checkpointing run keeps copies and backs up
    every checkpoint interval."""
    config = GLBConfig(checkpoint=tmp_path, checkpoint_interval=7.0)
    assert config.checkpoint == str(tmp_path)
    assert config.keeps_copies and config.effective_backup_interval == 7.0


def test_latency_samples_stay_bounded_and_uniform():
    """Beyond SAMPLES values, a sample keeps its size and takes in later values."""
    stats, samples = PlaceStats(), []
    for seen in range(1, 3 * SAMPLES + 1):
        stats.note(samples, float(seen), seen)
    assert len(samples) == SAMPLES
    assert any(v > SAMPLES for v in samples)
    assert len(set(samples)) == SAMPLES
