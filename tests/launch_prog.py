"""A program the launcher tests start under mpiexec, salloc or with the ssh launcher.

It prints one line ``RESULT <json>``: what every place saw of itself at the
start, and, when ``GROW`` names hosts (comma-separated), after growing onto
them and after shrinking by ``SHRINK`` places (orders sent to itself).
"""

import json
import os
import socket

import apgas
from apgas._core.runtime import current
from apgas.order import send_order


def whoami() -> dict:
    return {"place": apgas.here().id, "host": apgas.here().host, "pid": os.getpid(),
            "ppid": os.getppid(), "node": os.environ.get("SLURMD_NODENAME"),
            "rank": os.environ.get("PMI_RANK"), "ssh": bool(os.environ.get("SSH_CONNECTION")),
            "hostname": socket.gethostname(), "endpoint": current().transport.endpoint,
            "links": links()}


def links() -> dict[int, str]:
    """How this place reaches each place it has a link to: a Unix stream (``same-host``)
    or ZeroMQ."""
    transport = current().transport
    return {place: "same-host" if type(link.sock).__name__ == "LocalConn" else "zeromq"
            for place, link in transport._links.items() if link.sock is not None}


def survey() -> list[dict]:
    return [apgas.at(p, whoami) for p in apgas.places()]


def order(address, line: str) -> list[str]:
    return send_order(address, line, timeout=60)


class Newest(apgas.MalleableHandler):
    def pre_shrink(self, n):
        return apgas.places()[-n:]


def main() -> dict:
    result: dict = {"start": survey()}
    grow = [h for h in os.environ.get("GROW", "").split(",") if h]
    if grow:
        address = apgas.define_malleable_handler(Newest()).address
        result["grow_reply"] = order(address, f"grow {len(grow)} {' '.join(grow)}")
        result["grown"] = survey()
        shrink = int(os.environ.get("SHRINK", "0"))
        if shrink:
            result["shrink_reply"] = order(address, f"shrink {shrink}")
            result["shrunk"] = survey()
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(apgas.run(main)), flush=True)
