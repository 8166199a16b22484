"""Real ONNX models through tinygrad's `OnnxRunner` on kiln's tinygrad device (`KILN`) against
onnxruntime: a few of the models of `bench/onnx_models.py`, for correctness only (the benchmark
times them), prepared and run by the benchmark's own functions in this process.

SqueezeNet (random weights in the graph the onnx wheel ships), magika's file-type model,
PP-OCRv4 text recognition and PP-OCR's direction classifier (trained weights, from the wheels of
`bench/requirements-models.txt`). Skipped when tinygrad 0.14.0, onnx or onnxruntime is not
installed; a model is skipped when the package that carries it is not.
"""

import importlib.metadata
import os
import sys
from pathlib import Path

import pytest

tinygrad = pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install tinygrad==0.14.0)")
if importlib.metadata.version("tinygrad") != "0.14.0":
    pytest.skip("kiln.tinygrad is written against tinygrad 0.14.0", allow_module_level=True)
pytest.importorskip("onnx", reason="onnx is not installed (pip install onnx==1.18.0)")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install onnxruntime==1.31.1)")

import kiln.tinygrad  # noqa: E402
from tinygrad.helpers import Context  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import onnx_models  # noqa: E402

kiln.tinygrad.install()
MODELS = {m.name: m for m in onnx_models.models()}
# the kiln backend this process runs tinygrad on (`DEV=KILN:CUDA` runs these there; tinygrad keeps
# one KILN device per process, so switching backends inside it would mix CPU kernels and GPU buffers)
DEV = os.environ["DEV"] if os.environ.get("DEV", "").startswith("KILN") else "KILN"


@pytest.mark.parametrize("name", ["squeezenet", "magika", "ppocrv4_rec", "ppocr_cls"])
def test_model_matches_onnxruntime(name, tmp_path):
    model = MODELS[name]
    found = model.locate()
    if found is None:
        pytest.skip(f"{model.source} is not installed (see crates/kiln-py/bench/requirements-models.txt)")
    path, inputs = onnx_models.prepare(model, found, tmp_path)
    _, want = onnx_models.run_onnxruntime(str(path), inputs, iters=1)
    with Context(DEV=DEV):
        info, got = onnx_models.run_tinygrad(str(path), inputs, iters=1)
    assert info["renderer"].startswith("Kiln")
    assert info["kernels"] > 0  # the outputs checked come from a JIT replay (its warm-up ran on other inputs)
    result = onnx_models.compare(got, want, model)
    assert "error" not in result, result["error"]


def test_inputs_with_unknown_dimensions_take_any_size(tmp_path):
    """`kiln.tinygrad.onnx_inputs`: -1 and "?" dimensions are open ones, each its own."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    from tinygrad import Tensor
    from tinygrad.nn.onnx import OnnxRunner

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3, "?", "?"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1  # what paddle2onnx writes
    data = np.linspace(-1, 1, 2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    onnx.save(model, str(tmp_path / "relu.onnx"))
    with Context(DEV=DEV):
        got = OnnxRunner(str(tmp_path / "relu.onnx"))({"x": Tensor(data)})["y"].numpy()
    np.testing.assert_array_equal(got, np.maximum(data, 0))


def run_graph(tmp_path, monkeypatch, nodes, arrays, x_shape, y_shape, seed):
    """A one-input, one-output ONNX graph (`arrays`: its initializers' shapes, random values) run
    on onnxruntime and on `DEV` (kernels compiled here, by kiln's tile heuristic); returns
    (tinygrad's output, onnxruntime's, the tiles chosen as (scheduler, tile or None), whether the
    device tiles contractions: kiln's CPU)."""
    import numpy as np
    import onnx
    from kiln.tinygrad import tile
    from onnx import TensorProto, helper, numpy_helper
    from tinygrad import Device, Tensor
    from tinygrad.nn.onnx import OnnxRunner

    tiles = []
    choose = tile.contraction_tile
    monkeypatch.setattr(tile, "contraction_tile", lambda k, *a: tiles.append((k, r := choose(k, *a))) or r)
    rng = np.random.default_rng(seed)
    init = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in arrays.items()]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=init)
    path = tmp_path / "graph.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    data = rng.standard_normal(x_shape).astype(np.float32)
    _, want = onnx_models.run_onnxruntime(str(path), {"x": data}, iters=1)
    with Context(DEV=DEV, CACHELEVEL=0, PARALLEL=0):
        got = OnnxRunner(str(path))({"x": Tensor(data)})["y"].numpy()
        cpu = getattr(Device[Device.DEFAULT].renderer, "contraction_tiles", False)
    return got, want["y"], tiles, cpu


def test_convolution_weights_are_stored_in_blocks_of_output_channels(tmp_path, monkeypatch):
    """On kiln's CPU: `kiln.tinygrad.layout` stores the weights of an ungrouped Conv and of one
    with 32 output channels per group in blocks of output channels (a depthwise one keeps ONNX's
    order), and both get register tiles; a GlobalMaxPool's input is realized, so the convolution
    before it is not fused into the pooling. The results stay onnxruntime's."""
    import numpy as np
    from kiln.tinygrad import layout
    from onnx import helper
    from tinygrad.uop.ops import Ops

    reordered = []
    reorder = layout.reorder_conv_weights
    monkeypatch.setattr(layout, "reorder_conv_weights", lambda r, b, **kw: reordered.append(reorder(r, b, **kw)))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["h", "gw"], ["g"], pads=[1, 1, 1, 1], group=2),
        helper.make_node("Conv", ["g", "dw"], ["d"], pads=[1, 1, 1, 1], group=64),
        helper.make_node("GlobalMaxPool", ["d"], ["y"]),
    ]
    weights = {"w": (64, 4, 3, 3), "gw": (64, 32, 3, 3), "dw": (64, 1, 3, 3)}
    got, want, tiles, cpu = run_graph(tmp_path, monkeypatch, nodes, weights, (1, 4, 14, 14), (1, 64, 1, 1), 48)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if cpu:
        assert reordered == [2]
        kernels = [(k.full_shape, k.reduceop.arg[0], r is not None) for k, r in tiles if k.reduceop is not None]
        # every convolution gets a tile (the depthwise one rows of its own: its image, padded
        # first, varies along both axes), and the pooling is a kernel of its own: a max over the
        # realized 64×7×7 output
        assert [tiled for _, _, tiled in kernels] == [True, True, True, False], kernels
        assert kernels[-1][:2] == ([64, 49], Ops.MAX), kernels


def test_output_channels_are_padded_to_whole_blocks_and_cut_back(tmp_path, monkeypatch):
    """On kiln's CPU: an ungrouped Conv with 1000 output channels (SqueezeNet's last) gets weights
    and bias padded with zeros to 1024 (`layout.padded_outputs`), so its tile's lanes are whole
    vectors; the output keeps ONNX's 1000 channels and onnxruntime's values. One whose output is
    the graph's (which must be a whole tensor) keeps its own 1000."""
    import numpy as np
    from onnx import helper

    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Conv", ["r", "v"], ["y"]),
    ]
    arrays = {"w": (1000, 8, 1, 1), "b": (1000,), "v": (1000, 1000, 1, 1)}
    got, want, tiles, cpu = run_graph(tmp_path, monkeypatch, nodes, arrays, (1, 8, 13, 13), (1, 1000, 13, 13), 49)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    if cpu:
        shapes = [k.full_shape for k, r in tiles if k.reduceop is not None and r is not None]
        # the first convolution's 1024 output channels (in blocks of 32) over 169 pixels, summing 8
        assert any(s[-2:] == [169, 8] and np.prod(s[:-2]) == 1024 for s in shapes), shapes
        assert any(s[-2:] == [169, 1000] and np.prod(s[:-2]) == 1000 for s in shapes), shapes


@pytest.mark.parametrize("form", ["kernel_is_stride", "overlapping"])
def test_transposed_convolutions_match_onnxruntime(tmp_path, monkeypatch, form):
    """On kiln's CPU a ConvTranspose whose kernel is its stride (PP-OCR's 2×2 by 2) is a 1×1
    convolution with a register tile, its channels spread over the pixels
    (`compat.strided_transpose_as_product`); one whose taps overlap (3×3 by 2) keeps tinygrad's
    form. Both give onnxruntime's values."""
    import numpy as np
    from onnx import helper

    k = 2 if form == "kernel_is_stride" else 3
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2])
    out = 2 * 10 if k == 2 else 2 * 9 + 3
    arrays = {"w": (16, 24, k, k), "b": (24,)}
    got, want, tiles, cpu = run_graph(tmp_path, monkeypatch, [node], arrays, (1, 16, 10, 10), (1, 24, out, out), 50)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if cpu:
        # the product: 16 input channels summed into 24·2·2 channels of 100 pixels, tiled
        products = [k.full_shape for k, r in tiles if r is not None and k.full_shape[-1] == 16]
        assert bool(products) == (form == "kernel_is_stride"), products


def test_empty_constant_tensors_load(tmp_path):
    """`kiln.tinygrad.onnx_tensors`: a tensor with no elements and no data field (as paddle2onnx
    writes PP-OCRv4's detector) loads as an empty tensor."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    from tinygrad import Tensor
    from tinygrad.nn.onnx import OnnxRunner

    empty = helper.make_tensor("e", TensorProto.FLOAT, [0], [])
    assert not any(empty.HasField(f) for f in ("raw_data",)) and not empty.float_data
    nodes = [helper.make_node("Constant", [], ["e"], value=empty), helper.make_node("Concat", ["x", "e"], ["y"], axis=0)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 13)]),
              str(tmp_path / "empty.onnx"))
    data = np.arange(4, dtype=np.float32)
    with Context(DEV=DEV):
        got = OnnxRunner(str(tmp_path / "empty.onnx"))({"x": Tensor(data)})["y"].numpy()
    np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 2, 1, 0], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 2, 1, 0])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)),
])
def test_padded_pools_compute_tinygrads_bits(tmp_path, monkeypatch, op, attrs):
    """On kiln's CPU, ONNX's MaxPool, and AveragePool with `count_include_pad=1`, of stride 1
    pad a padded input first (`compat._pool_padding`: not with `ceil_mode`); every pool gives
    tinygrad's CPU device's bits, and onnxruntime's values."""
    import numpy as np
    import onnx
    from kiln.tinygrad import compat
    from onnx import TensorProto, helper
    from tinygrad import Tensor
    from tinygrad.nn.onnx import OnnxRunner

    padded = []
    padding = compat._pool_padding
    monkeypatch.setattr(compat, "_pool_padding", lambda *a: padded.append(r := padding(*a)) or r)
    shape = (1, 4, 9, 20)  # rows of 20: more than a vector's lanes
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g", [x], [y])
    path = str(tmp_path / "pool.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    data = np.random.default_rng(51).standard_normal(shape).astype(np.float32)
    data[0, 0, :3] = -np.abs(data[0, 0, :3])  # windows of negatives only, at the padded edge
    outs = {}
    for dev in (DEV, "CPU"):
        with Context(DEV=dev):
            outs[dev] = OnnxRunner(path)({"x": Tensor(data)})["y"].numpy()
    _, want = onnx_models.run_onnxruntime(path, {"x": data}, iters=1)
    np.testing.assert_allclose(outs[DEV], want["y"], rtol=1e-6, atol=1e-6)
    assert outs[DEV].tobytes() == outs["CPU"].tobytes()
    from tinygrad import Device
    with Context(DEV=DEV):
        cpu = getattr(Device[Device.DEFAULT].renderer, "contraction_tiles", False)
    if cpu:
        first = (not attrs.get("ceil_mode") and "strides" not in attrs
                 and (op == "MaxPool" or attrs.get("count_include_pad") == 1))
        assert any(p is not None for p in padded) == first, padded
