"""A data-parallel training step through tinygrad on kiln's virtual CPU devices: the same MLP
step (SGD on a cross-entropy loss) with its batch split over `--devices` KILN devices against
the whole batch on one.

    python crates/kiln-py/bench/tinygrad_data_parallel.py [--devices 2] [--batch 512] [--reps 20]

Each configuration runs in its own process, since kiln reads `KILN_CPU_DEVICES` when it opens
its CPU devices:
- `1 device`: `KILN` alone, with every thread (`KILN_CPU_DEVICES` unset);
- `N devices`: `KILN:0` .. `KILN:N-1` with `KILN_CPU_DEVICES=N`, so each has its share of the
  threads and the devices together use the machine once;
- `N devices, all threads each` (`--oversubscribed`): the same with `KILN_CPU_DEVICES` unset.
The parameters are replicated on every device and each batch is sharded along its rows, so
tinygrad all-reduces the gradients (copies between the devices and kernels that add them).
The step is a `TinyJit`, replayed as one kiln plan spanning the devices.

Before any time is printed, every configuration trains `--steps` steps from the same initial
weights on the same batches, and its weights and losses must match the one-device run; a
mismatch fails the run. Then `--reps` further steps are timed, each ending with every device's
synchronize. The configurations take turns, `--rounds` times (a fresh process each time, so a
machine whose speed drifts affects them alike); the table shows the median step of all rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tinygrad_common import kernels_per_call

RTOL, ATOL = 1e-4, 1e-6  # a sum split over devices adds in another order


def train(args: argparse.Namespace, ndev: int, out: str) -> dict:
    import numpy as np
    from tinygrad import Device, Tensor, TinyJit, nn
    from tinygrad.engine.realize import graph_cache
    from tinygrad.helpers import Context
    from tinygrad.uop.ops import Ops

    devices = tuple(f"KILN:{i}" for i in range(ndev))

    class MLP:
        def __init__(self) -> None:
            self.l1, self.l2 = nn.Linear(args.din, args.hidden), nn.Linear(args.hidden, args.dout)

        def __call__(self, x: Tensor) -> Tensor:
            return self.l2(self.l1(x).relu())

    Tensor.manual_seed(0)
    model = MLP()
    params = nn.state.get_parameters(model)
    for p in params:  # replicated on every device
        p.to_(devices if ndev > 1 else devices[0]).realize()
    opt = nn.optim.SGD(params, lr=args.lr)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            # the loss and the new weights in one schedule (tinygrad's training idiom)
            return loss.realize(*opt.schedule_step())

    rng = np.random.default_rng(1)
    batches = []
    for _ in range(args.batches):
        x = Tensor(rng.standard_normal((args.batch, args.din)).astype(np.float32), device=devices[0])
        y = Tensor(rng.integers(0, args.dout, args.batch).astype(np.int32), device=devices[0])
        if ndev > 1:
            x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)
        batches.append((x.realize(), y.realize()))

    def sync() -> None:
        for d in devices:
            Device[d].synchronize()

    losses = [step(*batches[i % len(batches)]).item() for i in range(args.steps)]
    np.savez(out, *[p.numpy() for p in params], losses=np.array(losses))
    graphs = [c.src[0] for c in step.captured.linear.src if c.src[0].op is Ops.CUSTOM_FUNCTION and c.src[0].arg == "graph"]
    plan_nodes = [len(graph_cache[g].plan) for g in graphs]
    copies = sum(1 for g in graphs for c in graph_cache[g].calls if c[1].op is Ops.COPY)
    times = []
    for i in range(args.reps):
        x, y = batches[i % len(batches)]
        st = time.perf_counter()
        step(x, y)
        sync()
        times.append(time.perf_counter() - st)
    return {
        "devices": ndev,
        "kiln": [Device[d].kiln.name for d in devices],  # type: ignore[attr-defined]
        "calls_outside_plans": len(step.captured.linear.src) - len(graphs),
        "plans": len(graphs),
        "plan_nodes": plan_nodes,
        "copies": copies,
        "kernels": kernels_per_call(step),
        "times": times,
    }


def run(name: str, ndev: int, split: bool, out: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KILN_CPU_DEVICES"}
    env["DEV"] = "KILN"
    if split:
        env["KILN_CPU_DEVICES"] = str(ndev)
    cmd = [sys.executable, __file__, "--child", str(ndev), "--out", out, *sys.argv[1:]]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
    return {"name": name, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=2, help="devices of the data-parallel run")
    ap.add_argument("--batch", type=int, default=512, help="rows of one step's batch (all devices together)")
    ap.add_argument("--din", type=int, default=784)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--dout", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--batches", type=int, default=4, help="distinct batches, cycled")
    ap.add_argument("--steps", type=int, default=4, help="checked steps (the first two capture the JIT)")
    ap.add_argument("--reps", type=int, default=20, help="timed steps")
    ap.add_argument("--rounds", type=int, default=3, help="turns of every configuration, each a fresh process")
    ap.add_argument("--oversubscribed", action="store_true", help="also run the devices with every thread each")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(train(args, args.child, args.out)))
        return 0
    if args.batch % args.devices:
        sys.exit(f"--batch {args.batch} does not split over {args.devices} devices")

    import numpy as np

    n = args.devices
    configs = [("1 device", 1, False), (f"{n} devices", n, True)]
    if args.oversubscribed:
        configs.append((f"{n} devices, all threads each", n, False))
    results: list[dict] = [{} for _ in configs]
    with tempfile.TemporaryDirectory() as tmp:
        base, worst = None, 0.0
        for round_ in range(args.rounds):
            for i, (name, ndev, split) in enumerate(configs):
                out = os.path.join(tmp, f"{round_}-{i}.npz")
                r = run(name, ndev, split, out)
                weights = np.load(out)
                if base is None:
                    base = weights  # the first one-device run
                for key in base.files:  # raises, naming the array, on a mismatch
                    np.testing.assert_allclose(weights[key], base[key], rtol=RTOL, atol=ATOL, err_msg=f"{name}: {key}")
                    worst = max(worst, float(np.max(np.abs(weights[key] - base[key]))))
                times = results[i].get("times", []) + r["times"]
                results[i] = {**r, "times": times}
    for r in results:
        r["ms"], r["min_ms"] = statistics.median(r["times"]) * 1e3, min(r["times"]) * 1e3
    flops = 6 * args.batch * (args.din * args.hidden + args.hidden * args.dout)  # forward + backward
    threads = os.environ.get("KILN_CPU_THREADS") or str(os.cpu_count())
    print(f"MLP {args.din}-{args.hidden}-{args.dout}, batch {args.batch}, SGD; {threads} threads; "
          f"weights and losses of {args.steps} steps match 1 device (rtol {RTOL:g}, atol {ATOL:g}; "
          f"largest difference {worst:.1e})")
    print(f"median of {args.rounds} x {args.reps} steps, each to every device's synchronize:")
    print(f"{'configuration':<30} {'kiln devices':<22} {'plans':>5} {'nodes':>5} {'copies':>6} {'ms/step':>9} {'min':>8} "
          f"{'GFLOP/s':>8} {'speed-up':>8}")
    for r in results:
        print(f"{r['name']:<30} {','.join(r['kiln']):<22} {r['plans']:>5} {sum(r['plan_nodes']):>5} {r['copies']:>6} "
              f"{r['ms']:>9.2f} {r['min_ms']:>8.2f} {flops / r['ms'] / 1e6:>8.1f} {results[0]['ms'] / r['ms']:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
