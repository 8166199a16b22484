"""A fix to tinygrad 0.14.0's ONNX runner, applied when `tinygrad.nn.onnx` is imported in a process
with kiln's wheel installed (the import hook of `kiln.tinygrad`), so it serves every device.

Some exporters (paddle2onnx, for PP-OCR's direction classifier in rapidocr-onnxruntime 1.4.4)
write a graph input's unknown dimensions as the number -1 and as the name "?" on several axes
(`x: [-1, 3, ?, ?]`). Both mean "any size" (onnxruntime runs such a model with any), but
`OnnxRunner` compares -1 with the real size ("has mismatch on dim=0. Expected -1"), and binds
every "?" to one size, so a 48×192 image fails on its width ("Expected 48, received 192").
`install` wraps `OnnxRunner._parse_input` so that each such dimension is an open one of its own,
named after the input and the axis (`x:0`): the first call binds it and later calls must agree,
as for any named dimension. Nothing else changes, and under another tinygrad version `install`
leaves the runner alone.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from types import ModuleType
from typing import Any

TINYGRAD_VERSION = "0.14.0"


def _anonymous(d: object) -> bool:
    return (isinstance(d, int) and d < 0) or d == "?"


def open_dims(name: str, spec: Any) -> Any:
    """`spec` with each dimension of -1 or "?" replaced by an open one named `name:axis`."""
    if not any(_anonymous(d) for d in spec.shape):
        return spec
    shape = tuple(f"{name}:{axis}" if _anonymous(d) else d for axis, d in enumerate(spec.shape))
    return dataclasses.replace(spec, shape=shape)


def install(onnx_module: ModuleType) -> None:
    """Wraps `OnnxRunner._parse_input` of tinygrad's just-imported `tinygrad.nn.onnx` (idempotent), on
    the tinygrad version this was written for. (Not imported here: importing it makes tensors.)"""
    runner = onnx_module.OnnxRunner
    if importlib.metadata.version("tinygrad") != TINYGRAD_VERSION or getattr(runner, "_kiln_open_dims", False):
        return
    tinygrad_parse_input = runner._parse_input

    def parse_input(self: Any, name: str, value: Any, spec: Any) -> Any:
        return tinygrad_parse_input(self, name, value, open_dims(name, spec))

    runner._parse_input = parse_input
    runner._kiln_open_dims = True
