"""ONNX backend node tests through tinygrad's `OnnxRunner`, on `DEV=KILN` and `DEV=CPU`, one run.

    pip install ./crates/kiln-py tinygrad==0.14.0 onnx==1.18.0 numpy
    python3 tools/tinygrad_onnx_node_tests.py                  # all 1,450 tests of onnx 1.18
    python3 tools/tinygrad_onnx_node_tests.py --only 'test_(add|matmul|conv)'   # a subset
    python3 tools/tinygrad_onnx_node_tests.py --without-kiln   # DEV=CPU with and without kiln's hook

The `onnx` wheel ships the tests (`onnx/backend/test/data/node/<test>/model.onnx` and
`test_data_set_0/{input,output}_N.pb`; inputs and outputs are read as tensors, so the few tests
with sequence or optional values fail alike on both devices). Each device runs every selected test in its own process
(tinygrad's `DEV` is process-wide): the model through `OnnxRunner`, the outputs compared with the
expected ones (`rtol`/`atol` below, the same for both devices). The parent prints each device's
pass count and wall time, and every test that passes on CPU but not on KILN with its reason; it
exits 1 when there is such a test or a device's run did not report every test, and 2 when onnx is
missing or no test matches.

`--without-kiln` runs tinygrad's own `CPU` device twice instead: with kiln's wheel as installed
(its start-up hook applies `kiln.tinygrad.compat.PATCHES`), and in a `python -S` process that
imports tinygrad without the hook. Every test must give the same outputs, bit for bit, in both;
only kiln's ONNX loader bug fixes may make a test pass that fails without them (listed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
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


def run_one(test: Path) -> tuple[str, str, str]:
    """("pass" | "fail" | "error", reason, a hash of the outputs' bytes) for one node test on this
    process's device."""
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
    digest = hashlib.sha256()
    for (name, value), want in zip(got.items(), expected):
        have = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
        digest.update(have.tobytes() if have.dtype.kind != "O" else repr(have).encode())
        if have.shape != want.shape:
            return "fail", f"output {name}: shape {have.shape}, expected {want.shape}", digest.hexdigest()
        if want.dtype.kind in "fc":
            if not np.allclose(have.astype(np.float64), want.astype(np.float64), rtol=RTOL, atol=ATOL, equal_nan=True):
                err = np.nanmax(np.abs(have.astype(np.float64) - want.astype(np.float64)))
                return "fail", f"output {name}: max abs error {err:.3g}", digest.hexdigest()
        elif not np.array_equal(have, want.astype(have.dtype) if want.dtype.kind != "O" else want):
            return "fail", f"output {name}: values differ", digest.hexdigest()
    return "pass", "", digest.hexdigest()


def child(pattern: str, site: str) -> None:
    if site:  # `python -S`: tinygrad from the parent's site-packages, without kiln's start-up hook
        sys.path.append(site)
    signal.signal(signal.SIGALRM, on_alarm)
    for test in node_tests(pattern):
        signal.alarm(TIMEOUT_S)
        try:
            status, reason, digest = run_one(test)
        except Exception as e:  # a test's own failure is its result  # noqa: BLE001
            status, reason, digest = "error", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", ""
        finally:
            signal.alarm(0)
        print(json.dumps({"test": test.name, "status": status, "reason": reason, "digest": digest}), flush=True)
    if site and "kiln.tinygrad.compat" in sys.modules:
        raise SystemExit("kiln's changes to tinygrad were applied in the run without kiln")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="a regular expression the test names must match")
    ap.add_argument("--devices", default="KILN,CPU")
    ap.add_argument("--without-kiln", action="store_true",
                    help="run DEV=CPU with kiln's hook and without it, and require the same outputs")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--site", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.only, args.site)
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
    # (label, DEV, without kiln's hook)
    runs = [("CPU", "CPU", False), ("CPU, no kiln", "CPU", True)] if args.without_kiln else [(d, d, False) for d in args.devices.split(",")]
    for label, dev, plain in runs:
        st = time.perf_counter()
        site = ["-S", __file__, "--site", sysconfig.get_paths()["purelib"]] if plain else [__file__]
        cmd = [sys.executable, *site, "--child", "--only", args.only]
        out = subprocess.run(cmd, env={**os.environ, "DEV": dev}, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - st
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        results[label] = {r["test"]: r for r in rows}
        passed = sum(r["status"] == "pass" for r in rows)
        print(f"{label:<12} {passed:5d} of {len(rows):5d} pass  {wall:8.1f} s wall" + ("" if out.returncode == 0 else f"  (exit {out.returncode})"))
        if out.returncode != 0 or len(rows) != len(selected):
            print(out.stderr[-2000:], file=sys.stderr)
            failed = True
    devs = list(results)
    if failed:
        print("a device's run ended early or reported fewer tests than were selected", file=sys.stderr)
        return 1
    if args.without_kiln:
        return same_without_kiln(results[devs[0]], results[devs[1]])
    if len(devs) < 2:
        return 0
    kiln_dev, ref = devs[0], devs[1]
    differ = [(t, r) for t, r in results[ref].items() if r["status"] == "pass" and results[kiln_dev].get(t, {}).get("status") != "pass"]
    for t, _ in differ:
        k = results[kiln_dev].get(t, {"status": "missing", "reason": "no result"})
        print(f"  {t}: {k['status']} on {kiln_dev}: {k['reason']}")
    print(f"{len(differ)} test(s) pass on {ref} but not on {kiln_dev}")
    return 1 if differ else 0


def same_without_kiln(kiln: dict[str, dict], plain: dict[str, dict]) -> int:
    """1 where a test's outputs differ, or it passes only without kiln; tests that pass only with
    kiln (its ONNX loader fixes) are listed."""
    fixed = [t for t, r in kiln.items() if r["status"] == "pass" and plain[t]["status"] != "pass"]
    worse = [t for t, r in plain.items() if r["status"] == "pass" and kiln[t]["status"] != "pass"]
    differ = [t for t, r in plain.items() if r["digest"] and kiln[t]["digest"] and r["digest"] != kiln[t]["digest"]]
    for t in fixed:
        print(f"  {t}: passes with kiln's ONNX loader fixes only (without: {plain[t]['reason']})")
    for t in worse:
        print(f"  {t}: passes without kiln only ({kiln[t]['status']} with it: {kiln[t]['reason']})")
    for t in differ:
        print(f"  {t}: other outputs with kiln than without")
    compared = sum(1 for t, r in plain.items() if r["digest"] and kiln[t]["digest"])
    print(f"{compared} tests' outputs compared bit for bit: {len(differ)} differ; {len(worse)} pass only without kiln, "
          f"{len(fixed)} only with it")
    return 1 if differ or worse else 0


if __name__ == "__main__":
    sys.exit(main())
