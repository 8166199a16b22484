"""Register tiles for contractions on kiln's CPU (tinygrad 0.14.0).

tinygrad's hand-coded heuristic gives a CPU matmul a 4×4 scalar tile, which runs at a tenth of
what the machine does. A register-blocked matrix multiply keeps a tile of C in vector registers:
each step of the reduction loads one vector of B, broadcasts one element of A per row and issues
one FMA per vector. kiln states that tile to tinygrad by its rows only: an output axis UPCAST by
the tile's rows, and the output axis along which one operand is contiguous split off as a loop of
two vectors' lanes (a LOOP range, `Scheduler.shift_to`). tinygrad's passes then rewrite 32 times
fewer nodes than an UPCAST of the lanes too would hand them (a ResNet-50 convolution: 8,000, and
seconds of rewriting each). kiln's CPU renderer unrolls and jams that loop into the scalar tile
(`unroll_lane_loops` in kiln-ir) and turns its accumulators into vector ones
(`vectorize_outer_products`), the same ops in the same order.

`kiln.tinygrad.compat` puts `hand_coded_optimizations` in place of tinygrad's heuristic (the name
`apply_opts` looks up at each call): for a kernel whose renderer asks for tiles
(`contraction_tiles`, kiln's CPU) and whose reduction is a sum of products of two buffers, it
applies that tile and the CPU threads; every other kernel, and every other device, gets tinygrad's
heuristic unchanged. BEAM, `NOOPT` and kernels with explicit opts never reach the heuristic, as
before. It reads tinygrad 0.14.0's scheduler (`Scheduler.reduceop`, `rngs`, `apply_opt`,
`shift_to`).
"""

from __future__ import annotations

import math
from typing import Optional

from tinygrad.codegen.opt import KernelOptError, Opt, OptOps
from tinygrad.codegen.opt.postrange import Scheduler
from tinygrad.renderer import Renderer
from tinygrad.uop.ops import AxisType, GroupOp, Ops, UOp

from . import originals

IRREGULAR = 1 << 40  # the "stride" of a range that the index uses other than as `range*c`


def _skip_gates(u: UOp) -> UOp:
    """`u` through casts and the `WHERE(valid, x, 0)` of padding."""
    while u.op is Ops.CAST or (u.op is Ops.WHERE and u.src[2].op is Ops.CONST):
        u = u.src[0] if u.op is Ops.CAST else u.src[1]
    return u


def _strides(operand: UOp) -> Optional[dict[UOp, int]]:
    """The ranges the operand's buffer index (`INDEX(buf, idx)`) depends on, each with its constant
    stride where the index uses it only in terms `range` or `range*c`, else `IRREGULAR` (a strided
    window's divisions). An elementwise expression of such operands (an image scaled per channel
    before a 1×1 convolution: `x * min(s, 1)`) has its operands' ranges, `IRREGULAR` where their
    strides differ. None if the operand is neither."""
    operand = _skip_gates(operand)
    if operand.op in GroupOp.ALU or operand.op is Ops.CAST:
        merged: dict[UOp, int] = {}
        for src in operand.src:
            if (s := _strides(src)) is None:
                return None
            for r, stride in s.items():
                merged[r] = stride if merged.get(r, stride) == stride else IRREGULAR
        return merged
    if operand.op is Ops.CONST:
        return {}
    if operand.op is not Ops.INDEX or len(operand.src) < 2:
        return None
    idx = operand.src[1].get_idx().simplify()  # a split axis's `(g*n + c) // n` is `g`
    if idx.op in (Ops.FLOORMOD, Ops.CMOD) and idx.src[1].op is Ops.CONST:  # a strided window's `% numel`
        idx = idx.src[0]
    strides: dict[UOp, int] = {}
    for term in idx.split_uop(Ops.ADD):
        if term.op is Ops.RANGE:
            strides[term] = strides.get(term, 0) + 1
        elif term.op is Ops.MUL and term.src[0].op is Ops.RANGE and term.src[1].op is Ops.CONST:
            strides[term.src[0]] = strides.get(term.src[0], 0) + int(term.src[1].arg)
        else:
            for r in term.toposort():
                if r.op is Ops.RANGE:
                    strides[r] = IRREGULAR
    return strides


# the ops above a lane operand's read that kiln-ir maps lane by lane (`mapped_lane_of`: its
# `liftable` ops; MAX reaches kiln as a WHERE of a comparison)
LANE_WISE = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.NEG, Ops.SQRT, Ops.MULACC, Ops.MAX, Ops.WHERE, Ops.CMPLT,
             Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR}


def _reads_lanes(operand: UOp, lane: UOp) -> bool:
    """Whether `operand` is a read (an INDEX) that varies along `lane`, or lane-wise ops over
    exactly one such read and values without one (a ReLU of the image: `MAX(x, 0)`): what
    kiln-ir loads as one vector of lanes."""
    reads, stack, seen = set(), [operand], set()
    while stack:
        if (u := stack.pop()) in seen:
            continue
        seen.add(u)
        if u.op is Ops.INDEX:
            reads.add(u)
        elif u.op in LANE_WISE:
            stack.extend(u.src)
        elif any(x.op is Ops.INDEX for x in u.toposort()):  # a read under another op (a CAST)
            return False
    return len(reads) == 1 and lane in next(iter(reads)).toposort()


def _split_groups(k: Scheduler, mul: UOp) -> Optional[Scheduler]:
    """`k` with an output axis that an operand reads by group (`axis // n`, a grouped
    convolution's output channels, `n` of them per group, dividing the axis) split into groups
    and the `n` within one (`Scheduler.shift_to`): the inner axis is then one the weights vary
    along and the image does not, a row axis for the tile. None if there is none."""
    for operand in mul.src:
        for u in _skip_gates(operand).toposort():
            if u.op not in (Ops.FLOORDIV, Ops.CDIV) or u.src[0].op is not Ops.RANGE or u.src[1].op is not Ops.CONST:
                continue
            rng, n = u.src[0], int(u.src[1].arg)
            if rng not in k.rngs or (a := k.rngs.index(rng)) not in k.upcastable_dims or not 1 < n < k.full_shape[a]:
                continue
            tk = k.copy()
            try:
                tk.shift_to(tk.rngs[a], n, AxisType.WEAK)
            except KernelOptError:
                continue
            return tk
    return None


def contraction_tile(k: Scheduler, vector_bytes: int, threads: int) -> Optional[Scheduler]:
    """The register tile for a sum-of-products kernel, or None (then tinygrad's heuristic runs).

    A grouped convolution's output channels, which the image reads by group, are first split
    into groups and the channels of one (`_split_groups`). Lanes: an output axis along which one
    operand, a load (or lane-wise ops of one: the ReLU of the layer before, `MAX(x, 0)`), has
    stride 1 and the other does not vary, split into a loop of two vectors' lanes (one where the
    axis is too short; where a vector does not divide it, the largest divisor of at least 4 lanes
    that a vector holds: kiln splits 14 lanes into 8, 4, 2). Where both operands offer such an axis (a convolution: the
    image's width, and the output channels of weights stored by `kiln.tinygrad.layout`), the one
    with more multiply-adds per instruction wins (`score`). The other operand, broadcast, may be
    an elementwise expression of loads (`x * min(s, 1)`). Rows: an output axis the other operand
    varies along (through a strided window's divisions too) and the lane operand does not,
    upcast by the largest divisor up to 8 rows (4 where vectors are narrower than 64 bytes), the
    closest-together axis on a tie: 8×2 accumulators of 16 lanes, kiln's own AVX-512 tile, or
    4×2 of 8 (AVX2's 16 registers); an axis without such a divisor (13) whole, where the
    registers hold it, or padded to whole tiles (57 to 64: PADTO) where that adds an eighth at
    most. Where there is none (a depthwise convolution), rows along an axis the lane operand
    alone varies along, each row its own lanes against the same broadcast. Then the CPU threads split the
    first output loop that divides evenly; where none does, fewer rows (down to half) may make
    one."""
    red = k.reduceop  # the first reduction picks the axes; the tile serves every one of them
    if red is None or red.arg[0] is not Ops.ADD:
        return None
    mul = _skip_gates(red.src[0])
    if mul.op is not Ops.MUL:
        return None
    strides = [_strides(s) for s in mul.src]
    if strides[0] is None or strides[1] is None:
        return None
    if (split := _split_groups(k, mul)) is not None:
        return contraction_tile(split, vector_bytes, threads)
    lanes_max = max(vector_bytes // mul.dtype.itemsize, 4)
    rows_max = 8 if vector_bytes >= 64 else 4
    registers = 32 if vector_bytes >= 64 else 16  # AVX-512's vector registers, else AVX2's
    shape = k.full_shape

    def lanes_of(a: int) -> tuple[int, int]:
        """(lanes per vector, vectors): two whole vectors, else the largest divisor of at least 4
        that a vector holds (14 of 196, 7 of 49), twice where that still divides."""
        n = next((n for n in (lanes_max, 8, *range(lanes_max - 1, 3, -1)) if n <= lanes_max and shape[a] % n == 0), 0)
        return n, (2 if n and (shape[a] // n) % 2 == 0 else 1)

    def pieces(lane_axis: int) -> int:
        """The vectors a row's lanes take: kiln splits lanes that a vector does not hold whole
        into powers of two (13 into 8, 4 and 1)."""
        n, v = lanes_of(lane_axis)
        return v * bin(n).count("1")

    def rows_of(a: int, lane_axis: int) -> int:
        """The largest divisor up to `rows_max`; else, for an axis with none (a 13×13 image's
        rows, or its 169 pixels), the largest divisor whose rows' accumulators the registers
        hold besides the lanes' loads and one broadcast (14 rows of two vectors with AVX-512's
        32)."""
        most = (registers - 1) // pieces(lane_axis) - 1
        n = next((n for n in (*range(rows_max, 1, -1), *range(most, rows_max, -1)) if shape[a] % n == 0), 0)
        return rows_max if n < rows_max // 2 and padded(a) else n

    def padded(a: int) -> bool:
        """Whether rounding axis `a` up to whole tiles of `rows_max` rows (tinygrad's PADTO: the
        rows past its end read zeros and store nothing) adds at most an eighth of its work (a
        57-pixel image's rows, which 3 divide at most, padded to 64)."""
        return (-shape[a] % rows_max) * 8 <= shape[a]

    def score(lane_axis: int, row_axis: int) -> float:
        """Multiply-adds per instruction of one reduction step: rows × lanes over the vector
        FMAs, the lanes' loads and the rows' broadcasts."""
        rows, p = rows_of(row_axis, lane_axis), pieces(lane_axis)
        return math.prod(lanes_of(lane_axis)) * rows / (rows * p + p + rows)

    plans = []
    for lane_side in (0, 1):
        lane_s, row_s = strides[lane_side], strides[1 - lane_side]
        lane_axes = [a for a in k.upcastable_dims if lane_s.get(k.rngs[a]) == 1 and k.rngs[a] not in row_s
                     and _reads_lanes(mul.src[lane_side], k.rngs[a])]  # lanes are reads; a product is broadcast
        if not lane_axes:
            continue
        lane_axis = max(lane_axes, key=lambda a: math.prod(lanes_of(a)))  # the first of the best
        if not lanes_of(lane_axis)[0]:
            continue
        row_axes = [a for a in k.upcastable_dims if a != lane_axis and k.rngs[a] in row_s and k.rngs[a] not in lane_s]
        # the most rows, then the closest together (one cache line of broadcasts)
        row_axis = max(row_axes, key=lambda a: (rows_of(a, lane_axis), -row_s[k.rngs[a]]), default=None)
        if row_axis is not None and rows_of(row_axis, lane_axis):
            plans.append((score(lane_axis, row_axis), 1, -lane_side, lane_axis, row_axis))
            continue
        # no outer product (a depthwise convolution: the weights vary along no output axis the
        # image does not): rows along an axis only the lane operand varies along, each row its
        # own vectors of lanes against the same broadcast. (Not where the broadcast varies along
        # it too, as a grouped convolution's image does by group: each row would load its own
        # lanes, and such tiles ran slower than tinygrad's.)
        own_rows = [a for a in k.upcastable_dims if a != lane_axis and k.rngs[a] in lane_s and k.rngs[a] not in row_s]
        row_axis = max(own_rows, key=lambda a: (rows_of(a, lane_axis), -lane_s[k.rngs[a]]), default=None)
        if row_axis is not None and rows_of(row_axis, lane_axis):
            plans.append((score(lane_axis, row_axis), 0, -lane_side, lane_axis, row_axis))
    # outer products first, then the most multiply-adds per instruction (a convolution's output
    # channels over a 7-pixel row); the first on a tie
    unthreaded = None
    for _, _, _, lane_axis, row_axis in sorted(plans, key=lambda p: (p[1], p[0], p[2]), reverse=True):
        (lanes, vectors), most = lanes_of(lane_axis), rows_of(row_axis, lane_axis)
        # the most rows, else fewer where that lets the threads split the outputs evenly
        fewer = (n for n in range(most - 1, max(most // 2, 2) - 1, -1) if shape[row_axis] % n == 0)
        for rows in (most, *fewer):
            tk = k.copy()
            try:
                lane_rng = tk.rngs[lane_axis]  # the row upcast renumbers the axes, not this range
                if shape[row_axis] % rows:
                    tk.apply_opt(Opt(OptOps.PADTO, row_axis, rows))
                tk.apply_opt(Opt(OptOps.UPCAST, row_axis, rows))
                tk.shift_to(lane_rng, lanes * vectors, AxisType.LOOP)
            except KernelOptError:
                continue
            if threads < 2 or _thread(tk, threads):
                return tk
            if unthreaded is None:
                unthreaded = tk
    return unthreaded


def _thread(k: Scheduler, threads: int) -> bool:
    """Splits the first output loop that divides evenly over the most threads (up to `threads`);
    False if none does."""
    for n in range(threads, 1, -1):
        for axis in k.axes_of(AxisType.WEAK):
            if k.full_shape[axis] % n == 0:
                try:
                    k.apply_opt(Opt(OptOps.THREAD, axis, n))
                    return True
                except KernelOptError:
                    pass
    return False


def vector_bytes(renderer: Renderer) -> int:
    """The width of the vector registers kiln's CPU compiles for (16 if it does not say)."""
    return int(renderer.device.properties.get("vector_bytes") or 16)  # type: ignore[attr-defined]


def hand_coded_optimizations(k: Scheduler) -> Scheduler:
    """tinygrad's heuristic, with kiln's register tile first for contractions on kiln's CPU."""
    ren = k.ren
    if getattr(ren, "contraction_tiles", False):
        tiled = contraction_tile(k, vector_bytes(ren), ren.global_max[0])
        if tiled is not None:
            return tiled
    return originals.tinygrad(originals.HEURISTIC)(k)

