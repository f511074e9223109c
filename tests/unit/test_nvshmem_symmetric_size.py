"""NVSHMEM_SYMMETRIC_SIZE from the heap size (issue 42, risk 5): NVSHMEM refuses allocations
beyond it (1 GiB unset), so a larger heap must set it before init."""

from __future__ import annotations

import pytest

from shmem.backends.nvshmem_env import SYMMETRIC_DEFAULT, SYMMETRIC_RESERVE, symmetric_size
from shmem.errors import ConfigError

GIB, MIB = 1 << 30, 1 << 20


def test_a_heap_within_the_default_leaves_nvshmem_alone() -> None:
    env: dict[str, str] = {}
    assert symmetric_size(256 * MIB, env) == SYMMETRIC_DEFAULT and env == {}
    assert symmetric_size(GIB - SYMMETRIC_RESERVE, env) == SYMMETRIC_DEFAULT and env == {}


def test_a_larger_heap_sets_the_size_with_room_for_nvshmem() -> None:
    env: dict[str, str] = {}
    assert symmetric_size(GIB, env) == GIB + SYMMETRIC_RESERVE
    assert env == {"NVSHMEM_SYMMETRIC_SIZE": str(GIB + SYMMETRIC_RESERVE)}


@pytest.mark.parametrize(
    ("given", "nbytes"),
    [("4g", 4 * GIB), ("4G", 4 * GIB), ("3.5g", 3584 * MIB), (".5t", 512 * GIB),
     ("2048m", 2 * GIB), ("2gg", 2 * GIB), (str(3 * GIB), 3 * GIB)],
)  # fmt: skip
def test_a_size_the_user_set_is_read_as_nvshmem_reads_it(given: str, nbytes: int) -> None:
    env = {"NVSHMEM_SYMMETRIC_SIZE": given}
    assert symmetric_size(GIB, env) == nbytes
    assert env == {"NVSHMEM_SYMMETRIC_SIZE": given}  # kept as the user wrote it


def test_a_size_too_small_or_unreadable_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"NVSHMEM_SYMMETRIC_SIZE='1g' .* cannot hold a heap"):
        symmetric_size(GIB, {"NVSHMEM_SYMMETRIC_SIZE": "1g"})
    with pytest.raises(ConfigError, match=r"'lots' is not a size NVSHMEM reads"):
        symmetric_size(GIB, {"NVSHMEM_SYMMETRIC_SIZE": "lots"})
