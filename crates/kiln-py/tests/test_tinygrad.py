"""tinygrad programs on kiln's tinygrad device (`KILN`) against numpy.

Each test builds tensors on `KILN`, so every kernel tinygrad schedules is rendered to kiln text,
compiled through kiln's kernel cache and launched by kiln. The kiln backend is tinygrad's
renderer choice: kiln's CPU by default, kiln's OpenCL with `DEV=KILN:OPENCL` in the environment.
Skipped when tinygrad 0.14.0 (the version `kiln.tinygrad` is written against) is not installed.
"""

import importlib.metadata
import shutil

import numpy as np
import pytest
from conftest import INC, SHIFTED, require

tinygrad = pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install tinygrad==0.14.0)")
if importlib.metadata.version("tinygrad") != "0.14.0":
    pytest.skip("kiln.tinygrad is written against tinygrad 0.14.0", allow_module_level=True)

import kiln.tinygrad  # noqa: E402
from kiln.tinygrad.device import HEADER, KilnGraph, renderer_for  # noqa: E402
from tinygrad import Device, Tensor, TinyJit, Variable, dtypes  # noqa: E402
from tinygrad.engine.realize import graph_cache, run_linear  # noqa: E402
from tinygrad.helpers import DEV as TARGETS  # noqa: E402
from tinygrad.helpers import Context, GlobalCounters, Target  # noqa: E402
from tinygrad.codegen.opt import heuristic  # noqa: E402
from tinygrad.uop.ops import AxisType, Ops  # noqa: E402

kiln.tinygrad.install()
DEV = "KILN"
BACKEND = TARGETS.target(DEV).renderer or "CPU"


def t(x):
    return Tensor(np.asarray(x), device=DEV)


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_the_device_is_kiln():
    dev = Device[DEV]
    assert type(dev).__name__ == "KilnDevice"
    assert dev.kiln.name == BACKEND
    assert dev.renderer.has_local == dev.renderer.has_shared == (BACKEND != "CPU")


@pytest.mark.parametrize("backend", ["OPENCL", "CUDA", "WEBGPU"])
def test_gpu_renderers_take_work_group_limits_from_the_device(backend):
    props = require(backend).properties
    renderer = renderer_for(backend)(Target.parse(f"KILN:{backend}"))
    assert renderer.local_max == tuple(props["max_work_group_dims"])
    assert renderer.shared_max == min(props["local_memory_bytes"], kiln.MAX_LOCAL_BYTES)


def test_cuda_declares_tinygrads_tensor_cores_that_kiln_renders():
    """`declared_tensor_cores`: kiln's CUDA WMMA forms (sm_80: the six of `mma.sync`) are
    exactly tinygrad's `tc.cuda_sm80`; a form kiln lacks (fp8) is not declared."""
    from kiln.tinygrad.device import declared_tensor_cores
    from tinygrad.codegen.opt import tc

    sm80 = [(16, 8, 16, i, o, 32) for i, o in [("f16", "f32"), ("bf16", "f32"), ("f16", "f16")]]
    sm80 += [(16, 8, 8, "f16", "f32", 32), (16, 8, 8, "f16", "f16", 32), (16, 8, 8, "f32", "f32", 32)]
    assert declared_tensor_cores(sm80) == tc.cuda_sm80
    assert declared_tensor_cores(sm80[3:5]) == tc.cuda_sm75
    assert declared_tensor_cores([]) == []


@pytest.mark.skipif(BACKEND != "CUDA", reason="tensor cores: kiln's CUDA backend on a GPU")
def test_half_matmul_runs_on_tensor_cores():
    sources = []
    compiler = Device[DEV].compiler
    compile_ = compiler.compile
    compiler.compile = lambda src: sources.append(src) or compile_(src)
    try:
        a, b = rand(64, 96, seed=50).astype(np.float16), rand(96, 32, seed=51).astype(np.float16)
        with Context(CACHELEVEL=0):
            out = (t(a).matmul(t(b), dtype=dtypes.float32)).numpy()
    finally:
        compiler.compile = compile_
    np.testing.assert_allclose(out, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-2, atol=1e-2)
    assert any("WMMA" in s for s in sources), "no kernel used kiln's WMMA"


def test_a_kernel_tinygrad_cached_runs_again_after_a_device_reset():
    """A `KilnProgram` from before `kiln.Device.reset()` loads its kernel again into the new
    generation (tinygrad keeps programs across it) instead of failing with DeviceLostError."""
    x = rand(37, seed=54)
    np.testing.assert_array_equal((t(x) * 3).numpy(), x * 3)
    Device[DEV].kiln.reset()
    np.testing.assert_array_equal((t(x) * 3).numpy(), x * 3)


def test_smoke():
    assert (t([1, 2, 3]) + 1).tolist() == [2, 3, 4]


INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: np.dtype(d).name)
def test_integer_elementwise(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    a = rng.integers(max(info.min, -100), min(info.max, 100), 37).astype(dtype)
    b = rng.integers(1, min(info.max, 50), 37).astype(dtype)
    ta, tb = t(a), t(b)
    np.testing.assert_array_equal((ta + tb).numpy(), a + b)
    np.testing.assert_array_equal((ta * tb).numpy(), a * b)
    np.testing.assert_array_equal((ta - tb).numpy(), a - b)
    np.testing.assert_array_equal(ta.maximum(tb).numpy(), np.maximum(a, b))
    np.testing.assert_array_equal((ta < tb).numpy(), a < b)
    np.testing.assert_array_equal((ta == tb).where(ta, tb).numpy(), np.where(a == b, a, b))
    np.testing.assert_array_equal((ta ^ tb).numpy(), a ^ b)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_float_elementwise(dtype):
    if dtype == np.float64 and BACKEND == "WEBGPU":
        pytest.skip("WGSL has no 64-bit float (kiln's WebGPU renderer refuses f64 with a typed error)")
    a = rand(5, 7, seed=2, dtype=dtype)
    b = np.abs(rand(5, 7, seed=3, dtype=dtype)) + dtype(0.5)
    ta, tb = t(a), t(b)
    tol = {"rtol": 2e-3, "atol": 2e-3} if dtype == np.float16 else {"rtol": 1e-5, "atol": 1e-6}
    np.testing.assert_allclose((ta + tb).numpy(), a + b, **tol)
    np.testing.assert_allclose((ta / tb).numpy(), a / b, **tol)
    np.testing.assert_allclose(ta.exp().numpy(), np.exp(a), **tol)
    np.testing.assert_allclose(tb.log().numpy(), np.log(b), **tol)
    np.testing.assert_allclose(tb.sqrt().numpy(), np.sqrt(b), **tol)
    np.testing.assert_allclose(ta.sin().numpy(), np.sin(a), **tol)
    np.testing.assert_allclose(ta.relu().numpy(), np.maximum(a, 0), **tol)
    np.testing.assert_allclose((-ta).numpy(), -a, **tol)


def test_bool_elementwise():
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    np.testing.assert_array_equal((t(a) & t(b)).numpy(), a & b)
    np.testing.assert_array_equal((t(a) | t(b)).numpy(), a | b)
    np.testing.assert_array_equal(t(a).logical_not().numpy(), ~a)


def test_bfloat16_round_trip():
    a = np.array([1.0, -2.5, 3.25, 1024.0], np.float32)  # exact in bf16
    out = (t(a).cast(dtypes.bfloat16) * 2).cast(dtypes.float32).numpy()
    np.testing.assert_array_equal(out, a * 2)


def test_casts():
    a = np.array([-3.7, -0.5, 0.0, 2.9, 300.2], np.float32)
    np.testing.assert_array_equal(t(a).cast(dtypes.int32).numpy(), a.astype(np.int32))
    np.testing.assert_array_equal(t(a).cast(dtypes.bool).numpy(), a.astype(bool))
    i = np.array([1, -2, 70000], np.int32)
    np.testing.assert_array_equal(t(i).cast(dtypes.int16).numpy(), i.astype(np.int16))
    np.testing.assert_array_equal(t(a).bitcast(dtypes.uint32).numpy(), a.view(np.uint32))


def test_reductions():
    a = rand(7, 19, seed=4)
    ta = t(a)
    np.testing.assert_allclose(ta.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ta.sum().numpy(), a.sum(), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(ta.max(axis=0).numpy(), a.max(axis=0))
    np.testing.assert_array_equal(ta.argmax(axis=1).numpy(), a.argmax(axis=1))
    np.testing.assert_allclose(ta.mean().numpy(), a.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ta.var(axis=1).numpy(), a.var(axis=1, ddof=1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ta.cumsum(axis=1).numpy(), a.cumsum(axis=1), rtol=1e-5, atol=1e-5)


def test_nan_survives_elementwise_max_and_min_as_on_tinygrads_cpu():
    """tinygrad decomposes max as `a < b ? b : a` for its C renderers; on KILN too (kiln's MAX
    is fmax, which dropped the NaN): clip, maximum and minimum keep a NaN operand, the sign of
    a zero comes out as on DEV=CPU, and the max() reduction is tinygrad's own."""
    x, y = [1.0, np.nan, 3.0, np.inf], [2.0, 0.0, np.nan, -1.0]
    np.testing.assert_array_equal(t(x).clip(0, 2).numpy(), [1.0, np.nan, 2.0, 2.0])
    np.testing.assert_array_equal(t(x).maximum(t(y)).numpy(), [2.0, np.nan, 3.0, np.inf])
    np.testing.assert_array_equal(t(x).minimum(t(y)).numpy(), [1.0, np.nan, 3.0, -1.0])
    assert np.signbit(t([-0.0, 0.0]).max().numpy())  # -0.0 < 0.0 is false: the first stays


def test_matmul():
    a, b = rand(33, 17, seed=5), rand(17, 29, seed=6)
    np.testing.assert_allclose((t(a) @ t(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_batched_matmul():
    a, b = rand(3, 8, 5, seed=7), rand(3, 5, 6, seed=8)
    np.testing.assert_allclose((t(a) @ t(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_softmax_and_layernorm():
    a = rand(6, 10, seed=9)
    e = np.exp(a - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(t(a).softmax(axis=1).numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    norm = (a - a.mean(axis=1, keepdims=True)) / np.sqrt(a.var(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(t(a).layernorm(axis=1).numpy(), norm, rtol=1e-4, atol=1e-4)


def conv2d_reference(x, w, pad):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, o, oh, ow), np.float64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i : i + oh, j : j + ow], w[:, :, i, j])
    return out


def test_conv2d_with_padding():
    x, w = rand(2, 3, 9, 8, seed=10), rand(4, 3, 3, 3, seed=11)
    out = t(x).conv2d(t(w), padding=1).numpy()
    np.testing.assert_allclose(out, conv2d_reference(x, w, 1), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(BACKEND != "CPU", reason="kiln's register tile is for its CPU")
@pytest.mark.parametrize(
    "shape", ["matmul", "conv3x3_pad1_14x14", "conv1x1", "blocked_conv3x3_pad1_7x7", "blocked_conv3x3_stride2", "blocked_conv7x7_pad3_stride2",
              "blocked_conv3x3_pad1_13x13", "blocked_conv3x3_pad1_57x57", "grouped_conv1x1", "grouped_conv1x1_of_relu", "grouped_blocked8_conv1x1_7x7"]
)
def test_contractions_get_kilns_register_tile_and_stay_exact(monkeypatch, shape):
    """Every contraction gets a tile, and the results stay those of the reference: convolutions
    with ONNX's weight order and with `kiln.tinygrad.layout.blocked` (output channels as
    lanes, also where the image is 7 wide, strided, 7×7-windowed with padding, 13 wide (its 13
    rows whole) or 57 wide (its rows padded to 64), and grouped
    ones (ShuffleNet's: the output channels split by group, `tile._split_groups`), also of a
    ReLU fused into the image's read (`WHERE(0 < x, x, 0)` lanes) and with weights in blocks of
    8 within a group."""
    from kiln.tinygrad import layout, tile

    tiled = []
    choose = tile.contraction_tile
    monkeypatch.setattr(tile, "contraction_tile", lambda *a: tiled.append(r := choose(*a)) or r)
    if shape == "matmul":
        a, b = rand(64, 40, seed=40), rand(40, 96, seed=41)
        run, want = lambda: (t(a) @ t(b)).numpy(), a.astype(np.float64) @ b
    elif shape.startswith("grouped"):
        # 4 groups of 12 output channels over 14×14 pixels, or 2 of 16 (in blocks of 8) over 7×7
        groups, cout, hw = (2, 32, 7) if "blocked8" in shape else (4, 48, 14)
        x, w = rand(1, 16, hw, hw, seed=44), rand(cout, 16 // groups, 1, 1, seed=45)
        image = (lambda: t(x).relu()) if "relu" in shape else (lambda: t(x))
        weight = (lambda: layout.blocked(t(w), 0, 8)) if "blocked8" in shape else (lambda: t(w))
        run = lambda: image().conv2d(weight(), groups=groups).numpy()  # noqa: E731
        xs, ws = np.split(np.maximum(x, 0) if "relu" in shape else x, groups, 1), np.split(w, groups, 0)
        want = np.concatenate([conv2d_reference(xg, wg, 0) for xg, wg in zip(xs, ws)], 1)
    else:
        k = 7 if "7x7" in shape else 3 if "3x3" in shape else 1
        pad, stride, hw = k // 2, 2 if "stride2" in shape else 1, int(shape.rsplit("x", 1)[1]) if "pad1_" in shape else 7 if "_7x7" in shape else 14
        x, w = rand(1, 8, hw, hw, seed=42), rand(64, 8, k, k, seed=43)
        blocked = shape.startswith("blocked")
        weight = (lambda: layout.blocked(t(w), 0, 32)) if blocked else (lambda: t(w))
        run = lambda: t(x).conv2d(weight(), padding=pad, stride=stride).numpy()  # noqa: E731
        want = conv2d_reference(x, w, pad)[:, :, ::stride, ::stride]
    with Context(CACHELEVEL=0, PARALLEL=0):  # compiled here, by the patched heuristic
        out = run()
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    # the rows upcast, the lanes a loop of at least 4 (kiln unrolls it: `unroll_lane_loops`)
    tiles = [r for r in tiled if r is not None]
    upcasts = [o.arg for r in tiles for o in r.applied_opts if o.op.name == "UPCAST"]
    lanes = [rg.src[0].arg for r in tiles for rg in r.rngs if rg.arg[-1] is AxisType.LOOP]
    assert upcasts and lanes and min(lanes) >= 4, f"no register tile: {[r.applied_opts for r in tiles]}, lanes {lanes}"
    if "13x13" in shape:  # 13 rows of the image (no divisor up to 8) by 32 output channels, not 13 lanes
        assert (upcasts, lanes) == ([13], [32]), (upcasts, lanes)
    if "57x57" in shape:  # 57 rows padded to 64 (3 divide them at most): tiles of 8
        pads = [o.arg for r in tiles for o in r.applied_opts if o.op.name == "PADTO"]
        assert (pads, upcasts, lanes) == ([8], [8], [32]), (pads, upcasts, lanes)


@pytest.mark.parametrize("on_host", [False, True])
@pytest.mark.parametrize("cout,block", [(64, 32), (24, 32)])
def test_blocked_weights_keep_their_values_in_blocks_of_output_channels(cout, block, on_host):
    """`layout.blocked`: the same tensor, stored [cout/block, cin, kh, kw, block]; all of
    cout innermost where the block does not divide it. `blocked_on_host` stores the same bytes
    without a kernel (an ONNX model's weights: no kernel for tinygrad to lower per shape)."""
    from kiln.tinygrad import layout

    w = rand(cout, 5, 3, 3, seed=47)
    stored = (layout.blocked_on_host if on_host else layout.blocked)(t(w).realize(), 0, block)
    linear = stored.schedule_linear()
    assert len([c for c in linear.src if c.src[0].op is not Ops.COPY]) == (0 if on_host else 1)
    run_linear(linear)
    np.testing.assert_array_equal(stored.numpy(), w)
    b = block if cout % block == 0 else cout
    order = w.reshape(cout // b, b, 5, 3, 3).transpose(0, 2, 3, 4, 1).ravel()
    np.testing.assert_array_equal(np.frombuffer(stored.uop.base.buffer.as_memoryview(), np.float32), order)


class _Node:
    """An `OnnxRunner` graph node, as `layout.reorder_conv_weights` reads it."""

    def __init__(self, op, inputs, outputs, **opts):
        self.op, self.inputs, self.outputs, self.opts = op, inputs, outputs, opts


@pytest.mark.parametrize("cout,group,block", [(64, 1, 32), (48, 1, 32), (2 * 48, 2, 16), (4 * 136, 4, 8),
                                              (64, 64, None), (3 * 20, 3, None)])
def test_conv_weights_get_the_largest_block_that_divides_each_group(monkeypatch, cout, group, block):
    """`layout.reorder_conv_weights` blocks an ungrouped convolution's weights by two vectors of
    lanes (all of `cout` innermost where that does not divide it); a grouped one's by the largest
    of two vectors, one, or half of one that divides each group's channels (ShuffleNet's 136 per
    group: 8), and leaves a depthwise one, and one whose groups none divides, in ONNX's order."""
    from kiln.tinygrad import layout

    calls = []
    monkeypatch.setattr(layout, "blocked_on_host", lambda w, axis, b: calls.append((axis, b)) or w)
    runner = type("Runner", (), {})()
    runner.graph_values = {"w": Tensor.empty(cout, cout // group, 3, 3)}
    runner.graph_nodes = [_Node("Conv", ["x", "w"], ["y"], group=group)]
    runner.graph_outputs = ["y"]
    assert layout.reorder_conv_weights(runner, 32) == (0 if block is None else 1)
    assert calls == ([] if block is None else [(0, block)])


def test_padded_output_channels_reach_the_conv_replacement_by_name():
    """`layout.reorder_conv_weights(pad_outputs=True)` pads a 1000-channel convolution's weights
    and bias to 1024 and gives the node the option `layout.OUT_CHANNELS`; ONNX's `Conv` on kiln
    (`compat.padded_image_input`) takes that option by the same name. A convolution whose output
    is the graph's keeps its 1000."""
    import inspect

    from kiln.tinygrad import compat, layout

    def runner_with(output):
        runner = type("Runner", (), {})()
        runner.graph_values = {"w": Tensor.empty(1000, 8, 1, 1), "b": Tensor.zeros(1000).contiguous().realize()}
        runner.graph_nodes = [_Node("Conv", ["x", "w", "b"], ["h"]), _Node("Relu", ["h"], ["r"])]
        runner.graph_outputs = [output]
        return runner

    inner = runner_with("r")
    assert layout.reorder_conv_weights(inner, 32, pad_outputs=True) == 1
    assert inner.graph_nodes[0].opts == {layout.OUT_CHANNELS: 1000}
    assert inner.graph_values["w"].shape == (1024, 8, 1, 1) and inner.graph_values["b"].shape == (1024,)
    assert layout.OUT_CHANNELS in inspect.signature(compat.padded_image_input(lambda *a: None)).parameters
    last = runner_with("h")
    assert layout.reorder_conv_weights(last, 32, pad_outputs=True) == 1
    assert last.graph_nodes[0].opts == {} and last.graph_values["w"].shape == (1000, 8, 1, 1)


@pytest.mark.skipif(BACKEND != "CPU", reason="kiln's register tile is for its CPU")
@pytest.mark.parametrize("rows,packed", [(64, True), (4, False)])
def test_a_matrix_products_right_operand_is_packed_in_column_blocks(monkeypatch, rows, packed):
    """`layout.pack_contractions`: with at least `layout.MIN_ROWS` rows on the left, the
    schedule copies the right operand [N/32, K, 32] (blocked along its columns) before the
    product, one more kernel; the product is exact."""
    from kiln.tinygrad import layout

    seen = []
    pack = layout.pack_lane_operand
    monkeypatch.setattr(layout, "pack_lane_operand", lambda *a: seen.append(r := pack(*a)) or r)
    a, b = rand(rows, 40, seed=52), rand(40, 96, seed=53)
    ta, tb = t(a).realize(), t(b).realize()
    GlobalCounters.reset()
    out = (ta @ tb).numpy()
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert [r is not None for r in seen] == [packed]
    assert GlobalCounters.kernel_count == (2 if packed else 1)


def test_a_blocked_copy_stores_column_blocks_innermost():
    """`layout.blocked_uop`: the same values, stored [N/block, K, block]."""
    from kiln.tinygrad import layout

    b = rand(40, 96, seed=53)
    stored = Tensor(layout.blocked_uop(t(b).uop, 1, 32)).realize()
    np.testing.assert_array_equal(stored.numpy(), b)
    np.testing.assert_array_equal(np.frombuffer(stored.uop.base.buffer.as_memoryview(), np.float32), b.reshape(40, 3, 32).transpose(1, 0, 2).ravel())


def test_the_tile_leaves_other_reductions_to_tinygrad(monkeypatch):
    from kiln.tinygrad import tile

    tiled = []
    choose = tile.contraction_tile
    monkeypatch.setattr(tile, "contraction_tile", lambda *a: tiled.append(r := choose(*a)) or r)
    a = rand(32, 48, seed=44)
    with Context(CACHELEVEL=0, PARALLEL=0):
        out = t(a).sum(axis=1).numpy()
    np.testing.assert_allclose(out, a.sum(axis=1), rtol=1e-5, atol=1e-5)
    assert all(r is None for r in tiled), tiled


@pytest.mark.parametrize("equal", [False, True])
def test_a_concatenated_convolution_reduces_over_its_own_channels_only(monkeypatch, equal):
    """`kiln.tinygrad.concat`: the computed inputs of a concatenation are realized first, so a
    convolution's reduction is not fused into the concatenation (where it would run for every
    channel of the result, the others masked off): after the image it extends (DenseNet), and
    beside another convolution as wide (a SqueezeNet fire module, which tinygrad stacks)."""
    from kiln.tinygrad import tile

    outputs = []
    choose = tile.hand_coded_optimizations
    def record(k):
        if k.reduceop is not None:
            outputs.append(int(np.prod(k.output_shape)))
        return choose(k)

    monkeypatch.setattr(heuristic, "hand_coded_optimizations", record)
    hw = 6 if equal else 8  # another kernel than the other case's (tinygrad compiles each once)
    x, w, w2 = rand(1, 16, hw, hw, seed=45), rand(8, 16, 3, 3, seed=46), rand(8, 16, 3, 3, seed=47)
    with Context(CACHELEVEL=0, PARALLEL=0):
        first = t(x).conv2d(t(w2), padding=1) if equal else t(x)
        out = first.cat(t(x).conv2d(t(w), padding=1), dim=1).numpy()
    split = 8 if equal else 16
    np.testing.assert_allclose(out[:, :split], conv2d_reference(x, w2, 1) if equal else x, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[:, split:], conv2d_reference(x, w, 1), rtol=1e-4, atol=1e-4)
    # (two convolutions of one shape are one kernel, compiled once)
    assert outputs == [hw * hw * 8], f"the reductions wrote {outputs} elements, not a convolution's {hw}×{hw}×8"


def test_pooling():
    x = rand(1, 2, 6, 6, seed=12)
    expect = x.reshape(1, 2, 3, 2, 3, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(t(x).max_pool2d(kernel_size=2).numpy(), expect)
    np.testing.assert_allclose(t(x).avg_pool2d(kernel_size=2).numpy(), x.reshape(1, 2, 3, 2, 3, 2).mean(axis=(3, 5)), rtol=1e-5, atol=1e-6)


def test_padding():
    x = rand(3, 4, seed=13)
    np.testing.assert_array_equal(t(x).pad(((1, 2), (0, 3))).numpy(), np.pad(x, ((1, 2), (0, 3))))


def test_indexing_and_gather():
    x = rand(6, 9, seed=14)
    np.testing.assert_array_equal(t(x)[1:5, ::2].numpy(), x[1:5, ::2])
    np.testing.assert_array_equal(t(x)[:, 3].numpy(), x[:, 3])
    idx = np.random.default_rng(15).integers(0, 9, (6, 4)).astype(np.int32)
    np.testing.assert_array_equal(t(x).gather(1, t(idx)).numpy(), np.take_along_axis(x, idx, 1))
    rows = np.array([5, 0, 2], np.int32)
    np.testing.assert_array_equal(t(x)[t(rows)].numpy(), x[rows])


def test_setitem():
    x = rand(4, 5, seed=16)
    tx = t(x.copy())
    tx[1:3, 2] = 7.0
    x[1:3, 2] = 7.0
    np.testing.assert_array_equal(tx.numpy(), x)


def test_sort_and_topk():
    x = rand(12, seed=17)
    values, indices = t(x).topk(4)
    order = np.argsort(-x)[:4]
    np.testing.assert_array_equal(values.numpy(), x[order])
    np.testing.assert_array_equal(indices.numpy(), order)
    np.testing.assert_array_equal(t(x).sort()[0].numpy(), np.sort(x))


def test_symbolic_shape():
    x = rand(64, 8, seed=18)
    n = Variable("n", 1, 64)
    for size in (3, 10, 64):
        out = (t(x)[: n.bind(size)] * 2).sum()
        np.testing.assert_allclose(out.numpy(), (x[:size] * 2).sum(), rtol=1e-5, atol=1e-4)


def test_tinyjit_replays_with_new_inputs():
    @TinyJit
    def f(a, b):
        return ((a @ b).relu() + 1).realize()

    for seed in range(4):
        a, b = rand(8, 16, seed=seed), rand(16, 4, seed=seed + 10)
        out = f(t(a), t(b)).numpy()
        np.testing.assert_allclose(out, np.maximum(a @ b, 0) + 1, rtol=1e-4, atol=1e-4)
    assert f.cnt == 4 and f.captured is not None


def kiln_graphs(f: TinyJit) -> list[KilnGraph]:
    """The kiln plans behind a captured TinyJit's graphs."""
    asts = [c.src[0] for c in f.captured.linear.src if c.src[0].op is Ops.CUSTOM_FUNCTION and c.src[0].arg == "graph"]
    return [graph_cache[ast] for ast in asts]


def test_tinyjit_graphs_replay_as_kiln_plans_with_new_inputs_and_sizes():
    @TinyJit
    def f(a, b, n):
        s = (a + b).contiguous()
        return (s * 2 + a).realize(), (s[:n] - b[:n]).exp().sum().realize()

    n = Variable("n", 1, 64)
    for seed, size in [(0, 64), (1, 64), (2, 17), (3, 40), (4, 1)]:
        a, b = rand(64, seed=seed), rand(64, seed=seed + 10)
        x, y = f(t(a), t(b), n.bind(size))
        np.testing.assert_allclose(x.numpy(), (a + b) * 2 + a, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y.numpy(), np.exp(a[:size]).sum(), rtol=1e-5, atol=1e-5)
    graphs = kiln_graphs(f)
    assert graphs and all(isinstance(g, KilnGraph) for g in graphs), graphs
    assert sum(len(g.calls) for g in graphs) >= 2


class RefusingPlan:
    """A plan whose rebindings are all refused, as kiln refuses new inputs that alias."""

    def __init__(self, plan: kiln.Plan):
        self.plan = plan

    def rebind(self, bindings: object) -> None:
        raise kiln.LaunchError("refused for the test")

    def __getattr__(self, name: str) -> object:
        return getattr(self.plan, name)


def test_a_refused_rebinding_records_the_graph_again():
    @TinyJit
    def f(a, b):
        return ((a + b).contiguous() * a).realize()

    for seed in range(3):
        f(t(rand(16, seed=seed)), t(rand(16, seed=seed + 1)))
    (graph,) = kiln_graphs(f)
    graph.plan = RefusingPlan(graph.plan)  # type: ignore[assignment]
    a, b = rand(16, seed=7), rand(16, seed=8)
    np.testing.assert_allclose(f(t(a), t(b)).numpy(), (a + b) * a, rtol=1e-6)
    assert isinstance(graph.plan, kiln.Plan), "recorded again over the new inputs"


def test_beam_compiles_each_round_of_candidates_in_one_batch(monkeypatch):
    compiler = Device[DEV].renderer.compiler
    batches = []
    batch = compiler.compile_batch
    monkeypatch.setattr(compiler, "compile_batch", lambda sources: batches.append(len(sources)) or batch(sources))
    a, b = rand(8, 16, seed=30), rand(16, 8, seed=31)
    ta, tb = t(a).realize(), t(b).realize()
    with Context(BEAM=2, CACHELEVEL=0):  # no cached search result: BEAM searches
        out = (ta @ tb).numpy()
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    assert batches and max(batches) > 1, batches


def test_a_compile_batch_names_the_kernels_that_do_not_compile():
    bad = INC.replace("ADD f32", "FROB f32")
    assert Device[DEV].renderer.compiler.compile_batch([INC, bad, INC]) == {bad}


def test_random_is_reproducible():
    Tensor.manual_seed(3)
    a = Tensor.rand(1000, device=DEV).numpy()
    Tensor.manual_seed(3)
    b = Tensor.rand(1000, device=DEV).numpy()
    np.testing.assert_array_equal(a, b)
    assert 0.0 <= a.min() and a.max() < 1.0 and 0.4 < a.mean() < 0.6


def test_a_refused_launch_names_the_kernel():
    from tinygrad.device import TinyELF

    dev = Device[DEV]
    policy = dev.kiln.bounds_policy
    dev.kiln.bounds_policy = "refuse"
    try:
        sig = ((None, 0, dtypes.float32, (8,)), ("n", 1, dtypes.int32, ()))
        prg = dev.runtime(TinyELF(f"# {HEADER}shifted\n{SHIFTED}".encode(), "shifted", dev.renderer.target, sig))
        buf = dev.allocator.alloc(8 * 4)
        with pytest.raises(kiln.OutOfBoundsError, match="tinygrad kernel shifted"):
            prg(buf, vals=(8,))
            dev.synchronize()
    finally:
        dev.kiln.bounds_policy = policy


def test_tinyjit_replays_with_new_sizes():
    @TinyJit
    def f(a, n):
        return (a[:n] * 3).sum().realize()

    x = rand(32, 4, seed=19)
    n = Variable("n", 1, 32)
    for size in (5, 9, 17, 32):
        np.testing.assert_allclose(f(t(x), n.bind(size)).numpy(), (x[:size] * 3).sum(), rtol=1e-5, atol=1e-4)


def test_transfers_between_devices():
    if shutil.which("clang") is None:
        pytest.skip("tinygrad's own CPU device compiles with clang, which is not on PATH")
    x = rand(3, 5, seed=20)
    on_cpu = (t(x) + 1).to("CPU")
    np.testing.assert_array_equal(on_cpu.numpy(), x + 1)
    back = (Tensor(x, device="CPU") * 2).to(DEV)
    np.testing.assert_array_equal(back.numpy(), x * 2)


def test_transfer_to_a_second_kiln_device():
    """`KILN:1` is the backend's device 1: kiln's virtual `CPU:1`, or the one device again on a
    machine with one (the ordinals share it; more in test_tinygrad_multi.py)."""
    count = sum(1 for d in kiln.devices() if d.name.split(":")[0] == BACKEND and d.available)
    want = f"{BACKEND}:1" if BACKEND == "CPU" or count > 1 else BACKEND
    assert Device[f"{DEV}:1"].kiln.name == want
    x = rand(3, 5, seed=21)
    second = (t(x) - 1).to(f"{DEV}:1")
    np.testing.assert_array_equal((second * 2).numpy(), (x - 1) * 2)
