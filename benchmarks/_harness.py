"""The one runner every harness's ``main`` goes through, and the one table writer.

A harness says what it is (``@harness(name, __doc__, ...)`` over its measure
function, which makes a :class:`Harness`: the module's ``main``); calling it
parses the command line, sets up logging, checks the extras it needs, puts
:func:`machine_info` first in the report, measures, and writes the report as
JSON, so that no harness repeats that. Tables are :class:`Table` objects, so
that every harness aligns its columns the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import (
    CheckoutError,
    available_bytes,
    machine_info,
    parse_args,
    require,
    scheduler_env_aside,
    setup_logging,
    write_json,
)

# -- tables ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: its title, its width (the unit included) and how a value is written."""

    title: str
    width: int
    spec: str = ""       # the value's format spec without alignment: ".2f", "g", ","
    unit: str = ""       # written after the value, inside the width: "s", " s", "ms"
    left: bool = False   # names are left-aligned, figures right-aligned
    gap: str = ""        # written before the cell: the space between columns

    def head(self) -> str:
        return self.gap + (f"{self.title:<{self.width}}" if self.left else f"{self.title:>{self.width}}")

    def cell(self, value: Any) -> str:
        """``value`` in this column; a string (``-``) is aligned as it is, without the unit."""
        if isinstance(value, Text):
            return value.text
        if self.left:
            return self.gap + format(str(value), f"<{self.width}")
        if value is None or isinstance(value, str):
            return self.gap + f"{'-' if value is None else value:>{self.width}}"
        return self.gap + format(value, f">{self.width - len(self.unit)}{self.spec}") + self.unit


@dataclasses.dataclass(frozen=True)
class Text:
    """A cell written as it is, unaligned: a verdict after the figures, or why a row was skipped."""

    text: str


def skipped(name: str, reason: str, prefix: str = "") -> list[Any]:
    """The row of something not measured: its name, then ``skipped: reason``."""
    return [name, Text(prefix + (reason if reason.startswith("skipped") else f"skipped: {reason}"))]


@dataclasses.dataclass(frozen=True)
class Table:
    """Columns of fixed widths: a header line, then one line per row. A row gives its
    values in column order; it may stop early, and a :class:`Text` ends it."""

    columns: Sequence[Column]
    title: str | None = None   # a line above the header
    rule: bool = False         # a line of dashes under the header

    def header(self) -> str:
        return "".join(c.head() for c in self.columns)

    def line(self, row: Sequence[Any]) -> str:
        """One row, for a table printed as its rows come."""
        cells = [c.cell(v) for c, v in zip(self.columns, row, strict=False)]
        return "".join(cells + [v.text for v in row[len(self.columns):] if isinstance(v, Text)])

    def render(self, rows: Iterable[Sequence[Any]]) -> str:
        head = [] if self.title is None else [self.title]
        header = self.header()
        rule = ["-" * len(header)] if self.rule else []
        return "\n".join([*head, header, *rule, *(self.line(row) for row in rows)])


def markdown_head(*titles: str, left: int = 1) -> list[str]:
    """The two first lines of a Markdown table: the titles, and the first ``left`` columns
    left-aligned, the figures after them right-aligned."""
    return ["| " + " | ".join(titles) + " |",
            "| " + " | ".join("---" if i < left else "---:" for i in range(len(titles))) + " |"]


def show(*texts: str) -> None:
    """Print ``texts`` now (a long run shows each table as it comes), one per line."""
    print("\n".join(texts), flush=True)


# -- the runner -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """One run of a harness, given to its measure function: the options, the report it
    fills (``machine`` already in it) and where the report goes (None: nowhere)."""

    harness: Harness
    args: argparse.Namespace
    argv: list[str]
    report: dict[str, Any]
    path: Path | None

    @property
    def command(self) -> list[str]:
        """``["python", "-m", "benchmarks.x", *argv]``, for the report."""
        return ["python", "-m", self.harness.name, *self.argv]

    def write(self, path: Path, report: dict[str, Any]) -> None:
        """Write another report than the main one (a study's own file), machine first."""
        write_json(path, {"machine": self.report["machine"], **report}, self.harness.log)


Measure = Callable[[Run], "int | None"]


def harness(name: str, doc: str | None, json: Path | None = None, quick: str | None = None,
            **more: Any) -> Callable[[Measure], Harness]:
    """``@harness("benchmarks.x", __doc__, ...)`` over a measure function makes it the
    harness's ``main`` (a :class:`Harness`: ``main(argv)`` runs it, ``main.parse`` parses)."""
    return lambda measure: Harness(name, doc or "", measure, json, quick, **more)


@dataclasses.dataclass(frozen=True)
class Harness:
    """What a benchmark program is: its name (``benchmarks.heartbeat``), its docstring
    (the first line is its ``--help`` description), its measure function and options.

    ``json``, ``quick`` and ``repeats`` say which of the common options it takes
    (``--json`` with that default, ``--quick`` with that help, ``--repeats``); its own
    ``options`` come first, and a common option it defines itself is not added again.
    ``check`` returns what is wrong with the options, if anything (and may fill in the
    defaults that depend on ``--quick``); ``needs`` the modules it cannot run without."""

    name: str
    doc: str
    measure: Measure
    json: Path | None = None
    quick: str | None = None
    repeats: bool = True
    options: Callable[[argparse.ArgumentParser], None] | None = None
    check: Callable[[argparse.Namespace], str | None] | None = None
    needs: Callable[[argparse.Namespace], Sequence[str]] | None = None
    loggers: tuple[str, ...] = ("benchmarks",)
    whole_doc: bool = False  # --help shows the whole docstring, not its first line

    @property
    def log(self) -> logging.Logger:
        return logging.getLogger(self.name)

    def parse(self, argv: list[str] | None) -> argparse.Namespace:
        """The options of ``argv`` (exit 2 with a usage message if they are wrong)."""
        return parse_args(argv, f"python -m {self.name}", self.doc, self.json, self.quick,
                          self.options, repeats=self.repeats, check=self.check, whole_doc=self.whole_doc)

    def __call__(self, argv: list[str] | None = None) -> int:
        """Parse, set up logging, measure into a report that starts with the machine, write it."""
        given = list(sys.argv[1:] if argv is None else argv)
        args = self.parse(given)
        if self.needs is not None:
            require(self.name, *self.needs(args))
        setup_logging(*self.loggers)
        run = Run(self, args, given, {"machine": machine_info()}, getattr(args, "json", None))
        code = self.measure(run) or 0
        if run.path is not None:
            write_json(run.path, run.report, self.log)
        return code


def compared(run: Run, compare: Callable[[], dict[str, Any]],
             render: Callable[[dict[str, Any]], str]) -> int:
    """The body of a harness that measures commits side by side (versus, handoffs): the
    report and its table, or exit code 2 and no JSON if a commit cannot be checked out."""
    try:
        report = compare()
    except CheckoutError as e:
        print(f"error: {e}", file=sys.stderr)
        run.path = None
        return 2
    run.report.update(report)
    show(render(report))
    return 0


def in_parts(run: Run, parts: Iterable[str]) -> int:
    """The body of a harness of several parts (steps, dist): the free memory before, each
    part's table as soon as it is done (the parts fill the report, and list what they
    skipped), the scheduler's variables put aside meanwhile, and the load after."""
    run.report.update(memory_available_bytes=available_bytes(), skipped=[])
    with scheduler_env_aside(run.harness.log):
        for table in parts:
            show("\n" + table)
    run.report["load_average_after"] = os.getloadavg()
    return 0
