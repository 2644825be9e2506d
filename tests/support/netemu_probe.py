"""A rank of the wire-truth test: the hierarchical all-reduce of a 16 MiB buffer through the
suite's communicator on emulated nodes, with the node's wire counters read around it."""

import json
import sys

import torch
import torch.distributed as dist

from suite.cluster.comm import Communicator
from suite.cluster.netemu import INTERFACE
from suite.cluster.recorder import Recorder
from suite.cluster.topology import build_topology
from suite.cluster.wire import WireCounters


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    topo = build_topology(2)
    recorder = Recorder(topo.rank, torch.device("cpu"))
    comm = Communicator(topo, recorder, torch.device("cpu"))
    buffer = torch.ones(4 * 2**20)  # 16 MiB of fp32
    wire = WireCounters(INTERFACE) if topo.local_rank == 0 else None
    dist.barrier()
    if wire:
        wire.start()
    recorder.begin_iteration(0)
    comm.all_reduce(buffer, topo.intra, phase="intra_allreduce")
    if topo.inter is not None:
        comm.all_reduce(buffer, topo.inter, phase="inter_allreduce")
    comm.broadcast(buffer, topo.intra, src=topo.intra.ranks[0], phase="broadcast")
    row = recorder.end_iteration()
    sent = wire.stop()["wire_tx_bytes"] if wire else 0.0
    totals = torch.tensor([row["bytes_inter"], sent], dtype=torch.float64)
    dist.all_reduce(totals)
    if topo.rank == 0:
        expected = float(buffer[0])  # 4 ranks of ones: 4
        result = {"recorded": totals[0].item(), "wire": totals[1].item(), "value": expected}
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
