"""GPU IPC between two processes (skipped without a GPU): memory from an IPC-enabled cuda.core
pool, exported by descriptor, imported and written by a child process, seen by the parent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shmem import Accelerator, Buffer, ipc
from shmem.errors import DescriptorError

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import sys
import numpy as np
from shmem import Buffer, ipc

buf = ipc.import_(sys.argv[1])
assert buf.descriptor.kind == "cuda", buf.descriptor.kind
got = buf.to_numpy()
want = np.arange(buf.count, dtype=np.float32)
assert np.array_equal(got, want), got[:8]
buf.copy_from(Buffer.from_numpy(2 * got), stream=None)  # write back: complete on return
print("child ok", buf.count, flush=True)
buf.close()
"""


@pytest.mark.smoke
def test_a_child_process_reads_and_writes_exported_gpu_memory() -> None:
    n = 1 << 20
    buf = ipc.allocate((n,), "float32", device=Accelerator(0))
    try:
        assert buf.kind == "cuda" and not buf.is_host_accessible
        buf.copy_from(Buffer.from_numpy(np.arange(n, dtype=np.float32)), stream=None)
        desc = ipc.export(buf)
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        child = subprocess.run(
            [sys.executable, "-c", CHILD, str(desc)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert child.returncode == 0 and "child ok" in child.stdout, child.stdout + child.stderr
        np.testing.assert_array_equal(buf.to_numpy(), 2 * np.arange(n, dtype=np.float32))
    finally:
        buf.close()


def test_an_import_after_the_exporter_closed_is_refused() -> None:
    buf = ipc.allocate((1024,), "float32", device=Accelerator(0))
    desc = ipc.export(buf)
    buf.close()  # the exporter lives on: the buffer is unknown, nobody failed (as on the host)
    with pytest.raises(DescriptorError, match="unknown buffer"):
        ipc.import_(str(desc))
