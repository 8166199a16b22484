"""Empty tensors in ONNX files, for tinygrad 0.14.0's protobuf parser
(`kiln.tinygrad.compat.install_onnx` wraps `OnnxPBParser._parse_TensorProto` with `parse_empty`).

ONNX writes a tensor with no elements (dims `[0]`) without any data field, and exporters use
such tensors as "not given" (paddle2onnx, for the `roi` and `scales` of a Resize in PP-OCRv4's
text detector in rapidocr-onnxruntime 1.4.4). tinygrad's parser asserts exactly one data field
("only 1 data field is allowed"), so the model does not load. After that assertion the parser has
read the whole tensor; `parse_empty` reads it again, and where it has no data field and no
elements, returns it as an empty tensor of its dtype and shape. Any other failure is raised as
before.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from tinygrad import Tensor

# TensorProto's data fields: float_data, int32_data, int64_data, raw_data, double_data, uint64_data
DATA_FIELDS = {4, 5, 7, 9, 10, 11}


def parse_empty(parse: Callable[[Any], dict], data_type: Callable[[int], Any]) -> Callable[[Any], dict]:
    """`parse` (an `OnnxPBParser._parse_TensorProto`) that also reads empty tensors;
    `data_type` maps an ONNX data type number to a tinygrad dtype."""

    def parse_tensor(parser: Any) -> dict:
        reader = parser.reader
        start = reader.tell()
        try:
            return parse(parser)
        except AssertionError:
            end = reader.tell()
            reader.seek(start)
            obj: dict[str, Any] = {"dims": []}
            has_data = False
            for field, wire_type in parser._parse_message(parser._decode_end_pos()):
                if field == 1:
                    obj["dims"].append(reader.read_int64())
                elif field == 2:
                    obj["data_type"] = reader.read_int64()
                elif field == 8:
                    obj["name"] = reader.read_string()
                else:
                    has_data |= field in DATA_FIELDS
                    reader.skip_field(wire_type)
            reader.seek(end)
            if has_data or math.prod(obj["dims"]) != 0 or "data_type" not in obj:
                raise
            obj["parsed_tensor"] = Tensor.empty(*obj["dims"], dtype=data_type(obj["data_type"]))
            return obj

    return parse_tensor
