"""The documentation does what it says: its one-machine commands, run as a newcomer
would, print what the page shows.

Which commands run is marked in the Markdown (README.md and docs/*.md), by an HTML
comment on the line before a fenced ``sh`` or ``python`` block; the site does not
show it::

    <!-- doc-test: small: --depth 13 => --depth 6; skip: sbatch -->

``doc-test`` alone runs the block as written. Directives, separated by ``;`` or
newlines:

- ``small: OLD => NEW``: run with OLD replaced by NEW (a size that takes seconds);
- ``skip: TEXT``: leave out the commands that contain TEXT;
- ``background``: the block's one command keeps running while the page's next
  blocks run (a program that takes orders "from another shell");
- ``slurm``: run inside the tests' private Slurm (``tests/_slurm.py``; skipped without).

How a page runs. Its marked blocks run in order, in a scratch directory holding
links to the checkout's ``.venv``, ``examples``, ``tests`` and ``benchmarks``,
with the virtual environment first on ``PATH`` (``python`` is the venv's, as in
an activated one). Each command of a ``sh`` block (a line, with its ``\\``
continuation lines) runs in its own ``bash``; ``export NAME=VALUE`` carries over to
the page's later commands, as in one shell. A command ending in ``&`` runs in the
background until the page's end (then Ctrl-C, SIGINT, if it has not ended), or
until ``wait`` waits for it. A ``python`` block runs as a script. Every command
must exit 0 and leave no process behind.

What the page shows. The full-line comments right below a command are its output
(a trailing comment is a remark), and so is a ``text`` block right after a marked
block (at most one paragraph between), for the block's last command. Each line
shown must appear in the output, in that order; runs of blanks count as one and
``...`` stands for any text. A background command must show at least one line: the
page goes on once it has appeared (the program is ready).

What differs from a newcomer's machine, so that a run disturbs nothing: the ports
8081, 8082 and 8090 are replaced by free ones; ``apgas_scheduler serve`` gets
``--port 8081`` and ``--output-dir`` in the scratch directory when the page gives
none, and ``/var/lib/apgas-scheduler`` (root's default state) means that
directory, ``/run/apgas-scheduler`` this user's socket directory; keys go to a
directory of the page's own (``APGAS_RUNTIME_DIR``).

``test_documented_options_exist`` asks ``--help`` of every ``python -m`` of this
project that the pages name (and of the harnesses in the Benchmarks table) and
checks that it exits 0 and knows every ``--option`` the pages give it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from apgas_scheduler.live import access
from benchmarks._common import communicate_or_kill

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = (".venv", "examples", "tests", "benchmarks")
PORTS = (8081, 8082, 8090)
COMMAND_TIMEOUT = 60.0
READY_TIMEOUT = 30.0
MARK = re.compile(r"^<!--\s*doc-test\b:?(.*?)-->", re.S | re.M)  # at a line's start
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclasses.dataclass
class Command:
    text: str
    shown: list[str] = dataclasses.field(default_factory=list)  # the output the page shows
    background: bool = False
    script: str | None = None  # a python block's source


@dataclasses.dataclass
class Block:
    page: str
    line: int
    commands: list[Command]
    slurm: bool = False


# -- reading the pages ------------------------------------------------------------------

def _directives(text: str, where: str) -> dict[str, list]:
    found: dict[str, list] = {"small": [], "skip": [], "background": [], "slurm": []}
    for item in filter(None, (i.strip() for i in re.split(r"[;\n]", text))):
        name, _, value = item.partition(":")
        name, value = name.strip(), value.strip()
        if name not in found:
            raise ValueError(f"{where}: unknown doc-test directive {item!r}")
        if name == "small":
            old, arrow, new = value.partition("=>")
            if not arrow or not old.strip():
                raise ValueError(f"{where}: small needs 'OLD => NEW', got {value!r}")
            found[name].append((old.strip(), new.strip()))
        else:
            found[name].append(value or True)
    return found


def _strip_comment(line: str) -> tuple[str, str]:
    """``(command, comment)``: a ``#`` after a blank and outside quotes starts the comment."""
    quote = ""
    for i, c in enumerate(line):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def _sh_commands(body: list[str], where: str) -> list[Command]:
    commands: list[Command] = []
    joined: list[str] = []
    for raw in body:
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1].rstrip() + " " + raw.strip()
        else:
            joined.append(raw)
    for line in joined:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if commands:  # a comment before the first command is a remark
                commands[-1].shown.append(stripped[1:].strip())
            continue
        text, _ = _strip_comment(stripped)
        background = text.endswith("&") and not text.endswith("&&")
        commands.append(Command(text[:-1].rstrip() if background else text, background=background))
    if not commands:
        raise ValueError(f"{where}: a doc-test block without commands")
    return commands


def _text_after(lines: list[str], i: int) -> list[str]:
    """The lines of a ``text`` block that follows line ``i`` (a closing fence), with at
    most one paragraph between; [] if there is none."""
    j, paragraphs = i + 1, 0
    while j < len(lines):
        if not lines[j].strip():
            j += 1
            continue
        if FENCE.match(lines[j]):
            if FENCE.match(lines[j])[1] != "text":
                return []
            end = next(k for k in range(j + 1, len(lines)) if lines[k].startswith("```"))
            return [line for line in lines[j + 1:end] if line.strip()]
        paragraphs += 1
        if paragraphs > 1 or lines[j].startswith("<!--"):
            return []
        while j < len(lines) and lines[j].strip():
            j += 1
    return []


def marked_blocks(page: Path) -> list[Block]:
    """The page's blocks marked ``doc-test``, in order, as commands with their shown output."""
    text = page.read_text()
    lines = text.splitlines()
    name = page.relative_to(ROOT).as_posix()
    blocks = []
    for mark in MARK.finditer(text):
        end_line = text.count("\n", 0, mark.end())  # the line the comment ends on (0-based)
        where = f"{name}:{end_line + 2}"
        fence = FENCE.match(lines[end_line + 1]) if end_line + 1 < len(lines) else None
        if fence is None or fence[1] not in ("sh", "python"):
            raise ValueError(f"{where}: a doc-test comment must come right before a sh or python block")
        start = end_line + 2
        close = next(k for k in range(start, len(lines)) if lines[k].startswith("```"))
        body = lines[start:close]
        found = _directives(mark[1], where)
        if fence[1] == "python":
            source = "\n".join(body) + "\n"
            for old, new in found["small"]:
                source = source.replace(old, new)
            commands = [Command("", script=source)]
        else:
            commands = [c for c in _sh_commands(body, where)
                        if not any(s in c.text for s in found["skip"])]
        commands[-1].shown += _text_after(lines, close)
        for c in commands:
            for old, new in found["small"]:
                c.text = c.text.replace(old, new)
        if found["background"]:
            if len(commands) != 1:
                raise ValueError(f"{where}: a background block holds one command")
            commands[0].background = True
        blocks.append(Block(name, start, commands, bool(found["slurm"])))
    return blocks


BLOCKS = {page.relative_to(ROOT).as_posix(): marked_blocks(page) for page in PAGES}
MARKED = [name for name, blocks in BLOCKS.items() if blocks]
SLURM_PAGES = [name for name in MARKED if any(b.slurm for b in BLOCKS[name])]  # on the session's cluster
PLAIN_PAGES = [name for name in MARKED if name not in SLURM_PAGES]


# -- matching -------------------------------------------------------------------------------

def _pattern(shown: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in " ".join(shown.split()).split("...")))


def unmatched(shown: list[str], output: str) -> str | None:
    """The first line of ``shown`` that does not appear in ``output`` after the lines
    before it, or None when all do, in order."""
    lines = [" ".join(line.split()) for line in output.splitlines()]
    at = 0
    for want in shown:
        pattern = _pattern(want)
        at = next((k + 1 for k in range(at, len(lines)) if pattern.fullmatch(lines[k])), -1)
        if at < 0:
            return want
    return None


def test_matching_rules():
    out = "scheduler listening on 127.0.0.1:4242 and /run/x.sock\n  1   uts   running \nnoise\n2\n"
    assert unmatched(["scheduler listening on 127.0.0.1:... and ...", "1 uts running", "2"], out) is None
    assert unmatched(["2", "1 uts running"], out) == "1 uts running"  # out of order
    assert unmatched(["1 uts"], out) == "1 uts"  # a whole line, not a part
    assert _strip_comment("a '#b' c  # d") == ("a '#b' c", "d")
    cmds = _sh_commands(["# a remark", "x --y \\", "   z &   # bg", "# shown", "w && v"], "t")
    assert [(c.text, c.shown, c.background) for c in cmds] == [
        ("x --y z", ["shown"], True), ("w && v", [], False)]


def test_the_pages_mark_their_commands():
    """The marks are there, so that the test below has something to run: the README's
    program and shell command, the tutorial's, the GLB applications, the scheduler's walk
    through and its restart, the dashboard, a malleable program taking orders, GLB."""
    assert {"README.md", "docs/getting-started.md", "docs/glb.md", "docs/benchmarks.md",
            "docs/scheduler.md", "docs/dashboard.md", "docs/malleability.md",
            "docs/cluster.md"} <= set(MARKED)
    assert sum(len(b.commands) for blocks in BLOCKS.values() for b in blocks) >= 30


# -- running a page ---------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tagged(token: str) -> list[int]:
    """Processes whose environment carries ``APGAS_DOC_TEST=token``."""
    found = []
    needle = f"APGAS_DOC_TEST={token}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


class Page:
    """One page's run: its scratch directory, environment, ports and background commands."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        for link in LINKED:
            (scratch / link).symlink_to(Path(sys.prefix) if link == ".venv" else ROOT / link)
        self.token = uuid.uuid4().hex
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("APGAS_", "SLURM_"))}
        self.env.update(PATH=f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                        PYTHONUNBUFFERED="1", APGAS_DOC_TEST=self.token,
                        APGAS_RUNTIME_DIR=str(scratch / "keys"),
                        XDG_STATE_HOME=str(scratch / "xdg-state"))
        self.state = scratch / "state"
        self.ports = {p: _free_port() for p in PORTS}
        self.background: list[tuple[subprocess.Popen, str]] = []
        self.problems: list[str] = []

    def here(self, text: str) -> str:
        """The page's text as it reads on this run (ports, default directories)."""
        for documented, free in self.ports.items():
            text = re.sub(rf"\b{documented}\b", str(free), text)
        return (text.replace("/var/lib/apgas-scheduler", str(self.state))
                .replace("/run/apgas-scheduler", str(access.socket_dir())))

    def command_line(self, c: Command) -> str:
        text = c.text
        if re.search(r"-m apgas_scheduler serve\b", text):
            text += "" if "--port" in text else " --port 8081"
            text += "" if "--output-dir" in text else f" --output-dir {self.state / 'jobs'}"
        return self.here(text)

    def run(self, block: Block, where: str) -> None:
        for c in block.commands:
            shown = [self.here(line) for line in c.shown]
            if c.script is not None:
                path = self.scratch / f"block-{block.line}.py"
                path.write_text(c.script)
                self.foreground(f"python {path.name}", shown, where)
            elif c.text.startswith("export "):
                for assignment in shlex.split(c.text)[1:]:
                    name, _, value = assignment.partition("=")
                    self.env[name] = value
            elif c.text == "wait":  # as the shell's: until the background commands have ended
                for proc, line in self.background:
                    try:
                        proc.wait(COMMAND_TIMEOUT)
                    except subprocess.TimeoutExpired:
                        pytest.fail(f"{where}: `{line}` still ran {COMMAND_TIMEOUT:g} s into `wait`")
            elif c.background:
                assert shown, f"{where}: `{c.text}` runs in the background but the page shows " \
                              "no line of it to wait for"
                self.start(self.command_line(c), shown, where)
            else:
                self.foreground(self.command_line(c), shown, where)

    def foreground(self, line: str, shown: list[str], where: str) -> None:
        proc = subprocess.Popen(["bash", "-c", line], cwd=self.scratch, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = communicate_or_kill(proc, COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{where}: `{line}` took more than {COMMAND_TIMEOUT:g} s")
        if not _group_gone(proc.pid, 5.0):
            _signal_group(proc.pid, signal.SIGKILL)
            self.problems.append(f"{where}: `{line}` left processes behind (killed)")
        assert proc.returncode == 0, f"{where}: `{line}` exited {proc.returncode}:\n{out[-4000:]}"
        missing = unmatched(shown, out)
        assert missing is None, f"{where}: `{line}` did not print\n    {missing}\nas the page " \
                                f"shows; it printed:\n{out[-4000:]}"

    def start(self, line: str, shown: list[str], where: str) -> None:
        log = self.scratch / f"background-{len(self.background)}.out"
        with open(log, "w") as out:
            proc = subprocess.Popen(["bash", "-c", line], cwd=self.scratch, env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.background.append((proc, line))
        deadline = time.monotonic() + READY_TIMEOUT
        while (missing := unmatched(shown, log.read_text())) is not None:
            if proc.poll() is not None or time.monotonic() > deadline:
                state = f"exited {proc.returncode}" if proc.poll() is not None else \
                    f"running after {READY_TIMEOUT:g} s"
                pytest.fail(f"{where}: `{line}` ({state}) did not print\n    {missing}\nas the page "
                            f"shows; it printed:\n{log.read_text()[-4000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        """End the background commands (Ctrl-C if they did not end by themselves), then
        check that nothing of the page runs."""
        for proc, line in self.background:
            for sig, wait in ((None, 3.0), (signal.SIGINT, 15.0), (signal.SIGTERM, 5.0)):
                if sig is not None:
                    _signal_group(proc.pid, sig)
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                self.problems.append(f"`{line}` did not end on Ctrl-C nor SIGTERM (killed)")
            if not _group_gone(proc.pid, 5.0):
                _signal_group(proc.pid, signal.SIGKILL)
                self.problems.append(f"`{line}` left processes behind (killed)")
            proc.wait()
        deadline = time.monotonic() + 5.0
        while (left := _tagged(self.token)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if left:
            self.problems.append(f"processes of the page still ran: {left} (killed)")


def run_page(page: str, tmp_path: Path, slurm_conf: str | None = None) -> None:
    run = Page(tmp_path)
    if slurm_conf is not None:
        run.env["SLURM_CONF"] = slurm_conf
    try:
        for block in BLOCKS[page]:
            run.run(block, f"{page}:{block.line}")
    finally:
        run.stop()
    assert not run.problems, "\n".join(run.problems)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("page", PLAIN_PAGES)
def test_the_page_does_what_it_says(page, tmp_path):
    run_page(page, tmp_path)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("page", SLURM_PAGES)
def test_the_slurm_page_does_what_it_says(page, tmp_path, slurm_cluster):  # skips without Slurm
    run_page(page, tmp_path, slurm_cluster.env["SLURM_CONF"])


# -- the options the pages name -----------------------------------------------------------------

OURS = ("apgas", "glb", "launcher", "apgas_scheduler", "benchmarks")
INVOKED = re.compile(r"(?:\.venv/bin/)?python3? -m ([A-Za-z_][\w.]*)([^`\n|]*)")
HARNESS = re.compile(r"`(benchmarks\.\w+)((?: [^`]*)?)`")


def documented_invocations() -> dict[tuple[str, str], set[str]]:
    """(module, subcommand) -> the ``--options`` the pages give it."""
    found: dict[tuple[str, str], set[str]] = {}
    for page in PAGES:
        text = page.read_text()
        for module, rest in [*INVOKED.findall(text), *HARNESS.findall(text)]:
            parts = module.split(".")
            if parts[0] not in OURS or module.endswith(".") or any(x.startswith("_") for x in parts):
                continue  # another project's, a placeholder (benchmarks.<name>), or internal
            words = _strip_comment(rest)[0].split()
            sub = words[0] if words and re.fullmatch(r"[a-z][a-z-]*", words[0]) else ""
            options = {re.match(r"--[\w-]+", w.lstrip("["))[0] for w in words
                       if re.match(r"--[\w-]+", w.lstrip("["))}
            found.setdefault((module, sub), set()).update(options)
    return found


DOCUMENTED = documented_invocations()


#: asks every documented command for its --help in one Python (a process per command
#: cost a second each): argv in, {"module sub": [exit code, what it printed]} out as JSON
HELP_ALL = """
import contextlib, io, json, runpy, sys
said = {}
for module, sub in json.loads(sys.argv[1]):
    sys.argv = [module, *([sub] if sub else []), "--help"]
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:
            code, _ = 1, out.write(f"{type(e).__name__}: {e}")
    said[f"{module} {sub}"] = [code, out.getvalue()]
sys.__stdout__.write(json.dumps(said))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, list]:
    done = subprocess.run([sys.executable, "-c", HELP_ALL, json.dumps(sorted(DOCUMENTED))], cwd=ROOT,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module, sub", sorted(DOCUMENTED), ids=lambda x: x or "-")
def test_documented_options_exist(module, sub, helps):
    code, text = helps[f"{module} {sub}"]
    command = shlex.join(["python", "-m", module, *([sub] if sub else []), "--help"])
    assert code == 0, f"{command} exited {code}:\n{text[-3000:]}"
    unknown = sorted(o for o in DOCUMENTED[module, sub] if o not in text)
    assert not unknown, f"the pages give `python -m {module} {sub}` {unknown}, which its --help " \
                        f"does not know:\n{text}"
