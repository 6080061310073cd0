"""The architecture's rules (docs/architecture.md), checked on the source: which package may import
which, no import cycles (lazy imports included), every file under 400 lines, no dead product code."""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("autopar", "cost_models")
MAX_LINES = 400

# package -> the packages it may import (besides itself). A top-level module of autopar counts as a
# package of its own. Read downwards: each line may only use what is listed above it.
ALLOWED: dict[str, set[str]] = {
    "cost_models": set(),
    "autopar.errors": set(),
    "autopar.version": set(),
    "autopar.fileio": {"autopar.errors"},
    "autopar.fields": {"autopar.errors"},
    "autopar.argparsing": {"autopar.errors"},
    "autopar.units": {"autopar.errors"},
    "autopar.cluster": {"autopar.errors", "autopar.fileio", "autopar.fields", "cost_models"},
    "autopar.models": {"autopar.errors", "autopar.units"},
    # modelspec.hf_traced traces a transformers config's model through autopar.models' units view
    "autopar.modelspec": {"autopar.errors", "autopar.fileio", "autopar.fields", "autopar.units", "autopar.models",
                          "cost_models"},
    "autopar.plan": {"autopar.errors", "autopar.fileio", "autopar.fields", "autopar.units", "autopar.cluster",
                     "autopar.modelspec", "cost_models"},
    "autopar.estimate": {"autopar.errors", "autopar.cluster", "autopar.modelspec", "autopar.plan", "cost_models"},
    "autopar.measured": {"autopar.errors", "autopar.fields", "autopar.cluster", "autopar.modelspec", "autopar.plan"},
    "autopar.search": {"autopar.errors", "autopar.version", "autopar.cluster", "autopar.modelspec", "autopar.plan",
                       "autopar.estimate", "cost_models"},
    "autopar.runtime": {"autopar.errors", "autopar.units", "autopar.models", "autopar.plan"},
    "autopar.launch": {"autopar.errors", "autopar.fileio", "autopar.fields", "autopar.cluster", "autopar.plan"},
    "autopar.profile": {"autopar.errors", "autopar.version", "autopar.fileio", "autopar.fields", "autopar.units",
                        "autopar.cluster", "autopar.modelspec", "autopar.plan", "autopar.estimate",
                        "autopar.models", "autopar.runtime", "cost_models"},
    "autopar.report": {"autopar.errors", "autopar.cluster", "autopar.modelspec", "autopar.plan", "autopar.estimate"},
    "autopar.planned": {"autopar.errors", "autopar.cluster", "autopar.modelspec", "autopar.plan", "autopar.profile",
                        "autopar.estimate", "cost_models"},
    "autopar.calibrate": {"autopar.errors", "autopar.version", "autopar.fields", "autopar.modelspec", "autopar.plan",
                          "autopar.estimate", "autopar.measured", "autopar.profile", "autopar.planned", "cost_models",
                          "autopar.cluster"},
    "autopar.show": {"autopar.errors", "autopar.fileio", "autopar.cluster", "autopar.modelspec", "autopar.plan",
                     "autopar.estimate", "autopar.search", "autopar.report", "autopar.planned", "cost_models"},
    "autopar.export": {"autopar.errors", "autopar.version", "autopar.fileio", "autopar.modelspec", "autopar.plan",
                       "autopar.estimate", "autopar.planned", "cost_models"},
    "autopar": {"autopar.errors", "autopar.version", "autopar.runtime", "autopar.planned"},
    "autopar.cli_search": set(),  # the top, beside autopar.cli: ``autopar search`` (filled below)
    "autopar.cli": set(),  # the top: may import every package (filled below)
}
ALLOWED["autopar.cli_search"] = set(ALLOWED) - {"autopar.cli", "autopar.cli_search"}
ALLOWED["autopar.cli"] = set(ALLOWED) - {"autopar.cli"}

# Single modules a package may import beyond its row. The runtime executes the pipeline schedule tables
# whose bubble and in-flight activations the cost model reads (one generator, so the two cannot drift);
# the rest of the cost model stays out of the runtime.
NARROW: dict[str, set[str]] = {"autopar.runtime": {"cost_models.pipeline_schedules"}}

# Methods the interpreter or a library calls by name (never referenced in our own code).
HOOKS = {"forward", "ignore_aliases", "__getattr__", "extra_repr", "error"}  # error: argparse


def _files(*tops: str) -> list[Path]:
    return sorted(p for t in tops for p in (ROOT / t).rglob("*.py") if "__pycache__" not in p.parts)


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    parts = module.split(".")
    return "cost_models" if parts[0] == "cost_models" else ".".join(parts[:2])


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Product modules ``path`` imports anywhere in its body (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] in PRODUCT}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PRODUCT:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            out |= subs or {node.module}
            if len(subs) < len(node.names):
                out.add(node.module)
    return out


def _graph() -> dict[str, set[str]]:
    files = _files(*PRODUCT)
    modules = {_module(p) for p in files}
    return {_module(p): _imports(p, modules) - {_module(p)} for p in files}


def test_packages_import_only_what_the_architecture_allows():
    bad = []
    for mod, deps in _graph().items():
        pkg = _package(mod)
        assert pkg in ALLOWED, f"{pkg} is not in the architecture's table: add it (tests/test_architecture.py)"
        bad += [f"{mod} imports {d}" for d in sorted(deps) if _package(d) != pkg and _package(d) not in ALLOWED[pkg]
                and d not in NARROW.get(pkg, set())]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("top", ["autopar", "cost_models", "tests", "benchmarks", "examples"])
def test_every_file_is_under_the_size_limit(top):
    long = [f"{p.relative_to(ROOT)}: {n}" for p in _files(top) if (n := len(p.read_text().splitlines())) >= MAX_LINES]
    assert not long, f"files of {MAX_LINES}+ lines (split them by concern): {long}"


def _documented() -> set[str]:
    """Names the README and docs give users in backticks (the documented public API)."""
    text = (ROOT / "README.md").read_text() + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    parts = text.split("```")  # odd parts are fenced code blocks, even parts prose with inline code
    code = [c for i, part in enumerate(parts) for c in ([part] if i % 2 else re.findall(r"`([^`\n]+)`", part))]
    return {name for c in code for name in re.findall(r"[A-Za-z_]\w*", c)}


def test_no_dead_code_in_the_product():
    """Every function, class and method of the product is used by the product (autopar, cost_models,
    benchmarks, examples), documented for users, or a hook the interpreter/a library calls."""
    refs: collections.Counter = collections.Counter()
    defs = []
    for p in _files(*PRODUCT, "benchmarks", "examples"):
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                refs[node.id] += 1
            elif isinstance(node, ast.Attribute):
                refs[node.attr] += 1
            elif isinstance(node, ast.alias) and p.name != "__init__.py":  # a re-export alone is no use
                refs[node.name.split(".")[-1]] += 1
        if p.relative_to(ROOT).parts[0] not in PRODUCT:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defs.append((p, node.name, node.name))
            if isinstance(node, ast.ClassDef):
                defs += [(p, f"{node.name}.{f.name}", f.name) for f in node.body
                         if isinstance(f, ast.FunctionDef) and not f.name.startswith("__")]
    documented = _documented()
    dead = [f"{p.relative_to(ROOT)}: {qual}" for p, qual, name in defs
            if refs[name] == 0 and name not in documented and name not in HOOKS]
    assert not dead, "unused by the product and undocumented (delete, use or document):\n" + "\n".join(dead)
