"""Clusters: the GPU catalogue (YAML data), presets, inline specs and cluster files."""

from autopar.cluster.catalogue import describe_gpu, gpu, gpu_names, node_defaults
from autopar.cluster.cluster import GIB, Cluster, GPUType, Node
from autopar.cluster.parse import (
    cluster_from_doc,
    load_cluster,
    preset_description,
    preset_names,
)

__all__ = [
    "GIB",
    "Cluster",
    "GPUType",
    "Node",
    "cluster_from_doc",
    "describe_gpu",
    "gpu",
    "gpu_names",
    "load_cluster",
    "node_defaults",
    "preset_description",
    "preset_names",
]
