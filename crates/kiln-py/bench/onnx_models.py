"""Real ONNX models through tinygrad's `OnnxRunner` on kiln's runtime (`DEV=KILN`) and on tinygrad's
own CPU runtime (`DEV=CPU`), against onnxruntime's CPU execution provider, one run.

    pip install --no-deps -r crates/kiln-py/bench/requirements-models.txt   # the OCR and magika models
    python crates/kiln-py/bench/onnx_models.py [--models resnet50,magika] [--devices KILN,CPU]
                                               [--iters 10] [--rounds 3] [--round-s 0.5] [--plan-runs 3]
                                               [--json results.json]

The models, batch 1, nothing downloaded:
- PP-OCRv4 text recognition (`ppocrv4_rec`, input 1x3x48x320), detection (`ppocrv4_det`, 1x3x640x640)
  and the mobile v2.0 direction classifier (`ppocr_cls`, 1x3x48x192), from rapidocr-onnxruntime's
  wheel. tinygrad 0.14 alone does not load the detection model: its Constant nodes hold empty
  tensors (dims [0] and no data field, which ONNX allows), and `OnnxPBParser._parse_TensorProto`
  asserts exactly one data field ("only 1 data field is allowed"); with kiln's wheel installed,
  `kiln.tinygrad.onnx_tensors` reads them as empty tensors (for every tinygrad device). Nor does it
  take the classifier's input `[-1, 3, ?, ?]` ("has mismatch on dim=0. Expected -1");
  `kiln.tinygrad.onnx_inputs` reads -1 and "?" as open dimensions. A runtime that fails a model
  with its known error is reported as skipped with it; onnxruntime's times are still measured.
- magika's file-type model (`magika`), from magika's wheel: int32 byte features (values 0-255, 256
  the padding token), shaped as the graph's input says.
- The model-zoo graphs the onnx wheel ships in `onnx/backend/test/data/light/` (ResNet-50,
  DenseNet-121, ShuffleNet, Inception v1 and v2, SqueezeNet, VGG-19, AlexNet, ZFNet-512). Their
  large weights are `ConstantOfShape` nodes (all one value); each is replaced by a random
  initializer of the same shape and dtype (numpy, fixed seed; conv and dense weights He-scaled,
  normal * sqrt(2 / fan-in), batch-norm scales and variances in [0.5, 1.5], biases and means
  normal * 0.1), the IR version raised to 4 so initializers need not be graph inputs, the input
  of a final Softmax added as an output (random weights can saturate the softmax to exact zeros
  and ones), and the modified model saved to a temporary folder. All runtimes run that file.

For each model, every runtime runs in its own process with `--timeout` (tinygrad's `DEV` is
process-wide), on the same inputs (numpy, fixed seed), and the processes take turns: onnxruntime
(the reference) starts first, then each tinygrad device, each while the ones before it wait idle
on a pipe. The first call is timed on its own: onnxruntime's first run, and for tinygrad the
kernels' compilation, with empty kernel caches (each process gets its own `KILN_CACHE_DIR` and
tinygrad `CACHEDB`; `--warm-caches` keeps the user's). tinygrad runs the model inside a `TinyJit`
(`prune=True`, as tinygrad's ONNX examples): after the first call, its capture and first replay
are warm-up calls (onnxruntime gets two as well), all three on other inputs (the checked ones
reversed along their last axis), so that a replay that ignored its inputs would fail the check.
Then come `--rounds` rounds: in each, every runtime in turn makes `--iters` timed calls on the
checked inputs, and more until they took `--round-s` seconds, each ending with the device's
synchronize, while the others wait. The median of all of a runtime's timed calls is reported: a
slow spell of a shared machine (this kind of host has slowed one runtime's separate run by 2x)
then falls on every runtime alike, and a brief one on few calls.

Before any time is printed, each tinygrad runtime's outputs are checked against onnxruntime's
(`np.testing.assert_allclose`: the model's rtol of each element plus its atol of the output's
largest magnitude, room for float32 summed in another order through deep networks). A runtime
whose outputs differ, or whose process fails or times out, fails that model: it gets no time, its
error is printed, and the run exits 1.

Saved plans (issue 45): each KILN device's process saves its captured JIT (`kiln.tinygrad.save_jit`,
timed, with the file's size). The plan is then loaded and run once (`kiln.load_plan`, then the first
call) in fresh processes, kiln imported before the clock starts: one with an empty kernel cache
(`KILN_CACHE_DIR` a new folder), then `--plan-runs` with the cache that one left; beside them,
onnxruntime's `InferenceSession` and first run in as many fresh processes, onnxruntime imported
first. Every loaded plan's outputs must equal the tinygrad run's on the same device bit for bit,
and match onnxruntime's as above, and its process must not have imported tinygrad, before any of
its times is kept; otherwise the model fails.

Prints a table (median ms per call of each runtime, onnxruntime's speed against each tinygrad
runtime as ort_ms / device_ms, first-call ms), the geometric mean of those ratios over the
models every runtime passed, the CPU model and each device's C compiler, and the saved plans'
table; `--json PATH` writes all of it, with every timed call and start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from tinygrad_cnn import compiler_used
from tinygrad_common import kernels_per_call

if TYPE_CHECKING:
    import onnx

ORT = "onnxruntime"
ORT_START = "onnxruntime-start"  # a process that only creates the session and runs once
PLAN = "plan"  # a process that only loads a saved plan and runs it once
READY = "ready"  # a runtime's process, to `run_children`: its calls so far are done; it waits for its turn
PAUSE_S = 0.05  # between one runtime's timed calls and the next's
WARMUP = 2  # untimed calls after the first: tinygrad's JIT capture and its first replay
SEED = 0
Feed = TypeVar("Feed")


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    source: str  # the package or folder it comes from
    locate: Callable[[], Path | None]  # the .onnx file; None when it is not installed
    shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # open input dimensions
    # The check against onnxruntime: rtol of each element plus atol of the output's largest
    # magnitude (float32 summed in another order; the worst seen is 1.2e-5 of the largest).
    rtol: float = 1e-3
    atol: float = 1e-4
    # plus this much absolute: onnxruntime's own error where it is absolute, not relative
    atol_abs: float = 0.0
    random_weights: bool = False  # replace ConstantOfShape weights (see `random_weight_model`)
    int_range: tuple[int, int] = (0, 0)  # integer inputs: uniform in [low, high]
    known_failure: str | None = None  # tinygrad 0.14's error for this model: the model is skipped


def package_file(package: str, relative: str) -> Path | None:
    """A file inside an installed package, found without importing the package (magika and
    rapidocr import their own dependencies, which their --no-deps install leaves out)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.exists() else None


def light_model(stem: str) -> Callable[[], Path | None]:
    def locate() -> Path | None:
        import onnx

        path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{stem}.onnx"
        return path if path.exists() else None

    return locate


def models() -> list[Model]:
    rapidocr = "rapidocr-onnxruntime"

    def ocr(file: str) -> Callable[[], Path | None]:
        return lambda: package_file("rapidocr_onnxruntime", f"models/{file}")

    found = [
        Model("ppocrv4_rec", rapidocr, ocr("ch_PP-OCRv4_rec_infer.onnx"), {"x": (1, 3, 48, 320)}),
        # its output is a Sigmoid, which onnxruntime rounds to 2^-24 absolute near 0 (values of
        # 1e-8 come out as 0 or 5.96e-8); on random images every output is near 0
        Model("ppocrv4_det", rapidocr, ocr("ch_PP-OCRv4_det_infer.onnx"), {"x": (1, 3, 640, 640)},
              atol_abs=4 * 2.0**-24, known_failure="only 1 data field is allowed"),
        Model("ppocr_cls", rapidocr, ocr("ch_ppocr_mobile_v2.0_cls_infer.onnx"), {"x": (1, 3, 48, 192)},
              known_failure="has mismatch on dim=0. Expected -1"),
        Model("magika", "magika", lambda: package_file("magika", "models/standard_v3_3/model.onnx"),
              int_range=(0, 256)),
    ]
    for stem in ("resnet50", "densenet121", "shufflenet", "inception_v1", "inception_v2", "squeezenet", "vgg19",
                 "bvlc_alexnet", "zfnet512"):
        found.append(Model(stem.removeprefix("bvlc_"), "onnx", light_model(stem), random_weights=True))
    return found


def random_weight_model(path: Path, out: Path, seed: int) -> None:
    """Writes the light model `path` to `out` with random weights (`randomize_weights`) and, where
    the graph ends in a Softmax, that Softmax's input as one more output: random weights can
    saturate a softmax to exact zeros and ones, which would hide wrong logits from the check."""
    import onnx

    model = onnx.load(str(path))
    randomize_weights(model.graph, np.random.default_rng(seed))
    producers = {o: node for node in model.graph.node for o in node.output}
    for output in list(model.graph.output):
        node = producers.get(output.name)
        if node is not None and node.op_type == "Softmax":
            logits = model.graph.output.add()
            logits.CopyFrom(output)  # a softmax's input has its output's type and shape
            logits.name = node.input[0]
    # IR 3 listed every initializer as a graph input too; from IR 4 on, initializers that are not
    # inputs are constants (which onnxruntime may fold, as it would a real model's weights).
    model.ir_version = max(model.ir_version, 4)
    onnx.checker.check_model(model)
    onnx.save(model, str(out))


def randomize_weights(graph: onnx.GraphProto, rng: np.random.Generator) -> None:
    """Replaces each `ConstantOfShape` weight of `graph` (the weight's shape an initializer) by a
    random initializer of the same shape and dtype, drawn for the weight's use: the node that
    consumes it, found through Unsqueeze/Reshape/Squeeze/Identity. Leaves only the real inputs as
    graph inputs."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in graph.initializer}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, index))

    def use(name: str) -> tuple[str, int, onnx.NodeProto | None]:
        """(op, input index, node) of the first node that computes with `name`."""
        for node, index in consumers.get(name, []):
            if node.op_type in ("Unsqueeze", "Reshape", "Squeeze", "Identity") and index == 0:
                return use(node.output[0])
            return node.op_type, index, node
        return "", -1, None

    def weight(shape: tuple[int, ...], name: str) -> np.ndarray:
        op, index, node = use(name)
        if op == "Conv" and index == 1:  # He-scaled: activations keep their scale through ReLUs
            return rng.standard_normal(shape) * math.sqrt(2 / math.prod(shape[1:]))
        if op == "Gemm" and index == 1:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)  # type: ignore[union-attr]
            return rng.standard_normal(shape) * math.sqrt(2 / (shape[-1] if trans_b else shape[-2]))
        if (op == "BatchNormalization" and index in (1, 4)) or op == "Mul":  # scales, variances
            return rng.uniform(0.5, 1.5, shape)
        return rng.standard_normal(shape) * 0.1  # biases, means

    nodes, weights = [], []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            nodes.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        dtype = helper.tensor_dtype_to_np_dtype(value.data_type) if value is not None else np.float32
        weights.append(numpy_helper.from_array(weight(shape, node.output[0]).astype(dtype), node.output[0]))
    used = {name for node in nodes for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    real_inputs = [i for i in graph.input if i.name not in inits]
    del graph.node[:], graph.initializer[:], graph.input[:]
    graph.node.extend(nodes)
    graph.initializer.extend(kept + weights)
    graph.input.extend(real_inputs)


def make_inputs(path: Path, model: Model, seed: int) -> dict[str, np.ndarray]:
    """Random inputs of the graph's input shapes and dtypes: an open first dimension is the batch
    (1), other open dimensions come from `model.shapes`."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in graph.input:
        if spec.name in inits:
            continue
        tensor_type = spec.type.tensor_type
        shape = model.shapes.get(spec.name) or tuple(d.dim_value for d in tensor_type.shape.dim)
        shape = (shape[0] if shape[0] > 0 else 1, *shape[1:])
        if min(shape) <= 0:
            raise ValueError(f"{model.name}: input {spec.name} has open dimensions {shape}: give its shape in models()")
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if np.issubdtype(dtype, np.integer):
            inputs[spec.name] = rng.integers(model.int_range[0], model.int_range[1], shape, endpoint=True).astype(dtype)
        else:
            inputs[spec.name] = rng.standard_normal(shape).astype(dtype)
    return inputs


def run_onnxruntime(model_path: str, inputs: dict[str, np.ndarray], iters: int, rounds: int = 1,
                    turn: Callable[[], None] = lambda: None,
                    min_round_s: float = 0.0) -> tuple[dict, dict[str, np.ndarray]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.inter_op_num_threads = 1
    start = time.perf_counter()
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    load_s = time.perf_counter() - start
    names = [o.name for o in session.get_outputs()]

    def call(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run(names, feed)

    first_s, times, outs = timed_calls(call, warmup_inputs(inputs), inputs, iters, rounds=rounds, turn=turn,
                                       min_round_s=min_round_s)
    info = {"threads": options.intra_op_num_threads, "providers": session.get_providers(),
            "load_ms": 1e3 * load_s, "first_ms": 1e3 * first_s, "times_ms": [1e3 * t for t in times]}
    return info, dict(zip(names, outs))


def run_tinygrad(model_path: str, inputs: dict[str, np.ndarray], iters: int, plan_path: str | None = None,
                 rounds: int = 1, turn: Callable[[], None] = lambda: None,
                 min_round_s: float = 0.0) -> tuple[dict, dict[str, np.ndarray]]:
    from tinygrad import Device, Tensor, TinyJit
    from tinygrad.nn.onnx import OnnxRunner

    dev = Device[Device.DEFAULT]
    start = time.perf_counter()
    runner = OnnxRunner(model_path)
    load_s = time.perf_counter() - start

    @TinyJit(prune=True)
    def forward(**feed: Tensor) -> dict[str, Tensor]:
        outs = runner(feed)
        Tensor.realize(*outs.values())  # in one schedule: realized one by one, each would recompute the graph
        return outs

    def on_device(arrays: dict[str, np.ndarray]) -> dict[str, Tensor]:
        return {name: Tensor(value).realize() for name, value in arrays.items()}

    warmup, timed = on_device(warmup_inputs(inputs)), on_device(inputs)
    dev.synchronize()
    first_s, times, outs = timed_calls(lambda feed: forward(**feed), warmup, timed, iters, dev.synchronize, rounds, turn,
                                       min_round_s)
    info = {"device": os.environ.get("DEV", Device.DEFAULT), "renderer": type(dev.renderer).__name__,
            "compiler": compiler_used(), "kernels": kernels_per_call(forward),
            "load_ms": 1e3 * load_s, "first_ms": 1e3 * first_s, "times_ms": [1e3 * t for t in times]}
    kiln_device = getattr(dev, "kiln", None)
    if plan_path is not None and kiln_device is not None:  # the captured JIT as a saved plan (KILN devices)
        import kiln.tinygrad

        start = time.perf_counter()
        size = kiln.tinygrad.save_jit(forward, plan_path)
        info["plan"] = {"save_ms": 1e3 * (time.perf_counter() - start), "file_bytes": size,
                        "kiln_device": kiln_device.name}
    return info, {name: out.numpy() for name, out in outs.items()}


def run_plan(plan_path: str, device: str, inputs: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    """A saved plan in this fresh process: `kiln.load_plan`, then its first call (kiln imported
    before the clock starts, as onnxruntime is for its session). Imports no tinygrad."""
    import kiln

    start = time.perf_counter()
    plan = kiln.load_plan(plan_path, device)
    loaded = time.perf_counter()
    outs = plan(inputs)
    done = time.perf_counter()
    info = {"load_ms": 1e3 * (loaded - start), "first_ms": 1e3 * (done - loaded), "to_first_ms": 1e3 * (done - start),
            "stats": plan.stats, "tinygrad_imported": "tinygrad" in sys.modules}
    return info, outs


def run_onnxruntime_start(model_path: str, inputs: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    """onnxruntime in this fresh process: `InferenceSession`, then its first run (imported before
    the clock starts), as `run_onnxruntime` creates it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.inter_op_num_threads = 1
    start = time.perf_counter()
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    loaded = time.perf_counter()
    names = [o.name for o in session.get_outputs()]
    outs = session.run(names, inputs)
    done = time.perf_counter()
    info = {"load_ms": 1e3 * (loaded - start), "first_ms": 1e3 * (done - loaded), "to_first_ms": 1e3 * (done - start)}
    return info, dict(zip(names, outs))


def warmup_inputs(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Other inputs for the first and warm-up calls, as valid as `inputs` (reversed along the last
    axis): the timed calls, whose outputs are checked, then show that the JIT's replays compute
    from their inputs."""
    return {name: np.ascontiguousarray(value[..., ::-1]) for name, value in inputs.items()}


def timed_calls(call: Callable[[Feed], Any], warmup: Feed, timed: Feed, iters: int,
                synchronize: Callable[[], None] = lambda: None, rounds: int = 1,
                turn: Callable[[], None] = lambda: None, min_round_s: float = 0.0) -> tuple[float, list[float], Any]:
    """The seconds of the first call and of `rounds` batches of at least `iters` calls, and of at
    least `min_round_s` seconds, after `WARMUP` more (the first ones on `warmup`, the timed ones
    on `timed`), and the last call's result. `turn` runs before each batch and after the last:
    it waits for this runtime's turn."""
    times = []
    for i in range(1 + WARMUP):
        start = time.perf_counter()
        out = call(warmup)
        synchronize()
        times.append(time.perf_counter() - start)
    for _ in range(rounds):
        turn()
        calls, began = 0, time.perf_counter()
        while calls < iters or time.perf_counter() - began < min_round_s:
            start = time.perf_counter()
            out = call(timed)
            synchronize()
            times.append(time.perf_counter() - start)
            calls += 1
    turn()
    return times[0], times[1 + WARMUP:], out


def wait_for_turn() -> None:
    """In a child process of `run_children`: says the calls so far are done ("ready" on stdout),
    then waits for its next turn (a line on stdin)."""
    print(READY, flush=True)
    if not sys.stdin.readline():
        raise SystemExit("the benchmark stopped before this runtime's turn")


def child(args: argparse.Namespace) -> int:
    """One runtime on one model: reads the inputs, writes the outputs, prints its timings as JSON."""
    with np.load(args.inputs) as data:
        inputs = {name: data[name] for name in data.files}
    if args.child == PLAN:
        info, outs = run_plan(args.plan, args.plan_device, inputs)
    elif args.child == ORT_START:
        info, outs = run_onnxruntime_start(args.model_path, inputs)
    elif args.child == ORT:
        info, outs = run_onnxruntime(args.model_path, inputs, args.iters, args.rounds, wait_for_turn, args.round_s)
    else:
        info, outs = run_tinygrad(args.model_path, inputs, args.iters, args.plan, args.rounds, wait_for_turn,
                                  args.round_s)
    np.savez(args.outputs, **outs)
    print(json.dumps(info))
    return 0


def child_command(runtime: str, model_path: Path, inputs: Path, outputs: Path, args: argparse.Namespace,
                  plan: Path | None = None, plan_device: str = "", kiln_cache: Path | None = None,
                  ) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a process that runs `runtime` (onnxruntime, or a
    tinygrad `DEV`; `ORT_START` and `PLAN` for the start-up measures) on one model. Unless
    `--warm-caches`, a tinygrad process gets empty kernel caches of its own (kiln's
    `KILN_CACHE_DIR`, tinygrad's `CACHEDB`), so its first call compiles every kernel, and saves its
    JIT as the plan file `plan`. A `PLAN` process loads `plan` on kiln device `plan_device` with
    kiln's kernel cache in `kiln_cache` (empty, or left by an earlier one)."""
    cmd = [sys.executable, __file__, "--child", runtime, "--model-path", str(model_path), "--inputs", str(inputs),
           "--outputs", str(outputs), "--iters", str(args.iters), "--rounds", str(args.rounds),
           "--round-s", str(args.round_s)]
    if plan is not None:
        cmd += ["--plan", str(plan), "--plan-device", plan_device]
    env = dict(os.environ)
    if kiln_cache is not None:
        env["KILN_CACHE_DIR"] = str(kiln_cache)
    if runtime not in (ORT, ORT_START, PLAN):
        env["DEV"] = runtime
        if not args.warm_caches:
            caches = Path(tempfile.mkdtemp(prefix=f"{runtime.replace(':', '_')}-caches-", dir=outputs.parent))
            env.update(KILN_CACHE_DIR=str(caches / "kiln"), CACHEDB=str(caches / "tinygrad.db"))
    return cmd, env


def run_child(runtime: str, model_path: Path, inputs: Path, outputs: Path, args: argparse.Namespace,
              plan: Path | None = None, plan_device: str = "", kiln_cache: Path | None = None) -> dict:
    """Runs a start-up measure (`ORT_START`, `PLAN`) in its own process (`child_command`): its
    timings, or {"error": ...} with the end of its stderr."""
    cmd, env = child_command(runtime, model_path, inputs, outputs, args, plan, plan_device, kiln_cache)
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    if out.returncode != 0:
        return {"error": f"exit status {out.returncode}:\n{out.stderr[-3000:]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


class Child:
    """A runtime's process that waits for its turns (`wait_for_turn`), as `run_children` runs it."""

    def __init__(self, runtime: str, cmd: list[str], env: dict[str, str], timeout: float):
        self.runtime, self.error = runtime, ""
        self.deadline, self.timeout = time.monotonic() + timeout, timeout
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _line(self) -> str | None:
        """Its next line of output; None when it has ended or ran out of time (then killed)."""
        try:
            return self.lines.get(timeout=max(self.deadline - time.monotonic(), 0))
        except queue.Empty:
            self.error = f"timed out after {self.timeout} s"
            self.proc.kill()
            return None

    def ready(self) -> bool:
        """Waits until it has done its calls so far and waits for its turn; False if it failed."""
        while (line := self._line()) is not None:
            if line == READY:
                return True
        self.error = self.error or self._exit_error() or "ended before its timed calls"
        return False

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def _exit_error(self) -> str:
        code = self.proc.wait()
        self.stderr.seek(0)
        return f"exit status {code}:\n{self.stderr.read()[-3000:]}" if code else ""

    def result(self) -> dict:
        """After its last turn: its timings (its last line), or {"error": ...}."""
        lines = []
        while not self.error and (line := self._line()) is not None:
            lines.append(line)
        self.error = self.error or self._exit_error()
        self.stderr.close()
        if self.error or not lines:
            return {"error": self.error or "printed no timings"}
        return json.loads(lines[-1])


def run_children(runs: list[tuple[str, Path, Path | None]], model_path: Path, inputs: Path,
                 args: argparse.Namespace) -> dict[str, dict]:
    """Runs onnxruntime and the tinygrad devices (`runs`: each runtime with its outputs file and
    plan file) on one model, each in its own process (`child_command`), taking turns: one after
    another, each starts (its session or JIT, the first call, the warm-ups) while the ones before
    it wait; then `--rounds` times, each runtime in turn makes `--iters` timed calls while the
    others wait on a pipe, idle; then each in turn writes its outputs (and saves its plan). A slow
    spell of the machine then falls on every runtime's calls alike, and no runtime computes while
    another is timed. Returns each runtime's timings, or {"error": ...}; after onnxruntime fails,
    none other starts."""
    waiting: list[Child] = []
    results: dict[str, dict] = {}
    for runtime, outputs, plan in runs:
        cmd, env = child_command(runtime, model_path, inputs, outputs, args, plan)
        child = Child(runtime, cmd, env, args.timeout)
        if child.ready():
            waiting.append(child)
            continue
        results[runtime] = child.result()
        if runtime == ORT:
            break
    for _ in range(args.rounds):
        for child in list(waiting):
            time.sleep(PAUSE_S)  # the last runtime's spinning threads go to sleep
            child.go()
            if not child.ready():
                waiting.remove(child)
                results[child.runtime] = child.result()
    for child in waiting:
        child.go()
        results[child.runtime] = child.result()
    return results


def last_error_line(error: str) -> str:
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else error


def compare(outs: dict[str, np.ndarray], refs: dict[str, np.ndarray], model: Model) -> dict:
    """The largest difference from onnxruntime's outputs, absolute and relative to the output's
    largest magnitude, and "error" where an output differs by more than `model.rtol` of the
    element plus `model.atol` of the output's largest magnitude plus `model.atol_abs`."""
    result: dict[str, Any] = {"max_abs_err": 0.0, "max_scaled_err": 0.0}
    for name, ref in refs.items():
        got = outs[name]
        if got.shape != ref.shape:
            result["error"] = f"output {name}: shape {got.shape}, onnxruntime's {ref.shape}"
            return result
        scale = float(np.abs(ref).max(initial=0))
        diff = float(np.abs(got.astype(np.float64) - ref).max(initial=0))
        result["max_abs_err"] = max(result["max_abs_err"], diff)
        result["max_scaled_err"] = max(result["max_scaled_err"], diff / scale if scale else diff)
        try:
            np.testing.assert_allclose(got, ref, rtol=model.rtol, atol=model.atol * scale + model.atol_abs)
        except AssertionError as e:
            result["error"] = f"output {name} differs from onnxruntime's:{e}"
    return result


def prepare(model: Model, found: Path, folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """The file every runtime runs (`found`, or with random weights a copy in `folder`) and its
    inputs."""
    path = found
    if model.random_weights:
        path = folder / f"{model.name}.onnx"
        random_weight_model(found, path, SEED)
    return path, make_inputs(path, model, SEED + 1)


def bench_model(model: Model, devices: list[str], folder: Path, args: argparse.Namespace) -> dict:
    """One model on onnxruntime, then on each device, checked against onnxruntime's outputs:
    {"status": "ok" | "failed" | "skipped", ...}, with a result per runtime."""
    found = model.locate()
    if found is None:
        return {"status": "skipped", "reason": f"not found: is {model.source} installed? (see requirements-models.txt)"}
    path, inputs = prepare(model, found, folder)
    inputs_file = folder / f"{model.name}.inputs.npz"
    np.savez(inputs_file, **inputs)
    record: dict[str, Any] = {"status": "ok", "source": model.source, "file": str(found), "rtol": model.rtol,
                              "atol": model.atol, "random_weights": model.random_weights,
                              "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in inputs.items()}}
    ref_file = folder / f"{model.name}.{ORT}.npz"
    out_files = {dev: folder / f"{model.name}.{dev.replace(':', '_')}.npz" for dev in devices}
    plan_files = {dev: folder / f"{model.name}.{dev.replace(':', '_')}.kplan" if args.plan_runs and dev.startswith("KILN")
                  else None for dev in devices}
    ran = run_children([(ORT, ref_file, None), *((dev, out_files[dev], plan_files[dev]) for dev in devices)], path,
                       inputs_file, args)
    ort = ran[ORT]
    record["runtimes"] = {ORT: ort}
    if "error" in ort:
        print(f"{model.name}: onnxruntime FAILED: {ort['error']}", file=sys.stderr)
        record["status"] = "failed"
        return record
    ort["ms"] = statistics.median(ort["times_ms"])
    with np.load(ref_file) as data:
        refs = {name: data[name] for name in data.files}
    for dev in devices:
        out_file, plan_file = out_files[dev], plan_files[dev]
        result = check_device(model, dev, ran[dev], out_file, refs)
        record["runtimes"][dev] = result
        if "error" in result:
            record["status"] = "failed"
        elif "plan" in result:
            result["plan"] = bench_plan(model, dev, result["plan"], path, plan_file, inputs_file, out_file, refs, folder, args)
            if "error" in result["plan"]:
                record["status"] = "failed"
    if record["status"] == "ok" and all("skipped" in record["runtimes"][dev] for dev in devices):
        record["status"] = "skipped"
        record["reason"] = "; ".join(sorted({record["runtimes"][dev]["skipped"] for dev in devices}))
    return record


def bench_plan(model: Model, dev: str, saved: dict, path: Path, plan_file: Path | None, inputs_file: Path,
               tinygrad_out: Path, refs: dict[str, np.ndarray], folder: Path, args: argparse.Namespace) -> dict:
    """The plan device `dev`'s process saved: loaded and run once in fresh processes, first with an
    empty kernel cache, then `--plan-runs` times with the cache the first left; and onnxruntime's
    session and first run as many times in fresh processes. Every plan run's outputs are checked
    against tinygrad's on `dev` (bit for bit) and onnxruntime's (`compare`) before any time is kept:
    a mismatch is an error and no times. Medians over the runs."""
    assert plan_file is not None
    with np.load(tinygrad_out) as data:
        want = {name: data[name] for name in data.files}
    cache = Path(tempfile.mkdtemp(prefix="plan-kiln-cache-", dir=folder))
    runs: dict[str, list[dict]] = {"empty_cache": [], "warm_cache": [], ORT_START: []}
    for kind in ["empty_cache"] + ["warm_cache"] * args.plan_runs:
        out_file = folder / f"{model.name}.plan.npz"
        run = run_child(PLAN, path, inputs_file, out_file, args, plan=plan_file, plan_device=saved["kiln_device"],
                        kiln_cache=cache)
        if "error" in run:
            print(f"{model.name}: the plan of {dev} FAILED: {run['error']}", file=sys.stderr)
            return {**saved, "error": run["error"]}
        with np.load(out_file) as data:
            got = {name: data[name] for name in data.files}
        differ = [n for n in want if n not in got or got[n].dtype != want[n].dtype or got[n].shape != want[n].shape
                  or got[n].tobytes() != want[n].tobytes()]
        if differ or set(got) != set(want):
            error = f"the loaded plan's outputs {differ or sorted(set(got) ^ set(want))} are not tinygrad's on {dev} bit for bit"
        elif "error" in (checked := compare(got, refs, model)):
            error = f"the loaded plan's {checked['error']}"
        elif run["tinygrad_imported"]:
            error = "loading and running the plan imported tinygrad"
        else:
            runs[kind].append(run)
            continue
        print(f"{model.name}: the plan of {dev} MISMATCH (no time reported): {error}", file=sys.stderr)
        return {**saved, "error": error}
    for _ in range(args.plan_runs):
        run = run_child(ORT_START, path, inputs_file, folder / f"{model.name}.{ORT_START}.npz", args)
        if "error" in run:
            return {**saved, "error": f"onnxruntime's start: {run['error']}"}
        runs[ORT_START].append(run)
    print(f"{model.name}: the plan of {dev} loads in fresh processes with outputs equal to tinygrad's on {dev} "
          f"bit for bit and matching onnxruntime's", file=sys.stderr)

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    result = {**saved, "kernels": runs["empty_cache"][0]["stats"]["kernels"], "runs": runs}
    for kind in runs:
        for key in ("load_ms", "first_ms", "to_first_ms"):
            result[f"{kind}_{key}"] = median(kind, key)
    return result


def check_device(model: Model, dev: str, result: dict, out_file: Path, refs: dict[str, np.ndarray]) -> dict:
    """A device's result, checked: its median ms where its outputs match onnxruntime's `refs`;
    else its error (and no times), or "skipped" where tinygrad failed as `model.known_failure` says."""
    if "error" in result:
        if model.known_failure and model.known_failure in result["error"]:
            result = {"skipped": f"tinygrad 0.14 cannot run it: {last_error_line(result['error'])}"}
            print(f"{model.name}: {dev} skipped: {result['skipped']}", file=sys.stderr)
        else:
            print(f"{model.name}: {dev} FAILED: {result['error']}", file=sys.stderr)
        return result
    with np.load(out_file) as data:
        result.update(compare({name: data[name] for name in data.files}, refs, model))
    if "error" in result:
        print(f"{model.name}: {dev} MISMATCH (no time reported): {result['error']}", file=sys.stderr)
        return {k: v for k, v in result.items() if k not in ("load_ms", "first_ms", "times_ms")}
    result["ms"] = statistics.median(result["times_ms"])
    print(f"{model.name}: {dev} outputs match onnxruntime's (max abs err {result['max_abs_err']:.3g}, "
          f"{result['max_scaled_err']:.3g} of the largest output)", file=sys.stderr)
    return result


def cpu_model() -> str:
    """/proc/cpuinfo's model name, with its family/model/stepping (a virtual machine's name can be
    as vague as "Intel(R) Xeon(R) Processor")."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if not line.strip():
                break
    except OSError:
        return platform.processor() or platform.machine()
    name = fields.get("model name", platform.machine())
    ids = ", ".join(f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)
    return f"{name} ({ids})" if ids else name


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("kiln", "tinygrad", "onnx", "onnxruntime", "numpy", "rapidocr-onnxruntime", "magika"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def print_table(results: dict[str, dict], devices: list[str]) -> dict[str, float]:
    """The table of the models that ran; returns the geometric mean of ort_ms / device_ms per
    device over the models every runtime passed."""
    def cell(runtime: dict, key: str) -> str:
        if "skipped" in runtime:
            return "skipped"
        if "error" in runtime:
            return "FAILED"
        return f"{runtime[key]:.2f}"

    heads = ["ort ms", *(f"{d} ms" for d in devices), *(f"ort/{d}" for d in devices),
             "ort 1st ms", *(f"{d} 1st ms" for d in devices)]
    width = max(len(name) for name in results) + 2
    print(f"{'model':<{width}}" + "".join(f"{h:>14}" for h in heads))
    ratios: dict[str, list[float]] = {d: [] for d in devices}
    for name, record in results.items():
        if "runtimes" not in record or "error" in record["runtimes"][ORT]:
            print(f"{name:<{width}}{record['status']}: {record.get('reason', 'onnxruntime failed')}")
            continue
        runs = record["runtimes"]
        row = [cell(runs[ORT], "ms"), *(cell(runs[d], "ms") for d in devices)]
        for d in devices:
            ok = "ms" in runs[d]
            row.append(f"{runs[ORT]['ms'] / runs[d]['ms']:.2f}x" if ok else "-")
        row += [cell(runs[ORT], "first_ms"), *(cell(runs[d], "first_ms") for d in devices)]
        print(f"{name:<{width}}" + "".join(f"{c:>14}" for c in row))
        if all("ms" in runs[d] for d in devices):
            for d in devices:
                ratios[d].append(runs[ORT]["ms"] / runs[d]["ms"])
    geomeans = {d: math.exp(statistics.fmean(math.log(r) for r in rs)) for d, rs in ratios.items() if rs}
    for d, g in geomeans.items():
        print(f"geometric mean of ort_ms / {d}_ms over {len(ratios[d])} models: {g:.3f}"
              f" ({d} {'faster' if g > 1 else 'slower'} than onnxruntime by {max(g, 1 / g):.2f}x)")
    return geomeans


def print_plan_table(results: dict[str, dict], devices: list[str], runs: int) -> None:
    """The saved plans' table: save time and file size, then a fresh process's `load_plan` and first
    call with an empty and with a warm kernel cache, beside onnxruntime's session and first run."""
    rows = [(name, d, r["runtimes"][d]["plan"]) for name, r in results.items() for d in devices
            if "plan" in r.get("runtimes", {}).get(d, {})]
    if not rows:
        return
    print(f"\nsaved plans (kiln.tinygrad.save_jit of the JIT above; a fresh process per load, imports aside; ms, "
          f"median of {runs} processes but the empty cache's one):")
    heads = ["save ms", "file MB", "kernels", "empty load", "empty 1st", "empty total", "warm load", "warm 1st",
             "warm total", "ort session", "ort 1st", "ort total", "warm/ort"]
    width = max(len(f"{name} {d}") for name, d, _ in rows) + 2
    print(f"{'model':<{width}}" + "".join(f"{h:>12}" for h in heads))
    for name, d, plan in rows:
        label = f"{name} {d}"
        if "error" in plan:
            print(f"{label:<{width}}FAILED: {last_error_line(plan['error'])}")
            continue
        cells = [f"{plan['save_ms']:.1f}", f"{plan['file_bytes'] / 1e6:.2f}", str(plan["kernels"])]
        for kind in ("empty_cache", "warm_cache", ORT_START):
            cells += [f"{plan[f'{kind}_{key}']:.1f}" for key in ("load_ms", "first_ms", "to_first_ms")]
        cells.append(f"{plan['warm_cache_to_first_ms'] / plan[f'{ORT_START}_to_first_ms']:.2f}x")
        print(f"{label:<{width}}" + "".join(f"{c:>12}" for c in cells))
    print("total = load + first call; warm/ort = the plan's warm total / onnxruntime's total (at most 1: kiln starts "
          "no slower). Every loaded plan's outputs equal tinygrad's on its device bit for bit and match onnxruntime's.")


def main() -> int:
    all_models = models()
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--models", default=",".join(m.name for m in all_models),
                    help=f"comma-separated, of: {', '.join(m.name for m in all_models)}")
    ap.add_argument("--devices", default="KILN,CPU", help="tinygrad DEV values (onnxruntime always runs)")
    ap.add_argument("--iters", type=int, default=10, help="timed calls per model, runtime and round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of timed calls: in each, every runtime in turn makes --iters calls (the median "
                         "is over all rounds)")
    ap.add_argument("--round-s", type=float, default=0.5,
                    help="seconds a runtime's calls of one round take at least (more calls than --iters where they "
                         "are short, so that a brief slow spell of the machine falls on few of them)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per model and runtime")
    ap.add_argument("--json", type=Path, help="write every result here")
    ap.add_argument("--warm-caches", action="store_true",
                    help="let tinygrad's and kiln's kernel caches of earlier runs serve the first call")
    ap.add_argument("--plan-runs", type=int, default=3,
                    help="fresh processes that load each KILN device's saved plan with a warm kernel cache (after one "
                         "with an empty cache), and that start onnxruntime; 0 saves no plans")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--plan-device", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--outputs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    if args.iters < 1 or args.rounds < 1 or not args.round_s >= 0:
        ap.error("--iters and --rounds must be at least 1, and --round-s at least 0")
    by_name = {m.name: m for m in all_models}
    chosen = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in by_name]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(by_name)}")
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
               "loadavg_at_start": os.getloadavg()}  # other work on the machine skews the times
    print(f"CPU: {machine['cpu']}, {machine['cores']} cores; onnxruntime: CPUExecutionProvider, "
          f"intra_op_num_threads {os.cpu_count()}, inter_op_num_threads 1", file=sys.stderr)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="onnx_models_") as tmp:
        for name in chosen:
            results[name] = bench_model(by_name[name], devices, Path(tmp), args)

    machine["loadavg_at_end"] = os.getloadavg()
    compilers = {d: r["runtimes"][d]["compiler"] for r in results.values() for d in devices
                 if "compiler" in r.get("runtimes", {}).get(d, {})}
    start_load, end_load = (" ".join(f"{x:.2f}" for x in machine[k]) for k in ("loadavg_at_start", "loadavg_at_end"))
    print(f"\nCPU: {machine['cpu']}, {machine['cores']} cores; load average (1, 5, 15 min) {start_load} at the start, "
          f"{end_load} at the end")
    for d in devices:
        print(f"{d} compiler: {compilers.get(d, 'unknown (no model ran)')}")
    caches = "kiln's and tinygrad's kernel caches as earlier runs left them" if args.warm_caches else \
        "empty kernel caches: includes compiling every kernel"
    print(f"ort = onnxruntime {versions()['onnxruntime']} (CPUExecutionProvider, {os.cpu_count()} intra-op threads); "
          f"ms = median of {args.rounds} rounds of {args.iters} calls or more ({args.round_s} s at least), the runtimes "
          f"taking turns; ort/DEV = ort ms / DEV ms (above 1: DEV is faster); "
          f"1st = the first call (tinygrad: {caches})")
    geomeans = print_table(results, devices)
    print_plan_table(results, devices, args.plan_runs)
    failed = sorted(n for n, r in results.items() if r["status"] == "failed")
    missing = sorted(n for n, r in results.items() if r.get("reason", "").startswith("not found"))
    for name, record in results.items():
        if "runtimes" not in record:
            print(f"skipped {name}: {record['reason']}")
        for d in devices:
            if "skipped" in record.get("runtimes", {}).get(d, {}):
                print(f"skipped {name} on {d}: {record['runtimes'][d]['skipped']}")
    if failed:
        print(f"FAILED: {', '.join(failed)} (see the errors above)")
    if missing:
        print(f"NOT MEASURED: {', '.join(missing)}: their models are not installed; "
              "pip install --no-deps -r crates/kiln-py/bench/requirements-models.txt")
    if args.json:
        report = {"command": [sys.executable, *sys.argv], "machine": machine, "versions": versions(),
                  "compilers": compilers, "iters": args.iters, "rounds": args.rounds, "round_s": args.round_s,
                  "warmup": WARMUP, "seed": SEED, "first_call": caches,
                  "onnxruntime": {"provider": "CPUExecutionProvider", "intra_op_num_threads": os.cpu_count(),
                                  "inter_op_num_threads": 1},
                  "geomean_ort_over_device": geomeans, "failed": failed, "models": results}
        args.json.write_text(json.dumps(report, indent=1))
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
