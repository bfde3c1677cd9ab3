"""The shape of the code: no import cycles among the project's modules nor among its
packages (imports inside functions count too), ``launcher`` below ``apgas`` (it
imports nothing of it), and no module outside ``apgas`` reaching into the runtime's
private modules (``apgas.lowlevel`` is the supported face)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("apgas", "glb", "launcher", "apgas_scheduler", "benchmarks")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside ``if TYPE_CHECKING:`` (imports for annotations only, never run)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(name: str, path: Path, known: dict[str, Path], annotations: bool = False) -> set[str]:
    """The project modules ``name`` imports (at module level or in functions), and
    with ``annotations`` those it names under ``if TYPE_CHECKING:`` too."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if not annotations and _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                prefix = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(prefix + ([node.module] if node.module else []))
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            candidates = submodules if node.module is None and submodules else [base, *submodules]
        for target in candidates:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
    return targets


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_function_level_imports_count(tmp_path):
    """An import inside a function runs too, later: it is an edge like any other."""
    path = tmp_path / "late.py"
    path.write_text("def f():\n    from apgas.protocol import check_host\n    return check_host\n")
    known = {"late": path, "apgas": ROOT / "apgas", "apgas.protocol": ROOT / "apgas" / "protocol.py"}
    assert imports("late", path, known) == {"apgas.protocol"}


def package_graph() -> dict[str, set[str]]:
    """Which top-level packages each one imports: importing any of a package's modules
    runs the package's ``__init__`` first, so a cycle here is a cycle at import time
    even when no two modules import each other."""
    known = modules()
    graph: dict[str, set[str]] = {package: set() for package in PACKAGES}
    for name, path in known.items():
        graph[name.split(".")[0]] |= {target.split(".")[0] for target in imports(name, path, known)}
    return {package: targets - {package} for package, targets in graph.items()}


def test_no_import_cycles_among_packages():
    assert cycles(package_graph()) == []


def test_launcher_imports_nothing_of_apgas():
    """The lower layer: ``apgas`` imports ``launcher`` on its way in, so a ``launcher``
    module that imports ``apgas`` (even in a function) runs back up into a package
    that is half imported."""
    known = modules()
    reaching = sorted(f"{name} -> {target}" for name, path in known.items()
                      if name.split(".")[0] == "launcher"
                      for target in imports(name, path, known) if target.split(".")[0] == "apgas")
    assert reaching == []


def test_only_apgas_imports_its_private_modules():
    known = modules()
    reaching = sorted(
        f"{name} -> {target}"
        for name, path in known.items() if not name.startswith("apgas")
        for target in imports(name, path, known)
        if target.startswith("apgas.") and target.split(".")[1].startswith("_"))
    assert reaching == [], "use apgas.lowlevel (or add what is missing there)"


def test_the_ready_line_is_written_only_in_the_protocol_module():
    """Nor in the examples, which plugin writers copy."""
    paths = [*modules().values(), *sorted((ROOT / "examples").glob("*.py"))]
    found = sorted(str(path.relative_to(ROOT)) for path in paths
                   if "APGAS-Ready" in path.read_text()
                   and path != ROOT / "apgas" / "protocol.py")
    assert found == [], "build and parse the protocol's lines with apgas.protocol"


SCHEDULER_ROOT = {"__init__", "__main__", "_model", "engine", "_nodes", "stats", "metrics", "jobs",
                  "client"}  # _nodes: the engine's node pool (its base class)
"""What every part of the scheduler shares; everything else lives in a part."""

SCHEDULER_PARTS = {"policies": {"policies"}, "sim": {"policies", "sim"},
                   "live": {"policies", "live"}, "slurm": {"policies", "slurm"},
                   "elastisim": {"policies", "elastisim"}}
"""Which parts each part may import: policies only themselves (and the root), the
simulator and the daemon the policies but never each other."""


def test_the_scheduler_package_has_the_shape_of_its_architecture():
    pkg = ROOT / "apgas_scheduler"
    root = {p.stem for p in pkg.glob("*.py")}
    assert root == SCHEDULER_ROOT, "a module of one part belongs in its part's package"
    parts = {p.name for p in pkg.iterdir() if (p / "__init__.py").exists()}
    assert parts == set(SCHEDULER_PARTS)
    known = modules()
    wrong = []
    for name, path in known.items():
        part = name.split(".")[1] if name.count(".") >= 1 else ""
        if not name.startswith("apgas_scheduler.") or part not in SCHEDULER_PARTS:
            continue
        for target in imports(name, path, known):
            if target.startswith("apgas_scheduler.") and target.count(".") >= 1:
                other = target.split(".")[1]
                if other in SCHEDULER_PARTS and other not in SCHEDULER_PARTS[part]:
                    wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_the_scheduler_root_imports_no_part_but_the_policies_and_the_event_log():
    """The engine, the model and the metrics sit below the parts: they may use the
    policies' base class and read the daemon's event log, nothing else of a part."""
    known = modules()
    allowed = {"apgas_scheduler.policies.planning", "apgas_scheduler.live.state",
               "apgas_scheduler.live.access"}
    wrong = sorted(f"{name} -> {target}" for name, path in known.items()
                   if name.startswith("apgas_scheduler") and name.count(".") <= 1
                   and name.split(".")[-1] in SCHEDULER_ROOT - {"__main__"}
                   for target in imports(name, path, known)
                   if target.count(".") >= 2 and target not in allowed)
    assert wrong == []


APGAS_PARTS = {"_core": "the runtime core", "_malleability": "malleability",
               "serving": "the daemon utilities", "_timeline": "the timeline", "arrays": "the distributed arrays",
               "dist": "the arrays' old name, deprecated"}
"""The folders of ``apgas``: each one part of the architecture (docs/design.md)."""

MALLEABILITY = ("apgas._malleability", "apgas.malleable", "apgas.order", "apgas.evolving",
                "apgas.ejs", "apgas.protocol", "apgas.auth")
"""Malleability: the private folder and the public modules it shows."""


def test_apgas_has_its_parts_in_folders_and_few_modules_beside_them():
    pkg = ROOT / "apgas"
    top = sorted(p.name for p in pkg.glob("*.py"))
    assert len(top) <= 16, f"{len(top)} modules directly in apgas/: {top}"
    folders = {p.name for p in pkg.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(APGAS_PARTS)


def test_the_core_names_nothing_above_it():
    """Malleability builds on the core, never the other way round: the core imports
    (even for annotations, under TYPE_CHECKING) only itself, the timeline it writes,
    and ``apgas.errors``."""
    known = modules()
    wrong = []
    for name, path in known.items():
        if not name.startswith("apgas._core"):
            continue
        for target in imports(name, path, known, annotations=True):
            if target.startswith("apgas") and not target.startswith(
                    ("apgas._core", "apgas._timeline", "apgas.errors")):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_the_parts_folders_run_nothing_on_import():
    """A private part's ``__init__`` is a docstring: importing one module of a part
    then imports nothing else of it, so the parts stay free of cycles."""
    for part in ("_core", "_malleability", "_timeline"):
        tree = ast.parse((ROOT / "apgas" / part / "__init__.py").read_text())
        assert [type(n).__name__ for n in tree.body] == ["Expr"], part


def test_lowlevel_is_the_runtimes_face_alone():
    """``apgas.lowlevel`` holds runtime hooks; the daemon utilities live in
    ``apgas.serving``, which needs no runtime and imports nothing of the core."""
    import apgas.lowlevel
    import apgas.serving

    assert not set(apgas.lowlevel.__all__) & set(apgas.serving.__all__)
    known = modules()
    for name, path in known.items():
        if name.startswith("apgas.serving"):
            assert {t for t in imports(name, path, known, annotations=True)
                    if t.startswith("apgas") and not t.startswith("apgas.serving")} == set(), name
    lowlevel = imports("apgas.lowlevel", known["apgas.lowlevel"], known, annotations=True)
    assert not any(t.startswith("apgas.serving") for t in lowlevel)


def test_no_cycle_inside_apgas_even_for_annotations():
    """The runtime core and malleability can be read apart: no two modules of ``apgas``
    name each other, not even under TYPE_CHECKING (``apgas.arrays``'s modules name the
    array of their package's face, which is theirs)."""
    known = {n: p for n, p in modules().items() if n == "apgas" or n.startswith("apgas.")}
    graph = {n: {t for t in imports(n, p, known, annotations=True) if t in known} for n, p in known.items()}
    found = [c for c in cycles(graph) if not all(m.startswith("apgas.arrays") for m in c)]
    assert found == []
