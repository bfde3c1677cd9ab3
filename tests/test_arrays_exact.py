"""apgas.arrays.exact_sum: exact sums that do not depend on the layout (issue 53, item 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import apgas
from apgas.arrays import BlockArray, exact_sum
from apgas.arrays._exact import column_sums, rounded

pytestmark = pytest.mark.timeout(120)


def vectors() -> np.ndarray:
    """Points whose sum, added in another order, rounds differently: magnitudes from
    1e-12 to 1e12, with large terms that cancel."""
    rng = np.random.default_rng(53)
    x = rng.standard_normal((301, 4)) * 10.0 ** rng.uniform(-12, 12, (301, 4))
    x[::7] *= -1
    x[100, 2], x[250, 2] = 1e16, -1e16
    return x


def sums_on(x: np.ndarray, counts: list[int]) -> list:
    out = []
    for k in counts:
        a = BlockArray.from_array(x, places=list(range(k)))
        out.append((exact_sum(a, axis=0), exact_sum(a), a.sum()))
        a.free()
    return out


def test_a_vector_sum_is_the_same_on_1_2_and_3_places_and_is_fsum():
    x = vectors()
    results = apgas.run(lambda: sums_on(x, [1, 2, 3]), places=3)
    fsum = np.array([math.fsum(x[:, c]) for c in range(x.shape[1])])
    for vector, scalar, _ in results:
        assert vector.shape == (4,) and vector.dtype == np.float64
        assert vector.tobytes() == fsum.tobytes()  # bit for bit
        assert scalar == math.fsum(x.ravel())
    # the per-block sum is not: its last bits follow the layout
    assert len({r[2] for r in results}) > 1


def other_kinds() -> list:
    out = []
    for x in (np.arange(-20, 40, dtype=np.int64).reshape(20, 3) * (2**53),
              np.linspace(-1, 3, 24, dtype=np.float32).reshape(6, 2, 2),
              np.array([[1.0, np.inf, np.inf], [2.0, 5.0, -np.inf], [3.0, np.inf, 0.0]]),
              np.zeros((0, 3))):
        a = BlockArray.from_array(x)
        out.append((exact_sum(a, axis=0), exact_sum(a)))
        a.free()
    a = BlockArray.from_array(np.ones(3, complex))
    with pytest.raises(TypeError, match="real numbers"):
        exact_sum(a)
    with pytest.raises(ValueError, match="axis=1"):
        exact_sum(a, axis=1)
    a.free()
    return out


def test_exact_sum_of_ints_float32_non_finite_and_empty():
    (ints, total), (f32, f32_total), (special, _), (empty, zero) = apgas.run(other_kinds, places=3)
    x = np.arange(-20, 40, dtype=np.int64).reshape(20, 3)
    assert ints.dtype == np.int64 and list(ints) == [int(v) * 2**53 for v in x.sum(axis=0)]
    assert total == int(x.sum()) * 2**53
    y = np.linspace(-1, 3, 24, dtype=np.float32).reshape(6, 2, 2).astype(np.float64)
    assert f32.shape == (2, 2) and f32[1, 1] == math.fsum(y[:, 1, 1]) and f32_total == math.fsum(y.ravel())
    assert special[0] == 6.0 and special[1] == np.inf and np.isnan(special[2])
    assert empty.tolist() == [0.0, 0.0, 0.0] and zero == 0.0


def test_column_sums_are_exact_for_the_extremes():
    x = np.array([[5e-324, 1.7976931348623157e308], [5e-324, -1.7976931348623157e308],
                  [-1e-320, 1.0]])
    parts = [column_sums(x[:1]), column_sums(x[1:])]
    assert rounded(parts, True) == [math.fsum(x[:, 0]), 1.0]
