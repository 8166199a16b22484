"""Convolution weights with the output channel innermost, for kiln's CPU (tinygrad 0.14.0's ONNX
runner; `kiln.tinygrad.compat.install_onnx` applies it after `OnnxRunner._init_from_graph`).

kiln's register tile (`kiln.tinygrad.tile`) puts a vector's lanes along an output axis on which
one operand is contiguous and the other does not vary. ONNX stores a convolution's weights as
`[cout, cin, kh, kw]`, so the only such axis is the image's width, and only without a stride:
a 7×7 image gives 7 lanes of 16, a stride-2 convolution gets no tile, and a padded one gathers
its lanes. With the weights stored `[cin, kh, kw, cout]` (the same tensor, another memory order),
the output channels are contiguous in the weights and absent from the image: every convolution
gets whole vectors of output channels, each step of its reduction loading them once and
broadcasting one input pixel per row.

ONNX initializers are constants, so the new order is computed once, on the first call (a
`contiguous` copy that the first call realizes and later calls read). Only the weights of
ungrouped convolutions (`group` 1) change; a weight another node also reads is the same tensor
to it, in the new order. Nothing else changes.
"""

from __future__ import annotations

from typing import Any

from tinygrad import Tensor


def blocked(weight: Tensor, block: int) -> Tensor:
    """`weight` ([cout, cin, k...]) with the same values, stored as `[cout/block, cin, k..., block]`
    (all of cout innermost where `block` does not divide it)."""
    cout, rest = weight.shape[0], weight.shape[1:]
    if not isinstance(cout, int) or cout % block:
        block = cout
    n = weight.ndim + 1
    order = (0, *range(2, n), 1)
    stored = weight.reshape(cout // block, block, *rest).permute(*order).contiguous()
    return stored.permute(0, n - 1, *range(1, n - 1)).reshape(weight.shape)


def reorder_conv_weights(runner: Any, block: int) -> int:
    """Stores each initializer that an ungrouped `Conv` reads as its weight in `blocked` order;
    returns how many it reordered."""
    values = runner.graph_values
    names = {
        node.inputs[1]
        for node in runner.graph_nodes
        if node.op == "Conv" and len(node.inputs) > 1 and node.opts.get("group", 1) == 1
    }
    done = 0
    for name in sorted(names):
        weight = values.get(name)
        if isinstance(weight, Tensor) and weight.ndim >= 3:
            values[name] = blocked(weight, block)
            done += 1
    return done
