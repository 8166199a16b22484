"""kiln as a tinygrad device: `DEV=KILN` runs any tinygrad program on kiln (tinygrad 0.14.0).

    DEV=KILN python -c "from tinygrad import Tensor; print((Tensor([1,2,3])+1).tolist())"

`DEV=KILN` (or `KILN:CPU`) is kiln's CPU, `DEV=KILN:OPENCL` and `DEV=KILN:CUDA` kiln's OpenCL and
CUDA devices: tinygrad's `DEVICE:RENDERER` target convention, where the renderer names the kiln
backend. A tensor's device `KILN:1` is the backend's device 1: on the CPU the virtual device
`CPU:1` (its own queues and threads; `KILN_CPU_DEVICES=n` splits the cores between `CPU:0` ..
`CPU:n-1`), so `Tensor.shard(("KILN:0", "KILN:1"))` runs data-parallel work on kiln, and a
TinyJit of it is one kiln plan spanning the devices (`kiln.tinygrad.device.KilnGraph`).

Registration. tinygrad opens a device `X` by importing `tinygrad.runtime.ops_x`. kiln's wheel
installs `kiln-tinygrad.pth`, which runs `_kiln_tinygrad.install()` at interpreter start-up:
that puts a finder on `sys.meta_path` answering the name `tinygrad.runtime.ops_kiln` with a
module whose `KilnDevice` is `kiln.tinygrad.device.KilnDevice`, and `tinygrad` and
`tinygrad.nn.onnx` with tinygrad's own modules, after which kiln's declared changes to them apply
(`kiln.tinygrad.compat.PATCHES`, acting on KILN devices only but for two ONNX loader fixes); no
other name. Nothing of kiln is imported until tinygrad is, and no tinygrad file changes. Where
`.pth` files are not processed (`python -S`), calling `kiln.tinygrad.install()` does the same.

Saving. `save_jit(jit, path)` saves a captured TinyJit on a KILN device as a kiln plan file
(`kiln.tinygrad.saving`), which `kiln.load_plan` runs in any process without tinygrad.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from _kiln_tinygrad import install


def save_jit(jit: Any, path: Union[str, Path], *, names: Optional[Union[Sequence[str], Mapping[Union[int, str], str]]] = None,
             outputs: Optional[Union[Sequence[str], Mapping[Union[int, str], str]]] = None) -> int:
    """Saves captured TinyJit `jit` to the plan file `path`; returns its size in bytes. See
    `kiln.tinygrad.saving.save_jit` (imported here on first use: importing `kiln.tinygrad`
    imports no tinygrad)."""
    from .saving import save_jit as save

    return save(jit, path, names=names, outputs=outputs)


__all__ = ["install", "save_jit"]
