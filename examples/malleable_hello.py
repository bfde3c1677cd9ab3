"""A malleable program: its places change while it runs.

    APGAS_MALLEABLE_LISTEN=127.0.0.1:8090 APGAS_LOCAL_HOSTS='*' python examples/malleable_hello.py

then, from another shell:

    python -m apgas.order --to 127.0.0.1:8090 grow 2 nodeA nodeB
    python -m apgas.order --to 127.0.0.1:8090 shrink 1
    python -m apgas.order --to 127.0.0.1:8090 status

It prints its places every second for a minute (``--seconds`` to change).
Under another communicator (``APGAS_COMMUNICATOR``), the orders come its way;
``docs/communicators.md`` runs it under ``examples/file_communicator.py``.
"""

import argparse
import time

import apgas


class Handler(apgas.MalleableHandler):
    """Nothing to move: release the newest places, greet the new ones."""

    def pre_shrink(self, n):
        return apgas.places()[-n:]   # never place 0 (the order is refused if n >= places)

    def post_shrink(self, n, removed):
        print(f"released {removed}", flush=True)

    def post_grow(self, n, continued, added):
        for p in added:
            print(apgas.at(p, lambda: f"hello from new {apgas.here()}"), flush=True)


def main(seconds: float) -> None:
    communicator = apgas.define_malleable_handler(Handler())
    if communicator.address is not None:  # None: this communicator listens on no socket
        print("orders to {}:{}".format(*communicator.address), flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        print("places:", [p.id for p in apgas.places()], flush=True)
        time.sleep(1)
    apgas.disable_malleable_handler()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    apgas.run(lambda: main(args.seconds), places=2)
