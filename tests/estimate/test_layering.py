"""The cost model's place in the import graph: cost_models at the bottom, autopar.estimate a thin layer
on top of it, no cycles (lazy imports included), and no memo that outlives the caller who owns it."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import autopar.estimate
import cost_models
from autopar.cluster.parse import load_cluster
from autopar.estimate import CostCache, estimate_plan
from autopar.modelspec.load import load_model
from autopar.plan.schema import ModelRef, Pipeline, Plan, Stage, StageLayer, Strategy

# What the adapter may build on: the cost model and autopar's plain data (nothing that plans or runs).
ESTIMATE_MAY_IMPORT = ("cost_models", "autopar.cluster", "autopar.modelspec", "autopar.plan", "autopar.errors",
                       "autopar.estimate")


def _modules(pkg) -> list[str]:
    return [pkg.__name__] + [f"{pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]


def _imports(module: str) -> set[str]:
    """Every module ``module`` imports, at the top or inside functions."""
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def _internal_graph(modules: list[str]) -> dict[str, set[str]]:
    known = set(modules)
    return {m: {i for i in _imports(m) if i in known and i != m} for m in modules}


def _assert_acyclic(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in graph[m]:
            assert state.get(d) != 1, f"import cycle: {' -> '.join(path + [m, d])}"
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_cost_models_imports_nothing_from_autopar():
    for m in _modules(cost_models):
        bad = {i for i in _imports(m) if i.split(".")[0] == "autopar"}
        assert not bad, f"{m} imports {bad}"


def test_estimate_imports_only_downward():
    for m in _modules(autopar.estimate):
        bad = {i for i in _imports(m) if i.split(".")[0] in ("autopar", "cost_models")
               and not i.startswith(ESTIMATE_MAY_IMPORT)}
        assert not bad, f"{m} imports {bad}"


def test_no_import_cycles():
    # Submodules only: a package's __init__ re-exports (it imports its submodules, never the reverse).
    _assert_acyclic(_internal_graph(_modules(cost_models)[1:]))
    _assert_acyclic(_internal_graph(_modules(autopar.estimate)[1:]))


def _module_containers() -> dict[tuple[str, str], int]:
    out = {}
    for m in _modules(cost_models) + _modules(autopar.estimate):
        mod = importlib.import_module(m)
        for name, v in vars(mod).items():
            if isinstance(v, (dict, list, set)) and not name.startswith("__"):
                out[(m, name)] = len(v)
    return out


def test_estimates_leave_no_module_level_state():
    model = load_model("gpt-tiny")
    cluster = load_cluster("2x2xA100-80G")
    ref = ModelRef(model.name, model.seq_len, model.num_layers)
    layers = [StageLayer(ly.name, Strategy(2, 1, "selective", True) if ly.tp_ok(2) else Strategy())
              for ly in model.layers]
    plan = Plan(ref, cluster, 8, [Pipeline(4, 2, 2, [Stage([0, 1], layers)]), Pipeline(4, 2, 2, [Stage([2, 3], layers)])])
    before = _module_containers()
    cache = CostCache()
    shared = estimate_plan(plan, model, cache=cache)
    assert _module_containers() == before
    fresh = estimate_plan(plan, model)
    assert fresh.step_time_s == shared.step_time_s and fresh.memory_gib == shared.memory_gib
    assert estimate_plan(plan, model, cache=cache).step_time_s == shared.step_time_s
