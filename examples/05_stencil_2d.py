"""A classic OpenSHMEM program: a 2-D Jacobi heat stencil on a grid of ranks split into teams.

The global grid is cut into ``PY x PX`` blocks, one per rank. ``split_2d`` gives each rank
its row team and its column team. Every iteration each rank sends its edges into its
neighbours' halo slots: rows with ``put_signal_nbi`` (contiguous), columns with ``iput``
(strided: one element per row of the block) followed by ``signal``; it then waits for its
own halos with ``wait_until_all`` on its signal words. Halo slots alternate by iteration
parity, so a fast neighbour never overwrites a halo still being read. The heat left in each
row of ranks is summed over the row team, then over the column team (team all-reduces), and a
lock-protected log on rank 0 records the order ranks finished in.

The result is compared, bit for bit, with the same stencil computed serially on rank 0.

    python -m launch -n 4 examples/05_stencil_2d.py
"""

from __future__ import annotations

import math

import numpy as np

import shmem
from collectives import Communicator

BLOCK = 12  # each rank's block is BLOCK x BLOCK
ITERATIONS = 40
NORTH, SOUTH, WEST, EAST = range(4)


def jacobi(u: np.ndarray) -> np.ndarray:
    """One step on the interior of ``u`` (its border holds the boundary or the halos)."""
    out = u.copy()
    out[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
    return out


def serial(py: int, px: int) -> np.ndarray:
    grid = np.zeros((py * BLOCK + 2, px * BLOCK + 2))
    grid[0, :] = 1.0  # the hot top edge
    for _ in range(ITERATIONS):
        grid = jacobi(grid)
    return grid[1:-1, 1:-1]


def main() -> None:
    with shmem.init() as world:
        p = world.world_size
        px = max(d for d in range(1, math.isqrt(p) + 1) if p % d == 0)  # columns of ranks
        py = p // px
        xteam, yteam = world.team_world.split_2d(px)  # my row of ranks, my column of ranks
        x, y = xteam.my_pe, yteam.my_pe
        nbr = {
            NORTH: yteam.members[y - 1] if y > 0 else None,
            SOUTH: yteam.members[y + 1] if y < py - 1 else None,
            WEST: xteam.members[x - 1] if x > 0 else None,
            EAST: xteam.members[x + 1] if x < px - 1 else None,
        }
        opposite = {NORTH: SOUTH, SOUTH: NORTH, WEST: EAST, EAST: WEST}
        u = np.zeros((BLOCK + 2, BLOCK + 2))
        if y == 0:
            u[0, :] = 1.0
        with (
            world.zeros((2, 4, BLOCK), "float64") as halo,  # [parity][direction][element]
            world.zeros(4, "uint64") as sig,  # iteration each halo direction holds
            world.zeros(1, "int64") as lock,
            world.zeros(p + 1, "int64") as log,  # [next free slot, ranks in finishing order]
        ):
            for it in range(1, ITERATIONS + 1):
                base = (it % 2) * 4 * BLOCK
                for d, rank in nbr.items():
                    if rank is None:
                        continue
                    slot = base + opposite[d] * BLOCK  # where my edge lands in its halo
                    if d in (NORTH, SOUTH):
                        row = u[1 if d == NORTH else BLOCK, 1:-1]
                        halo.put_signal_nbi(
                            rank, row, sig, it, sig_index=opposite[d], offset=slot * 8
                        )
                    else:  # a column: every (BLOCK + 2)-th element of my block, from row 1
                        start = (BLOCK + 2) + (1 if d == WEST else BLOCK)
                        src = u.reshape(-1)[start:]
                        halo.iput(rank, src, src_stride=BLOCK + 2, count=BLOCK, index=slot)
                        sig.signal(rank, it, index=opposite[d])  # after the data
                world.quiet()  # my row puts are complete (their signals delivered)
                waiting = [d for d, rank in nbr.items() if rank is not None]
                sig.wait_until_all("ge", it, indices=waiting)
                mine = halo.local()[it % 2]
                if nbr[NORTH] is not None:
                    u[0, 1:-1] = mine[NORTH]
                if nbr[SOUTH] is not None:
                    u[-1, 1:-1] = mine[SOUTH]
                if nbr[WEST] is not None:
                    u[1:-1, 0] = mine[WEST]
                if nbr[EAST] is not None:
                    u[1:-1, -1] = mine[EAST]
                u = jacobi(u)
            world.barrier()

            # the heat in my row of ranks, then in the whole grid (two team all-reduces)
            with Communicator(xteam) as rows, Communicator(yteam) as cols:
                row_heat = rows.all_reduce(np.array([u[1:-1, 1:-1].sum()]))
                total = cols.all_reduce(row_heat)
            with lock.lock():  # a lock-protected append to rank 0's log
                slot = log.g(0, 0)
                log.p(0, 1 + slot, world.rank)
                log.p(0, 0, slot + 1)
            with Communicator(world) as comm:
                blocks = comm.all_gather(np.ascontiguousarray(u[1:-1, 1:-1]).reshape(-1))
            world.barrier()
            if world.rank == 0:
                full = np.zeros((py * BLOCK, px * BLOCK))
                for r in range(p):
                    ry, rx = divmod(r, px)
                    full[ry * BLOCK : (ry + 1) * BLOCK, rx * BLOCK : (rx + 1) * BLOCK] = blocks[
                        r * BLOCK * BLOCK : (r + 1) * BLOCK * BLOCK
                    ].reshape(BLOCK, BLOCK)
                want = serial(py, px)
                assert np.array_equal(full, want), float(np.abs(full - want).max())
                assert math.isclose(total[0], want.sum(), rel_tol=1e-12)
                order = log.local()[1:].tolist()
                assert log.local()[0] == p and sorted(order) == list(range(p))
                print(
                    f"stencil ok: {py}x{px} ranks, {py * BLOCK}x{px * BLOCK} grid, "
                    f"{ITERATIONS} iterations, heat {total[0]:.6f}, finished {order}"
                )
            world.barrier()
        xteam.destroy()
        yteam.destroy()


if __name__ == "__main__":
    main()
