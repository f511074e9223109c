"""Imported at start-up by every Python process whose path holds tests/fakegpu (the fake-GPU
runs' PYTHONPATH): with ``FAKEGPU_DRIVER=1`` (set by :func:`fakedriver.install`) the process
takes the fake libcuda for a driver too. Does nothing otherwise."""

from __future__ import annotations

import os

if os.environ.get("FAKEGPU_DRIVER") == "1":
    from tests.fakegpu import fakedriver

    fakedriver.install()
