"""The search package's shape: one dispatcher (run.py), planners that never call back into it, a
result type both planners share, and an import graph without cycles or function-level imports."""

import ast
from pathlib import Path

import pytest

from autopar.search import SearchOptions, search
from autopar.search.hetero import baselines as hetero_baselines
from autopar.search.hetero.driver import search_heterogeneous
from autopar.search.homogeneous import search_homogeneous
from autopar.search.result import HETEROGENEOUS, HOMOGENEOUS, SearchResult
from tests.search.hetero.hetlib import PARAMS, mixed
from tests.search.tiny import gpt_like, small_cluster

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ROOT / "autopar" / "search"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _search_imports(path: Path) -> tuple[set[str], list[str]]:
    """(autopar.search modules imported at module level, those imported inside a function or class)."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    found, nested = set(), []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autopar.search"):
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("autopar.search")]
        for name in names:
            (found.add(name) if id(node) in top else nested.append(f"{name} (line {node.lineno})"))
    return found, nested


def _graph() -> dict[str, set[str]]:
    return {_module(p): _search_imports(p)[0] for p in sorted(SEARCH.rglob("*.py"))}


def test_no_function_level_imports_of_search_modules():
    for path in sorted(SEARCH.rglob("*.py")):
        assert _search_imports(path)[1] == [], f"{path.name} imports a search module lazily"


def test_search_modules_import_no_cycle():
    graph = _graph()
    done: set[str] = set()

    def visit(mod: str, stack: list[str]) -> None:
        assert mod not in stack, "import cycle: " + " -> ".join(stack[stack.index(mod):] + [mod])
        if mod in done:
            return
        for dep in graph.get(mod, ()):
            # a package's own __init__ is Python's loading order, not a dependency of its modules
            if not mod.startswith(dep + "."):
                visit(dep, stack + [mod])
        done.add(mod)

    for mod in graph:
        visit(mod, [])


def test_only_run_dispatches_and_nothing_calls_back_into_it():
    graph = _graph()
    importers = {m for m, deps in graph.items() if "autopar.search.run" in deps}
    assert importers == {"autopar.search"}, "only the package re-exports search()"
    planners = {"autopar.search.hetero.driver", "autopar.search.homogeneous"}
    both = {m for m, deps in graph.items() if planners <= deps}
    assert both == {"autopar.search.run"}
    assert "autopar.search.homogeneous" in graph["autopar.search.hetero.baselines"]


def test_both_planners_return_the_same_result_type():
    mdl, o = gpt_like(blocks=2), SearchOptions(params=PARAMS)
    homo = search_homogeneous(mdl, small_cluster(1, 2), 4, o, with_baselines=False)
    het = search_heterogeneous(mdl, mixed(), 4, o, with_baselines=False)
    for res, planner in ((homo, HOMOGENEOUS), (het, HETEROGENEOUS)):
        assert type(res) is SearchResult
        assert res.planner == planner == res.plan.search["planner"]
        assert res.pruned == res.plan.search["pruned"] and res.candidates > 0


@pytest.mark.parametrize("homogeneous", [True, False])
def test_front_door_dispatches_on_the_cluster(homogeneous):
    cluster = small_cluster(1, 2) if homogeneous else mixed()
    res = search(gpt_like(blocks=2), cluster, 4, SearchOptions(params=PARAMS), with_baselines=False)
    assert res.planner == (HOMOGENEOUS if homogeneous else HETEROGENEOUS)


def test_heterogeneous_baselines_call_the_homogeneous_planner(monkeypatch):
    calls = []

    def spy(*args, **kw):
        calls.append(args[1].is_homogeneous)
        return search_homogeneous(*args, **kw)

    monkeypatch.setattr(hetero_baselines, "search_homogeneous", spy)
    res = search(gpt_like(blocks=2), mixed(), 4, SearchOptions(params=PARAMS))
    assert res.planner == HETEROGENEOUS and calls and all(calls)
