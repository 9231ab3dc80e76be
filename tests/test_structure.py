"""The package's shape, checked from the source: the rules docs/internals.md states.

- No import circle between nmtkit's packages (a package is a folder under nmtkit/, or a
  top-level module): every import, lazy ones inside functions included, points down.
- No function over 60 lines.
- The backend-neutral front (`Translator`, `generate`, the registry) and the CTranslate2 engine
  import no torch: an export directory is translated without loading it (measured in a fresh
  process in test_export.py).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nmtkit"
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of nmtkit."""
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def imported(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """The nmtkit modules a module imports, anywhere in its body (lazy imports included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("nmtkit")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("nmtkit"):
                found.add(mod)
                found |= {f"{mod}.{a.name}" for a in node.names}
    return found


def package_of(module: str) -> str:
    """nmtkit.generation.translator -> generation; nmtkit.io -> io; nmtkit -> nmtkit."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "nmtkit"


def package_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, f in mods.items():
        src = package_of(name)
        targets = {package_of(m) for m in imported(ast.parse(f.read_text("utf-8")), name, f.name == "__init__.py")
                   if m in mods}
        graph.setdefault(src, set()).update(t for t in targets if t not in (src, "nmtkit"))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_the_cycle_finder_finds_a_cycle_and_resolves_imports():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    tree = ast.parse("import os\nfrom nmtkit.io import read_lines\ndef f():\n    from . import forced\n"
                     "    from ..search import config\n")
    assert imported(tree, "nmtkit.generation.translator", False) == {
        "nmtkit.io", "nmtkit.io.read_lines", "nmtkit.generation", "nmtkit.generation.forced",
        "nmtkit.search", "nmtkit.search.config"}


def test_packages_import_each_other_in_one_direction_only():
    graph = package_graph()
    assert {"generation", "backends", "search", "models", "data"} <= set(graph)  # guard: the graph was read
    assert "backends" in graph["generation"] and "search" in graph["backends"]
    cycle = find_cycle(graph)
    assert cycle is None, f"import circle between packages: {' -> '.join(cycle)}"


def test_no_function_is_over_60_lines():
    long = []
    for f in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text("utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 60 lines: " + ", ".join(long)


def test_the_backend_neutral_front_imports_no_torch():
    code = ("import sys\n"
            "import nmtkit.generation.translator, nmtkit.generation.generator, nmtkit.backends.registry\n"
            "import nmtkit.backends.ctranslate2.engine, nmtkit.search.config, nmtkit.device\n"
            "import nmtkit.backends.onnx.engine, nmtkit.backends.onnx.convert, nmtkit.search.arrays\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "import nmtkit.backends.pytorch.engine\n"
            "assert 'torch' in sys.modules\n")  # guard: the check can fail
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
