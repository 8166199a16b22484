"""tinygrad's BEAM search of a matmul on kiln's CPU, with each of its compiler pairs, one run.

    python crates/kiln-py/bench/beam_search.py [--n 1024] [--beam 2] [--compilers cc,llvm]

BEAM search compiles and times hundreds of candidate kernels, so its wall time is mostly compile
time. For each pair (`KILN_CPU_COMPILER`), a fresh process with empty caches (its own
`KILN_CACHE_DIR` and tinygrad `CACHEDB`) multiplies two random n x n float32 matrices on
`DEV=KILN` with `BEAM` set, timing the first `realize()` (the search, then the chosen kernel's
run). The product is checked against numpy's before any time is printed; a pair whose result
differs, or whose process fails, fails the run (exit 1).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time
import numpy as np
from tinygrad import Tensor
n = int(sys.argv[1])
rng = np.random.default_rng(0)
a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
x, y = Tensor(a, device="KILN").realize(), Tensor(b, device="KILN").realize()
t = time.perf_counter()
c = (x @ y).realize()
seconds = time.perf_counter() - t
np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-3, atol=1e-3 * np.sqrt(n))
print(seconds)
"""


def search(compiler: str, n: int, beam: int) -> float:
    """Seconds of the first realize() of an n x n matmul with `BEAM=beam` on pair `compiler`."""
    with tempfile.TemporaryDirectory(prefix="kiln-beam-") as scratch:
        env = {
            **os.environ,
            "DEV": "KILN",
            "BEAM": str(beam),
            "KILN_CPU_COMPILER": compiler,
            "KILN_CACHE_DIR": os.path.join(scratch, "kiln"),
            "CACHEDB": os.path.join(scratch, "tinygrad.db"),
        }
        done = subprocess.run([sys.executable, "-c", CHILD, str(n)], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pair {compiler}: the search failed:\n{done.stderr.strip()}")
        return float(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--beam", type=int, default=2)
    ap.add_argument("--compilers", default="cc,llvm")
    args = ap.parse_args()
    pairs = [p.strip() for p in args.compilers.split(",") if p.strip()]
    times: dict[str, float] = {}
    for pair in pairs:
        try:
            times[pair] = search(pair, args.n, args.beam)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
    print(f"BEAM={args.beam} search of a {args.n}x{args.n} float32 matmul on DEV=KILN (result checked):")
    first = pairs[0]
    for pair in pairs:
        print(f"  {pair:>6}: {times[pair]:8.1f} s   ({times[first] / times[pair]:.2f}x the {first} pair's speed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
