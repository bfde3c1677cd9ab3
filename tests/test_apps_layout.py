"""The applications are a package of their own (``glb.apps``), the measurement harnesses
a folder of their own (``benchmarks``): the runtime and GLB run without numpy and numba,
``glb.apps`` says which extra it needs, and imports cross these borders only through
public modules."""

from __future__ import annotations

import subprocess
import sys

from test_layout import ROOT, imports, modules

MAX_LINES = 510   # about 500
#: modules longer than MAX_LINES, each of which must say at its top ("One module: ...") why
LONG: set[str] = {"glb._worker"}


def _private(module: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in module.split("."))


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_runtime_and_glb_import_neither_numpy_nor_numba():
    code = ("import glb, apgas, launcher; from glb import GLB; import sys; "
            "assert 'numba' not in sys.modules and 'numpy' not in sys.modules, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'numpy'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_the_apps_without_numba_name_the_extra():
    code = "import sys; sys.modules['numba'] = None; from glb.apps import uts"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 1
    assert 'ModuleNotFoundError: glb.apps needs numba' in proc.stderr
    assert 'pip install "apgas[apps]"' in proc.stderr


def test_imports_cross_the_borders_only_through_public_modules():
    known = modules()
    wrong = []
    for name, path in known.items():
        for target in imports(name, path, known):
            if _inside(name, "glb.apps"):
                # the apps use GLB's public face and their own package, never a harness
                if target.startswith("benchmarks") or (_inside(target, "glb") and not _inside(target, "glb.apps")
                                                       and _private(target)):
                    wrong.append(f"{name} -> {target}")
            elif _inside(name, "glb"):
                if _inside(target, "glb.apps"):
                    wrong.append(f"{name} -> {target} (GLB must not need the apps extra)")
            elif _inside(target, "glb.apps") and _private(target):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_benchmarks_holds_harnesses_only():
    assert not any((ROOT / "benchmarks" / f"{app}.py").exists() for app in ("uts", "nqueens", "bc", "pi", "_app"))


def test_modules_are_short_or_say_why():
    long = {}
    for name, path in modules().items():
        if _inside(name, "glb") or _inside(name, "benchmarks"):
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                long[name] = lines
    assert set(long) <= LONG, long
    for name in LONG:
        head = (ROOT / (name.replace(".", "/") + ".py")).read_text()[:3000]
        assert "One module:" in head, f"{name} should say at its top why it is one module"
