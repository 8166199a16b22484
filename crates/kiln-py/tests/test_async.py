"""Asynchronous launches on a device whose memory the host does not address (OpenCL here):
a launch is queued, and reading a buffer or synchronize() waits for the work before it."""

import numpy as np
import pytest
from conftest import INC, SHIFTED, require

import kiln


@pytest.fixture
def cl():
    return require("OPENCL")


def test_reading_a_buffer_waits_for_the_launches_that_write_it(cl):
    k = cl.compile(INC, name="inc")
    n = 1 << 18
    a, b = cl.from_numpy(np.zeros(n, np.float32)), cl.empty("f32", n)
    for _ in range(10):  # a <- a + 2, ten times, each launch reading the one before
        k(a, b, n=n)
        k(b, a, n=n)
    np.testing.assert_array_equal(a.numpy(), 20)  # no synchronize(): the read waits
    cpu = kiln.Device("CPU").empty("f32", n)
    k(a, b, n=n)
    cpu.copy_from(b)  # a copy to another device waits too
    np.testing.assert_array_equal(cpu.numpy(), 21)
    b.copy_from(np.zeros(n, np.float32))  # so does a write from the host
    k(b, a, n=n)
    cl.synchronize()
    np.testing.assert_array_equal(a.numpy(), 1)


def test_a_failure_while_running_is_raised_by_the_next_wait(cl):
    old = cl.bounds_policy
    cl.bounds_policy = "guard"
    try:
        shifted = cl.compile(SHIFTED, name="shifted")
    finally:
        cl.bounds_policy = old
    shifted(cl.empty("f32", 8), n=8)  # queued: the guard fires on the device
    with pytest.raises(kiln.OutOfBoundsError, match="guarded") as e:
        cl.synchronize()
    assert e.value.line == 8, str(e.value)  # located after the fact, by the kernel's name
    cl.synchronize()  # reported once
    k = cl.compile(INC, name="inc")
    a, b = cl.from_numpy(np.ones(4, np.float32)), cl.empty("f32", 4)
    k(a, b, n=4)  # the device goes on with a fresh queue
    np.testing.assert_array_equal(b.numpy(), 2)


def test_argument_errors_are_raised_by_the_launch_itself(cl):
    k = cl.compile(INC, name="inc")
    with pytest.raises(kiln.LaunchError, match="has 4 elements"):
        k(cl.empty("f32", 8), cl.empty("f32", 4), n=8)


def test_a_plan_runs_after_the_launches_before_it(cl):
    k = cl.compile(INC, name="inc")
    a, b, c = cl.from_numpy(np.zeros(64, np.float32)), cl.empty("f32", 64), cl.empty("f32", 64)
    plan = kiln.Plan(cl)
    plan.launch(k, [b, c], {"n": 64})
    k(a, b, n=64)  # queued; the plan reads what it writes
    plan.run()
    np.testing.assert_array_equal(c.numpy(), 2)


def test_from_dlpack_onto_a_device_the_host_cannot_address_copies(cl):
    x = np.arange(16, dtype=np.float32)
    b = kiln.from_dlpack(x, device=cl)
    assert b.device == cl.name and not b.is_host
    x[:] = 0
    np.testing.assert_array_equal(b.numpy(), np.arange(16))
    assert b.__dlpack_device__() == (4, 0)  # kDLOpenCL (the `cl` fixture's OPENCL:0): reported ...
    with pytest.raises(BufferError, match="cannot be shared through DLPack"):
        b.__dlpack__()  # ... but not exported (DLPack's BufferError)
