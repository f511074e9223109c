"""The fake driver's kernel table (``tests/fakegpu/kernel_signatures.py``) against the ``.cu``
kernels: every ``__global__`` entry point of every ``.cu`` file in the tree, its parameter
macros expanded (``FWD_ARGS(T)``, ``SYNC_PARAMS``, the ``INSTANTIATE`` families), must have
exactly its table family's parameters (same order, names and types, ``T``/``TO`` bound to one
element type per kernel); every kernel the fake emulates (the names ``fake_libcuda.c`` and its
headers compare a launch's kernel name with) must be in the table; and the C the table
generates must compile with the fake. Reordered copies of real kernels (in memory) show that a
reorder fails here, naming the kernel, the position and both parameters.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fakegpu import kernel_signatures as table

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fakegpu"
SKIP_DIRS = {"logs", "results", "node_modules", "__pycache__", "build", "dist"}
# .cu kernels the fake does not emulate (none today): a new kernel goes in the table and the
# fake, or here
NOT_EMULATED: frozenset[str] = frozenset()


# -- a small C preprocessor: comments, continuations, #define/#undef, expansion ---------------

_TOKEN = re.compile(
    r"""(?P<ws>\s+)
      | (?P<id>[A-Za-z_]\w*)
      | (?P<num>\.?\d(?:[eEpP][+-]|[\w.])*)
      | (?P<str>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
      | (?P<op>\#\#|\S)""",
    re.VERBOSE,
)


def _strip_comments(text: str) -> str:
    """``text`` without comments (a newline kept for each one's lines), strings left alone."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(" " + "\n" * text.count("\n", i, j))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _tokens(text: str) -> list[str]:
    return [m.group() for m in _TOKEN.finditer(text)]


@dataclass
class Macro:
    params: list[str] | None  # None: object-like
    body: list[str]


def _next(tokens: list[str], i: int) -> int:
    """The index of the first non-whitespace token at or after ``i``."""
    while i < len(tokens) and tokens[i].isspace():
        i += 1
    return i


def _arguments(tokens: list[str], i: int) -> tuple[list[list[str]], int]:
    """The arguments of the call whose ``(`` is at ``i``, and the index of its ``)``."""
    args: list[list[str]] = [[]]
    depth = 0
    for j in range(i, len(tokens)):
        t = tokens[j]
        if t == "(":
            depth += 1
            if depth == 1:
                continue
        elif t == ")":
            depth -= 1
            if depth == 0:
                return args, j
        elif t == "," and depth == 1:
            args.append([])
            continue
        args[-1].append(t)
    raise ValueError("unbalanced parentheses in a macro call")


def _strip(tokens: list[str]) -> list[str]:
    return [t for t in tokens if not t.isspace()]


def _substitute(
    macro: Macro, args: list[list[str]], macros: dict[str, Macro], off: frozenset[str]
) -> list[str]:
    params = macro.params or []
    if params == [] and args == [[]]:
        args = []
    if len(args) != len(params):
        raise ValueError(f"macro called with {len(args)} arguments, takes {len(params)}")
    body = macro.body
    out: list[str] = []
    for k, t in enumerate(body):
        before = next((body[j] for j in range(k - 1, -1, -1) if not body[j].isspace()), "")
        after = next((body[j] for j in range(k + 1, len(body)) if not body[j].isspace()), "")
        if t in params:
            raw = args[params.index(t)]
            if before == "#":  # stringizing: replaces the "#" (and the space after it)
                while out[-1].isspace():
                    out.pop()
                out[-1] = '"' + "".join(raw).strip() + '"'
            elif "##" in (before, after):
                out.extend(_strip(raw))
            else:
                out.extend(_expand(raw, macros, off))
        elif t == "#" and after in params:
            out.append(t)  # replaced by the stringized argument above
        else:
            out.append(t)
    return _paste(out)


def _paste(tokens: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(tokens):
        if tokens[i] == "##":
            while out and out[-1].isspace():
                out.pop()
            j = _next(tokens, i + 1)
            left = out.pop() if out else ""
            out.append(left + (tokens[j] if j < len(tokens) else ""))
            i = j + 1
        else:
            out.append(tokens[i])
            i += 1
    return out


def _expand(tokens: list[str], macros: dict[str, Macro], off: frozenset[str]) -> list[str]:
    """``tokens`` with every macro expanded (a macro is not expanded inside itself)."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        macro = macros.get(t) if t not in off else None
        if macro is not None and macro.params is None:
            out.extend(_expand(_paste(macro.body), macros, off | {t}))
            i += 1
            continue
        if macro is not None:
            j = _next(tokens, i + 1)
            if j < len(tokens) and tokens[j] == "(":
                args, end = _arguments(tokens, j)
                out.extend(_expand(_substitute(macro, args, macros, off), macros, off | {t}))
                i = end + 1
                continue
        out.append(t)
        i += 1
    return out


_DEFINE = re.compile(r"#\s*define\s+([A-Za-z_]\w*)(\(([^)]*)\))?(.*)", re.DOTALL)
_UNDEF = re.compile(r"#\s*undef\s+([A-Za-z_]\w*)")


def preprocess(source: str) -> list[str]:
    """The non-whitespace tokens of ``source`` after its macros are expanded, directive by
    directive (conditionals are not evaluated: every branch is kept)."""
    text = _strip_comments(source).replace("\\\n", " ")
    macros: dict[str, Macro] = {}
    out: list[str] = []
    segment: list[str] = []

    def flush() -> None:
        out.extend(_strip(_expand(_tokens("\n".join(segment)), macros, frozenset())))
        segment.clear()

    for line in text.split("\n"):
        if not line.lstrip().startswith("#"):
            segment.append(line)
            continue
        flush()
        directive = line.strip()
        if m := _DEFINE.fullmatch(directive):
            name, has_params, params, body = m.groups()
            names = [p.strip() for p in params.split(",")] if has_params else None
            if names is not None and "..." in names:
                raise ValueError(f"variadic macro {name}: not supported here")
            macros[name] = Macro(
                [p for p in names if p] if names is not None else None, _tokens(body.strip())
            )
        elif m := _UNDEF.fullmatch(directive):
            macros.pop(m.group(1), None)
    flush()
    return out


# -- kernels ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[tuple[str, str], ...]  # (name, C type)
    file: str


def _type(tokens: list[str]) -> str:
    """A C type's tokens as the table writes them: ``const u64* const*``."""
    text = ""
    for t in tokens:
        text += t if t == "*" or not text else " " + t
    return text


def _group(tokens: list[str], i: int) -> int:
    """The index of the ``)`` closing the ``(`` at ``i``."""
    depth = 0
    for j in range(i, len(tokens)):
        depth += {"(": 1, ")": -1}.get(tokens[j], 0)
        if depth == 0:
            return j
    raise ValueError("unbalanced parentheses")


def kernels_of(source: str, file: str) -> list[Kernel]:
    """The ``__global__`` functions of a ``.cu`` source, with their parameters."""
    tokens = preprocess(source)
    found: list[Kernel] = []
    for i, t in enumerate(tokens):
        if t != "__global__":
            continue
        j = i + 1
        while j + 1 < len(tokens):
            if tokens[j] in ("__launch_bounds__", "__attribute__") and tokens[j + 1] == "(":
                j = _group(tokens, j + 1) + 1
            elif re.fullmatch(r"[A-Za-z_]\w*", tokens[j]) and tokens[j + 1] == "(":
                break
            else:
                j += 1
        name, end = tokens[j], _group(tokens, j + 1)
        params: list[tuple[str, str]] = []
        current: list[str] = []
        depth = 0
        for t2 in [*tokens[j + 2 : end], ","]:
            depth += {"(": 1, ")": -1, "<": 1, ">": -1}.get(t2, 0)
            if t2 == "," and depth == 0:
                if current and current != ["void"]:
                    if not re.fullmatch(r"[A-Za-z_]\w*", current[-1]) or len(current) < 2:
                        raise ValueError(f"{file}: kernel {name}: unnamed parameter {current}")
                    params.append((current[-1], _type(current[:-1])))
                current = []
            else:
                current.append(t2)
        found.append(Kernel(name, tuple(params), file))
    return found


def _cu_files() -> list[Path]:
    files: list[Path] = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        files += [Path(folder) / n for n in sorted(names) if n.endswith(".cu")]
    return files


def cu_kernels() -> dict[str, Kernel]:
    """Every kernel of every ``.cu`` file of the tree, by name (a name defined twice must
    have one parameter list: the branches of an ``#if``)."""
    kernels: dict[str, Kernel] = {}
    for path in _cu_files():
        rel = str(path.relative_to(ROOT))
        for kernel in kernels_of(path.read_text(), rel):
            seen = kernels.setdefault(kernel.name, kernel)
            assert seen.params == kernel.params, (
                f"kernel {kernel.name} is defined twice with different parameters "
                f"({seen.file}, {kernel.file})"
            )
    return kernels


# -- the comparison ---------------------------------------------------------------------------


def _type_pattern(ctype: str) -> re.Pattern[str]:
    parts = re.split(r"\b(" + "|".join(table.TYPE_VARIABLES) + r")\b", ctype)
    return re.compile(
        "".join("(.+?)" if k % 2 else re.escape(part) for k, part in enumerate(parts))
    )


def compare(kernel: Kernel) -> str | None:
    """What differs between ``kernel`` and its table family (None: nothing)."""
    family = table.family_of(kernel.name)
    where = f"kernel {kernel.name} ({kernel.file})"
    if family is None:
        return f"{where} is not in tests/fakegpu/kernel_signatures.py"
    theirs = f"the table (kernel_signatures.py, family {family.name})"
    bound: dict[str, tuple[str, int]] = {}
    for pos, (want, have) in enumerate(zip(family.params, kernel.params, strict=False)):
        (tname, ttype), (kname, ktype) = want, have
        m = _type_pattern(ttype).fullmatch(ktype)
        if tname != kname or m is None:
            return (
                f"{where}, position {pos}: {theirs} has `{ttype} {tname}`, "
                f"the kernel has `{ktype} {kname}`"
            )
        variables = re.findall(r"\b(" + "|".join(table.TYPE_VARIABLES) + r")\b", ttype)
        for var, concrete in zip(variables, m.groups(), strict=True):
            first = bound.setdefault(var, (concrete, pos))
            if first[0] != concrete:
                return (
                    f"{where}, position {pos} `{ktype} {kname}`: {var} is `{first[0]}` at "
                    f"position {first[1]} ({family.params[first[1]][0]}), `{concrete}` here"
                )
    if len(family.params) != len(kernel.params):
        n = min(len(family.params), len(kernel.params))
        extra = (family.params if len(family.params) > n else kernel.params)[n]
        side = "the table" if len(family.params) > n else "the kernel"
        return (
            f"{where}: {theirs} has {len(family.params)} parameters, the kernel "
            f"{len(kernel.params)}; position {n}: only {side} has `{extra[1]} {extra[0]}`"
        )
    return None


def problems(kernels: dict[str, Kernel]) -> list[str]:
    return [p for k in kernels.values() if (p := compare(k)) is not None]


_EMULATED = re.compile(r'\bstr(n?)cmp\s*\(\s*nm\s*,\s*"([^"]*)"')


def fake_sources() -> str:
    return "\n".join(p.read_text() for p in sorted([*FAKE.glob("*.c"), *FAKE.glob("*.h")]))


def emulation_problems(c_source: str, kernels: dict[str, Kernel]) -> list[str]:
    """Names the fake's C compares a launch's kernel name with (``strcmp``: the name,
    ``strncmp``: a prefix) that no table family or no ``.cu`` kernel has, and ``.cu`` kernels
    the fake does not emulate (bar NOT_EMULATED)."""
    found: list[str] = []
    emulated: set[str] = set()
    for prefix, name in _EMULATED.findall(c_source):
        hits = [k for k in kernels if (k.startswith(name) if prefix else k == name)]
        if not hits:
            found.append(f"the fake emulates {name!r}{'*' if prefix else ''}: no .cu kernel")
        for k in hits:
            if table.family_of(k) is None:
                found.append(f"kernel {k} ({kernels[k].file}) is emulated but not in the table")
        emulated.update(hits)
    for k in sorted(set(kernels) - emulated - NOT_EMULATED):
        found.append(f"kernel {k} ({kernels[k].file}) is not emulated by the fake")
    return list(dict.fromkeys(found))


# -- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernels() -> dict[str, Kernel]:
    return cu_kernels()


def test_the_parser_finds_the_kernels(kernels: dict[str, Kernel]) -> None:
    # the macro families expanded: 8 + 3 forward, 3 x 3 folds, 3 x 3 backward attention
    # kernels; all-reduce's per dtype and op
    assert len(kernels) >= 150, len(kernels)  # 199 today
    assert len(kernels["mha_fwd_bfloat16_d64"].params) == 35
    assert kernels["mha_fwd_float32_general"].params[-1] == ("d", "int")
    assert kernels["allreduce_one_shot_bfloat16_to_float32_sum"].params[2] == ("out", "float*")
    assert kernels["family_broadcast"].params[-1] == ("sig", "u64")
    assert kernels["block_ids"].params == (("out", "int*"),)


def test_the_table_matches_every_cu_kernel(kernels: dict[str, Kernel]) -> None:
    found = problems(kernels)
    assert not found, "\n".join(found)


def test_every_table_pattern_names_a_kernel(kernels: dict[str, Kernel]) -> None:
    stale = [
        f"family {f.name}: pattern {p!r}"
        for f in table.FAMILIES
        for p in f.patterns
        if not any(table.family_of(k) is f and table.matches(p, k) for k in kernels)
    ]
    assert not stale, f"table patterns matching no .cu kernel: {stale}"


def test_every_emulated_kernel_is_in_the_table(kernels: dict[str, Kernel]) -> None:
    source = fake_sources()
    assert len(_EMULATED.findall(source)) >= 20  # the dispatch is still by name
    found = emulation_problems(source, kernels)
    assert not found, "\n".join(found)


def test_a_kernel_the_fake_emulates_outside_the_table_fails(kernels: dict[str, Kernel]) -> None:
    source = fake_sources() + '\nif(!strcmp(nm,"shmem_quiet")){}\n'
    extra = {**kernels, "shmem_quiet": Kernel("shmem_quiet", (), "shmem/kernels/quiet.cu")}
    assert emulation_problems(source, extra) == [
        "kernel shmem_quiet (shmem/kernels/quiet.cu) is emulated but not in the table"
    ]


# (kernel, text of its .cu file, the text replacing it, position, table's name, kernel's name)
MUTATIONS = [
    (
        "shmem_signal",
        "u64* flag, u64 value, int op",
        "u64 value, u64* flag, int op",
        0,
        "flag",
        "value",
    ),
    (
        "shmem_strided_copy",
        "int rank, int elem_size",
        "int elem_size, int rank",
        3,
        "rank",
        "elem_size",
    ),
    # inside FWD_ARGS(T)
    (
        "mha_fwd_bfloat16_d64",
        "int seq_len, int kv_len, int *trace",
        "int kv_len, int seq_len, int *trace",
        10,
        "seq_len",
        "kv_len",
    ),
    # inside SYNC_PARAMS, through INSTANTIATE_AR's macros
    (
        "allreduce_one_shot_float16_sum",
        "int rank, int size, u64 sig",
        "int size, int rank, u64 sig",
        11,
        "rank",
        "size",
    ),
    # inside BWD_KERNELS
    ("mha_bwd_dkdv_float32", "T* dk, T* dv, const i64*", "T* dv, T* dk, const i64*", 6, "dk", "dv"),
    (
        "saxpy",
        "float a, const float* x, float* y",
        "float a, float* y, const float* x",
        1,
        "x",
        "y",
    ),
]


@pytest.mark.parametrize(
    ("kernel", "old", "new", "position", "ours", "theirs"),
    MUTATIONS,
    ids=[m[0] for m in MUTATIONS],
)
def test_a_reordered_kernel_fails_loudly(
    kernels: dict[str, Kernel],
    kernel: str,
    old: str,
    new: str,
    position: int,
    ours: str,
    theirs: str,
) -> None:
    file = kernels[kernel].file
    source = (ROOT / file).read_text()
    if source.count(old) != 1:
        pytest.fail(f"{file} no longer has {old!r} once: update MUTATIONS")
    reordered = {k.name: k for k in kernels_of(source.replace(old, new), file)}
    message = compare(reordered[kernel])
    assert message is not None
    assert f"kernel {kernel} ({file}), position {position}:" in message, message
    assert f" {ours}`" in message and f" {theirs}`" in message, message
    assert problems({k.name: k for k in kernels_of(source, file)}) == []


def test_a_changed_type_or_count_fails(kernels: dict[str, Kernel]) -> None:
    file = kernels["shmem_atomic"].file
    source = (ROOT / file).read_text()
    assert source.count("u64 compare, u64* old") == 1
    changed = {k.name: k for k in kernels_of(source.replace("u64 compare,", "int compare,"), file)}
    assert compare(changed["shmem_atomic"]) == (
        f"kernel shmem_atomic ({file}), position 4: the table (kernel_signatures.py, family "
        "shmem_atomic) has `u64 compare`, the kernel has `int compare`"
    )
    dropped = {k.name: k for k in kernels_of(source.replace(", u64* old)", ")"), file)}
    message = compare(dropped["shmem_atomic"])
    assert message is not None and "position 5: only the table has `u64* old`" in message


def test_element_types_are_bound_once(kernels: dict[str, Kernel]) -> None:
    kernel = kernels["reduce_local_float16_sum"]
    params = list(kernel.params)
    params[1] = ("out", "bf16*")
    message = compare(Kernel(kernel.name, tuple(params), kernel.file))
    assert message is not None and "T is `f16` at position 0 (inputs), `bf16` here" in message


def test_the_generated_header_holds_each_family_by_name(tmp_path: Path) -> None:
    """(That it compiles with the fake's C is checked in tests/compile/.)"""
    header = table.write_header(tmp_path).read_text()
    assert '{"mha_fwd", "mha_fwd_*", 35, {FKP_q, FKP_k, FKP_v, FKP_o, FKP_lse,' in header
