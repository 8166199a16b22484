"""Leaving the interpreter with work in flight: launches never synchronized and `run_async`
plans never waited on finish before the drivers' libraries unload (kiln drains them at exit),
and a process interrupted mid-plan leaves a kernel cache every later process can load."""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

import kiln
from conftest import KERNELS, require

# Ends with work in flight on `device`: a 256³ matmul launched without a synchronize, then
# (for odd seeds) a plan of it started with run_async and never waited on.
IN_FLIGHT = textwrap.dedent(
    """\
    import sys, numpy as np, kiln
    dev = kiln.Device(sys.argv[1])
    k = dev.compile(sys.argv[2])
    n, seed = 256, int(sys.argv[3])
    A, B, C = (dev.from_numpy(np.ones(n * n, np.float32)) for _ in range(3))
    k(A, B, C, m=n, k=n, n=n)
    if seed % 2:
        plan = kiln.Plan(dev)
        plan.launch(k, [A, B, C], {"m": n, "k": n, "n": n})
        run = plan.run_async()
    """
)

# Compiles one new kernel after another on the CPU (each written to the disk cache), printing
# the constant of each one done, while a plan runs on `device`, until it is interrupted.
COMPILING = textwrap.dedent(
    """\
    import sys, numpy as np, kiln
    dev, cpu = kiln.Device(sys.argv[1]), kiln.Device("CPU")
    inc = dev.compile(sys.argv[2], name="inc")
    a, out = dev.from_numpy(np.ones(4096, np.float32)), dev.empty("f32", 4096)
    plan = kiln.Plan(dev)
    plan.launch(inc, [a, out], {"n": 4096})
    for c in range(10**6):
        run = plan.run_async()
        cpu.compile(sys.argv[3].replace("1.0", f"{c}.0"), name=f"add_{c}")
        print(c, flush=True)
        run.wait()
    """
)


def in_flight_device() -> str:
    """OpenCL, where exiting with work in flight crashed in PoCL's worker thread; else CUDA;
    the CPU when the machine has neither (and KILN_REQUIRE names neither)."""
    for backend in ("OPENCL", "CUDA"):
        try:
            return require(backend).name
        except pytest.skip.Exception:
            pass
    return "CPU"


def test_exiting_with_launches_and_runs_in_flight_never_crashes(tmp_path: pathlib.Path) -> None:
    device = in_flight_device()
    env = {**os.environ, "POCL_CACHE_DIR": str(tmp_path / "pocl"), "KILN_CACHE_DIR": str(tmp_path / "kiln")}
    script = tmp_path / "in_flight.py"
    script.write_text(IN_FLIGHT)
    failures = []
    for seed in range(100):
        out = subprocess.run([sys.executable, str(script), device, str(KERNELS / "matmul.kiln"), str(seed)],
                             env=env, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            failures.append((seed, out.returncode, out.stderr[-500:]))
    assert not failures, f"{len(failures)} of 100 exits on {device} failed: {failures[:3]}"


def logging_cc(tmp_path: pathlib.Path) -> tuple[str, pathlib.Path]:
    """A C compiler that logs each compile (not `--version`) and runs clang, else cc."""
    log = tmp_path / "cc.log"
    real = shutil.which("clang") or shutil.which("cc") or "cc"
    cc = tmp_path / "logging-cc"
    cc.write_text(f'#!/bin/sh\nif [ "$1" != --version ]; then echo "$@" >> "{log}"; fi\nexec {real} "$@"\n')
    cc.chmod(0o755)
    return str(cc), log


def test_an_interrupt_mid_plan_leaves_a_cache_that_loads_without_compiling(tmp_path: pathlib.Path) -> None:
    from conftest import INC

    device = in_flight_device()
    cc, log = logging_cc(tmp_path)
    env = {**os.environ, "POCL_CACHE_DIR": str(tmp_path / "pocl"), "KILN_CACHE_DIR": str(tmp_path / "kiln"),
           "KILN_CC": cc}
    script = tmp_path / "compiling.py"
    script.write_text(COMPILING)
    proc = subprocess.Popen([sys.executable, str(script), device, INC, INC], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    done = [int(proc.stdout.readline()) for _ in range(3)]  # a few kernels are in the cache
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    done += [int(line) for line in rest.split()]
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
    # Every kernel the interrupted process finished loads from the cache in a new process,
    # with no compile, and computes what it should.
    compiled = log.read_text().count("\n")
    check = textwrap.dedent(
        """\
        import sys, numpy as np, kiln
        cpu = kiln.Device("CPU")
        a, out = cpu.from_numpy(np.ones(8, np.float32)), cpu.empty("f32", 8)
        for c in map(int, sys.argv[2:]):
            cpu.compile(sys.argv[1].replace("1.0", f"{c}.0"), name=f"add_{c}")(a, out, n=8)
            assert (out.numpy() == 1.0 + c).all(), (c, out.numpy())
        """
    )
    out = subprocess.run([sys.executable, "-c", check, INC, *map(str, done)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert log.read_text().count("\n") == compiled, "a kernel the interrupted process finished was compiled again"
