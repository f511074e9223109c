# mypy: disable-error-code="func-returns-value,misc"
"""The nvshmem backend's Python paths at one rank on the fake driver (tests/fakegpu/README.md).

Prints one line per check and ``SUMMARY <ok> ok; <failed> failed: [...]`` last.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

import collectives
import shmem
import shmem.backends as _backends
import shmem.device.cuda.device as _c
from shmem.errors import NvshmemError, NvshmemUnsupportedError, SignalTimeoutError
from tests.attention_reference import chunk_reference

RESULTS: list[tuple[str, bool]] = []


def check(label: str, fn: Callable[[], Any]) -> Any:
    try:
        result = fn()
    except Exception as exc:
        print(f"FAIL {label}: {type(exc).__name__}: {exc}"[:600], flush=True)
        traceback.print_exc(limit=-5)
        RESULTS.append((label, False))
        return None
    print(f"OK   {label} -> {result!r}"[:300], flush=True)
    RESULTS.append((label, True))
    return result


def error_of(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:150]
    raise AssertionError("no error raised")


def nvshmem_error(fn: Callable[[], Any]) -> str:
    """The call raises a clear NvshmemError (docs/openshmem.md: refused)."""
    try:
        fn()
    except NvshmemError as exc:
        return str(exc)[:120]
    raise AssertionError("no NvshmemError raised")


def times_out(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except SignalTimeoutError:
        return "raised"
    raise AssertionError("no SignalTimeoutError")


def refused(fn: Callable[[], Any]) -> str:
    """The call raises NvshmemUnsupportedError naming itself (docs/openshmem.md's table)."""
    try:
        fn()
    except NvshmemUnsupportedError as exc:
        assert "not available on the nvshmem backend yet" in str(exc), exc
        return str(exc).split(":")[0]
    raise AssertionError("no NvshmemUnsupportedError raised")


def openshmem_refusals(w: Any, buf: Any, i32: Any) -> None:
    """OpenSHMEM calls the nvshmem backend does not have yet refuse clearly; teams, quiet,
    fence and the queries work."""
    u64 = w.zeros(2, "uint64")
    src = np.zeros(4, np.float32)
    check("put_nbi refused", lambda: refused(lambda: buf.put_nbi(0, src)))
    check("get_nbi refused", lambda: refused(lambda: buf.get_nbi(0, np.zeros(4, np.float32))))
    check("iput refused", lambda: refused(lambda: buf.iput(0, src, stride=2)))
    check("ibget refused", lambda: refused(lambda: buf.ibget(0, 2, block=2, stride=4)))
    check("put_signal refused", lambda: refused(lambda: buf.put_signal(0, src, u64, 1)))
    check("signal_fetch refused", lambda: refused(u64.signal_fetch))
    check("wait_until refused", lambda: refused(lambda: i32.wait_until("ge", 0)))
    check("test_any refused", lambda: refused(lambda: i32.test_any("ge", 0)))
    check("float atomic refused", lambda: refused(lambda: buf.atomic_fetch(0, 0)))
    check("atomic_nbi refused", lambda: refused(lambda: i32.atomic_nbi(0, 0, "fetch_add", 1)))
    ctr = w.zeros(2, "int64")
    check("bitwise atomic refused", lambda: nvshmem_error(lambda: ctr.atomic_fetch_and(0, 0, 1)))
    check("bitwise atomic refused (xor)", lambda: nvshmem_error(lambda: ctr.atomic_xor(0, 0, 1)))

    # locks are built on the integer atomics the backend has: they run (one rank here)
    def lock_cycle() -> tuple[bool, ...]:
        ctr.set_lock(0, timeout=1.0)
        held = ctr.try_lock(0)  # taken: False
        ctr.clear_lock(0)
        again = ctr.try_lock(0)  # free: True, and now held
        ctr.clear_lock(0)
        with ctr.lock(0, timeout=1.0):
            inside = ctr.test_lock(0)  # OpenSHMEM's value: 1, not acquired
        got = (held, again, inside == 0, ctr.test_lock(0) == 0)
        assert got == (False, True, False, True), got
        ctr.clear_lock(0)
        return got

    check("lock: set, test while held, clear, test, with", lock_cycle)
    ctr.close()
    check("quiet and fence", lambda: (w.quiet(), w.fence()))
    check("queries", lambda: (w.pe_accessible(0), w.addr_accessible(buf, 0), w.info_get_version()))
    team = check("split a team", lambda: w.team_world.split_strided(0, 1, 1))
    if team is not None:
        check("team barrier", team.barrier)
        with collectives.Communicator(team) as tcomm:  # the world itself: the GPU path
            check("team all_reduce", lambda: tcomm.all_reduce(np.ones(4, np.float32)).tolist())
        check("team destroy", team.destroy)
    u64.close()


def attention_checks() -> None:
    """collectives.mha.attention and attention_backward on GPU Buffers: the launcher's
    arguments, strides, grids and buffers, against the fake driver's emulation of the
    attention kernels (which computes in double) and the host kernels."""
    from collectives.mha import (
        MaskSpec,
        MHASchedule,
        MHATileSummary,
        TileScheduler,
        attention,
        attention_backward,
    )
    from collectives.mha.gpu import (
        attention_backward_gpu,
        attention_gpu,
        work_order,
        worker_items,
    )
    from collectives.mha.gpu_args import BLOCK_M
    from shmem import Accelerator, Buffer, DeviceContext

    gpu = Accelerator(0)

    def dev(a: np.ndarray) -> Buffer:
        b = Buffer(a.dtype, a.shape, device=gpu)
        b.inplace_copy_from(Buffer.from_numpy(np.ascontiguousarray(a)))
        return b

    rng = np.random.default_rng(0)

    def forward(
        dtype: Any, d: int, docs: list[int] | None, heads: int, kv: int, **kw: Any
    ) -> float:
        tokens = docs[-1] if docs else 150
        shape = (tokens,) if docs else (2, tokens)
        q, k, v = (rng.standard_normal((*shape, n, d)).astype(dtype) for n in (heads, kv, kv))
        extra: dict[str, Any] = {"valid_length": docs} if docs else {}
        out, lse = attention(dev(q), dev(k), dev(v), return_lse=True, **extra, **kw)
        assert isinstance(out, Buffer) and out.shape == q.shape and out.dtype == q.dtype
        want, want_lse = attention(q, k, v, return_lse=True, **extra, **kw)
        err = float(np.abs(out.to_numpy().astype(np.float64) - want.astype(np.float64)).max())
        lse_err = float(np.abs(lse.to_numpy() - want_lse).max())
        tol = 1e-4 if dtype is np.float32 else 2e-2
        assert err < tol and lse_err < 5 * tol, (err, lse_err)
        return err

    bf16, f16 = ml_dtypes.bfloat16, np.float16
    check(
        "GPU attention bf16 d128 causal GQA (queued)",
        lambda: forward(bf16, 128, None, 4, 2, causal=True, workers=5),
    )
    check(
        "GPU attention bf16 d64 document-causal ragged (static, lpt)",
        lambda: forward(
            bf16, 64, [0, 5, 140, 141, 333], 2, 1, causal=True, scheduler="static", workers=3
        ),
    )
    check(
        "GPU attention f16 d80 window (transient)",
        lambda: forward(f16, 80, None, 2, 2, window=(37, 5), scheduler="transient"),
    )
    check(
        "GPU attention f32 d72 general path",
        lambda: forward(np.float32, 72, [0, 99, 180], 2, 2, causal=True),
    )

    def trace() -> str:
        docs, heads, d, workers = [0, 70, 400, 401, 600], 3, 64, 5
        mask = MaskSpec(causal=True)
        q, k, v = (rng.standard_normal((600, heads, d)).astype(bf16) for _ in range(3))
        summary = MHATileSummary.create(
            num_heads=heads, block_m=BLOCK_M, block_n=BLOCK_M, row_offsets=docs, mask=mask
        )
        for scheduler in ("static", "queued"):
            _, grid, _ = work_order(summary, scheduler, MHASchedule.LPT, workers)
            cap = summary.num_items + 1
            tr = Buffer.zeros((grid * cap,), "int32", device=gpu)
            attention_gpu(
                dev(q), dev(k), dev(v), mask=mask, offsets=docs, scale=0.125,
                scheduler=scheduler, schedule=MHASchedule.LPT, workers=workers,
                return_lse=False, trace=tr, trace_cap=cap,
            )  # fmt: skip
            taken = [[int(x) - 1 for x in row if x] for row in tr.to_numpy().reshape(grid, cap)]
            sched = TileScheduler(workers, MHASchedule.LPT)
            if scheduler == "static":
                assert taken == [worker_items(sched, summary, c) for c in range(grid)], taken
            else:
                valid = [i for i in range(summary.num_items) if sched.valid(summary, i)]
                assert sorted(i for t in taken for i in t) == valid, taken
        return "ok"

    check("GPU attention: the CTAs take the host schedulers' tiles", trace)

    def on_a_stream() -> str:
        q, k, v = (rng.standard_normal((1, 90, 2, 64)).astype(bf16) for _ in range(3))
        with DeviceContext(gpu) as ctx:
            out = attention(dev(q), dev(k), dev(v), causal=True, stream=ctx)
            ctx.synchronize()
        want = attention(q, k, v, causal=True)
        assert np.abs(out.to_numpy().astype(np.float32) - want.astype(np.float32)).max() < 2e-2
        bad = error_of(lambda: attention(dev(q), dev(k), dev(v), stream="s"))
        assert "invalid stream" in bad, bad
        return "ok"

    check("GPU attention on a caller's stream", on_a_stream)

    def backward() -> float:
        docs = [0, 33, 160, 161]
        q = rng.standard_normal((161, 4, 32)).astype(np.float32)
        k, v = (rng.standard_normal((161, 2, 32)).astype(np.float32) for _ in range(2))
        do = rng.standard_normal(q.shape).astype(np.float32)
        kw: dict[str, Any] = {"valid_length": docs, "causal": True, "window": (20, None)}
        o, lse = attention(q, k, v, return_lse=True, **kw)
        want = attention_backward(q, k, v, o, lse, do, **kw)
        og, lg = attention(dev(q), dev(k), dev(v), return_lse=True, **kw)
        got = attention_backward(dev(q), dev(k), dev(v), og, lg, dev(do), **kw)
        err = max(float(np.abs(g.to_numpy() - w).max()) for g, w in zip(got, want, strict=True))
        assert err < 1e-4, err
        return err

    check("GPU attention backward (GQA, ragged, causal window)", backward)

    def chunk_units() -> str:
        """A query chunk against another chunk's keys (kv_len != seq_len, position delta):
        the sequence-parallel unit, forward and backward, against a float64 reference."""
        cases = [  # (dtype, d, rows, keys, heads, kv heads, delta, mask)
            (bf16, 64, 70, 130, 4, 2, 60, MaskSpec(causal=True)),  # queries at a cache's end
            (f16, 128, 64, 64, 2, 1, 64, MaskSpec(causal=True)),  # an earlier chunk: all seen
            (bf16, 64, 50, 90, 2, 2, -20, MaskSpec(causal=True)),  # 20 rows see nothing
            (bf16, 64, 40, 40, 2, 2, -40, MaskSpec(causal=True)),  # a later chunk: nothing
            (np.float32, 40, 33, 77, 2, 2, -20, MaskSpec(causal=False, left=15, right=4)),
        ]
        worst = 0.0
        for dtype, d, n, m, h, hk, delta, mask in cases:
            q = rng.standard_normal((2, n, h, d)).astype(dtype)
            k, v = (rng.standard_normal((2, m, hk, d)).astype(dtype) for _ in range(2))
            do = rng.standard_normal(q.shape).astype(dtype)
            o, lse, *grads = chunk_reference(q, k, v, do, delta, mask)
            scale = 1.0 / np.sqrt(d)
            og, lg = attention_gpu(
                dev(q), dev(k), dev(v), mask=mask, offsets=None, scale=scale,
                scheduler="queued", schedule=MHASchedule.LPT, workers=3, return_lse=True,
                delta=delta,
            )  # fmt: skip
            tol = 1e-4 if dtype is np.float32 else 2e-2
            got_lse = lg.to_numpy()
            assert np.array_equal(np.isinf(got_lse), np.isinf(lse)), (delta, "LSE -inf rows")
            fin = np.isfinite(lse)
            err = max(
                float(np.abs(og.to_numpy().astype(np.float64) - o).max()),
                float(np.abs(got_lse[fin] - lse[fin]).max(initial=0.0)),
            )
            # the backward from the reference's own O and LSE (its inputs' rounding only)
            got = attention_backward_gpu(
                dev(q), dev(k), dev(v), dev(o.astype(dtype)), dev(lse.astype(np.float32)),
                dev(do), mask=mask, offsets=None, scale=scale, delta=delta,
            )  # fmt: skip
            for g, want in zip(got, grads, strict=True):
                assert g.shape == want.shape, (g.shape, want.shape)
                err = max(err, float(np.abs(g.to_numpy().astype(np.float64) - want).max()))
            assert err < tol, (delta, err)
            worst = max(worst, err)
        return f"max error {worst:.2e}"

    check("GPU attention unit: a query chunk against another chunk's keys", chunk_units)


def main() -> None:
    _c._driver_present = lambda: True  # the fake libcuda stands in for a driver
    _c.device_count.cache_clear()
    _backends._nvshmem_status = lambda: None  # no /dev/nvidia*: nvshmem4py runs on the fake
    w = shmem.init(backend="nvshmem", heap_nbytes="64MiB", signal_timeout_s=2.0)
    heap: Any = w.heap
    check("backend", lambda: (w.backend, heap.mode, heap.version, heap.limited_mpg))
    buf = w.zeros(100, "float32")
    check("local is a device Buffer", lambda: (buf.local().is_host, buf.local().shape))
    check("zeros", lambda: buf.local().to_numpy()[:3].tolist())  # noqa: PLW0108 - deferred

    def fills() -> str:
        """Device fills of every element size, 16-byte ones (complex128, long double)
        included: one 2-D memset per 32-bit word of the element."""
        cases: list[tuple[Any, Any]] = [
            ("uint8", 7),
            ("float16", -2.5),
            ("float32", 3.25),
            ("float64", -1e300),
            ("complex64", 1 - 2j),
            ("complex128", 3.5 + 4e-300j),
            (np.longdouble, np.longdouble(1) / 3),
        ]
        for dt, value in cases:
            got = shmem.Buffer.scalar(value, dt, device=heap.device).to_numpy()
            want = np.asarray(value).astype(shmem.dtypes.as_dtype(dt))
            assert got.tobytes() == want.tobytes(), (dt, got, want)
        return "ok"

    check("device fills of every element size", fills)
    check("put numpy, get", lambda: (buf.put(0, np.arange(100, dtype=np.float32)), buf.get(0)[4]))
    dev_dst = shmem.Buffer("float32", 100, device=heap.device)
    check("get into a device Buffer", lambda: buf.get(0, dev_dst).to_numpy()[2])
    check("put a device Buffer", lambda: (buf.put(0, buf.local()), buf.get(0)[-1]))
    check(
        "put with signal, wait",
        lambda: (buf.put(0, np.ones(100, np.float32), signal=(3, 7)), w.wait_until(3, "eq", 7)),
    )
    check("signal read", lambda: w.signals.read(3))

    def unsigned_words() -> int:  # uint64 signals: up to 2**64 - 1, compared unsigned
        top = (1 << 64) - 1
        w.signal(0, 6, top)
        seen = w.wait_until(6, "gt", 1 << 63)
        assert seen == top == w.signals.read(6), seen
        w.signal(0, 6, 1, "add")  # wraps
        assert w.wait_until(6, "lt", 1) == 0
        return seen

    check("signals are unsigned 64-bit words", unsigned_words)
    check("a wait times out", lambda: times_out(lambda: w.wait_until(4, "eq", 1, timeout=0.1)))
    check("barrier", lambda: [w.barrier() for _ in range(3)])
    ctr = w.zeros(2, "int64")
    check(
        "atomics int64",
        lambda: (
            ctr.atomic_fetch_add(0, 0, 5),
            ctr.atomic_fetch_add(0, 0, -2),
            ctr.atomic_swap(0, 1, 9),
            ctr.atomic_compare_swap(0, 1, 9, -4),
            ctr.get(0).tolist(),
        ),
    )
    i32 = w.zeros(1, "int32")
    check("atomics int32", lambda: (i32.atomic_fetch_add(0, 0, -1), i32.get(0).tolist()))
    check("DLPack device", buf.__dlpack_device__)
    host = np.zeros(100, np.float32)
    check("enqueue_copy_to", lambda: (buf.enqueue_copy_to(host), w.ctx.synchronize(), host[0]))
    check(
        "enqueue_copy_from",
        lambda: (
            buf.enqueue_copy_from(np.full(100, 3, np.float32)),
            w.ctx.synchronize(),
            buf.get(0)[0],
        ),
    )
    comm = check("Communicator", lambda: collectives.Communicator(w))
    if comm is not None:
        for name in ("float16", "bfloat16", "float32", "float64"):
            dt = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
            x = (np.arange(1000) % 17).astype(dt)
            for algo in ("one_shot", "two_shot"):
                check(
                    f"all_reduce {name} {algo}",
                    lambda x=x, algo=algo: bool(
                        (comm.all_reduce(x, op="sum", algorithm=algo) == x).all()
                    ),
                )
        big = np.arange(3 << 20, dtype=np.float32)  # more than the scratch: in pieces
        check("all_reduce in pieces", lambda: bool((comm.all_reduce(big) == big).all()))
        out = np.zeros(1000, np.float32)
        check(
            "all_reduce into a numpy out",
            lambda: (comm.all_reduce(np.ones(1000, np.float32), out=out) is out, out[1]),
        )
        check(
            "all_reduce in place on an SHMEMBuffer",
            lambda: comm.all_reduce(buf, out=buf.local()).to_numpy()[0],
        )
        check("all_reduce of a device Buffer", lambda: comm.all_reduce(buf.local()).to_numpy()[0])
        check(
            "long double refused",
            lambda: error_of(lambda: comm.all_reduce(np.zeros(4, np.longdouble))),
        )

        def every_dtype() -> str:
            """Integers, bool, float8 and complex on the GPU kernels (the op a launch
            argument): at one rank every op gives the input back (avg: x / 1)."""
            for name in (
                "int8",
                "uint16",
                "int32",
                "uint64",
                "bool",
                "float8_e4m3",
                "float8_e5m2",
                "complex64",
                "complex128",
            ):
                dt = shmem.dtypes.as_dtype(name)
                x = (np.arange(24) % 5).astype(dt)
                ops = ["sum", "prod", "max"]
                if name != "bool":
                    ops.append("avg")
                if dt.kind in "iub":
                    ops += ["band", "bxor"]
                for op in ops:
                    if dt.kind == "c" and op == "max":
                        continue
                    for algo in ("one_shot", "two_shot"):
                        got = comm.all_reduce(x, op=op, algorithm=algo)
                        assert got.dtype == dt and got.tobytes() == x.tobytes(), (name, op, algo)
                    got = comm.reduce_scatter(x, op=op)
                    assert got.tobytes() == x.tobytes(), (name, op)
            bad = error_of(lambda: comm.all_reduce(np.zeros(4, np.float32), op="band"))
            assert "needs an integer" in bad, bad
            return "ok"

        check("GPU all_reduce and reduce_scatter of every dtype", every_dtype)

        def with_check_args() -> tuple[int, str]:
            gpu = comm._gpu
            gpu.check_args, before = True, gpu.calls
            try:
                assert (comm.all_reduce(np.ones(8, np.float32)) == 1).all()
                bad = error_of(lambda: comm.all_reduce(np.zeros(4, np.longdouble)))
                assert gpu.calls == before + 2, (gpu.calls, before)  # both compared
                assert "long double" in bad, bad
                return gpu.calls - before, bad
            finally:
                gpu.check_args = False

        check("all_reduce honours check_args", with_check_args)

        def family() -> str:
            """The family on the GPU stages (one rank: every part is this rank's)."""
            x = np.arange(12, dtype=np.float32)
            assert (comm.all_gather(x) == x).all()
            assert (comm.all_to_all(x) == x).all()
            y = x.copy()
            assert comm.broadcast(y, root=0) is y and (y == x).all()
            assert (comm.reduce_scatter(x, op="max") == x).all()
            assert (comm.reduce_scatter(x.astype(np.float64), op="avg") == x).all()
            dev = comm.all_gather(buf.local())  # a device Buffer in, a device Buffer out
            assert (dev.to_numpy() == buf.local().to_numpy()).all()
            out = np.empty(12, np.float32)
            assert comm.all_to_all(x, out=out) is out and (out == x).all()
            big = np.arange(3 << 20, dtype=np.uint8)  # beyond the scratch: in pieces
            assert (comm.all_gather(big) == big).all()
            assert (comm.reduce_scatter(big.astype(np.float32) % 7) == big % 7).all()
            bad = error_of(lambda: comm.broadcast(x, root=5))
            assert "root" in bad, bad
            assert (comm.all_gather(x, stream=w.ctx) == x).all()  # ordered on that stream
            bad = error_of(lambda: comm.all_to_all(x, stream="s"))
            assert "invalid stream" in bad, bad
            return "ok"

        check("family on the GPU stages", family)

        def sequence_parallel() -> str:
            """sequence_parallel_attention on GPU Buffers (one rank: one unit per call)
            against the host schedules on the same numpy inputs, and the GPU refusals."""
            from collectives.mha import (
                SequenceParallelStats,
                attention,
                attention_backward,
                sequence_parallel_attention,
                sequence_parallel_attention_backward,
            )

            rng = np.random.default_rng(3)
            bf16 = ml_dtypes.bfloat16

            def dev(a: np.ndarray) -> shmem.Buffer:
                b = shmem.Buffer(a.dtype, a.shape, device=heap.device)
                b.inplace_copy_from(shmem.Buffer.from_numpy(np.ascontiguousarray(a)))
                return b

            cases: list[tuple[Any, int, dict[str, Any]]] = [
                (bf16, 64, {"schedule": "ring", "causal": True}),
                (np.float32, 40, {"schedule": "zigzag", "window": (30, 2)}),
                (np.float16, 128, {"schedule": "ring"}),
                (
                    bf16,
                    64,
                    {"schedule": "zigzag", "causal": True, "valid_length": [0, 20, 21, 90, 150]},
                ),
                (np.float32, 64, {"schedule": "ring", "valid_length": [0, 70, 150]}),
                (bf16, 64, {"schedule": "dynamic", "causal": True}),
                (np.float32, 64, {"schedule": "dynamic", "causal": True, "unit_rows": 40}),
                (np.float16, 64, {"schedule": "dynamic", "unit_rows": 33, "window": (50, 9)}),
                (
                    np.float32,
                    64,
                    {"schedule": "dynamic", "unit_rows": 40, "valid_length": [0, 60, 61, 150]},
                ),
            ]
            for dtype, d, kw in cases:
                q = rng.standard_normal((150, 4, d)).astype(dtype)
                k, v = (rng.standard_normal((150, 2, d)).astype(dtype) for _ in range(2))
                stats = SequenceParallelStats()
                o, lse = sequence_parallel_attention(
                    comm, dev(q), dev(k), dev(v), return_lse=True, stats=stats, **kw
                )
                if kw.get("unit_rows"):  # several units per query chunk, folded in order
                    assert stats.units_computed > 4, stats
                assert isinstance(o, shmem.Buffer) and o.shape == q.shape and o.dtype == q.dtype
                # one rank holds the whole sequence: the single-process attention is the answer
                host_kw = {n: kw[n] for n in ("causal", "window", "valid_length") if n in kw}
                ragged = "valid_length" in kw  # [tokens, heads, d] as it is, else a batch of 1
                qh, kh, vh = (a if ragged else a[None] for a in (q, k, v))
                want, want_lse = attention(qh, kh, vh, return_lse=True, **host_kw)
                if not ragged:
                    want, want_lse = want[0], want_lse[0]
                tol = 1e-4 if dtype is np.float32 else 2e-2
                err = np.abs(o.to_numpy().astype(np.float64) - want.astype(np.float64)).max()
                assert err < tol, (kw, err)
                assert np.abs(lse.to_numpy() - want_lse).max() < 5 * tol, kw
                do = rng.standard_normal(q.shape).astype(dtype)
                grads = sequence_parallel_attention_backward(
                    comm, dev(do), dev(q), dev(k), dev(v), o, lse, **kw
                )
                o_h, l_h, do_h = o.to_numpy(), lse.to_numpy(), do
                if not ragged:
                    o_h, l_h, do_h = o_h[None], l_h[None], do_h[None]
                wants = attention_backward(qh, kh, vh, o_h, l_h, do_h, **host_kw)
                for g, w_, a in zip(grads, wants, (q, k, v), strict=True):
                    assert isinstance(g, shmem.Buffer) and g.dtype == a.dtype, type(g)
                    exp = w_ if ragged else w_[0]
                    gerr = np.abs(g.to_numpy().astype(np.float64) - exp.astype(np.float64))
                    assert gerr.max() < 4 * tol, (kw, gerr.max())
            x = dev(rng.standard_normal((8, 2, 64)).astype(bf16))
            refusals: list[tuple[dict[str, Any], str]] = [
                ({"schedule": "ring", "valid_length": [0, 3, 9]}, "valid_length"),
                ({"schedule": "spiral"}, "unknown schedule"),
            ]
            for kw, words in refusals:
                bad = error_of(lambda kw=kw: sequence_parallel_attention(comm, x, x, x, **kw))
                assert words in bad, bad
            bad = error_of(  # a numpy lse among GPU inputs
                lambda: sequence_parallel_attention_backward(
                    comm, x, x, x, x, x, np.zeros((8, 2), np.float32), schedule="ring"
                )
            )
            assert "lse is on the host while another input is on a GPU" in bad, bad
            bad = error_of(
                lambda: sequence_parallel_attention_backward(
                    comm, x, x, x, x, x, dev(np.zeros((8, 2), bf16)), schedule="ring"
                )
            )
            assert "lse must be float32" in bad, bad
            host = np.zeros((8, 2, 64), np.float32)
            bad = error_of(lambda: sequence_parallel_attention(comm, host, host, host))
            assert "numpy inputs run on the host backend" in bad, bad
            # a failure inside a schedule: the caller's error, and the call's buffers freed
            import collectives.mha._sp_gpu

            sp_gpu: Any = collectives.mha._sp_gpu  # its attention_gpu, replaced for a moment

            def broken(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("injected unit failure")

            before = dict(w._arena.allocated())
            real = sp_gpu.attention_gpu
            sp_gpu.attention_gpu = broken
            try:
                for schedule in ("ring", "zigzag", "dynamic"):
                    bad = error_of(
                        lambda s_=schedule: sequence_parallel_attention(comm, x, x, x, schedule=s_)
                    )
                    assert "injected unit failure" in bad, bad
                    assert dict(w._arena.allocated()) == before, schedule
            finally:
                sp_gpu.attention_gpu = real
            odd = dev(rng.standard_normal((8, 2, 12)).astype(bf16))
            bad = error_of(
                lambda: sequence_parallel_attention(comm, odd, odd, odd, schedule="ring")
            )
            assert "multiple of 8" in bad, bad
            return "ok"

        check("sequence_parallel_attention on the GPU (every schedule)", sequence_parallel)

        def folds() -> str:
            """The GPU ring's folding across several (query, key) segment pairs, at one rank:
            rows held out of order (positions 101-149, then 0-100, then 150-179) make three
            segments on each side, nine pairs, some masked out, folded by mha_merge."""
            import dataclasses

            from collectives.mha import SequenceParallelStats, attention, attention_backward
            from collectives.mha._sp_gpu import backward_ring_gpu, forward_ring_gpu
            from collectives.mha._sp_setup import Operands, setup

            rng = np.random.default_rng(5)
            # (49 rows first: with 2 heads the next segment's LSE rows start 8 bytes off a
            # 16-byte boundary, which the backward must take)
            pos = np.r_[np.arange(101, 150), np.arange(0, 101), np.arange(150, 180)]
            worst = 0.0
            for dtype, causal, window in (
                (np.float32, True, None),
                (ml_dtypes.bfloat16, False, (40, 10)),
            ):
                q = rng.standard_normal((180, 2, 64)).astype(dtype)
                k, v = (rng.standard_normal((180, 1, 64)).astype(dtype) for _ in range(2))
                ops = Operands(
                    *(shmem.Buffer.from_numpy(a[pos]).to(heap.device) for a in (q, k, v))
                )
                st, ops = setup(
                    comm, "folds", ops, schedule="ring", causal=causal, window=window,
                    valid_length=None, scale=None, block_m=64, block_n=64, unit_rows=None,
                    threads=None, stats=None, prepare=lambda ops: ops,
                )  # fmt: skip
                st = dataclasses.replace(st, positions=[pos])
                stats = SequenceParallelStats()
                o, lse = forward_ring_gpu(st, ops.q, ops.k, ops.v, stats)
                want, want_lse = attention(
                    q[None], k[None], v[None], causal=causal, window=window, return_lse=True
                )
                err = np.abs(o.to_numpy().astype(np.float64) - want[0][pos]).max()
                assert err < (1e-5 if dtype is np.float32 else 2e-2), (causal, err)
                assert np.abs(lse.to_numpy() - want_lse[0][pos]).max() < 1e-3, causal
                assert 3 <= stats.units_computed < 9, stats.units_computed  # masked pairs skipped
                worst = max(worst, float(err))
                # the backward over the same pairs: dQ summed here, dK/dV through the slots
                do = rng.standard_normal(q.shape).astype(dtype)
                grads = backward_ring_gpu(
                    st, ops.q, ops.k, ops.v, o,
                    shmem.Buffer.from_numpy(do[pos]).to(heap.device), lse, stats,
                )  # fmt: skip
                inverse = np.argsort(pos)
                wants = attention_backward(
                    q[None], k[None], v[None], o.to_numpy()[inverse][None],
                    lse.to_numpy()[inverse][None], do[None], causal=causal, window=window,
                )  # fmt: skip
                for g, w_ in zip(grads, wants, strict=True):
                    gerr = np.abs(g.to_numpy().astype(np.float64) - w_[0][pos]).max()
                    assert gerr < (1e-4 if dtype is np.float32 else 8e-2), (causal, gerr)
                    worst = max(worst, float(gerr))
            return f"max error {worst:.1e}"

        check("GPU sequence-parallel folds across segment pairs", folds)

        class Foreign:
            """Another library's stream (torch, cupy): only ``__cuda_stream__``."""

            def __init__(self, handle: int) -> None:
                self.handle = handle

            def __cuda_stream__(self) -> tuple[int, int]:
                return (0, self.handle)

        def foreign_stream() -> str:
            x = np.arange(12, dtype=np.float32)
            s = Foreign(int(w.ctx.stream.handle))
            assert (comm.all_reduce(x, stream=s) == x).all()
            assert (comm.all_gather(x, stream=s) == x).all()
            return "ok"

        check("collectives on a __cuda_stream__ stream", foreign_stream)

        def fused() -> str:
            """out_dtype and scale in the all-reduce kernel (one rank: x * scale)."""
            x = (np.arange(300) / 7).astype(ml_dtypes.bfloat16)
            got = comm.all_reduce(x, out_dtype="float32", scale=0.25)
            assert got.dtype == np.float32, got.dtype
            want = x.astype(np.float32) * np.float32(0.25)
            assert got.tobytes() == want.tobytes()
            got = comm.all_reduce(x, algorithm="two_shot", out_dtype=np.float32)
            assert got.tobytes() == x.astype(np.float32).tobytes()
            y = np.arange(10, dtype=np.float32)
            assert (comm.all_reduce(y, op="avg", scale=3.0) == y * 3).all()
            bad = error_of(lambda: comm.all_reduce(y, out_dtype="float64"))
            assert "may widen float16 or bfloat16" in bad, bad
            return "ok"

        check("GPU all_reduce out_dtype and scale", fused)

        def captured() -> str:
            """A call recorded while the stream captures: no host wait, no host stage
            state; eager calls after it (the fake runs kernels at launch) stay in step."""
            import shmem.cuda as shmem_cuda

            real = shmem_cuda.is_capturing
            x = buf.local()  # device input and output, as a captured call needs
            out = comm.all_reduce(x)
            shmem_cuda.is_capturing = lambda stream: True
            try:
                for _ in range(3):
                    comm.all_reduce(x, out=out)
            finally:
                shmem_cuda.is_capturing = real
            again = comm.all_reduce(np.ones(8, np.float32))  # the stages stayed in step
            assert (again == 1).all()
            return "ok"

        check("a call recorded while capturing needs no host stage state", captured)

        check("Communicator barrier", comm.barrier)

        def gpu_flight() -> str:  # the GPU engine's calls in the flight recorder
            from shmem import flight

            ring = flight.recorder().log().records
            mine = [r for r in ring if r.stream == comm.stream and r.seq]
            assert mine[-1].op == "barrier" and mine[-1].state == "done", mine[-1]
            done = {r.op for r in mine if r.state == "done"}
            assert {"all_reduce", "all_gather", "barrier"} <= done, done
            failed = sum(r.state == "failed" for r in mine)  # the calls refused above
            assert [r.seq for r in mine] == list(range(mine[0].seq, mine[-1].seq + 1))
            return f"{len(mine)} calls, {failed} refused, last #{mine[-1].seq}"

        check("GPU engine calls in the flight recorder", gpu_flight)
        check("Communicator close", comm.close)
    openshmem_refusals(w, buf, i32)
    attention_checks()
    for b in (i32, ctr, buf):
        check("close a buffer", b.close)
    check("heap back to the pad only", lambda: w.heap_stats().num_allocated)
    check("finalize", w.finalize)
    from tests.fakegpu.fakedriver import nvshmem_calls

    print("nvshmem calls:", nvshmem_calls())
    bad = [label for label, ok in RESULTS if not ok]
    print("SUMMARY", len(RESULTS) - len(bad), "ok;", len(bad), "failed:", bad, flush=True)


if __name__ == "__main__":
    main()
