"""A malleable job for the live scheduler tests: it prints where it listens for orders
(``LISTEN host:port``), then after every grow and shrink where each place runs
(``GROWN``/``SHRUNK`` and a JSON list of ``[place, host, node]``, ``node`` being
``$SLURMD_NODENAME`` or else the host name the place's machine gives itself), and ends
once a shrink leaves at most ``END_AT_PLACES`` places (default 1)."""

import json
import os
import socket
import threading

import apgas

ended = threading.Event()


def where() -> list:
    return [apgas.here().id, apgas.here().host,
            os.environ.get("SLURMD_NODENAME") or socket.gethostname()]


def places() -> str:
    return json.dumps([apgas.at(p, where) for p in apgas.places()])


class Newest(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]

    def post_grow(self, n, continued, added):
        print("GROWN " + places(), flush=True)

    def post_shrink(self, n, removed):
        print("SHRUNK " + places(), flush=True)
        if len(apgas.places()) <= int(os.environ.get("END_AT_PLACES", "1")):
            ended.set()


def main():
    print("LISTEN {}:{}".format(*apgas.define_malleable_handler(Newest()).address), flush=True)
    ended.wait(90)
    apgas.disable_malleable_handler()


if __name__ == "__main__":
    apgas.run(main)
