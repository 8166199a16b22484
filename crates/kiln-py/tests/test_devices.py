"""kiln.devices(), kiln.Device: listing, properties, generation, reset, synchronize, stats."""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import INC, require

import kiln


def test_devices_lists_every_backend_with_a_reason_when_unavailable():
    rows = kiln.devices()
    names = [r.name for r in rows]
    assert names[0] == "CPU" and rows[0].available
    assert any(n.startswith("OPENCL") for n in names) and any(n.startswith("CUDA") for n in names)
    for r in rows:
        assert isinstance(r.description, str) and r.description, r
        assert ("unavailable" in repr(r)) == (not r.available)


def test_device_properties_and_statistics(dev):
    assert dev.name == "CPU" and "C compiler" in dev.description
    props = dev.properties
    work_groups = {"max_work_group_size", "max_work_group_dims", "local_memory_bytes"}
    assert set(props) == {"isa", "vector_bytes", "l1d_bytes", "l2_bytes", "l3_bytes", "wmma", "threads"} | work_groups
    assert props["threads"] >= 1, "kiln's CPU is a host device: its kernels run on its core pool"
    assert props["vector_bytes"] is None or props["vector_bytes"] >= 16
    # the CPU's matrix-multiply-accumulate forms: one thread, f32 accumulators among them
    assert props["wmma"] and all(len(f) == 6 and f[5] == 1 for f in props["wmma"]), props["wmma"]
    assert any(f[3:5] == ("f32", "f32") for f in props["wmma"]), props["wmma"]
    assert all(props[k] is None for k in work_groups), "kiln's CPU has no work groups"
    before = dev.memory_stats()
    assert set(before) == {"in_use", "cached", "high_water", "hits", "misses", "budget"}
    b = dev.empty("f32", 1 << 16)
    b.copy_from(np.zeros(1 << 16, "float32"))
    assert dev.memory_stats()["in_use"] >= before["in_use"] + (1 << 18)
    del b
    assert dev.trim() >= 0
    assert "CPU" in repr(dev)


@pytest.mark.parametrize("backend", ["OPENCL", "CUDA", "WEBGPU"])
def test_gpu_properties_give_the_work_group_limits(backend):
    props = require(backend).properties
    size, dims, local = props["max_work_group_size"], props["max_work_group_dims"], props["local_memory_bytes"]
    assert size >= 1 and len(dims) == 3 and all(d >= 1 for d in dims), props
    assert local >= 16 << 10, props  # OpenCL 1.0's full profile and WebGPU have 16 KiB, CUDA 48 KiB
    # OpenCL C and WGSL have no matrix instruction kiln renders (CUDA: mma.sync from sm_75)
    assert backend == "CUDA" or props["wmma"] == [], props["wmma"]


def test_compiler_pairs_are_listed_picked_per_kernel_and_per_device(dev):
    pairs = dev.compilers
    # LLVM in process is the default where libLLVM 16 opens and KILN_CC names no C compiler (the
    # C compiler for the host's instruction set otherwise).
    asked = os.environ.get("KILN_CPU_COMPILER", "").strip()
    default = asked or ("llvm" if "llvm" in pairs and not os.environ.get("KILN_CC") else "cc")
    assert pairs[0] == default, pairs
    x = np.arange(4, dtype="float32")
    a = dev.empty("f32", 4)
    a.copy_from(x)
    for pair in pairs:  # the same kernel through every pair
        out = dev.empty("f32", 4)
        dev.compile(INC, name="inc", compiler=pair)(a, out, n=4)
        assert out.numpy().tolist() == (x + 1).tolist(), pair
    with pytest.raises(kiln.UnavailableError, match=f"no compiler pair `nope`; its pairs are: {pairs[0]}"):
        dev.compile(INC, compiler="nope")
    if "cc-sse2" in pairs:
        old = kiln.Device("CPU", compiler="cc-sse2")
        assert old.compilers[0] == "cc-sse2" and old.properties["vector_bytes"] == 16, old.properties
        assert old.properties["isa"] == "SSE2"
    with pytest.raises(kiln.UnavailableError, match="its pairs are"):
        kiln.Device("CPU", compiler="nope")


def test_the_llvm_pair_runs_where_offered_and_the_module_needs_no_libllvm(dev):
    """The CPU's LLVM pair (where libLLVM 16 opens) computes what the C pair does; the native
    module links no LLVM, and with none to open it imports and the CPU runs on its C pair."""
    missing = dev.missing_compilers
    assert isinstance(missing, dict)
    if "llvm" in dev.compilers:
        x = np.arange(4, dtype="float32")
        a, out = dev.empty("f32", 4), dev.empty("f32", 4)
        a.copy_from(x)
        dev.compile(INC, name="inc", compiler="llvm")(a, out, n=4)
        assert out.numpy().tolist() == (x + 1).tolist()
    elif "cpu-llvm" in os.environ.get("KILN_REQUIRE", "").lower().split(","):
        pytest.fail(f"KILN_REQUIRE names cpu-llvm, but the LLVM pair is not offered: {missing.get('llvm')}")
    module = kiln._kiln.__file__
    needed = subprocess.run(["ldd", module], capture_output=True, text=True, check=True).stdout
    assert "LLVM" not in needed, needed
    check = (
        "import kiln; d = kiln.Device('CPU'); assert 'llvm' not in d.compilers, d.compilers; "
        "assert 'no usable libLLVM 16' in d.missing_compilers['llvm'], d.missing_compilers; "
        "import numpy as np; a = d.empty('f32', 4); o = d.empty('f32', 4); a.copy_from(np.zeros(4, 'float32')); "
        f"d.compile({INC!r})(a, o, n=4); assert o.numpy().tolist() == [1.0] * 4"
    )
    env = {**os.environ, "KILN_LIBLLVM": "/nonexistent/libLLVM-16.so.1"}
    subprocess.run([sys.executable, "-c", check], env=env, check=True)


def test_a_device_name_is_parsed_by_kiln():
    assert kiln.Device("cpu").name == "CPU"
    with pytest.raises(kiln.InvalidArgumentError, match="device"):
        kiln.Device("CPU:x")
    # A well-formed name of a backend this build lacks is unavailable, and says so.
    with pytest.raises(kiln.UnavailableError, match="no backend called TPU"):
        kiln.Device("TPU:0")


def test_a_missing_device_is_unavailable():
    with pytest.raises(kiln.UnavailableError):
        kiln.Device("OPENCL:99")


def test_reset_bumps_the_generation_and_stales_old_objects(dev, inc):
    a, o = dev.empty("f32", 4), dev.empty("f32", 4)
    inc(a, o, n=4)
    gen = dev.generation
    dev.reset()
    assert dev.generation == gen + 1 and not dev.is_lost
    with pytest.raises(kiln.DeviceLostError, match="generation") as e:
        a.numpy()
    assert "generation" in e.value.root_cause
    with pytest.raises(kiln.DeviceLostError):
        inc(dev.empty("f32", 4), dev.empty("f32", 4), n=4)
    fresh = dev.compile(INC, name="inc")
    a2, o2 = dev.from_numpy(np.ones(4, "float32")), dev.empty("f32", 4)
    fresh(a2, o2, n=4)
    assert o2.numpy().tolist() == [2.0] * 4
    dev.synchronize()


def test_a_closed_handle_refuses_work_and_works_as_a_context_manager():
    with kiln.Device("CPU") as d:
        d.empty("f32", 1)
    with pytest.raises(kiln.InvalidArgumentError, match="closed"):
        d.empty("f32", 1)
    with pytest.raises(kiln.InvalidArgumentError, match="closed"):
        d.synchronize()
    kiln.Device("CPU").empty("f32", 1)  # other handles are unaffected


def test_bounds_policy_round_trips_and_rejects_unknown_names(dev):
    assert dev.bounds_policy in ("guard", "refuse")
    old = dev.bounds_policy
    try:
        dev.bounds_policy = "refuse"
        assert dev.bounds_policy == "refuse"
        with pytest.raises(kiln.InvalidArgumentError, match="guard"):
            dev.bounds_policy = "loose"
    finally:
        dev.bounds_policy = old
