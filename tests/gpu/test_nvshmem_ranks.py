"""The nvshmem backend at 1, 2 and 4 ranks (several ranks may share one GPU): the heap,
SHMEMBuffer on GPU memory, signals, atomics, barriers, and the GPU all-reduce checked
bitwise against the host backend's semantics (``collectives.ops.reduce_into``).

Run by ``./dev gpu`` (scripts/gpu_run.py) under the launcher::

    python -m launch -n 2 --allow-gpu-sharing -m pytest -q --only-mpi \
        tests/gpu/test_nvshmem_ranks.py
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import shmem
from shmem.errors import SignalTimeoutError
from tests.gpu.params import grid

pytestmark = [pytest.mark.mpi, pytest.mark.gpu]

CI_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ci.toml"


@pytest.fixture(scope="module")
def gpu_world() -> Iterator[Any]:
    w = shmem.init(CI_CONFIG, backend="nvshmem", heap_nbytes="256MiB", signal_timeout_s=60.0)
    yield w
    if not w.finalized:
        w.finalize()


@pytest.mark.smoke
def test_init_reports_mode_and_version(gpu_world: Any) -> None:
    heap = gpu_world.heap
    assert gpu_world.backend == "nvshmem"
    assert heap.version and heap.mode in ("initialised", "LIMITED_MPG", "FULL_MPG")
    print(f"nvshmem {heap.version}, mode {heap.mode}, GPU {heap.device.id}")  # for the log
    assert all(heap.is_local(r) for r in range(gpu_world.world_size))  # one node


@pytest.mark.smoke
def test_local_is_a_device_buffer_shared_with_torch_and_cupy(gpu_world: Any) -> None:
    peers = _cuda_peers()
    if not peers:
        pytest.skip("neither torch built with CUDA nor cupy is installed")
    buf = gpu_world.zeros(1000, "float32")
    try:
        loc = buf.local()
        assert not loc.is_host and loc.shape == (1000,)
        np.testing.assert_array_equal(loc.to_numpy(), 0)
        for mod in peers:
            t = mod.from_dlpack(buf)
            t += 1
            if mod.__name__ == "torch":
                mod.cuda.synchronize()
            else:
                mod.cuda.Device().synchronize()
        got = buf.get(gpu_world.rank)
        np.testing.assert_array_equal(got, len(peers))
        gpu_world.barrier()
    finally:
        buf.close()


def _cuda_peers() -> list[Any]:
    """torch (a build with CUDA) and cupy where installed: the DLPack peers on a GPU."""
    import importlib

    found = []
    for name in ("torch", "cupy"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if name == "torch" and not mod.cuda.is_available():
            continue  # a CPU build: it cannot take a GPU buffer
        found.append(mod)
    return found


@pytest.mark.parametrize(
    "dtype",
    grid(["float32", "float64", "int32", "int64", "uint8", "bfloat16"], smoke=[("float32",)]),
)
def test_ring_put_with_signal_then_get(gpu_world: Any, dtype: str) -> None:
    w = gpu_world
    r, p = w.rank, w.world_size
    with_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    buf = w.zeros(257, dtype)
    try:
        data = (np.arange(257) % 50 + r).astype(with_dtype)
        w.barrier()
        buf.put((r + 1) % p, data, signal=(0, 1, "add"))
        w.wait_until(0, "ge", 1)
        left = (r - 1) % p
        np.testing.assert_array_equal(
            buf.local().to_numpy(), (np.arange(257) % 50 + left).astype(with_dtype)
        )
        got = buf.get((r + 1) % p)  # what I put there
        np.testing.assert_array_equal(got, data)
        w.barrier()
        w.signal(r, 0, 0)
        w.barrier()
    finally:
        buf.close()


@pytest.mark.smoke
def test_device_to_device_put(gpu_world: Any) -> None:
    w = gpu_world
    r, p = w.rank, w.world_size
    src = w.zeros(64, "float32")
    dst = w.zeros(64, "float32")
    try:
        w.ctx.enqueue_copy(src.local(), np.full(64, r, np.float32))
        w.ctx.synchronize()
        w.barrier()
        dst.put((r + 1) % p, src.local())  # a GPU Buffer as the source
        w.barrier()
        np.testing.assert_array_equal(dst.local().to_numpy(), (r - 1) % p)
    finally:
        dst.close()
        src.close()


@pytest.mark.smoke
def test_atomic_tickets_are_distinct(gpu_world: Any) -> None:
    w = gpu_world
    counter = w.zeros(1, "int64")
    try:
        tickets = [counter.atomic_fetch_add(0, 0, 1) for _ in range(50)]
        everyone = sorted(t for ts in w.comm.allgather(tickets) for t in ts)
        assert everyone == list(range(50 * w.world_size))
        w.barrier()
        assert counter.atomic_compare_swap(0, 0, 50 * w.world_size, -7) in (
            50 * w.world_size,
            -7,
        )
        w.barrier()
        assert counter.get(0)[0] == -7
        w.barrier()
    finally:
        counter.close()


@pytest.mark.smoke
def test_a_wait_times_out_with_the_host_backends_error(gpu_world: Any) -> None:
    with pytest.raises(SignalTimeoutError, match="slot 5"):
        gpu_world.wait_until(5, "eq", 12345, timeout=0.2)
    gpu_world.barrier()


def _inputs(rank: int, n: int, dtype: Any) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(1000 + rank)
    x = rng.standard_normal(n) * 4
    x[rng.integers(0, n, max(1, n // 50))] = 0.0
    return x.astype(dtype)


@pytest.mark.parametrize(
    ("dtype", "op", "algorithm", "n"),
    grid(
        ["float16", "bfloat16", "float32", "float64"],
        ["sum", "avg", "prod", "min", "max"],
        ["one_shot", "two_shot"],
        [1, 1000, (1 << 20) + 3],
        smoke=[
            ("float32", "sum", "one_shot", 1000),
            ("bfloat16", "avg", "two_shot", (1 << 20) + 3),
        ],
    ),
)
def test_gpu_all_reduce_equals_host_semantics(
    gpu_world: Any, dtype: str, op: str, algorithm: str, n: int
) -> None:
    import collectives
    from collectives.ops import accumulate_dtype, reduce_into

    w = gpu_world
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    mine = _inputs(w.rank, n, dt)
    with collectives.Communicator(w) as comm:
        got = comm.all_reduce(mine, op=op, algorithm=algorithm)  # numpy in: numpy out
        part = comm.reduce_scatter(mine, op=op)  # (its own kernels, one per dtype and op)
    expected = np.empty(n, dt)
    reduce_into(
        expected,
        [_inputs(r, n, dt) for r in range(w.world_size)],
        op,
        accumulate_dtype(dt, np.dtype(np.float32)),
        avg_count=w.world_size,
    )
    assert got.tobytes() == expected.tobytes()
    from collectives.schedule import shard_of

    lo, hi = shard_of(n, w.world_size, w.rank)
    assert part.tobytes() == expected[lo:hi].tobytes()
    digests = w.comm.allgather(hashlib.sha256(got.tobytes()).hexdigest())
    assert len(set(digests)) == 1


def test_gpu_all_reduce_in_place_on_an_shmem_buffer_and_errors(gpu_world: Any) -> None:
    import collectives

    w = gpu_world
    buf = w.zeros(4096, "float32")
    try:
        w.ctx.enqueue_copy(buf.local(), np.full(4096, w.rank + 1, np.float32))
        w.ctx.synchronize()
        with collectives.Communicator(w) as comm:
            res = comm.all_reduce(buf, out=buf.local())
            total = w.world_size * (w.world_size + 1) / 2
            np.testing.assert_array_equal(res.to_numpy(), total)
            # every host dtype but long double reduces on the GPU (int32 included); the
            # refusals name what was wrong
            with pytest.raises(ValueError, match="no long double"):
                comm.all_reduce(np.zeros(4, np.longdouble))
            with pytest.raises(ValueError, match="needs an integer"):
                comm.all_reduce(np.zeros(4, np.float32), op="band")
    finally:
        buf.close()


def test_gpu_all_reduce_times_out_in_the_kernel_when_a_rank_never_arrives(gpu_world: Any) -> None:
    """The kernel's own deadline (its waits on the global timer): where the last rank never
    calls, the others' kernels give up after ``[signal] timeout_s`` and each raises
    SignalTimeoutError from the status word, naming the wait; closing stays collective."""
    import dataclasses

    import collectives

    w = gpu_world
    if w.world_size < 2:
        pytest.skip("needs a rank that stays away")
    config = w.config
    w.config = dataclasses.replace(config, signal=dataclasses.replace(config.signal, timeout_s=1.0))
    try:
        comm = collectives.Communicator(w)
        assert comm._gpu is not None
        # the kernels compare the calls; configs/ci.toml's host-side check would wait for
        # the absent rank first (a deadline of its own, its exchange then out of step)
        comm._gpu.check_args = False
        comm.all_reduce(np.ones(16, np.float32), algorithm="one_shot")  # (scratch, stages)
        if w.rank != w.world_size - 1:
            with pytest.raises(SignalTimeoutError, match=r"timed out after 1 s waiting"):
                comm.all_reduce(np.ones(16, np.float32), algorithm="one_shot")
        w.barrier()
        comm.close()
    finally:
        w.config = config


@pytest.mark.parametrize("who", ["every rank", "rank 0 only"])
def test_gpu_close_keeps_the_scratch_when_the_drain_sees_a_failure(
    gpu_world: Any, who: str
) -> None:
    """A failed CUDA-graph replay leaves the status word set with nobody reading it; close's
    drain then returns at once, and the scratch a peer may still write must stay allocated
    (it was freed regardless), on every rank alike even when one rank saw it: freeing is
    collective."""
    import collectives
    from shmem import cuda as shmem_cuda

    w = gpu_world
    comm = collectives.Communicator(w)
    comm.all_reduce(np.ones(16, np.float32))
    gpu = comm._gpu
    assert gpu is not None
    stream = w.heap.stream
    status = int(gpu._arrive.handle) + 4
    if who == "every rank" or w.rank == 0:
        shmem_cuda.memset_async(status, 1, 1, stream)  # the status word: 1, a timed-out wait
        stream.sync()
    comm.close()
    assert gpu.broken and not gpu.scratch.closed and not gpu.flags.closed
    # tidy up for the tests after this one: clear the status, close for real
    shmem_cuda.memset_async(status, 0, 4, stream)
    stream.sync()
    gpu.broken = False
    gpu.close()
    assert gpu.scratch.closed and gpu.flags.closed


@pytest.mark.parametrize("n_per_rank", grid([1, 1000, (1 << 19) + 5], smoke=[(1000,)]))
def test_gpu_family_equals_host_semantics(gpu_world: Any, n_per_rank: int) -> None:
    """all_gather, all_to_all, broadcast from every root, and reduce_scatter on the GPU
    stages, against what the host backend computes (bitwise; float32 accumulation)."""
    import collectives
    from collectives.ops import accumulate_dtype, reduce_into
    from collectives.schedule import shard_of

    w = gpu_world
    p, r = w.world_size, w.rank
    n = n_per_rank * p
    inputs = [_inputs(q, n, np.dtype(np.float32)) for q in range(p)]
    with collectives.Communicator(w) as comm:
        got = comm.all_gather(inputs[r])
        assert got.tobytes() == np.concatenate(inputs).tobytes()
        got = comm.all_to_all(inputs[r])
        c = n // p
        want = np.concatenate([inputs[q][r * c : (r + 1) * c] for q in range(p)])
        assert got.tobytes() == want.tobytes()
        for root in range(p):
            x = inputs[r].copy()
            assert comm.broadcast(x, root=root) is x
            assert x.tobytes() == inputs[root].tobytes()
        for op in ("sum", "max", "avg"):
            got = comm.reduce_scatter(inputs[r], op=op)
            full = np.empty(n, np.float32)
            acc = accumulate_dtype(np.dtype(np.float32), np.dtype(np.float32))
            reduce_into(full, inputs, op, acc, avg_count=p)
            lo, hi = shard_of(n, p, r)
            assert got.tobytes() == full[lo:hi].tobytes(), op
        src = w.zeros(8, "bfloat16")
        dev: Any = comm.all_gather(src.local())  # a device Buffer in, a device Buffer out
        assert not dev.is_host and dev.num_elements == 8 * p
        src.close()


@pytest.mark.parametrize("kind", grid(["count", "op", "collective"], smoke=[("op",)]))
def test_gpu_mismatched_calls_raise_everywhere_without_check_args(
    gpu_world: Any, kind: str
) -> None:
    """Always-on detection on the GPU: every kernel compares the ranks' call signatures when
    the inputs are staged, so rank 0 disagreeing raises CollectiveMismatchError everywhere
    (configs/ci.toml's check_args would catch it first: switched off here)."""
    import collectives
    from shmem.errors import CollectiveMismatchError

    w = gpu_world
    if w.world_size < 2:
        pytest.skip("needs two ranks to disagree")
    comm = collectives.Communicator(w)
    assert comm._gpu is not None
    comm._gpu.check_args = False
    odd = w.rank == 0
    x = np.ones(1000 if (odd and kind == "count") else 2000, np.float32)
    with pytest.raises(CollectiveMismatchError, match="different collectives"):
        if odd and kind == "collective":
            comm.all_gather(x)
        else:
            comm.all_reduce(x, op="max" if (odd and kind == "op") else "sum")
    comm.close()  # broken: its GPU scratch stays allocated (a warning), nothing waits


@pytest.mark.smoke
def test_gpu_all_reduce_and_all_gather_replay_in_a_cuda_graph(gpu_world: Any) -> None:
    """Issue 17: both calls captured once in a CUDA graph (torch's, on torch's stream, passed
    as ``stream=``), replayed 100 times with new inputs; every replay's result is checked.
    The stage numbers are read on the device, so nothing of the capture is stale."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import collectives

    w = gpu_world
    p, r = w.world_size, w.rank
    comm = collectives.Communicator(w)
    try:
        x = torch.zeros(1000, device="cuda", dtype=torch.float32)
        summed = torch.empty_like(x)
        gathered = torch.empty(1000 * p, device="cuda", dtype=torch.float32)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on the capture stream (compiles, plans)
            comm.all_reduce(x, out=summed, stream=stream)
            comm.all_gather(x, out=gathered, stream=stream)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            comm.all_reduce(x, out=summed, stream=stream)
            comm.all_gather(x, out=gathered, stream=stream)
        base = torch.arange(1000, device="cuda", dtype=torch.float32)
        for i in range(100):
            x.copy_(base * (r + 1) + i)
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            want_sum = base * (p * (p + 1) // 2) + p * i
            assert torch.equal(summed, want_sum), (i, (summed - want_sum).abs().max().item())
            want_gather = torch.cat([base * (q + 1) + i for q in range(p)])
            assert torch.equal(gathered, want_gather), i
        # eager calls after the replays are in step with them
        got = comm.all_reduce(np.ones(8, np.float32))
        assert (np.asarray(got) == p).all()
    finally:
        comm.close()


@pytest.mark.parametrize(
    ("dtype", "op", "algorithm"),
    grid(
        ["bfloat16", "float16"],
        ["sum", "avg", "prod", "min", "max"],
        ["one_shot", "two_shot"],
        smoke=[("bfloat16", "sum", "one_shot"), ("bfloat16", "avg", "two_shot")],
    ),
)
def test_gpu_all_reduce_fused_out_dtype_and_scale(
    gpu_world: Any, dtype: str, op: str, algorithm: str
) -> None:
    """16-bit floats in, float32 out, scaled in the kernel: bitwise the host's rank-order
    float32 reduction times the scale (one rounding, to float32)."""
    import collectives
    from collectives.ops import reduce_into

    w = gpu_world
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    n, p = 5000, w.world_size
    acc = np.dtype(np.float32)
    with collectives.Communicator(w) as comm:
        got = comm.all_reduce(
            _inputs(w.rank, n, dt), op=op, algorithm=algorithm, out_dtype="float32", scale=0.125
        )
    want = np.empty(n, acc)
    reduce_into(want, [_inputs(r, n, dt).astype(acc) for r in range(p)], op, acc, avg_count=p)
    want *= np.float32(0.125)
    assert got.dtype == acc and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("op", ["sum", "avg", "prod", "min", "max"])
def test_gpu_float32_accumulated_in_float64_equals_the_host(gpu_world: Any, op: str) -> None:
    """``[collectives] float32_accumulate = "float64"``: the float32 kernels that accumulate
    in double (``*_float32_acc64_*``), both algorithms and the reduce-scatter, bitwise the
    host's rank-order float64 reduction rounded once."""
    import dataclasses

    import collectives
    from collectives.ops import reduce_into
    from collectives.schedule import shard_of

    w = gpu_world
    n, p = 3001, w.world_size
    config = w.config
    wide = dataclasses.replace(config.collectives, float32_accumulate="float64")
    w.config = dataclasses.replace(config, collectives=wide)
    try:
        comm = collectives.Communicator(w)
    finally:
        w.config = config
    with comm:
        got = [comm.all_reduce(_inputs(w.rank, n, np.float32), op=op, algorithm=a)
               for a in ("one_shot", "two_shot")]  # fmt: skip
        part = comm.reduce_scatter(_inputs(w.rank, n, np.float32), op=op)
    want = np.empty(n, np.float32)
    every = [_inputs(r, n, np.float32) for r in range(p)]
    reduce_into(want, every, op, np.dtype(np.float64), avg_count=p)
    for g in got:
        assert g.tobytes() == want.tobytes(), op
    lo, hi = shard_of(n, p, w.rank)
    assert part.tobytes() == want[lo:hi].tobytes(), op


OP_ARG_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                 "bool", "float8_e4m3", "float8_e5m2", "complex64", "complex128"]  # fmt: skip


def _any_inputs(rank: int, n: int, dt: np.dtype[Any]) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(2000 + rank)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -(2**62)), min(info.max, 2**62), n).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    return (rng.standard_normal(n) * 4).astype(dt)


@pytest.mark.parametrize(
    ("dtype", "algorithm"),
    grid(
        OP_ARG_DTYPES,
        ["one_shot", "two_shot"],
        smoke=[("int32", "one_shot"), ("uint64", "two_shot")],
    ),
)
def test_gpu_reductions_of_every_other_dtype_equal_the_host(
    gpu_world: Any, dtype: str, algorithm: str
) -> None:
    """Integers (wrapping, avg truncated toward zero), bool, float8 (float32 accumulation,
    one rounding as ml_dtypes) and complex: every op the host allows for the dtype, the
    all-reduce and the reduce-scatter, bitwise the host's reduce_into."""
    import collectives
    from collectives.ops import OPS, accumulate_dtype, reduce_into
    from collectives.schedule import shard_of
    from shmem.errors import OpError

    w = gpu_world
    dt = shmem.dtypes.as_dtype(dtype)
    n, p = 3001, w.world_size
    mine = _any_inputs(w.rank, n, dt)
    every = [_any_inputs(r, n, dt) for r in range(p)]
    acc = accumulate_dtype(dt, np.dtype(np.float32))
    with collectives.Communicator(w) as comm:
        for op in OPS:
            try:
                collectives.ops.check_op(op, dt, "test")
            except OpError:
                continue
            got = comm.all_reduce(mine, op=op, algorithm=algorithm)
            want = np.empty(n, dt)
            reduce_into(want, every, op, acc, avg_count=p)
            assert got.tobytes() == want.tobytes(), (dtype, op)
            part = comm.reduce_scatter(mine, op=op)
            lo, hi = shard_of(n, p, w.rank)
            assert part.tobytes() == want[lo:hi].tobytes(), (dtype, op)


@pytest.mark.parametrize(
    ("schedule", "dtype", "kw"),
    [
        pytest.param("ring", "bfloat16", {"causal": True}, marks=pytest.mark.smoke),
        ("zigzag", "bfloat16", {"causal": True}),
        ("ring", "float16", {}),
        ("zigzag", "float32", {"window": (300, 17)}),
        ("ring", "float32", {"causal": True, "window": (None, 0)}),
        ("zigzag", "bfloat16", {"causal": True, "valid_length": "docs"}),
        ("ring", "float16", {"valid_length": "docs"}),
        ("dynamic", "bfloat16", {"causal": True}),
        ("dynamic", "float32", {"causal": True, "unit_rows": 100}),
        ("dynamic", "float16", {"causal": True, "valid_length": "docs", "unit_rows": 150}),
    ],
)
def test_gpu_sequence_parallel_equals_one_gpu(
    gpu_world: Any, schedule: str, dtype: str, kw: dict[str, Any]
) -> None:
    """sequence_parallel_attention and its backward on GPU Buffers (every rank a shard of
    one sequence, ragged shard lengths on the ring) against the single-GPU kernels on the
    whole sequence: each rank's rows of O, LSE, dQ, dK and dV."""
    import collectives
    from collectives.mha import (
        SequenceParallelStats,
        attention,
        attention_backward,
        sequence_parallel_attention,
        sequence_parallel_attention_backward,
        zigzag_shard,
    )
    from collectives.schedule import shard_bounds

    w = gpu_world
    size, rank = w.world_size, w.rank
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    total, heads, kv_heads, d = 1000 + 37 * size, 4, 2, 64
    if kw.get("valid_length") == "docs":  # documents across shard boundaries, one of 1 token
        kw = {**kw, "valid_length": [0, 123, 124, total // 2 + 5, total]}
    rng = np.random.default_rng(11)  # the same sequence on every rank
    q = rng.standard_normal((total, heads, d)).astype(dt)
    k, v = (rng.standard_normal((total, kv_heads, d)).astype(dt) for _ in range(2))
    if schedule == "zigzag":
        rows = zigzag_shard(np.arange(total), rank, size)
    else:
        a, b = shard_bounds(total, size)[rank]
        rows = np.arange(a, b)

    def gpu(x: np.ndarray[Any, Any]) -> Any:
        return shmem.Buffer.from_numpy(np.ascontiguousarray(x)).to(w.heap.device)

    do = rng.standard_normal(q.shape).astype(dt)
    stats = SequenceParallelStats()
    with collectives.Communicator(w) as comm:
        o, lse = sequence_parallel_attention(
            comm, gpu(q[rows]), gpu(k[rows]), gpu(v[rows]), schedule=schedule,
            return_lse=True, stats=stats, **kw,
        )  # fmt: skip
        grads = sequence_parallel_attention_backward(
            comm, gpu(do[rows]), gpu(q[rows]), gpu(k[rows]), gpu(v[rows]), o, lse,
            schedule=schedule, **kw,
        )  # fmt: skip
    # per-rank work balance, for the log (ranks share one GPU: not a scaling figure)
    print(
        f"SP {schedule} rank {rank}/{size}: units computed {stats.units_computed}, taken "
        f"{stats.units_taken}, given {stats.units_given}, busy {stats.busy_per_rank}"
    )
    # the single-GPU kernels on the whole sequence: ragged [tokens, ...] with documents,
    # else a batch of one
    ragged = "valid_length" in kw

    def whole(x: np.ndarray[Any, Any]) -> Any:
        return gpu(x if ragged else x[None])

    def rows_of(b: Any) -> np.ndarray[Any, Any]:
        a: np.ndarray[Any, Any] = b.to_numpy()
        picked: np.ndarray[Any, Any] = (a if ragged else a[0])[rows]
        return picked.astype(np.float64)

    mask = {n: kw[n] for n in ("causal", "window", "valid_length") if n in kw}
    full = [whole(a) for a in (q, k, v)]
    want, want_lse = attention(*full, return_lse=True, **mask)
    tol = 1e-4 if dtype == "float32" else 2e-2
    assert np.abs(o.to_numpy().astype(np.float64) - rows_of(want)).max() < tol
    assert np.abs(lse.to_numpy() - rows_of(want_lse)).max() < 5 * tol
    wants = attention_backward(full[0], full[1], full[2], want, want_lse, whole(do), **mask)
    for got, exp in zip(grads, wants, strict=True):
        # relative to the gradient's size: dK/dV sum one partial (rounded to the input
        # type) per rank where the single-GPU kernel rounds once
        want_g = rows_of(exp)
        err = np.abs(got.to_numpy().astype(np.float64) - want_g).max()
        assert err < 4 * tol * max(1.0, float(np.abs(want_g).max(initial=0.0))), err
