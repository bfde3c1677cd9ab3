"""No module of the project passes 500 lines unless its docstring says why (issue 15)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("apgas", "glb", "launcher", "apgas_scheduler", "benchmarks", "examples")
LIMIT = 500
REASON = "Why one module"


def test_long_modules_say_why_they_are_one_module():
    unexplained = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            lines = text.count("\n")
            if lines > LIMIT and REASON not in (ast.get_docstring(ast.parse(text)) or ""):
                unexplained.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not unexplained, (f"modules over {LIMIT} lines whose docstring has no "
                             f"'{REASON} ...' paragraph: {unexplained}")
