"""Termination detection under random delays that reorder messages between pairs."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import fast_first
from test_core import spawn_tree, total_count, tree_size

import apgas
from apgas._core.transport import Transport


def test_chaos_hook_reorders_across_pairs_but_not_within_a_pair():
    got: list[tuple[int, int]] = []
    done = threading.Event()

    def handler(kind, src, a, b, body, buffers):
        got.append((a, b))
        if len(got) == 400:
            done.set()

    secret = b"k" * 32
    receivers = [Transport(i, secret, "127.0.0.1", handler) for i in (1, 2)]
    sender = Transport(0, secret, "127.0.0.1", handler, chaos=(3, 0.02))
    try:
        for t in (*receivers, sender):
            t.start()
        for r in receivers:
            sender.connect(r.place_id, r.endpoint)
        for seq in range(200):
            for r in receivers:
                sender.send(r.place_id, 1, r.place_id, seq)
        assert done.wait(10)
    finally:
        for t in (sender, *receivers):
            t.close()
    for dst in (1, 2):
        assert [b for a, b in got if a == dst] == list(range(200))  # FIFO within a pair
    assert got != [(dst, seq) for seq in range(200) for dst in (1, 2)]  # pairs interleave differently


def chaos_run(seed: int) -> tuple[int, int, float]:
    """A computation whose finish may end only after every one of its tasks."""
    def main():
        with apgas.finish():
            for p in apgas.places():
                apgas.async_at(p, spawn_tree, 4, 2)
        first = total_count()  # would be short if the finish had ended early
        start = time.monotonic()
        with apgas.finish():
            apgas.async_at(apgas.place(2), spawn_tree, 5, 2)
        return first, total_count(), time.monotonic() - start

    return apgas.run(main, places=3, threads=2, chaos=f"{seed}:3")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", fast_first(range(50), 10))
def test_termination_under_reordering(seed):
    first, second, _ = chaos_run(seed)
    assert first == 3 * tree_size(4, 2)
    assert second == tree_size(5, 2)


def test_bad_chaos_spec_is_rejected():
    with pytest.raises(apgas.ConfigError, match="seed:max_delay_ms"):
        apgas.run(lambda: None, chaos="fast")
