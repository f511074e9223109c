"""``python -m shmem.ipc list``: the buffers published on this node."""

from __future__ import annotations

import sys

from . import list_published


def main(argv: list[str]) -> int:
    if argv[:1] != ["list"]:
        print("usage: python -m shmem.ipc list", file=sys.stderr)
        return 2
    rows = list_published()
    print(f"{'name':24} {'nbytes':>12} {'dtype':10} {'owner pid':>9} {'age':>9}  state")
    for p in rows:
        state = "alive" if p.alive else "owner gone"
        print(f"{p.name:24} {p.nbytes:>12} {p.dtype:10} {p.pid:>9} {p.age_s:>8.1f}s  {state}")
    if not rows:
        print("(nothing published)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
