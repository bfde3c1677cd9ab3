"""Runtime configuration: keyword arguments, then ``APGAS_*`` variables, then defaults.

This module alone reads the environment; the README's configuration table
documents every field.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from launcher import (
    HostSpecError,
    check_hosts,
    default_start_method,
    detect_launcher,
    launcher_names,
    mpi_rank_from_env,
    read_hostfile,
    slurm_hosts,
)
from launcher._digits import ascii_int

from ..errors import ConfigError

__all__ = ["Config", "load_config", "host_mismatch"]

START_METHODS = ("fork", "spawn")


@dataclasses.dataclass(frozen=True)
class Config:
    places: int = 1
    threads: int = max(1, os.cpu_count() or 1)
    hosts: tuple[str, ...] = ()
    interface: str = "127.0.0.1"
    join_timeout: float = 15.0
    immediate_threads: int = 2
    log_level: str = "WARNING"
    python: str = ""
    chaos: str = ""  # test hook "seed:max_delay_ms": delay and reorder messages
    communicator: str = ""  # "" = socket, started when a handler is registered
    scheduler: str = ""  # host:port where the scheduler listens
    malleable_listen: str = ""  # host:port where the job listens for orders
    launcher: str = "local"  # detected when not given: mpi, srun or local
    grow_launcher: str = "local"  # starts the places of a grow; the launcher unless that is mpi
    hostfile: str = ""
    ssh: str = "ssh"  # the ssh command, with options
    srun: str = "srun"  # the srun command, with options
    check_inhibit: float = 10.0  # s: check_status calls this soon after the last one are no-ops
    slurm_grow_timeout: float = 30.0  # s the slurm communicator waits for Slurm to give nodes
    slurm_poll: float = 30.0  # s between reads of the job's orders besides the wake-up signal
    slurm_grow: str = ""  # "expand" or "companion"; "": expand where Slurm permits it
    heartbeat: str = "1:10"  # "interval:timeout" s: a place silent that long is dead; "0": off
    max_message_bytes: int = 256 * 1024 * 1024  # larger messages are refused by sender and receiver
    same_host: bool = True  # places of one host and network namespace talk over Unix streams
    max_places: int = 256  # a grow order that would pass this many places is refused
    timeline: str = ""  # place 0 appends the run's timeline here as JSON lines (apgas._timeline.recorder)
    timeline_interval: float = 0.1  # s between two load samples of a place while GLB computes
    # local places: "fork" (from a warmed template process) or "spawn" (fresh interpreters)
    start_method: str = dataclasses.field(default_factory=default_start_method)
    preload: str = ""  # "module[:function],...": the fork template imports (and calls) them once


def _parse_int(name: str, value: Any, minimum: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return number


def _parse_float(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a positive number, got {value!r}") from None
    if not number > 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return number


def _parse_flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be 1 or 0 (true or false), got {value!r}")


def _parse_seconds(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number of seconds >= 0, got {value!r}") from None
    if not number >= 0:
        raise ConfigError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return number


def _parse_hosts(name: str, value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    hosts = tuple(str(h).strip() for h in items)
    if not hosts or any(not h for h in hosts):
        raise ConfigError(f"{name} must be a comma-separated list of host names, got {value!r}")
    check_hosts(hosts, name)  # HostSpecError, a ConfigError for the caller
    return hosts


def default_heartbeat(places_per_core: float) -> str:
    """``1:10``, stretched in proportion beyond 64 places a core: place 0's ZeroMQ I/O
    thread answers every place's pings, and 512 places a core left it silent for 10 s
    (a 1,024-place GLB run on 2 cores lost place 0 at ``1:10`` and ran at ``2:60``)."""
    factor = max(1.0, places_per_core / 64)
    return f"{factor:g}:{10 * factor:g}"


def load_config(overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
    """Build the configuration; ``overrides`` are ``run()``'s keyword arguments."""
    env = os.environ if environ is None else environ
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise ConfigError(f"unknown configuration option(s) {unknown}; known: {sorted(fields)}")

    def pick(field: str) -> tuple[str, Any] | None:
        if field in given:
            return field, given[field]
        var = "APGAS_" + field.upper()
        if env.get(var, "") != "":
            return var, env[var]
        return None

    values: dict[str, Any] = _launch_values(pick, env)
    places = pick("places")
    if places is not None:
        values["places"] = _parse_int(places[0], places[1], 1)
    elif "hosts" in values:
        values["places"] = len(values["hosts"])
    world = mpi_rank_from_env(env) if values["launcher"] == "mpi" else None
    if values["launcher"] == "mpi":
        if world is None:
            raise ConfigError("the mpi launcher needs a process started by mpiexec (PMI_RANK or "
                              "OMPI_COMM_WORLD_RANK is not set); run: mpiexec -n 4 python script.py")
        if places is not None and values["places"] != world[1]:
            raise ConfigError(f"{places[0]} is {places[1]!r} but mpiexec started {world[1]} "
                              "rank(s); under mpiexec every rank is one place")
        values["places"] = world[1]
    for field in ("threads", "immediate_threads", "max_places"):
        found = pick(field)
        if found is not None:
            values[field] = _parse_int(found[0], found[1], 1)
    for field in ("join_timeout", "timeline_interval"):
        found = pick(field)
        if found is not None:
            values[field] = _parse_float(*found)
    found = pick("max_message_bytes")
    if found is not None:
        values["max_message_bytes"] = _parse_int(found[0], found[1], 4096)
    for field in ("check_inhibit", "slurm_grow_timeout", "slurm_poll"):
        found = pick(field)
        if found is not None:
            values[field] = _parse_seconds(*found)
    found = pick("log_level")
    if found is not None:
        level = str(found[1]).upper()
        if not isinstance(logging.getLevelName(level), int):
            raise ConfigError(f"{found[0]} must be a logging level name such as INFO, got {found[1]!r}")
        values["log_level"] = level
    found = pick("heartbeat")
    if found is not None:
        from .heartbeat import parse_heartbeat

        parse_heartbeat(str(found[1]))
        values["heartbeat"] = str(found[1])
    else:
        hosts = len(set(values.get("hosts", ()))) or 1
        per_core = values.get("places", 1) / hosts / (os.cpu_count() or 1)
        values["heartbeat"] = default_heartbeat(per_core)
    found = pick("same_host")
    if found is not None:
        values["same_host"] = _parse_flag(*found)
    found = pick("slurm_grow")
    if found is not None:
        if found[1] not in ("expand", "companion"):
            raise ConfigError(f"{found[0]} must be expand or companion, got {found[1]!r}")
        values["slurm_grow"] = str(found[1])
    for field in ("interface", "python", "chaos", "communicator", "ssh", "srun", "timeline"):
        found = pick(field)
        if found is not None:
            values[field] = str(found[1])
    found = pick("preload")
    if found is not None:
        values["preload"] = ",".join(parse_preload(found[0], str(found[1])))
    found = pick("start_method")
    if found is not None:
        if found[1] not in START_METHODS:
            raise ConfigError(f"{found[0]} must be one of {list(START_METHODS)}, got {found[1]!r}")
        values["start_method"] = str(found[1])
    for field in ("scheduler", "malleable_listen"):
        found = pick(field)
        if found is not None:
            parse_address(found[0], str(found[1]))
            values[field] = str(found[1])
    if values.get("chaos"):
        parse_chaos(values["chaos"])
    return Config(**values)


def _launch_values(pick: Callable[[str], tuple[str, Any] | None], env: Mapping[str, str]) -> dict[str, Any]:
    """The launchers and the hosts: given, from a host file, or from the Slurm allocation."""
    names = launcher_names()
    values: dict[str, Any] = {}
    for field in ("launcher", "grow_launcher"):
        found = pick(field)
        if found is not None:
            if found[1] not in names:
                raise ConfigError(f"{found[0]} must be one of {names}, got {found[1]!r}")
            values[field] = str(found[1])
    values.setdefault("launcher", detect_launcher(env))
    if values["launcher"] != "mpi":
        values.setdefault("grow_launcher", values["launcher"])
    else:
        values.setdefault("grow_launcher", detect_launcher(env, mpi=False))
    if values["grow_launcher"] == "mpi":
        raise ConfigError("APGAS_GROW_LAUNCHER cannot be 'mpi': MPI starts no places after "
                          "mpiexec; use local, ssh or srun")
    hosts, hostfile = pick("hosts"), pick("hostfile")
    if hosts is not None and hostfile is not None:
        raise ConfigError(f"give {hosts[0]} or {hostfile[0]}, not both")
    try:
        if hosts is not None:
            values["hosts"] = _parse_hosts(*hosts)
        elif hostfile is not None:
            values["hostfile"] = str(hostfile[1])
            values["hosts"] = read_hostfile(values["hostfile"])
        elif values["launcher"] == "srun" and env.get("SLURM_JOB_NODELIST"):
            # the slurm communicator counts one place a node (it resizes by whole nodes)
            communicator = pick("communicator")
            per_node = "" if communicator and communicator[1] == "slurm" else env.get(
                "SLURM_TASKS_PER_NODE", "")
            values["hosts"] = slurm_hosts(env["SLURM_JOB_NODELIST"], per_node)
    except HostSpecError as e:
        raise ConfigError(str(e)) from None
    return values


def host_mismatch(config: Config, overrides: Mapping[str, Any] | None = None,
                  environ: Mapping[str, str] | None = None) -> str | None:
    """Why ``config.places`` differs from the host slots handed to the job, or None.

    Hosts are *handed out* when they come from the surroundings, not from
    ``apgas.run``'s caller: ``APGAS_HOSTS`` (our scheduler sets it),
    ``APGAS_HOSTFILE`` (the ElasticJobScheduler's node file) or the Slurm
    allocation. A count given as well (``places=``, ``-n``, ``APGAS_PLACES``)
    that differs from them starts places anyway, cycled over the slots, so some
    hosts run more places than they have slots, or stay idle; the text says
    which, and what to do. None when the counts agree, when the caller gave the
    hosts itself (``hosts=``, ``hostfile=``: its choice) and under mpiexec, whose
    ranks are the places."""
    env = os.environ if environ is None else environ
    given = {k for k, v in (overrides or {}).items() if v is not None}
    hosts = list(config.hosts)
    if (not hosts or config.places == len(hosts) or config.launcher == "mpi"
            or given & {"hosts", "hostfile"}):
        return None
    if env.get("APGAS_HOSTS", ""):
        source = "APGAS_HOSTS"
    elif env.get("APGAS_HOSTFILE", ""):
        source = f"APGAS_HOSTFILE {config.hostfile}"
    else:
        source = "the Slurm allocation, SLURM_JOB_NODELIST"
    asked = f"places={config.places}" if "places" in given else f"APGAS_PLACES={config.places}"
    slots: dict[str, int] = {}
    for host in hosts:
        slots[host] = slots.get(host, 0) + 1
    placed: dict[str, list[int]] = {host: [] for host in slots}
    for i in range(config.places):
        placed[hosts[i % len(hosts)]].append(i)
    if config.places > len(hosts):
        crowded = [f"{host} runs places {', '.join(map(str, ids))} on {slots[host]} slot(s)"
                   for host, ids in placed.items() if len(ids) > slots[host]]
        effect = "places are cycled over them, so " + _some(crowded)
        fix = f"ask the scheduler for {config.places} hosts"
    else:
        idle = [host for host, ids in placed.items() if not ids]
        short = [f"{host} ({slots[host] - len(ids)} of {slots[host]} slots)"
                 for host, ids in placed.items() if ids and len(ids) < slots[host]]
        effect = "these get no place and stay idle: " + _some(idle + short)
        fix = f"ask the scheduler for {config.places} hosts only"
    handed = [host if k == 1 else f"{host} ({k} slots)" for host, k in slots.items()]
    return (f"starting {config.places} places ({asked}) on the {len(hosts)} host slot(s) handed "
            f"to this job ({source}: {_some(handed)}); {effect}. Leave the number of places unset "
            f"for one place per slot, {fix}, or give apgas.run the hosts (hosts=...) to share "
            "them on purpose")


def _some(items: list[str], most: int = 8) -> str:
    """The first ``most`` items, comma-separated, and how many more."""
    shown = ", ".join(items[:most])
    return shown if len(items) <= most else f"{shown} and {len(items) - most} more"


def parse_chaos(spec: str) -> tuple[int, float]:
    """Parse the chaos test hook ``"seed:max_delay_ms"``."""
    try:
        seed, delay = spec.split(":")
        return int(seed), float(delay) / 1000.0
    except ValueError:
        raise ConfigError(f"APGAS_CHAOS must look like 'seed:max_delay_ms', got {spec!r}") from None


_PRELOAD = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?")


def parse_preload(name: str, value: str) -> list[str]:
    """The entries of a comma-separated list of ``module`` or ``module:function``;
    ConfigError naming one that is neither."""
    entries = [m.strip() for m in value.split(",") if m.strip()]
    for entry in entries:
        if not _PRELOAD.fullmatch(entry):
            raise ConfigError(f"{name} must be comma-separated module names, each with an "
                              f"optional :function, such as glb.apps.uts:warm_up, got {entry!r}")
    return entries


def is_wildcard(interface: str) -> bool:
    """Whether the interface setting means every interface (``*`` or ``0.0.0.0``)."""
    return interface in ("*", "0.0.0.0")


def parse_address(name: str, value: str) -> tuple[str, int]:
    """Parse ``host:port`` (port 0 means any free port); an IPv6 host may be written in
    brackets, ``[::1]:8082``, as in a URL (the host comes back without them)."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    number = ascii_int(port)
    if not sep or not host or number is None or not 0 <= number <= 65535:
        raise ConfigError(f"{name} must look like host:port, got {value!r}")
    return host, number
