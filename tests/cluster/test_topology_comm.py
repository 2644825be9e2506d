"""Topology groups and the communicator's byte accounting on real gloo ranks."""

import pytest
import torch

from suite.cluster import phases
from suite.cluster.comm import Communicator
from suite.cluster.recorder import Recorder
from suite.cluster.topology import build_topology, check_layout, discover_gpus_per_node
from suite.errors import BenchError
from tests.support.distributed import run_each

S = 4096  # bytes of a 1024-float tensor


def topology_worker(rank):
    topo = build_topology(gpus_per_node=2)
    return {
        "node": topo.node,
        "local_rank": topo.local_rank,
        "is_leader": topo.is_leader,
        "intra": topo.intra.ranks,
        "inter": None if topo.inter is None else topo.inter.ranks,
        "peers": topo.peers.ranks,
        "leaders": topo.leaders,
        "nodes": topo.num_nodes,
    }


def test_two_nodes_of_two(runs):
    out = runs["topology"]
    assert [o["node"] for o in out] == [0, 0, 1, 1]
    assert [o["local_rank"] for o in out] == [0, 1, 0, 1]
    assert [o["is_leader"] for o in out] == [True, False, True, False]
    assert [o["intra"] for o in out] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [o["inter"] for o in out] == [(0, 2), None, (0, 2), None]
    assert [o["peers"] for o in out] == [(0, 2), (1, 3), (0, 2), (1, 3)]
    assert all(o["leaders"] == [0, 2] and o["nodes"] == 2 for o in out)


def test_layout_must_divide():
    assert check_layout(8, 4) == 2
    with pytest.raises(BenchError, match="not divisible"):
        check_layout(6, 4)


#: the phase every collective of the byte-accounting check is recorded under
X = phases.ALLREDUCE


def comm_worker(rank):
    topo = build_topology(gpus_per_node=2)
    rec = Recorder(rank, torch.device("cpu"))
    comm = Communicator(topo, rec, torch.device("cpu"))
    results = {}

    def measure(name, fn):
        rec.begin_iteration(0)
        value = fn()
        row = rec.end_iteration()
        results[name] = (row["bytes_intra"], row["bytes_inter"], value)

    t = lambda: torch.full((1024,), float(rank + 1))  # noqa: E731
    measure("ar_intra", lambda: comm.all_reduce(t(), topo.intra, phase=X)[0].item())
    measure(
        "ar_inter",
        lambda: comm.all_reduce(t(), topo.inter, phase=X)[0].item() if topo.inter else None,
    )
    measure("ar_world", lambda: comm.all_reduce(t(), topo.world, phase=X)[0].item())
    measure("ag_world", lambda: comm.all_gather(t(), topo.world, phase=X)[:, 0].tolist())
    measure("ag_intra", lambda: comm.all_gather(t(), topo.intra, phase=X)[:, 0].tolist())
    measure(
        "bc_intra",
        lambda: comm.broadcast(t(), topo.intra, src=topo.intra.ranks[0], phase=X)[0].item(),
    )
    measure("bc_world", lambda: comm.broadcast(t(), topo.world, src=0, phase=X)[0].item())
    return results


def test_byte_accounting_matches_ring_formulas(runs):
    out = runs["comm"]
    total = lambda key, link: sum(o[key][0 if link == "intra" else 1] for o in out)  # noqa: E731
    # values are right
    assert [o["ar_intra"][2] for o in out] == [3, 3, 7, 7]
    assert [o["ar_inter"][2] for o in out] == [4, None, 4, None]
    assert all(o["ar_world"][2] == 10 for o in out)
    assert all(o["ag_world"][2] == [1, 2, 3, 4] for o in out)
    # intra all-reduce, n=2: each rank sends 2(n-1)/n S = S, all on intra links
    assert total("ar_intra", "intra") == 4 * S and total("ar_intra", "inter") == 0
    # leaders' all-reduce, n=2 nodes: each leader sends S across nodes; followers nothing
    assert total("ar_inter", "inter") == 2 * S and total("ar_inter", "intra") == 0
    # flat ring over 4 ranks on 2 nodes: per rank 1.5 S; edges 1->2 and 3->0 cross nodes
    assert total("ar_world", "inter") == 2 * 1.5 * S
    assert total("ar_world", "intra") == 2 * 1.5 * S
    assert out[1]["ar_world"][1] == 1.5 * S and out[0]["ar_world"][1] == 0
    # all-gather of an S piece over 4 ranks: each sends 3 pieces
    assert total("ag_world", "inter") == 2 * 3 * S and total("ag_world", "intra") == 2 * 3 * S
    assert total("ag_intra", "intra") == 4 * 1 * S
    # broadcast: a chain from the root; n-1 transfers of S
    assert total("bc_intra", "intra") == 2 * S and total("bc_intra", "inter") == 0
    assert total("bc_world", "intra") + total("bc_world", "inter") == 3 * S
    assert total("bc_world", "inter") == 1 * S  # chain 0->1->2->3 crosses once


def test_nodes_discovered_from_hostnames():
    assert discover_gpus_per_node(["a", "a", "b", "b"]) == 2
    assert discover_gpus_per_node(["a"] * 4) == 4
    with pytest.raises(BenchError, match="equal contiguous blocks"):
        discover_gpus_per_node(["a", "b", "a", "b"])
    with pytest.raises(BenchError, match="equal contiguous blocks"):
        discover_gpus_per_node(["a", "a", "a", "b"])


@pytest.fixture(scope="module")
def runs():
    """Both runs this file checks, on one set of 4 ranks."""
    return run_each(4, {"topology": (topology_worker, ()), "comm": (comm_worker, ())})
