"""``SHMEM_REQUIRE_GPU=1`` (set by ./dev gpu): a failed GPU probe is an error, never a
silent "no GPU" that turns a broken GPU run into "ok, N skipped"."""

from __future__ import annotations

import pytest

from shmem.backends import resolve_backend
from shmem.device.cuda import device as _cuda_device
from shmem.errors import BackendUnavailableError, DeviceUnavailableError


@pytest.fixture(autouse=True)
def _fresh_probe() -> object:
    _cuda_device.device_count.cache_clear()
    yield None
    _cuda_device.device_count.cache_clear()


def test_without_the_switch_no_driver_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHMEM_REQUIRE_GPU", raising=False)
    monkeypatch.setattr(_cuda_device, "_driver_present", lambda: False)
    assert _cuda_device.device_count() == 0


def test_with_the_switch_no_driver_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHMEM_REQUIRE_GPU", "1")
    monkeypatch.setattr(_cuda_device, "_driver_present", lambda: False)
    with pytest.raises(DeviceUnavailableError, match="SHMEM_REQUIRE_GPU=1: no NVIDIA driver"):
        _cuda_device.device_count()


def test_with_the_switch_a_broken_install_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> object:
        raise ImportError("cuda.core 0.3 is too old")

    monkeypatch.setenv("SHMEM_REQUIRE_GPU", "1")
    monkeypatch.setattr(_cuda_device, "_driver_present", lambda: True)
    monkeypatch.setattr(_cuda_device, "_cc", broken)
    with pytest.raises(DeviceUnavailableError, match="too old"):
        _cuda_device.device_count()
    monkeypatch.delenv("SHMEM_REQUIRE_GPU")
    _cuda_device.device_count.cache_clear()
    assert _cuda_device.device_count() == 0  # the same install without the switch: no GPU


def test_with_the_switch_auto_never_falls_back_to_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SHMEM_BACKEND", raising=False)
    monkeypatch.setattr("shmem.backends._nvshmem_status", lambda: "nvshmem4py is not installed")
    assert resolve_backend("auto")[0] == "host"
    monkeypatch.setenv("SHMEM_REQUIRE_GPU", "1")
    with pytest.raises(BackendUnavailableError, match=r"SHMEM_REQUIRE_GPU=1 .* not installed"):
        resolve_backend("auto")
    assert resolve_backend("host")[0] == "host"  # asking for the host explicitly still works
