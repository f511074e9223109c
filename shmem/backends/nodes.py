"""Which ranks are on which node: the node communicator a World's heap is built on (real
nodes, or nodes simulated on one machine by ``[heap] node_split``), and the ranks whose
memory MPI really shares (whatever the split says)."""

from __future__ import annotations

from typing import cast

from mpi4py import MPI

__all__ = ["host_size", "shared_ranks", "split_nodes"]


def split_nodes(comm: MPI.Intracomm, node_split: str) -> MPI.Intracomm:
    """The node communicator: ranks that share memory (``"node"``), each rank alone
    (``"rank"``), or groups of K consecutive ranks of a shared-memory node (``"K"``)."""
    if node_split == "rank":
        return cast(MPI.Intracomm, comm.Split(color=comm.Get_rank(), key=0))
    shared = cast(MPI.Intracomm, comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank()))
    if node_split == "node":
        return shared
    group = int(node_split)
    sub = cast(MPI.Intracomm, shared.Split(color=shared.Get_rank() // group, key=comm.Get_rank()))
    shared.Free()
    return sub


def shared_ranks(comm: MPI.Intracomm) -> frozenset[int]:
    """The ranks of ``comm`` whose memory MPI shares with this process (collective)."""
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    mine, every = shared.Get_group(), comm.Get_group()
    ranks = MPI.Group.Translate_ranks(mine, None, every)
    for handle in (mine, every, shared):
        handle.Free()
    return frozenset(int(r) for r in ranks)


def host_size(comm: MPI.Intracomm, node_comm: MPI.Intracomm) -> int:
    """The number of ranks of ``comm`` on this machine (collective): ``node_comm``'s size,
    or more where nodes are simulated (``node_split`` "rank" or K). By host name: MPICH's
    shared-memory split sees one rank per node under ``MPIR_CVAR_NOLOCAL``."""
    names = comm.allgather(MPI.Get_processor_name())
    return max(names.count(names[comm.Get_rank()]), node_comm.Get_size())
