"""The parameter lists of the kernels the fake driver emulates: the one table they come from.

The fake libcuda (``fake_libcuda.c``, ``fake_collectives.h``, ``fake_attention.h``) reads a
kernel's launch parameters by name, never by position: ``ARG(double, scale)`` is the launch's
``scale``, wherever this table puts it. The fake's build writes the table as a C header,
``fake_kernel_params.h``, into its build folder (``write_header``; by hand:
``python3 tests/fakegpu/kernel_signatures.py DIR`` then ``cc -I DIR ...``), and
``tests/unit/test_fake_kernel_signatures.py`` checks the table against the ``.cu`` kernels'
real parameter lists (macros expanded): same order, names and types. So a reordered kernel
fails that test, not the emulation, silently.

A family is the kernels sharing one parameter list: its ``patterns`` are kernel names, where
``*`` stands for one or more characters; a kernel belongs to the first family (in table
order) with a pattern that matches its name. Types are written as the ``.cu`` files write
them (their typedefs: ``u64``, ``i64``, ``u32``), with ``T`` and ``TO`` for a family's element
types (the input's and the output's), each bound to one type per kernel.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

Param = tuple[str, str]  # (name, C type)


@dataclass(frozen=True)
class Family:
    """Kernels with one parameter list: ``patterns`` (``*``: one or more characters) and
    ``params``, in order, as (name, C type)."""

    name: str
    patterns: tuple[str, ...]
    params: tuple[Param, ...]


# the cross-rank stage parameters of collectives/kernels/allreduce.cu (SYNC_PARAMS)
SYNC: tuple[Param, ...] = (
    ("flags", "u64* const*"),
    ("arrive", "u32*"),
    ("arrive_base", "u32"),
    ("stage0", "u64"),
    ("timeout_ns", "u64"),
    ("status", "int*"),
    ("rank", "int"),
    ("size", "int"),
    ("sig", "u64"),
)

# the forward attention kernels' parameters (collectives/kernels/attention.cu, FWD_ARGS)
FWD: tuple[Param, ...] = (
    ("q", "const T*"),
    ("k", "const T*"),
    ("v", "const T*"),
    ("o", "T*"),
    ("lse", "float*"),
    ("order", "const int*"),
    ("num_items", "int"),
    ("mode", "int"),
    ("counters", "int*"),
    ("row_offsets", "const i64*"),
    ("seq_len", "int"),
    ("kv_len", "int"),
    ("trace", "int*"),
    ("trace_cap", "int"),
    ("q_sb", "i64"),
    ("q_ss", "i64"),
    ("q_sh", "i64"),
    ("k_sb", "i64"),
    ("k_ss", "i64"),
    ("k_sh", "i64"),
    ("v_sb", "i64"),
    ("v_ss", "i64"),
    ("v_sh", "i64"),
    ("o_sb", "i64"),
    ("o_ss", "i64"),
    ("o_sh", "i64"),
    ("l_sb", "i64"),
    ("l_ss", "i64"),
    ("l_sh", "i64"),
    ("causal", "int"),
    ("left", "int"),
    ("right", "int"),
    ("delta", "int"),
    ("group", "int"),
    ("scale_log2", "float"),
)

# the masks and shapes of the backward kernels (dkdv and dq), after their gradient outputs
BWD_TAIL: tuple[Param, ...] = (
    ("row_offsets", "const i64*"),
    ("seq_len", "int"),
    ("kv_len", "int"),
    ("heads", "int"),
    ("kv_heads", "int"),
    ("d", "int"),
    ("causal", "int"),
    ("left", "int"),
    ("right", "int"),
    ("delta", "int"),
    ("scale", "float"),
)
BWD_HEAD: tuple[Param, ...] = (
    ("q", "const T*"),
    ("k", "const T*"),
    ("v", "const T*"),
    ("dout", "const T*"),
    ("lse", "const float*"),
    ("dvec", "const float*"),
)

FAMILIES: tuple[Family, ...] = (
    # shmem/kernels/strided_copy.cu
    Family(
        "shmem_strided_copy",
        ("shmem_strided_copy",),
        (
            ("dst", "char*"),
            ("src", "const char*"),
            ("n", "unsigned long long"),
            ("rank", "int"),
            ("elem_size", "int"),
            ("meta", "const long long*"),
        ),
    ),
    # shmem/kernels/signals.cu
    Family("shmem_signal", ("shmem_signal",), (("flag", "u64*"), ("value", "u64"), ("op", "int"))),
    Family(
        "shmem_wait_until",
        ("shmem_wait_until",),
        (
            ("flag", "const u64*"),
            ("cmp", "int"),
            ("value", "u64"),
            ("timeout_ns", "u64"),
            ("result", "i64*"),
        ),
    ),
    Family(
        "shmem_barrier",
        ("shmem_barrier",),
        (
            ("pads", "u64* const*"),
            ("rank", "int"),
            ("size", "int"),
            ("epoch", "u64"),
            ("timeout_ns", "u64"),
            ("result", "i64*"),
        ),
    ),
    Family(
        "shmem_atomic",
        ("shmem_atomic",),
        (
            ("target", "void*"),
            ("width", "int"),
            ("op", "int"),
            ("value", "u64"),
            ("compare", "u64"),
            ("old", "u64*"),
        ),
    ),
    # tests/gpu/kernels/saxpy.cu
    Family(
        "saxpy",
        ("saxpy",),
        (("a", "float"), ("x", "const float*"), ("y", "float*"), ("n", "unsigned long long")),
    ),
    Family("block_ids", ("block_ids",), (("out", "int*"),)),
    # collectives/kernels/allreduce.cu: the op a runtime argument (``_op``) first
    Family(
        "allreduce_one_shot_op",
        ("allreduce_one_shot_*_op",),
        (
            ("input", "const T*"),
            ("scratch", "const T* const*"),
            ("out", "T*"),
            ("n", "u64"),
            ("scale", "double"),
            ("op", "int"),
            *SYNC,
        ),
    ),
    Family(
        "allreduce_one_shot",
        ("allreduce_one_shot_*",),
        (
            ("input", "const T*"),
            ("scratch", "const T* const*"),
            ("out", "TO*"),
            ("n", "u64"),
            ("scale", "double"),
            *SYNC,
        ),
    ),
    Family(
        "allreduce_two_shot_op",
        ("allreduce_two_shot_*_op",),
        (
            ("input", "const T*"),
            ("scratch", "const T* const*"),
            ("results", "T* const*"),
            ("out", "T*"),
            ("n", "u64"),
            ("scale", "double"),
            ("op", "int"),
            *SYNC,
        ),
    ),
    Family(
        "allreduce_two_shot",
        ("allreduce_two_shot_*",),
        (
            ("input", "const T*"),
            ("scratch", "const T* const*"),
            ("results", "TO* const*"),
            ("out", "TO*"),
            ("n", "u64"),
            ("scale", "double"),
            *SYNC,
        ),
    ),
    Family(
        "reduce_scatter_op",
        ("reduce_scatter_*_op",),
        (
            ("input", "const T*"),
            ("scratch", "const T* const*"),
            ("out", "T*"),
            ("n", "u64"),
            ("lo", "u64"),
            ("hi", "u64"),
            ("op", "int"),
            *SYNC,
        ),
    ),
    Family(
        "reduce_scatter",
        ("reduce_scatter_*",),
        (
            ("input", "const T*"),
            ("scratch", "const T* const*"),
            ("out", "T*"),
            ("n", "u64"),
            ("lo", "u64"),
            ("hi", "u64"),
            *SYNC,
        ),
    ),
    Family(
        "reduce_local",
        ("reduce_local_*",),
        (("inputs", "const T* const*"), ("out", "T*"), ("n", "u64"), ("count", "int")),
    ),
    Family("allreduce_drain", ("allreduce_drain",), SYNC[:-1]),  # no signature
    Family(
        "family_gather",
        ("family_all_gather", "family_all_to_all"),
        (
            ("input", "const u8*"),
            ("scratch", "const u8* const*"),
            ("out", "u8*"),
            ("nbytes", "u64"),
            ("stride", "u64"),
            *SYNC,
        ),
    ),
    Family(
        "family_broadcast",
        ("family_broadcast",),
        (
            ("input", "const u8*"),
            ("scratch", "const u8* const*"),
            ("out", "u8*"),
            ("nbytes", "u64"),
            ("root", "int"),
            *SYNC,
        ),
    ),
    # collectives/kernels/attention.cu: the general forward first (the head dim an argument)
    Family("mha_fwd_general", ("mha_fwd_*_general",), (*FWD, ("d", "int"))),
    Family("mha_fwd", ("mha_fwd_*",), FWD),
    Family(
        "mha_merge",
        ("mha_merge_*",),
        (
            ("out", "float*"),
            ("lse", "float*"),
            ("part", "const T*"),
            ("part_lse", "const float*"),
            ("rows", "i64"),
            ("d", "int"),
        ),
    ),
    Family("mha_cast", ("mha_cast_*",), (("dst", "T*"), ("src", "const float*"), ("n", "i64"))),
    Family(
        "mha_accumulate",
        ("mha_accumulate_*",),
        (("dst", "float*"), ("src", "const T*"), ("n", "i64")),
    ),
    Family(
        "mha_bwd_dvec",
        ("mha_bwd_dvec_*",),
        (
            ("o", "const T*"),
            ("dout", "const T*"),
            ("dvec", "float*"),
            ("rows", "i64"),
            ("heads", "int"),
            ("d", "int"),
        ),
    ),
    Family("mha_bwd_dkdv", ("mha_bwd_dkdv_*",), (*BWD_HEAD, ("dk", "T*"), ("dv", "T*"), *BWD_TAIL)),
    Family("mha_bwd_dq", ("mha_bwd_dq_*",), (*BWD_HEAD, ("dq", "T*"), *BWD_TAIL)),
)

# the type variables of the table's types: each bound to one element type per kernel
TYPE_VARIABLES = ("T", "TO")

# bytes of the scalar types the kernels take (every pointer is 8): the fake checks that it
# reads each parameter with a C type of this size
SCALAR_SIZES = {
    "int": 4,
    "unsigned": 4,
    "u32": 4,
    "float": 4,
    "double": 8,
    "u64": 8,
    "i64": 8,
    "long long": 8,
    "unsigned long long": 8,
}


def matches(pattern: str, kernel: str) -> bool:
    """Whether ``kernel`` matches ``pattern`` (``*``: one or more characters; as the C
    ``fk_match``)."""
    head, star, tail = pattern.partition("*")
    if not star:
        return kernel == pattern
    return len(kernel) > len(head) + len(tail) and kernel.startswith(head) and kernel.endswith(tail)


def family_of(kernel: str) -> Family | None:
    """The first family with a pattern matching ``kernel``, or None."""
    for family in FAMILIES:
        if any(matches(p, kernel) for p in family.patterns):
            return family
    return None


def param_size(ctype: str) -> int:
    """Bytes of a parameter of C type ``ctype`` (as the table writes it)."""
    if ctype.endswith("*"):
        return 8
    base = re.sub(r"\bconst\b", "", ctype).strip()
    if base not in SCALAR_SIZES:
        raise ValueError(f"kernel_signatures.py: no size for the C type {ctype!r}")
    return SCALAR_SIZES[base]


def c_header() -> str:
    """The table as C: ``FKP_<name>`` ids of every parameter name, and ``fk_sigs``, one row
    per pattern in table order (pattern, count, the parameters' ids, sizes and types)."""
    names = sorted({name for family in FAMILIES for name, _ in family.params})
    most = max(len(family.params) for family in FAMILIES)
    lines = [
        "/* Generated from tests/fakegpu/kernel_signatures.py when the fake libcuda is built:",
        "   do not edit (edit the table). The kernels' parameters by name: fake_libcuda.c's",
        "   ARG(type, name) reads parameter `name` where its kernel's row puts it. */",
        "#ifndef FAKE_KERNEL_PARAMS_H",
        "#define FAKE_KERNEL_PARAMS_H",
        f"#define FK_MAX_PARAMS {most}",
        "enum {",
        *(f"    FKP_{name}," for name in names),
        "    FKP_COUNT",
        "};",
        "static const char* const fkp_names[FKP_COUNT] = {",
        *(f'    "{name}",' for name in names),
        "};",
        "typedef struct {",
        "    const char* family; const char* pattern; int n;",
        "    int param[FK_MAX_PARAMS]; int size[FK_MAX_PARAMS]; const char* type[FK_MAX_PARAMS];",
        "} FKSig;",
        "static const FKSig fk_sigs[] = {",
    ]
    for family in FAMILIES:
        ids = ", ".join(f"FKP_{name}" for name, _ in family.params)
        sizes = ", ".join(str(param_size(ctype)) for _, ctype in family.params)
        types = ", ".join(f'"{ctype}"' for _, ctype in family.params)
        for pattern in family.patterns:
            lines.append(
                f'    {{"{family.name}", "{pattern}", {len(family.params)},'
                f" {{{ids}}}, {{{sizes}}}, {{{types}}}}},"
            )
    lines += ["    {0, 0, 0, {0}, {0}, {0}}", "};", "#endif", ""]
    return "\n".join(lines)


def write_header(directory: Path) -> Path:
    """Write ``fake_kernel_params.h`` into ``directory`` (the fake's build folder, given to
    the compiler with ``-I``) and return its path."""
    path = Path(directory) / "fake_kernel_params.h"
    path.write_text(c_header())
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: kernel_signatures.py DIR  (writes DIR/fake_kernel_params.h)")
    write_header(Path(sys.argv[1]))
