"""A stand-in for an evolving program's place 0 that only takes orders, with plain sockets.

The test speaks for it towards the scheduler (``APGAS-Ready``,
``Evolving;Request``, ``Evolving;Check``, ...) so that it controls the timing;
this process listens on ``APGAS_MALLEABLE_LISTEN`` and answers the orders as
an apgas job would: ``grow`` with ``ok grow <n> places <ids>``, ``shrink``
with the hosts it gives back, ``refuse`` with ``ok refuse <n>``. Every order
and the hosts held after it go to ``FAKE_LOG`` as JSON lines, after a first
line ``{"order": "listening", "port": <the port it bound>}`` (the test names
that port in the job's ready line).

``FAKE_DELAY`` seconds pass before each answer (so that an order stays in
flight a while); with ``FAKE_HOLD_GROW``/``FAKE_HOLD_SHRINK`` naming a file, a
grow/shrink is answered only once that file exists (so that it stays in flight
until the test is done with it, however slow the machine);
``FAKE_GROW_ERROR``/``FAKE_SHRINK_ERROR`` make grows/shrinks
fail with that reason. The process exits after ``FAKE_SECONDS`` (600: a test's
steps take what they take on a loaded machine; the scheduler ends it before,
at its walltime or the scheduler's shutdown).
"""

import json
import os
import socket
import time


def address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


def answer(words: list[str], hosts: list[str], next_id: int) -> tuple[list[str], list[str], int]:
    """The reply lines, the hosts held afterwards and the next place id."""
    verb = words[0] if words else ""
    if verb == "grow":
        if os.environ.get("FAKE_GROW_ERROR"):
            return [f"error {os.environ['FAKE_GROW_ERROR']}"], hosts, next_id
        ids = [str(i) for i in range(next_id, next_id + len(words) - 2)]
        return [f"ok grow {words[1]} places {' '.join(ids)}"], hosts + words[2:], next_id + len(ids)
    if verb == "shrink":
        if os.environ.get("FAKE_SHRINK_ERROR"):
            return [f"error {os.environ['FAKE_SHRINK_ERROR']}"], hosts, next_id
        n = int(words[1])
        return hosts[-n:], hosts[:-n], next_id
    if verb == "refuse":
        return [f"ok refuse {words[1]}"], hosts, next_id
    return [f"error unknown order {verb!r}"], hosts, next_id


def main() -> None:
    hosts = os.environ["APGAS_HOSTS"].split(",")
    next_id = len(hosts)
    delay = float(os.environ.get("FAKE_DELAY", "0"))
    deadline = time.monotonic() + float(os.environ.get("FAKE_SECONDS", "600"))
    listen = os.environ.get("APGAS_MALLEABLE_LISTEN")  # unset for a rigid job: it just runs
    server = socket.create_server(address(listen)) if listen else None
    with open(os.environ["FAKE_LOG"], "a", buffering=1) as log:
        port = server.getsockname()[1] if server is not None else None
        log.write(json.dumps({"order": "listening", "hosts": hosts, "port": port}) + "\n")
        if server is None:
            time.sleep(max(0.0, deadline - time.monotonic()))
            return
        server.settimeout(0.1)
        while time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                line = conn.makefile().readline().strip()
                if line.startswith("A1 "):  # signed by the scheduler: the order is the rest
                    line = line.split(" ", 4)[4] if line.count(" ") >= 4 else ""
                time.sleep(delay)
                hold = os.environ.get(f"FAKE_HOLD_{line.split(' ', 1)[0].upper()}")
                while hold and not os.path.exists(hold):
                    time.sleep(0.01)
                reply, hosts, next_id = answer(line.split(), hosts, next_id)
                log.write(json.dumps({"order": line, "hosts": hosts}) + "\n")
                conn.sendall("".join(r + "\n" for r in reply).encode())


if __name__ == "__main__":
    main()
