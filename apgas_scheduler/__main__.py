"""``python -m apgas_scheduler``: serve, submit, status, cancel, requeue, add-nodes,
node-up, shutdown, dashboard-url, report, simulate, compare, elastisim.

    python -m apgas_scheduler serve --nodes 'node[0-7]' --port 8081 --policy malleable --log events.jsonl
    python -m apgas_scheduler serve --nodes 'node[0-7]' --dashboard 8082    # then: dashboard-url
    python -m apgas_scheduler dashboard-url --dashboard 127.0.0.1:8082
    python -m apgas_scheduler submit --to 127.0.0.1:8081 job.toml
    python -m apgas_scheduler status --to 127.0.0.1:8081 [--json]
    python -m apgas_scheduler requeue --to 127.0.0.1:8081 ID     # back to the queue (requeue = N)
    python -m apgas_scheduler report events.jsonl [--gantt gantt.png] [--html report.html] [--json]
    python -m apgas_scheduler slurm-controller --policy NAME [--partition P] [--interval S]
    python -m apgas_scheduler simulate --trace FILE.swf --nodes N --policy NAME [--malleable-share F] [--json OUT]
    python -m apgas_scheduler compare --generate kit --nodes 512 --policies easy,mebf [--plot cmp.png]
    python -m apgas_scheduler elastisim --policy lending [--url ipc:///tmp/elastisim.ipc] [--stats S.json]
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import launcher as launchers
from apgas import auth, protocol
from apgas.errors import ConfigError
from apgas.lowlevel import parse_address
from apgas.protocol import ascii_int
from apgas.serving import loggable

from .client import SchedulerError, SchedulerUnreachable, request, submit
from .jobs import JobFileError, load_job_file
from .live.state import StateError
from .policies import get_policy, policy_names

log = logging.getLogger("scheduler")


def _address(value: str) -> tuple[str, int]:
    try:
        return parse_address("the address", value)  # argparse names the option before it
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _dashboard_address(value: str) -> tuple[str, int]:
    """``HOST:PORT``, or ``PORT`` alone for this machine's loopback."""
    return _address(f"127.0.0.1:{value}" if ascii_int(value) is not None else value)


def _user(value: str) -> int:
    """A user name or uid, as a uid."""
    import pwd

    try:
        uid = ascii_int(value)
        return pwd.getpwnam(value).pw_uid if uid is None else uid
    except KeyError:
        raise argparse.ArgumentTypeError(f"no user {value!r} on this machine") from None


def _nodes(value: str) -> list[str]:
    try:
        return launchers.expand_hostlist(value)
    except launchers.HostSpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _node_address(value: str) -> dict[str, str]:
    names, sep, address = value.rpartition("=")
    if not sep or not names or not address:
        raise argparse.ArgumentTypeError(f"expected NODES=ADDRESS, got {value!r}")
    try:
        protocol.check_host(address)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"NODES=ADDRESS {value!r}: the address: {e}") from None
    return {n: address for n in _nodes(names)}


def _key_default() -> str:
    """The operator's key file as --help shows it: the real path, which
    ``$APGAS_RUNTIME_DIR`` decides (``~/.apgas`` without it)."""
    from .live.access import default_key_file

    return f"{default_key_file()}: $APGAS_RUNTIME_DIR/scheduler.key, else ~/.apgas/scheduler.key"


def build_parser() -> argparse.ArgumentParser:
    key = _key_default()
    parser = argparse.ArgumentParser(prog="python -m apgas_scheduler",
                                     description="An elastic batch job scheduler for APGAS jobs.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the scheduler daemon")
    serve.add_argument("--nodes", type=_nodes, default=None,
                       help="node names, e.g. 'node[0-7]' or 'a,b'; default: the Slurm allocation")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8081, help="port (0: any free port)")
    serve.add_argument("--policy", choices=policy_names(), default="easy")
    serve.add_argument("--log", default=None, help="JSON-lines event log to append to")
    serve.add_argument("--interval", type=float, default=5.0, help="seconds between scheduling passes")
    serve.add_argument("--resize-interval", type=float, default=10.0,
                       help="minimum seconds between two resizes of one job")
    serve.add_argument("--register-timeout", type=float, default=60.0,
                       help=f"seconds a malleable job has to send {protocol.READY} "
                            f"(or {protocol.NOT_MALLEABLE}: it went rigid)")
    serve.add_argument("--quarantine", type=float, default=300.0, metavar="SECONDS",
                       help="seconds a node is out of service after one job lost its place there "
                            "(down until node-up once a job of another user does too; 0: down "
                            "until node-up at once)")
    serve.add_argument("--launcher", choices=["local", "ssh", "srun"], default=None,
                       help="how job commands start on their first node (default: detected)")
    serve.add_argument("--output-dir", default=None,
                       help="where job-N.out/.err go (default: STATE_DIR.jobs beside a given "
                            "--state-dir, else /var/lib/apgas-scheduler/jobs for root, else "
                            "$XDG_STATE_HOME/apgas-scheduler/jobs); made 0711, refused if another "
                            "user owns it or may write it, and serves one state: refused if "
                            "another state's scheduler used it")
    serve.add_argument("--state-dir", default=None, metavar="DIR",
                       help="the durable state (SQLite): jobs, pool, events; a scheduler started "
                            "on an earlier one's state resumes it, on the --nodes given now "
                            "(nodes no longer given leave the pool once their jobs end); a "
                            "different state directory starts afresh (default: OUTPUT_DIR.state, "
                            "beside the output directory)")
    serve.add_argument("--node-address", action="append", type=_node_address, default=[],
                       metavar="NODES=ADDRESS",
                       help="where the scheduler reaches nodes that are not this machine, when "
                            "their names do not resolve to them, e.g. 'node[1-3]=10.0.0.5' "
                            "(repeatable)")
    serve.add_argument("--order-port-base", type=int, default=None, metavar="PORT",
                       help="a plain-protocol malleable job listens for orders on PORT + its "
                            "id (default 27100; wraps after 1000); a signed one on a port the "
                            "kernel gives it, which it reports")
    serve.add_argument("--key-file", default=None, metavar="PATH",
                       help="the operator's key, which TCP requests must be signed with; made "
                            f"(mode 0600) if missing (default: {key})")
    serve.add_argument("--socket", default=None, metavar="PATH",
                       help="the Unix socket for clients on this machine (default: "
                            "/run/apgas-scheduler/PORT.sock for root, else "
                            "$XDG_RUNTIME_DIR/apgas-scheduler/PORT.sock)")
    serve.add_argument("--socket-mode", type=lambda v: int(v, 8), default=0o600, metavar="MODE",
                       help="its file mode: 600 (default) lets only the operator in, 666 every "
                            "user of the machine (each submits jobs that run as themselves)")
    serve.add_argument("--dashboard", type=_dashboard_address, default=None, metavar="[HOST:]PORT",
                       help="serve the live page here (default: off; HOST defaults to "
                            "127.0.0.1); open the URL that dashboard-url prints")
    serve.add_argument("--allow-plain-jobs", action="store_true",
                       help="accept jobs with protocol = \"plain\" (the ElasticJobScheduler's "
                            "unsigned lines): anyone who can reach the ports can speak for them")
    for name, helptext in (("submit", "submit a job file"), ("status", "show jobs and nodes"),
                           ("cancel", "cancel a job"),
                           ("requeue", "put a job back in the queue: a running one is killed "
                                       "first; counts towards its requeue = N"),
                           ("add-nodes", "add nodes to the pool"),
                           ("node-up", "put nodes that are down (a job lost its place there) "
                                       "back into service"),
                           ("shutdown", "stop the scheduler (running jobs are killed)")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--to", type=_address, required=True, metavar="HOST:PORT")
        p.add_argument("--key-file", default=None, metavar="PATH",
                       help=f"sign with this key (default: {key}, if readable)")
        p.add_argument("--socket", default=None, metavar="PATH",
                       help="use this Unix socket (default, without a readable key: PORT.sock "
                            "in your own socket directory, else in /run/apgas-scheduler)")
        p.add_argument("--scheduler-user", type=_user, default=None, metavar="USER",
                       help="the user the scheduler runs as, when neither root nor you: a "
                            "socket or local port held by anyone else is refused")
        if name == "submit":
            p.add_argument("files", nargs="+", metavar="JOB.toml")
            p.add_argument("--retry", type=float, default=0.0, metavar="SECONDS",
                           help="send a submit again for up to this long when the scheduler "
                                "does not answer (a restart): each runs once however often "
                                "it arrives (default: 0, no retry)")
        elif name == "status":
            p.add_argument("--json", action="store_true", help="print the status as JSON")
        elif name in ("cancel", "requeue"):
            p.add_argument("id", type=int)
        elif name in ("add-nodes", "node-up"):
            p.add_argument("names", type=_nodes)
    ctl = sub.add_parser("slurm-controller", help="run our policies on a Slurm: resize the "
                         "malleable jobs that opted in (run as the Slurm operator)")
    ctl.add_argument("--policy", choices=policy_names(), required=True)
    ctl.add_argument("--partition", default=None, help="the partition to schedule (default: all)")
    ctl.add_argument("--interval", type=float, default=5.0,
                     help="seconds between passes (each reads squeue and sinfo once)")
    ctl.add_argument("--resize-interval", type=float, default=10.0,
                     help="minimum seconds between two resizes of one job")
    ctl.add_argument("--order-timeout", type=float, default=120.0,
                     help="seconds a job has to answer an order before it gets no other")
    url = sub.add_parser("dashboard-url", help="print the URL (with its token) of a "
                                               "scheduler's live page")
    url.add_argument("--dashboard", type=_dashboard_address, required=True, metavar="[HOST:]PORT",
                     help="where serve --dashboard listens")
    url.add_argument("--key-file", default=None, metavar="PATH",
                     help=f"the operator's key (default: {key})")
    from .sim import compare as cmp
    simulate = sub.add_parser("simulate", help="simulate one policy on a trace or a generated workload")
    cmp.add_workload_arguments(simulate)
    cmp.add_policy_arguments(simulate)
    simulate.add_argument("--policy", required=True, help="one of: " + ", ".join(cmp.all_policy_names()))
    simulate.add_argument("--json", default=None, help="write the metrics here")
    compare = sub.add_parser("compare", help="simulate several policies on one workload")
    cmp.add_workload_arguments(compare)
    cmp.add_policy_arguments(compare)
    compare.add_argument("--policies", required=True, help="comma-separated policy names")
    compare.add_argument("--json", default=None)
    compare.add_argument("--plot", default=None, help="PNG: turnaround, slowdown, utilization over time")
    report = sub.add_parser("report", help="metrics and a Gantt chart from an event log",
                            description="Metrics of a run from its event log: the totals and "
                                        "by_class, each job class's figures (no incentive: that "
                                        "needs a second run with the malleable jobs rigid, which "
                                        "only simulate and compare make).")
    report.add_argument("events", help="a JSON-lines event log (--log), or the scheduler's "
                                       "state directory or its scheduler.db")
    report.add_argument("--gantt", default=None, help="write a Gantt chart PNG here")
    report.add_argument("--html", default=None, metavar="OUT.html",
                        help="write the dashboard's views of the run here, as one "
                             "self-contained file")
    report.add_argument("--json", action="store_true")
    from . import elastisim as es
    es.add_arguments(sub.add_parser("elastisim", help=es.HELP, description=es.DESCRIPTION))
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        if ns.command == "serve":
            return _serve(ns)
        if ns.command == "dashboard-url":
            return _dashboard_url(ns)
        if ns.command == "slurm-controller":
            from .slurm.controller import run_controller

            try:
                return run_controller(ns.policy, ns.partition, ns.interval, ns.resize_interval,
                                      ns.order_timeout)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        if ns.command in ("simulate", "compare"):
            try:
                return _simulate(ns)
            except (OSError, ValueError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        if ns.command == "elastisim":
            from .elastisim import main as elastisim_main
            return elastisim_main(ns)
        if ns.command == "report":
            try:
                return _report(ns)
            except (OSError, ValueError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        return _client(ns)
    except SchedulerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        print("error: plots need matplotlib; install it with: pip install 'apgas[bench]'", file=sys.stderr)
        return 2


def _serve(ns: argparse.Namespace) -> int:
    from .live.daemon import Scheduler

    nodes = ns.nodes
    if nodes is None:
        if not os.environ.get("SLURM_JOB_NODELIST"):
            print("error: give --nodes (not inside a Slurm allocation)", file=sys.stderr)
            return 2
        try:
            nodes = launchers.expand_hostlist(os.environ["SLURM_JOB_NODELIST"])
        except launchers.HostSpecError as e:
            print(f"error: SLURM_JOB_NODELIST: {e}", file=sys.stderr)
            return 2
    from .live.core import EscapeFilter

    for handler in logging.getLogger().handlers:  # whatever any part logs: no forged lines
        handler.addFilter(EscapeFilter())
    name = ns.launcher or launchers.detect_launcher(os.environ, mpi=False)
    if name == "local":  # the node names all stand for this machine
        known = [h for h in os.environ.get("APGAS_LOCAL_HOSTS", "").split(",") if h]
        os.environ["APGAS_LOCAL_HOSTS"] = ",".join(known + nodes)
    addresses = {n: a for given in ns.node_address for n, a in given.items()}
    ports = {} if ns.order_port_base is None else {"order_port_base": ns.order_port_base}
    try:
        sched = Scheduler(nodes, get_policy(ns.policy, resize_interval=ns.resize_interval),
                          host=ns.host, port=ns.port, events=ns.log, interval=ns.interval,
                          launcher=name, register_timeout=ns.register_timeout,
                          output_dir=ns.output_dir, node_addresses=addresses,
                          key_file=ns.key_file, socket_path=ns.socket, socket_mode=ns.socket_mode,
                          allow_plain_jobs=ns.allow_plain_jobs, state_dir=ns.state_dir,
                          dashboard=ns.dashboard, quarantine=ns.quarantine, **ports)
    except (OSError, ValueError, StateError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"scheduler listening on {sched.address[0]}:{sched.address[1]} and {sched.socket_path}",
          flush=True)
    if sched.dashboard is not None:
        print(f"dashboard at {sched.dashboard.url}", flush=True)
    if sched.resumed:  # never silently: the jobs and nodes of an earlier run are back
        print(sched.resumed, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sched.shutdown())
    try:
        sched.serve_forever()
    except KeyboardInterrupt:
        sched.shutdown()
        sched._finish()
    return 0


def _dashboard_url(ns: argparse.Namespace) -> int:
    from .live.access import dashboard_token, default_key_file
    from .live.dashboard import dashboard_url

    path = ns.key_file or default_key_file()
    try:
        key = auth.read_secret(path)
    except (OSError, auth.AuthError) as e:
        print(f"error: cannot read the operator's key {path}: {e}", file=sys.stderr)
        return 2
    print(dashboard_url(ns.dashboard, dashboard_token(key)))
    return 0


def _client(ns: argparse.Namespace) -> int:
    try:
        door = {"key": auth.read_secret(ns.key_file) if ns.key_file else None,
                "socket_path": ns.socket, "scheduler_uid": ns.scheduler_user}
    except (OSError, auth.AuthError) as e:
        print(f"error: cannot read the key file {ns.key_file}: {e}", file=sys.stderr)
        return 2
    if ns.command == "submit":
        return _submit(ns.to, ns.files, door, ns.retry)
    if ns.command == "status":
        reply = request(ns.to, "status", **door)
        reply.pop("ok", None)
        if isinstance(sys.stdout, io.TextIOWrapper):  # a terminal that cannot show a name
            sys.stdout.reconfigure(errors="backslashreplace")  # (ASCII only) still gets the rest
        print(json.dumps(reply, indent=2) if ns.json else _status_table(reply))
    elif ns.command in ("cancel", "requeue"):
        print(request(ns.to, ns.command, id=ns.id, **door)["state"])
    elif ns.command == "add-nodes":
        print(",".join(request(ns.to, "add-nodes", nodes=ns.names, **door)["nodes"]))
    elif ns.command == "node-up":
        down = request(ns.to, "node-up", nodes=ns.names, **door)["down"]
        print(f"still down: {','.join(down) or 'none'}")
    elif ns.command == "shutdown":
        request(ns.to, "shutdown", **door)
    return 0


def _submit(to: tuple[str, int], files: list[str], door: dict[str, Any], retry: float = 0.0) -> int:
    """Submit every file, printing each id, or the error naming the file, and go
    on; exit 2 if a file could not be read, else 1 if the scheduler refused one.
    An unreachable scheduler (after ``retry`` seconds of sending again) ends it:
    the files not sent yet are named."""
    unreadable = refused = 0
    for k, path in enumerate(files):
        try:
            spec = load_job_file(path)
        except JobFileError as e:
            print(f"error: {e}", file=sys.stderr)
            unreadable += 1
            continue
        try:
            job_id = submit(to, spec.to_dict(), file=path, retry_for=retry, **door)
        except SchedulerUnreachable as e:
            left = files[k + 1:] if e.sent else files[k:]
            print(f"error: {e}" + (f"; {path} may have been submitted" if e.sent else "")
                  + (f"; not submitted: {', '.join(left)}" if left else ""), file=sys.stderr)
            return 1
        except SchedulerError as e:
            message = str(e)
            print(f"error: {message if message.startswith(path) else f'{path}: {message}'}",
                  file=sys.stderr)
            refused += 1
            continue
        print(job_id, flush=True)
    return 2 if unreadable else 1 if refused else 0


def _status_table(status: dict[str, Any]) -> str:
    """The status as text for a terminal. Every text in it is escaped and cut
    (``loggable``): a job's name is another user's, and a state written by an
    older scheduler may hold any (control characters, lone surrogates)."""
    def text(value: Any, limit: int = 1000) -> str:
        return loggable(str(value), limit)

    down = [text(n["name"]) + (f" ({text(n['quarantine'])} s left)" if "quarantine" in n else "")
            for n in status["nodes"] if n.get("down")]
    draining = [text(n["name"]) for n in status["nodes"] if n.get("draining")]
    idle = sum(n["job"] is None and not n.get("down") for n in status["nodes"])
    lines = [f"policy {text(status['policy'])}, t = {status['time']:.1f} s, "
             f"{idle}/{len(status['nodes'])} node(s) idle"
             + (f", {len(down)} down: {','.join(down)}" if down else "")
             + (f", {len(draining)} draining: {','.join(draining)}" if draining else ""),
             f"{'id':>4} {'name':<20} {'class':<10} {'state':<10} {'nodes':<24} "
             f"{'requeues':<8} reason"]
    for j in status["jobs"]:
        nodes = text(",".join(map(str, j["nodes"])))
        count = j.get("requeues") or 0  # an older daemon's status has none
        requeues = f"{count}/{j.get('requeue', 0)}" if count else "-"
        reason = text(j["reason"])
        if count and not j["reason"].startswith("requeued"):  # why it went back, last time
            reason += f" (last requeue: {text(j.get('requeue_reason', ''))})"
        lines.append(f"{j['id']:>4} {text(j['name'])[:20]:<20} {text(j['class'])[:10]:<10} "
                     f"{text(j['state'])[:10]:<10} {nodes[:24]:<24} {requeues:<8} {reason}")
    return "\n".join(lines)


def _simulate(ns: argparse.Namespace) -> int:
    from .sim import compare as cmp

    names = [ns.policy] if ns.command == "simulate" else [p for p in ns.policies.split(",") if p]
    known = cmp.all_policy_names()
    unknown = [p for p in names if p not in known]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; known: {', '.join(known)}")
    cmp.check_options(names, ns)
    jobs = cmp.build_workload(ns)
    cmp.check_workload(jobs, names, ns)
    runs = cmp.compare(jobs, names, ns)
    print(_workload_line(jobs, ns))
    print(cmp.table(runs))
    for extra in (cmp.class_table([(r["policy"], r["metrics"]) for r in runs]),
                  cmp.incentive_table(runs)):
        if extra:
            print(f"\n{extra}")
    if ns.json:
        if ns.command == "simulate":
            Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
            Path(ns.json).write_text(json.dumps(runs[0]["metrics"], indent=2) + "\n")
        else:
            cmp.write_json(ns.json, runs, ns)
    if getattr(ns, "plot", None):
        cmp.plot(ns.plot, runs, ns.nodes, title=ns.trace or ns.generate)
    return 0


def _workload_line(jobs: list[Any], ns: argparse.Namespace) -> str:
    """How many jobs were simulated, and which were left out and why."""
    too_big = sum(j.min_nodes > ns.nodes for j in jobs)
    text = f"{len(jobs) - too_big} job(s) simulated on {ns.nodes} node(s)"
    why = []
    if too_big:
        why.append(f"{too_big} left out: they need more than {ns.nodes} node(s)"
                   + (f" at --procs-per-node {ns.procs_per_node}" if ns.trace else ""))
    skipped = int(getattr(ns, "swf_stats", {}).get("skipped", 0))
    if skipped:
        why.append(f"{skipped} trace record(s) skipped: no run time or no processors "
                   "(cancelled or failed before they started)")
    return text + (f" ({'; '.join(why)})" if why else "")


def _report(ns: argparse.Namespace) -> int:
    from .metrics import compute_metrics, gantt, read_events

    events = read_events(ns.events)
    metrics = compute_metrics(events)
    if ns.gantt:
        gantt(events, ns.gantt, title=ns.events)
    if ns.html:
        from apgas.serving import render_page

        from .live.views import dashboard_model

        model = dashboard_model(events, title=f"apgas scheduler report: {ns.events}")
        Path(ns.html).write_text(render_page(model), encoding="utf-8")
        print(f"wrote {ns.html}", file=sys.stderr)
    if ns.json:
        print(json.dumps(metrics, indent=2))
    else:
        from .sim.compare import class_table

        for key, value in metrics.items():
            if key != "by_class":
                print(f"{key:<24} {value}")
        by_class = class_table([(None, metrics)])
        if by_class:
            print(f"\n{by_class}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
