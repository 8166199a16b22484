"""A fix to tinygrad 0.14.0's ONNX runner, which `kiln.tinygrad.compat.install_onnx` applies when
`tinygrad.nn.onnx` is imported in a process with kiln's wheel (so it serves every device).

Some exporters (paddle2onnx, for PP-OCR's direction classifier in rapidocr-onnxruntime 1.4.4)
write a graph input's unknown dimensions as the number -1 and as the name "?" on several axes
(`x: [-1, 3, ?, ?]`). Both mean "any size" (onnxruntime runs such a model with any), but
`OnnxRunner` compares -1 with the real size ("has mismatch on dim=0. Expected -1"), and binds
every "?" to one size, so a 48×192 image fails on its width ("Expected 48, received 192").
`OnnxRunner._parse_input` then sees each such dimension as an open one of its own, named after
the input and the axis (`x:0`): the first call binds it and later calls must agree, as for any
named dimension. Nothing else changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def _anonymous(d: object) -> bool:
    return (isinstance(d, int) and d < 0) or d == "?"


def open_dims(name: str, spec: Any) -> Any:
    """`spec` with each dimension of -1 or "?" replaced by an open one named `name:axis`."""
    if not any(_anonymous(d) for d in spec.shape):
        return spec
    shape = tuple(f"{name}:{axis}" if _anonymous(d) else d for axis, d in enumerate(spec.shape))
    return dataclasses.replace(spec, shape=shape)

