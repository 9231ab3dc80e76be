"""The package's shape, checked from the source: the rules docs/internals.md states.

- No import circle between nmtkit's packages (a package is a folder under nmtkit/, or a
  top-level module): every import, lazy ones inside functions included, points down.
- No import circle between modules either, at any depth, lazy imports included.
- No function over 60 lines.
- The backend-neutral front (`Translator`, `generate`, the registry) and the CTranslate2 engine
  import no torch: an export directory is translated without loading it (measured in a fresh
  process in test_export.py).
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from nmtkit.search.config import SearchConfig

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


def module_graph() -> dict[str, set[str]]:
    """Module -> the nmtkit modules it imports (lazy imports inside functions included)."""
    mods = modules()
    return {name: {m for m in imported(ast.parse(f.read_text("utf-8")), name, f.name == "__init__.py")
                   if m in mods and m != name}
            for name, f in mods.items()}


def test_modules_import_each_other_in_one_direction_only():
    graph = module_graph()
    assert "nmtkit.backends.onnx.engine" in graph["nmtkit.backends.onnx.convert"]  # guard: lazy and top imports read
    cycle = find_cycle(graph)
    assert cycle is None, f"import circle between modules: {' -> '.join(cycle)}"


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


# ---------------------------------------------------------------------------------------------
# generate's walk: the model described once, its options passed down without bouncing


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """(data directory, checkpoint of a random tiny model, raw input file)."""
    import torch

    from conftest import word_mapping_data_dir
    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models import ArchConfig, Transformer

    root = tmp_path_factory.mktemp("walk")
    data = word_mapping_data_dir(root, 40, 4, 12, 0)
    sd, td = load_dictionaries(data)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
    torch.manual_seed(0)
    model = Transformer(cfg, len(sd), len(td))
    ckpt = root / "m.pt"
    save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(), "model": model.state_dict(),
                     "dictionaries": {"src_sha256": sd.sha256, "tgt_sha256": td.sha256, "src_size": len(sd),
                                      "tgt_size": len(td), "src_lang": "de", "tgt_lang": "en"}}, ckpt)
    (root / "in.txt").write_text("w1 w2\nw3\n", encoding="utf-8")
    return data, ckpt, root / "in.txt"


def count_reads(monkeypatch) -> list[str]:
    """The names of the JSON files nmtkit reads from now on (manifests, export descriptions)."""
    import nmtkit.backends.directory as directory
    import nmtkit.data.manifest as manifest
    import nmtkit.io as nio

    reads: list[str] = []
    real = nio.read_json

    def counted(path):
        reads.append(Path(path).name)
        return real(path)

    for module in (nio, manifest, directory):
        monkeypatch.setattr(module, "read_json", counted)
    return reads


def test_generate_reads_the_data_directorys_manifest_once(tiny_model, run_cli, monkeypatch):
    data, ckpt, text = tiny_model
    reads = count_reads(monkeypatch)
    for extra in ((), ("--gen-subset", "valid"), ("--gen-subset", "valid", "--score-reference")):
        reads.clear()
        args = ("--input", text) if not extra else extra
        r = run_cli("generate", data, "--path", ckpt, *args, "--quiet", "--beam", "2", "--max-len-b", "3")
        assert r.code == 0, r.err
        assert reads == ["manifest.json"], (extra, reads)


def test_an_export_directorys_description_is_read_once(tmp_path, monkeypatch):
    from nmtkit.generation.generator import GenerateOptions
    from nmtkit.generation.model_flags import model_source
    from nmtkit.search.config import SEARCH_SETTINGS

    d = tmp_path / "exported"
    d.mkdir()
    (d / "nmtkit.json").write_text('{"format": "nmtkit-export", "format_version": 1, "runtime": {"name": "ctranslate2"}, '
                                   '"arch_config": {}, "data": {"source_lang": "de", "target_lang": "en"}}',
                                   encoding="utf-8")
    reads = count_reads(monkeypatch)
    values = {f.name: f.default for f in dataclasses.fields(GenerateOptions) if f.name not in ("search", "source")}
    values.update(paths=[str(d)], data_dir=None, input="-", search={k: None for k in ("max_len_b",)})
    search = {k: getattr(SearchConfig(), k) for k in SEARCH_SETTINGS}
    values["search"] = {**search, "max_len_b": None, "lenpen_form": None, "early_stop": None}
    opts = GenerateOptions.from_flags(values)
    opts.validate()
    assert model_source(opts) is opts.source and opts.source.export == str(d)
    assert opts.search.max_len_b == 50 and opts.search.early_stop == "beam"  # from the description and its engine
    assert reads == ["nmtkit.json"]


# The options' walk through `generate`: the runs of calls, module by module, that receive the
# options or one of their parts (paths, search settings, the model's description, data dir,
# input), as a profiler sees them on a real run. A stay is such a run in one module; a climb is
# a stay in a package above the one before (the layers of `package_graph`). Both stay small when
# things are decided once, at the top, and passed down: today 26 stays and 7 climbs for raw text
# (with or without terms), 26 and 6 for scoring a binarized split with word alignments.
MAX_STAYS, MAX_CLIMBS = 27, 7


def package_floors() -> dict[str, int]:
    """Package -> its floor: 1 for a package that imports none of the others, else one above the highest it imports."""
    graph, floors = package_graph(), {}

    def floor(p: str) -> int:
        if p not in floors:
            floors[p] = 1 + max((floor(q) for q in graph.get(p, ())), default=0)
        return floors[p]

    return {p: floor(p) for p in graph}


def walk_of_options(argv: list[str]) -> list[str]:
    """The modules, in order, whose calls receive `generate`'s options or their parts."""
    from nmtkit.cli import main

    stays: list[str] = []
    held: list = []

    def module_of(code) -> str | None:
        f = Path(code.co_filename)
        if PACKAGE not in f.parents:
            return None
        parts = f.relative_to(ROOT).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def profile(frame, event, arg):
        if event != "call" or (mod := module_of(frame.f_code)) is None:
            return
        if not held:
            if mod != "nmtkit.generation.generator" or frame.f_code.co_name != "generate":
                return
            held.append(frame.f_locals["opts"])
        opts = held[0]
        mine = {id(opts)} | {id(getattr(opts, k)) for k in ("paths", "search", "source", "data_dir", "input")
                             if getattr(opts, k, None) is not None}
        code = frame.f_code
        if any(id(frame.f_locals.get(a)) in mine for a in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]):
            if not stays or stays[-1] != mod:
                stays.append(mod)

    sys.setprofile(profile)
    try:
        main([str(a) for a in argv])
    except SystemExit as e:
        assert e.code in (0, None), e.code
    finally:
        sys.setprofile(None)
    return stays


@pytest.mark.parametrize("kind", ["text", "terms", "scored split"])
def test_generates_options_walk_down_without_bouncing(tiny_model, capsys, kind):
    data, ckpt, text = tiny_model
    terms = text.with_name("terms.txt")
    terms.write_text("w1 w2\tW1\nw3\n", encoding="utf-8")
    args = {"text": ["--input", text], "terms": ["--input", terms, "--constraints", "--print-alignment"],
            "scored split": ["--gen-subset", "valid", "--score-reference", "--print-alignment", "words"]}[kind]
    stays = walk_of_options(["generate", data, "--path", ckpt, *args, "--quiet", "--beam", "2"])
    floors = package_floors()
    climbs = [(a, b) for a, b in zip(stays, stays[1:]) if floors[package_of(b)] > floors[package_of(a)]]
    assert stays[0] == "nmtkit.generation.generator" and "nmtkit.backends.registry" in stays  # guard: followed
    assert len(stays) <= MAX_STAYS, stays
    assert len(climbs) <= MAX_CLIMBS, climbs
