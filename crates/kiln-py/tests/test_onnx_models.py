"""Real ONNX models through tinygrad's `OnnxRunner` on kiln's tinygrad device (`KILN`) against
onnxruntime: a few of the models of `bench/onnx_models.py`, for correctness only (the benchmark
times them), prepared and run by the benchmark's own functions in this process.

SqueezeNet (random weights in the graph the onnx wheel ships), magika's file-type model and
PP-OCRv4 text recognition (trained weights, from the wheels of
`bench/requirements-models.txt`). Skipped when tinygrad 0.14.0, onnx or onnxruntime is not
installed; a model is skipped when the package that carries it is not.
"""

import importlib.metadata
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


@pytest.mark.parametrize("name", ["squeezenet", "magika", "ppocrv4_rec"])
def test_model_matches_onnxruntime(name, tmp_path):
    model = MODELS[name]
    found = model.locate()
    if found is None:
        pytest.skip(f"{model.source} is not installed (see crates/kiln-py/bench/requirements-models.txt)")
    path, inputs = onnx_models.prepare(model, found, tmp_path)
    _, want = onnx_models.run_onnxruntime(str(path), inputs, iters=1)
    with Context(DEV="KILN"):
        info, got = onnx_models.run_tinygrad(str(path), inputs, iters=1)
    assert info["renderer"].startswith("Kiln")
    assert info["kernels"] > 0  # the outputs checked come from a JIT replay (its warm-up ran on other inputs)
    result = onnx_models.compare(got, want, model)
    assert "error" not in result, result["error"]
