"""apgas.arrays: block-distributed arrays over real place processes (issue 31)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import apgas
from apgas._core import serialization as ser
from apgas.arrays import BlockArray, _blocks, dot
from apgas.arrays._layout import even

pytestmark = pytest.mark.timeout(120)


# --- helpers (module level: they pickle by reference) --------------------------------
def entries_here() -> list[tuple[int, int]]:
    return sorted(_blocks._entries) + sorted(_blocks._staging)


def no_entries_anywhere() -> bool:
    return all(apgas.at(p, entries_here) == [] for p in apgas.places())


def seen_at(p: int, a: BlockArray) -> tuple[range, tuple[int, ...], tuple]:
    """What place ``p`` sees of ``a``: its rows, its block's shape, the layout."""
    return apgas.at(p, lambda: (a.rows(), a.local().shape, a.layout))


def check_even(a: BlockArray, ids: list[int]) -> None:
    layout = a.layout
    assert [b[0] for b in layout] == ids
    sizes = [stop - start for _, start, stop in layout]
    assert sum(sizes) == a.shape[0] and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the extra rows go to the first places
    assert layout[0][1] == 0 and all(layout[i][2] == layout[i + 1][1] for i in range(len(layout) - 1))
    for p in apgas.places():
        rows, shape, seen = seen_at(p.id, a)
        assert seen == layout
        block = next(((s, e) for q, s, e in layout if q == p.id), (0, 0))
        assert rows == range(*block) or (len(rows) == 0 and block[0] == block[1])
        assert shape == (block[1] - block[0], *a.shape[1:])


# --- the layout arithmetic -----------------------------------------------------------
@given(st.integers(0, 1000), st.lists(st.integers(0, 50), min_size=1, max_size=20, unique=True))
def test_even_layouts_cover_the_rows_in_place_order(rows, ids):
    layout = even(rows, ids)
    assert [b[0] for b in layout] == ids
    sizes = [e - s for _, s, e in layout]
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)
    assert [b[1] for b in layout[1:]] == [b[2] for b in layout[:-1]]


# --- from_array, gather, local ---------------------------------------------------------
def roundtrips() -> None:
    rng = np.random.default_rng(1)
    big = rng.random((100_000,))  # 200 KiB blocks: they travel out of band
    cube = np.arange(5 * 4 * 3).reshape(5, 4, 3)
    cases = [
        (big, None),
        (np.arange(10 * 7).reshape(10, 7), None),
        ((rng.random((9, 4, 2)) + 1j * rng.random((9, 4, 2))).astype(complex), None),
        (cube.transpose(2, 1, 0), None),                  # a transposed view
        (np.arange(200.0).reshape(40, 5)[::3, 1::2], None),  # a strided view
        (np.asfortranarray(rng.random((13, 6))), None),
        (np.arange(3, dtype=np.int8), None),              # fewer rows than places
        (np.zeros((0, 4)), None),                         # no rows at all
        (np.arange(11.0), [1, 3]),                        # the home holds no rows
        (np.arange(11.0), [3, 0, 2]),                     # in the order given
    ]
    for x, places in cases:
        a = BlockArray.from_array(x, places=places)
        ids = [p.id for p in apgas.places()] if places is None else places
        assert a.shape == x.shape and a.dtype == x.dtype
        got = a.gather()
        assert got.dtype == x.dtype and np.array_equal(got, x)
        check_even(a, ids)
        gathered_elsewhere = apgas.at(2, a.gather)
        assert np.array_equal(gathered_elsewhere, x)
        a.free()
    assert no_entries_anywhere()


def test_from_array_then_gather_gives_the_input():
    apgas.run(roundtrips, places=4)


def fill_with_owner(a: BlockArray) -> None:
    block = a.local()
    block[...] = apgas.here().id * 100 + np.arange(len(block)).reshape(-1, *[1] * (block.ndim - 1))


def writes() -> None:
    for a in (BlockArray.zeros((10, 3), dtype=np.int64), BlockArray.from_array(np.ones((7, 2, 2)))):
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, fill_with_owner, a)
        got = a.gather()
        for pid, start, stop in a.layout:
            for i in range(start, stop):
                assert (got[i] == pid * 100 + i - start).all()
        assert (a.local() == got[a.rows().start:a.rows().stop]).all()  # home's view, not a copy
        a.free()
    z = BlockArray.zeros(5, places=[2])
    assert z.shape == (5,) and z.dtype == np.float64 and z.layout == ((2, 0, 5),)
    assert z.rows() == range(0) and z.local().shape == (0,)
    z.free()
    assert no_entries_anywhere()


def test_local_is_a_writable_view_of_the_block():
    apgas.run(writes, places=3)


# --- redistribute ------------------------------------------------------------------
def resizes() -> None:
    x = np.arange(23 * 3, dtype=float).reshape(23, 3)
    a = BlockArray.from_array(x, places=[0, 1])
    # a handle sent away before the moves sees the new layout afterwards
    apgas.at(3, lambda: a.rows())
    for ids in ([0, 1, 2, 3], [2, 3], [3, 2, 1], [1, 2, 3], [0], [3, 2, 1, 0], [3, 2, 1, 0]):
        a.redistribute(ids)
        assert np.array_equal(a.gather(), x)
        check_even(a, ids)
        for p in apgas.places():
            if p.id not in ids and p.id != a.home:
                assert apgas.at(p, entries_here) == []
    a.redistribute()
    check_even(a, [0, 1, 2, 3])
    a.free()
    b = BlockArray.from_array(np.arange(3), places=[1])
    b.redistribute([3, 2])
    assert np.array_equal(apgas.at(2, b.gather), np.arange(3))
    check_even(b, [3, 2])
    b.free()
    assert no_entries_anywhere()


def test_redistribute_moves_rows_and_keeps_the_content():
    apgas.run(resizes, places=4)


def random_resizes() -> None:
    all_ids = [p.id for p in apgas.places()]

    @settings(max_examples=20, deadline=None, database=None)
    @given(shape=st.lists(st.integers(0, 9), min_size=1, max_size=3),
           first=st.permutations(all_ids).flatmap(lambda ids: st.just(ids[:1 + len(ids) // 2])),
           then=st.lists(st.permutations(all_ids).flatmap(
               lambda ids: st.integers(1, len(ids)).map(lambda k: ids[:k])), min_size=1, max_size=3))
    def check(shape, first, then):
        x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
        a = BlockArray.from_array(x, places=first)
        try:
            for ids in then:
                a.redistribute(ids)
                assert np.array_equal(a.gather(), x)
                check_even(a, ids)
        finally:
            a.free()

    check()
    assert no_entries_anywhere()


def test_redistribute_property():
    apgas.run(random_resizes, places=4)


# --- halo --------------------------------------------------------------------------------
def keep(ref: apgas.GlobalRef, key: int, value: np.ndarray) -> None:
    ref.get()[key] = value


def send_halo(ref: apgas.GlobalRef, a: BlockArray) -> None:
    apgas.at(ref.home, keep, ref, apgas.here().id, a.halo(1))


def halos() -> None:
    for x in (np.arange(10.0), np.arange(10 * 3).reshape(10, 3), np.arange(3.0)):
        a = BlockArray.from_array(x)
        for width in (0, 1, 2, 5):
            padded = np.pad(x, [(width, width)] + [(0, 0)] * (x.ndim - 1))
            for pid, start, stop in a.layout:
                got = apgas.at(pid, a.halo, width)
                assert got.shape == (stop - start + 2 * width, *x.shape[1:])
                assert np.array_equal(got, padded[start:stop + 2 * width]), (pid, width)
        # the stencil pattern: every place takes its halo in one finish
        got = {}
        ref = apgas.GlobalRef(got)
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, send_halo, ref, a)
        ref.free()
        assert set(got) == {p.id for p in apgas.places()}
        a.free()


def test_halo_matches_numpy_slicing():
    apgas.run(halos, places=4)


def halo_view_at(a: BlockArray, width: int) -> tuple[np.ndarray, bool]:
    """The uncopied halo, and whether its middle rows are the block (taken after it)."""
    h = a.halo(width, copy=False)
    block = a.local()
    return h.copy(), bool(np.shares_memory(h, block) and h[width:width + len(block)].base is block.base)


def double_at(a: BlockArray) -> None:
    a.local()[...] *= 2


def halo_views() -> None:
    for x in (np.arange(10.0), np.arange(10 * 3).reshape(10, 3), np.arange(3.0)):
        a = BlockArray.from_array(x)
        for width in (0, 1, 2, 5, 1):
            for _ in range(2):  # made once per width, then reused; the block doubles between calls
                padded = np.pad(x, [(width, width)] + [(0, 0)] * (x.ndim - 1))
                for pid, start, stop in a.layout:
                    got, shared = apgas.at(pid, halo_view_at, a, width)
                    assert got.shape == (stop - start + 2 * width, *x.shape[1:])
                    assert np.array_equal(got, padded[start:stop + 2 * width]), (pid, width)
                    assert shared or stop == start
                with apgas.finish():
                    for p in apgas.places():
                        apgas.async_at(p, double_at, a)
                x = x * 2
        assert np.array_equal(a.gather(), x)
        a.redistribute([0, 2])  # a new block: the buffer is made anew
        got, _ = apgas.at(2, halo_view_at, a, 1)
        assert np.array_equal(got, np.pad(x, [(1, 1)] + [(0, 0)] * (x.ndim - 1))[a.layout[1][1]:
                                                                                   a.layout[1][2] + 2])
        a.free()


def test_halo_without_copy_fetches_only_the_edges():
    apgas.run(halo_views, places=4)


# --- reductions -----------------------------------------------------------------------
def reductions() -> None:
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((1001, 3)), rng.standard_normal((1001, 3))
    a, b = BlockArray.from_array(x), BlockArray.from_array(y)
    s, d = a.sum(), dot(a, b)
    assert np.isclose(s, x.sum(), rtol=1e-12) and np.isclose(d, np.dot(x.ravel(), y.ravel()), rtol=1e-12)
    assert all(a.sum() == s and dot(a, b) == d for _ in range(3))
    assert apgas.at(3, a.sum) == s and apgas.at(1, lambda: dot(a, b)) == d
    for ids in ([1, 2], [0, 1, 2, 3]):
        a.redistribute(ids)
        b.redistribute(ids)
    assert a.sum() == s and dot(a, b) == d  # back on the same places: the same bits
    ints = BlockArray.from_array(np.arange(1, 101, dtype=np.int64))
    assert ints.sum() == 5050 and dot(ints, ints) == sum(i * i for i in range(1, 101))
    zc = (rng.standard_normal(50) + 1j * rng.standard_normal(50))
    c = BlockArray.from_array(zc, places=[2, 0])
    assert np.isclose(dot(c, c), np.dot(zc, zc), rtol=1e-12) and np.isclose(c.sum(), zc.sum(), rtol=1e-12)
    empty = BlockArray.zeros((0, 2))
    assert empty.sum() == 0.0 and dot(empty, empty) == 0.0
    for v in (a, b, ints, c, empty):
        v.free()
    assert no_entries_anywhere()


def test_sum_and_dot_match_numpy_and_are_deterministic():
    apgas.run(reductions, places=4)


# --- errors -------------------------------------------------------------------------------
def errors() -> None:
    with pytest.raises(TypeError, match="numpy array.*list"):
        BlockArray.from_array([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="object"):
        BlockArray.from_array(np.array([1, "a"], dtype=object))
    with pytest.raises(TypeError, match="object"):
        BlockArray.zeros(3, dtype=object)
    with pytest.raises(ValueError, match="scalar"):
        BlockArray.from_array(np.array(1.0))
    with pytest.raises(ValueError, match="empty"):
        BlockArray.from_array(np.ones(3), places=[])
    with pytest.raises(ValueError, match="twice"):
        BlockArray.from_array(np.ones(3), places=[1, 1])
    with pytest.raises(apgas.DeadPlaceError, match="place 7"):
        BlockArray.from_array(np.ones(3), places=[0, 7])
    with pytest.raises(ValueError, match="non-negative"):
        BlockArray.zeros((3, -1))
    a, b = BlockArray.from_array(np.ones(4)), BlockArray.from_array(np.ones(5))
    with pytest.raises(ValueError, match=r"shapes: \(4,\) and \(5,\)"):
        dot(a, b)
    with pytest.raises(TypeError, match="ndarray"):
        dot(a, np.ones(4))  # type: ignore[arg-type]
    c = BlockArray.from_array(np.ones(4), places=[1, 0])
    with pytest.raises(ValueError, match="laid out differently"):
        dot(a, c)
    with pytest.raises(ValueError, match="empty"):
        a.redistribute([])
    with pytest.raises(ValueError, match="width"):
        a.halo(-1)
    d = BlockArray.from_array(np.ones(4), places=[1])
    with pytest.raises(ValueError, match="holds no block"):
        d.halo(1)
    for v in (a, b, c, d):
        v.free()
    with pytest.raises(ValueError, match="freed"):
        a.gather()
    a.free()  # twice: nothing
    assert no_entries_anywhere()


def test_bad_input_gives_clear_errors():
    apgas.run(errors, places=2)


def test_a_contiguous_slice_travels_uncopied():
    """What ``push`` and ``from_array`` send: the slice's own memory is the message's frame."""
    x = np.arange(1000 * 100, dtype=float).reshape(1000, 100)
    frames = ser.dumps((entries_here, (x[10:500],), {}))
    assert len(frames) == 2 and np.shares_memory(np.frombuffer(frames[1], dtype=float), x)


def test_apgas_imports_without_numpy():
    code = ("import sys; sys.modules['numpy'] = None; import apgas; "
            "assert 'apgas.arrays' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
