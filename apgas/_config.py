"""Runtime configuration: keyword arguments, then ``APGAS_*`` variables, then defaults.

This module alone reads the environment; the README's configuration table
documents every field.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping

from .errors import ConfigError

__all__ = ["Config", "load_config"]


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


def _parse_hosts(name: str, value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    hosts = tuple(str(h).strip() for h in items)
    if not hosts or any(not h for h in hosts):
        raise ConfigError(f"{name} must be a comma-separated list of host names, got {value!r}")
    return hosts


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

    values: dict[str, Any] = {}
    hosts = pick("hosts")
    if hosts is not None:
        values["hosts"] = _parse_hosts(*hosts)
    places = pick("places")
    if places is not None:
        values["places"] = _parse_int(places[0], places[1], 1)
    elif "hosts" in values:
        values["places"] = len(values["hosts"])
    for field in ("threads", "immediate_threads"):
        found = pick(field)
        if found is not None:
            values[field] = _parse_int(found[0], found[1], 1)
    found = pick("join_timeout")
    if found is not None:
        values["join_timeout"] = _parse_float(*found)
    found = pick("log_level")
    if found is not None:
        level = str(found[1]).upper()
        if not isinstance(logging.getLevelName(level), int):
            raise ConfigError(f"{found[0]} must be a logging level name such as INFO, got {found[1]!r}")
        values["log_level"] = level
    for field in ("interface", "python", "chaos", "communicator"):
        found = pick(field)
        if found is not None:
            values[field] = str(found[1])
    for field in ("scheduler", "malleable_listen"):
        found = pick(field)
        if found is not None:
            parse_address(found[0], str(found[1]))
            values[field] = str(found[1])
    if values.get("chaos"):
        parse_chaos(values["chaos"])
    return Config(**values)


def parse_chaos(spec: str) -> tuple[int, float]:
    """Parse the chaos test hook ``"seed:max_delay_ms"``."""
    try:
        seed, delay = spec.split(":")
        return int(seed), float(delay) / 1000.0
    except ValueError:
        raise ConfigError(f"APGAS_CHAOS must look like 'seed:max_delay_ms', got {spec!r}") from None


def parse_address(name: str, value: str) -> tuple[str, int]:
    """Parse ``host:port`` (port 0 means any free port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name} must look like host:port, got {value!r}")
    return host, int(port)
