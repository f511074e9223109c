"""The pure-Python DLPack producer and consumer: layouts, dtypes, round trips, lifetimes, errors."""

from __future__ import annotations

import ctypes
import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any, cast

import ml_dtypes
import numpy as np
import pytest

from shmem.device import dlpack as _dlpack
from shmem.device.dlpack import (
    DLDataType,
    DLDevice,
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLPackVersion,
    DLPackView,
    DLTensor,
    _release,
    abi,
    dl_to_dtype,
    dtype_to_dl,
    from_dlpack,
    live_exports,
    to_dlpack,
)
from shmem.errors import DLPackArgumentError, DLPackDTypeError, DLPackError, ShmemError

Array = np.ndarray[Any, np.dtype[Any]]

# (dtype, DLPack code, bits) as in dmlc/dlpack include/dlpack/dlpack.h (DLPack 1.1).
EXPECTED_CODES: list[tuple[np.dtype[Any], int, int]] = [
    (np.dtype(np.float16), 2, 16),
    (np.dtype(np.float32), 2, 32),
    (np.dtype(np.float64), 2, 64),
    (np.dtype(ml_dtypes.bfloat16), 4, 16),
    (np.dtype(ml_dtypes.float8_e4m3fn), 10, 8),
    (np.dtype(ml_dtypes.float8_e5m2), 12, 8),
    (np.dtype(np.int8), 0, 8),
    (np.dtype(np.int16), 0, 16),
    (np.dtype(np.int32), 0, 32),
    (np.dtype(np.int64), 0, 64),
    (np.dtype(np.uint8), 1, 8),
    (np.dtype(np.uint16), 1, 16),
    (np.dtype(np.uint32), 1, 32),
    (np.dtype(np.uint64), 1, 64),
    (np.dtype(np.bool_), 6, 8),
]
ALL_DTYPES = [dt for dt, _, _ in EXPECTED_CODES]
ML_DTYPES = {
    np.dtype(t) for t in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)
}
NUMPY_DTYPES = [dt for dt in ALL_DTYPES if dt not in ML_DTYPES]

LAYOUTS: dict[str, Callable[[Array], Array]] = {
    "contiguous": lambda a: a,
    "strided": lambda a: a[::2, 1:],
    "reversed": lambda a: a[::-1, ::-2],
    "transposed": lambda a: a.T,
    "0-d": lambda a: a[1, 2, ...],
    "empty": lambda a: a[:0],
}


def _sample(dtype: np.dtype[Any], shape: tuple[int, ...] = (5, 6)) -> Array:
    values = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    out: Array = (values % 3 == 0) if dtype == np.bool_ else (values % 13)  # exact even in float8
    return out.astype(dtype)


def _layout(dtype: np.dtype[Any], layout: str) -> Array:
    out: Array = LAYOUTS[layout](_sample(dtype))
    return out


def _elem_strides(a: Array) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


def _export(a: Array, *, versioned: bool, owner: object = None) -> object:
    return to_dlpack(
        a.ctypes.data,
        a.shape,
        _elem_strides(a),
        a.dtype,
        (1, 0),
        a if owner is None else owner,
        versioned=versioned,
        readonly=not a.flags.writeable,
    )


def _data_ptr(a: Array) -> int:
    ptr: int = a.__array_interface__["data"][0]
    return ptr


def _np_from_dlpack(obj: object) -> Array:
    out: Array = np.from_dlpack(cast(Any, obj))
    return out


def _same_bytes(x: Array, y: Array) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


class Wrapper:
    """The smallest DLPack producer: hands out a capsule made by ``make``."""

    def __init__(self, make: Callable[[bool], object], device: tuple[int, int] = (1, 0)) -> None:
        self.make = make
        self.device = device
        self.calls: list[dict[str, Any]] = []

    def __dlpack__(self, **kwargs: Any) -> object:
        self.calls.append(kwargs)
        max_version = kwargs.get("max_version")
        return self.make(max_version is not None and max_version >= (1, 0))

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def _owner_wrapper(owner: Owner) -> Wrapper:
    return Wrapper(lambda v: _export(owner.arr, versioned=v, owner=owner))


class Owner:
    """A weakly referenceable owner of a numpy array."""

    def __init__(self, arr: Array) -> None:
        self.arr = arr


@pytest.fixture(params=["native", "ctypes"])
def release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run with numpy's C deleters (the default here) and with the ctypes callbacks."""
    if request.param == "ctypes":
        monkeypatch.setattr(_release, "_RELEASE", _release._CTYPES_RELEASE)
    gc.collect()
    before = live_exports()
    yield request.param
    gc.collect()
    assert live_exports() == before, "every exported tensor was deleted"


# -- layouts and codes --------------------------------------------------------------------


def test_struct_layouts_match_dlpack_h() -> None:
    assert ctypes.sizeof(DLPackVersion) == 8
    assert ctypes.sizeof(DLDevice) == 8
    assert ctypes.sizeof(DLDataType) == 4
    assert ctypes.sizeof(DLTensor) == 48
    offsets = {name: getattr(DLTensor, name).offset for name, *_ in DLTensor._fields_}
    assert offsets == {
        "data": 0,
        "device": 8,
        "ndim": 16,
        "dtype": 20,
        "shape": 24,
        "strides": 32,
        "byte_offset": 40,
    }
    assert ctypes.sizeof(DLManagedTensor) == 64
    assert DLManagedTensor.manager_ctx.offset == 48  # type: ignore[union-attr]
    assert DLManagedTensor.deleter.offset == 56  # type: ignore[union-attr]
    assert ctypes.sizeof(DLManagedTensorVersioned) == 80
    versioned = {
        name: getattr(DLManagedTensorVersioned, name).offset
        for name, *_ in DLManagedTensorVersioned._fields_
    }
    assert versioned == {
        "version": 0,
        "manager_ctx": 8,
        "deleter": 16,
        "flags": 24,
        "dl_tensor": 32,
    }


def test_enum_values_match_dlpack_h() -> None:
    assert (_dlpack.DLDeviceType.kDLCPU, _dlpack.DLDeviceType.kDLCUDA) == (1, 2)
    assert _dlpack.DLDeviceType.kDLCUDAHost.value == 3
    assert _dlpack.DLDataTypeCode.kDLBfloat.value == 4
    assert _dlpack.DLDataTypeCode.kDLBool.value == 6
    assert _dlpack.DLDataTypeCode.kDLFloat8_e4m3fn.value == 10
    assert _dlpack.DLDataTypeCode.kDLFloat8_e5m2.value == 12
    assert _dlpack.DLPACK_VERSION == (1, 1)


@pytest.mark.parametrize(("dtype", "code", "bits"), EXPECTED_CODES, ids=str)
def test_dtype_codes_both_ways(dtype: np.dtype[Any], code: int, bits: int) -> None:
    assert dtype_to_dl(dtype) == (code, bits, 1)
    assert dl_to_dtype(code, bits, 1) == dtype


def test_numpy_uses_the_same_codes() -> None:
    for dtype in NUMPY_DTYPES:
        view = from_dlpack(np.zeros(2, dtype))
        assert dtype_to_dl(view.dtype) == dtype_to_dl(dtype)


def test_native_release_functions_in_use() -> None:
    # numpy 2.1-2.x: its C deleters and capsule destructors passed the import-time checks.
    assert _release._RELEASE.native


# -- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_roundtrip_is_zero_copy(
    release: str, dtype: np.dtype[Any], layout: str, versioned: bool
) -> None:
    a = _layout(dtype, layout)
    view = from_dlpack(_export(a, versioned=versioned))
    assert isinstance(view, DLPackView)
    assert (view.device, view.byte_offset, view.readonly) == ((1, 0), 0, False)
    assert view.strides == view.strides_in_elements == _elem_strides(a)
    out = view.to_numpy()
    assert _same_bytes(out, a)
    assert out.dtype == dtype
    if a.size:
        assert _data_ptr(out) == _data_ptr(a)
        assert out.strides == a.strides
        out_flat, a_flat = out.reshape(-1), a.reshape(-1)  # views when 0-d or contiguous
        if out.ndim == 0 or a.flags.c_contiguous:
            a_flat[0] = a_flat[-1]
            assert out_flat[0] == a_flat[-1], "writes show through: the memory is shared"


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=str)
def test_numpy_consumes_our_capsule(
    release: str, dtype: np.dtype[Any], layout: str, versioned: bool
) -> None:
    a = _layout(dtype, layout)
    wrapper = Wrapper(lambda v: _export(a, versioned=v and versioned))
    out = _np_from_dlpack(wrapper)
    assert wrapper.calls and wrapper.calls[0].get("max_version") is not None
    assert _same_bytes(out, a)
    if a.size:
        assert _data_ptr(out) == _data_ptr(a)
        assert out.strides == a.strides
    del out


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=str)
def test_we_consume_numpy(dtype: np.dtype[Any], layout: str) -> None:
    a = _layout(dtype, layout)
    for source in (a, a.__dlpack__(max_version=(1, 0)), a.__dlpack__()):
        out = from_dlpack(source).to_numpy()
        assert _same_bytes(out, a)
        if a.size:
            assert _data_ptr(out) == _data_ptr(a)
            assert out.strides == a.strides


def test_producer_without_max_version_gets_a_legacy_call(release: str) -> None:
    a = _sample(np.dtype(np.int32))

    class Old:
        def __dlpack__(self) -> object:
            return _export(a, versioned=False)

    out = from_dlpack(Old()).to_numpy()
    assert _same_bytes(out, a)


def test_readonly_flag_both_ways(release: str) -> None:
    a = _sample(np.dtype(ml_dtypes.bfloat16))
    a.flags.writeable = False
    view = from_dlpack(_export(a, versioned=True))
    assert view.readonly
    out = view.to_numpy()
    assert not out.flags.writeable and _same_bytes(out, a)
    b = _sample(np.dtype(np.float32))
    b.flags.writeable = False
    assert not _np_from_dlpack(Wrapper(lambda v: _export(b, versioned=True))).flags.writeable
    assert from_dlpack(b).readonly  # numpy marks its read-only exports


def test_foreign_producer_null_strides_byte_offset_and_deleter_called_once() -> None:
    """A producer's deleter runs exactly once, after the view and its arrays are gone."""
    backing = np.arange(10, dtype=np.float32)
    calls: list[int] = []
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda p: calls.append(p or 0))
    managed = DLManagedTensorVersioned()
    shape = (ctypes.c_int64 * 2)(2, 3)
    managed.version.major, managed.version.minor = 1, 0
    managed.deleter = ctypes.cast(deleter, ctypes.c_void_p).value
    t = managed.dl_tensor
    t.data, t.byte_offset, t.ndim = backing.ctypes.data, 16, 2  # starts at backing[4]
    t.device.device_type, t.dtype.code, t.dtype.bits, t.dtype.lanes = 1, 2, 32, 1
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))  # strides stay NULL
    capsule = _capsule(ctypes.addressof(managed), b"dltensor_versioned")

    view = from_dlpack(capsule)
    assert (view.ptr, view.byte_offset, view.strides) == (backing.ctypes.data, 16, (3, 1))
    assert _capsule_name(capsule) == b"used_dltensor_versioned"
    out = view.to_numpy()
    np.testing.assert_array_equal(out, backing[4:10].reshape(2, 3))
    del capsule, view
    gc.collect()
    assert calls == []
    del out
    gc.collect()
    assert calls == [ctypes.addressof(managed)]


def test_cuda_tensor_is_described_but_not_mapped(release: str) -> None:
    owner = object()
    capsule = to_dlpack(
        0x7F00_0000_1000, (4, 8), None, ml_dtypes.bfloat16, (2, 3), owner, versioned=True
    )
    view = from_dlpack(capsule)
    assert (view.ptr, view.shape, view.strides, view.device) == (
        0x7F00_0000_1000,
        (4, 8),
        (8, 1),
        (2, 3),
    )
    assert view.dtype == ml_dtypes.bfloat16
    with pytest.raises(DLPackError, match=r"to_numpy: memory is not host-accessible .*kDLCUDA"):
        view.to_numpy()


# -- lifetimes ----------------------------------------------------------------------------


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_owner_lives_as_long_as_the_view(release: str, versioned: bool) -> None:
    owner = Owner(_sample(np.dtype(ml_dtypes.float8_e4m3fn)))
    ref = weakref.ref(owner)
    capsule = _export(owner.arr, versioned=versioned, owner=owner)
    view = from_dlpack(capsule)
    expected = owner.arr.copy()
    del owner, capsule
    gc.collect()
    assert ref() is not None, "the view keeps the owner alive"
    out = view.to_numpy()
    del view
    gc.collect()
    assert ref() is not None, "an array made by to_numpy keeps the owner alive"
    assert _same_bytes(out, expected)
    del out
    gc.collect()
    assert ref() is None, "the deleter released the owner"


def test_owner_lives_as_long_as_a_numpy_consumer(release: str) -> None:
    owner = Owner(_sample(np.dtype(np.int16)))
    ref = weakref.ref(owner)
    out = _np_from_dlpack(_owner_wrapper(owner))
    del owner
    gc.collect()
    assert ref() is not None
    del out
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_unconsumed_capsules_are_freed(release: str, versioned: bool) -> None:
    owner = Owner(_sample(np.dtype(np.float64)))
    ref = weakref.ref(owner)
    before = live_exports()
    for _ in range(10_000):
        capsule = _export(owner.arr, versioned=versioned, owner=owner)
        assert live_exports() == before + 1
        del capsule
    assert live_exports() == before
    del owner
    gc.collect()
    assert ref() is None


def test_exception_in_flight_survives_a_dropped_capsule() -> None:
    # numpy rejects bfloat16 and drops our capsule while its BufferError propagates; numpy's C
    # capsule destructor and deleter (used here) keep that exception intact.
    a = _sample(np.dtype(ml_dtypes.bfloat16))
    before = live_exports()
    with pytest.raises((BufferError, RuntimeError), match="Unsupported dtype"):
        _np_from_dlpack(Wrapper(lambda v: _export(a, versioned=v)))
    assert live_exports() == before


def test_consumer_frees_a_rejected_tensor_it_asked_for(release: str) -> None:
    owner = Owner(_sample(np.dtype(np.float32)))
    ref = weakref.ref(owner)

    wrapper = _owner_wrapper(owner)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(abi, "_FROM_DL", {})  # make the tensor unacceptable to the consumer
        with pytest.raises(DLPackDTypeError, match="from_dlpack: unsupported dtype"):
            from_dlpack(wrapper)
    del wrapper
    del owner
    gc.collect()
    assert ref() is None


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [object, "U4", np.dtype(">f4"), np.longdouble, np.dtype(">c8")])
def test_unsupported_dtypes(bad: Any) -> None:
    with pytest.raises(DLPackDTypeError, match=r"dtype_to_dl: unsupported dtype \(got "):
        dtype_to_dl(bad)
    before = live_exports()
    with pytest.raises(DLPackDTypeError, match=r"to_dlpack: unsupported dtype"):
        to_dlpack(1024, (2,), None, bad, (1, 0), None, versioned=True)
    assert live_exports() == before


def test_error_classes() -> None:
    for cls in (DLPackError, DLPackDTypeError, DLPackArgumentError):
        assert issubclass(cls, ShmemError)
    assert issubclass(DLPackError, BufferError)
    assert issubclass(DLPackDTypeError, BufferError) and issubclass(DLPackDTypeError, ValueError)
    assert issubclass(DLPackArgumentError, ValueError)
    with pytest.raises(ValueError, match="non-native byte order"):
        dtype_to_dl(np.dtype(">i4"))


@pytest.mark.parametrize(
    ("code", "bits", "lanes"),
    [(5, 32, 1), (2, 32, 4), (2, 8, 1), (3, 64, 1), (99, 8, 1), (6, 1, 1)],
)
def test_unsupported_dl_types(code: int, bits: int, lanes: int) -> None:
    with pytest.raises(DLPackDTypeError, match=r"dl_to_dtype: unsupported dtype \(got code="):
        dl_to_dtype(code, bits, lanes)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shape": (2, -1)}, r"shape out of range"),
        ({"shape": (2.0,)}, r"shape must be an integer"),
        ({"strides": (1,)}, r"strides do not match shape"),
        ({"device": (99, 0)}, r"unknown device type \(got 99"),
        ({"device": (1, -1)}, r"device id out of range"),
        ({"device": "cpu"}, r"device must be a \(device_type, device_id\) tuple"),
        ({"ptr": 0}, r"null pointer for a non-empty tensor"),
        ({"ptr": -8}, r"pointer out of range"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {
        "ptr": 4096,
        "shape": (2, 3),
        "strides": None,
        "dtype": np.float32,
        "device": (1, 0),
        "owner": None,
    }
    args.update(kwargs)
    before = live_exports()
    with pytest.raises(DLPackArgumentError, match=match):
        to_dlpack(**args, versioned=True)
    assert live_exports() == before


def test_readonly_needs_a_versioned_capsule() -> None:
    with pytest.raises(DLPackError, match="legacy capsule cannot be read-only"):
        to_dlpack(4096, (2,), None, np.int8, (1, 0), None, versioned=False, readonly=True)


def test_to_numpy_refuses_device_memory(release: str) -> None:
    capsule = to_dlpack(4096, (2,), None, np.float32, (2, 0), None, versioned=True)
    with pytest.raises(DLPackError, match=r"not host-accessible \(got device \(2, 0\) kDLCUDA"):
        from_dlpack(capsule).to_numpy()


def test_consumed_and_foreign_capsules_are_refused(release: str) -> None:
    capsule = _export(_sample(np.dtype(np.uint8)), versioned=True)
    from_dlpack(capsule)
    with pytest.raises(
        DLPackError, match=r"already consumed \(got a capsule named 'used_dltensor_versioned'"
    ):
        from_dlpack(capsule)
    import datetime

    with pytest.raises(DLPackError, match=r"not a DLPack capsule \(got a capsule named 'datetime"):
        from_dlpack(datetime.datetime_CAPI)
    with pytest.raises(DLPackError, match=r"not a DLPack object \(got int"):
        from_dlpack(3)


def test_unknown_major_version_is_deleted_not_read() -> None:
    calls: list[int] = []
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda p: calls.append(p or 0))
    managed = DLManagedTensorVersioned()
    managed.version.major = 2
    managed.deleter = ctypes.cast(deleter, ctypes.c_void_p).value
    capsule = _capsule(ctypes.addressof(managed), b"dltensor_versioned")
    with pytest.raises(DLPackError, match=r"unsupported DLPack version \(got \(2, 0\)"):
        from_dlpack(capsule)
    assert calls == [ctypes.addressof(managed)]
    assert _capsule_name(capsule) == b"used_dltensor_versioned"


def test_rejected_capsule_passed_in_is_left_unconsumed(release: str) -> None:
    capsule = to_dlpack(4096, (2,), None, np.float32, (1, 0), None, versioned=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(abi, "_FROM_DL", {})
        with pytest.raises(DLPackDTypeError, match="from_dlpack: unsupported dtype"):
            from_dlpack(capsule)
    assert _capsule_name(capsule) == b"dltensor_versioned"
    assert from_dlpack(capsule).dtype == np.float32


# -- helpers: raw capsules ------------------------------------------------------------------

_NAMES: dict[bytes, ctypes.Array[ctypes.c_char]] = {}


def _capsule(pointer: int, name: bytes) -> object:
    """A capsule without destructor (the test owns the tensor)."""
    new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
        ("PyCapsule_New", ctypes.pythonapi)
    )
    buf = _NAMES.setdefault(name, ctypes.create_string_buffer(name))  # outlives the capsule
    capsule: object = new(pointer, ctypes.addressof(buf), None)
    return capsule


def _capsule_name(capsule: object) -> bytes | None:
    get = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
        ("PyCapsule_GetName", ctypes.pythonapi)
    )
    name: bytes | None = get(capsule)
    return name
