"""kiln's changes to tinygrad (`kiln.tinygrad.compat.PATCHES`): a target that no longer has the
expected shape is skipped with one warning naming it, and with kiln's wheel installed tinygrad's
own `CPU` device computes exactly what it computes without it. Each case runs in fresh
processes: `python -S` with tinygrad's site-packages on the path is tinygrad without kiln's
start-up hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig

import pytest

pytest.importorskip("tinygrad")

SITE = sysconfig.get_paths()["purelib"]

# tinygrad without kiln's hook, two of its internals changed as a later tinygrad might change
# them, then kiln's install: which patches warn, and which names are left as they were
SKIPS = rf"""
import json, sys, warnings
sys.path.append({SITE!r})
import tinygrad
from tinygrad.engine import jit, realize
def graph_split_rewrite(linear, max_batch_size, *, new_option=False):
    return linear
jit.graph_split_rewrite = graph_split_rewrite
del realize.lower_and_compile
import tinygrad.nn.onnx
import kiln.tinygrad
from kiln.tinygrad import compat
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    kiln.tinygrad.install()
    kiln.tinygrad.install()
print(json.dumps({{
    "warned": [str(w.message) for w in caught if issubclass(w.category, compat.KilnPatchWarning)],
    "kept": jit.graph_split_rewrite is graph_split_rewrite,
    "applied": sorted(compat.APPLIED),
}}))
"""


def run(code: str, *flags: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_target_that_changed_is_skipped_with_one_warning_naming_it():
    from kiln.tinygrad import compat

    out = json.loads(run(SKIPS, "-S"))
    changed = ["tinygrad.engine.jit:graph_split_rewrite", "tinygrad.engine.realize:lower_and_compile"]
    assert [w.split(" (")[0] for w in out["warned"]] == [f"kiln.tinygrad: not applying {t}" for t in changed], out["warned"]
    assert "new_option" in out["warned"][0] and "not found" in out["warned"][1], out["warned"]
    assert out["kept"], "a skipped target was replaced anyway"
    assert out["applied"] == sorted(p.target for p in compat.PATCHES if p.target not in changed)


# tinygrad's CPU device: a training loop (conv, batch norm, Adam), a matmul chain and an ONNX
# model with a convolution and a global pool; every result's bytes, hashed
PROGRAM = rf"""
import hashlib, sys
if {{"-S"}} & set(sys.orig_argv):
    sys.path.append({SITE!r})
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tinygrad import Tensor, TinyJit, nn
from tinygrad.helpers import Context
from tinygrad.nn.onnx import OnnxRunner
digest = hashlib.sha256()
rng = np.random.default_rng(3)
Tensor.manual_seed(3)
class Net:
    def __init__(self):
        self.c, self.bn, self.l = nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.Linear(16 * 8 * 8, 10)
    def __call__(self, x):
        return self.l(self.bn(self.c(x)).relu().flatten(1))
net = Net()
opt = nn.optim.Adam(nn.state.get_parameters(net), lr=1e-3)
x, y = Tensor(rng.standard_normal((8, 3, 10, 10), dtype=np.float32)), Tensor(rng.integers(0, 10, 8))
@TinyJit
def step():
    opt.zero_grad()
    loss = net(x).sparse_categorical_crossentropy(y).backward()
    opt.step()
    return loss.realize()
with Context(TRAINING=1):
    for _ in range(4):
        digest.update(step().numpy().tobytes())
for p in nn.state.get_parameters(net):
    digest.update(p.numpy().tobytes())
a, b = rng.standard_normal((64, 48), dtype=np.float32), rng.standard_normal((48, 96), dtype=np.float32)
digest.update(((Tensor(a) @ Tensor(b)).relu() @ Tensor(b.T)).numpy().tobytes())
w = numpy_helper.from_array(rng.standard_normal((32, 3, 3, 3), dtype=np.float32), "w")
nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("GlobalAveragePool", ["h"], ["y"])]
graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 1, 1])], initializer=[w])
model = OnnxRunner(Tensor(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()))
digest.update(model({{"x": Tensor(rng.standard_normal((1, 3, 16, 16), dtype=np.float32))}})["y"].numpy().tobytes())
compat = sys.modules.get("kiln.tinygrad.compat")
print(digest.hexdigest(), len(compat.APPLIED) if compat else 0)
"""


def test_tinygrads_cpu_device_computes_the_same_with_and_without_kilns_wheel(tmp_path):
    pytest.importorskip("onnx")
    env = {"DEV": "CPU", "CACHELEVEL": "0"}
    from kiln.tinygrad import compat

    with_kiln, applied = run(PROGRAM, env=env).split()
    without, none = run(PROGRAM, "-S", env=env).split()
    assert (int(applied), int(none)) == (len(compat.PATCHES), 0), "kiln's hook did not run where expected"
    assert with_kiln == without


# a module of kiln.tinygrad imported before tinygrad: tinygrad's import applies the table while
# that module is still being imported
FIRST = r"""
import importlib, sys
importlib.import_module(sys.argv[1])
import numpy as np
from tinygrad import Tensor
from kiln.tinygrad import compat, originals
a, b = np.arange(64 * 40, dtype=np.float32).reshape(64, 40) / 64, np.ones((40, 96), np.float32)
c = (Tensor(a, device="KILN") @ Tensor(b, device="KILN")).numpy()
assert np.array_equal(c, a @ b), "wrong product"
print(sorted(compat.APPLIED) == sorted(originals.REPLACED), len(compat.APPLIED))
"""


@pytest.mark.parametrize("module", ["compat", "tile", "lowered", "beam", "device", "layout"])
def test_kiln_modules_imported_before_tinygrad_apply_the_whole_table(module):
    from kiln.tinygrad import compat

    done = subprocess.run([sys.executable, "-c", FIRST, f"kiln.tinygrad.{module}"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "CACHELEVEL": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    core = sum(1 for p in compat.PATCHES if not p.target.startswith(compat.ONNX + ":"))
    assert done.stdout.split() == ["True", str(core)], done.stdout + done.stderr[-2000:]



@pytest.mark.parametrize("stride", [1, 2])
def test_a_depthwise_convolution_padded_first_gives_the_same_bits(stride):
    """`compat.padded_image_input` (ONNX `Conv` on kiln's CPU): the padded image is realized
    before a grouped convolution, and the result is tinygrad's own, bit for bit."""
    import numpy as np
    from tinygrad import Tensor

    from kiln.tinygrad import compat, originals

    onnx = pytest.importorskip("tinygrad.nn.onnx")
    conv = onnx.onnx_ops["Conv"]
    assert "tinygrad.nn.onnx:onnx_ops[Conv]" in compat.APPLIED and "tinygrad.nn.onnx:onnx_ops[Conv]" in originals.REPLACED
    tinygrads = originals.tinygrad("tinygrad.nn.onnx:onnx_ops[Conv]")
    rng = np.random.default_rng(5)
    x = Tensor(rng.standard_normal((1, 24, 10, 32), dtype=np.float32), device="KILN").realize()
    w = Tensor(rng.standard_normal((24, 1, 5, 5), dtype=np.float32), device="KILN").realize()
    args = dict(group=24, pads=[2, 2, 2, 2], strides=stride)
    got, want = conv(x, w, **args).numpy(), tinygrads(x, w, **args).numpy()
    assert got.shape == want.shape and got.tobytes() == want.tobytes()
