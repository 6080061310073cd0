"""The pruning-rule registry: every count either planner keeps is a registered rule with a description
(so ``--explain`` never prints a blank one), the counting sites name enum members, and every
registered rule is reachable (no dead entries)."""

import ast
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from autopar.cluster.cluster import Cluster, Node
from autopar.modelspec.spec import LayerSpec, MoESpec
from autopar.plan.io import plan_to_dict
from autopar.search import SearchOptions, search
from autopar.search.homogeneous import HomogeneousSearch
from autopar.search.rules import Rule, describe, rule_counts
from tests.search.hetero.hetlib import PARAMS, mixed
from tests.search.tiny import gpt_like, small_cluster

SEARCH_DIR = Path(__file__).resolve().parents[2] / "autopar" / "search"


def rules_model():
    """A model that meets every strategy rule: 6 heads (tp 4 cannot divide them), an embedding with no
    sequence-shardable activations (sp has no effect), a unit with no TP plan and an MoE block of 3 experts
    (ep 2 or 4 cannot divide them; with tp > 1 it has no ep)."""
    m = gpt_like(blocks=4, a=6)
    embed = replace(m.layers[0], act_seq_bytes=0.0)
    norm = LayerSpec("norm", "generic", 1024, 0, 1e6, boundary_bytes=m.layers[1].boundary_bytes)
    b0 = m.layers[1]
    moe = replace(b0, moe=MoESpec(3, 1, expert_params=b0.params // 2, expert_flops=b0.flops / 4,
                                  dispatch_bytes=b0.boundary_bytes))
    return replace(m, layers=[embed, moe] + m.layers[2:-1] + [norm, m.layers[-1]])


def pcie_cluster() -> Cluster:
    """One node of 4 GPUs on PCIe (no NVLink)."""
    return Cluster([Node(replace(small_cluster().nodes[0].gpu, nvlink_gbps=0.0), 4)], name="4xpcie")


def opts(**kw) -> SearchOptions:
    return SearchOptions(params=PARAMS, **kw)


@pytest.fixture(scope="module")
def counted() -> dict[str, Counter]:
    """Pruning counts of searches that, together, trigger every rule: planner -> counts."""
    mdl = rules_model()
    homo, hetero = Counter(), Counter()
    cases = [(small_cluster(3, 4), 12, opts()),  # p = 4: 3-device stages straddle 4-device nodes; p > 6 units
             (small_cluster(2, 2), 8, opts(pp_degrees=[1, 2, 3])),  # 3 does not divide 4 devices
             (small_cluster(2, 2), 8, opts(memory_budget_gib=0.1)),  # tight: long layer ranges cannot fit
             (small_cluster(2, 2), 8, opts(cp_degrees=(2,))),  # cp 2: tp 4 x cp 2 exceeds 4 devices; no sp with cp
             (pcie_cluster(), 8, opts()),  # no NVLink: no async TP
             (small_cluster(2, 2), 8, opts(max_tp=1))]  # tp 2 and 4 above --max-tp
    for cluster, B, o in cases:
        res = search(mdl, cluster, B, o, with_baselines=False)
        assert res.plan.search["pruned"] == res.pruned  # the plan file holds the same counts
        homo.update(res.pruned)
    # Nothing fits, so search() raises; the search object still holds what it pruned on the way.
    hs = HomogeneousSearch(mdl, small_cluster(2, 2), 1, opts(memory_budget_gib=0.05))
    assert hs.run()[0] is None
    homo.update(rule_counts(hs.pruned))
    res = search(mdl, mixed(5.0, slow_nodes=2), 8, opts(), with_baselines=False)
    assert res.planner == "heterogeneous"
    hetero.update(res.pruned)
    return {"homogeneous": homo, "heterogeneous": hetero}


def test_every_counted_rule_is_registered_with_a_description(counted):
    for planner, counts in counted.items():
        assert counts, f"the {planner} search counted nothing"
        for key in counts:
            assert type(key) is str, f"{key!r}: counts leave the search as plain strings"
            assert describe(key).strip(), f"{key}: registered without a description"


def test_every_registered_rule_is_reachable(counted):
    seen = set(counted["homogeneous"]) | set(counted["heterogeneous"])
    assert seen == {r.value for r in Rule}


def test_counts_are_plain_strings_in_plan_files(counted):
    res = search(rules_model(), small_cluster(2, 2), 8, opts(), with_baselines=False)
    text = yaml.safe_dump(plan_to_dict(res.plan))  # SafeDumper refuses Enum keys
    assert "dominated" in text and "Rule" not in text


def test_unregistered_keys_are_refused():
    with pytest.raises(ValueError):
        rule_counts({"no-such-rule": 1})
    assert rule_counts({Rule.DOMINATED: 2, "tp-crosses-node": 1}) == {"dominated": 2, "tp-crosses-node": 1}
    assert str(Rule.DOMINATED) == "dominated" and f"{Rule.DOMINATED}" == "dominated"


def _pruned_subscripts(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            target = node.value
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
            if name == "pruned":
                yield node


def test_counting_sites_name_enum_members():
    sites = 0
    for path in sorted(SEARCH_DIR.rglob("*.py")):
        for node in _pruned_subscripts(ast.parse(path.read_text())):
            sites += 1
            keys = [node.slice.body, node.slice.orelse] if isinstance(node.slice, ast.IfExp) else [node.slice]
            for k in keys:
                ok = (isinstance(k, ast.Attribute) and isinstance(k.value, ast.Name) and k.value.id == "Rule"
                      and k.attr in Rule.__members__)
                assert ok, f"{path.name}:{node.lineno}: count with a Rule member, not {ast.unparse(k)}"
    assert sites >= 16
