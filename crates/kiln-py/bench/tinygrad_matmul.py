"""A square matrix product through tinygrad: tinygrad's compiler on kiln's runtime (`DEV=KILN`)
against the same compiler on another tinygrad device (default `DEV=CPU`), one run.

    python crates/kiln-py/bench/tinygrad_matmul.py [--n 1024] [--dtype float32] [--devices KILN,CPU]

Each device runs in its own process (tinygrad's `DEV` is process-wide) on the same random
matrices (numpy, fixed seed). A `TinyJit` product is warmed up, then `--iters` calls are timed,
each ending with the device's synchronize. Before any speed is printed, every device's product
is checked against numpy (float64 on `--check-rows` sampled rows, to a tolerance scaled to the
dtype and `n`); a device whose result is wrong fails the run. Set `TC=1` (tinygrad's variable)
to let tinygrad use the device's tensor cores where its renderer has them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from tinygrad_common import run_children

# Relative tolerance per element of the sampled rows, times sqrt(n) (rounding of a sum of n terms).
EPS = {"float32": 1e-6, "half": 1e-3, "bfloat16": 8e-3}


def run_device(args: argparse.Namespace) -> dict:
    import numpy as np
    from tinygrad import Device, Tensor, TinyJit, dtypes

    n, dt = args.n, getattr(dtypes, args.dtype)
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((n, n)).astype(np.float32)
    b_np = rng.standard_normal((n, n)).astype(np.float32)
    a, b = Tensor(a_np).cast(dt).realize(), Tensor(b_np).cast(dt).realize()
    # The operands as the device holds them (rounded to dt), for the reference.
    a_ref, b_ref = a.float().numpy().astype(np.float64), b.float().numpy().astype(np.float64)
    product = TinyJit(lambda x, y: (x @ y).realize())
    dev = Device[Device.DEFAULT]
    for _ in range(3):
        out = product(a, b)
    dev.synchronize()
    times = []
    for _ in range(args.iters):
        st = time.perf_counter()
        out = product(a, b)
        dev.synchronize()
        times.append(time.perf_counter() - st)
    got = out.float().numpy()
    rows = rng.choice(n, size=min(args.check_rows, n), replace=False)
    want = a_ref[rows] @ b_ref
    scale = np.abs(a_ref[rows]) @ np.abs(b_ref)
    err = float(np.max(np.abs(got[rows] - want) / (scale + 1e-30)))
    sec = statistics.median(times)
    return {"device": os.environ.get("DEV", Device.DEFAULT), "renderer": type(dev.renderer).__name__,
            "ms": sec * 1e3, "gflops": 2 * n**3 / sec / 1e9, "max_rel_err": err}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--dtype", default="float32", choices=sorted(EPS))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--check-rows", type=int, default=16)
    ap.add_argument("--devices", default="KILN,CPU")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_device(args)))
        return 0
    results, failed = run_children(__file__, args.devices)
    bound = EPS[args.dtype] * max(args.n, 1) ** 0.5
    wrong = [r["device"] for r in results if not r["max_rel_err"] <= bound]
    for r in results:
        print(f"{r['device']:>12} ({r['renderer']}): max error {r['max_rel_err']:.2e} (bound {bound:.1e})")
    if failed or wrong:
        print(f"failed: {failed}, wrong results: {wrong}", file=sys.stderr)
        return 1
    tc = os.environ.get("TC", "default")
    print(f"matmul {args.n}x{args.n}x{args.n} {args.dtype}, TC={tc}, median of {args.iters}:")
    for r in results:
        print(f"{r['device']:>12}: {r['ms']:9.3f} ms  {r['gflops']:10.1f} GFLOP/s")
    base = results[-1]
    for r in results[:-1]:
        print(f"{r['device']} / {base['device']}: {r['gflops'] / base['gflops']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
