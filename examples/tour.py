"""The main job: a tour of what the service does, checked as it goes, ending with a table.

    ./dev tour                        # 4 ranks on the host backend (creates .venv if needed)
    python -m launch -n 4 examples/tour.py

Every capability adds its step here as it lands. A failed check raises, and the launcher
names the rank and the check.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

import shmem


@dataclass
class Step:
    name: str
    checked: str
    figure: str


def _timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds per call over ``repeat`` calls, timed in blocks of 20."""
    blocks = []
    for _ in range(max(1, repeat // 20)):
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        blocks.append((time.perf_counter() - t0) / 20)
    return statistics.median(blocks)


def heap_step(world: shmem.World) -> Step:
    bufs = [world.zeros(n, "float32") for n in (1, 1000, 123_457)]
    offsets = world.comm.allgather([b.offset for b in bufs])
    assert all(o == offsets[0] for o in offsets), f"offsets differ: {offsets}"
    x = bufs[1]
    x.local()[...] = world.rank
    world.barrier()
    local_peers = [r for r in range(world.world_size) if x.peer(r) is not None]
    for r in local_peers:
        view = x.peer(r)
        assert view is not None and (view == r).all(), f"peer view of rank {r} is wrong"
    for b in bufs:
        b.close()
    stats = world.heap_stats()
    return Step(
        "symmetric heap",
        f"same offsets on {world.world_size} ranks; peer views of {len(local_peers)} ranks",
        f"{world.config.heap.nbytes >> 20} MiB/rank, {stats.free_total >> 20} MiB free",
    )


def put_get_step(world: shmem.World) -> Step:
    right = (world.rank + 1) % world.world_size
    left = (world.rank - 1) % world.world_size
    for name, dt in shmem.SUPPORTED_DTYPES.items():
        with world.zeros(64, name) as x:
            src = (np.arange(64) % 2 + world.rank % 2).astype(dt)
            x.put(right, src)
            world.barrier()
            expect = (np.arange(64) % 2 + left % 2).astype(dt)
            assert (x.local() == expect).all(), f"put of {name} is wrong"
            assert (x.get(right) == src).all(), f"get of {name} is wrong"
            world.barrier()
    return Step("put / get", f"ring put and get of all {len(shmem.SUPPORTED_DTYPES)} dtypes", "-")


def atomics_step(world: shmem.World) -> Step:
    with world.zeros(1, "int64") as counter:
        tickets = [counter.atomic_fetch_add(0, 0, 1) for _ in range(50)]
        everyone = sorted(t for ts in world.comm.allgather(tickets) for t in ts)
        assert everyone == list(range(50 * world.world_size)), "fetch-add tickets repeat"
    return Step("atomics", f"{50 * world.world_size} fetch-add tickets, all distinct", "-")


def signal_step(world: shmem.World) -> Step:
    rounds = 500
    right = (world.rank + 1) % world.world_size
    left = (world.rank - 1) % world.world_size
    with world.zeros((2, 512), "int64") as data:
        t0 = time.perf_counter()
        for i in range(1, rounds + 1):
            s = i % 2
            data.put(right, np.full(512, i * 10 + world.rank), offset=s * 512 * 8, signal=(s, i))
            world.wait_until(s, "ge", i)
            assert (data.local()[s] == i * 10 + left).all(), f"round {i}: stale data"
            world.signal(left, 2 + s, i)
            world.wait_until(2 + s, "ge", i)
        per_round = (time.perf_counter() - t0) / rounds
    return Step(
        "signals",
        f"{rounds} rounds of put-with-signal, data checked every round",
        f"{per_round * 1e6:.1f} us/round",
    )


def barrier_step(world: shmem.World) -> Step:
    ours = _timed(world.barrier, 400)
    mpi = _timed(world.comm.Barrier, 400)
    return Step(
        "barrier",
        "epoch-flag barrier vs MPI_Barrier, same run",
        f"{ours * 1e6:.1f} us vs {mpi * 1e6:.1f} us (x{mpi / ours:.2f})",
    )


def pingpong_step(world: shmem.World) -> Step:
    if world.world_size < 2:
        return Step("ping-pong", "skipped: needs 2 ranks", "-")
    seq = [0]
    msg = np.zeros(1, np.int64)

    def ours() -> None:
        seq[0] += 1
        if world.rank == 0:
            world.signal(1, 0, seq[0])
            world.wait_until(1, "ge", seq[0])
        elif world.rank == 1:
            world.wait_until(0, "ge", seq[0])
            world.signal(0, 1, seq[0])

    def mpi() -> None:
        if world.rank == 0:
            world.comm.Send(msg, 1, 5)
            world.comm.Recv(msg, 1, 6)
        elif world.rank == 1:
            world.comm.Recv(msg, 0, 5)
            world.comm.Send(msg, 0, 6)

    # only ranks 0 and 1 take part; the others wait in the heap's barrier, which yields the
    # core on an oversubscribed node (MPI's busy-polls: with 4 ranks on 2 cores it took the
    # cores from both contenders and made the figures bimodal)
    world.barrier()
    t_ours = _timed(ours, 2000) if world.rank < 2 else 0.0
    world.barrier()
    t_mpi = _timed(mpi, 2000) if world.rank < 2 else 0.0
    world.barrier()
    t_ours, t_mpi = world.comm.bcast((t_ours, t_mpi), root=0)
    return Step(
        "ping-pong",
        "signal round trip vs 8-byte Send/Recv (ranks 0-1)",
        f"{t_ours * 1e6:.2f} us vs {t_mpi * 1e6:.2f} us (x{t_mpi / t_ours:.2f})",
    )


def device_step(world: shmem.World) -> Step:
    n, tile = 1 << 15, 1 << 10
    with shmem.DeviceContext(shmem.CPU()) as ctx:
        x = ctx.enqueue_create_buffer("float32", n)
        ctx.enqueue_copy(x, np.arange(n, dtype=np.float32))

        def square(block: shmem.Block, v: np.ndarray[Any, Any]) -> None:
            lo = block.block_idx.x * tile
            v[lo : lo + tile] *= v[lo : lo + tile]

        ctx.enqueue_function(square, x, grid_dim=n // tile)
        out = np.empty(n, np.float32)
        ctx.enqueue_copy(out, x)  # stream-ordered after the kernel
        ctx.synchronize()
        assert np.array_equal(out, np.arange(n, dtype=np.float32) ** 2), "kernel result"
        view = shmem.Buffer.from_numpy(out.reshape(128, 256))[::2, 1::4]
        assert np.array_equal(view.to_numpy(), out.reshape(128, 256)[::2, 1::4])
    return Step(
        "devices & streams",
        f"host kernel over {n // tile} blocks, copies in stream order, strided views",
        f"{shmem.CPU().attributes.cores} core(s)",
    )


def allreduce_step(world: shmem.World) -> Step:
    import collectives  # the collectives are a separate package built on shmem

    n = 1 << 18
    with collectives.Communicator(world) as comm, world.zeros(n, "float32") as x:
        x.local()[...] = np.arange(n, dtype=np.float32) % 13 + world.rank
        world.barrier()
        expected = np.zeros(n, np.float32)
        for r in range(world.world_size):  # rank order, as the collective guarantees
            expected = expected + (np.arange(n, dtype=np.float32) % 13 + r)
        got = np.asarray(comm.all_reduce(x))
        assert got.tobytes() == expected.tobytes(), "all-reduce differs from the rank-order sum"
        everyone = world.comm.allgather(got.tobytes())
        assert len(set(everyone)) == 1, "all-reduce results differ between ranks"
        out = np.empty(n, np.float32)
        ours = _timed(lambda: comm.all_reduce(x, out=out), 100)
        mpi = _timed(lambda: world.comm.Allreduce(x.local(), out), 100)
        ours, mpi = world.comm.bcast((ours, mpi), root=0)
        algo = comm.table.choose(n * 4, world.world_size, world.num_nodes)
    return Step(
        "all-reduce",
        f"1 MiB float32 ({algo}) equals the rank-order sum, bitwise, on every rank",
        f"{ours * 1e6:.0f} us vs MPI {mpi * 1e6:.0f} us (x{mpi / ours:.2f})",
    )


def attention_step(world: shmem.World) -> Step:
    from collectives.mha import attention

    # rank 0 alone uses the cores; the others wait in the (yielding) flag barrier, not in
    # MPI, whose waits spin and would take the cores from it
    step = _attention_check(attention) if world.rank == 0 else None
    world.barrier()
    return cast(Step, world.comm.bcast(step, root=0))


def _attention_check(attention: Any) -> Step:
    s, h, d = 512, 4, 64
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, s, h, d)).astype(np.float32) for _ in range(3))
    t0 = time.perf_counter()
    o = attention(q, k, v, causal=True, block_m=64, block_n=128)
    took = time.perf_counter() - t0
    # float64 reference: softmax(Q K^T / sqrt(d) + causal mask) V, head by head
    worst = 0.0
    for head in range(h):
        scores = q[0, :, head].astype(np.float64) @ k[0, :, head].astype(np.float64).T
        scores = np.where(np.tril(np.ones((s, s), bool)), scores / np.sqrt(d), -np.inf)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        ref = (p / p.sum(axis=1, keepdims=True)) @ v[0, :, head]
        worst = max(worst, float(np.abs(o[0, :, head] - ref).max()))
    assert worst < 1e-4, f"attention differs from the reference by {worst}"
    flops = 4 * h * (s * (s + 1) // 2) * d
    return Step(
        "attention (1 rank)",
        f"causal S={s} H={h} D={d} vs a float64 reference (max error {worst:.1e})",
        f"{flops / took / 1e9:.1f} GFLOP/s",
    )


def sequence_parallel_step(world: shmem.World) -> Step:
    import collectives
    from collectives.mha import (
        SequenceParallelStats,
        sequence_parallel_attention,
        sequence_parallel_attention_backward,
    )
    from collectives.schedule import shard_bounds

    s, h, hk, d = 611, 4, 2, 32  # GQA; 611 rows split unevenly over the ranks
    rng = np.random.default_rng(11)
    q_all, do_all = (rng.standard_normal((s, h, d)).astype(np.float32) for _ in range(2))
    k_all, v_all = (rng.standard_normal((s, hk, d)).astype(np.float32) for _ in range(2))
    a, b = shard_bounds(s, world.world_size)[world.rank]
    q, k, v, do = q_all[a:b], k_all[a:b], v_all[a:b], do_all[a:b]
    fwd, bwd = SequenceParallelStats(), SequenceParallelStats()
    with collectives.Communicator(world) as comm:
        kw: dict[str, Any] = dict(causal=True, block_m=32, unit_rows=48)
        o, lse = sequence_parallel_attention(comm, q, k, v, return_lse=True, stats=fwd, **kw)
        dq, dk, dv = sequence_parallel_attention_backward(
            comm, do, q, k, v, o, lse, stats=bwd, **kw
        )
    # float64 reference on the full sequence: O and the gradients of sum(O * dO)
    o_ref, dq_ref = np.zeros((s, h, d)), np.zeros((s, h, d))
    dk_ref, dv_ref = np.zeros((s, hk, d)), np.zeros((s, hk, d))
    causal = np.tril(np.ones((s, s), bool))
    for head in range(h):
        kh = head // (h // hk)
        q64, k64, v64 = (x.astype(np.float64) for x in (q_all[:, head], k_all[:, kh], v_all[:, kh]))
        scores = np.where(causal, q64 @ k64.T / np.sqrt(d), -np.inf)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        o_ref[:, head] = p @ v64
        dp = do_all[:, head] @ v64.T
        ds = p * (dp - (dp * p).sum(axis=1, keepdims=True))
        dq_ref[:, head] = ds @ k64 / np.sqrt(d)
        dk_ref[:, kh] += ds.T @ q64 / np.sqrt(d)
        dv_ref[:, kh] += p.T @ do_all[:, head]
    worst = max(
        float(np.abs(got - want[a:b]).max(initial=0.0))
        for got, want in ((o, o_ref), (dq, dq_ref), (dk, dk_ref), (dv, dv_ref))
    )
    assert worst < 1e-4, f"sequence-parallel attention differs from the reference by {worst}"
    worst = max(world.comm.allgather(worst))
    taken = sum(world.comm.allgather(fwd.units_taken + bwd.units_taken))
    units = sum(world.comm.allgather(fwd.units + bwd.units))
    return Step(
        "sequence-parallel attention",
        f"dynamic causal S={s} GQA: O, dQ, dK, dV vs float64 (max error {worst:.1e})",
        f"{taken} of {units} units taken across ranks, imbalance {fwd.imbalance:.2f}",
    )


def ipc_step(world: shmem.World) -> Step:
    import subprocess
    import sys

    from shmem import ipc

    if world.rank != 0:
        world.barrier()
        return cast(Step, world.comm.bcast(None, root=0))
    child = (
        "import sys; from shmem import ipc; b = ipc.import_(sys.argv[1]); "
        "print(int(b.array.sum())); b.array[...] = 7; b.close()"
    )
    with ipc.allocate(1000, "int32") as buf:
        buf.array[...] = np.arange(1000)
        desc = ipc.export(buf)
        out = subprocess.run(
            [sys.executable, "-c", child, str(desc)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert int(out) == int(np.arange(1000).sum()), "the other process read other data"
        assert (buf.array == 7).all(), "the other process's writes did not reach us"
        size = len(desc.to_bytes())
    world.barrier()
    step = Step(
        "IPC",
        "a separate process imported an exported buffer; writes seen both ways",
        f"descriptor {size} bytes",
    )
    return cast(Step, world.comm.bcast(step, root=0))


def torch_step(world: shmem.World) -> Step:
    """torch.distributed on the symheap backend: an all-reduce against gloo's, in place."""
    import importlib.util
    import os

    if importlib.util.find_spec("torch") is None:
        return Step("torch backend", "skipped: torch not installed (pip install '.[peers]')", "-")
    if "MASTER_PORT" not in os.environ:
        return Step("torch backend", "skipped: run under python -m launch (env:// init)", "-")
    import torch
    import torch.distributed as dist

    dist.init_process_group("symheap")  # on this World
    gloo = dist.new_group(backend="gloo")
    x = torch.randn(16384, generator=torch.Generator().manual_seed(world.rank))
    ours, theirs = x.clone(), x.clone()
    dist.all_reduce(ours)
    dist.all_reduce(theirs, group=gloo)
    torch.testing.assert_close(ours, theirs)
    every = [torch.empty_like(ours) for _ in range(world.world_size)]
    dist.all_gather(every, ours)
    assert all(torch.equal(e, ours) for e in every), "ranks hold different sums"
    # timed in place, as a gradient all-reduce runs: on zeros, which stay finite (a sum of
    # P copies a hundred times over overflows float32)
    ours.zero_()
    theirs.zero_()
    t_ours = _timed(lambda: dist.all_reduce(ours), 100)
    t_gloo = _timed(lambda: dist.all_reduce(theirs, group=gloo), 40)
    dist.destroy_process_group()
    return Step(
        "torch backend",
        "dist.all_reduce (64 KiB) equals gloo's, bitwise the same on every rank",
        f"{t_ours * 1e6:.0f} us, {t_gloo / t_ours:.1f}x gloo",
    )


def main() -> None:
    with shmem.init() as world:
        steps = [
            heap_step(world),
            put_get_step(world),
            atomics_step(world),
            signal_step(world),
            barrier_step(world),
            pingpong_step(world),
            device_step(world),
            allreduce_step(world),
            attention_step(world),
            sequence_parallel_step(world),
            ipc_step(world),
            torch_step(world),
        ]
        world.barrier()
        if world.rank == 0:
            print(
                f"\nshmem {shmem.__version__}: {world.world_size} ranks on {world.num_nodes} "
                f"node(s), backend {world.backend}, node_split {world.config.heap.node_split}"
            )
            w1 = max(len(s.name) for s in steps)
            w2 = max(len(s.checked) for s in steps)
            print(f"{'step':<{w1}}  {'checked':<{w2}}  figure")
            print(f"{'-' * w1}  {'-' * w2}  {'-' * 6}")
            for s in steps:
                print(f"{s.name:<{w1}}  {s.checked:<{w2}}  {s.figure}")
            print(f"all {len(steps)} steps passed")


if __name__ == "__main__":
    main()
