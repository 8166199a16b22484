"""kiln.Plan: recorded launches and copies, replayed with new values, synchronously or not."""

import numpy as np
import pytest

from conftest import SHIFTED

import kiln


def test_record_and_replay_with_new_sizes(dev, inc):
    a = dev.from_numpy(np.arange(64, dtype=np.float32))
    b, c, d = dev.empty("f32", 64), dev.empty("f32", 64), dev.empty("f32", 64)
    plan = kiln.Plan(dev)
    assert plan.launch(inc, [a, b], {"n": 64}) == 0
    assert plan.launch(inc, [b, c], {"n": 64}) == 1  # reads what node 0 writes
    assert plan.copy(d, c) == 2
    assert len(plan) == 3 and plan.var_names == ["n"] and "3 nodes" in repr(plan)
    plan.run()
    np.testing.assert_array_equal(d.numpy(), np.arange(64) + 2)
    d.copy_from(np.zeros(64, np.float32))
    plan.run(n=64)
    np.testing.assert_array_equal(d.numpy(), np.arange(64) + 2)
    a.copy_from(np.full(64, 10, np.float32))
    plan.run(n=16)  # only the first 16 elements are recomputed
    np.testing.assert_array_equal(c.numpy()[:16], 12)
    np.testing.assert_array_equal(c.numpy()[16:], np.arange(16, 64) + 2)


def test_rebind_runs_on_new_buffers(dev, inc):
    a, b, c = dev.from_numpy(np.arange(8, dtype=np.float32)), dev.empty("f32", 8), dev.empty("f32", 8)
    plan = kiln.Plan(dev)
    plan.launch(inc, [a, b], {"n": 8})
    plan.launch(inc, [b, c], {"n": 8})
    a2, c2 = dev.from_numpy(np.full(8, 5, np.float32)), dev.empty("f32", 8)
    plan.rebind([(0, 0, a2), (1, 1, c2)])
    plan.run()
    np.testing.assert_array_equal(c2.numpy(), 7)
    with pytest.raises(kiln.LaunchError, match="shares memory"):
        plan.rebind([(0, 0, c2)])  # the output of node 1 as the input of node 0
    with pytest.raises(kiln.LaunchError, match="no node 5"):
        plan.rebind([(5, 0, a)])
    with pytest.raises(kiln.InvalidArgumentError, match="tuples"):
        plan.rebind([(0, 0, np.zeros(8))])
    plan.run()  # a refused rebinding changed nothing
    np.testing.assert_array_equal(c2.numpy(), 7)


def test_run_async_returns_a_waitable(dev, inc):
    a = dev.from_numpy(np.zeros(1024, np.float32))
    b = dev.empty("f32", 1024)
    plan = kiln.Plan(dev)
    plan.launch(inc, [a, b], {"n": 1024})
    runs = [plan.run_async(n=1024) for _ in range(3)]
    for r in runs:
        r.wait()
        assert r.done()
        r.wait()  # waiting again is harmless
    np.testing.assert_array_equal(b.numpy(), 1)


def test_plan_errors(dev, inc):
    a, b = dev.empty("f32", 8), dev.empty("f32", 8)
    plan = kiln.Plan(dev)
    with pytest.raises(kiln.LaunchError, match="has 8 elements"):
        plan.launch(inc, [a, b], {"n": 16})
    with pytest.raises(kiln.InvalidArgumentError, match="kiln.Buffer"):
        plan.launch(inc, [a, np.zeros(8)], {"n": 8})
    plan.launch(inc, [a, b], {"n": 8})
    with pytest.raises(kiln.LaunchError, match="no plan variable|not a plan variable|no variable"):
        plan.run(m=3)
    with pytest.raises(kiln.LaunchError):
        plan.run(n=9)  # larger than the buffers
    run = plan.run_async(n=9)
    with pytest.raises(kiln.LaunchError):
        run.wait()
    with pytest.raises(kiln.Error):
        run.wait()  # the failure is reported again
    with pytest.raises(kiln.InvalidArgumentError, match="must be an int"):
        plan.run(n=1.5)
    plan.run(n=8)  # still usable


def test_a_plan_of_a_reset_device_is_lost(inc):
    dev = kiln.Device("CPU")
    a, b = dev.empty("f32", 8), dev.empty("f32", 8)
    k = dev.compile(__import__("conftest").INC, name="inc")
    plan = kiln.Plan(dev)
    plan.launch(k, [a, b], {"n": 8})
    plan.run()
    dev.reset()
    with pytest.raises(kiln.DeviceLostError):
        plan.run()


def test_a_guarded_fault_in_a_plan_run_names_its_line(dev):
    old = dev.bounds_policy
    dev.bounds_policy = "guard"
    try:
        shifted = dev.compile(SHIFTED, name="shifted_in_plan")
    finally:
        dev.bounds_policy = old
    plan = kiln.Plan(dev)
    plan.launch(shifted, [dev.empty("f32", 8)], {"n": 8})
    with pytest.raises(kiln.OutOfBoundsError, match="guarded") as e:
        plan.run()
    assert e.value.line == 8, str(e.value)
