"""Sphinx configuration of the API reference (``./dev docs``; warnings are errors there)."""

from __future__ import annotations

import builtins
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the packages from this checkout, installed or not

project = "symheap"
author = "the symheap authors"
copyright = "the symheap authors"
extensions = ["sphinx.ext.autodoc", "numpydoc"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []

# autodoc: each page documents a package's ``__all__`` (names resolved by attribute access, so
# the lazy ``collectives`` and ``collectives.torch_backend`` load what they export)
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "groupwise"
autodoc_typehints = "signature"
autodoc_inherit_docstrings = True

# numpydoc: the sections render as field lists; no generated member tables (autodoc lists the
# members already)
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

# -n checks every cross-reference. The standard library, numpy, torch and cuda.core have no
# inventory here (the build is offline); the project's internal modules, private classes and
# type aliases (what signatures and base-class lists name but ``__all__`` does not export) have
# no page.
_EXTERNAL = sorted(
    {*sys.stdlib_module_names, "numpy", "np", "npt", "torch", "cuda", "mpi4py", "MPI"}
)
_INTERNAL_TYPES = [
    r"(\w+\.)*_\w+(\.\w+)*",  # anything private
    r"(shmem|collectives)\.(\w+\.)*\w*(Config|Impl|Methods|Resource|Heap|Team|Context|Plan|Keywords|Aliases|Channel)",
    r"(ShapeLike|DTypeLike|Casting|Input|Fetched|DeviceImpl|StreamImpl|Team|Context)",
    r"(SymmetricHeap|MemoryResource|Published|shmem\.ipc\.Published)",
]
nitpick_ignore_regex = [
    ("py:.*", r"(" + "|".join(_EXTERNAL) + r")\..*"),
    ("py:class", r"c10d::\w+"),  # torch's pybind11 annotations
    ("py:class", r"\w+\[.*"),  # a generic's pieces, as Sphinx splits some signatures
    ("py:.*", r"(" + "|".join(n for n in dir(builtins) if not n.startswith("_")) + r")"),
    ("py:mod", r"\.?(shmem|collectives|launch)?(\.\w+)*"),  # internal modules named in prose
    *(("py:class", pattern) for pattern in _INTERNAL_TYPES),
]
