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
  (ungrouped, or with a multiple of 32, 16 or 8 per group), `[cout, cin, kh, kw]` in ONNX, are
  stored `[cout/32, cin, kh, kw, 32]` (the block of a group's). The output
  channels become the lanes of every convolution (a 7×7 image gives whole vectors, a strided
  window a tile at all), and ONNX initializers are constants, so the copy is made once, on the
  first call, and later calls read it. An ungrouped convolution's output channels a sixteenth or
  less short of a whole block are padded with zero channels, cut off again after it
  (`padded_outputs`).
- `pack_contractions` (every schedule on kiln's CPU: `tinygrad.schedule.get_kernel_graph`): the
  right operand of a matrix product with at least `MIN_ROWS` rows on the left, `[K, N]`, is
  copied `[N/32, K, 32]` inside the schedule that computes the product (a copy per schedule: K·N
  elements against M·K·N multiply-adds). The copy is one of the schedule's own intermediate
  buffers, as tinygrad makes for any kernel it splits off: it is computed from the operand's value
  at that point of that schedule and never becomes a tensor's buffer, so no other tensor (a lazy
  product realized after the operand is assigned, a loss read after an optimizer step) can read it.

The tensors keep their shapes and values; only the memory order of the copy changes.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from tinygrad import Tensor, dtypes
from tinygrad.uop.ops import Ops, UOp

MIN_ROWS = 32  # a product's left rows from which packing its right operand pays for the copy


def block_order(shape: tuple[int, ...], axis: int, block: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """How `blocked` stores a tensor of `shape`: the shape with `axis` split into `axis/block` and
    `block` (all of `axis` as the block where `block` does not divide it), the permutation of that
    shape that is stored (the block's outer axis first, its lanes last), and its inverse."""
    n = shape[axis]
    if n % block:
        block = n
    split = (*shape[:axis], n // block, block, *shape[axis + 1 :])
    order = (axis, *(i for i in range(len(shape) + 1) if i not in (axis, axis + 1)), axis + 1)
    inverse = tuple(order.index(i) for i in range(len(shape) + 1))
    return split, order, inverse


def blocked(t: Tensor, axis: int, block: int) -> Tensor:
    """`t` with the same shape and values, stored with `axis` split into `axis/block` (outermost)
    and `block` (innermost); all of `axis` innermost where `block` does not divide it. A tensor
    whose `axis` is symbolic is returned as it is."""
    axis %= t.ndim
    if not all(isinstance(d, int) for d in t.shape):
        return t
    split, order, inverse = block_order(tuple(int(d) for d in t.shape), axis, block)
    return t.reshape(*split).permute(order).contiguous().permute(inverse).reshape(t.shape)


# the dtypes whose bytes numpy copies as they are (no bfloat16)
HOST_DTYPES = (dtypes.float32, dtypes.float16, dtypes.float64)


def blocked_on_host(t: Tensor, axis: int, block: int) -> Tensor:
    """`blocked` for a tensor with a fixed shape, copied in host memory now: the same bytes
    under the same view, without a kernel that tinygrad lowers in the first call (a model's
    weights would need one per shape). `blocked` where numpy or the dtype does not allow it."""
    try:
        import numpy as np
    except ImportError:
        return blocked(t, axis, block)
    if t.dtype not in HOST_DTYPES or not all(isinstance(d, int) for d in t.shape):
        return blocked(t, axis, block)
    axis %= t.ndim
    split, order, inverse = block_order(tuple(int(d) for d in t.shape), axis, block)
    host = np.ascontiguousarray(t.numpy().reshape(split).transpose(order))
    return Tensor(host, device=t.device).permute(inverse).reshape(t.shape)


OUT_CHANNELS = "kiln_out_channels"  # the option of a `Conv` node whose weights `reorder_conv_weights` padded


def padded_outputs(cout: int, block: int) -> int:
    """The output channels an ungrouped convolution's weights are padded to with zeros: the next
    multiple of the block, where that adds at most a sixteenth (SqueezeNet's 1000 to 1024: lanes of
    two whole vectors, and output channels that the CPU threads split evenly); else `cout`."""
    padded = -(-cout // block) * block
    return padded if cout > block and (padded - cout) * 16 <= cout else cout


def reorder_conv_weights(runner: Any, block: int, pad_outputs: bool = False) -> int:
    """Stores each initializer or `Constant` node's value that a `Conv` of an `OnnxRunner` reads
    as its weight blocked along its output channels, where the block divides each group's;
    returns how many it reordered. A weight another node also reads is the same tensor to it.
    With `pad_outputs`, the weights (and bias) of an ungrouped convolution that only `Conv`
    nodes read are padded with zero output channels first (`padded_outputs`), and each such node
    gets the option `OUT_CHANNELS`: the channels of its output to keep (ONNX's `Conv` on kiln's
    CPU, `kiln.tinygrad.compat`, takes it)."""
    values = runner.graph_values
    constants = {out: node.opts for node in runner.graph_nodes if node.op == "Constant" for out in node.outputs}
    convs = [node for node in runner.graph_nodes if node.op == "Conv" and len(node.inputs) > 1]
    groups = {node.inputs[1]: node.opts.get("group", 1) for node in convs}
    readers: dict[str, set[str]] = {}
    for node in runner.graph_nodes:
        for name in node.inputs:
            readers.setdefault(name, set()).add(node.op)
    done = 0
    for name, group in sorted(groups.items()):
        # where the weight is: an initializer's value, or the `value` of the Constant node making it
        holder, key = (values, name) if name in values else (constants.get(name, {}), "value")
        weight = holder.get(key)
        if not isinstance(weight, Tensor) or weight.ndim < 3:
            continue
        cout = weight.shape[0]
        if pad_outputs and group == 1 and isinstance(cout, int) and readers.get(name) == {"Conv"}:
            if (padded := padded_outputs(cout, block)) != cout and _pad_convs(runner, name, cout, padded):
                weight = weight.pad(((0, padded - cout), *((0, 0),) * (weight.ndim - 1)))
        # a grouped convolution gets blocks within its groups, of one vector or half of one
        # where two do not divide a group's channels (ShuffleNet's 136: 8 lanes over 7 pixels
        # rows beat 7 pixels as lanes); a depthwise one none (each output channel reads its own
        # input channel, so the image varies along the lanes too)
        per_group = weight.shape[0] // group if isinstance(weight.shape[0], int) and group > 0 else 0
        fits = [b for b in (block, block // 2, block // 4) if group == 1 or (per_group and per_group % b == 0)]
        if fits:
            holder[key] = blocked_on_host(weight, 0, fits[0])
            done += 1
    return done


def _pad_convs(runner: Any, weight: str, cout: int, padded: int) -> bool:
    """Gives every `Conv` node reading `weight` the option `OUT_CHANNELS` (`cout`) and pads the
    bias it reads, an initializer only convolutions read, to `padded` zeros; False (nothing
    changed) where a bias is anything else, or a node's output is the graph's (which must be a
    whole tensor, not the view of the channels kept)."""
    nodes = [n for n in runner.graph_nodes if n.op == "Conv" and n.inputs[1] == weight]
    if any(out in runner.graph_outputs for n in nodes for out in n.outputs):
        return False
    biases = {n.inputs[2] for n in nodes if len(n.inputs) > 2 and n.inputs[2]}
    for bias in biases:
        value = runner.graph_values.get(bias)
        only_convs = all(bias not in n.inputs or n.op == "Conv" for n in runner.graph_nodes)
        if not isinstance(value, Tensor) or value.shape != (cout,) or not only_convs:
            return False
    for bias in biases:
        runner.graph_values[bias] = runner.graph_values[bias].pad(((0, padded - cout),)).realize()
    for n in nodes:
        n.opts[OUT_CHANNELS] = cout
    return True


def _moved_to_front(reduce: UOp) -> tuple[UOp, int]:
    """The operand of a single-axis `REDUCE` and the axis it sums, in that operand's order
    (tinygrad permutes the summed axis to the front)."""
    src = reduce.src[0]
    if src.op is Ops.PERMUTE:
        return src.src[0], src.arg[0]
    return src, 0


def pack_lane_operand(reduce: UOp, block: int) -> Optional[UOp]:
    """`reduce` with its right operand stored in blocks of `block` columns, when `reduce` is an f32
    matrix product worth it (a sum over one axis of a product whose right operand varies along
    the summed axis and one output axis only, the last, which the block divides, and whose left
    operand has at least `MIN_ROWS` rows where the right one does not vary); else None."""
    if reduce.arg != (Ops.ADD, 1) or len(reduce.src) != 1:
        return None
    mul, k = _moved_to_front(reduce)
    if mul.op is not Ops.MUL or mul.dtype != dtypes.float32 or len(mul.src) != 2:
        return None
    x, w = mul.src
    if x.dtype != dtypes.float32 or w.dtype != dtypes.float32 or len(x.shape) != len(w.shape):
        return None
    if w.base.op is Ops.CONST or not all(isinstance(d, int) for d in (*x.shape, *w.shape)):
        return None
    out_axes = [i for i in range(len(w.shape)) if i != k]
    lanes = [i for i in out_axes if w.shape[i] != 1]
    if w.shape[k] < 2 or x.shape[k] != w.shape[k] or len(lanes) != 1 or lanes[0] != out_axes[-1]:
        return None
    n = lanes[0]
    if x.shape[n] != 1 or w.shape[n] % block:
        return None
    rows = 1
    for i in out_axes:
        rows *= int(x.shape[i])
    if rows < MIN_ROWS:
        return None
    packed = mul.replace(src=(x, blocked_uop(w, n, block)))
    src = reduce.src[0].replace(src=(packed,)) if reduce.src[0].op is Ops.PERMUTE else packed
    return reduce.replace(src=(src,))


def blocked_uop(u: UOp, axis: int, block: int) -> UOp:
    """`blocked` on a tensor graph node: `u` with the same shape and values, copied with `axis`
    split into `axis/block` (outermost) and `block` (innermost)."""
    shape = tuple(int(d) for d in u.shape)
    split, order, inverse = block_order(shape, axis, block)
    return u.reshape(split).permute(order).contiguous().permute(inverse).reshape(shape)


def pack_contractions(sink: UOp, block_of: Callable[[Any], Optional[int]]) -> UOp:
    """The tensor graph `sink` of one schedule with the right operand of each matrix product
    worth it (`pack_lane_operand`) copied in blocks of its columns, where `block_of` gives the
    block for the product's device (None: leave it). A right operand split across devices
    (`Tensor.shard` along an axis) is left as it is."""
    subs: dict[UOp, UOp] = {}
    for u in sink.toposort():
        if u.op is not Ops.REDUCE or (block := block_of(u.device)) is None:
            continue
        try:
            if u.axis is not None:
                continue
        except RuntimeError:  # split along several axes
            continue
        packed = pack_lane_operand(u, block)
        if packed is not None:
            subs[u] = packed
    return sink.substitute(subs) if subs else sink
