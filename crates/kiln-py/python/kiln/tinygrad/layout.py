"""Operands stored in blocks of a register tile's lanes, for kiln's CPU (tinygrad 0.14.0;
`kiln.tinygrad.compat` applies both changes below on devices whose renderer has
`contraction_tiles`).

kiln's register tile (`kiln.tinygrad.tile`) puts two vectors of lanes along an output axis on
which one operand is contiguous and the other does not vary; each step of the reduction loads
those lanes once and broadcasts one element of the other operand per row. Where the lane operand
is a row-major matrix, the step's lanes sit one row apart: 4 KiB for a 1024-wide matrix, so
that every step falls in the same cache set and in another page, and a tile's panel does not
stay in L1. `blocked` stores the operand with the lane axis split into blocks of the tile's
lanes, the block outermost and its lanes innermost: a panel is then one contiguous run.

- `reorder_conv_weights` (ONNX models: `OnnxRunner._init_from_graph`): the weights of convolutions
  (ungrouped, or with a multiple of the block per group), `[cout, cin, kh, kw]` in ONNX, are stored `[cout/32, cin, kh, kw, 32]`. The output
  channels become the lanes of every convolution (a 7×7 image gives whole vectors, a strided
  window a tile at all), and ONNX initializers are constants, so the copy is made once, on the
  first call, and later calls read it.
- `Tensor.dot` (`pack_columns`): the right operand of a matrix product with at least `MIN_ROWS`
  rows on the left is stored `[N/32, K, 32]` (a copy per call: K·N elements against M·K·N
  multiply-adds).

The tensors keep their shapes and values; only the memory order of the copy changes.
"""

from __future__ import annotations

from typing import Any, Optional

from tinygrad import Tensor, dtypes

MIN_ROWS = 32  # a product's left rows from which packing its right operand pays for the copy


def blocked(t: Tensor, axis: int, block: int) -> Tensor:
    """`t` with the same shape and values, stored with `axis` split into `axis/block` (outermost)
    and `block` (innermost); all of `axis` innermost where `block` does not divide it."""
    axis %= t.ndim
    n = t.shape[axis]
    if not isinstance(n, int) or n % block:
        block = n
    split = t.reshape(*t.shape[:axis], n // block, block, *t.shape[axis + 1 :])
    order = (axis, *(i for i in range(t.ndim + 1) if i not in (axis, axis + 1)), axis + 1)
    inverse = tuple(order.index(i) for i in range(t.ndim + 1))
    return split.permute(order).contiguous().permute(inverse).reshape(t.shape)


def reorder_conv_weights(runner: Any, block: int) -> int:
    """Stores each initializer that a `Conv` of an `OnnxRunner` reads as its weight blocked along
    its output channels, where the block divides each group's; returns how many it reordered. A
    weight another node also reads is the same tensor to it."""
    values = runner.graph_values
    groups = {node.inputs[1]: node.opts.get("group", 1) for node in runner.graph_nodes if node.op == "Conv" and len(node.inputs) > 1}
    done = 0
    for name, group in sorted(groups.items()):
        weight = values.get(name)
        if not isinstance(weight, Tensor) or weight.ndim < 3:
            continue
        # a grouped convolution gets blocks within its groups (a depthwise one none: each output
        # channel reads its own input channel, so the image varies along the lanes too)
        if group == 1 or (isinstance(weight.shape[0], int) and (weight.shape[0] // group) % block == 0):
            values[name] = blocked(weight, 0, block)
            done += 1
    return done


def pack_columns(x: Tensor, w: Tensor, block: int) -> Optional[Tensor]:
    """`w` blocked along its columns when `x @ w` is an f32 matrix product worth it (a 2-D `w`
    whose columns the block divides, at least `MIN_ROWS` rows of `x`); else None."""
    if w.ndim != 2 or x.ndim < 2 or w.dtype != dtypes.float32 or x.dtype != dtypes.float32:
        return None
    rows, (k, n) = x.shape[:-1], w.shape
    if not all(isinstance(d, int) for d in (*rows, k, n)) or n % block or k < 2:
        return None
    count = 1
    for d in rows:
        count *= int(d)
    return blocked(w, 1, block) if count >= MIN_ROWS else None
