"""Buffers: empty, from_numpy, numpy, copy_from, view, dtypes; zero-copy numpy and DLPack
both ways, with the memory alive as long as any view of it."""

import gc
import weakref

import numpy as np
import pytest

import kiln


@pytest.mark.parametrize("dtype", ["bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64"])
def test_numpy_round_trip_of_every_dtype(dev, dtype):
    b = dev.empty(dtype, 5)
    want = (np.arange(5) % 2).astype(b.numpy().dtype)
    b.copy_from(want)
    assert b.dtype == dtype and len(b) == 5 and b.nbytes == 5 * want.itemsize
    np.testing.assert_array_equal(b.numpy(), want)
    np.testing.assert_array_equal(dev.from_numpy(want).numpy(), want)


def test_dtype_spellings(dev):
    assert dev.empty(np.float32, 1).dtype == "f32"
    assert dev.empty(np.dtype("<i8"), 1).dtype == "i64"
    assert dev.empty("float16", 1).dtype == "f16"
    assert dev.empty("bfloat16", 1).dtype == "bf16"
    assert set(kiln.DTYPES) >= {"f32", "bf16", "bool"}
    with pytest.raises(kiln.InvalidArgumentError, match="unknown dtype"):
        dev.empty("f31", 1)
    with pytest.raises(kiln.InvalidArgumentError, match="numpy has no bf16"):
        dev.empty("bf16", 2).numpy()


def test_from_numpy_flattens_and_copies(dev):
    x = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]  # not contiguous
    b = dev.from_numpy(x)
    assert len(b) == 6
    np.testing.assert_array_equal(b.numpy(), x.ravel())
    x[:] = 0
    assert b.numpy().any(), "from_numpy copies"
    assert len(dev.from_numpy([1.0, 2.0])) == 2


def test_copy_from_checks_dtype_and_length(dev):
    b = dev.empty("f32", 4)
    with pytest.raises(kiln.InvalidArgumentError, match="cannot copy 3 x f32"):
        b.copy_from(np.zeros(3, np.float32))
    with pytest.raises(kiln.InvalidArgumentError, match="f64"):
        b.copy_from(np.zeros(4, np.float64))
    with pytest.raises(kiln.InvalidArgumentError, match="copy of 12 bytes"):
        b.copy_from(dev.empty("f32", 3))
    src = dev.from_numpy(np.arange(4, dtype=np.float32))
    b.copy_from(src)
    np.testing.assert_array_equal(b.numpy(), np.arange(4))


def test_views_share_memory_and_check_their_range(dev):
    b = dev.from_numpy(np.arange(10, dtype=np.float32))
    v = b.view(2, 3)
    assert len(v) == 3 and len(b.view(7)) == 3
    np.testing.assert_array_equal(v.numpy(), [2, 3, 4])
    v.copy_from(np.zeros(3, np.float32))
    np.testing.assert_array_equal(b.numpy()[1:6], [1, 0, 0, 0, 5])
    assert b.reinterpret("u8").nbytes == 40
    with pytest.raises(kiln.InvalidArgumentError, match="outside a buffer of 10"):
        b.view(8, 3)
    with pytest.raises(kiln.InvalidArgumentError, match="past a buffer"):
        b.view(11)
    with pytest.raises(kiln.InvalidArgumentError, match="cannot be viewed as f64"):
        b.view(0, 3).reinterpret("f64")
    assert "3 x f32" in repr(v)


def test_a_view_outlives_its_buffer_object(dev):
    b = dev.from_numpy(np.arange(1000, dtype=np.float32))
    gone = weakref.ref(b)
    v = b.view(990, 10)
    del b
    gc.collect()
    assert gone() is None
    filler = [dev.from_numpy(np.full(1000, -1, np.float32)) for _ in range(8)]
    np.testing.assert_array_equal(v.numpy(), np.arange(990, 1000))
    del filler


def test_numpy_writes_and_kiln_reads_without_a_copy(dev, inc):
    x = np.zeros(64, np.float32)
    b = kiln.from_dlpack(x)
    assert b.is_host and b.device == "CPU" and len(b) == 64
    x[:] = np.arange(64)  # written through numpy ...
    out = dev.empty("f32", 64)
    inc(b, out, n=64)  # ... read by a kiln kernel
    np.testing.assert_array_equal(out.numpy(), np.arange(64) + 1)


def test_kiln_writes_and_numpy_reads_without_a_copy(dev, inc):
    src = dev.from_numpy(np.arange(64, dtype=np.float32))
    out = dev.empty("f32", 64)
    seen = np.from_dlpack(out)
    also = np.asarray(out)  # the array interface shares it too
    assert out.__dlpack_device__() == (1, 0)
    inc(src, out, n=64)  # written by a kiln kernel ...
    np.testing.assert_array_equal(seen, np.arange(64) + 1)  # ... read through numpy
    np.testing.assert_array_equal(also, np.arange(64) + 1)
    seen[0] = 100
    assert out.numpy()[0] == 100


def test_a_numpy_view_keeps_kiln_memory_alive(dev, inc):
    out = dev.empty("f32", 256)
    inc(dev.from_numpy(np.zeros(256, np.float32)), out, n=256)
    gone = weakref.ref(out)
    seen = np.from_dlpack(out)
    also = np.asarray(out.view(0, 4))
    del out
    gc.collect()
    assert gone() is None
    filler = [dev.from_numpy(np.full(256, -7, np.float32)) for _ in range(8)]
    np.testing.assert_array_equal(seen, 1)
    np.testing.assert_array_equal(also, 1)
    del filler


def test_a_kiln_buffer_keeps_imported_memory_alive(dev, inc):
    x = np.arange(32, dtype=np.float32)
    gone = weakref.ref(x)
    b = kiln.from_dlpack(x)
    v = b.view(30, 2)
    del x, b
    gc.collect()
    assert gone() is not None, "the kiln views hold the array"
    out = dev.empty("f32", 2)
    inc(v, out, n=2)
    np.testing.assert_array_equal(out.numpy(), [31, 32])
    del v
    gc.collect()
    assert gone() is None, "the last kiln view released the array"


def test_from_dlpack_copies_what_cannot_be_shared(dev):
    ro = np.arange(4, dtype=np.float32)
    ro.setflags(write=False)
    b = kiln.from_dlpack(ro)
    np.testing.assert_array_equal(b.numpy(), ro)
    np.from_dlpack(b)[0] = 9  # the copy is writable and is not the array
    assert ro[0] == 0
    raw = bytearray(4 * 5)
    odd = np.frombuffer(raw, dtype=np.float32, count=4, offset=2)  # misaligned
    c = kiln.from_dlpack(odd, device=dev)
    odd_w = np.frombuffer(raw, dtype=np.uint8)
    odd_w[2:] = 0xFF
    assert not np.isnan(c.numpy()).any(), "a misaligned array is copied"
    with pytest.raises(kiln.InvalidArgumentError, match="DLPack"):
        kiln.from_dlpack([1, 2, 3])
    with pytest.raises(kiln.InvalidArgumentError, match="contiguous"):
        kiln.from_dlpack(np.arange(8, dtype=np.float32)[::2])


def test_dlpack_export_options(dev):
    b = dev.from_numpy(np.arange(3, dtype=np.int64))
    np.testing.assert_array_equal(np.from_dlpack(b.view(1)), [1, 2])
    with pytest.raises(BufferError, match="without copying"):
        b.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not on DLPack device"):
        b.__dlpack__(dl_device=(2, 0))
    legacy = b.__dlpack__()
    versioned = b.__dlpack__(max_version=(1, 0))
    assert "dltensor" in repr(legacy) and "dltensor_versioned" in repr(versioned)
    del legacy, versioned  # unconsumed capsules free their tensors
    gc.collect()
    np.testing.assert_array_equal(np.from_dlpack(dev.from_numpy(np.array([True, False]))), [True, False])
