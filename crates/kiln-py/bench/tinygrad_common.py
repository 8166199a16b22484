"""What the tinygrad benchmarks share (imported from the scripts' own folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def kernels_per_call(jit: object) -> int:
    """Kernel launches in one call of a captured TinyJit, counting those inside its graphs
    (tinygrad's own counter counts a replayed graph as one)."""
    from tinygrad.uop.ops import Ops

    def count(call: object) -> int:
        ast = call.src[0]  # type: ignore[attr-defined]
        if ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph":
            return sum(count(c) for c in ast.src[0].src)
        return int(ast.op is Ops.PROGRAM)

    return sum(count(c) for c in jit.captured.linear.src)  # type: ignore[attr-defined]


def run_children(script: str, devices: str) -> tuple[list[dict], list[str]]:
    """Runs `script --child` with this process's arguments once per device in `devices`
    (comma-separated `DEV` values), each in its own process (tinygrad's `DEV` is process-wide).
    Returns the JSON result each printed last, and the devices that failed (their error printed)."""
    results, failed = [], []
    for dev in devices.split(","):
        cmd = [sys.executable, script, "--child", *sys.argv[1:]]
        out = subprocess.run(cmd, env={**os.environ, "DEV": dev}, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"DEV={dev} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
            failed.append(dev)
            continue
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return results, failed
