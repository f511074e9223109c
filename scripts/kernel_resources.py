"""Every kernel's registers, shared memory, stack and spills at sm_90 and sm_80, from NVIDIA's
own tools without a GPU: NVRTC makes the PTX of each CUDA source of the runtime (as
``shmem.device.cuda.nvrtc.source_of`` gives it), ``ptxas -v`` assembles it and reports.

    python scripts/kernel_resources.py            # rewrites the two files below
    python scripts/kernel_resources.py --check    # exits 1 when they are stale

Writes ``tests/fakegpu/cudacpu/resources.tsv`` (the fake GPU's occupancy limits and
tests/unit/test_kernel_resources.py read it; a header line holds each source's hash, so a
changed kernel without a new table fails that test) and the table between the
``kernel-resources`` markers of ``docs/gpu.md``. Takes a few minutes on two cores (NVRTC).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("shmem/kernels/signals.cu", "shmem/kernels/strided_copy.cu",
           "collectives/kernels/allreduce.cu", "collectives/kernels/attention.cu")  # fmt: skip
ARCHS = ("90", "80")
TSV = ROOT / "tests" / "fakegpu" / "cudacpu" / "resources.tsv"
DOC = ROOT / "docs" / "gpu.md"
BEGIN, END = "<!-- kernel-resources: begin -->", "<!-- kernel-resources: end -->"
FIELDS = ("arch", "kernel", "registers", "shared", "stack", "spill_stores", "spill_loads")

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for 'sm_(\d+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def digest(relative: str) -> str:
    """The hash of a source as NVRTC compiles it (its includes in place)."""
    sys.path.insert(0, str(ROOT))
    from shmem.device.cuda.nvrtc import source_of

    return hashlib.sha256(source_of(relative).encode()).hexdigest()[:16]


def ptx(relative: str, arch: str) -> str:
    """NVRTC's PTX of ``relative`` for ``compute_<arch>``, with the runtime's options."""
    from cuda.bindings import nvrtc

    from shmem.device.cuda.nvrtc import source_of

    def ok(result: tuple[object, ...]) -> tuple[object, ...]:
        if int(result[0]) != 0:  # type: ignore[call-overload]
            raise RuntimeError(f"kernel_resources.py: NVRTC failed on {relative} ({result[0]})")
        return result

    src = source_of(relative).encode()
    _, prog = ok(nvrtc.nvrtcCreateProgram(src, Path(relative).name.encode(), 0, [], []))
    opts = [f"--gpu-architecture=compute_{arch}".encode(), b"--std=c++17"]
    result = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(result[0]) != 0:
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"kernel_resources.py: {relative}: {log.decode(errors='replace')}")
    _, n = ok(nvrtc.nvrtcGetPTXSize(prog))
    out = b" " * int(n)  # type: ignore[call-overload]
    ok(nvrtc.nvrtcGetPTX(prog, out))
    nvrtc.nvrtcDestroyProgram(prog)
    text: str = out.rstrip(b"\0 ").decode()
    return text


def ptxas() -> str:
    """NVIDIA's ptxas: the nvcc wheel's (pip install '.[nvrtc]'), else one on PATH."""
    import site

    for root in site.getsitepackages():
        for hit in sorted(Path(root).glob("nvidia/cu*/bin/ptxas")):
            return str(hit)
    found = shutil.which("ptxas")
    if found is None:
        raise RuntimeError("kernel_resources.py: no ptxas (pip install '.[nvrtc]')")
    return found


def resources(relative: str, arch: str) -> list[dict[str, int | str]]:
    """``ptxas -v``'s figures for every kernel of ``relative`` at ``sm_<arch>``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx(relative, arch))
        run = subprocess.run(
            [ptxas(), f"-arch=sm_{arch}", "-v", str(path), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True, text=True, check=True, timeout=1200,
        )  # fmt: skip
    rows: list[dict[str, int | str]] = []
    current: dict[str, int | str] = {}
    for line in run.stderr.splitlines():
        if m := _ENTRY.search(line):
            current = {"arch": m[2], "kernel": m[1], "shared": 0, "stack": 0}
            current.update(spill_stores=0, spill_loads=0)
            rows.append(current)
        elif (m := _FRAME.search(line)) and current:
            current.update(stack=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        elif (m := _USED.search(line)) and current:
            current.update(registers=int(m[1]), shared=int(m[2] or 0))
    return rows


def table() -> tuple[str, list[dict[str, int | str]]]:
    """The TSV text (hash header, one row per kernel and arch) and its rows."""
    rows = [r for rel in SOURCES for arch in ARCHS for r in resources(rel, arch)]
    rows.sort(key=lambda r: (r["arch"], r["kernel"]))
    head = "# " + " ".join(f"{rel}={digest(rel)}" for rel in SOURCES)
    lines = [head, "\t".join(FIELDS)]
    lines += ["\t".join(str(r[f]) for f in FIELDS) for r in rows]
    return "\n".join(lines) + "\n", rows


def markdown(rows: list[dict[str, int | str]]) -> str:
    """The docs' summary: kernels grouped by family, the largest figures of each group."""
    groups: dict[tuple[str, str], list[dict[str, int | str]]] = {}
    for r in rows:
        name = str(r["kernel"])
        family = re.sub(r"_(float|bfloat|int|uint|bool|complex).*$", "_*", name)
        groups.setdefault((family, str(r["arch"])), []).append(r)
    out = [
        "| kernels | sm | count | registers | static shared (B) | stack (B) | spills (B) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (family, arch), rs in sorted(groups.items()):
        reg = [int(r["registers"]) for r in rs]
        sh = max(int(r["shared"]) for r in rs)
        st = max(int(r["stack"]) for r in rs)
        sp = max(int(r["spill_stores"]) + int(r["spill_loads"]) for r in rs)
        regs = f"{min(reg)}-{max(reg)}" if min(reg) != max(reg) else str(reg[0])
        out.append(f"| `{family}` | {arch} | {len(rs)} | {regs} | {sh} | {st} | {sp} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the files are stale")
    args = ap.parse_args()
    if args.check:
        head = TSV.read_text().splitlines()[0] if TSV.exists() else ""
        want = "# " + " ".join(f"{rel}={digest(rel)}" for rel in SOURCES)
        print("fresh" if head == want else "stale: run scripts/kernel_resources.py")
        return 0 if head == want else 1
    text, rows = table()
    TSV.write_text(text)
    doc = DOC.read_text()
    if BEGIN in doc and END in doc:
        a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
        DOC.write_text(doc[:a] + "\n" + markdown(rows) + "\n" + doc[b:])
    print(f"{len(rows)} kernels x archs; {TSV.relative_to(ROOT)} and {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
