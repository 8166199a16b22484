"""Compiling (text, paths, batches, errors with line and column) and launching."""

import pathlib

import numpy as np
import pytest
from conftest import INC, KERNELS, SHIFTED, require

import kiln


def test_compile_from_a_path_names_the_kernel_after_the_file(dev):
    k = dev.compile(KERNELS / "add.kiln")
    assert k.name == "add" and k.device == "CPU"
    assert k.var_names == ["n"] and k.vars == [("n", 1, 16777216)]
    assert k.params == [(0, "f32"), (1, "f32"), (2, "f32")] and k.outs == [2]
    assert "add" in k.source and "add" in repr(k)
    assert dev.compile(str(KERNELS / "add.kiln")).name == "add"


def test_compile_from_text_with_a_name(dev):
    assert dev.compile(INC, name="inc").name == "inc"


def test_launch_by_call_and_by_launch(dev, add):
    a = dev.from_numpy(np.arange(16, dtype=np.float32))
    b = dev.from_numpy(np.full(16, 0.5, np.float32))
    c = dev.empty("f32", 16)
    add(a, b, c, n=16)
    np.testing.assert_array_equal(c.numpy(), np.arange(16, dtype=np.float32) + 0.5)
    c.copy_from(np.zeros(16, np.float32))
    add.launch([a, b, c], vars={"n": 8})
    np.testing.assert_array_equal(c.numpy()[:8], np.arange(8) + 0.5)
    np.testing.assert_array_equal(c.numpy()[8:], 0)


def test_a_parse_error_keeps_line_and_column(dev):
    with pytest.raises(kiln.ParseError) as e:
        dev.compile('%n = DEFINE_VAR i32 "n" 1 8\n%x = BOGUS i32 (%n)\n')
    assert (e.value.line, e.value.col) == (2, 6)
    assert "line 2, column 6" in str(e.value)
    assert isinstance(e.value, kiln.InvalidArgumentError) and isinstance(e.value, kiln.Error)


def test_a_validation_error_keeps_line_and_column(dev):
    text = INC.replace("%c  = CONST f32 1.0", "%c  = CONST i32 1")
    with pytest.raises(kiln.ParseError, match="different dtypes") as e:
        dev.compile(text)
    assert (e.value.line, e.value.col) == (9, 7), str(e.value)


def test_a_render_failure_is_a_compile_error(dev):
    with pytest.raises(kiln.CompileError, match="gidx7"):
        dev.compile(INC.replace('"idx0"', '"gidx7"'))


def test_a_missing_file_is_an_io_error(dev):
    with pytest.raises(kiln.IoError, match="cannot read kernel file"):
        dev.compile(pathlib.Path("/nonexistent/k.kiln"))
    with pytest.raises(kiln.InvalidArgumentError, match="kernel text"):
        dev.compile(42)


def test_compile_many_keeps_order_and_reports_the_failing_entry(dev):
    ks = dev.compile_many([KERNELS / "add.kiln", (INC, "inc"), (INC, "inc2")])
    assert [k.name for k in ks] == ["add", "inc", "inc2"]
    with pytest.raises(kiln.ParseError, match="kernel 1 of the batch") as e:
        dev.compile_many([INC, "%x = BOGUS\n"])
    assert e.value.line == 1
    assert dev.compile_many([]) == []


def test_an_unproven_access_is_refused_with_its_node_and_line(dev):
    old = dev.bounds_policy
    dev.bounds_policy = "refuse"
    try:
        k = dev.compile(SHIFTED, name="shifted")
    finally:
        dev.bounds_policy = old
    o = dev.empty("f32", 8)
    with pytest.raises(kiln.OutOfBoundsError) as e:
        k(o, n=8)
    assert isinstance(e.value, kiln.LaunchError)
    assert e.value.line == 8 and "%st (line 8)" in str(e.value), str(e.value)


def test_a_guarded_access_that_leaves_its_buffer_is_out_of_bounds(dev):
    old = dev.bounds_policy
    dev.bounds_policy = "guard"
    try:
        k = dev.compile(SHIFTED, name="shifted")
    finally:
        dev.bounds_policy = old
    o = dev.empty("f32", 8)
    with pytest.raises(kiln.OutOfBoundsError, match="guarded"):
        k(o, n=8)


def test_bad_launch_arguments(dev, add):
    a, b, c = (dev.empty("f32", 8) for _ in range(3))
    with pytest.raises(kiln.LaunchError, match="holds f64"):
        add(a, b, dev.empty("f64", 8), n=8)
    with pytest.raises(kiln.LaunchError, match="has 4 elements"):
        add(a, b, dev.empty("f32", 4), n=8)
    with pytest.raises(kiln.LaunchError, match="takes 3 buffer"):
        add(a, b, n=8)
    with pytest.raises(kiln.InvalidArgumentError, match="kiln.Buffer"):
        add(a, b, np.zeros(8, np.float32), n=8)
    with pytest.raises(kiln.InvalidArgumentError, match="has no value"):
        add(a, b, c)
    with pytest.raises(kiln.InvalidArgumentError, match="no variable `m`"):
        add(a, b, c, n=8, m=1)
    with pytest.raises(kiln.InvalidArgumentError, match="outside its bounds"):
        add(a, b, c, n=0)
    with pytest.raises(kiln.InvalidArgumentError, match="must be an int"):
        add(a, b, c, n="8")
    with pytest.raises(kiln.InvalidArgumentError, match="has no value"):
        add.launch([a, b, c], vars={})


def test_a_buffer_of_another_device_is_refused(add):

    cl = require("OPENCL")
    cpu = kiln.Device("CPU")
    a, b = cpu.empty("f32", 8), cpu.empty("f32", 8)
    with pytest.raises(kiln.LaunchError, match="OPENCL"):
        add(a, b, cl.empty("f32", 8), n=8)
    on_cl = cl.from_numpy(np.arange(8, dtype=np.float32))
    a.copy_from(on_cl)  # copies cross devices
    np.testing.assert_array_equal(a.numpy(), np.arange(8))
    with pytest.raises(BufferError):
        np.from_dlpack(on_cl)


def test_opencl_launches_when_present():

    cl = require("OPENCL")
    k = cl.compile(INC, name="inc")
    a, o = cl.from_numpy(np.arange(32, dtype=np.float32)), cl.empty("f32", 32)
    k(a, o, n=32)
    np.testing.assert_array_equal(o.numpy(), np.arange(32) + 1)
