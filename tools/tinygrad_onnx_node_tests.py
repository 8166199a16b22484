"""ONNX backend node tests through tinygrad's `OnnxRunner`, on `DEV=KILN` and `DEV=CPU`, one run.

    pip install ./crates/kiln-py tinygrad==0.14.0 onnx==1.18.0 numpy
    python3 tools/tinygrad_onnx_node_tests.py                  # all 1,450 tests of onnx 1.18
    python3 tools/tinygrad_onnx_node_tests.py --only 'test_(add|matmul|conv)'   # a subset

The `onnx` wheel ships the tests (`onnx/backend/test/data/node/<test>/model.onnx` and
`test_data_set_0/{input,output}_N.pb`; inputs and outputs are read as tensors, so the few tests
with sequence or optional values fail alike on both devices). Each device runs every selected test in its own process
(tinygrad's `DEV` is process-wide): the model through `OnnxRunner`, the outputs compared with the
expected ones (`rtol`/`atol` below, the same for both devices). The parent prints each device's
pass count and wall time, and every test that passes on CPU but not on KILN with its reason; it
exits 1 when there is such a test or a device's run did not report every test, and 2 when onnx is
missing or no test matches.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

RTOL, ATOL = 1e-3, 1e-4
TIMEOUT_S = 120


class TestTimeout(Exception):
    pass


def on_alarm(signum: int, frame: object) -> None:
    raise TestTimeout(f"no result in {TIMEOUT_S} s")


def node_tests(pattern: str) -> list[Path]:
    import onnx

    root = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
    return sorted(p for p in root.iterdir() if (p / "model.onnx").exists() and re.search(pattern, p.name))


def read_tensors(folder: Path, prefix: str) -> list:
    import onnx
    from onnx import numpy_helper

    out = []
    for f in sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[-1])):
        t = onnx.TensorProto()
        t.ParseFromString(f.read_bytes())
        out.append(numpy_helper.to_array(t))
    return out


def run_one(test: Path) -> tuple[str, str]:
    """("pass" | "fail" | "error", reason) for one node test on this process's device."""
    import numpy as np
    import onnx

    from tinygrad import Tensor
    from tinygrad.nn.onnx import OnnxRunner

    data = test / "test_data_set_0"
    model = onnx.load(str(test / "model.onnx"))
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    inputs = dict(zip(names, read_tensors(data, "input")))
    expected = read_tensors(data, "output")
    runner = OnnxRunner(str(test / "model.onnx"))
    got = runner(inputs)
    for (name, value), want in zip(got.items(), expected):
        have = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
        if have.shape != want.shape:
            return "fail", f"output {name}: shape {have.shape}, expected {want.shape}"
        if want.dtype.kind in "fc":
            if not np.allclose(have.astype(np.float64), want.astype(np.float64), rtol=RTOL, atol=ATOL, equal_nan=True):
                err = np.nanmax(np.abs(have.astype(np.float64) - want.astype(np.float64)))
                return "fail", f"output {name}: max abs error {err:.3g}"
        elif not np.array_equal(have, want.astype(have.dtype) if want.dtype.kind != "O" else want):
            return "fail", f"output {name}: values differ"
    return "pass", ""


def child(pattern: str) -> None:
    signal.signal(signal.SIGALRM, on_alarm)
    for test in node_tests(pattern):
        signal.alarm(TIMEOUT_S)
        try:
            status, reason = run_one(test)
        except Exception as e:  # a test's own failure is its result  # noqa: BLE001
            status, reason = "error", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        finally:
            signal.alarm(0)
        print(json.dumps({"test": test.name, "status": status, "reason": reason}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="a regular expression the test names must match")
    ap.add_argument("--devices", default="KILN,CPU")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.only)
        return 0
    try:
        selected = node_tests(args.only)
    except ImportError as e:
        print(f"cannot run the ONNX node tests: {e}; pip install onnx==1.18.0", file=sys.stderr)
        return 2
    if not selected:
        print(f"no ONNX node test matches --only {args.only!r}", file=sys.stderr)
        return 2
    results: dict[str, dict[str, dict]] = {}
    failed = False
    for dev in args.devices.split(","):
        st = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--child", "--only", args.only], env={**os.environ, "DEV": dev},
                             capture_output=True, text=True, check=False)
        wall = time.perf_counter() - st
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        results[dev] = {r["test"]: r for r in rows}
        passed = sum(r["status"] == "pass" for r in rows)
        print(f"{dev:<12} {passed:5d} of {len(rows):5d} pass  {wall:8.1f} s wall" + ("" if out.returncode == 0 else f"  (exit {out.returncode})"))
        if out.returncode != 0 or len(rows) != len(selected):
            print(out.stderr[-2000:], file=sys.stderr)
            failed = True
    devs = list(results)
    if failed:
        print("a device's run ended early or reported fewer tests than were selected", file=sys.stderr)
        return 1
    if len(devs) < 2:
        return 0
    kiln_dev, ref = devs[0], devs[1]
    differ = [(t, r) for t, r in results[ref].items() if r["status"] == "pass" and results[kiln_dev].get(t, {}).get("status") != "pass"]
    for t, _ in differ:
        k = results[kiln_dev].get(t, {"status": "missing", "reason": "no result"})
        print(f"  {t}: {k['status']} on {kiln_dev}: {k['reason']}")
    print(f"{len(differ)} test(s) pass on {ref} but not on {kiln_dev}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
