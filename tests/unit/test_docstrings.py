"""numpydoc sections on every exported callable (issue 32; docs/api builds from them).

Each package's ``__all__`` is walked: every function, every class (its constructor's
parameters are documented in the class docstring, the numpydoc convention) and every public
method of an exported class, inherited ones included, once each. A docstring must parse with
numpydoc without warnings and have

* ``Parameters`` naming exactly the signature's parameters (``self``/``cls`` excepted;
  ``*args``/``**kwargs`` may be written with or without their stars),
* ``Returns`` (or ``Yields``) when the return annotation is not ``None``,
* ``Raises`` when the body raises (a ``raise X`` statement, nested functions excepted).

A failure lists every callable with what it lacks.
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import textwrap
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from numpydoc.docscrape import NumpyDocString

PACKAGES = (
    "shmem",
    "shmem.ipc",
    "shmem.flight",
    "collectives",
    "collectives.mha",
    "collectives.torch_backend",
    "launch",
)
OURS = ("shmem", "collectives", "launch")


def _ours(obj: Any) -> bool:
    return str(getattr(obj, "__module__", "")).split(".")[0] in OURS


def _constructor(cls: type) -> Callable[..., Any] | None:
    """The ``__init__`` a class's docstring documents: ours (or a dataclass's), else none."""
    if issubclass(cls, enum.Enum):
        return None
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            init = vars(klass)["__init__"]
            if _ours(klass) and inspect.isfunction(init) and _ours(init):
                return init
            return None
    return None


def _methods(cls: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    for name in sorted(dir(cls)):
        if name.startswith("_"):
            continue
        static = inspect.getattr_static(cls, name)
        if isinstance(static, (classmethod, staticmethod)):
            static = static.__func__
        if inspect.isfunction(static) and _ours(static):
            yield name, static


def _exported() -> Iterator[tuple[str, str, Callable[..., Any], Callable[..., Any] | None]]:
    """(package, label, docstring owner, function checked) for every exported callable."""
    seen: set[int] = set()
    for pkg in PACKAGES:
        module = importlib.import_module(pkg)
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) in seen or not _ours(obj):
                continue
            seen.add(id(obj))
            label = f"{pkg}.{name}"
            if inspect.isclass(obj):
                yield pkg, label, obj, _constructor(obj)
                for meth_name, meth in _methods(obj):
                    if id(meth) not in seen:
                        seen.add(id(meth))
                        yield pkg, f"{label}.{meth_name}", meth, meth
            elif callable(obj):
                yield pkg, label, obj, obj


def _raises(func: Callable[..., Any]) -> bool:
    """Whether the body has a ``raise X`` (nested functions and classes not counted)."""
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(func)))
    except (OSError, TypeError):
        return False
    tree = ast.parse(source)
    body = tree.body[0]
    stack: list[ast.AST] = list(ast.iter_child_nodes(body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Raise) and node.exc is not None:
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def _documented_names(doc: NumpyDocString) -> set[str]:
    names: set[str] = set()
    for param in doc["Parameters"]:
        for part in param.name.split(","):
            names.add(part.strip().lstrip("*"))
    return names


def _problems(owner: Callable[..., Any], func: Callable[..., Any] | None) -> list[str]:
    text = inspect.getdoc(owner) if inspect.isclass(owner) else owner.__doc__
    if not text or not text.strip():
        return ["no docstring"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            doc = NumpyDocString(inspect.cleandoc(text))
        except Exception as exc:  # numpydoc raises ValueError or warns on bad sections
            return [f"unparsable docstring ({exc})"]
    if func is None:
        return []
    problems = []
    params = [
        p.name for p in inspect.signature(func).parameters.values() if p.name not in ("self", "cls")
    ]
    wanted, documented = set(params), _documented_names(doc)
    if wanted - documented:
        problems.append(f"Parameters lacks {sorted(wanted - documented)}")
    if documented - wanted:
        problems.append(f"Parameters names what the signature lacks: {sorted(documented - wanted)}")
    is_init = func.__name__ == "__init__"
    returns = inspect.signature(func).return_annotation
    if (
        not is_init
        and returns not in (None, "None", inspect.Signature.empty)
        and not (doc["Returns"] or doc["Yields"])
    ):
        problems.append(f"no Returns (returns {returns})")
    raises = _raises(func)
    if is_init and inspect.isclass(owner) and "__post_init__" in vars(owner):
        raises = raises or _raises(vars(owner)["__post_init__"])
    if raises and not doc["Raises"]:
        problems.append("no Raises (the body raises)")
    return problems


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_callable_has_its_numpydoc_sections(package: str) -> None:
    missing = [
        f"{label}: {'; '.join(problems)}"
        for pkg, label, owner, func in _exported()
        if pkg == package and (problems := _problems(owner, func))
    ]
    assert not missing, f"{len(missing)} callables lack numpydoc sections:\n" + "\n".join(missing)


def test_the_walk_finds_the_callables() -> None:
    labels = {label for _, label, _, _ in _exported()}
    assert {"shmem.init", "shmem.ipc.import_", "collectives.Communicator.all_reduce"} <= labels
    assert "collectives.mha.attention" in labels
    assert not any(label.startswith("launch.") for label in labels)  # launch exports nothing
