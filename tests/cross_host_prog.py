"""Programs the cross-host tests (tests/test_cross_host.py) run on the virtual cluster.

``MODE=glb``: a malleable GLB count over every host while the program sends
itself the orders in ``ORDERS`` (``;``-separated); the last root of the tree is
held until they are done, so the count ends after them. ``MODE=fail``: long
tasks at every place; the test kills a host or cuts its link; the program
reports what the finish raised and when, then works on with the places left.
Each prints one ``RESULT <json>`` line; ``fail`` prints ``RUNNING`` first, once
the long task runs at every place (a fault after it hits them, however slow the machine).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from orders import wait_malleable  # noqa: E402

import apgas  # noqa: E402
from apgas.order import send_order  # noqa: E402


def glb() -> dict:
    with tempfile.TemporaryDirectory() as scratch:  # the gate, gone with the run
        return _glb(os.path.join(scratch, "orders-done"))


def _glb(gate: str) -> dict:
    from glb_bags import Count, TreeBag, tree_nodes

    from glb import GLB, GLBConfig

    roots = [(s, 20) for s in (4, 5, 6, 10)] + [(13, 20, gate)]
    replies: list[list[str]] = []
    glb_ = GLB(GLBConfig(n=32, malleable=True))

    def orders() -> None:
        try:
            host, port = os.environ["APGAS_MALLEABLE_LISTEN"].rsplit(":", 1)
            address = (host, int(port))
            wait_malleable(address)  # GLB registers its handler when the count starts
            for line in os.environ["ORDERS"].split(";"):
                replies.append(send_order(address, line, timeout=60))
        finally:
            open(gate, "w").close()

    sender = threading.Thread(target=orders)
    sender.start()
    total = glb_.compute_dynamic(TreeBag(roots, spin=20), Count()).value
    sender.join()
    return {"total": total, "expected": tree_nodes(roots), "replies": replies,
            "worked": sorted({s.place for s in glb_.stats() if s.units}),
            "hosts": [p.host for p in apgas.places()]}


def long_task_runs() -> bool:
    # in the place's environment: a global would travel with the function, pickled by value
    return os.environ.get("LONG_TASK_RUNS") == "1"


def until_a_place_dies(count: int) -> None:
    """A long task that ends once this place knows of a place fewer (of a death)."""
    os.environ["LONG_TASK_RUNS"] = "1"
    deadline = time.monotonic() + 120
    while len(apgas.places()) >= count and time.monotonic() < deadline:
        time.sleep(0.05)


def fail() -> dict:
    places = apgas.places()
    ids = {p.id: p.host for p in places}
    caught: list[dict] = []
    try:
        with apgas.finish():
            for p in places[1:]:
                apgas.async_at(p, until_a_place_dies, len(places))
            while not all(apgas.at(p, long_task_runs) for p in places[1:]):
                time.sleep(0.01)
            print("RUNNING", flush=True)
    except apgas.MultipleException as e:
        caught = [{"place": x.place_id, "error": str(x)} for x in e.exceptions
                  if isinstance(x, apgas.DeadPlaceError)]
    detected = time.monotonic()
    survivors = [p.id for p in apgas.places()]
    with apgas.finish():  # the others go on
        for p in apgas.places():
            apgas.async_at(p, time.sleep, 0.01)
    return {"caught": caught, "detected": detected, "survivors": survivors, "hosts": ids}


if __name__ == "__main__":
    print("RESULT " + json.dumps(apgas.run({"glb": glb, "fail": fail}[os.environ["MODE"]])),
          flush=True)
