"""Whatever a caller passes, the answer is a result or a `kiln.Error` that says what was wrong
and what to do: one test per case found by hand and by the API fuzzer (each asserts the class
and a phrase of the message; the crash and wrong-result cases also that nothing ran wrong)."""

import pathlib

import numpy as np
import pytest

import kiln
from conftest import INC, KERNELS, require


def gpu_devices():
    """The devices with their own queues that this machine has (as `require` decides)."""
    out = []
    for backend in ("OPENCL", "CUDA", "WEBGPU"):
        try:
            out.append(require(backend))
        except pytest.skip.Exception:
            pass
    return out


def deep_where_chain(depth: int) -> str:
    """D1: `depth` chained WHEREs, which crashed PoCL's in-process clang at 10,000."""
    lines = ['%n = DEFINE_VAR i32 "n" 1 8', "%p = PARAM ptr<f32> 0 (%n)", '%i = SPECIAL i32 "idx0" (%n)',
             "%a = INDEX ptr<f32> (%p, %i)", "%x0 = LOAD f32 (%a)", "%c = CONST f32 1.0", "%z = CONST f32 0.0",
             "%t = CMPLT bool (%z, %x0)"]
    lines += [f"%x{k} = WHERE f32 (%t, %x{k - 1}, %c)" for k in range(1, depth)]
    lines += [f"%s = STORE void (%a, %x{depth - 1})", "SINK void (%s)"]
    return "\n".join(lines) + "\n"


# D2: a gated store of 7 into u8 elements n·n (an i32 launch size) of a buffer of n.
SQUARE_LAUNCH = """\
%n  = DEFINE_VAR i32 "n" 1 65536
%m  = MUL i32 (%n, %n)
%o  = PARAM ptr<u8> 0 (%n)
%i  = SPECIAL i32 "idx0" (%m)
%ok = CMPLT bool (%i, %n)
%p  = INDEX ptr<u8> (%o, %i)
%v  = CONST u8 7
%st = STORE void (%p, %v, %ok)
SINK void (%st)
"""


def test_d1_a_kernel_too_deep_for_backend_compilers_is_refused_on_every_backend(dev):
    for d in [dev, *gpu_devices()]:
        with pytest.raises(kiln.InvalidArgumentError, match="longest chain of dependent operations is 10006 nodes"):
            d.compile(deep_where_chain(10_000))
    dev.compile(deep_where_chain(1_000))  # a deep but ordinary kernel still compiles


def test_d2_a_launch_size_that_wraps_its_dtype_is_refused_and_nothing_runs(dev):
    for d in [dev, *gpu_devices()]:
        k = d.compile(SQUARE_LAUNCH, name="square")
        out = d.from_numpy(np.zeros(46341, np.uint8))
        with pytest.raises(kiln.InvalidArgumentError, match="does not fit i32"):
            k(out, n=46341)
            d.synchronize()
        assert not out.numpy().any(), f"a refused launch wrote on {d.name}"
        k(out, n=46340)
        d.synchronize()
        assert (out.numpy()[:46340] == 7).all()


def test_d3_zero_byte_plan_copies_are_no_ops(dev):
    for d in [dev, *gpu_devices()]:
        p = kiln.Plan(d)
        full = d.from_numpy(np.arange(4, dtype=np.float32))
        p.copy(d.empty("f32", 0), d.empty("f32", 0))
        p.copy(full.view(4, 0), full.view(4, 0).reinterpret("f32"))
        p.run()
        p.run()
        assert full.numpy().tolist() == [0, 1, 2, 3]


def test_d4_every_wait_raises_the_same_typed_error(dev):
    k = dev.compile(KERNELS / "add.kiln")
    p = kiln.Plan(dev)
    a = dev.empty("f32", 4)
    p.launch(k, [a, a, dev.empty("f32", 4)], {"n": 4})
    run = p.run_async(n=5)  # the recorded buffers hold 4 elements
    errors = []
    for _ in range(2):
        with pytest.raises(kiln.Error) as e:
            run.wait()
        errors.append(e.value)
    assert type(errors[0]) is type(errors[1]) and type(errors[0]) is not kiln.Error
    assert str(errors[0]) == str(errors[1]) and errors[1].root_cause == errors[0].root_cause
    assert run.done()


def test_d5_sizes_past_any_buffer_are_refused_and_len_works(dev):
    with pytest.raises(kiln.InvalidArgumentError, match="larger than any buffer"):
        dev.empty("u8", 2**63)
    with pytest.raises(kiln.InvalidArgumentError, match="larger than any buffer"):
        dev.empty("u8", 2**64 - 1)
    with pytest.raises(kiln.InvalidArgumentError, match="need more than"):
        dev.empty("f64", 2**61)
    with pytest.raises(kiln.InvalidArgumentError, match="exceeds the address space"):
        dev.empty("u8", 2**63 - 1)  # allocated now (rounded up to an allocator size class)
    assert len(dev.empty("u8", 2**20)) == 2**20


def test_d6_a_failed_allocation_leaves_high_water_alone():
    d = kiln.Device("CPU", compiler="cc-sse2")  # a device of its own: no other test's buffers in its counters
    before = d.memory_stats()["high_water"]
    with pytest.raises(kiln.OutOfMemoryError):
        d.empty("u8", 2**40)
    assert d.memory_stats()["high_water"] == before


def test_d7_empty_arrays_are_taken_whatever_their_strides(dev):
    assert len(kiln.from_dlpack(np.zeros((0, 5), np.float32))) == 0
    assert len(dev.from_numpy(np.zeros((2, 0, 3)))) == 0


@pytest.mark.parametrize("call, phrase", [
    (lambda d: d.empty("f32", -1), "must be 0 or more, got -1"),
    (lambda d: d.empty("f32", 2**64), "larger than any buffer"),
    (lambda d: d.empty("f32", 1.5), "must be an int, got float"),
    (lambda d: d.empty("f32", 4).view(-1, 2), "offset must be 0 or more"),
    (lambda d: d.empty("f32", 4).view(0, 2**70), "larger than any buffer"),
])
def test_sizes_and_offsets_are_checked_as_python_ints(dev, call, phrase):
    with pytest.raises(kiln.InvalidArgumentError, match=phrase):
        call(dev)


def test_an_impossible_size_fails_at_empty(dev):
    with pytest.raises(kiln.OutOfMemoryError):
        dev.empty("f32", 2**60)


def test_arrays_kiln_cannot_take_directly_are_copied_or_refused(dev):
    a = np.arange(8, dtype=np.float32)
    assert dev.from_numpy(a[::2]).numpy().tolist() == [0, 2, 4, 6]  # copied
    with pytest.raises(kiln.InvalidArgumentError, match="strided"):
        kiln.from_dlpack(a[::2])
    with pytest.raises(kiln.InvalidArgumentError, match="complex64"):
        dev.from_numpy(np.zeros(4, np.complex64))
    with pytest.raises(kiln.InvalidArgumentError, match="dtype object"):
        dev.from_numpy(np.array([object()] * 3))
    with pytest.raises(kiln.InvalidArgumentError, match="numpy cannot make an array"):
        dev.from_numpy([[1, 2], [3]])
    with pytest.raises(kiln.OutOfMemoryError, match="the host"):
        dev.from_numpy(np.broadcast_to(np.float32(1), (2**50,)))  # 4 PiB: past any address space
    with pytest.raises(kiln.InvalidArgumentError, match="does not support DLPack"):
        kiln.from_dlpack([1.0, 2.0])


def test_messages_speak_to_a_python_caller(dev, tmp_path: pathlib.Path):
    with pytest.raises(kiln.IoError, match="no kernel file at examples/kernels/nope.kiln"):
        dev.compile("examples/kernels/nope.kiln")
    with pytest.raises(kiln.UnavailableError, match="no backend called GPU") as e:
        kiln.Device("GPU")
    assert "crate" not in str(e.value)
    inc = dev.compile(INC, name="inc")
    a = dev.empty("f32", 4)
    with pytest.raises(kiln.InvalidArgumentError, match="pass it as a keyword, e.g. n=N") as e:
        inc(a, a)
    assert "--var" not in str(e.value)
    with pytest.raises(kiln.InvalidArgumentError, match="does not fit a 64-bit integer"):
        inc(a, a, n=2**70)
    with pytest.raises(kiln.InvalidArgumentError, match="must be an int, got str"):
        inc(a, a, n="4")
    with pytest.raises(kiln.ParseError, match="unknown op `BOGUS`") as e:
        dev.compile("%x = BOGUS\n")
    assert "upper case" not in str(e.value)
    with pytest.raises(kiln.ParseError, match="ops are upper case"):
        dev.compile("%x = load f32\n")
    big = tmp_path / "big.kiln"
    big.write_bytes(b"#" * (64 << 20) + b"\n#")
    with pytest.raises(kiln.IoError, match="larger than 64 MiB"):
        dev.compile(big)


def test_a_closed_handle_refuses_everything_but_its_name_and_the_objects_made_before_work():
    d = kiln.Device("CPU")
    inc = d.compile(INC, name="inc")
    a, out = d.from_numpy(np.ones(4, np.float32)), d.empty("f32", 4)
    d.close()
    assert d.name == "CPU" and "closed" in repr(d)
    for call in (lambda: d.properties, lambda: d.generation, lambda: d.description, lambda: d.empty("f32", 1),
                 lambda: d.__enter__()):
        with pytest.raises(kiln.InvalidArgumentError, match="was closed"):
            call()
    inc(a, out, n=4)  # made before close: the device stays open for it
    assert out.numpy().tolist() == [2.0] * 4


def test_stale_buffers_are_refused_when_viewed_or_copied_after_a_reset():
    d = kiln.Device("CPU", compiler="cc-avx2")  # reset only this test's device
    b = d.empty("f32", 4)
    d.reset()
    for call in (lambda: b.view(0, 2), lambda: b.reinterpret("u8"), lambda: kiln.Plan(d).copy(d.empty("f32", 4), b)):
        with pytest.raises(kiln.DeviceLostError):
            call()


def test_run_async_refuses_an_unknown_variable_at_once(dev):
    p = kiln.Plan(dev)
    a = dev.empty("f32", 4)
    p.launch(dev.compile(INC, name="inc"), [a, dev.empty("f32", 4)], {"n": 4})
    with pytest.raises(kiln.LaunchError, match="the plan has no variable `zz`"):
        p.run_async(zz=3)


def test_kernel_names_never_collide_and_are_bounded(dev):
    assert dev.compile(INC, name="a b").name != dev.compile(INC, name="a\0b").name
    with pytest.raises(kiln.InvalidArgumentError, match="at most 128"):
        dev.compile(INC, name="x" * 5000)
    for d in gpu_devices():  # PoCL aborted on a 300-character name
        with pytest.raises(kiln.InvalidArgumentError, match="at most 128"):
            d.compile(INC, name="x" * 300)


def test_arguments_of_the_wrong_kind_are_kilns_errors(dev):
    b = dev.empty("f32", 4)
    with pytest.raises(kiln.InvalidArgumentError, match="a compile_many entry"):
        dev.compile_many([(str(KERNELS / "add.kiln"),)])
    with pytest.raises(kiln.InvalidArgumentError, match="is not a dtype"):
        dev.empty(3, 4)
    with pytest.raises(kiln.InvalidArgumentError, match="timeout is in seconds"):
        kiln.Plan(dev, timeout="1")
    with pytest.raises(kiln.InvalidArgumentError, match="between kiln.Buffer objects"):
        kiln.Plan(dev).copy(b, np.zeros(4))
    with pytest.raises(kiln.InvalidArgumentError, match="a dict of names to ints"):
        dev.compile(INC, name="inc").launch([b, b], [("n", 4)])
    assert b.__dlpack__(max_version=(-1, 0)) is not None  # any int is a version
    for d in gpu_devices():
        assert d.empty("f32", 1).__dlpack_device__()[0] in (2, 4, 15)  # kDLCUDA, kDLOpenCL, kDLWebGPU
