"""Saved plans from Python: `kiln.Plan.save`, `kiln.load_plan`, `kiln.tinygrad.save_jit` and
`python -m kiln.onnx`, with `kiln run-plan` (the CLI) on the same files.

Round trips to the same bits (a plan made here, one made by kiln-runtime's `saved_plan` example,
a TinyJit, an ONNX model), loading in a fresh process that never imports tinygrad, and the typed
errors of damaged files, wrong inputs and what cannot be saved. The tinygrad tests are skipped
without tinygrad 0.14.0, the ONNX ones without onnx, and those that run the CLI or the example
when their binaries are not built (`cargo build --release -p kiln`; `cargo test --release` builds
the example).
"""

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import INC, KERNELS, require

import kiln
import kiln.tinygrad

REPO = Path(__file__).resolve().parents[3]


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")


def built(relative: str, how: str) -> Path:
    """A binary of the workspace's release build (`KILN_CLI` names the CLI), or a skip saying how
    to build it."""
    if relative == "kiln" and os.environ.get("KILN_CLI"):
        return Path(os.environ["KILN_CLI"])
    path = target_dir() / "release" / relative
    if not path.exists():
        pytest.skip(f"{path} is not built ({how})")
    return path


def needs_tinygrad():
    pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install tinygrad==0.14.0)")
    if importlib.metadata.version("tinygrad") != "0.14.0":
        pytest.skip("kiln.tinygrad is written against tinygrad 0.14.0")


def inc_and_add_plan(dev, path):
    """Saves y = (x + 1) + w over `n` elements (w: 64 constant weights) to `path`; returns w."""
    inc, add = dev.compile(INC, name="inc"), dev.compile(KERNELS / "add.kiln")
    x, h, y = dev.empty("f32", 64), dev.empty("f32", 64), dev.empty("f32", 64)
    w = np.linspace(-2, 2, 64, dtype=np.float32)
    weights = dev.from_numpy(w)
    plan = kiln.Plan(dev)
    plan.launch(inc, [x, h], {"n": 64})
    plan.launch(add, [h, weights, y], {"n": 64})
    size = plan.save(path, inputs={"x": (x, ["n"])}, outputs={"y": (y, ["n"])})
    assert size == path.stat().st_size
    weights.copy_from(np.zeros(64, np.float32))  # saved as it was: later changes are not in the file
    return w


def test_plan_save_and_load_round_trip(dev, tmp_path):
    path = tmp_path / "inc.kplan"
    w = inc_and_add_plan(dev, path)
    plan = kiln.load_plan(path)
    assert plan.device == "CPU" and plan.path == path
    assert [(t.name, t.dtype, t.shape) for t in plan.inputs] == [("x", "f32", ["n"])]
    assert [(t.name, t.dtype, t.shape) for t in plan.outputs] == [("y", "f32", ["n"])]
    assert [(v.name, v.value, v.min, v.max) for v in plan.variables] == [("n", 64, 1, 1048576)]
    assert plan.stats["kernels"] == 2 and plan.stats["nodes"] == 2 and plan.stats["constant_bytes"] >= 256
    x = np.arange(64, dtype=np.float32)
    np.testing.assert_array_equal(plan(x=x)["y"], x + 1 + w)
    # another batch size, the mapping form, and `run` with the variable given too
    np.testing.assert_array_equal(plan({"x": x[:5]})["y"], x[:5] + 1 + w[:5])
    np.testing.assert_array_equal(plan.run({"x": x[:7]}, vars={"n": 7})["y"], x[:7] + 1 + w[:7])
    # a strided array is copied; a kiln buffer is a DLPack tensor like any other
    np.testing.assert_array_equal(plan(x=x[::2])["y"], x[::2] + 1 + w[:32])
    np.testing.assert_array_equal(plan(x=dev.from_numpy(x[:9]))["y"], x[:9] + 1 + w[:9])
    assert "inputs (x f32 [n])" in repr(plan)


@pytest.mark.parametrize("backend", ["OPENCL", "WEBGPU"])
def test_a_cpu_plan_loads_on_other_devices(dev, tmp_path, backend):
    other = require(backend)
    path = tmp_path / "inc.kplan"
    w = inc_and_add_plan(dev, path)
    x = np.linspace(0, 1, 10, dtype=np.float32)
    for plan in (kiln.load_plan(path, other.name), kiln.load_plan(path, other, map_constants=False)):
        assert plan.device == other.name
        np.testing.assert_allclose(plan(x=x)["y"], x + 1 + w[:10], rtol=1e-6)


def test_load_options(dev, tmp_path):
    path = tmp_path / "inc.kplan"
    w = inc_and_add_plan(dev, path)
    x = np.ones(3, np.float32)
    mapped = kiln.load_plan(path, "CPU", compiler="cc", strict_bounds=True)
    copied = kiln.load_plan(path, map_constants=False)
    for plan in (mapped, copied):
        np.testing.assert_array_equal(plan(x=x)["y"], 2 + w[:3])
    assert copied.stats["mapped_bytes"] == 0 < w.nbytes <= mapped.stats["mapped_bytes"] <= mapped.stats["constant_bytes"]
    with pytest.raises(kiln.UnavailableError, match="no compiler pair `nope`"):
        kiln.load_plan(path, compiler="nope")
    with pytest.raises(kiln.UnavailableError, match="no backend called NOPE"):
        kiln.load_plan(path, "NOPE")
    with pytest.raises(kiln.InvalidArgumentError, match="device is a kiln.Device or a device name"):
        kiln.load_plan(path, 3)
    with pytest.raises(kiln.InvalidArgumentError, match="is a path"):
        kiln.load_plan(3)


def test_a_plan_made_by_kiln_runtime_loads_and_runs_as_the_cli_runs_it(tmp_path):
    """kiln-runtime's sample model (`SampleMlp`, saved by its example, which checks its own loads
    against the host): `load_plan` gives what `kiln run-plan` gives, bit for bit."""
    example = built("examples/saved_plan", "cargo build --release -p kiln-runtime --example saved_plan")
    cli = built("kiln", "cargo build --release -p kiln")
    path = tmp_path / "mlp.kplan"
    subprocess.run([str(example), "--out", str(path), "--shape", "8,16,32,8", "CPU"], check=True, capture_output=True,
                   env={**os.environ, "KILN_CACHE_DIR": str(tmp_path / "cache")})
    plan = kiln.load_plan(path)
    assert [(t.name, t.dtype, t.shape) for t in plan.inputs] == [("x", "f32", ["batch", 16])]
    assert [(t.name, t.dtype, t.shape) for t in plan.outputs] == [("y", "f32", ["batch", 8])]
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    got = plan(x=x)["y"]
    np.save(tmp_path / "x.npy", x)
    subprocess.run([str(cli), "run-plan", str(path), "--in", f"x={tmp_path / 'x.npy'}", "--out", f"y={tmp_path / 'y.npy'}"],
                   check=True, capture_output=True)
    want = np.load(tmp_path / "y.npy")
    assert got.shape == want.shape == (3, 8) and got.tobytes() == want.tobytes()


def run_fresh(script: str, *args: str) -> str:
    """Runs `script` in a fresh interpreter; returns its stdout."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


LOAD_AND_RUN = """
    import sys
    import numpy as np
    import kiln
    plan = kiln.load_plan(sys.argv[1])
    inputs = {t.name: np.load(sys.argv[2] + t.name + ".npy") for t in plan.inputs}
    for name, out in plan(inputs).items():
        np.save(sys.argv[2] + "out-" + name + ".npy", out)
    print(sorted(m for m in sys.modules if m.split(".")[0] == "tinygrad" or m == "kiln.tinygrad"))
"""


def test_loading_and_running_imports_no_tinygrad(dev, tmp_path):
    path = tmp_path / "inc.kplan"
    w = inc_and_add_plan(dev, path)
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32))
    assert run_fresh(LOAD_AND_RUN, str(path), f"{tmp_path}/").strip() == "[]"
    np.testing.assert_array_equal(np.load(tmp_path / "out-y.npy"), np.arange(6, dtype=np.float32) + 1 + w[:6])


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]


def test_damaged_files_raise_typed_errors(dev, tmp_path):
    good = tmp_path / "good.kplan"
    inc_and_add_plan(dev, good)
    data = good.read_bytes()
    manifest_len = int.from_bytes(data[16:24], "little")
    constants = len(data) - 256  # the block of weights ends the file

    def load(raw: bytes) -> Exception:
        path = tmp_path / "bad.kplan"
        path.write_bytes(raw)
        with pytest.raises(kiln.Error) as e:
            kiln.load_plan(path)
        return e.value

    cases = {
        "not_a_plan": b"PK\x03\x04" + data[4:],
        "truncated": data[:40],
        "checksum": flip(data, 64 + manifest_len // 2),  # inside the manifest
    }
    for kind, raw in cases.items():
        e = load(raw)
        assert type(e) is kiln.PlanFileError and e.kind == kind, (kind, e)
    e = load(flip(data, 64 + manifest_len + 10))  # a kernel's text
    assert type(e) is kiln.PlanFileError and e.kind == "checksum" and "kernel" in str(e)
    e = load(flip(data, constants + 8))  # a weight
    assert type(e) is kiln.PlanFileError and e.kind == "checksum" and "constants" in str(e)
    e = load(data[:8] + (7).to_bytes(4, "little") + data[12:])
    assert type(e) is kiln.PlanVersionError and (e.found, e.known, e.kind) == (7, 1, "unknown_version")
    assert isinstance(e, kiln.PlanFileError) and isinstance(e, kiln.InvalidArgumentError)
    assert "version 7" in str(e) and "save the plan again" in str(e)
    with pytest.raises(kiln.IoError, match="No such file"):
        kiln.load_plan(tmp_path / "missing.kplan")
    with pytest.raises(kiln.IoError):
        kiln.load_plan(tmp_path)


def test_no_damage_crashes_the_loader(dev, tmp_path):
    """Truncations and bit flips anywhere: every case loads (and runs) or raises a kiln.Error, and
    every change to a part the file checksums (the manifest, the kernels, the weights) is refused."""
    good = tmp_path / "good.kplan"
    inc_and_add_plan(dev, good)
    data = good.read_bytes()
    manifest = json.loads(data[64 : 64 + int.from_bytes(data[16:24], "little")])
    padding = range(manifest["kernel_section"]["offset"] + manifest["kernel_section"]["bytes"], manifest["constants"]["offset"])
    rng = np.random.default_rng(45)
    path = tmp_path / "case.kplan"
    for case in range(150):
        at = int(rng.integers(0, len(data)))
        raw = data[:at] if case % 5 == 0 else flip(data, at)
        path.write_bytes(raw)
        try:
            plan = kiln.load_plan(path, map_constants=case % 2 == 0)
            plan(x=np.ones(4, np.float32))
        except kiln.Error:
            continue
        assert case % 5 != 0 and (at < 64 or at in padding), f"case {case}: a change at byte {at} loaded"


def test_wrong_inputs_raise_plan_input_errors(dev, tmp_path):
    path = tmp_path / "inc.kplan"
    inc_and_add_plan(dev, path)
    plan = kiln.load_plan(path)
    x = np.ones(4, np.float32)
    cases = [
        ({"z": x}, "z", "no input of this name (its inputs: x f32 [n])"),
        ({}, "x", "missing: the plan takes f32 [n]"),
        ({"x": x.astype(np.float64)}, "x", "got f64 elements, the plan takes f32 [n]"),
        ({"x": x.reshape(2, 2)}, "x", "2 dimensions"),
        ({"x": np.ones(65, np.float32)}, "x", "65 elements, more than its buffer's 64"),
        ({"x": np.ones(0, np.float32)}, "x", "n in [1, 1048576]"),
        ({"x": "text"}, "x", "DLPack"),
        ({"x": object()}, "x", ""),
    ]
    for inputs, name, message in cases:
        with pytest.raises(kiln.PlanInputError) as e:
            plan(**inputs)
        assert e.value.input == name and message in str(e.value), (inputs, e.value)
        assert isinstance(e.value, kiln.InvalidArgumentError)
    with pytest.raises(kiln.PlanInputError, match="given more than once"):
        plan({"x": x}, x=x)
    with pytest.raises(kiln.PlanInputError, match="no variable `m`"):
        plan.run({"x": x}, vars={"m": 3})
    with pytest.raises(kiln.PlanInputError, match="n = 4"):
        plan.run({"x": x}, vars={"n": 5})
    with pytest.raises(kiln.InvalidArgumentError, match="mapping of names"):
        plan([x])
    np.testing.assert_array_equal(plan(x=x)["y"][:1], plan(x=x)["y"][:1])  # the plan still runs


def test_what_cannot_be_saved(dev, tmp_path):
    inc = dev.compile(INC, name="inc")
    a, b = dev.empty("f32", 8), dev.empty("f32", 8)
    plan = kiln.Plan(dev)
    plan.launch(inc, [a, b], {"n": 8})
    path = tmp_path / "p.kplan"
    with pytest.raises(kiln.PlanSaveError, match="`m` of input `x` is not a plan variable"):
        plan.save(path, inputs={"x": (a, ["m"])})
    with pytest.raises(kiln.PlanSaveError, match="16 elements"):
        plan.save(path, inputs={"x": (a, [16])})
    with pytest.raises(kiln.PlanSaveError, match="not empty"):
        plan.save(path, inputs={"": a})
    with pytest.raises(kiln.InvalidArgumentError, match="kiln.Buffer or a"):
        plan.save(path, inputs={"x": np.ones(8)})
    with pytest.raises(kiln.InvalidArgumentError, match="must be 0 or more"):
        plan.save(path, inputs={"x": (a, [-1])})
    with pytest.raises(kiln.IoError):
        plan.save(tmp_path / "missing" / "p.kplan", inputs={"x": a}, outputs={"y": b})
    assert not path.exists()
    ends = kiln.Channel.local(1)
    plan.all_reduce(ends[0], b)
    with pytest.raises(kiln.PlanSaveError, match="collective"):
        plan.save(path, inputs={"x": a}, outputs={"y": b})


# ---------------------------------------------------------------------------------------------
# tinygrad


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def test_a_tinyjit_saves_and_loads_to_the_same_bits(tmp_path):
    needs_tinygrad()
    from tinygrad import Tensor, TinyJit
    from tinygrad.helpers import Context

    rng = np.random.default_rng(7)
    w1, w2 = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)
    with Context(DEV="KILN"):
        weights = [Tensor(w1).realize(), Tensor(w2).realize()]

        @TinyJit
        def mlp(x, *, scale):
            h = (x @ weights[0]).relu().contiguous()
            return {"logits": (h @ weights[1]) * scale, "norm": (h * h).sum()}

        @TinyJit
        def one_kernel(x):  # a JIT of one call: tinygrad makes no graph batch of it
            return (x * 2 + 1).sum(axis=1)

        xs = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(3)]
        scale = np.full((1, 8), 0.5, np.float32)
        for x in xs:
            want = {k: v.numpy() for k, v in mlp(Tensor(x), scale=Tensor(scale)).items()}
            want_one = one_kernel(Tensor(x)).numpy()
        with pytest.raises(kiln.PlanSaveError, match="not captured yet"):
            fresh = TinyJit(lambda x: x + 1)
            fresh(Tensor(xs[0]))
            kiln.tinygrad.save_jit(fresh, tmp_path / "fresh.kplan")
        size = kiln.tinygrad.save_jit(mlp, tmp_path / "mlp.kplan")
        kiln.tinygrad.save_jit(one_kernel, tmp_path / "one.kplan", names=["rows"], outputs=["sums"])
    assert size == (tmp_path / "mlp.kplan").stat().st_size
    plan = kiln.load_plan(tmp_path / "mlp.kplan")
    assert [(t.name, t.shape) for t in plan.inputs] == [("x", [4, 16]), ("scale", [1, 8])]
    assert [(t.name, t.shape) for t in plan.outputs] == [("logits", [4, 8]), ("norm", [])]
    assert plan.stats["constant_bytes"] >= w1.nbytes + w2.nbytes  # the weights travel in the file
    got = plan(x=xs[-1], scale=scale)
    assert all(same_bits(got[k], want[k]) for k in want), (got, want)
    one = kiln.load_plan(tmp_path / "one.kplan")
    assert [t.name for t in one.inputs] == ["rows"] and [t.name for t in one.outputs] == ["sums"]
    assert same_bits(one(rows=xs[-1])["sums"], want_one)
    # in a fresh process, which imports no tinygrad
    np.save(tmp_path / "x.npy", xs[-1])
    np.save(tmp_path / "scale.npy", scale)
    assert run_fresh(LOAD_AND_RUN, str(tmp_path / "mlp.kplan"), f"{tmp_path}/").strip() == "[]"
    assert all(same_bits(np.load(tmp_path / f"out-{k}.npy"), want[k]) for k in want)


def test_a_tinyjit_with_a_variable_saves_it_as_a_plan_variable(tmp_path):
    needs_tinygrad()
    from tinygrad import Tensor, TinyJit, Variable
    from tinygrad.helpers import Context

    @TinyJit
    def f(a, b, n):
        s = (a + b).contiguous()
        return (s * 2 + a), (s[:n] - b[:n]).exp().sum()

    n = Variable("n", 1, 64)
    rng = np.random.default_rng(3)
    runs = []
    with Context(DEV="KILN"):
        for size in (64, 17, 40, 5):
            a, b = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
            x, y = f(Tensor(a), Tensor(b), n.bind(size))
            runs.append((a, b, size, x.numpy(), y.numpy()))
        kiln.tinygrad.save_jit(f, tmp_path / "f.kplan")
    plan = kiln.load_plan(tmp_path / "f.kplan")
    assert [(v.name, v.min, v.max) for v in plan.variables] == [("n", 1, 64)]
    for a, b, size, x, y in runs:
        got = plan.run({"a": a, "b": b}, vars={"n": size})
        assert same_bits(got["output0"], x) and same_bits(got["output1"], y)


def test_save_jit_refuses_what_a_plan_cannot_hold(tmp_path):
    needs_tinygrad()
    from tinygrad import Tensor, TinyJit
    from tinygrad.helpers import Context

    x = np.ones((4, 4), np.float32)
    with Context(DEV="KILN"):
        @TinyJit
        def two_devices(a):
            return (a + 1).to("KILN:1") * 2

        @TinyJit
        def from_tinygrads_cpu(a):
            return (a.to("KILN") + 1) * 2

        @TinyJit
        def returns_its_input(a):
            return a, (a + 1).contiguous()

        cases = [(two_devices, lambda: Tensor(x), "a saved plan runs on one KILN device"),
                 (from_tinygrads_cpu, lambda: Tensor(x, device="CPU"), "runs on"),
                 (returns_its_input, lambda: Tensor(x), "output0 is not written by any of the JIT's calls")]
        for jit, make, message in cases:
            for _ in range(3):
                jit(make().realize())
            with pytest.raises(kiln.PlanSaveError, match=message):
                kiln.tinygrad.save_jit(jit, tmp_path / "refused.kplan")
            assert not (tmp_path / "refused.kplan").exists()


# ---------------------------------------------------------------------------------------------
# ONNX


def small_onnx_model(path: Path) -> None:
    """A convolution, ReLU, global pooling and a dense layer, with the names exporters write
    (`input.1`), an open batch dimension and two outputs."""
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install onnx==1.18.0)")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "conv.weight"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "conv.bias"),
             numpy_helper.from_array(rng.standard_normal((5, 8)).astype(np.float32) * 0.3, "fc.weight"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32) * 0.1, "fc.bias")]
    nodes = [helper.make_node("Conv", ["input.1", "conv.weight", "conv.bias"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["features"]),
             helper.make_node("GlobalAveragePool", ["features"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1)]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["N", 3, 12, 12])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 8, 12, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def test_an_onnx_model_compiles_to_a_plan_with_its_names(tmp_path):
    needs_tinygrad()
    small_onnx_model(tmp_path / "small.onnx")
    out = subprocess.run([sys.executable, "-m", "kiln.onnx", str(tmp_path / "small.onnx"), "-o", str(tmp_path / "small.kplan"),
                          "--json", str(tmp_path / "report.json")], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "equal tinygrad's on the same device, bit for bit" in out.stdout and "input.1 f32 [1, 3, 12, 12]" in out.stdout
    plan = kiln.load_plan(tmp_path / "small.kplan")
    assert [(t.name, t.shape) for t in plan.inputs] == [("input.1", [1, 3, 12, 12])]
    assert sorted((t.name, tuple(t.shape)) for t in plan.outputs) == [("features", (1, 8, 12, 12)), ("logits", (1, 5))]
    x = np.random.default_rng(5).standard_normal((1, 3, 12, 12)).astype(np.float32)
    got = plan({"input.1": x})

    # the CLI, by the same names: the same bits
    cli = built("kiln", "cargo build --release -p kiln")
    np.save(tmp_path / "x.npy", x)
    subprocess.run([str(cli), "run-plan", str(tmp_path / "small.kplan"), "--in", f"input.1={tmp_path / 'x.npy'}",
                    "--out", f"logits={tmp_path / 'logits.npy'}", "--out", f"features={tmp_path / 'features.npy'}"],
                   check=True, capture_output=True)
    for name in ("logits", "features"):
        assert same_bits(np.load(tmp_path / f"{name}.npy"), got[name])

    # and what the model computes: onnxruntime's outputs, where it is installed
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    session = ort.InferenceSession(str(tmp_path / "small.onnx"), providers=["CPUExecutionProvider"])
    logits, features = session.run(["logits", "features"], {"input.1": x})
    np.testing.assert_allclose(got["logits"], logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["features"], features, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["OPENCL", "WEBGPU"])
def test_the_cli_runs_an_onnx_models_plan_on_other_devices(tmp_path, backend):
    """A plan compiled from an ONNX model on the CPU runs through `kiln run-plan --device` on
    OpenCL and WebGPU, by the model's names, with the CPU plan's outputs (to float rounding: the
    backends' compilers may contract or order differently)."""
    needs_tinygrad()
    pytest.importorskip("onnx", reason="onnx is not installed")
    other = require(backend)
    small_onnx_model(tmp_path / "small.onnx")
    subprocess.run([sys.executable, "-m", "kiln.onnx", str(tmp_path / "small.onnx"), "-o", str(tmp_path / "small.kplan")],
                   check=True, capture_output=True)
    x = np.random.default_rng(6).standard_normal((1, 3, 12, 12)).astype(np.float32)
    want = kiln.load_plan(tmp_path / "small.kplan")({"input.1": x})
    cli = built("kiln", "cargo build --release -p kiln")
    np.save(tmp_path / "x.npy", x)
    out = subprocess.run([str(cli), "run-plan", str(tmp_path / "small.kplan"), "--device", other.name,
                          "--in", f"input.1={tmp_path / 'x.npy'}", "--out", f"logits={tmp_path / 'logits.npy'}",
                          "--out", f"features={tmp_path / 'features.npy'}", "--runs", "3", "--timings"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert f"on {other.name} in" in out.stderr and "2 more runs: median" in out.stderr, out.stderr
    for name in ("logits", "features"):
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), want[name], rtol=1e-5, atol=1e-6)


def test_the_onnx_command_says_what_it_needs(tmp_path, capsys):
    needs_tinygrad()
    import kiln.onnx

    small_onnx_model(tmp_path / "small.onnx")
    base = [str(tmp_path / "small.onnx"), "-o", str(tmp_path / "x.kplan")]
    for extra, message in [(["--input", "nope=1x2"], "--input names nope, which the model does not take"),
                           (["--input", "input.1=1x3x12"], "has 3 dimensions"),
                           (["--input", "input.1=1x4x12x12"], "dimension 1 is 4, the model fixes it at 3"),
                           (["--device", "CPU"], "not a KILN device")]:
        assert kiln.onnx.main(base + extra) == 1
        assert message in capsys.readouterr().err, extra
    assert not (tmp_path / "x.kplan").exists()
    for extra, message in [(["--input", "bad"], "expected NAME=SHAPE"), (["--int-range", "5,1"], "LOW <= HIGH")]:
        with pytest.raises(SystemExit) as e:
            kiln.onnx.main(base + extra)
        assert e.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(kiln.onnx.ModelError, match=r"open dimensions \['N', 3, 'H', 'W'\]: give its shape with --input"):
        spec = type("Spec", (), {"shape": ("N", 3, "H", "W"), "is_sequence": False})
        kiln.onnx.input_shapes({"x": spec}, {})
