"""tinygrad's programs for KILN devices kept between processes (`kiln.tinygrad.lowered`): a
second process reads the programs the first lowered, lowers none of them again and computes the
same bits; a changed setting or `CACHELEVEL=0` lowers again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tinygrad")

# A convolution (kiln's register tile), a matrix product with a bias and a softmax: one process,
# which prints how many kernels tinygrad lowered, the outputs' bytes and the kernels' sources.
PROGRAM = r"""
import json, sys
import numpy as np
from tinygrad import Tensor
from tinygrad import codegen

lowered = 0
lower = codegen.do_to_program
def counting(*args):
    global lowered
    lowered += 1
    return lower(*args)
codegen.do_to_program = counting

rng = np.random.default_rng(0)
x = Tensor(rng.standard_normal((1, 8, 12, 12), dtype=np.float32))
w = Tensor(rng.standard_normal((16, 8, 3, 3), dtype=np.float32))
m = Tensor(rng.standard_normal((16 * 10 * 10, 32), dtype=np.float32))
b = Tensor(rng.standard_normal((32,), dtype=np.float32))
y = (x.conv2d(w).relu().reshape(1, -1) @ m + b).softmax()
out = y.numpy()
sources = sorted(p.src[2].arg for p in codegen.to_program_cache.values())
print(json.dumps({"lowered": lowered, "out": out.tobytes().hex(), "sources": sources}))
"""


def run(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # in-process lowering (no worker pool), so that every kernel lowered is counted
    return {**os.environ, "DEV": "KILN", "PARALLEL": "0", "CACHEDB": str(tmp_path / "tinygrad.db"),
            "KILN_CACHE_DIR": str(tmp_path / "kiln")}


def test_a_second_process_lowers_nothing_and_computes_the_same_bits(env: dict[str, str]) -> None:
    first = run(env)
    assert first["lowered"] >= 3
    second = run(env)
    assert second["lowered"] == 0
    assert second["out"] == first["out"]
    assert second["sources"] == first["sources"]


def test_another_setting_or_cachelevel_0_lowers_again(env: dict[str, str]) -> None:
    first = run(env)
    assert first["lowered"] >= 3
    # NOOPT is one of the settings tinygrad keys its programs by: other programs, lowered anew
    noopt = run({**env, "NOOPT": "1"})
    assert noopt["lowered"] >= 3 and noopt["sources"] != first["sources"]
    # tinygrad's switch for its disk cache turns this one off too
    off = {**env, "CACHEDB": env["CACHEDB"] + ".off", "CACHELEVEL": "0"}
    assert run(off)["lowered"] == first["lowered"]
    assert run(off)["lowered"] == first["lowered"]


def test_the_key_changes_with_the_device_the_renderer_renders_for() -> None:
    from types import SimpleNamespace

    from kiln.tinygrad import lowered
    from tinygrad import Tensor

    ast = Tensor.ones(4).contiguous().schedule_linear().src[0].src[0]  # one kernel's AST

    def renderer(vector_bytes: int) -> SimpleNamespace:
        device = SimpleNamespace(properties={"threads": 2, "vector_bytes": vector_bytes})
        return SimpleNamespace(device=device, target=None, global_max=(2, 0, 0), supports_float4=True)

    assert lowered.disk_key(ast, renderer(64)) == lowered.disk_key(ast, renderer(64))
    assert lowered.disk_key(ast, renderer(64)) != lowered.disk_key(ast, renderer(32))


def test_gpu_devices_lower_as_before(env: dict[str, str]) -> None:
    # tinygrad tunes a GPU kernel's work-group size from its lowered graph: only kiln's CPU
    # devices keep their programs
    from conftest import require

    require("OPENCL")
    gpu = {**env, "DEV": "KILN:OPENCL"}
    first = run(gpu)
    assert first["lowered"] >= 3
    assert run(gpu)["lowered"] == first["lowered"]
