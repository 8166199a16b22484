"""tinygrad on several KILN devices (`Tensor.shard`) against the same program on one.

`KILN:n` is kiln's device n of the backend (`kiln.tinygrad.device.kiln_device`): on kiln's CPU
the virtual device `CPU:n`, with its own queues and threads. tinygrad splits a sharded tensor
over the devices, copies between them and builds its all-reduce from copies and kernels; a
TinyJit of that work is one `kiln.Plan` spanning the devices (`KilnGraph`). Each result here is
compared with the same computation on one KILN device (and numpy). The OpenCL case runs in a
child process (`DEV=KILN:OPENCL` is process-wide), where the ordinals share this machine's one
PoCL device if it has only one. Skipped without tinygrad 0.14.0.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import require

tinygrad = pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install tinygrad==0.14.0)")
if importlib.metadata.version("tinygrad") != "0.14.0":
    pytest.skip("kiln.tinygrad is written against tinygrad 0.14.0", allow_module_level=True)

import kiln.tinygrad  # noqa: E402
from kiln.tinygrad.device import KilnGraph, KilnProgram, kiln_device, shares_plan, with_device_num  # noqa: E402
from tinygrad import Device, Tensor, TinyJit, nn  # noqa: E402
from tinygrad.engine.realize import graph_cache  # noqa: E402
from tinygrad.helpers import DEV as TARGETS  # noqa: E402
from tinygrad.helpers import Context  # noqa: E402
from tinygrad.uop.ops import Ops  # noqa: E402

kiln.tinygrad.install()
DEV = "KILN"
BACKEND = TARGETS.target(DEV).renderer or "CPU"
DEVS = tuple(f"{DEV}:{i}" for i in range(4))
RTOL, ATOL = 1e-5, 1e-6


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def sharded(x, axis, devices=DEVS):
    return Tensor(x, device=DEV).shard(devices, axis=axis).realize()


def graphs_of(f: TinyJit) -> list:
    """The captured TinyJit's calls: a `KilnGraph` for each graph, else the call's op."""
    return [graph_cache[c.src[0]] if c.src[0].op is Ops.CUSTOM_FUNCTION and c.src[0].arg == "graph" else c.src[0].op
            for c in f.captured.linear.src]


def the_plan(f: TinyJit) -> KilnGraph:
    """The one kiln plan a captured TinyJit replays (fails unless it is exactly one)."""
    calls = graphs_of(f)
    assert len(calls) == 1 and isinstance(calls[0], KilnGraph), calls
    return calls[0]


def kiln_devices_of(graph: KilnGraph) -> set:
    """The kiln devices whose buffers the graph's calls use."""
    return {b.ensure_allocated()._buf.device for _, _, bufs, _ in graph.calls for b in bufs}


class PlanCounter:
    """Counts the `kiln.Plan`s made while installed (`kiln.Plan` is a native class: wrapped)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.made = 0
        plan = kiln.Plan

        def counting(*args, **kwargs):
            self.made += 1
            return plan(*args, **kwargs)

        monkeypatch.setattr(kiln, "Plan", counting)


def test_kiln_ordinals_are_the_backends_devices():
    names = [Device[d].kiln.name for d in DEVS]
    assert names == [kiln_device(BACKEND, i).name for i in range(4)]
    if BACKEND == "CPU":
        assert names == ["CPU", "CPU:1", "CPU:2", "CPU:3"]


def test_ordinals_past_the_backends_devices_share_them():
    dev = require("OPENCL")
    count = sum(1 for d in kiln.devices() if d.available and d.name.split(":")[0] == "OPENCL")
    assert kiln_device("OPENCL", 0).name == dev.name
    assert kiln_device("OPENCL", count).name == dev.name
    assert kiln_device("OPENCL", count + 1).name == kiln_device("OPENCL", 1 % count).name


def test_copies_between_kiln_devices():
    x = rand(5, 7, seed=1)
    on2 = Tensor(x, device=DEVS[0]).to(DEVS[2]).realize()
    assert on2.uop.buffer._buf.device == Device[DEVS[2]].kiln.name
    on3 = (on2 * 2).to(DEVS[3]) - 1
    np.testing.assert_array_equal(on3.numpy(), x * 2 - 1)


@pytest.mark.parametrize("axes", [(0, None), (None, 1), (1, 0)], ids=["rows", "columns", "contraction"])
def test_a_sharded_matmul_matches_one_device(axes):
    a, b = rand(64, 48, seed=2), rand(48, 32, seed=3)
    one = (Tensor(a, device=DEV) @ Tensor(b, device=DEV)).numpy()
    out = sharded(a, axes[0]) @ sharded(b, axes[1])
    assert out.device == tuple(Device.canonicalize(d) for d in DEVS)
    np.testing.assert_allclose(out.numpy(), one, rtol=RTOL, atol=1e-5)
    np.testing.assert_allclose(one, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


# tinygrad's all-reduce algorithms (`tinygrad.schedule.allreduce`), forced by its variables
ALLREDUCES = {"naive": {"RING": 0, "ALL2ALL": 0}, "ring": {"RING": 2, "ALL2ALL": 0}, "all2all": {"ALL2ALL": 2}}


@pytest.mark.parametrize("algorithm", sorted(ALLREDUCES))
def test_an_all_reduce_runs_inside_one_kiln_plan(algorithm):
    """A sum over the sharded axis is tinygrad's all-reduce: copies between the four devices and
    kernels adding the parts, all in one plan, replayed with new inputs."""
    with Context(**ALLREDUCES[algorithm]):
        f = TinyJit(lambda x: x.sum(0).realize())
        for seed in range(4):
            x = rand(64, 40, seed=10 + seed)
            one = Tensor(x, device=DEV).sum(0).numpy()
            np.testing.assert_allclose(f(sharded(x, 0)).numpy(), one, rtol=RTOL, atol=1e-5)
    graph = the_plan(f)
    copies = [bufs for _, ast, bufs, _ in graph.calls if ast.op is Ops.COPY]
    assert copies and all(dst.device != src.device for dst, src in copies)
    assert len(graph.plan) == len(graph.calls)
    assert kiln_devices_of(graph) == {Device[d].kiln.name for d in DEVS}


class MLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(24, 32), nn.Linear(32, 5)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def train(devices: tuple, steps: int, counter: PlanCounter) -> dict:
    """`steps` TinyJit SGD steps of `MLP` (the same initial weights and batches), the batch
    sharded over `devices` (one device: not sharded). Returns the weights, losses, the JIT and
    the plans made by each step."""
    Tensor.manual_seed(5)
    model = MLP()
    params = nn.state.get_parameters(model)
    for p in params:
        p.to_(devices if len(devices) > 1 else devices[0]).realize()
    opt = nn.optim.SGD(params, lr=0.1, momentum=0.9)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            return loss.realize(*opt.schedule_step())

    rng = np.random.default_rng(6)
    losses, plans = [], []
    for _ in range(steps):
        x = Tensor(rng.standard_normal((16, 24)).astype(np.float32), device=devices[0])
        y = Tensor(rng.integers(0, 5, 16).astype(np.int32), device=devices[0])
        if len(devices) > 1:
            x, y = x.shard(devices, axis=0).realize(), y.shard(devices, axis=0).realize()
        made = counter.made
        losses.append(step(x, y).item())
        plans.append(counter.made - made)
    return {"weights": [p.numpy() for p in params], "losses": losses, "jit": step, "plans": plans}


@pytest.fixture(scope="module")
def trained():
    with pytest.MonkeyPatch.context() as mp:
        counter = PlanCounter(mp)
        return {"one": train((DEV,), 5, counter), "four": train(DEVS, 5, counter)}


def test_data_parallel_training_on_four_devices_matches_one_device(trained):
    one, four = trained["one"], trained["four"]
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=RTOL)
    for w4, w1 in zip(four["weights"], one["weights"]):
        np.testing.assert_allclose(w4, w1, rtol=RTOL, atol=ATOL)
    assert one["losses"][-1] < one["losses"][0]  # it trains


def test_the_jitted_data_parallel_step_is_one_kiln_plan(trained):
    """The captured step (forward, backward, the gradients' all-reduce, the update) is one plan
    over the four devices, recorded once when the JIT captures it (the second call) and replayed
    by later calls with their inputs bound."""
    graph = the_plan(trained["four"]["jit"])
    assert len(graph.plan) == len(graph.calls)
    assert sum(1 for _, ast, _, _ in graph.calls if ast.op is Ops.COPY) > 0
    assert kiln_devices_of(graph) == {Device[d].kiln.name for d in DEVS}
    assert trained["four"]["plans"] == [0, 1, 0, 0, 0]
    assert len(the_plan(trained["one"]["jit"]).plan) > 0  # one device: one plan too


def test_a_kernel_reading_the_device_index_gets_it_per_device():
    """A sum of tensors split along different axes reads the whole of one on every device,
    indexed by tinygrad's device index `_device_num`: one plan records that kernel once per
    device with its index a constant."""
    f = TinyJit(lambda a, b: (a + b).realize())
    for seed in range(3):
        a, b = rand(8, 8, seed=20 + seed), rand(8, 8, seed=30 + seed)
        one = (Tensor(a, device=DEV) + Tensor(b, device=DEV)).numpy()
        np.testing.assert_array_equal(f(sharded(a, 0), sharded(b, 1)).numpy(), one)
    graph = the_plan(f)
    # a program per device (tinygrad's runtimes are per device), each fixed to its own index
    indexed = [rt for rt in graph.runtimes if isinstance(rt, KilnProgram) and "_device_num" in rt.kernel.var_names]
    names = [Device.canonicalize(d) for d in DEVS]
    assert sorted({names.index(rt.dev.device) for rt in indexed}) == [0, 1, 2, 3]
    assert all(list(rt.per_device) == [names.index(rt.dev.device)] for rt in indexed)
    assert all("_device_num" not in k.var_names for rt in indexed for k in rt.per_device.values())


def test_the_device_index_becomes_a_constant():
    src = '%7 = CONST i32 1\n%10 = DEFINE_VAR i32 "_device_num" 0 3\n%11 = DEFINE_VAR i32 "n" 1 8\n'
    assert with_device_num(src, 2) == '%7 = CONST i32 1\n%10 = CONST i32 2\n%11 = DEFINE_VAR i32 "n" 1 8\n'


def test_inputs_sharded_or_moved_inside_the_jit_follow_new_inputs(monkeypatch):
    """Sharding an input inside the JIT reads it with kernels (rebound per call); moving a part of
    a sharded input copies it, and since a plan's copies cannot be rebound, each call with
    another input records the plan again."""
    counter = PlanCounter(monkeypatch)
    w = rand(32, 8, seed=40)
    wt = sharded(w, None, DEVS[:2])
    shard_inside = TinyJit(lambda x: (x.shard(DEVS[:2], axis=0) @ wt).realize())
    move = TinyJit(lambda x: (x.to(DEVS[1]) * 2).realize())
    plans = {}
    for f, make, want in [(shard_inside, lambda x: Tensor(x, device=DEV).realize(), lambda x: x @ w),
                          (move, lambda x: sharded(x, 0, DEVS[:2]), lambda x: x * 2)]:
        made = counter.made
        for seed in range(4):
            x = rand(16, 32, seed=41 + seed)
            np.testing.assert_allclose(f(make(x)).numpy(), want(x), rtol=1e-5, atol=1e-5)
        assert any(ast.op is Ops.COPY for _, ast, _, _ in the_plan(f).calls)
        plans[f] = counter.made - made
    # recorded when captured (the second call); `move` again on each of the two later calls
    assert plans == {shard_inside: 1, move: 3}


def test_a_chosen_jit_batch_size_splits_the_plan():
    """Unless `JIT_BATCH_SIZE` is chosen, a JIT on KILN devices is one batch (`compat.graph_split`)."""

    def chain(x: Tensor) -> Tensor:
        for i in range(6):
            x = (x * 2 + i).contiguous()
        return x.realize()

    x = rand(16, seed=50)
    want = x
    for i in range(6):
        want = want * 2 + i
    whole, split = TinyJit(chain), TinyJit(chain)
    for _ in range(3):
        np.testing.assert_allclose(whole(Tensor(x, device=DEV)).numpy(), want, rtol=1e-6)
    with Context(JIT_BATCH_SIZE=2):
        for _ in range(3):
            np.testing.assert_allclose(split(Tensor(x, device=DEV)).numpy(), want, rtol=1e-6)
    assert len(the_plan(whole).calls) == 6
    assert len([g for g in graphs_of(split) if isinstance(g, KilnGraph)]) > 1


def test_only_kiln_devices_share_a_plan():
    if shutil.which("clang") is None:
        pytest.skip("tinygrad's own CPU device compiles with clang, which is not on PATH")
    assert shares_plan([Device[d] for d in DEVS])
    assert not shares_plan([Device[DEV], Device["CPU"]])


OPENCL_CHILD = """
import json, numpy as np
from tinygrad import Device, Tensor, TinyJit
from tinygrad.engine.realize import graph_cache
from tinygrad.uop.ops import Ops
devs = ("KILN:0", "KILN:1")
rng = np.random.default_rng(7)
a, b = rng.standard_normal((32, 24)).astype(np.float32), rng.standard_normal((24, 16)).astype(np.float32)
one = (Tensor(a, device="KILN") @ Tensor(b, device="KILN")).numpy()
errors = {}
for name, (ax, bx) in {"rows": (0, None), "contraction": (1, 0)}.items():
    out = Tensor(a, device="KILN").shard(devs, axis=ax) @ Tensor(b, device="KILN").shard(devs, axis=bx)
    errors[name] = float(np.max(np.abs(out.numpy() - one)))
f = TinyJit(lambda x, y: (x @ y).realize())
for i in range(3):
    x = rng.standard_normal((32, 24)).astype(np.float32)
    got = f(Tensor(x, device="KILN").shard(devs, axis=1), Tensor(b, device="KILN").shard(devs, axis=0)).numpy()
    want = (Tensor(x, device="KILN") @ Tensor(b, device="KILN")).numpy()
    errors[f"jit{i}"] = float(np.max(np.abs(got - want)))
calls = [graph_cache[c.src[0]] if c.src[0].op is Ops.CUSTOM_FUNCTION else None for c in f.captured.linear.src]
print(json.dumps({"kiln": [Device[d].kiln.name for d in devs], "errors": errors, "scale": float(np.max(np.abs(one))),
                  "graphs": [type(g).__name__ for g in calls],
                  "copies": sum(1 for g in calls if g for c in g.calls if c[1].op is Ops.COPY)}))
"""


def test_a_sharded_matmul_on_two_opencl_backed_kiln_devices():
    """`DEV=KILN:OPENCL`: `KILN:0` and `KILN:1` are kiln's OpenCL devices 0 and 1, or both the one
    device where the machine has one; a sharded product and its TinyJit (one plan) match one device."""
    require("OPENCL")
    env = {**os.environ, "DEV": "KILN:OPENCL"}
    done = subprocess.run([sys.executable, "-c", OPENCL_CHILD], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kiln"] == [kiln_device("OPENCL", 0).name, kiln_device("OPENCL", 1).name]
    bound = 1e-5 * max(result["scale"], 1.0)
    assert all(err <= bound for err in result["errors"].values()), result
    assert result["graphs"] == ["KilnGraph"] and result["copies"] > 0, result
