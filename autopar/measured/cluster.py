"""A measured file's ``cluster`` block into the Cluster one case ran on.

Nodes are ``{gpu, count, repeat, intra_bw_gbps}`` (GB/s) plus a top-level ``inter_bw_gbps``. GPU names
go through the catalogue; a null bandwidth takes the catalogue's default for the GPU's node class (and
the notes say which). With one node type the case's device count decides the nodes: ``repeat: null``
(or a node larger than the run) means as many full nodes as the run needs, plus one partial node. With
several node types the nodes must hold exactly the run's devices.
"""

from __future__ import annotations

from autopar.cluster import catalogue
from autopar.cluster.cluster import Cluster
from autopar.cluster.parse import cluster_from_doc
from autopar.errors import AutoparError
from autopar.fields import Fields, as_list, as_str

NODE_KEYS = ("gpu", "count", "repeat", "intra_bw_gbps", "inter_bw_gbps")


class UnknownGPU(AutoparError):
    """A node names a GPU the catalogue does not know (the case is skipped, or raised when strict)."""


def _nodes(f: Fields) -> list[Fields]:
    raw = as_list(f.raw("nodes", what="a list of nodes"), f.at("nodes"), nonempty=True)
    return [Fields(n, f"{f.at('nodes')}[{i}]", kind="node", keys=NODE_KEYS) for i, n in enumerate(raw)]


def cluster_for_case(block: object, world: int, where: str) -> tuple[Cluster, list[str]]:
    """(Cluster of ``world`` devices, notes) from the file's ``cluster`` block; errors name ``where``."""
    f = Fields(block, where, kind="cluster")
    nodes = _nodes(f)
    notes: list[str] = []
    out = []
    for nf in nodes:
        name = as_str(nf.raw("gpu", what="a GPU name"), nf.at("gpu"))
        canonical = catalogue.lookup(name)
        if canonical is None:
            raise UnknownGPU(nf.at("gpu"), f"unknown GPU type {name!r}",
                             "add it to autopar/cluster/catalogue.yaml (with sourced figures) or name a catalogue GPU")
        count = nf.req_int("count", low=1)
        repeat = nf.opt_int("repeat", None, low=1)
        node = {"gpu": canonical, "count": count, "repeat": repeat}
        intra = nf.opt_num("intra_bw_gbps", None, gt=0)
        if intra is None:
            default = catalogue.node_defaults(catalogue.gpu(canonical)).intra_bw_gbps
            notes.append(f"{nf.at('intra_bw_gbps')} null: catalogue default {default:g} GB/s for {canonical}")
        else:
            node["intra_bw_gbps"] = intra
        out.append(node)
    if len(out) == 1:
        count = out[0]["count"]
        full, rest = divmod(world, count)
        out[0]["repeat"] = full
        out = ([out[0]] if full else []) + ([{**out[0], "count": rest, "repeat": 1}] if rest else [])
    else:
        if any(n["repeat"] is None for n in out):
            raise AutoparError(f.at("nodes"), "a node of a mixed cluster has no repeat", "give every node its repeat")
        total = sum(n["count"] * n["repeat"] for n in out)
        if total != world:
            raise AutoparError(f.at("nodes"), f"hold {total} GPUs but the case runs on {world} (pp x tp x cp x dp)",
                               "make the nodes' count x repeat add up to the case's devices")
    doc = {"nodes": [{k: v for k, v in n.items() if v is not None} for n in out]}
    inter = f.opt_num("inter_bw_gbps", None, gt=0)
    if inter is not None:
        doc["inter_bw_gbps"] = inter
    elif len(doc["nodes"]) > 1 or doc["nodes"][0].get("repeat", 1) > 1:
        defaults = [catalogue.node_defaults(catalogue.gpu(n["gpu"])).inter_bw_gbps for n in out]
        notes.append(f"{f.at('inter_bw_gbps')} null: catalogue default {min(defaults):g} GB/s")
    return cluster_from_doc(doc, f.opt_str("description", "") or None, where), notes
