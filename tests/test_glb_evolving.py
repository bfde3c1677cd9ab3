"""GLB's evolving mode against a scripted scheduler: busy places ask for more,
idle ones are released, and the result stays exact."""

from __future__ import annotations

import time

import pytest
from glb_bags import ChainBag, Count, TreeBag, tree_nodes

import apgas
from glb import GLB, GLBConfig

pytestmark = pytest.mark.timeout(120)

TREE = [(4, 28), (5, 28), (6, 28), (7, 28)]  # about 2 s on one place
FAST = dict(evolving=True, evolving_interval=0.1, evolving_window=3, evolving_backoff=60.0)


def test_busy_places_ask_for_a_place_and_the_count_stays_exact(fake_scheduler):
    asked: list[str] = []

    def script(message, fake):
        if not message.startswith("Evolving;Request"):
            return None
        asked.append(message)
        if len(asked) == 1:
            fake.later("grow 1 nodeA")
            return "ok 1"
        return "error job 1 asks for 1 more node(s) but holds 2 and may have at most 2"

    fake = fake_scheduler(script)
    expected = tree_nodes(TREE)

    def main():
        glb = GLB(GLBConfig(n=255, **FAST))
        total = glb.compute_dynamic(TreeBag(TREE), Count()).value
        worked = {s.place for s in glb.stats() if s.units > 0}
        return total, glb.evolver.requests, worked

    total, requests, worked = apgas.run(main, places=1)
    assert total == expected
    assert asked[0] == "Evolving;Request;1"
    assert requests == len(asked) <= 2  # after the refusal, the backoff keeps it from asking
    fake.join()
    assert fake.replies == [["ok grow 1 places 1"]]
    assert 1 in worked  # the new place took part


def test_idle_places_are_released_and_the_count_stays_exact(fake_scheduler, monkeypatch):
    monkeypatch.setenv("APGAS_HOSTS", "n0,n1,n2")
    fake = fake_scheduler(lambda m, f: None)
    chain = ChainBag(20_000, spin=300)  # cannot be split: one place works, two idle

    def main():
        glb = GLB(GLBConfig(n=50, **FAST))
        total = glb.compute_dynamic(chain, Count()).value
        return total, glb.evolver.releases, [p.id for p in apgas.places()]

    total, releases, left = apgas.run(main)
    assert total == 20_000
    assert releases == 2 and left == [0]
    assert sorted(fake.messages("Evolving;Release")) == ["Evolving;Release;n1",
                                                          "Evolving;Release;n2"]


def test_evolving_mode_needs_a_scheduler(malleable_address, monkeypatch):
    monkeypatch.delenv("APGAS_SCHEDULER", raising=False)

    def main():
        glb = GLB(GLBConfig(evolving=True))
        with pytest.raises(apgas.ApgasError, match="needs a scheduler"):
            glb.compute_dynamic(TreeBag([(1, 10)]), Count())
        return GLB().compute_dynamic(TreeBag([(1, 10)]), Count()).value  # and it goes on

    assert apgas.run(main, places=2) == tree_nodes([(1, 10)])


@pytest.mark.parametrize("options, match", [
    (dict(evolving_low=0.9, evolving_high=0.5), "evolving_low < evolving_high"),
    (dict(evolving_window=0), "evolving_window must be an integer >= 1"),
    (dict(evolving_interval=0), "evolving_interval must be a positive number"),
])
def test_bad_evolving_options(options, match):
    with pytest.raises(ValueError, match=match):
        GLBConfig(**options)


# -- the watcher alone (no run): mpiexec ranks stay, and a failing step does not kill it ------

def test_low_load_releases_only_places_that_can_leave(monkeypatch):
    from glb import _evolving

    leavable = {2}  # 1 is an mpiexec rank
    released = []
    monkeypatch.setattr(_evolving, "removable", lambda place_id: place_id in leavable)
    monkeypatch.setattr(apgas, "release_places", lambda places: released.append(places))
    evolver = _evolving.Evolver(0, GLBConfig(**FAST))
    monkeypatch.setattr(evolver, "_loads", lambda: {0: 0.0, 1: 0.0, 2: 0.1})
    for _ in range(FAST["evolving_window"]):
        evolver.step()
    assert released == [[2]]  # not 1, though it is less loaded

    leavable.clear()
    for _ in range(FAST["evolving_window"] * 2):
        evolver.step()
    assert released == [[2]] and evolver.releases == 1  # nothing can leave: nothing is tried


@pytest.mark.parametrize("error", [ValueError("place 1 is an mpiexec rank"),
                                   apgas.ApgasError("the scheduler at x:1 closed the connection"),
                                   RuntimeError("a bug")])
def test_a_failing_step_is_logged_and_watching_goes_on(monkeypatch, error):
    import logging

    from glb import _evolving

    steps = []
    logged: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]

    def step():
        steps.append(1)
        raise error

    evolver = _evolving.Evolver(0, GLBConfig(**dict(FAST, evolving_interval=0.01)))
    monkeypatch.setattr(evolver, "step", step)
    logger = logging.getLogger("glb.evolving")
    logger.addHandler(handler)
    evolver.start()
    try:
        deadline = time.monotonic() + 10
        while len(steps) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        evolver.stop()
        logger.removeHandler(handler)
    assert len(steps) >= 3  # the thread outlived the failures
    assert any(str(error) in message for message in logged)
