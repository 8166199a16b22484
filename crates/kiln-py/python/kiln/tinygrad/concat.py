"""Concatenations realized inside the schedule that computes them, on kiln's devices (tinygrad
0.14.0; `kiln.tinygrad.compat` applies `realize_concatenations` to each schedule's tensor graph).

tinygrad fuses a concatenation into the kernels that produce its inputs: a convolution
concatenated to earlier channels (a DenseNet layer, an Inception block) then runs its reduction
for every channel of the result, the earlier ones masked off (DenseNet-121 ran 4.7× slower on
kiln's CPU that way). So each input that is computed (not a buffer read as it is) gets a kernel of
its own, and on kiln's CPU the concatenation too: a convolution reading it otherwise loads each
element through a choice between the inputs, and gets no register tile (SqueezeNet's fire
modules).

The copies are the schedule's own intermediate buffers, made from the values that schedule
reads, never tensors' buffers: a tensor that shares an input with a concatenation realized
earlier still computes that input from what it reads when it is realized, as on tinygrad's
devices. A schedule's graph writes a concatenation in one of two ways (`Tensor.cat`): the sum
of its inputs each padded to its place along one axis, or, where the inputs are equally long on
that axis, a `STACK` (permuted where it stacks along another axis than the first) reshaped to
merge the new axis into it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from tinygrad import dtypes
from tinygrad.uop.ops import Ops, UOp

BUFFERS = (Ops.PARAM, Ops.BUFFER, Ops.AFTER)


def _summands(u: UOp) -> list[UOp]:
    """The terms of a tree of `ADD`s."""
    return [t for s in u.src for t in _summands(s)] if u.op is Ops.ADD else [u]


def padded_parts(add: UOp) -> Optional[list[UOp]]:
    """The padded inputs of `add` if it is a concatenation: a sum of at least two terms, each
    padded along one and the same axis, into places that do not overlap and cover that axis."""
    terms = _summands(add)
    if len(terms) < 2 or any(t.op is not Ops.PAD or not all(isinstance(d, int) for d in (*t.shape, *t.src[0].shape)) for t in terms):
        return None
    places = []
    for t in terms:
        grown = [i for i, (a, b) in enumerate(zip(t.src[0].shape, t.shape)) if a != b]
        if len(grown) != 1 or not all(isinstance(p, int) for p in t.marg[grown[0]]):
            return None
        lo = t.marg[grown[0]][0]
        places.append((grown[0], lo, lo + t.src[0].shape[grown[0]]))
    if len({a for a, _, _ in places}) != 1:
        return None
    spans = sorted((lo, hi) for _, lo, hi in places)
    ends = [0] + [hi for _, hi in spans]
    if any(lo != end for (lo, _), end in zip(spans, ends)) or ends[-1] != add.shape[places[0][0]]:
        return None
    return terms


def _is_computed(u: UOp) -> bool:
    """Whether `u` needs a kernel of its own to exist (not a buffer or constant, as it is or
    moved)."""
    return u.base.op not in BUFFERS and u.base.op is not Ops.CONST


def _only_stored(u: UOp, consumers: dict[UOp, list[UOp]]) -> bool:
    """Whether `u` is only stored (as it is or reshaped): realized already."""
    users = consumers.get(u, [])
    return bool(users) and all((c.op is Ops.STORE and c.src[-1] is u) or (c.op is Ops.RESHAPE and _only_stored(c, consumers)) for c in users)


def _realized(u: UOp) -> UOp:
    """`u`, realized first if computed."""
    return u.contiguous() if _is_computed(u) else u


def _stacked(u: UOp) -> Optional[UOp]:
    """The `STACK` of at least two inputs that `u` is, or reshapes (through a permute)."""
    if u.op is Ops.RESHAPE:
        u = u.src[0].src[0] if u.src[0].op is Ops.PERMUTE else u.src[0]
    return u if u.op is Ops.STACK and len(u.src) >= 2 else None


def _with_realized_inputs(u: UOp) -> Optional[UOp]:
    """Concatenation `u` (a sum of padded inputs, or a `STACK`) with its computed inputs
    realized; None if `u` is neither."""
    if u.op is Ops.STACK and len(u.src) >= 2:
        return u.replace(src=tuple(_realized(s) for s in u.src))
    if u.op is not Ops.ADD or padded_parts(u) is None:
        return None

    def rebuilt(t: UOp) -> UOp:
        if t.op is Ops.ADD:
            return t.replace(src=tuple(rebuilt(s) for s in t.src))
        return t.replace(src=(_realized(t.src[0]), *t.src[1:]))

    return rebuilt(u)


def realize_concatenations(sink: UOp, kiln_device: Callable[[Any], bool], tiling: Callable[[Any], bool]) -> UOp:
    """The tensor graph `sink` of one schedule with the computed inputs of each float
    concatenation on a device `kiln_device` accepts realized first, and on one `tiling` accepts
    the concatenation too (unless it is only stored)."""
    consumers: dict[UOp, list[UOp]] = {}
    order = sink.toposort()
    for u in order:
        for s in u.src:
            consumers.setdefault(s, []).append(u)
    new: dict[UOp, UOp] = {}
    for u in order:
        srcs = tuple(new[s] for s in u.src)
        v = u if all(a is b for a, b in zip(srcs, u.src)) else u.replace(src=srcs)
        if dtypes.is_float(u.dtype) and kiln_device(u.device):
            # the result, where it is complete: a sum of padded inputs, or a stack reshaped
            whole = u.op is Ops.ADD or (u.op is Ops.RESHAPE and _stacked(u) is not None)
            cat = _with_realized_inputs(v) if u.op in (Ops.ADD, Ops.STACK) else None
            v = v if cat is None else cat
            if whole and (cat is not None or u.op is Ops.RESHAPE) and tiling(u.device) and not _only_stored(u, consumers):
                v = v.contiguous()
        new[u] = v
    return new[sink]
