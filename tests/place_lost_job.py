"""A malleable program that hears of its lost places, written as a user would.

It prints where it listens (``LISTEN host:port``) and, at the start and after
every grow, its places with their process ids (``PLACES`` and a JSON list of
``[place, host, pid]``). Its handler records every ``on_place_lost`` call and
prints it (``LOST`` and a JSON list of ``[place, host]``). After the first
loss it shows that it goes on: a finish with a task at every place it still
has (``AFTER`` and the places that ran one, with what ``apgas.places()`` says).

It ends after a loss, or, with ``REGROW_TO=<n>``, once it has ``n`` places again
after a loss (a scheduler gave it a healthy node); at most after 90 s.
"""

import json
import os
import threading
import time

import apgas

lost_calls: list[list[list]] = []
lost = threading.Event()


def where() -> list:
    return [apgas.here().id, apgas.here().host, os.getpid()]


def report_in(ref: apgas.GlobalRef) -> None:
    me = apgas.here().id
    apgas.at(ref.home, lambda: ref.get().append(me))


def show_places() -> None:
    print("PLACES " + json.dumps([apgas.at(p, where) for p in apgas.places()]), flush=True)


class Watchful(apgas.MalleableHandler):
    def pre_shrink(self, n, chosen=None):
        return list(chosen) if chosen is not None else apgas.places()[-n:]

    def post_grow(self, n, continued, added):
        show_places()

    def on_place_lost(self, places):
        lost_calls.append([[p.id, p.host] for p in places])
        print("LOST " + json.dumps(lost_calls[-1]), flush=True)
        lost.set()


def main() -> None:
    address = apgas.define_malleable_handler(Watchful()).address
    print("LISTEN {}:{}".format(*address), flush=True)
    show_places()
    if not lost.wait(90):
        raise SystemExit("no place was lost within 90 s")
    ran: list[int] = []
    ref = apgas.GlobalRef(ran)
    with apgas.finish():  # the program goes on with the places it has
        for p in apgas.places():
            apgas.async_at(p, report_in, ref)
    print("AFTER " + json.dumps({"ran": sorted(ran), "places": [p.id for p in apgas.places()],
                                 "calls": lost_calls}), flush=True)
    deadline = time.monotonic() + 60
    while len(apgas.places()) < int(os.environ.get("REGROW_TO", "0")):
        if time.monotonic() > deadline:
            raise SystemExit(f"still {len(apgas.places())} place(s) 60 s after the loss")
        time.sleep(0.1)
    apgas.disable_malleable_handler()


if __name__ == "__main__":
    apgas.run(main)
