"""One forward pass of a ResNet-style CNN: tinygrad's compiler on kiln's runtime (`DEV=KILN`)
against the same compiler on tinygrad's own CPU runtime (`DEV=CPU`), one run.

    python crates/kiln-py/bench/tinygrad_cnn.py [--batches 1,32] [--size 32] [--widths 16,32,64]

The model: a 3x3 conv stem, then one stage per width of `--blocks` residual blocks (conv-bn-relu,
conv-bn, plus the shortcut, relu; each stage after the first starts with a stride-2 block whose
shortcut is a strided 1x1 conv-bn), a global average pool and a linear head. Batch norm runs in
inference mode on its running statistics.

Each device runs in its own process (tinygrad's `DEV` is process-wide) on the same random weights
and images (numpy, fixed seed). Per batch size, a `TinyJit` forward pass is warmed up (its first
calls run and capture it), then `--iters` replays are timed. Prints the median ms per forward
pass, images/s and kernels per forward pass for each device, then KILN against CPU, but only
once every device computed the same logits as the first (to `--rtol`/`--atol`: the devices' C
compilers may contract or reorder float arithmetic differently); fails otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

from tinygrad_common import kernels_per_call, run_children


def build_model(widths: list[int], blocks: int, classes: int):
    """The network as a callable of a (batch, 3, size, size) tensor; its parameters are tinygrad's
    `nn` layers, reachable through `nn.state.get_state_dict`."""
    from tinygrad import Tensor, nn

    class ConvBN:
        def __init__(self, cin: int, cout: int, kernel: int, stride: int):
            self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)
            self.bn = nn.BatchNorm(cout)

        def __call__(self, x: Tensor) -> Tensor:
            return self.bn(self.conv(x))

    class Block:
        def __init__(self, cin: int, cout: int, stride: int):
            self.a, self.b = ConvBN(cin, cout, 3, stride), ConvBN(cout, cout, 3, 1)
            self.shortcut = ConvBN(cin, cout, 1, stride) if stride != 1 or cin != cout else None

        def __call__(self, x: Tensor) -> Tensor:
            skip = x if self.shortcut is None else self.shortcut(x)
            return (self.b(self.a(x).relu()) + skip).relu()

    class ResNet:
        def __init__(self) -> None:
            self.stem = ConvBN(3, widths[0], 3, 1)
            self.blocks, cin = [], widths[0]
            for stage, width in enumerate(widths):
                for i in range(blocks):
                    self.blocks.append(Block(cin, width, 2 if stage > 0 and i == 0 else 1))
                    cin = width
            self.head = nn.Linear(cin, classes)

        def __call__(self, x: Tensor) -> Tensor:
            x = self.stem(x).relu()
            for block in self.blocks:
                x = block(x)
            return self.head(x.mean(axis=(2, 3)))

    return ResNet()


def load_weights(model: object, seed: int) -> None:
    """Sets every float parameter and running statistic from a seeded numpy generator: conv and
    linear weights scaled by 1/sqrt(fan-in), batch-norm scales near 1, variances positive."""
    import numpy as np
    from tinygrad import dtypes, nn

    rng = np.random.default_rng(seed)
    for name, p in sorted(nn.state.get_state_dict(model).items()):
        if not dtypes.is_float(p.dtype):
            continue  # num_batches_tracked: unused in inference
        shape = p.shape
        if name.endswith("running_var"):
            value = rng.uniform(0.5, 1.5, shape)
        elif "bn." in name and name.endswith("weight"):
            value = rng.uniform(0.5, 1.5, shape)
        elif len(shape) > 1:
            value = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        else:
            value = rng.standard_normal(shape) * 0.1
        p.replace(p.__class__(value.astype(np.float32), device=p.device)).realize()


def compiler_used() -> str:
    """The C compiler behind this process's device, as that device reports it."""
    from tinygrad import Device

    dev = Device[Device.DEFAULT]
    backend = getattr(dev, "kiln", None)
    if backend is not None:  # kiln's device description names its compiler on kiln's CPU
        return backend.description
    compiler = dev.renderer.compiler
    if type(compiler).__name__ == "ClangCompiler":  # tinygrad runs `$CC`, else `clang`, from PATH
        cc = os.environ.get("CC", "clang")
        path = shutil.which(cc)
        return f"{os.path.realpath(path) if path else cc} ({type(compiler).__name__}, {cc} on PATH)"
    return type(compiler).__name__


def run_device(args: argparse.Namespace) -> dict:
    """Builds the model on this process's device; per batch size, warms a TinyJit forward pass
    up and times its replays."""
    import numpy as np
    from tinygrad import Device, GlobalCounters, Tensor, TinyJit

    widths = [int(w) for w in args.widths.split(",")]
    model = build_model(widths, args.blocks, args.classes)
    load_weights(model, seed=0)
    rng = np.random.default_rng(1)
    dev = Device[Device.DEFAULT]
    runs = []
    for batch in (int(b) for b in args.batches.split(",")):
        images = Tensor(rng.standard_normal((batch, 3, args.size, args.size)).astype(np.float32)).realize()
        forward = TinyJit(lambda x: model(x).realize())
        for _ in range(3):  # run, capture, first replay
            forward(images)
        dev.synchronize()
        times, kernels = [], []
        for _ in range(args.iters):
            k0, st = GlobalCounters.kernel_count, time.perf_counter()
            out = forward(images)
            dev.synchronize()
            times.append(time.perf_counter() - st)
            kernels.append(GlobalCounters.kernel_count - k0)
        ms = 1e3 * statistics.median(times)
        runs.append({"batch": batch, "ms": ms, "images_s": batch / ms * 1e3, "kernels": kernels_per_call(forward),
                     "calls": statistics.median(kernels),
                     "logits": out.numpy().tolist()})
    return {"device": os.environ.get("DEV", Device.DEFAULT), "renderer": type(dev.renderer).__name__, "compiler": compiler_used(), "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--size", type=int, default=32, help="image height and width")
    ap.add_argument("--widths", default="16,32,64", help="channels of each stage")
    ap.add_argument("--blocks", type=int, default=2, help="residual blocks per stage")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--iters", type=int, default=20, help="timed forward passes per batch size")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--devices", default="KILN,CPU")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_device(args)))
        return 0
    import numpy as np

    results, failed = run_children(__file__, args.devices)
    same = True
    for r in results[1:]:
        for mine, theirs in zip(r["runs"], results[0]["runs"]):
            try:
                np.testing.assert_allclose(mine["logits"], theirs["logits"], rtol=args.rtol, atol=args.atol)
            except AssertionError as e:
                print(f"batch {mine['batch']}: {r['device']} and {results[0]['device']} DIFFER:{e}", file=sys.stderr)
                same = False
    if not same:
        return 1
    if len(results) > 1:
        print(f"logits equal on every device (rtol {args.rtol}, atol {args.atol})")
    for r in results:
        print(f"{r['device']:<12} {r['renderer']:<18} compiler: {r['compiler']}")
        for run in r["runs"]:
            print(f"  batch {run['batch']:>3}  {run['ms']:9.2f} ms/forward  {run['images_s']:9.1f} images/s"
                  f"  {run['kernels']:4d} kernels/forward in {run['calls']:3.0f} calls")
    for r in results[1:]:
        for mine, theirs in zip(results[0]["runs"], r["runs"]):
            print(f"batch {mine['batch']:>3}: {results[0]['device']} runs {theirs['ms'] / mine['ms']:.2f}x as fast as {r['device']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
