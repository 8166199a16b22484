"""Eager tinygrad (each op realized at once, no TinyJit, as in a notebook): kiln's runtime
(`DEV=KILN`) against tinygrad's own CPU runtime (`DEV=CPU`), one run.

    python crates/kiln-py/bench/tinygrad_eager.py [--iters 9] [--devices KILN,CPU]

Each device runs in its own process (tinygrad's `DEV` is process-wide) on the same numpy inputs.
Every op is checked against numpy first, warmed up (tinygrad compiles and caches it), then timed
as a whole call: building the lazy tensor, scheduling, lowering, launching, and waiting for the
device. The small ops measure the per-call overhead, the large ones the kernels too. Prints the
median milliseconds per call on each device and KILN's time over CPU's; fails if an op's result
is wrong on any device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np
from tinygrad_common import run_children

# name: (numpy inputs' shapes, tinygrad op, numpy op)
OPS: dict[str, tuple[list[tuple[int, ...]], Callable[..., Any], Callable[..., Any]]] = {
    "add_16": ([(16,), (16,)], lambda a, b: a + b, lambda a, b: a + b),
    "add_1m": ([(1 << 20,), (1 << 20,)], lambda a, b: a + b, lambda a, b: a + b),
    "sum_1m": ([(1 << 20,)], lambda a: a.sum(), lambda a: a.sum(dtype=np.float64)),
    "softmax_256x1024": ([(256, 1024)], lambda a: a.softmax(-1), lambda a: softmax(a)),
    "matmul_64": ([(64, 64), (64, 64)], lambda a, b: a @ b, lambda a, b: a.astype(np.float64) @ b),
    "matmul_1024": ([(1024, 1024), (1024, 1024)], lambda a, b: a @ b, lambda a, b: a.astype(np.float64) @ b),
    "conv3x3_16x32x32": ([(1, 16, 32, 32), (16, 16, 3, 3)], lambda x, w: x.conv2d(w, padding=1), lambda x, w: conv3x3(x, w)),
}


def softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp((a - a.max(-1, keepdims=True)).astype(np.float64))
    return e / e.sum(-1, keepdims=True)


def conv3x3(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    n, c, h, wd = x.shape
    p = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([p[:, :, i : i + h, j : j + wd] for i in range(3) for j in range(3)], axis=2)  # n c 9 h w
    return np.einsum("ncphw,ocp->nohw", cols, w.reshape(w.shape[0], c, 9))


def run_device(args: argparse.Namespace) -> dict:
    from tinygrad import Device, Tensor

    dev = Device[Device.DEFAULT]
    rng = np.random.default_rng(0)
    times: dict[str, float] = {}
    for name, (shapes, op, ref) in OPS.items():
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        tensors = [Tensor(a).realize() for a in arrays]
        got = op(*tensors).numpy()
        np.testing.assert_allclose(got, ref(*arrays), rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(ref(*arrays)).max())))
        for _ in range(2):
            op(*tensors).realize()
        dev.synchronize()
        samples = []
        for _ in range(args.iters):
            st = time.perf_counter()
            op(*tensors).realize()
            dev.synchronize()
            samples.append(time.perf_counter() - st)
        times[name] = statistics.median(samples) * 1e3
    return {"device": Device.DEFAULT, "ms": times}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--devices", default="KILN,CPU")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_device(args)))
        return 0
    results, failed = run_children(__file__, args.devices)
    if results:
        print(f"{'op (median ms/call)':<20}" + "".join(f"{r['device']:>12}" for r in results)
              + (f"{'ratio':>10}" if len(results) == 2 else ""))
        for name in OPS:
            cells = [r["ms"][name] for r in results]
            ratio = f"{cells[0] / cells[1]:10.2f}" if len(cells) == 2 else ""
            print(f"{name:<20}" + "".join(f"{c:12.3f}" for c in cells) + ratio)
        if len(results) == 2:
            print(f"ratio: {results[0]['device']}'s time over {results[1]['device']}'s (below 1: {results[0]['device']} is faster)")
    return 0 if results and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
