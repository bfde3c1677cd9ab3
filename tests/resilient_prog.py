"""A resilient GLB count over every host of the virtual cluster, for
tests/test_cross_host_resilient.py: it prints ``RUNNING`` once the places are
up, counts a tree held open until the file ``$GATE`` exists (the test crashes
hosts and cuts links meanwhile), prints ``PLACES <n>`` whenever the number of
places changes (the test opens the gate once the lost ones are gone), and
prints one ``RESULT <json>`` line."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from glb_bags import Count, GatedBag, TreeBag, tree_nodes  # noqa: E402

import apgas  # noqa: E402
from glb import GLB, GLBConfig  # noqa: E402


def watch_places() -> None:
    count = len(apgas.places())
    while True:
        time.sleep(0.05)
        if len(apgas.places()) != count:
            count = len(apgas.places())
            print(f"PLACES {count}", flush=True)


def main() -> dict:
    roots = [(s, 18) for s in (4, 5, 6, 10, 13)]
    glb = GLB(GLBConfig(n=32, resilient=True, backup_interval=0.1))
    threading.Thread(target=watch_places, daemon=True).start()
    print("RUNNING", flush=True)
    total = glb.compute_dynamic(GatedBag(TreeBag(roots, spin=20), os.environ["GATE"]), Count())
    assert glb.resilience is not None
    return {"total": total.value, "expected": tree_nodes(roots),
            "lost": glb.resilience.places_lost, "rounds": glb.resilience.rounds,
            "hosts": [p.host for p in apgas.places()]}


if __name__ == "__main__":
    print("RESULT " + json.dumps(apgas.run(main)), flush=True)
