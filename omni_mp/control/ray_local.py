"""A local multi-node Ray cluster on this machine (several raylets, all on loopback), to try
`placement: ray` without other hosts: the tests, `benchmarks/ray_two_nodes.py` and the
docs/multinode.md's one-machine recipe use it. Node i gets the custom resource `node_<letter>` (node_a
is the head), so a stage can be pinned with `ray_resources: {node_b: 0.01}`."""

from __future__ import annotations

import os
import string
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def local_cluster(nodes: int = 2, cpus_per_node: int = 2) -> Iterator[Any]:
    """A `ray.cluster_utils.Cluster`; shut down (with any driver connection) on exit."""
    # Every Ray process on loopback: otherwise Ray swaps 127.0.0.1 for the host's outward
    # address (a local cluster must not talk over the network). Read when ray is imported.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    if ray_constants.ENABLE_RAY_CLUSTER:  # ray was imported before the variable was set
        raise RuntimeError(
            "local_cluster: set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before ray is first imported "
            "(vLLM imports it): otherwise the driver connects to the host's outward address"
        )

    local = {"node_ip_address": "127.0.0.1", "include_dashboard": False, "num_cpus": cpus_per_node}
    cluster = Cluster(initialize_head=True, head_node_args={**local, "resources": {"node_a": 1}})
    try:
        for i in range(1, nodes):
            cluster.add_node(**local, resources={f"node_{string.ascii_lowercase[i]}": 1})
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
