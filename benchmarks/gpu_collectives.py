"""The GPU collectives (all_reduce and the family) against NVSHMEM's own collectives on the
same kind of buffers and the device-to-device copy of the same bytes, in the same run.

    python -m launch -n 2 --allow-gpu-sharing benchmarks/gpu_collectives.py \
        --out results/gpu_collectives.jsonl

Every rank runs on the nvshmem backend; each point is timed with CUDA events on the World's
stream (median of ``--repeat`` calls after a warm-up; our calls include the host's read of
the status word, NVSHMEM's ``*_on_stream`` calls do not wait). Rank 0 writes one record per
(collective, bytes per rank): ``ours_us``, ``nvshmem_us`` (``nvshmem.core``'s
``collective_on_buffer`` on buffers from ``nvshmem.core.buffer``: reduce, reducescatter,
fcollect, broadcast, alltoall), ``copy_us`` (a device-to-device copy of the output's bytes:
the roofline a collective of that size cannot beat on one GPU) and the ratios
``vs_nvshmem`` (NVSHMEM's time / ours: above 1, we are faster) and ``copy_fraction``.

Several ranks on one GPU time-slice it: the figures compare implementations on the same
machine in the same run, not scaling. Reported, not asserted. Several ranks on one GPU
without the MPS daemon (NVSHMEM's LIMITED_MPG mode: the lent machine) is where NVSHMEM's
host collectives exit the process: they are refused there through the heap's guard and the
record says so (``nvshmem_error``); NVSHMEM's figures then come from a one-rank run, or from
one rank per GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness import append_jsonl, cuda_median_seconds

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")
NVSHMEM_NAME = {
    "all_reduce": "reduce",
    "reduce_scatter": "reducescatter",
    "all_gather": "fcollect",
    "broadcast": "broadcast",
    "all_to_all": "alltoall",
}


def sizes_of(name: str, per_rank: int, p: int) -> tuple[int, int]:
    """(input bytes, output bytes) of ``name`` for ``per_rank`` bytes a rank."""
    if name == "all_gather":
        return per_rank, per_rank * p
    if name == "reduce_scatter":
        return per_rank * p, per_rank
    return per_rank, per_rank


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4KiB,256KiB,4MiB,64MiB", help="bytes per rank")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--heap", default="1GiB", help="symmetric heap per rank")
    ap.add_argument("--no-nvshmem", action="store_true", help="skip NVSHMEM's collectives")
    ap.add_argument("--out", type=Path, default=Path("results/gpu_collectives.jsonl"))
    args = ap.parse_args()

    import collectives
    import shmem
    from shmem import Buffer
    from shmem.config import parse_size

    w = shmem.init(backend="nvshmem", heap_nbytes=args.heap)
    p, rank = w.world_size, w.rank
    comm = collectives.Communicator(w)
    stream = w.ctx.stream
    device = w.ctx.device
    nv: Any = None
    if not args.no_nvshmem:
        import nvshmem.core as nv_mod

        nv = nv_mod
    records = []
    for size in (parse_size(s) for s in args.sizes.split(",")):
        per_rank = size - size % (4 * p)  # whole float32 elements, and chunks for all_to_all
        for name in args.collectives.split(","):
            in_bytes, out_bytes = sizes_of(name, per_rank, p)
            x = Buffer.zeros((in_bytes // 4,), "float32", device=device)
            out = Buffer.zeros((out_bytes // 4,), "float32", device=device)
            w.barrier()
            t_ours = cuda_median_seconds(stream, _ours(comm, name, x, out), args.repeat)
            t_copy = cuda_median_seconds(
                stream, _copy(x, out, min(in_bytes, out_bytes), stream), args.repeat
            )
            rec: dict[str, Any] = {
                "bench": "gpu_collectives",
                "collective": name,
                "ranks": p,
                "bytes_per_rank": per_rank,
                "ours_us": t_ours * 1e6,
                "copy_us": t_copy * 1e6,
                "copy_fraction": t_copy / t_ours,
            }
            if nv is not None:
                rec.update(_nvshmem(nv, name, in_bytes, out_bytes, stream, args.repeat, w))
                if "nvshmem_us" in rec:
                    rec["vs_nvshmem"] = rec["nvshmem_us"] / rec["ours_us"]
            if rank == 0:
                records.append(rec)
                print(json.dumps(rec), flush=True)
            x.close()
            out.close()
    if rank == 0:
        append_jsonl(args.out, records)
    comm.close()
    w.finalize()


def _ours(comm: Any, name: str, x: Any, out: Any) -> Any:
    def run() -> Any:
        if name == "broadcast":
            return comm.broadcast(x, root=0, out=out)
        return getattr(comm, name)(x, out=out)

    return run


def _copy(x: Any, out: Any, nbytes: int, stream: Any) -> Any:
    from shmem import cuda as shmem_cuda

    def run() -> None:
        shmem_cuda.memcpy_async(out.unsafe_ptr(), x.unsafe_ptr(), nbytes, stream)

    return run


def _nvshmem(
    nv: Any, name: str, in_bytes: int, out_bytes: int, stream: Any, repeat: int, w: Any
) -> dict[str, Any]:
    """NVSHMEM's collective of the same shape, on buffers it allocated (a failure is
    reported in the record, not raised: the peer's API differs between versions). Asked for
    through the heap's guard: with several ranks on one GPU and no MPS (LIMITED_MPG, the
    lent machine) NVSHMEM's collectives exit the process, so the guard refuses them, on
    every rank alike, before any collective allocation."""
    src = dst = None
    try:
        collective = w.heap.nv("collective_on_buffer")
        src = nv.buffer(in_bytes)
        dst = nv.buffer(out_bytes)
        team = nv.Teams.TEAM_WORLD
        op = "sum" if name in ("all_reduce", "reduce_scatter") else None

        def run() -> None:
            collective(
                NVSHMEM_NAME[name], team, dst, src, dtype="float", op=op, root=0, stream=stream
            )

        w.barrier()
        return {"nvshmem_us": cuda_median_seconds(stream, run, repeat) * 1e6}
    except Exception as exc:  # reported: the comparison is missing for this point
        return {"nvshmem_error": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        stream.sync()
        for b in (dst, src):
            if b is not None:
                nv.free(b)


if __name__ == "__main__":
    main()
