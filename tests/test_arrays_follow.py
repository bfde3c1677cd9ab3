"""BlockArray(follow=True): the runtime re-spreads the array on grow and shrink orders."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
from orders import order

import apgas
from apgas.arrays import BlockArray, _blocks
from apgas.arrays._layout import even

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_scheduler")]


def live() -> list[int]:
    return [p.id for p in apgas.places()]


class Recorder(apgas.MalleableHandler):
    """Releases the newest places; records each call with the followed array's layout."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.array: BlockArray | None = None

    def _layout(self):
        return None if self.array is None else self.array.layout

    def pre_grow(self, n):
        self.calls.append(("pre_grow", n, self._layout()))

    def post_grow(self, n, continued, added):
        self.calls.append(("post_grow", n, self._layout()))

    def pre_shrink(self, n):
        self.calls.append(("pre_shrink", n, self._layout()))
        return apgas.places()[-n:]

    def post_shrink(self, n, removed):
        self.calls.append(("post_shrink", n, self._layout()))


def test_a_followed_array_follows_grow_and_shrink_orders(malleable_address):
    x = np.arange(23 * 3, dtype=np.float64).reshape(23, 3)

    def main():
        handler = Recorder()
        apgas.define_malleable_handler(handler)
        a = BlockArray.from_array(x, follow=True)
        z = BlockArray.zeros((7,), dtype=np.int64, follow=True)
        handler.array = a
        layouts = [a.layout]
        for line in ("grow 2 nodeA nodeB", "shrink 1", "shrink 2"):
            reply = order(malleable_address, line)
            assert not reply[0].startswith("error"), reply
            assert a.layout == even(23, live()), (line, a.layout)
            assert z.layout == even(7, live())
            np.testing.assert_array_equal(a.gather(), x)
            np.testing.assert_array_equal(z.gather(), np.zeros(7, np.int64))
            layouts.append(a.layout)
        handler.array = None
        a.free()
        z.free()
        order(malleable_address, "grow 1 nodeC")  # freed arrays are no longer followed
        assert not _blocks._entries
        return layouts, handler.calls

    layouts, calls = apgas.run(main, places=2)
    assert layouts == [even(23, [0, 1]), even(23, [0, 1, 2, 3]), even(23, [0, 1, 2]),
                       even(23, [0])]
    # the arrays are re-spread after the places joined and before post_grow, and
    # after pre_shrink chose the places and before they leave (so before post_shrink)
    assert calls == [
        ("pre_grow", 2, layouts[0]), ("post_grow", 2, layouts[1]),
        ("pre_shrink", 1, layouts[1]), ("post_shrink", 1, layouts[2]),
        ("pre_shrink", 2, layouts[2]), ("post_shrink", 2, layouts[3]),
        ("pre_grow", 1, None), ("post_grow", 1, None),
    ]


def test_follow_needs_place_0_and_no_places():
    def main():
        with pytest.raises(ValueError, match="do not pass places"):
            BlockArray.from_array(np.arange(4.0), places=[0, 1], follow=True)

        def elsewhere():
            with pytest.raises(apgas.ApgasError, match="home to be place 0"):
                BlockArray.from_array(np.arange(4.0), follow=True)
            with pytest.raises(apgas.ApgasError, match="home to be place 0"):
                BlockArray.zeros(4, follow=True)
            return True

        return apgas.at(1, elsewhere)

    assert apgas.run(main, places=2)


def test_an_array_that_does_not_follow_keeps_its_layout(malleable_address):
    x = np.arange(10.0)

    def main():
        apgas.define_malleable_handler(Recorder())
        kept = BlockArray.from_array(x, places=[0, 1])
        stranded = BlockArray.from_array(x)  # rows on places 0, 1, 2
        assert order(malleable_address, "grow 1 nodeA")[0].startswith("ok")
        assert kept.layout == even(10, [0, 1])
        np.testing.assert_array_equal(kept.gather(), x)
        assert order(malleable_address, "shrink 1") == ["nodeA"]
        assert kept.layout == even(10, [0, 1])
        np.testing.assert_array_equal(kept.gather(), x)
        reply = order(malleable_address, "shrink 1")  # place 2 leaves
        assert not reply[0].startswith("error"), reply
        assert live() == [0, 1]
        # place 2 held rows of the array that does not follow: they left with it
        assert stranded.layout == even(10, [0, 1, 2])
        with pytest.raises(apgas.MultipleException) as caught:
            stranded.gather()
        assert any(isinstance(e, apgas.DeadPlaceError) and "has left" in str(e)
                   for e in caught.value.exceptions), caught.value.exceptions
        stranded.free()  # drops what is left, at the live places
        kept.free()
        assert not _blocks._entries

    apgas.run(main, places=3)


def test_a_followed_array_that_lost_rows_with_a_dead_place_says_so(malleable_address):
    class Heard(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.heard = threading.Event()

        def on_place_lost(self, places):
            self.heard.set()

    def main():
        handler = Heard()
        apgas.define_malleable_handler(handler)
        a = BlockArray.from_array(np.arange(9.0), follow=True)
        os.kill(apgas.at(2, os.getpid), signal.SIGKILL)
        assert handler.heard.wait(30)  # resize listeners hear of it before the handler
        with pytest.raises(apgas.ApgasError, match=r"lost rows 6:9 with place 2"):
            a.gather()
        with pytest.raises(apgas.ApgasError, match="resilient=True and listed in the arrays of apgas.steps"):
            a.layout  # noqa: B018
        reply = order(malleable_address, "grow 1 nodeA")  # a broken array is left alone
        assert reply[0].startswith("ok"), reply
        a.free()
        with pytest.raises(ValueError, match="freed"):
            a.layout  # noqa: B018
        assert not _blocks._entries
        return live()

    assert apgas.run(main, places=3) == [0, 1, 3]
