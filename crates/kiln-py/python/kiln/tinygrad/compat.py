"""Every change `kiln.tinygrad` makes to tinygrad's behaviour, in one declared table (`PATCHES`),
written for tinygrad 0.14.0.

No tinygrad file changes: each entry replaces one name that tinygrad looks up when it runs, and
names the parameters of the original it was written against, who sees the change (its scope)
and why. A change to results or graphs applies to KILN devices only (the replacement checks the
device and otherwise calls tinygrad's original); the two ONNX loader bug fixes apply to every
device and are listed as such. `install` applies the entries whose target still has the expected
parameters and warns once per entry it skips, by name (`KilnPatchWarning`); `python -m
kiln.tinygrad.compat` prints the table and which entries apply to the installed tinygrad.

kiln's tinygrad registration (`_kiln_tinygrad`, run by `kiln-tinygrad.pth` at start-up) calls
`install` when tinygrad is imported and `install_onnx` when `tinygrad.nn.onnx` is, so every
process with kiln's wheel, tinygrad's worker processes included, has the same changes before it
schedules anything; importing kiln's device module patches nothing by itself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import sys
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional

from tinygrad import Device, Tensor, codegen, dtypes
from tinygrad.engine import realize
from tinygrad.helpers import ALLOW_DEVICE_USAGE, JIT_BATCH_SIZE
from tinygrad.uop.ops import Ops, UOp

from . import beam, concat, layout, lowered, onnx_inputs, onnx_tensors, originals, tile

TINYGRAD_VERSION = "0.14.0"
DEFAULT_JIT_BATCH_SIZE = 32  # tinygrad's own default of `JIT_BATCH_SIZE`
GLOBAL_POOLS = ("GlobalAveragePool", "GlobalMaxPool")


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
    return originals.tinygrad(originals.KERNEL_GRAPH)(layout.pack_contractions(sink, block_of))


def realized_input(pool: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """An ONNX global pooling op whose input is realized first on kiln's CPU."""

    def pool_realized(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return pool(x.contiguous() if tiling_renderer(x.device) is not None else x, *args, **kwargs)

    return pool_realized


def padded_image_input(conv: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """ONNX's `Conv` on kiln's CPU, with a padded input padded and realized first. The
    convolution then reads the image without a bounds test per tap: a register tile whose lanes
    are the image's width (a depthwise convolution's) loads whole vectors instead of one gated
    lane at a time, and one whose lanes are output channels broadcasts each row's pixel without
    one (PP-OCR's 3×3 convolutions ran a third faster, ResNet-50 5%). The same zeros are
    multiplied in, so the same bits come out. With `kiln_out_channels` (the option
    `layout.reorder_conv_weights` gives a node whose weights it padded with zero output
    channels), only those channels of the output are kept."""

    def conv_padded(X: Tensor, W: Tensor, B: Optional[Tensor] = None, auto_pad: str = "NOTSET", dilations: Any = 1,
                    group: int = 1, kernel_shape: Any = None, pads: Any = 0, strides: Any = 1,
                    kiln_out_channels: Optional[int] = None) -> Tensor:
        dims = len(W.shape) - 2
        flat = list(pads) if isinstance(pads, (list, tuple)) else [pads] * (2 * dims)
        flat = flat * 2 if len(flat) == dims else flat
        if tiling_renderer(X.device) is not None and auto_pad == "NOTSET" and len(flat) == 2 * dims and any(flat) and min(flat) >= 0:
            # the image realized first: a convolution producing it then writes it unpadded,
            # reading whole rows too (fused with the pad, its lanes would be gated reads)
            X = X.contiguous().pad(((0, 0), (0, 0), *zip(flat[:dims], flat[dims:]))).contiguous()
            pads = 0
        out = conv(X, W, B, auto_pad, dilations, group, kernel_shape, pads, strides)
        # weights padded with zero output channels (`layout.reorder_conv_weights`): the channels
        # kept, of the whole output realized (a slice alone would be computed as one)
        return out if kiln_out_channels is None else out.contiguous()[:, :kiln_out_channels]

    return conv_padded


def _pool_padding(X: Tensor, kernel_shape: Any, auto_pad: str, ceil_mode: int, pads: Any, strides: Any) -> Optional[tuple]:
    """For ONNX's pooling ops on kiln's CPU: the padding of each axis of `X`, (before, after), by
    the node's explicit `pads`, where padding `X` first gives the pool's windows unchanged (no
    `auto_pad`, no `ceil_mode`, whose extra padding depends on the pads) and pays for the copy: a
    pool of stride 1 over rows of at least one vector (LLVM vectorizes its loop over a row; a
    13-pixel row stays scalar, and a stride of 2 gathers its lanes either way); else None."""
    dims = len(kernel_shape)
    flat = list(pads) if isinstance(pads, (list, tuple)) else [pads] * (2 * dims)
    flat = flat * 2 if len(flat) == dims else flat
    renderer = tiling_renderer(X.device)
    if (renderer is None or auto_pad != "NOTSET" or ceil_mode or len(flat) != 2 * dims or not any(flat)
            or min(flat) < 0 or not dtypes.is_float(X.dtype) or not isinstance(X.shape[-1], int)):
        return None
    stride_1 = all(s == 1 for s in (strides if isinstance(strides, (list, tuple)) else [strides]))
    if not stride_1 or X.shape[-1] < tile.vector_bytes(renderer) // X.dtype.itemsize:
        return None
    return ((0, 0),) * (X.ndim - dims) + tuple(zip(flat[:dims], flat[dims:]))


def padded_max_pool_input(max_pool: Callable[..., Any]) -> Callable[..., Any]:
    """ONNX's `MaxPool` on kiln's CPU with a padded input padded with -inf (tinygrad's pad value)
    into a buffer of its own first (`_pool_padding`): the pool then reads whole rows without a
    bounds test per tap, a loop LLVM vectorizes (a 3×3 pool of stride 1 over 256×28×28: 279 µs
    gated, 91 µs padded, plus the padding copy). The input is realized first, so that an input
    other nodes read too (an Inception block's concatenation) is computed once. Each window
    holds the same values in the same order, so the same max comes out; the indices output is
    tinygrad's own."""

    def max_pool_padded(X: Tensor, kernel_shape: Any, auto_pad: str = "NOTSET", ceil_mode: int = 0,
                        dilations: Any = 1, pads: Any = 0, storage_order: int = 0, strides: Any = 1) -> Any:
        values, indices = max_pool(X, kernel_shape, auto_pad, ceil_mode, dilations, pads, storage_order, strides)
        if (padding := _pool_padding(X, kernel_shape, auto_pad, ceil_mode, pads, strides)) is not None:
            padded = X.realize().pad(padding, value=X.dtype.min).contiguous()
            values, _ = max_pool(padded, kernel_shape, auto_pad, ceil_mode, dilations, 0, storage_order, strides)
        return values, indices

    return max_pool_padded


def padded_average_pool_input(average_pool: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """ONNX's `AveragePool` on kiln's CPU with `count_include_pad=1`: a padded input padded with
    zeros and realized first, as `MaxPool`'s; tinygrad's sums over the same windows of the same
    values in the same order, divided by the window's size. (With `count_include_pad=0` the
    divisor is a count per output pixel, which tinygrad folds into a constant reciprocal in some
    lanes and not others depending on the kernel's upcasts: a kernel of another shape than
    tinygrad's own then rounds some quotients otherwise, so that pool is left as it is.)"""

    def average_pool_padded(X: Tensor, kernel_shape: Any, auto_pad: str = "NOTSET", ceil_mode: int = 0,
                            count_include_pad: int = 0, dilations: Any = 1, pads: Any = 0, strides: Any = 1) -> Tensor:
        padding = _pool_padding(X, kernel_shape, auto_pad, ceil_mode, pads, strides) if count_include_pad else None
        if padding is None:
            return average_pool(X, kernel_shape, auto_pad, ceil_mode, count_include_pad, dilations, pads, strides)
        padded = X.realize().pad(padding).contiguous()
        return average_pool(padded, kernel_shape, auto_pad, ceil_mode, count_include_pad, dilations, 0, strides)

    return average_pool_padded


def strided_transpose_as_product(conv_transpose: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """ONNX's `ConvTranspose` on kiln's CPU, where its kernel is its stride (2×2 by 2: PP-OCR's
    upsampling) and nothing else is set: each output pixel then takes exactly one tap, so it is a
    1×1 convolution into `cout·kh·kw` channels (a contraction with a register tile) whose channels
    are then spread over the pixels. tinygrad's own form sums every tap over an input with zeros
    between its pixels, three of four products zero, in a kernel without a tile. The nonzero
    products are summed over the same input channels in the same order."""

    def transposed(X: Tensor, W: Tensor, B: Optional[Tensor] = None, auto_pad: str = "NOTSET", dilations: Any = 1,
                   group: int = 1, kernel_shape: Any = None, pads: Any = None, output_shape: Any = None,
                   output_padding: Any = 0, strides: Any = 1) -> Tensor:
        kernel = tuple(W.shape[2:])
        dims = len(kernel)

        def each(v: Any) -> tuple[Any, ...]:
            return tuple(v) if isinstance(v, (list, tuple)) else (v,) * dims

        plain = (dims == 2 and group == 1 and auto_pad == "NOTSET" and not any(each(pads or 0))
                 and each(dilations) == (1, 1) and not any(each(output_padding)) and each(strides) == kernel
                 and all(isinstance(d, int) for d in (*X.shape, *W.shape)))
        if tiling_renderer(X.device) is None or not plain or (output_shape is not None and tuple(output_shape)[-2:] !=
                                                               tuple(int(X.shape[i + 2]) * kernel[i] for i in range(2))):
            return conv_transpose(X, W, B, auto_pad, dilations, group, kernel_shape, pads, output_shape, output_padding,
                                  strides)
        (n, cin, h, w), (cout, kh, kw) = X.shape, W.shape[1:]
        taps = W.permute(1, 2, 3, 0).reshape(cout * kh * kw, cin, 1, 1)  # output channel and tap first
        # the product realized as it comes (whole vectors stored), then spread by whoever reads it
        out = X.conv2d(taps).contiguous().reshape(n, cout, kh, kw, h, w).permute(0, 1, 4, 2, 5, 3)
        out = out.reshape(n, cout, h * kh, w * kw)
        return out if B is None else out + B.reshape(1, cout, 1, 1)

    return transposed


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
    return originals.tinygrad(originals.LOWER_AND_COMPILE)(linear)


def graph_split(linear: UOp, max_batch_size: int = 0) -> UOp:
    """tinygrad's `graph_split_rewrite`, with no limit on a batch's calls on KILN devices where
    the user did not choose `JIT_BATCH_SIZE`."""
    chosen = "JIT_BATCH_SIZE" in os.environ or JIT_BATCH_SIZE.value != DEFAULT_JIT_BATCH_SIZE
    if not chosen and on_kiln_only(linear):
        max_batch_size = 0
    return originals.tinygrad(originals.GRAPH_SPLIT)(linear, max_batch_size=max_batch_size)


def open_parse_input(parse_input: Callable[..., Any]) -> Callable[..., Any]:
    """`OnnxRunner._parse_input` reading dimensions of -1 and "?" as open ones."""

    def parse(self: Any, name: str, value: Any, spec: Any) -> Any:
        return parse_input(self, name, value, onnx_inputs.open_dims(name, spec))

    return parse


def init_with_kiln_layout(init_from_graph: Callable[..., Any]) -> Callable[..., Any]:
    """`OnnxRunner._init_from_graph`, then convolution weights in blocks of the register tile's
    lanes where the default device is a kiln CPU device."""

    def init(self: Any, graph: dict, *args: Any, **kwargs: Any) -> None:
        init_from_graph(self, graph, *args, **kwargs)
        renderer = tiling_renderer(Device.DEFAULT)
        if renderer is not None:
            # output channels padded only where kiln's `Conv` (which keeps the node's) is in place
            conv_applied = f"{ONNX}:onnx_ops[Conv]" in APPLIED
            layout.reorder_conv_weights(self, lane_block(renderer), pad_outputs=conv_applied)

    return init


def parse_empty_tensors(parse: Callable[..., Any]) -> Callable[..., Any]:
    onnx = sys.modules["tinygrad.nn.onnx"]
    return onnx_tensors.parse_empty(parse, lambda t: onnx.OnnxDataType(t).to_dtype())


def late(get: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """A function that calls what `get()` returns when it is called: the module that defines the
    replacement may still be importing when tinygrad's import applies the table (a module of
    `kiln.tinygrad` imported before tinygrad)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return get()(*args, **kwargs)

    return call


KILN = "KILN devices"
KILN_CPU = "kiln's CPU devices"
EVERY_DEVICE = "every device (a bug fix)"


@dataclass(frozen=True)
class Patch:
    """One change to tinygrad: `target` (`module:attribute.path`, `[key]` for a dict entry) is
    replaced by `make(original)`, if the original takes `params`. (The replacements of tinygrad's
    core call the originals this module read at import, which `install` passes to `make`.)"""

    target: str
    params: tuple[str, ...]
    scope: str
    why: str
    make: Callable[[Any], Any]


ONNX = "tinygrad.nn.onnx"
PATCHES: tuple[Patch, ...] = (
    Patch(originals.POOL, (), KILN,
          "BEAM compiles each round of kiln candidates in one batch (`kiln.tinygrad.beam`)",
          lambda original: late(lambda: beam.KilnBeamPool)),
    Patch(originals.HEURISTIC, ("k",), KILN_CPU,
          "contractions get kiln's register tile (`kiln.tinygrad.tile`); other kernels keep tinygrad's heuristic",
          lambda original: late(lambda: tile.hand_coded_optimizations)),
    Patch(originals.KERNEL_GRAPH, ("args", "kwargs"), KILN,
          "a concatenation's computed inputs get kernels of their own (`kiln.tinygrad.concat`), and on kiln's CPU "
          "a matrix product's right operand is copied in blocks of the tile's columns (`layout.pack_contractions`)",
          lambda original: late(lambda: kernel_graph)),
    Patch(originals.GRAPH_SPLIT, ("linear", "max_batch_size"), KILN,
          "a captured TinyJit on KILN devices is one graph batch, so one `kiln.Plan`, unless `JIT_BATCH_SIZE` is chosen",
          lambda original: late(lambda: graph_split)),
    Patch(originals.LOWER_AND_COMPILE, ("linear",), KILN,
          "an eager schedule whose programs are all lowered already is built without walking them",
          lambda original: late(lambda: lower_and_compile)),
    Patch(originals.TO_PROGRAM, ("ast", "renderer"), KILN_CPU,
          "lowered programs are kept in tinygrad's disk cache for later processes (`kiln.tinygrad.lowered`)",
          lambda original: late(lambda: lowered.to_program)),
    Patch(f"{ONNX}:OnnxRunner._parse_input", ("self", "name", "value", "spec"), EVERY_DEVICE,
          "input dimensions of -1 and \"?\" are open ones, as onnxruntime reads them (`kiln.tinygrad.onnx_inputs`)",
          open_parse_input),
    Patch(f"{ONNX}:OnnxPBParser._parse_TensorProto", ("self",), EVERY_DEVICE,
          "a tensor with no elements and no data field loads as an empty tensor (`kiln.tinygrad.onnx_tensors`)",
          parse_empty_tensors),
    Patch(f"{ONNX}:OnnxRunner._init_from_graph", ("self", "graph", "is_subgraph"), KILN_CPU,
          "convolution weights are stored in blocks of output channels, the register tile's lanes (`kiln.tinygrad.layout`)",
          init_with_kiln_layout),
    Patch(f"{ONNX}:onnx_ops[Conv]",
          ("X", "W", "B", "auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"), KILN_CPU,
          "a padded input is padded first, so the tile reads the image without a bounds test per tap; weights padded "
          "with zero output channels (`layout`) have the output cut back",
          padded_image_input),
    Patch(f"{ONNX}:onnx_ops[ConvTranspose]",
          ("X", "W", "B", "auto_pad", "dilations", "group", "kernel_shape", "pads", "output_shape", "output_padding",
           "strides"), KILN_CPU,
          "a transposed convolution whose kernel is its stride is a 1×1 convolution with a register tile, its "
          "channels then spread over the pixels",
          strided_transpose_as_product),
    Patch(f"{ONNX}:onnx_ops[MaxPool]",
          ("X", "kernel_shape", "auto_pad", "ceil_mode", "dilations", "pads", "storage_order", "strides"), KILN_CPU,
          "a padded input is padded with -inf first, so the pool reads whole rows without a bounds test per tap",
          padded_max_pool_input),
    Patch(f"{ONNX}:onnx_ops[AveragePool]",
          ("X", "kernel_shape", "auto_pad", "ceil_mode", "count_include_pad", "dilations", "pads", "strides"), KILN_CPU,
          "with count_include_pad=1, a padded input is padded with zeros first, so the pool reads whole rows "
          "without a bounds test per tap", padded_average_pool_input),
    *(Patch(f"{ONNX}:onnx_ops[{name}]", ("X",), KILN_CPU,
            "the input is realized first, so the convolution before it is not fused into a nested reduction "
            "that gets no register tile", realized_input) for name in GLOBAL_POOLS),
)


class KilnPatchWarning(UserWarning):
    """A change in `PATCHES` that kiln did not apply: its target is missing or takes other parameters."""


# target -> kiln's replacement, for each applied patch; target -> why not, for each skipped one
APPLIED: dict[str, Any] = {}
SKIPPED: dict[str, str] = {}


def _slot(patch: Patch) -> tuple[Any, str, bool]:
    """(the object holding the target, its attribute or key, whether it is a key)."""
    module, path = patch.target.split(":")
    owner: Any = sys.modules.get(module) or importlib.import_module(module)
    *parents, last = path.split(".")
    for name in parents:
        owner = getattr(owner, name)
    if last.endswith("]"):
        name, key = last[:-1].split("[")
        return getattr(owner, name), key, True
    return owner, last, False


def _apply(patch: Patch) -> None:
    if patch.target in APPLIED or patch.target in SKIPPED:
        return
    try:
        owner, name, is_key = _slot(patch)
        original = owner[name] if is_key else getattr(owner, name)
        params = tuple(inspect.signature(original).parameters)
    except (ImportError, AttributeError, KeyError, TypeError, ValueError) as e:
        reason = f"not found ({type(e).__name__}: {e})"
    else:
        if params == patch.params:
            originals.REPLACED[patch.target] = original
            APPLIED[patch.target] = replacement = patch.make(original)
            if is_key:
                owner[name] = replacement
            else:
                setattr(owner, name, replacement)
            return
        reason = f"takes ({', '.join(params)}), not ({', '.join(patch.params)})"
    SKIPPED[patch.target] = reason
    warnings.warn(
        f"kiln.tinygrad: not applying {patch.target} (tinygrad {installed_version()}): it {reason}; "
        f"kiln wrote this change for tinygrad {TINYGRAD_VERSION}, so on {patch.scope} tinygrad keeps its own "
        f"behaviour here: {patch.why}",
        KilnPatchWarning,
        stacklevel=3,
    )


def installed_version() -> str:
    return importlib.metadata.version("tinygrad")


def install() -> None:
    """Applies the patches of tinygrad's core (idempotent); those of `tinygrad.nn.onnx` when it is
    imported (`install_onnx`). Under another tinygrad than the one the table was written for, it
    says so once: the entries whose targets kept their shape still apply."""
    if installed_version() != TINYGRAD_VERSION and not (APPLIED or SKIPPED):
        warnings.warn(
            f"kiln.tinygrad: tinygrad {installed_version()} is installed, and kiln's changes to tinygrad were written "
            f"for {TINYGRAD_VERSION}; those whose targets kept their shape apply (`python -m kiln.tinygrad.compat` "
            "lists them)",
            KilnPatchWarning,
            stacklevel=2,
        )
    for patch in PATCHES:
        if not patch.target.startswith(ONNX + ":"):
            _apply(patch)


def install_onnx(onnx_module: ModuleType) -> None:
    """Applies the patches of a just-imported `tinygrad.nn.onnx` (idempotent)."""
    del onnx_module  # the patches find it in `sys.modules`
    for patch in PATCHES:
        if patch.target.startswith(ONNX + ":"):
            _apply(patch)


def report() -> str:
    """The table, each entry with whether it applies to the installed tinygrad."""
    lines = [f"kiln.tinygrad patches, written for tinygrad {TINYGRAD_VERSION}; installed: tinygrad {installed_version()}"]
    for p in PATCHES:
        state = "applied" if p.target in APPLIED else f"SKIPPED: {SKIPPED[p.target]}" if p.target in SKIPPED else "not installed"
        lines.append(f"- {p.target} [{p.scope}]: {state}\n    {p.why}")
    return "\n".join(lines)


# tinygrad imported while this module was being imported (it was imported first) asked for the
# table then; it is applied now that the module is whole
READY = True
_kiln_tinygrad_hook: Any = sys.modules.get("_kiln_tinygrad")
if _kiln_tinygrad_hook is not None:
    _kiln_tinygrad_hook.apply_pending()


if __name__ == "__main__":
    # this file runs as `__main__`, a second copy: the table in effect is the imported module's
    import tinygrad.nn.onnx  # noqa: F401  (kiln's import hook applies the ONNX entries)

    from kiln.tinygrad import compat as installed

    installed.install()
    installed.install_onnx(tinygrad.nn.onnx)
    print(installed.report())
    sys.exit(1 if installed.SKIPPED else 0)
