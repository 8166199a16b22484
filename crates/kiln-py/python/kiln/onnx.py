"""Compiles an ONNX model into a kiln plan file, through tinygrad on kiln (tinygrad 0.14.0).

    python -m kiln.onnx MODEL.onnx -o MODEL.kplan [--input NAME=1x3x224x224 ...] [--device KILN]

tinygrad's `OnnxRunner` (`tinygrad.nn.onnx`, with kiln's fixes to it) runs the model inside a
`TinyJit` on the KILN device `--device` (a tinygrad `DEV`: `KILN` is kiln's CPU, `KILN:OPENCL` its
OpenCL device), on random inputs of the graph's input shapes (numpy, `--seed`); the captured JIT
is saved as a plan (`kiln.tinygrad.save_jit`) whose inputs and outputs carry the ONNX graph's
own names, so `kiln run-plan MODEL.kplan --in NAME=x.npy` and `kiln.load_plan("MODEL.kplan")` take
and return them by those names, in any process, without tinygrad or the ONNX file.

Before the file is written, the saved plan is loaded on the same device and run on the inputs of
a last JIT call; its outputs must equal that call's bit for bit, or nothing is written and the
command exits 1. The JIT's first call and its capture run on other inputs (the checked ones
reversed along their last axis), so a plan that ignored its inputs would fail the check.

An open dimension of an input (a name, `?` or -1 in the graph) is 1 where it is the first (the
batch), and must be given with `--input NAME=SHAPE` elsewhere; `--input` may fix any input's
shape. Integer inputs are drawn from `--int-range` (0 to 255 by default), floats from a standard
normal, booleans evenly. A summary (file size, kernels, constants, and how long each step took)
goes to stdout, `--json` writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import kiln


class ModelError(Exception):
    """A model or option this command cannot compile, with what to do instead."""


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`NAME=1x3x224x224` as (name, shape); the name may hold `=` (split at the last one)."""
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
    except ValueError:
        shape = (-1,)
    if not sep or not name or not shape or min(shape) < 0:
        raise argparse.ArgumentTypeError(f"expected NAME=SHAPE with the dimensions separated by x (x=1x3x224x224), got {text!r}")
    return name, shape


def parse_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(",")
    try:
        if sep and int(low) <= int(high):
            return int(low), int(high)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected LOW,HIGH with LOW <= HIGH (0,255), got {text!r}")


def input_shapes(graph_inputs: dict[str, Any], given: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shape each input is compiled for: `given`, else the graph's, its open first
    dimension 1."""
    unknown = sorted(set(given) - set(graph_inputs))
    if unknown:
        raise ModelError(f"--input names {', '.join(unknown)}, which the model does not take; its inputs: "
                         + ", ".join(f"{n} {list(s.shape)}" for n, s in graph_inputs.items()))
    shapes = {}
    for name, spec in graph_inputs.items():
        if spec.is_sequence:
            raise ModelError(f"input {name} is a sequence of tensors; a plan takes tensors")
        graph_shape = tuple(spec.shape)
        if name in given:
            shape = given[name]
            if len(shape) != len(graph_shape):
                raise ModelError(f"--input {name} has {len(shape)} dimensions, the model's input has {len(graph_shape)} {list(graph_shape)}")
            for axis, (want, got) in enumerate(zip(graph_shape, shape)):
                if isinstance(want, int) and want > 0 and want != got:
                    raise ModelError(f"--input {name}: dimension {axis} is {got}, the model fixes it at {want}")
        else:
            shape = tuple(d if isinstance(d, int) and d > 0 else (1 if axis == 0 else -1) for axis, d in enumerate(graph_shape))
            if -1 in shape:
                raise ModelError(f"input {name} has open dimensions {list(graph_shape)}: give its shape with --input "
                                 f"{name}={'x'.join(str(d if d > 0 else 1) for d in shape)} (for example)")
        shapes[name] = shape
    return shapes


def random_inputs(graph_inputs: dict[str, Any], shapes: dict[str, tuple[int, ...]], seed: int,
                  int_range: tuple[int, int]) -> dict[str, Any]:
    import numpy as np
    from tinygrad.dtype import _to_np_dtype

    rng = np.random.default_rng(seed)
    arrays: dict[str, Any] = {}
    for name, shape in shapes.items():
        dtype = _to_np_dtype(graph_inputs[name].dtype)
        if dtype is None:
            raise ModelError(f"input {name} has dtype {graph_inputs[name].dtype}, which numpy lacks")
        if np.issubdtype(dtype, np.bool_):
            arrays[name] = rng.integers(0, 1, shape, endpoint=True).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            arrays[name] = rng.integers(int_range[0], int_range[1], shape, endpoint=True).astype(dtype)
        else:
            arrays[name] = rng.standard_normal(shape).astype(dtype)
    return arrays


def compile_model(model: Path, output: Path, *, shapes: Optional[dict[str, tuple[int, ...]]] = None, device: str = "KILN",
                  seed: int = 0, int_range: tuple[int, int] = (0, 255)) -> dict[str, Any]:
    """Compiles `model` on tinygrad device `device` into the plan file `output` (see the module
    docs); returns the report. Raises `ModelError` for a model it cannot compile and
    `kiln.Error` from kiln (the plan's outputs not those of the JIT: `kiln.Error`)."""
    import numpy as np
    from tinygrad import Device, Tensor, TinyJit
    from tinygrad.helpers import Context
    from tinygrad.nn.onnx import OnnxRunner

    import kiln.tinygrad

    kiln.tinygrad.install()
    if device.split(":")[0] != "KILN":
        raise ModelError(f"--device {device} is not a KILN device (KILN, KILN:OPENCL, ...): a plan runs on kiln")
    report: dict[str, Any] = {"model": str(model), "plan": str(output), "device": device}
    with Context(DEV=device):
        dev = Device[device]
        start = time.perf_counter()
        runner = OnnxRunner(model)
        report["onnx_load_s"] = time.perf_counter() - start
        shapes = input_shapes(runner.graph_inputs, shapes or {})
        inputs = random_inputs(runner.graph_inputs, shapes, seed, int_range)
        report["inputs"] = {n: {"shape": list(a.shape), "dtype": str(a.dtype)} for n, a in inputs.items()}

        @TinyJit(prune=True)
        def forward(**feed: Tensor) -> dict[str, Tensor]:
            outs = runner(feed)
            for name, out in outs.items():
                if not isinstance(out, Tensor):
                    raise ModelError(f"output {name} is a {type(out).__name__}; a plan's outputs are tensors")
            Tensor.realize(*outs.values())  # in one schedule: one by one, each would compute the graph again
            return outs

        def call(arrays: dict[str, Any]) -> dict[str, Any]:
            outs = forward(**{n: Tensor(a).realize() for n, a in arrays.items()})
            dev.synchronize()
            return outs

        other = {n: np.ascontiguousarray(a[..., ::-1]) for n, a in inputs.items()}
        start = time.perf_counter()
        call(other)  # the first call: tinygrad schedules and compiles every kernel
        report["first_call_s"] = time.perf_counter() - start
        start = time.perf_counter()
        call(other)  # the second: the JIT captures
        report["capture_s"] = time.perf_counter() - start
        want = {n: t.numpy() for n, t in call(inputs).items()}

        partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
        start = time.perf_counter()
        try:
            size = kiln.tinygrad.save_jit(forward, partial)
            report["save_s"] = time.perf_counter() - start
            kiln_device: kiln.Device = dev.kiln  # type: ignore[attr-defined]
            start = time.perf_counter()
            plan = kiln.load_plan(partial, kiln_device)
            report["plan_load_s"] = time.perf_counter() - start
            start = time.perf_counter()
            got = plan(inputs)
            report["plan_first_call_s"] = time.perf_counter() - start
            mismatched = [n for n in want if n not in got or got[n].shape != want[n].shape or got[n].tobytes() != want[n].tobytes()]
            if mismatched or set(got) != set(want):
                raise kiln.Error(f"the saved plan's outputs {mismatched or sorted(set(got) ^ set(want))} differ from tinygrad's "
                                 f"on {device}; no plan was written")
            partial.replace(output)
        finally:
            partial.unlink(missing_ok=True)
    report.update(file_bytes=size, kernels=plan.stats["kernels"], nodes=plan.stats["nodes"],
                  constant_bytes=plan.stats["constant_bytes"], kiln_device=plan.device,
                  plan_inputs=[(t.name, t.dtype, t.shape) for t in plan.inputs],
                  plan_outputs=[(t.name, t.dtype, t.shape) for t in plan.outputs])
    return report


def size_text(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"


def summary(r: dict[str, Any]) -> str:
    def spec(entries: list[Any]) -> str:
        return ", ".join(f"{name} {dtype} [{', '.join(map(str, shape))}]" for name, dtype, shape in entries)

    ms = {k: 1e3 * r[k] for k in ("onnx_load_s", "first_call_s", "capture_s", "save_s", "plan_load_s", "plan_first_call_s")}
    return "\n".join([
        f"wrote {r['plan']}: {size_text(r['file_bytes'])} ({r['kernels']} kernels, {r['nodes']} nodes, "
        f"{size_text(r['constant_bytes'])} of constants), for {r['kiln_device']}",
        f"inputs:  {spec(r['plan_inputs'])}",
        f"outputs: {spec(r['plan_outputs'])}",
        "checked: the plan's outputs equal tinygrad's on the same device, bit for bit",
        f"times (ms): onnx load {ms['onnx_load_s']:.1f}, first call (compiles) {ms['first_call_s']:.1f}, "
        f"capture {ms['capture_s']:.1f}, save {ms['save_s']:.1f}, plan load {ms['plan_load_s']:.1f}, "
        f"plan first call {ms['plan_first_call_s']:.1f}",
    ])


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kiln.onnx", description=__doc__.splitlines()[0],
                                 epilog="See docs/saved-plans.md (Python).")
    ap.add_argument("model", type=Path, help="the .onnx file")
    ap.add_argument("-o", "--output", type=Path, help="the plan file to write (default: MODEL with .kplan)")
    ap.add_argument("--input", dest="inputs", action="append", default=[], type=parse_shape, metavar="NAME=SHAPE",
                    help="an input's shape, dimensions separated by x (1x3x224x224); repeatable")
    ap.add_argument("--device", default="KILN", help="the tinygrad device to compile on: KILN (kiln's CPU), KILN:OPENCL, ...")
    ap.add_argument("--seed", type=int, default=0, help="of the random inputs the check runs on")
    ap.add_argument("--int-range", type=parse_range, default=(0, 255), metavar="LOW,HIGH",
                    help="integer inputs are drawn from LOW..HIGH (inclusive)")
    ap.add_argument("--json", type=Path, help="write the report here as JSON")
    args = ap.parse_args(argv)
    if not args.model.is_file():
        ap.error(f"no model file at {args.model}")
    output = args.output or args.model.with_suffix(".kplan")
    names = [n for n, _ in args.inputs]
    if len(set(names)) != len(names):
        ap.error("an input's --input is given twice")
    try:
        report = compile_model(args.model, output, shapes=dict(args.inputs), device=args.device, seed=args.seed,
                               int_range=args.int_range)
    except (ModelError, kiln.Error) as e:
        print(f"python -m kiln.onnx: {e}", file=sys.stderr)
        return 1
    print(summary(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
