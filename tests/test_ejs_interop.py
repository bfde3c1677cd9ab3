"""A GLB job under a scheduler that behaves like the ElasticJobScheduler on the wire
(``tests/ejs_like.py``): grow, shrink and an evolving request, and nothing the job
sends ends EJS's receiver."""

from __future__ import annotations

import threading

import pytest
from ejs_like import EjsLike, point_job_at
from glb_bags import Count, TreeBag, tree_nodes
from orders import free_port

import apgas
from glb import GLB, GLBConfig

pytestmark = pytest.mark.timeout(120)

TREE = [(4, 24), (5, 24)]
NODES = {"n1": "127.0.0.1", "n2": "127.0.0.1", "n3": "127.0.0.1"}


@pytest.fixture
def ejs_job(monkeypatch):
    """An EJS-like scheduler and a job environment as ``python -m apgas ejs-env`` gives
    it, except that the job listens on the wildcard address (EJS must still see 127.0.0.1)."""
    port = free_port()
    scheduler = EjsLike(NODES, "n1", port, cooldown=1.0, shrink_timeout=20.0)
    monkeypatch.setenv("APGAS_LOCAL_HOSTS", "*")
    point_job_at(scheduler, monkeypatch, "0.0.0.0")
    yield scheduler
    scheduler.close()


def test_glb_job_grows_shrinks_and_gets_its_request_from_an_ejs_like_scheduler(ejs_job, tmp_path):
    gate = str(tmp_path / "gate")
    roots = [(3, 22, gate)] + TREE  # held until the scheduler's part is done
    seen: dict[str, object] = {}

    def drive() -> None:
        try:
            assert ejs_job.ready.wait(30), ejs_job.lines
            ejs_job.cooldown = 60.0  # EJS's: no grant before the shrink, however slow this is
            ejs_job.grow(["n2"])
            ejs_job.wait_for("postGrowTimeGLB;1")
            ejs_job.wait_for("growTimeAPGAS;1")
            seen["shrink"] = ejs_job.shrink(1)
            ejs_job.wait_for("shrinkTimeAPGAS;1")
            ejs_job.cooldown = 1.0  # then the busy place's request is granted a second later
            ejs_job.wait_for("Evolving;Request;1")  # the busy place asks; never answered
            seen["granted"] = ejs_job.wait_for("growTimeAPGAS;1", count=2, timeout=30)
        except BaseException as e:
            seen["error"] = e
        finally:
            open(gate, "w").close()

    driver = threading.Thread(target=drive)

    def main():
        driver.start()
        glb = GLB(GLBConfig(n=100, evolving=True, evolving_interval=0.1, evolving_window=3,
                            evolving_low=0.0, evolving_backoff=60.0))
        total = glb.compute_dynamic(TreeBag(roots), Count()).value
        request = glb.evolver.request
        return total, [p.host for p in apgas.places()], request

    total, hosts, request = apgas.run(main, places=1)
    driver.join(30)
    assert "error" not in seen, seen.get("error")
    assert total == tree_nodes(roots)
    assert seen["shrink"] == ["n2"]
    assert len(ejs_job.granted) == 1 and hosts[1:] == ejs_job.granted  # the node n2 freed
    assert request is None or request.state == "granted"  # never refused for want of an answer
    assert ejs_job.dead is None and ejs_job.unknown == [] and ejs_job.ignored == []
    kinds = {line.split(";")[0] for line in ejs_job.lines}
    assert {"preGrowTimeGLB", "postGrowTimeGLB", "preShrinkTimeGLB", "postShrinkTimeGLB",
            "growTimeAPGAS", "shrinkTimeAPGAS"} <= kinds
    assert all(line.endswith(":127.0.0.1") for line in ejs_job.lines), ejs_job.lines
    assert not any("NotMalleable" in line for line in ejs_job.lines)


def test_an_unanswered_request_holds_back_no_other_message(ejs_job):
    def main():
        class Keep(apgas.MalleableHandler):
            def pre_shrink(self, n, chosen=None):
                return chosen or apgas.places()[-n:]

        apgas.define_malleable_handler(Keep())
        request = apgas.request_grow(1)
        ejs_job.wait_for("Evolving;Request;1")
        ejs_job.grow(["n2"])  # EJS's grant; the request was never answered
        assert request.result(timeout=30)[0].host == "n2"
        with pytest.raises(apgas.ApgasError, match="answers no question"):
            apgas.check_status(1, 3)
        return request.state

    assert apgas.run(main, places=1) == "granted"
    assert ejs_job.dead is None and ejs_job.unknown == []
    assert [line.split(";")[0] for line in ejs_job.lines[:3]] == \
        ["APGAS-Ready:127.0.0.1", "readyTimeAPGAS", "Evolving"]

