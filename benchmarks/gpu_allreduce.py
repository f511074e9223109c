"""The GPU all-reduce kernel on one GPU, in one process that reduces P buffers it owns.

    python benchmarks/gpu_allreduce.py --out results/gpu_allreduce.jsonl

Several ranks on one GPU time-slice it, so their timings say nothing about the kernel.
Instead this runs the all-reduce kernels' reduction loop (``reduce_local_*`` in
``collectives/kernels/allreduce.cu``: rank-order accumulation, float32 for 16-bit types) over
P device buffers in one process. All peers below are timed in the same run, with CUDA events:

* ``bandwidth_fraction``: its achieved bandwidth, ``(P + 1) * bytes / t`` (P reads, one write),
  over the device-to-device copy bandwidth (``2 * bytes / t``);
* ``vs_torch``: ``torch.stack(inputs).sum(0)`` time over ours (above 1: we are faster);
* ``nvshmem_reduce``: NVSHMEM's own sum reduce with one PE over one buffer of the same size,
  and our kernel's per-byte rate relative to it.

Reported, not asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from harness import append_jsonl, cuda_median_seconds

from collectives.gpu import KERNELS, THREADS, grid_blocks
from shmem.config import parse_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--sizes", default="1MiB,16MiB,256MiB")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--no-nvshmem", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("results/gpu_allreduce.jsonl"))
    args = ap.parse_args()

    from cuda.core import Buffer as CCBuffer
    from cuda.core import Device, LaunchConfig, launch

    from shmem import cuda as shmem_cuda

    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    sms = int(dev.properties.multiprocessor_count)
    torch: Any = None
    try:
        import torch as _torch

        torch = _torch
    except ImportError:
        pass
    nv = None if args.no_nvshmem else _nvshmem_single(dev, stream)
    records = []
    for dtype in args.dtypes.split(","):
        dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
        fn = shmem_cuda.load_kernel(0, KERNELS, f"reduce_local_{dtype}_sum")
        for nbytes in (parse_size(s) for s in args.sizes.split(",")):
            n = nbytes // dt.itemsize
            copy_src = dev.allocate(nbytes, stream=stream)
            copy_dst = dev.allocate(nbytes, stream=stream)

            def d2d(a: Any = copy_src, b: Any = copy_dst, size: int = nbytes) -> None:
                shmem_cuda.memcpy_async(int(b.handle), int(a.handle), size, stream)

            t_copy = cuda_median_seconds(stream, d2d, args.repeat)
            copy_bw = 2 * nbytes / t_copy
            nv_rec = _nvshmem_reduce(nv, stream, nbytes, dtype, args.repeat) if nv else None
            for p in (int(x) for x in args.ranks.split(",")):
                host = (np.random.default_rng(7).standard_normal(n) * 2).astype(dt)
                inputs = [dev.allocate(nbytes, stream=stream) for _ in range(p)]
                for buf in inputs:
                    buf.copy_from(
                        CCBuffer.from_handle(int(host.ctypes.data), nbytes), stream=stream
                    )
                out = dev.allocate(nbytes, stream=stream)
                table = np.array([int(b.handle) for b in inputs], np.uint64)
                table_dev = dev.allocate(table.nbytes, stream=stream)
                table_dev.copy_from(
                    CCBuffer.from_handle(int(table.ctypes.data), table.nbytes), stream=stream
                )
                stream.sync()
                blocks = grid_blocks(n, sms)  # the production launch shape

                def ours(
                    t: Any = table_dev,
                    o: Any = out,
                    count: int = n,
                    ranks: int = p,
                    grid: int = blocks,
                    kernel: Any = fn,
                ) -> None:
                    launch(
                        stream,
                        LaunchConfig(grid=grid, block=THREADS),
                        kernel,
                        np.uint64(int(t.handle)),
                        np.uint64(int(o.handle)),
                        np.uint64(count),
                        np.int32(ranks),
                    )

                t_ours = cuda_median_seconds(stream, ours, args.repeat)
                bw = (p + 1) * nbytes / t_ours
                rec: dict[str, Any] = {
                    "bench": "gpu_allreduce",
                    "device": dev.name,
                    "dtype": dtype,
                    "ranks": p,
                    "bytes": nbytes,
                    "time_us": t_ours * 1e6,
                    "bandwidth_gbs": bw / 1e9,
                    "copy_bandwidth_gbs": copy_bw / 1e9,
                    "bandwidth_fraction": bw / copy_bw,
                }
                if torch is not None and dtype in ("float32", "bfloat16", "float16"):
                    tdt = {
                        "float32": torch.float32,
                        "bfloat16": torch.bfloat16,
                        "float16": torch.float16,
                    }[dtype]
                    tin = [torch.randn(n, device="cuda", dtype=tdt) for _ in range(p)]
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(args.repeat):
                        torch.stack(tin).sum(0)
                    torch.cuda.synchronize()
                    t_torch = (time.perf_counter() - t0) / args.repeat
                    rec["torch_stack_sum_us"] = t_torch * 1e6
                    rec["vs_torch"] = t_torch / t_ours
                if nv_rec is not None:
                    rec.update(nv_rec)
                if nv_rec is not None and "nvshmem_reduce_us" in nv_rec:
                    rec["vs_nvshmem_per_byte"] = bw / (
                        2 * nbytes / (nv_rec["nvshmem_reduce_us"] / 1e6)
                    )
                records.append(rec)
                print(json.dumps(rec), flush=True)
                for b in (*inputs, out, table_dev):
                    b.close(stream)
            copy_src.close(stream)
            copy_dst.close(stream)
    append_jsonl(args.out, records)
    if nv is not None:
        nv.finalize()


def _nvshmem_single(dev: Any, stream: Any) -> Any:
    """nvshmem4py initialised with one PE (uid bootstrap, no MPI), or None without it."""
    try:
        import nvshmem.core as nv
    except ImportError:
        return None
    import os

    os.environ.setdefault("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo")
    uid = nv.get_unique_id()
    nv.init(device=dev, uid=uid, rank=0, nranks=1, initializer_method="uid")
    version = nv.get_version()  # its repr spans lines; the library version is one field
    version = getattr(version, "libnvshmem_version", version)
    print(json.dumps({"nvshmem_version": str(version)}), flush=True)
    return nv


def _nvshmem_reduce(nv: Any, stream: Any, nbytes: int, dtype: str, repeat: int) -> dict[str, Any]:
    """NVSHMEM's one-PE reduce of the same bytes (a failure is reported in the record, not
    raised: our figures stand without the peer's, whose API differs between versions)."""
    try:
        return _nvshmem_reduce_timed(nv, stream, nbytes, dtype, repeat)
    except Exception as exc:
        return {"nvshmem_error": f"{type(exc).__name__}: {exc}"[:300]}


def _nvshmem_reduce_timed(
    nv: Any, stream: Any, nbytes: int, dtype: str, repeat: int
) -> dict[str, Any]:
    name = {"float32": "float", "bfloat16": "bfloat16", "float16": "half", "float64": "double"}
    made: list[Any] = []
    try:
        src = nv.buffer(nbytes)
        made.append(src)
        dst = nv.buffer(nbytes)
        made.append(dst)
        team = nv.Teams.TEAM_WORLD

        def run() -> None:
            nv.collective_on_buffer(
                "reduce", team, dst, src, dtype=name[dtype], op="sum", stream=stream
            )

        t = cuda_median_seconds(stream, run, repeat)
    finally:
        for b in reversed(made):  # a failed free must not hide the error that got here
            with contextlib.suppress(Exception):
                nv.free(b)
    return {"nvshmem_reduce_us": t * 1e6}


if __name__ == "__main__":
    main()
