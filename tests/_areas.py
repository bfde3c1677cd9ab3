"""Areas of the suite, and the developer's loop: ``pytest --changed``.

Every test carries one area marker, from its module's name (:data:`AREAS`), so
``pytest -m glb`` runs the GLB tests. ``pytest --changed`` runs the areas of
what changed since the last commit (``--changed=REF``: since ``REF``, such as
``origin/main``), by the table :data:`SOURCES` of which sources each area tests,
plus every test module that changed itself. A change to the suite's own
machinery (``conftest.py``, ``_leaks.py``) selects everything.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

__all__ = ["AREAS", "SOURCES", "area_of", "changed_files", "areas_of"]

ROOT = Path(__file__).resolve().parent.parent

#: area: the test modules' name prefixes (under tests/; the first match wins)
AREAS: dict[str, tuple[str, ...]] = {
    "security": ("security/",),
    "bench": ("test_bench_",),
    "slurm": ("test_slurm_", "test_launcher_srun", "test_scheduler_containment", "test_scheduler_live"),
    "scheduler": ("test_scheduler_", "test_dmr_workload", "test_traces", "test_eval_published",
                  "test_ejs_", "test_dashboard", "test_pool"),
    "glb": ("test_glb", "test_synthetic", "test_apps_layout"),
    "launcher": ("test_launcher", "test_run_hosts", "test_cross_host", "test_vcluster", "test_supervisor",
                 "test_process_titles", "test_heartbeat"),
    "elastic": ("test_steps", "test_arrays", "test_evolving", "test_malleability", "test_place_lost",
                "test_communicator_plugin", "test_timeline", "test_chaos"),
    "docs": ("test_docs", "test_dependency_docs", "test_static_checks", "test_layout", "test_module_size",
             "test_wheel_contents", "test_without_services", "test_error_messages"),
    "core": ("test_",),
}

#: source path prefix (from the checkout's root): the areas that test it
SOURCES: dict[str, tuple[str, ...]] = {
    "apgas/serving/": ("security", "scheduler"),
    "apgas/auth": ("security", "core"),
    "apgas/": ("core", "elastic"),
    "glb/": ("glb",),
    "launcher/": ("launcher",),
    "apgas_scheduler/slurm": ("slurm",),
    "apgas_scheduler/": ("scheduler", "security"),
    "benchmarks/": ("bench",),
    "docs/": ("docs",),
    "examples/": ("docs",),
    "README.md": ("docs",),
    "pyproject.toml": ("docs",),
    "tests/_slurm.py": ("slurm",),
    "tests/_sshd.py": ("launcher",),
    "tests/vcluster.py": ("launcher",),
    "tests/_bench_helpers.py": ("bench",),
    "tests/_browser.py": ("scheduler",),
    "tests/conftest.py": tuple(AREAS),
    "tests/_leaks.py": tuple(AREAS),
    "tests/_areas.py": tuple(AREAS),
    "tests/orders.py": tuple(AREAS),
}


def area_of(module: str) -> str:
    """The area of a test module, by its path under tests/ (``security/test_x.py``)."""
    name = module.split("tests/", 1)[-1]
    return next(area for area, prefixes in AREAS.items() if name.startswith(prefixes))


@functools.cache  # asked by the report's header and by the selection: git runs once
def changed_files(since: str) -> list[str]:
    """Paths (from the root) that differ from commit ``since``, untracked ones included."""
    def git(*args: str) -> list[str]:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        if done.returncode:
            raise pytest.UsageError(f"--changed={since}: git {' '.join(args)} failed: "
                                    f"{done.stderr.strip()}")
        return done.stdout.splitlines()

    return sorted({*git("diff", "--name-only", since), *git("ls-files", "--others", "--exclude-standard")})


def areas_of(paths: list[str]) -> set[str]:
    """The areas that test any of ``paths`` (:data:`SOURCES`; a test module is its own)."""
    found: set[str] = set()
    for path in paths:
        for prefix, areas in SOURCES.items():
            if path.startswith(prefix):
                found.update(areas)
                break
    return found


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--changed", nargs="?", const="HEAD", default=None, metavar="REF",
                     help="run only the tests of the areas whose sources changed since REF "
                          "(default HEAD: the uncommitted changes), and changed test modules")


def pytest_configure(config: pytest.Config) -> None:
    for area in AREAS:
        config.addinivalue_line("markers", f"{area}: the tests of the {area} area (tests/_areas.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(getattr(pytest.mark, area_of(item.nodeid.split("::", 1)[0])))
    since = config.getoption("changed")
    if since is None:
        return
    paths = changed_files(since)
    areas = areas_of(paths)
    modules = {path for path in paths if path.startswith("tests/") and Path(path).name.startswith("test_")}
    keep, drop = [], []
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        (keep if area_of(module) in areas or module in modules else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_report_header(config: pytest.Config) -> str | None:
    since = config.getoption("changed")
    if since is None:
        return None
    paths = changed_files(since)
    return (f"--changed={since}: {len(paths)} file(s) changed; areas "
            f"{', '.join(sorted(areas_of(paths))) or 'none'} and the changed test modules")
