"""``with_links``: the one path measured links (a profile's intra-node link, a calibration's nccl-tests
links) take onto a cluster."""

from __future__ import annotations

import pytest

from autopar.cluster.parse import cluster_from_doc, load_cluster
from autopar.errors import AutoparError
from autopar.profile.apply import with_links


def test_links_replace_every_node_fabric_and_the_network():
    c = load_cluster("2x4xA100-80G")
    got = with_links(c, {"bw_gbps": 40.0, "lat_us": 7.0}, {"bw_gbps": 90.0, "lat_us": 2.5})
    assert [(nd.intra_bw_gbps, nd.intra_lat_us, nd.count) for nd in got.nodes] == [(40.0, 7.0, 4)] * 2
    assert (got.inter_bw_gbps, got.inter_lat_us, got.name) == (90.0, 2.5, c.name)
    same = with_links(c)
    assert same.to_dict() == c.to_dict()


def test_one_network_link_onto_a_cluster_of_link_matrices_is_refused():
    c = cluster_from_doc({"spec": "2x4xA100-80G", "bw_matrix_gbps": [[0, 10], [10, 0]]}, name="m")
    with pytest.raises(AutoparError, match=r"^calibration.communication.inter_link: .* gives a matrix"):
        with_links(c, None, {"bw_gbps": 90.0, "lat_us": 2.5})
    assert with_links(c, {"bw_gbps": 40.0, "lat_us": 7.0}).bw_matrix_gbps == [[0, 10], [10, 0]]
