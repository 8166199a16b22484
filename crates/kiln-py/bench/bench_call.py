"""kiln from Python: the cost of a launch and of a plan replay, on the CPU device.

    python crates/kiln-py/bench/bench_call.py [--reps N]

py_call_tiny: the median wall time of ``add(a, b, c, n=1)`` followed by
``dev.synchronize()`` (a whole call, completion included), result verified. Goal: <= 5 us.
py_plan_replay_per_kernel: a plan of 1000 dependent increments of one element, replayed
from Python, per kernel; verified by the count the increments leave (as ``kiln bench``'s
``plan_replay_per_kernel`` in Rust).
"""

import argparse
import pathlib
import statistics
import time

import numpy as np

import kiln

ADD = pathlib.Path(__file__).resolve().parents[3] / "examples" / "kernels" / "add.kiln"

INCREMENT = """\
%one = CONST i32 1
%z   = CONST i32 0
%x   = PARAM ptr<f32> 0 (%one)
%p   = INDEX ptr<f32> (%x, %z)
%v   = LOAD f32 (%p)
%c   = CONST f32 1.0
%s   = ADD f32 (%v, %c)
%st  = STORE void (%p, %s)
SINK void (%st)
"""

GOAL_US = 5.0


def batches(fn, count, batch):
    """Median, min and max of ``count`` batches of ``batch`` calls, in microseconds per call."""
    for _ in range(batch):
        fn()  # warm up
    per_call = []
    for _ in range(count):
        t = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        per_call.append((time.perf_counter_ns() - t) / batch / 1e3)
    return statistics.median(per_call), min(per_call), max(per_call)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200, help="batches per figure (default 200)")
    args = parser.parse_args()
    dev = kiln.Device("CPU")

    add = dev.compile(ADD)
    a = dev.from_numpy(np.array([1.5], np.float32))
    b = dev.from_numpy(np.array([2.25], np.float32))
    c = dev.from_numpy(np.zeros(1, np.float32))

    def tiny():
        add(a, b, c, n=1)
        dev.synchronize()

    med, lo, hi = batches(tiny, args.reps, 100)
    if c.numpy()[0] != 3.75:
        raise SystemExit(f"py_call_tiny: wrong result {c.numpy()[0]}, expected 3.75")
    verdict = "meets" if med <= GOAL_US else "misses"
    print(f"py_call_tiny               median {med:7.3f} us  (min {lo:.3f}, max {hi:.3f})  verified; {verdict} the goal <= {GOAL_US} us")

    kernels = 1000
    inc = dev.compile(INCREMENT, name="increment")
    x = dev.from_numpy(np.zeros(1, np.float32))
    plan = kiln.Plan(dev)
    for _ in range(kernels):
        plan.launch(inc, [x])
    reps = max(args.reps // 10, 5)
    med, lo, hi = batches(plan.run, reps, 1)
    runs = 1 + reps  # the warm-up run, then the timed runs
    want = float(kernels * runs)
    if x.numpy()[0] != want:
        raise SystemExit(f"py_plan_replay_per_kernel: {x.numpy()[0]} increments, expected {want}")
    k = kernels
    print(f"py_plan_replay_per_kernel  median {med / k:7.3f} us  (min {lo / k:.3f}, max {hi / k:.3f})  verified ({kernels} kernels per replay)")


if __name__ == "__main__":
    main()
