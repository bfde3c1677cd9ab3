"""The supervisor of a place on another host: nothing of the place stays there once
place 0 is gone or has given the place up.

Place 0 cannot signal a process on another host, and a place that is stopped,
hung, or cut off from the network cannot notice that place 0 is gone. So the
ssh and srun launchers start ``python -m launcher._supervise -- <place
command>`` on the host. It reads the bootstrap line from its stdin (the secret
stays off every command line), starts the place as its child with a pipe as
stdin, hands the line on, and sleeps in one ``poll`` until

* the place ends: the supervisor ends the same way (its exit code, or its
  signal), so ssh, srun and place 0 see what they saw without it;
* its stdin reaches end of file: the launching side is gone (place 0 died,
  or declared the place dead and killed its ssh or srun client);
* its link to place 0 is lost: a ZeroMQ DEALER of its own towards place 0's
  endpoint, with ZMTP heartbeats (``APGAS_HEARTBEAT``, from the bootstrap
  line; answered by place 0's libzmq I/O thread), drops its connection
  (place 0 ended, or answered no ping for the timeout: a cut link), or has
  made no handshake within the timeout.

In the last two cases it closes the place's stdin (a running place then exits
by itself with code 3) and SIGKILLs it: at once if it is stopped, else if it
has not ended within :data:`GRACE_S` (one deep in C code, hung). The place gets
SIGKILL when the supervisor dies (``PR_SET_PDEATHSIG``), and the supervisor
never outlives it.

``--pid PID`` watches an mpiexec rank from beside it instead (the rank starts
it, :func:`launcher.mpi.start_watchdog`): the rank is SIGKILLed when place 0's
link is lost and the rank neither ends nor closes the watchdog's stdin within
:data:`GRACE_S`; the rank closes it when place 0 asked it to stop.

It accepts no message: it listens on no socket, its DEALER never reads, and
place 0 sends it nothing. What makes it act is the absence of place 0 (a
dropped connection, no pong), its own stdin (the channel that brought the
run's secret) and its child's end; no one can make it kill or run anything by
sending it bytes.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import resource
import signal
import sys
import time
from typing import Any, NoReturn

import zmq
from zmq.utils.monitor import recv_monitor_message

from ._curve import CurveKeys, keys_of

__all__ = ["GRACE_S", "heartbeat_of", "PlaceZeroLink", "supervise", "watch", "main"]

GRACE_S = 1.0
"""Seconds a place has to end by itself once it is to end, before SIGKILL."""
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
CORE_SIGNALS = {signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP, signal.SIGABRT, signal.SIGBUS,
                signal.SIGFPE, signal.SIGSEGV, signal.SIGSYS, signal.SIGXCPU, signal.SIGXFSZ}
_PR_SET_PDEATHSIG = 1


def heartbeat_of(spec: object) -> tuple[float, float] | None:
    """``APGAS_HEARTBEAT`` (``interval:timeout``, or ``interval`` with a timeout ten
    times it) as place 0 checked it; None when off, the default ``1:10`` if unreadable."""
    text = str("1:10" if spec is None else spec).strip().lower()
    if text in ("0", "off", "none", ""):
        return None
    try:
        values = [float(part) for part in text.split(":")]
        interval, timeout = values if len(values) == 2 else (values[0], values[0] * 10)
    except ValueError:
        return 1.0, 10.0
    return (interval, timeout) if interval > 0 and timeout > 0 else (1.0, 10.0)


class PlaceZeroLink:
    """A connection of our own to place 0's ROUTER, kept alive by ZMTP heartbeats.

    Nothing is ever sent or read on it: libzmq pings place 0 every interval and
    drops the connection when nothing came back for the timeout, and the monitor
    reports that. ``deadline`` is when a link still without handshake counts as lost.
    """

    def __init__(self, endpoint: str, heartbeat: tuple[float, float] | None,
                 keys: CurveKeys) -> None:
        self.endpoint = endpoint
        self.heartbeat = heartbeat
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, 1)
        keys.connect_as_client(self._sock)  # place 0 takes the run's own only
        self.deadline: float | None = None
        if heartbeat is not None:
            interval, timeout = heartbeat
            self._sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, round(interval * 1000)))
            self._sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, round(timeout * 1000)))
            self._sock.setsockopt(zmq.HEARTBEAT_TTL, max(100, round(timeout * 1000)))
            self._sock.setsockopt(zmq.CONNECT_TIMEOUT, max(1, round(timeout * 1000)))
            self.deadline = time.monotonic() + timeout
        self.monitor = self._sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._sock.connect(endpoint)
        self.up = False

    def lost(self, now: float) -> str | None:
        """Read what the monitor reported; why the link counts as lost, else None."""
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                break
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.up, self.deadline = True, None
            elif event == zmq.EVENT_DISCONNECTED and self.up:
                silence = f", or answered no heartbeat for {self.heartbeat[1]:g} s" \
                    if self.heartbeat else ""
                return f"the link to place 0 at {self.endpoint} dropped (place 0 ended{silence})"
        if self.deadline is not None and now >= self.deadline:
            return f"place 0 at {self.endpoint} was not reached within {self.heartbeat[1]:g} s" \
                if self.heartbeat else "place 0 was not reached"
        return None


def _read_line(fd: int) -> tuple[bytes, bool]:
    """The first line of ``fd`` (read unbuffered, so later polls see all that is left)
    and whether its end came with it. What follows the line is dropped, as the place does."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, 65536)
        if not chunk:
            return data, True
        data += chunk
    return data[:data.index(b"\n") + 1], False


def _boot(line: bytes) -> dict[str, Any]:
    try:
        boot = json.loads(line or b"null")
    except ValueError:
        return {}
    return boot if isinstance(boot, dict) else {}


def _link_for(boot: dict[str, Any]) -> PlaceZeroLink | None:
    endpoint, secret = boot.get("parent_endpoint"), boot.get("secret")
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
        return None
    try:
        keys = keys_of(bytes.fromhex(secret)) if isinstance(secret, str) else None
    except ValueError:
        keys = None
    if keys is None:
        return None  # no secret, no link: place 0 would refuse it (the place itself says why)
    config = boot.get("config")
    return PlaceZeroLink(endpoint, heartbeat_of(config.get("heartbeat") if isinstance(config, dict)
                                                 else None), keys)


def _sleep_until_news(pidfd: int, stdin: int | None, link: PlaceZeroLink | None,
                      until: float | None = None) -> tuple[str, str]:
    """Sleep until something happens: ``("ended", "")`` (the watched process),
    ``("eof", "")`` (stdin), ``("lost", why)`` (place 0) or ``("time", "")`` (``until``)."""
    poller = zmq.Poller()
    poller.register(pidfd, zmq.POLLIN)
    if stdin is not None:
        poller.register(stdin, zmq.POLLIN)
    if link is not None:
        poller.register(link.monitor, zmq.POLLIN)
    while True:
        deadlines = [d for d in (until, link.deadline if link else None) if d is not None]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        ready = dict(poller.poll(None if wait is None else max(1, round(wait * 1000))))
        if pidfd in ready:
            return "ended", ""
        if stdin is not None and stdin in ready:
            try:
                more = os.read(stdin, 65536)
            except OSError:
                more = b""
            if not more:
                return "eof", ""
        now = time.monotonic()
        why = link.lost(now) if link is not None else None
        if why:
            return "lost", why
        if until is not None and now >= until:
            return "time", ""


def _say(text: str) -> None:
    """One line to stderr, never blocking (a full pipe towards a cut-off ssh client
    must not keep us here); called just before the place is killed, so no one
    else needs that stderr blocking any more."""
    try:
        os.set_blocking(2, False)
        os.write(2, f"apgas supervisor on {os.uname().nodename}: {text}\n".encode())
    except OSError:
        pass  # whoever read our stderr is gone


def _is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, or a tracer's stop): it cannot end by itself."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _pidfds() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (OSError, AttributeError):
        return False


def _start(argv: list[str], line: bytes) -> tuple[int, int]:
    """Fork and exec the place with a pipe as stdin that holds ``line`` already;
    (its pid, the pipe's write end)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    if len(line) > 65536:  # the whole line fits in the pipe: writing it never blocks
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, len(line))
    os.write(write_end, line)
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    supervisor = os.getpid()
    child = os.fork()  # no thread runs yet: the ZeroMQ context comes later
    if child == 0:
        try:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != supervisor:
                os._exit(1)  # the supervisor died before the line above
            os.dup2(read_end, 0)  # dup2 clears close-on-exec
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, f"apgas supervisor: cannot run {argv[0]}: {e}\n".encode(errors="replace"))
        finally:
            os._exit(127)
    os.close(read_end)
    return child, write_end


def _end_like(status: int) -> NoReturn:
    """Exit as the place did: its code, or its signal raised on ourselves (a signal
    that would dump a core: 128 + the signal, with no core). The scheduler's
    ``_job_exec`` has a twin: it runs isolated and cannot import this one."""
    sys.stderr.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in CORE_SIGNALS:
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 127)


def supervise(argv: list[str], stdin: int = 0) -> NoReturn:
    """Run the place command ``argv`` as our child and watch it (the module's doc)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is place 0's to handle
    if not _pidfds():
        _say("no pidfds here (Linux 5.3+): the place runs unsupervised")
        os.execvp(argv[0], argv)  # it reads its bootstrap line itself
    line, _ = _read_line(stdin)  # an end of file that came with it shows again below
    child, to_child = _start(argv, line)
    pidfd = os.pidfd_open(child)

    def forward(sig: int, _frame: object) -> None:
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except OSError:
            pass  # it has ended

    for sig in FORWARDED:
        signal.signal(sig, forward)
    boot = _boot(line)
    link = _link_for(boot)
    what, why = _sleep_until_news(pidfd, stdin, link)
    if what != "ended":
        os.close(to_child)  # a running place sees end of file and exits by itself
        if not _is_stopped(child):
            what = _sleep_until_news(pidfd, None, None, time.monotonic() + GRACE_S)[0]
        if what != "ended":
            _say(f"place {boot.get('place', '?')} (pid {child}) killed: "
                 + (why or "its launcher is gone (end of stdin)"))
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    while True:  # a stop is no end
        _, status = os.waitpid(child, 0)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            _end_like(status)


def watch(pid: int, stdin: int = 0) -> NoReturn:
    """Watch the process ``pid`` (an mpiexec rank, our parent) from beside it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    line, eof = _read_line(stdin)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        os._exit(0)  # it has ended
    link = _link_for(_boot(line))
    if eof or link is None:
        os._exit(0)
    what, why = _sleep_until_news(pidfd, stdin, link)
    if what == "lost" and (_is_stopped(pid) or _sleep_until_news(
            pidfd, stdin, None, time.monotonic() + GRACE_S)[0] == "time"):
        _say(f"place {_boot(line).get('place', '?')} (pid {pid}) killed: {why}")
        try:  # said first: mpiexec cleans up the rank's descendants, us too, once it is gone
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)


def main(args: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(prog="python -m launcher._supervise",
                                     description="Watch a place; end it when place 0 is gone.")
    parser.add_argument("--pid", type=int, help="watch this process (a rank) from beside it")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the place command")
    parsed = parser.parse_args(args)
    command = parsed.command[1:] if parsed.command[:1] == ["--"] else parsed.command
    if parsed.pid is not None and not command:
        watch(parsed.pid)
    if parsed.pid is None and command:
        supervise(command)
    parser.error("give either --pid PID or -- COMMAND")


if __name__ == "__main__":
    main()
