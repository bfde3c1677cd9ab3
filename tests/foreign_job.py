"""A malleable job that speaks the socket protocol with plain sockets, without apgas.

It announces itself with ``APGAS-Ready;<port>``, naming the port it bound
(``APGAS_MALLEABLE_LISTEN`` says port 0), or plain with the bare
``APGAS-Ready`` on the fixed port it was given (as an evolving job it then asks for
``FOREIGN_REQUEST`` nodes, and with ``FOREIGN_RELEASE`` gives the last one
back after a grow), takes grow and shrink orders (answering a shrink with the
hosts it gives back, a grow with nothing, as ElasticJobScheduler's jobs do) for
``FOREIGN_SECONDS`` seconds, or, with ``FOREIGN_UNTIL`` set to ``grow`` or
``shrink``, until it has taken the first such order (a test then waits for that
event, not for a guessed time; ``FOREIGN_SECONDS`` only bounds it; with
``FOREIGN_HOLD`` naming a file it then stays until that file exists, so that a
test can see what the scheduler made of its last messages while it runs), writes what
it held after each order to ``FOREIGN_LOG`` as JSON lines, and exits 0.

It signs its lines as ``docs/security.md`` describes (HMAC-SHA256 with
``APGAS_JOB_SECRET``), written out here as a job in another language would;
with ``APGAS_PLAIN_PROTOCOL=1`` it speaks plain lines, as Java's jobs do.
"""

import hashlib
import hmac
import json
import os
import secrets
import socket
import time

PLAIN = os.environ.get("APGAS_PLAIN_PROTOCOL") == "1"


def address(value):
    host, _, port = value.rpartition(":")
    return host, int(port)


def signed(line):
    if PLAIN:
        return line
    t, nonce = time.time_ns(), secrets.token_hex(8)
    mac = hmac.new(os.environ["APGAS_JOB_SECRET"].encode(), f"{t} {nonce} {line}".encode(),
                   hashlib.sha256).hexdigest()[:32]
    return f"A1 {t} {nonce} {mac} {line}"


def order_words(line):
    """The order's words (a signed order's signature is not checked by this test job)."""
    words = line.split()
    return words[4:] if words and words[0] == "A1" else words


def tell(line):
    with socket.create_connection(address(os.environ["APGAS_SCHEDULER"]), timeout=10) as conn:
        conn.sendall(signed(line).encode() + b"\n")


hosts = os.environ["APGAS_HOSTS"].split(",")
server = socket.create_server(address(os.environ["APGAS_MALLEABLE_LISTEN"]))
server.settimeout(0.1)
me = f"127.0.0.1:{os.environ['APGAS_JOB_ID']}"
with open(os.environ["FOREIGN_LOG"], "a") as log:
    log.write(json.dumps({"order": "start", "hosts": hosts}) + "\n")
    port = server.getsockname()[1]
    tell(f"APGAS-Ready:{me}" if PLAIN else f"APGAS-Ready;{port}:{me}")
    if os.environ.get("FOREIGN_REQUEST"):  # an evolving job asks for more nodes
        tell(f"Evolving;Request;{os.environ['FOREIGN_REQUEST']}:{me}")
    deadline = time.monotonic() + float(os.environ.get("FOREIGN_SECONDS", "5"))
    while time.monotonic() < deadline:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        with conn:
            line = order_words(conn.makefile().readline())
            if line[0] == "grow":
                hosts += line[2:]
                if os.environ.get("FOREIGN_RELEASE"):  # ... and gives one back itself
                    tell(f"Evolving;Release;{hosts.pop()}:{me}")
            elif line[0] == "shrink":
                n = int(line[1])
                gone, hosts = hosts[-n:], hosts[:-n]
                conn.sendall("".join(h + "\n" for h in gone).encode())
            log.write(json.dumps({"order": " ".join(line), "hosts": hosts}) + "\n")
            log.flush()
            tell(f"{line[0]}TimeAPGAS;{line[1]};1000:{me}")
            if line[0] == os.environ.get("FOREIGN_UNTIL"):
                break
    hold = os.environ.get("FOREIGN_HOLD")
    while hold and not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)
    tell(f"APGAS-NotMalleable:{me}")
