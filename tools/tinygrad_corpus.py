"""Exports the kernels tinygrad 0.14 really generates as kiln text: a corpus for kiln's bounds proof.

kiln proves, when it builds a kernel or at launch, that every LOAD and STORE stays inside its
buffer (crates/kiln-ir/src/bounds.rs), and it must never refuse a correct kernel. This script
collects correct kernels from a real compiler: it runs a fixed list of small tensor expressions
(conv2d with padding/dilation/stride, conv_transpose2d, pooling, cumsum, topk, matmul, softmax,
reductions, movement ops, ...) through tinygrad on its CPU device and lowers every kernel under
several settings:

  cpu-default  tinygrad's CPU kernels as they ran (hand-coded optimizations)
  cpu-noopt    the same with NOOPT=1
  cpu-beam     candidates of BEAM=2 search on the CPU renderer (see `sample_beam_candidates`)
  gpu-default  the same kernels lowered for the OpenCL renderer (work groups, local memory);
  gpu-noopt    lowering only: no OpenCL device is needed
  gpu-beam     BEAM=2 candidates on the OpenCL renderer (LOCAL, GROUP, GROUPTOP, ...)

BEAM search times every candidate optimization on the device; here tinygrad's own candidate
enumeration (`get_kernel_actions` in tinygrad/codegen/opt/search.py) is called from a stand-in for
`beam_search`, and a few candidates per beam level are lowered without timing them.

Each kernel's linearized UOp list (what the renderer consumes) is converted to kiln's text format
(README.md, "The text format"; examples/kernels/cumsum.kiln is the hand-written model) by the
converter of the KILN device (crates/kiln-py/python/kiln/tinygrad/render.py): tinygrad's
register accumulators (BUFFER in REG memory, stored before a loop and reloaded through AFTER)
become DEFINE_ACC / ASSIGN / valued END, gated INDEX/LOAD and IF-guarded stores become gated LOAD
and STORE, SHRINK (a float4 access) becomes an INDEX of a vector pointer, local memory becomes
DEFINE_LOCAL / BARRIER / AFTER. Every exported kernel is then checked by brute force: each
access's index and gate are evaluated over all combinations of the loop, launch and variable
values they depend on, so a kernel the converter got wrong (out of bounds) is reported, not
exported. Kernels are deduplicated by content and written to crates/kiln-device/tests/tinygrad/;
crates/kiln-device/tests/tinygrad_corpus.rs runs kiln's proof over them.

Run from the repository root (clang must be on PATH for tinygrad's CPU device):

    pip install ./crates/kiln-py tinygrad==0.14.0 numpy
    python3 tools/tinygrad_corpus.py              # rewrites crates/kiln-device/tests/tinygrad/
    python3 tools/tinygrad_corpus.py --out DIR --only cumsum --settings cpu-default,gpu-beam
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import sys
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Union

# tinygrad reads these when it is imported: kernels run on the CPU device, and programs are
# lowered in this process (not in a worker pool), so the hooks below see every one.
os.environ["DEV"] = "CPU"
os.environ["PARALLEL"] = "0"

import numpy as np  # noqa: E402

import tinygrad.codegen as tg_codegen  # noqa: E402
import tinygrad.codegen.opt.search as tg_search  # noqa: E402
import tinygrad.engine.realize as tg_realize  # noqa: E402
from tinygrad import Tensor, Variable  # noqa: E402
from tinygrad.codegen.late.linearizer import linearize  # noqa: E402
from tinygrad.codegen.opt.postrange import Scheduler  # noqa: E402
from tinygrad.device import Device  # noqa: E402
from tinygrad.helpers import Context, Target  # noqa: E402
from tinygrad.renderer import Renderer  # noqa: E402
from tinygrad.renderer.cstyle import OpenCLRenderer  # noqa: E402
from tinygrad.uop.ops import Ops, UOp  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "crates" / "kiln-device" / "tests" / "tinygrad"
SETTINGS = ("cpu-default", "cpu-noopt", "cpu-beam", "gpu-default", "gpu-noopt", "gpu-beam")

# ---------------------------------------------------------------------------------------------
# The tensor expressions
# ---------------------------------------------------------------------------------------------


def _rand(*shape: int, seed: int = 0) -> Tensor:
    return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).realize()


def _ints(*shape: int) -> Tensor:
    return Tensor(np.arange(math.prod(shape), dtype=np.int32).reshape(shape)).realize()


def _one(t: Union[Tensor, tuple[Tensor, ...]]) -> Tensor:
    """The tensor of an op that may also return indices (max_pool2d)."""
    return t[0] if isinstance(t, tuple) else t


# name -> (the expression as written, a function building it from fresh realized inputs)
EXPRESSIONS: dict[str, tuple[str, Callable[[], Tensor]]] = {
    "conv2d_pad_dil_stride": (
        "x(1,3,12,12).conv2d(w(4,3,3,3), padding=1, dilation=2, stride=2)",
        lambda: _rand(1, 3, 12, 12).conv2d(_rand(4, 3, 3, 3, seed=1), padding=1, dilation=2, stride=2),
    ),
    "conv2d_pad": (
        "x(1,3,10,10).conv2d(w(4,3,3,3), padding=1)",
        lambda: _rand(1, 3, 10, 10).conv2d(_rand(4, 3, 3, 3, seed=1), padding=1),
    ),
    "conv2d_asym_pad": (
        "x(2,2,9,7).conv2d(w(3,2,2,3), padding=(1,2,0,1), stride=(2,1))",
        lambda: _rand(2, 2, 9, 7).conv2d(_rand(3, 2, 2, 3, seed=1), padding=(1, 2, 0, 1), stride=(2, 1)),
    ),
    "conv_transpose2d": (
        "x(1,4,5,5).conv_transpose2d(w(4,3,3,3), stride=2, padding=1, output_padding=1)",
        lambda: _rand(1, 4, 5, 5).conv_transpose2d(_rand(4, 3, 3, 3, seed=1), stride=2, padding=1, output_padding=1),
    ),
    "conv_transpose2d_dil": (
        "x(1,2,6,6).conv_transpose2d(w(2,2,3,3), dilation=2)",
        lambda: _rand(1, 2, 6, 6).conv_transpose2d(_rand(2, 2, 3, 3, seed=1), dilation=2),
    ),
    "avg_pool2d_pad": (
        "x(1,2,11,11).avg_pool2d(kernel_size=(3,3), stride=2, padding=1)",
        lambda: _rand(1, 2, 11, 11).avg_pool2d(kernel_size=(3, 3), stride=2, padding=1),
    ),
    "max_pool2d": (
        "x(1,2,12,12).max_pool2d(kernel_size=(2,2))",
        lambda: _one(_rand(1, 2, 12, 12).max_pool2d(kernel_size=(2, 2))),
    ),
    "max_pool2d_pad_dil": (
        "x(1,2,11,11).max_pool2d(kernel_size=(3,3), stride=2, padding=1, dilation=2)",
        lambda: _one(_rand(1, 2, 11, 11).max_pool2d(kernel_size=(3, 3), stride=2, padding=1, dilation=2)),
    ),
    "cumsum_axis0": ("a(45,20 i32).cumsum(axis=0)", lambda: _ints(45, 20).cumsum(axis=0)),
    "cumsum_axis1": ("x(6,70).cumsum(axis=1)", lambda: _rand(6, 70).cumsum(axis=1)),
    "topk": ("x(3,12).topk(3)[0]", lambda: _rand(3, 12).topk(3)[0]),
    "matmul": ("x(16,24) @ y(24,12)", lambda: _rand(16, 24) @ _rand(24, 12, seed=1)),
    "softmax": ("x(5,33).softmax(axis=1)", lambda: _rand(5, 33).softmax(axis=1)),
    "sum_axis": ("x(13,40).sum(axis=0)", lambda: _rand(13, 40).sum(axis=0)),
    "argmax": ("x(7,19).argmax(axis=1)", lambda: _rand(7, 19).argmax(axis=1)),
    "pad_shrink_flip_permute": (
        "x(3,5,7).pad(((1,2),(0,1),(2,0))).shrink(((0,5),(1,6),(0,8))).flip(1).permute(2,0,1) + 1",
        lambda: _rand(3, 5, 7).pad(((1, 2), (0, 1), (2, 0))).shrink(((0, 5), (1, 6), (0, 8))).flip(1).permute(2, 0, 1) + 1,
    ),
    "gather": (
        "x(6,9).gather(1, idx(6,4))",
        lambda: _rand(6, 9).gather(1, Tensor(np.random.default_rng(2).integers(0, 9, (6, 4)).astype(np.int32)).realize()),
    ),
    "symbolic_sum": (
        "x(64,8)[:n].sum(axis=1), n in 1..64",
        lambda: _rand(64, 8)[: Variable("n", 1, 64).bind(10)].sum(axis=1),
    ),
}

# tinygrad linear UOps -> kiln text: the converter the KILN device renders with
from kiln.tinygrad.render import (  # noqa: E402
    FLOATS,
    INT_BITS,
    K,
    Converter,
    Unsupported,
    render,
    split_dtype,
    toposort,
    var_arg,
)

# ---------------------------------------------------------------------------------------------
# Brute force: every access's index and gate over all the values they depend on
# ---------------------------------------------------------------------------------------------

BRUTE_LIMIT = 1 << 21


class DataDependent(Exception):
    pass


def _wrap(x: np.ndarray, scalar: str) -> np.ndarray:
    if scalar == "bool":
        return x.astype(bool)
    bits = INT_BITS[scalar]
    if bits == 64:
        return x.astype(np.int64)
    x = x.astype(np.int64)
    if scalar.startswith("i"):
        return ((x + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))
    return x % (1 << bits)


def _eval(n: K, env: dict[int, np.ndarray], memo: dict[int, np.ndarray]) -> np.ndarray:
    if id(n) in memo:
        return memo[id(n)]
    if id(n) in env:
        return env[id(n)] if split_dtype(n.dtype)[0] != "bool" else env[id(n)] != 0
    scalar, width = split_dtype(n.dtype)
    if width != 1 or scalar in FLOATS or n.op in ("LOAD", "DEFINE_ACC", "ASSIGN", "END", "GEP", "VECTORIZE"):
        raise DataDependent(n.op)
    s = [_eval(x, env, memo) for x in n.src]
    op = n.op
    if op == "CONST":
        r = np.array(n.arg, dtype=bool if scalar == "bool" else np.int64)
    elif op in ("ADD", "SUB", "MUL"):
        a, b = s
        r = a + b if op == "ADD" else a - b if op == "SUB" else a * b
    elif op == "IDIV":
        a, b = s
        safe = np.where(b == 0, 1, b)
        q = np.abs(a) // np.abs(safe) * np.sign(a) * np.sign(safe)
        r = np.where(b == 0, 0, q)
    elif op == "MOD":
        a, b = s
        safe = np.where(b == 0, 1, b)
        q = np.abs(a) // np.abs(safe) * np.sign(a) * np.sign(safe)
        r = np.where(b == 0, a, a - q * safe)
    elif op in ("SHL", "SHR"):
        a, b = s
        bits = INT_BITS[scalar]
        c = b % bits
        if op == "SHL":
            r = a << c
        elif scalar.startswith("u"):
            r = (a % (1 << bits)) >> c
        else:
            r = a >> c
    elif op in ("AND", "OR", "XOR"):
        a, b = s
        r = a & b if op == "AND" else a | b if op == "OR" else a ^ b
    elif op in ("MAX", "MIN"):
        r = np.maximum(*s) if op == "MAX" else np.minimum(*s)
    elif op == "NEG":
        r = -s[0]
    elif op == "NOT":
        r = ~s[0] if scalar == "bool" else ~s[0]
    elif op in ("CMPLT", "CMPLE", "CMPEQ", "CMPNE"):
        a, b = s
        r = {"CMPLT": a < b, "CMPLE": a <= b, "CMPEQ": a == b, "CMPNE": a != b}[op]
    elif op == "WHERE":
        r = np.where(*s)
    elif op == "MULACC":
        r = s[0] * s[1] + s[2]
    elif op == "CAST":
        src_scalar = split_dtype(n.src[0].dtype)[0]
        if src_scalar in FLOATS:
            raise DataDependent("float cast")
        r = s[0] != 0 if scalar == "bool" else s[0].astype(np.int64)
    else:
        raise DataDependent(op)
    r = _wrap(np.asarray(r), scalar)
    memo[id(n)] = r
    return r


def _is_data_leaf(n: K) -> bool:
    """An integer or bool loaded from memory (or a lane of such a load): brute force tries every
    value in a window around the buffers' sizes, so only the gates can keep its access inside."""
    scalar, width = split_dtype(n.dtype)
    return n.op in ("LOAD", "GEP") and width == 1 and scalar not in FLOATS and not n.is_ptr


def _leaves(roots: list[K]) -> list[K]:
    out: list[K] = []
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op in ("RANGE", "SPECIAL", "DEFINE_VAR") or _is_data_leaf(n):
            out.append(n)
            if _is_data_leaf(n):
                continue
        stack.extend(n.src)
    order = {"DEFINE_VAR": 0, "SPECIAL": 1, "RANGE": 2, "LOAD": 3, "GEP": 3}
    return sorted(out, key=lambda n: (order[n.op], str(n.arg)))



def leaf_name(n: K) -> str:
    if n.op == "RANGE":
        return f"range{n.arg}"
    if n.op in ("SPECIAL", "DEFINE_VAR"):
        return str(n.arg[0] if isinstance(n.arg, tuple) else n.arg)
    return f"loaded {n.dtype}"


def _scalar_eval(n: K, var_vals: dict[int, int]) -> int:
    env = {k: np.array(v) for k, v in var_vals.items()}
    return int(_eval(n, env, {}))


@dataclass
class BruteResult:
    accesses: int = 0
    checked: int = 0
    data_dependent: int = 0
    sampled: int = 0
    violations: list[str] = field(default_factory=list)


def brute_force(root: K, seed: int = 0, shrink: int = 0) -> BruteResult:
    """Checks every LOAD and STORE of `root` against its buffer, made `shrink` elements shorter
    (a sanity check of the check itself: a kernel that reaches its last element must then fail)."""
    res = BruteResult()
    rng = np.random.default_rng(seed)
    topo = toposort(root)
    # loaded integers range over a window around every buffer size (sizes are constants here)
    sizes = [n.src[0].arg for n in topo if n.op in ("PARAM", "DEFINE_LOCAL") and n.src[0].op == "CONST"]
    window = 4 + max((a for a in sizes if isinstance(a, int)), default=0)
    for n in topo:
        if n.op not in ("LOAD", "STORE") or not n.src[0].is_ptr:
            continue
        res.accesses += 1
        offsets: list[K] = []
        p = n.src[0]
        while p.op in ("INDEX", "AFTER"):
            if p.op == "INDEX":
                offsets.append(p.src[1])
            p = p.src[0]
        width = split_dtype(n.src[0].dtype)[1]
        gate = n.src[2] if len(n.src) == 3 else None
        length_node = p.src[0]
        roots = offsets + ([gate] if gate is not None else []) + [length_node]
        leaves = _leaves(roots)
        # every leaf's full range (extents of loops may depend on variables: masked below)
        try:
            var_leaves = [v for v in leaves if v.op == "DEFINE_VAR"]
            lo_vars = {id(v): var_arg(v)[1] for v in var_leaves}
            hi_vars = {id(v): var_arg(v)[2] for v in var_leaves}
            values: list[np.ndarray] = []
            for leaf in leaves:
                if leaf.op == "DEFINE_VAR":
                    _, lo, hi = var_arg(leaf)
                    values.append(np.arange(lo, hi + 1, dtype=np.int64))
                elif _is_data_leaf(leaf):
                    scalar = split_dtype(leaf.dtype)[0]
                    lo, hi = (0, 1) if scalar == "bool" else (-window, window)
                    if scalar.startswith("u"):
                        lo = 0
                    values.append(np.arange(lo, hi + 1, dtype=np.int64))
                else:
                    # the largest extent over the variables' range (extents grow with variables here)
                    ext = max(_scalar_eval(leaf.src[0], lo_vars), _scalar_eval(leaf.src[0], hi_vars))
                    values.append(np.arange(0, max(ext, 0), dtype=np.int64))
            total = math.prod(len(v) for v in values)
            if total == 0:
                res.checked += 1
                continue
            if total <= BRUTE_LIMIT:
                grids = np.meshgrid(*values, indexing="ij") if values else []
                env = {id(leaf): grid.reshape(-1) for leaf, grid in zip(leaves, grids)}
            else:
                res.sampled += 1
                env = {id(leaf): rng.choice(v, BRUTE_LIMIT) for leaf, v in zip(leaves, values)}
            memo: dict[int, np.ndarray] = {}
            mask = np.ones(1 if not leaves else len(next(iter(env.values()))), dtype=bool)
            for leaf in leaves:
                if leaf.op in ("RANGE", "SPECIAL"):
                    mask &= env[id(leaf)] < _eval(leaf.src[0], env, memo)
            idx = sum((_eval(o, env, memo) for o in offsets), np.zeros_like(mask, dtype=np.int64))
            length = _eval(length_node, env, memo) - shrink
            if gate is not None:
                mask &= _eval(gate, env, memo)
            bad = mask & ((idx < 0) | (idx + width > length))
        except DataDependent:
            res.data_dependent += 1
            continue
        res.checked += 1
        if np.any(bad):
            k = int(np.argmax(bad))
            point = {leaf_name(leaf): int(env[id(leaf)][k]) for leaf in leaves}
            at = int(np.broadcast_to(idx, bad.shape)[k])
            of = int(np.broadcast_to(length, bad.shape)[k])
            res.violations.append(f"{n.op} at index {at} of {of} with {point}")
    return res


# ---------------------------------------------------------------------------------------------
# Getting tinygrad's kernels
# ---------------------------------------------------------------------------------------------


@dataclass
class Captured:
    """One kernel as tinygrad ran it: its AST (a SINK before optimization) and linear program."""

    ast: UOp
    lin: list[UOp]
    name: str


def run_expression(build: Callable[[], Tensor], noopt: bool) -> list[Captured]:
    """Runs one expression on the CPU device and returns the kernels tinygrad compiled for it."""
    got: list[Captured] = []
    original = tg_realize.to_program

    def capture(ast: UOp, renderer: Renderer) -> UOp:
        prg = original(ast, renderer)
        if ast.op is Ops.SINK:
            got.append(Captured(ast, list(prg.src[1].src), clean_name(prg.arg.name)))
        return prg

    tg_realize.to_program = capture
    try:
        with Context(NOOPT=int(noopt)):
            out = build()
            tg_codegen.to_program_cache.clear()
            out.realize()
    finally:
        tg_realize.to_program = original
    return got


def clean_name(name: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", name)


def lower(ast: UOp, ren: Renderer) -> list[UOp]:
    """tinygrad's path from a kernel AST to the renderer's linear UOp list, without compiling."""
    sink = tg_codegen.full_rewrite_to_sink(ast, ren, optimize=ast.tag is None)
    return tg_codegen.line_rewrite(linearize(sink), tg_codegen.pm_linearize_cleanups)


def for_renderer(ast: UOp, ren: Renderer) -> UOp:
    """The kernel with its buffers on `ren`'s device, as BEAM search hands candidates over."""
    params = [p for p in ast.toposort() if p.op is Ops.PARAM]
    out: UOp = ast.substitute({p: p.replace(arg=replace(p.arg, device=ren.target.device)) for p in params})
    return out


def sample_beam_candidates(ast: UOp, ren: Renderer, per_level: int, amt: int = 2) -> list[tuple[str, list[UOp]]]:
    """What BEAM=`amt` would compile for this kernel, without timing: tinygrad's `beam_search` is
    replaced by a stand-in that takes the Scheduler apply_opts hands it (the AST after tinygrad's
    range simplification, loops already made global where the renderer has work groups), asks
    `get_kernel_actions` for the candidates of the first level, lowers `per_level` of them (spread
    over the kinds of optimization), keeps the first `amt` as the beam, and lowers `per_level // 2`
    second-level candidates of each."""
    out: list[tuple[str, list[UOp]]] = []

    def pick(cands: dict[int, Scheduler], n: int) -> list[Scheduler]:
        by_kind: dict[str, list[Scheduler]] = defaultdict(list)
        for _, s in sorted(cands.items()):
            by_kind[s.applied_opts[-1].op.name].append(s)
        picked: list[Scheduler] = []
        for round_ in itertools.count():
            added = False
            for kind in sorted(by_kind):
                lst = by_kind[kind]
                if round_ < len(lst) and len(picked) < n:
                    # spread over the list: the first, the last, the middle, ...
                    pos = [0, len(lst) - 1, len(lst) // 2][round_] if round_ < 3 else round_
                    if lst[pos] not in picked:
                        picked.append(lst[pos])
                        added = True
            if not added or len(picked) >= n or round_ >= 3:
                break
        return picked

    def lower_candidate(s: Scheduler) -> Optional[list[UOp]]:
        try:
            opt_ast = s.copy().get_optimized_ast(name_override="test")
            return lower(for_renderer(opt_ast, ren), ren)
        except Exception:  # noqa: BLE001 - BEAM skips candidates that fail to lower, so do we
            return None

    def stand_in(s: Scheduler, rawbufs: object, var_vals: object, amt_: int, *args: object, **kw: object) -> Scheduler:
        level1 = pick(tg_search.get_kernel_actions(s, include_0=False), per_level)
        beam: list[Scheduler] = []
        for c in level1:
            lin = lower_candidate(c)
            if lin is not None:
                out.append((opts_str(c), lin))
                beam.append(c)
        for b in beam[:amt]:
            for c in pick(tg_search.get_kernel_actions(b, include_0=False), max(1, per_level // 2)):
                lin = lower_candidate(c)
                if lin is not None:
                    out.append((opts_str(c), lin))
        return s

    original = tg_search.beam_search
    tg_search.beam_search = stand_in  # type: ignore[assignment]
    try:
        with Context(BEAM=amt):
            tg_codegen.full_rewrite_to_sink(for_renderer(ast.replace(arg=replace(ast.arg, beam=amt)), ren), ren)
    finally:
        tg_search.beam_search = original
    return out


def opts_str(s: Scheduler) -> str:
    return ", ".join(f"{o.op.name}({o.axis},{o.arg})" for o in s.applied_opts)


def opencl_renderer() -> Renderer:
    return OpenCLRenderer(Target("CL", arch="cl_khr_fp16,cl_khr_fp64"))


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


@dataclass
class Tally:
    exported: int = 0
    duplicate: int = 0
    vector: int = 0  # exported kernels with vector (float4-style) accesses
    local: int = 0  # exported kernels with work-group local memory
    skipped: Counter[str] = field(default_factory=Counter)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="corpus folder (its .kiln files are replaced)")
    ap.add_argument("--only", default="", help="comma-separated expression names (default: all)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated settings (default: all)")
    ap.add_argument("--cpu-candidates", type=int, default=2, help="BEAM candidates lowered per level on the CPU")
    ap.add_argument("--gpu-candidates", type=int, default=3, help="BEAM candidates lowered per level for OpenCL")
    ap.add_argument("--beam-kernels", type=int, default=4,
                    help="BEAM candidates for at most this many kernels of one expression (topk has many alike)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(EXPRESSIONS)
    settings = [s for s in args.settings.split(",") if s]
    for s in settings:
        if s not in SETTINGS:
            ap.error(f"unknown setting {s}; settings are {', '.join(SETTINGS)}")

    cpu = Device["CPU"].renderer
    gpu = opencl_renderer()
    tallies: dict[str, Tally] = {s: Tally() for s in settings}
    written: dict[str, str] = {}  # content (without comments) -> file name
    files: dict[str, str] = {}
    problems: list[str] = []
    brute_totals: Counter[str] = Counter()

    def export(setting: str, expr: str, kname: str, idx: int, extra: str, lin: list[UOp]) -> None:
        tally = tallies[setting]
        try:
            conv = Converter(lin)
            root = conv.convert()
        except Unsupported as e:
            tally.skipped[str(e)] += 1
            if args.verbose:
                print(f"  skip {setting} {expr} {kname}: {e}")
            return
        except Exception as e:  # noqa: BLE001 - a converter bug is a skip with its reason, and reported
            tally.skipped[f"converter error: {type(e).__name__}: {e}"] += 1
            problems.append(f"{setting} {expr} {kname}: {traceback.format_exc()}")
            return
        body = render(root, [])
        if body in written:
            tally.duplicate += 1
            return
        brute = brute_force(root)
        if brute.violations:
            tally.skipped["brute force found an out-of-bounds access (conversion bug)"] += 1
            problems.append(f"{setting} {expr} {kname}: {brute.violations[:3]}")
            return
        brute_totals["accesses"] += brute.accesses
        brute_totals["checked"] += brute.checked
        brute_totals["data-dependent"] += brute.data_dependent
        brute_totals["sampled"] += brute.sampled
        brute_totals["short-caught"] += bool(brute_force(root, shrink=1).violations)
        fname = f"{expr}.{setting}.{idx}.kiln"
        n = 1
        while fname in files:
            n += 1
            fname = f"{expr}.{setting}.{idx}_{n}.kiln"
        header = [
            f"tinygrad 0.14 kernel `{kname}` of {EXPRESSIONS[expr][0]}",
            f"setting: {setting}{' (' + extra + ')' if extra else ''}; exported by tools/tinygrad_corpus.py",
            f"brute force: {brute.checked} of {brute.accesses} accesses in bounds over every index combination"
            + (f" ({brute.sampled} sampled)" if brute.sampled else "")
            + (f", {brute.data_dependent} data-dependent" if brute.data_dependent else ""),
        ]
        written[body] = fname
        files[fname] = render(root, header)
        tally.exported += 1
        nodes = toposort(root)
        tally.vector += any(n.op == "INDEX" and split_dtype(n.dtype)[1] > 1 for n in nodes)
        tally.local += any(n.op == "DEFINE_LOCAL" for n in nodes)

    for expr in names:
        if expr not in EXPRESSIONS:
            ap.error(f"unknown expression {expr}")
        print(f"{expr}: {EXPRESSIONS[expr][0]}", flush=True)
        base = run_expression(EXPRESSIONS[expr][1], noopt=False)
        if "cpu-default" in settings:
            for i, c in enumerate(base):
                export("cpu-default", expr, c.name, i, "", c.lin)
        if "cpu-noopt" in settings:
            for i, c in enumerate(run_expression(EXPRESSIONS[expr][1], noopt=True)):
                export("cpu-noopt", expr, c.name, i, "NOOPT=1", c.lin)
        for i, c in enumerate(base):
            beam = i < args.beam_kernels
            if "cpu-beam" in settings and beam:
                for j, (opts, lin) in enumerate(sample_beam_candidates(c.ast, cpu, args.cpu_candidates)):
                    export("cpu-beam", expr, c.name, i * 100 + j, f"BEAM=2 candidate: {opts}", lin)
            for setting, noopt in (("gpu-default", False), ("gpu-noopt", True)):
                if setting in settings:
                    try:
                        with Context(NOOPT=int(noopt)):
                            lin = lower(for_renderer(c.ast, gpu), gpu)
                    except Exception as e:  # noqa: BLE001
                        tallies[setting].skipped[f"tinygrad lowering failed: {type(e).__name__}"] += 1
                        continue
                    export(setting, expr, c.name, i, "OpenCL renderer" + (", NOOPT=1" if noopt else ""), lin)
            if "gpu-beam" in settings and beam:
                for j, (opts, lin) in enumerate(sample_beam_candidates(c.ast, gpu, args.gpu_candidates)):
                    export("gpu-beam", expr, c.name, i * 100 + j, f"OpenCL renderer, BEAM=2 candidate: {opts}", lin)

    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.kiln"):
        old.unlink()
    for fname, text in files.items():
        (args.out / fname).write_text(text)

    print(f"\n{'setting':<12} {'exported':>8} {'(vector':>7} {'local)':>6} {'duplicate':>9} {'skipped':>7}  reasons")
    for s in settings:
        t = tallies[s]
        reasons = "; ".join(f"{r} ({n})" for r, n in t.skipped.most_common())
        print(f"{s:<12} {t.exported:>8} {t.vector:>7} {t.local:>6} {t.duplicate:>9} {sum(t.skipped.values()):>7}  {reasons}")
    print(f"\n{len(files)} kernels written to {args.out}")
    print(
        f"brute force: {brute_totals['checked']} of {brute_totals['accesses']} accesses checked in bounds "
        f"({brute_totals['sampled']} sampled, {brute_totals['data-dependent']} data-dependent, not checked); "
        f"with every buffer one element shorter it flags {brute_totals['short-caught']} of {len(files)} kernels"
    )
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
