"""Objects shared between Python threads; the GIL is released while kiln works."""

import threading

import numpy as np
import pytest
from conftest import INC, require

import kiln


def test_threads_launch_one_kernel_on_one_device_concurrently(dev, inc):
    errors, n = [], 4096

    def work(seed):
        try:
            a = dev.from_numpy(np.full(n, seed, np.float32))
            out = dev.empty("f32", n)
            for _ in range(200):
                inc(a, out, n=n)
            assert (out.numpy() == seed + 1).all()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_the_gil_is_released_during_a_launch(dev):
    """A Python thread keeps running while another is inside a long kernel launch."""
    sum_ = dev.compile(__import__("conftest").KERNELS / "sum.kiln")
    big = dev.from_numpy(np.ones(1 << 24, np.float32))
    out = dev.empty("f32", 1)
    ticks, running = [0], threading.Event()

    def count():
        running.set()
        while running.is_set():
            ticks[0] += 1

    t = threading.Thread(target=count)
    t.start()
    running.wait()
    before = ticks[0]
    for _ in range(5):
        sum_(big, out, n=1 << 24)
    during = ticks[0] - before
    running.clear()
    t.join()
    assert out.numpy()[0] == 1 << 24
    assert during > 1000, f"the counting thread ran {during} times during the launches"


@pytest.mark.parametrize("backend", ["CPU", "OPENCL"])
def test_threads_launch_while_another_resets_the_device(backend):
    dev = require(backend)
    stop, errors, lost, done = threading.Event(), [], [], []

    def launcher():
        # Rounds race the resets; the last round starts after the resets ended and must pass.
        last = False
        while not last:
            last = stop.is_set()
            try:
                k = dev.compile(INC, name="inc")
                a = dev.from_numpy(np.ones(512, np.float32))
                out = dev.empty("f32", 512)
                for _ in range(50):
                    k(a, out, n=512)
                assert (out.numpy() == 2).all()
                done.append(1)
            except kiln.DeviceLostError as e:
                lost.append((last, e))
            except Exception as e:  # anything else is a failure
                errors.append(e)

    def resetter():
        for _ in range(20):
            dev.reset()
        stop.set()

    threads = [threading.Thread(target=launcher) for _ in range(3)] + [threading.Thread(target=resetter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == [], errors[:3]
    assert len(done) >= 3, [str(e) for last, e in lost if last]
    k = dev.compile(INC, name="inc")
    out = dev.empty("f32", 4)
    k(dev.from_numpy(np.zeros(4, np.float32)), out, n=4)
    assert out.numpy().tolist() == [1, 1, 1, 1]
