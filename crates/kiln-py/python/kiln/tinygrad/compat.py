"""Every change `kiln.tinygrad` makes to tinygrad's behaviour, in one place, for tinygrad 0.14.0.

No tinygrad file changes: each change replaces one name that tinygrad looks up when it runs.

- `search.get_worker_pool` (always): BEAM compiles each round of kiln candidates in one batch
  (`kiln.tinygrad.beam`); other renderers keep tinygrad's pool.
- `heuristic.hand_coded_optimizations`: contractions on kiln's CPU get kiln's register tile
  (`kiln.tinygrad.tile`); other kernels and devices keep tinygrad's heuristic.
- `schedule.get_kernel_graph` (every schedule on KILN devices): the computed inputs of a
  concatenation get kernels of their own, and on kiln's CPU the concatenation too
  (`kiln.tinygrad.concat`), instead of being fused into one kernel that runs every input's
  reduction for each element of the result.
- `OnnxRunner._parse_input`, when `tinygrad.nn.onnx` is imported (the import hook of
  `_kiln_tinygrad` calls `install_onnx`; this module never imports it, since importing it makes
  tensors): input dimensions of -1 and "?" are open ones (`kiln.tinygrad.onnx_inputs`).
- `schedule.get_kernel_graph` on kiln's CPU: in each schedule, the right operand of a large
  enough f32 matrix product is copied in blocks of the register tile's columns first
  (`kiln.tinygrad.layout.pack_contractions`); on several KILN devices too, where that operand is
  whole on each (replicated weights, not a `shard` split). The copy is an intermediate buffer of
  that schedule, never a tensor's, so every tensor reads what it reads on tinygrad's devices
  (around `assign` and optimizer steps too); the schedule cache keeps the rewritten graph.
- `OnnxPBParser._parse_TensorProto`, likewise: a tensor with no elements and no data field (which
  ONNX allows) loads as an empty tensor (`kiln.tinygrad.onnx_tensors`).
- ONNX's `GlobalAveragePool` and `GlobalMaxPool` (`onnx_ops`), likewise: on kiln's CPU their input
  is realized first. tinygrad otherwise fuses the convolution before them into the pooling
  kernel, a sum nested in another reduction, which gets no register tile (magika's one
  convolution ran at 12 GFLOP/s that way, SqueezeNet's last at 15).
- `OnnxRunner._init_from_graph`, likewise: on kiln's CPU, convolution weights are stored in
  blocks of output channels, the register tile's lanes (`kiln.tinygrad.layout`).
- `realize.to_program` (kernels of kiln's CPU devices): the programs tinygrad lowers for them are
  kept in tinygrad's disk cache and read by later processes instead of being lowered again
  (`kiln.tinygrad.lowered`).
- `realize.lower_and_compile` (schedules on KILN devices only): where every program of a
  schedule is lowered already (an eager op run again), the compiled schedule is built without
  walking the programs.
- `jit.graph_split_rewrite`: a captured TinyJit whose calls all run on KILN devices is one
  graph batch, so one `kiln.Plan` (`KilnGraph`), however many devices it spans, unless the user
  chose `JIT_BATCH_SIZE` (in the environment, or a value other than tinygrad's default 32).
  tinygrad otherwise cuts the JIT into batches of 32, 64, 128, … calls, so that a GPU starts on
  one batch while the next is built; a kiln plan runs to completion when called, so the cuts
  would only add waits between plans and keep the plan from running independent work (the
  devices of a sharded step) at once across them.

`install` runs when `kiln.tinygrad.device` is imported, so tinygrad's compile worker processes
(which import it to unpickle the renderer) get the changes too. Under another tinygrad version
only the BEAM pool is installed (it reads nothing of tinygrad's internals but the pool's use).
"""

from __future__ import annotations

import importlib.metadata
import os
from types import ModuleType
from typing import Any, Callable, Optional

from tinygrad import Device, Tensor, codegen, schedule
from tinygrad.codegen.opt import heuristic, search
from tinygrad.engine import jit, realize
from tinygrad.helpers import ALLOW_DEVICE_USAGE, JIT_BATCH_SIZE
from tinygrad.uop.ops import Ops, UOp

from . import concat, layout, lowered, onnx_inputs, onnx_tensors, tile

TINYGRAD_VERSION = "0.14.0"
tinygrad_kernel_graph = schedule.get_kernel_graph
tinygrad_graph_split = jit.graph_split_rewrite
tinygrad_lower_and_compile = realize.lower_and_compile
DEFAULT_JIT_BATCH_SIZE = 32  # tinygrad's own default of `JIT_BATCH_SIZE`
GLOBAL_POOLS = ("GlobalAveragePool", "GlobalMaxPool")


def pinned() -> bool:
    """Whether the installed tinygrad is the version these changes were written for."""
    return importlib.metadata.version("tinygrad") == TINYGRAD_VERSION


def lane_block(renderer: Any) -> int:
    """Two vectors of f32 lanes: the columns of one register tile on kiln's CPU."""
    return 2 * tile.vector_bytes(renderer) // 4


# the renderer of each KILN device opened so far that tiles contractions (kiln's CPU), by its
# tinygrad name; `Device[...]` opens devices, which tinygrad forbids inside `@function`
TILING: dict[str, Any] = {}


def opened(name: str, renderer: Any) -> None:
    """Records KILN device `name` (canonical, as `Device` names it) with its renderer."""
    if getattr(renderer, "contraction_tiles", False):
        TILING[name] = renderer


def on_kiln(device: Any) -> bool:
    """Whether `device` (a tensor's: a name, or a tuple of them) is one or more KILN devices."""
    devices = device if isinstance(device, tuple) else (device,)
    return bool(devices) and all(isinstance(d, str) and d.split(":")[0] == "KILN" for d in devices)


def tiling_renderer(device: Any) -> Optional[Any]:
    """The renderer of `device` if it is an opened kiln CPU device (a renderer with
    `contraction_tiles`); for a tensor on several devices (`Tensor.shard`), that of its KILN
    devices (they share one backend)."""
    if not on_kiln(device):
        return None
    devices = device if isinstance(device, tuple) else (device,)
    if devices[0] not in TILING and ALLOW_DEVICE_USAGE:
        Device[devices[0]]  # opening it records it (`opened`)
    return TILING.get(devices[0])


def kernel_graph(sink: UOp) -> UOp:
    """tinygrad's `get_kernel_graph`, with the matrix products of kiln's CPU devices packed
    (`kiln.tinygrad.layout.pack_contractions`)."""

    def block_of(device: Any) -> Optional[int]:
        renderer = tiling_renderer(device)
        return None if renderer is None else lane_block(renderer)

    sink = concat.realize_concatenations(sink, on_kiln, lambda device: tiling_renderer(device) is not None)
    return tinygrad_kernel_graph(layout.pack_contractions(sink, block_of))


def realized_input(pool: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """An ONNX global pooling op whose input is realized first on kiln's CPU."""

    def pool_realized(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return pool(x.contiguous() if tiling_renderer(x.device) is not None else x, *args, **kwargs)

    return pool_realized


def on_kiln_only(linear: UOp) -> bool:
    """Whether every call of a captured JIT's `linear` runs on KILN devices."""
    args = [b for si in linear.src for b in si.src[1:] if not b.is_bound_var]
    devices = tuple({d for b in args for d in (b.device if isinstance(b.device, tuple) else (b.device,))})
    return on_kiln(devices)


def lower_and_compile(linear: UOp) -> UOp:
    """tinygrad's `lower_and_compile`, which returns `linear` with each call's kernel replaced by
    its compiled program: where every call is on KILN devices and every program is in tinygrad's
    cache already (an eager op run again), the same result built directly, without
    `UOp.substitute`, which walks every node of each program (its linearized kernel: thousands
    of nodes for a register tile) on every call."""
    if linear.op is Ops.LINEAR and on_kiln_only(linear):
        todo = {c: a for c in linear.toposort() if c.op is Ops.CALL and (a := realize._get_call_to_compile(c)) is not None}
        programs = {c: codegen.to_program_cache.get(codegen.to_program_key(*a)) for c, a in todo.items() if a[0] is c.src[0]}
        if set(todo) <= set(linear.src) and len(programs) == len(todo) and None not in programs.values():
            return linear.replace(src=tuple(c.replace(src=(programs[c], *c.src[1:])) if c in programs else c for c in linear.src))
    return tinygrad_lower_and_compile(linear)


def graph_split(linear: UOp, max_batch_size: int = 0) -> UOp:
    """tinygrad's `graph_split_rewrite`, with no limit on a batch's calls on KILN devices where
    the user did not choose `JIT_BATCH_SIZE`."""
    chosen = "JIT_BATCH_SIZE" in os.environ or JIT_BATCH_SIZE.value != DEFAULT_JIT_BATCH_SIZE
    if not chosen and on_kiln_only(linear):
        max_batch_size = 0
    return tinygrad_graph_split(linear, max_batch_size=max_batch_size)


def install() -> None:
    """Installs the changes above (idempotent)."""
    from . import beam  # it imports kiln.tinygrad.device, which calls this at its end

    search.get_worker_pool = beam.KilnBeamPool
    if pinned():
        heuristic.hand_coded_optimizations = tile.hand_coded_optimizations
        schedule.get_kernel_graph = kernel_graph
        jit.graph_split_rewrite = graph_split
        realize.lower_and_compile = lower_and_compile
        realize.to_program = lowered.to_program


def install_onnx(onnx_module: ModuleType) -> None:
    """Wraps `OnnxRunner._parse_input` and `_init_from_graph`, the global pools of `onnx_ops`
    and `OnnxPBParser._parse_TensorProto` of a just-imported `tinygrad.nn.onnx` (idempotent)."""
    runner: Any = onnx_module.OnnxRunner
    if not pinned() or getattr(runner, "_kiln_installed", False):
        return
    parse_input = runner._parse_input

    def open_parse_input(self: Any, name: str, value: Any, spec: Any) -> Any:
        return parse_input(self, name, value, onnx_inputs.open_dims(name, spec))

    runner._parse_input = open_parse_input
    init_from_graph = runner._init_from_graph

    def init_with_kiln_layout(self: Any, graph: dict, *args: Any, **kwargs: Any) -> None:
        init_from_graph(self, graph, *args, **kwargs)
        renderer = tiling_renderer(Device.DEFAULT)
        if renderer is not None:
            layout.reorder_conv_weights(self, lane_block(renderer))

    runner._init_from_graph = init_with_kiln_layout
    runner._kiln_installed = True
    ops = onnx_module.onnx_ops  # the dict every OnnxRunner looks its ops up in
    for name in GLOBAL_POOLS:
        if callable(ops.get(name)):
            ops[name] = realized_input(ops[name])
    pb: Any = onnx_module.OnnxPBParser
    pb._parse_TensorProto = onnx_tensors.parse_empty(pb._parse_TensorProto, lambda t: onnx_module.OnnxDataType(t).to_dtype())
