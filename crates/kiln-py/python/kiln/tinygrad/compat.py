"""Every change `kiln.tinygrad` makes to tinygrad's behaviour, in one place, for tinygrad 0.14.0.

No tinygrad file changes: each change replaces one name that tinygrad looks up when it runs.

- `search.get_worker_pool` (always): BEAM compiles each round of kiln candidates in one batch
  (`kiln.tinygrad.beam`); other renderers keep tinygrad's pool.
- `heuristic.hand_coded_optimizations`: contractions on kiln's CPU get kiln's register tile
  (`kiln.tinygrad.tile`); other kernels and devices keep tinygrad's heuristic.
- `Tensor.cat` on kiln's devices: the inputs are realized first (`contiguous`, nothing to do for
  a realized tensor), then tinygrad's `cat` copies them. tinygrad otherwise fuses a concatenation
  into the kernels that produce its inputs, and a convolution concatenated to earlier channels (a
  DenseNet layer, an Inception block) then runs its reduction for every channel of the result,
  the earlier ones masked off: DenseNet-121 ran 4.7× slower on kiln's CPU that way.
- `OnnxRunner._parse_input`, when `tinygrad.nn.onnx` is imported (the import hook of
  `_kiln_tinygrad` calls `install_onnx`; this module never imports it, since importing it makes
  tensors): input dimensions of -1 and "?" are open ones (`kiln.tinygrad.onnx_inputs`).
- `OnnxRunner._init_from_graph`, likewise: on kiln's CPU, the weights of ungrouped convolutions
  are stored in blocks of output channels, the register tile's lanes (`kiln.tinygrad.onnx_layout`).

`install` runs when `kiln.tinygrad.device` is imported, so tinygrad's compile worker processes
(which import it to unpickle the renderer) get the changes too. Under another tinygrad version
only the BEAM pool is installed (it reads nothing of tinygrad's internals but the pool's use).
"""

from __future__ import annotations

import importlib.metadata
from types import ModuleType
from typing import Any

from tinygrad import Device, Tensor
from tinygrad.codegen.opt import heuristic, search

from . import onnx_inputs, onnx_layout, tile

TINYGRAD_VERSION = "0.14.0"
tinygrad_cat = Tensor.cat


def pinned() -> bool:
    """Whether the installed tinygrad is the version these changes were written for."""
    return importlib.metadata.version("tinygrad") == TINYGRAD_VERSION


def cat(self: Tensor, *args: Tensor, dim: int = 0) -> Tensor:
    """tinygrad's `Tensor.cat`, with the inputs realized first on kiln's devices."""
    if isinstance(self.device, str) and self.device.split(":")[0] == "KILN":
        self, args = self.contiguous(), tuple(a.contiguous() for a in args)
    return tinygrad_cat(self, *args, dim=dim)


def install() -> None:
    """Installs the changes above (idempotent)."""
    from . import beam  # it imports kiln.tinygrad.device, which calls this at its end

    search.get_worker_pool = beam.KilnBeamPool
    if pinned():
        heuristic.hand_coded_optimizations = tile.hand_coded_optimizations
        Tensor.cat = cat  # type: ignore[method-assign]


def install_onnx(onnx_module: ModuleType) -> None:
    """Wraps `OnnxRunner._parse_input` and `_init_from_graph` of a just-imported
    `tinygrad.nn.onnx` (idempotent)."""
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
        renderer = Device[Device.DEFAULT].renderer
        if getattr(renderer, "contraction_tiles", False):
            # two vectors of f32 lanes: the output channels of one register tile
            onnx_layout.reorder_conv_weights(self, 2 * tile.vector_bytes(renderer) // 4)

    runner._init_from_graph = init_with_kiln_layout
    runner._kiln_installed = True
