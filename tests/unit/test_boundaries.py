"""The tree's structure, checked from the source: package boundaries and import cycles.

* No module of one top-level package imports an underscore-named module or name of another
  package, or reads an underscore attribute of something it imported from another package
  (what a package needs from ``shmem`` is public API there).
* Inside the packages of ``PRIVATE_NAMES_STAY_HOME`` (``collectives.mha``), no module imports
  an underscore-named name from another module, or reads one as an attribute of a module it
  imported: a name another module uses is public in its module. Underscore-named *modules*
  (``from . import _units``) are fine.
* No module-level import cycle anywhere in the tree (imports under ``if TYPE_CHECKING:`` and
  inside functions do not count: they run after every module has loaded).

These read the code with :mod:`ast` only: nothing is imported or run.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shmem", "collectives", "launch")
# scripts and tests may use only the public API of the packages too
CONSUMERS = (*PACKAGES, "benchmarks", "examples")


def _modules(top: str) -> Iterator[tuple[str, Path]]:
    base = ROOT / top
    for path in sorted(base.rglob("*.py")):
        if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
            continue
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module name an ``ImportFrom`` refers to."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name == "TYPE_CHECKING":
                for child in node.body:
                    lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _file_violations(top: str, module: str, path: Path, source: str) -> list[str]:
    found: list[str] = []
    tree = ast.parse(source, str(path))
    foreign: set[str] = set()  # local names bound to another package's modules or objects
    where = str(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                head = alias.name.split(".")[0]
                if head in PACKAGES and head != top:
                    if any(_is_private(p) for p in alias.name.split(".")):
                        found.append(f"{where}:{node.lineno}: import {alias.name}")
                    foreign.add(alias.asname or head)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            head = target.split(".")[0]
            if head not in PACKAGES or head == top:
                continue
            if any(_is_private(p) for p in target.split(".")):
                found.append(f"{where}:{node.lineno}: from {target} import ...")
            for alias in node.names:
                if _is_private(alias.name):
                    found.append(f"{where}:{node.lineno}: from {target} import {alias.name}")
                foreign.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in foreign:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def _violations(top: str) -> list[str]:
    return [
        v
        for module, path in _modules(top)
        for v in _file_violations(top, module, path.relative_to(ROOT), path.read_text())
    ]


def _private_members(source: str) -> set[str]:
    """Underscore names a module defines as members: methods, and ``self._x = ...``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _is_private(node.name):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and _is_private(node.attr)
        ):
            names.add(node.attr)
    return names


def _member_violations(top: str, path: Path, source: str, elsewhere: set[str]) -> list[str]:
    """``obj._x`` where ``obj`` is not ``self``/``cls`` and only another package defines
    ``_x``: reaching into another package's object (``self.world._check_open``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr in elsewhere):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def _members_used_across(top: str) -> list[str]:
    sources = {
        t: {p: p.read_text() for _, p in _modules(t)} for t in CONSUMERS if (ROOT / t).is_dir()
    }
    defined = {t: set().union(*map(_private_members, s.values())) for t, s in sources.items()}
    mine = defined.get(top, set())
    others = set().union(*(d for t, d in defined.items() if t != top)) - mine
    return [
        v
        for path, src in sources.get(top, {}).items()
        for v in _member_violations(top, path.relative_to(ROOT), src, others)
    ]


@pytest.mark.parametrize("top", CONSUMERS)
def test_no_package_uses_another_packages_private_names(top: str) -> None:
    found = sorted(set(_violations(top) + _members_used_across(top)))
    assert not found, "private names used across packages:\n" + "\n".join(found)


# packages whose modules share no private names, even with each other
PRIVATE_NAMES_STAY_HOME = ("collectives.mha",)


def _private_name_imports(module: str, path: Path, source: str, modules: set[str]) -> list[str]:
    """``from m import _x`` where ``m._x`` is not a module (``modules``: the tree's modules'
    dotted names), and ``m._x`` where the local name ``m`` is bound to one of the tree's
    modules by an import."""
    found: list[str] = []
    bound: set[str] = set()  # local names of the tree's modules imported
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    bound.add(alias.asname or alias.name)
                elif _is_private(alias.name):
                    found.append(f"{path}:{node.lineno}: from {target} import {alias.name}")
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            dotted = f"{ast.unparse(node.value)}.{node.attr}"  # a submodule is fine
            if isinstance(base, ast.Name) and base.id in bound and dotted not in modules:
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("package", PRIVATE_NAMES_STAY_HOME)
def test_no_module_imports_another_modules_private_names(package: str) -> None:
    """What one module of ``package`` uses from another is public there (no leading
    underscore) or lives in the module that uses it."""
    top = package.split(".", maxsplit=1)[0]
    modules = {m for t in PACKAGES for m, _ in _modules(t)}
    found = [
        v
        for module, path in _modules(top)
        if module == package or module.startswith(package + ".")
        for v in _private_name_imports(module, path.relative_to(ROOT), path.read_text(), modules)
    ]
    assert not found, f"private names imported across modules of {package}:\n" + "\n".join(found)


def _import_graph(inside_functions: bool = False) -> dict[str, set[str]]:
    """Module -> modules it imports at module level (not under TYPE_CHECKING); with
    ``inside_functions``, the imports inside its functions and methods too."""
    known = {m: p for top in PACKAGES for m, p in _modules(top)}
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_lines(tree)
        for node in tree.body if not inside_functions else [tree]:
            stmts: list[ast.stmt] = [node] if isinstance(node, ast.stmt) else []
            if isinstance(node, ast.Try):
                stmts = [*node.body, *node.orelse, *node.finalbody]
            if inside_functions:
                stmts = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
            for stmt in stmts:
                if stmt.lineno in skip:
                    continue
                targets: list[str] = []
                if isinstance(stmt, ast.Import):
                    targets = [a.name for a in stmt.names]
                elif isinstance(stmt, ast.ImportFrom):
                    base = _resolve(module, path, stmt)
                    targets = [base] + [f"{base}.{a.name}" for a in stmt.names]
                for t in targets:
                    # importing a.b.c runs a, a.b and a.b.c
                    parts = t.split(".")
                    for i in range(1, len(parts) + 1):
                        name = ".".join(parts[:i])
                        if name in known and name != module:
                            if inside_functions and module.startswith(name + "."):
                                continue  # its own package: already imported when it runs
                            graph[module].add(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _is_package_init_cycle(comp: list[str], graph: dict[str, set[str]]) -> bool:
    """A package's ``__init__`` importing its own submodules, which import siblings through
    the package (``from . import x``) is how packages work, not a cycle between modules:
    drop package nodes and look again."""
    packages = {m for m in comp if any(o.startswith(m + ".") for o in comp)}
    rest = {m: {w for w in graph[m] if w in comp and w not in packages} for m in comp}
    sub = {m: e for m, e in rest.items() if m not in packages}
    return not _cycles(sub)


def test_no_module_level_import_cycles() -> None:
    graph = _import_graph()
    cycles = [c for c in _cycles(graph) if not _is_package_init_cycle(c, graph)]
    assert not cycles, "module-level import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_import_cycles_even_through_imports_inside_functions() -> None:
    """A function-level import is still a dependency: the modules of the tree form no loop
    through them either (only ``if TYPE_CHECKING:`` imports, annotations, are left out)."""
    graph = _import_graph(inside_functions=True)
    cycles = [c for c in _cycles(graph) if not _is_package_init_cycle(c, graph)]
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checks_can_fail() -> None:
    """The detectors find what they are for, on made-up graphs and sources."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    src = (
        "import shmem\n"
        "from shmem.backends.host import _X\n"
        "from shmem import _cuda\n"
        "from shmem.world import World\n"
        "shmem._private\n"
        "World._finalized\n"
        "self._mine\n"
    )
    found = _file_violations("collectives", "collectives.x", Path("collectives/x.py"), src)
    assert [f.split(": ", 1)[1] for f in found] == [
        "from shmem.backends.host import _X",
        "from shmem import _cuda",
        "shmem._private",
        "World._finalized",
    ]
    shmem_src = "class W:\n    def _check_open(self): self._gpu = 1\n"
    assert _private_members(shmem_src) == {"_check_open", "_gpu"}
    use = "self.world._check_open()\nself._gpu\nheap._gpu\n"
    found = _member_violations("collectives", Path("c.py"), use, {"_check_open", "_gpu"})
    assert sorted(f.split(": ", 1)[1] for f in found) == ["heap._gpu", "self.world._check_open"]
    assert _file_violations("shmem", "shmem.x", Path("shmem/x.py"), src) == []
    mha = (
        "from . import _units, gpu\n"
        "from ._plan import _doc_runs, runs\n"
        "from .gpu import _context\n"
        "from ..interop import _private\n"
        "import collectives.mha._units\n"
        "_units.ready\n"
        "_units._hidden\n"
        "gpu._lock\n"
        "collectives.mha._units._x\n"
        "self._mine\n"
    )
    modules = {"collectives.interop", "collectives.mha._units", "collectives.mha.gpu"}
    found = _private_name_imports("collectives.mha.x", Path("collectives/mha/x.py"), mha, modules)
    assert [f.split(": ", 1)[1] for f in found] == [
        "from collectives.mha._plan import _doc_runs",
        "from collectives.mha.gpu import _context",
        "from collectives.interop import _private",
        "_units._hidden",
        "gpu._lock",
        "collectives.mha._units._x",
    ]


_NOT_IN_UNIT = ("subprocess", "multiprocessing", "mpi4py", "cuda", "ctypes.util", "shutil")


def test_the_unit_tier_starts_no_process_and_no_compiler() -> None:
    """``tests/unit`` needs nothing (tests/README.md): none of its files imports what starts
    processes, MPI, CUDA or a compiler; such tests live in their own tiers."""
    found = []
    for path in sorted((ROOT / "tests" / "unit").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if not names:
                continue
            assert isinstance(node, ast.Import | ast.ImportFrom)
            for name in names:
                if name.split(".")[0] in _NOT_IN_UNIT or name in _NOT_IN_UNIT:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: import {name}")
    assert not found, "the unit tier must stay pure:\n" + "\n".join(found)


def test_generic_device_classes_hold_an_implementation_and_never_load_cuda() -> None:
    """``Buffer`` and ``DeviceContext`` call their device's implementation object
    (``shmem.device.impl``): they import no CUDA module and keep no host/GPU pair of
    attributes to branch on."""
    found = []
    for name in ("memory.py", "context.py"):
        tree = ast.parse((ROOT / "shmem" / "device" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "cuda" in node.module:
                found.append(f"shmem/device/{name}:{node.lineno}: from {node.module} import ...")
            if isinstance(node, ast.ImportFrom) and any("cuda" in a.name for a in node.names):
                found.append(f"shmem/device/{name}:{node.lineno}: imports a CUDA module")
            if isinstance(node, ast.Attribute) and node.attr in ("_gpu", "_host_stream"):
                found.append(f"shmem/device/{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


def test_the_host_device_implementation_satisfies_the_protocols() -> None:
    import shmem
    from shmem.device.impl import DeviceImpl, StreamImpl

    cpu = shmem.CPU()
    assert isinstance(cpu.impl, DeviceImpl) and cpu.impl.is_host
    with shmem.DeviceContext(cpu) as ctx:
        assert isinstance(ctx.stream_impl, StreamImpl)


def test_the_cuda_implementation_declares_the_same_protocols() -> None:
    """Checked without a GPU: the CUDA kind's objects have every protocol member."""
    from shmem.device import cuda as _cuda
    from shmem.device.impl import DeviceImpl, StreamImpl

    assert isinstance(_cuda.CUDA, DeviceImpl) and not _cuda.CUDA.is_host
    members = [m for m in dir(StreamImpl) if not m.startswith("_")]
    assert members and all(hasattr(_cuda.GpuStream, m) for m in members), members


# shmem's layers, bottom up. A module of a layer imports (at module level, in a function or
# under TYPE_CHECKING: every import counts) only shmem's foundations, its own layer and the
# layers listed for it. The runtime (World, Team, SHMEMBuffer, signals, heaps, backends) is
# everything else of shmem and may import all of these.
SHMEM_FOUNDATIONS = ("shmem.errors", "shmem.dtypes", "shmem.config", "shmem._version")
SHMEM_LAYERS = {
    "shmem.device": (),  # Device, DeviceContext, Buffer, resources, DLPack, views, CUDA, NVRTC
    "shmem.ipc": ("shmem.device",),  # IPC stands on the device layer, beside the runtime
}


def _in(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _layer_violations(module: str, path: Path, source: str) -> list[str]:
    layer = next((name for name in SHMEM_LAYERS if _in(module, name)), None)
    if layer is None:
        return []
    allowed = (*SHMEM_FOUNDATIONS, layer, *SHMEM_LAYERS[layer])
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            # ``from shmem import x`` / ``from .. import x`` imports the submodule x
            names = [f"{target}.{a.name}" for a in node.names] if target == "shmem" else [target]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if _in(name, "shmem") and name != "shmem" and not any(_in(name, a) for a in allowed):
                found.append(f"{path}:{node.lineno}: {layer} imports {name}")
    return found


def test_shmem_layers_import_only_what_lies_below_them() -> None:
    found = [
        v
        for module, path in _modules("shmem")
        for v in _layer_violations(module, path.relative_to(ROOT), path.read_text())
    ]
    assert not found, "shmem's layering is broken:\n" + "\n".join(found)


def test_the_layer_check_can_fail() -> None:
    src = (
        "from ..errors import ArgumentError\n"
        "from .memory import Buffer\n"
        "def f():\n"
        "    from .. import ipc\n"
        "    from ..world import World\n"
        "    import shmem.team\n"
    )
    found = _layer_violations("shmem.device.x", Path("shmem/device/x.py"), src)
    assert [f.split(": ", 1)[1] for f in found] == [
        "shmem.device imports shmem.ipc",
        "shmem.device imports shmem.world",
        "shmem.device imports shmem.team",
    ]
    ipc = "from ..device.memory import Buffer\nfrom ..buffer import SHMEMBuffer\n"
    found = _layer_violations("shmem.ipc", Path("shmem/ipc/__init__.py"), ipc)
    assert [f.split(": ", 1)[1] for f in found] == ["shmem.ipc imports shmem.buffer"]
    assert _layer_violations("shmem.world", Path("shmem/world.py"), src) == []


LONG_FUNCTION_LINES = 80  # a longer function says why in its docstring: "Long because ..."


def _long_functions(path: Path, source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        doc = ast.get_docstring(node) or ""
        body = node.body[1:] if doc and len(node.body) > 1 else node.body
        lines = (node.end_lineno or node.lineno) - body[0].lineno + 1
        if lines > LONG_FUNCTION_LINES and "Long because" not in doc:
            found.append(f"{path}:{node.lineno}: {node.name} has {lines} lines")
    return found


def test_no_long_function_without_a_reason() -> None:
    found = [
        v
        for top in PACKAGES
        for _, path in _modules(top)
        for v in _long_functions(path.relative_to(ROOT), path.read_text())
    ]
    assert not found, (
        f"functions over {LONG_FUNCTION_LINES} lines (split them, or say 'Long because ...' "
        "in the docstring):\n" + "\n".join(found)
    )


def test_the_long_function_check_can_fail() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(LONG_FUNCTION_LINES + 1))
    assert _long_functions(Path("m.py"), 'def f():\n    """Doc."""\n' + body)
    why = 'def f():\n    """Doc.\n\n    Long because it must."""\n'
    assert not _long_functions(Path("m.py"), why + body)
    assert not _long_functions(Path("m.py"), "def f():\n" + body[: -len("    x80 = 80\n")])


MODULE_CODE_LINES = 500  # a module's size is its code: not docstrings, comments, blank lines
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def code_lines(source: str) -> int:
    """The lines of ``source`` that hold code: a token other than a comment, or than the
    docstring of the module, a class or a function (numpydoc sections stay free)."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in _NOT_CODE or (tok.type == tokenize.STRING and tok.start[0] in docstrings):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines)


def test_no_module_has_more_than_500_lines_of_code() -> None:
    found = []
    for top in PACKAGES:
        for _, path in _modules(top):
            n = code_lines(path.read_text())
            if n > MODULE_CODE_LINES:
                found.append(f"{path.relative_to(ROOT)}: {n} lines of code")
    assert not found, (
        f"modules over {MODULE_CODE_LINES} lines of code (split them along a seam a reader "
        "would name):\n" + "\n".join(found)
    )


def test_the_code_line_count_can_fail() -> None:
    """Code counts; docstrings, comments and blank lines do not; a module over the limit
    is found."""
    src = (
        '"""Module doc,\n\nover lines."""\n'
        "# a comment\n"
        "\n"
        "def f(a,\n      b):\n"
        '    """Doc.\n\n    Parameters\n    ----------\n    a : int\n    """\n'
        "    x = '''not a\n    docstring'''  # trailing comment\n"
        "    return a\n"
    )
    assert code_lines(src) == 5  # def (2 lines), x = (2 lines), return
    big = "".join(f"x{i} = {i}\n" for i in range(MODULE_CODE_LINES + 1))
    assert code_lines(big) == MODULE_CODE_LINES + 1
    assert code_lines('"""' + "doc\n" * 600 + '"""\n' + "# c\n" * 600) == 0


def test_every_package_of_the_tree_is_in_the_distribution() -> None:
    """pyproject.toml lists its packages: a package missing there is missing from the
    wheel (the GPU run installs one), while the editable install of the tests finds it."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in PACKAGES
        for init in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - listed == set(), (
        f"packages missing from pyproject.toml: {sorted(found - listed)}"
    )
