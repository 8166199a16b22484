//! Element types between kiln ([`Scalar`]), numpy and DLPack.

use kiln_ir::Scalar;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::errors::invalid_arg;

/// numpy's name of each dtype; bf16 has none.
pub fn numpy_name(s: Scalar) -> Option<&'static str> {
    Some(match s {
        Scalar::Bool => "bool",
        Scalar::I8 => "int8",
        Scalar::I16 => "int16",
        Scalar::I32 => "int32",
        Scalar::I64 => "int64",
        Scalar::U8 => "uint8",
        Scalar::U16 => "uint16",
        Scalar::U32 => "uint32",
        Scalar::U64 => "uint64",
        Scalar::F16 => "float16",
        Scalar::F32 => "float32",
        Scalar::F64 => "float64",
        Scalar::BF16 => return None,
    })
}

/// A dtype from a kiln name (`"f32"`), a numpy name (`"float32"`, `"bfloat16"`) or anything
/// `numpy.dtype()` accepts (`numpy.float32`, `numpy.dtype("<f4")`).
pub fn parse(dtype: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    let py = dtype.py();
    let name: String = if let Ok(s) = dtype.cast::<PyString>() {
        s.to_cow()?.into_owned()
    } else {
        let numpy = py.import("numpy").map_err(|_| {
            invalid_arg(py, "a dtype that is not a name (e.g. \"f32\") needs numpy, which is not installed")
        })?;
        let numpy_dtype = numpy.getattr("dtype")?.call1((dtype,)).map_err(|e| {
            invalid_arg(py, format!("{dtype} is not a dtype ({e}): use a kiln name such as \"f32\" or a numpy dtype"))
        })?;
        numpy_dtype.getattr("name")?.extract()?
    };
    by_name(&name).ok_or_else(|| {
        invalid_arg(
            py,
            format!(
                "unknown dtype `{name}`: use a kiln name ({}) or its numpy name",
                Scalar::ALL.map(|s| s.name()).join(", ")
            ),
        )
    })
}

fn by_name(name: &str) -> Option<Scalar> {
    name.parse().ok().or_else(|| match name {
        "bfloat16" => Some(Scalar::BF16),
        _ => Scalar::ALL.into_iter().find(|&s| numpy_name(s) == Some(name)),
    })
}

/// DLPack's type code and bit width of a dtype.
pub fn to_dlpack(s: Scalar) -> (u8, u8) {
    const INT: u8 = 0;
    const UINT: u8 = 1;
    const FLOAT: u8 = 2;
    const BFLOAT: u8 = 4;
    const BOOL: u8 = 6;
    let code = match s {
        Scalar::Bool => BOOL,
        Scalar::BF16 => BFLOAT,
        s if s.is_float() => FLOAT,
        s if s.is_signed() => INT,
        _ => UINT,
    };
    (code, (s.size() * 8) as u8)
}

/// The dtype of a DLPack type code and width (single lane), if kiln has it.
pub fn from_dlpack(code: u8, bits: u8) -> Option<Scalar> {
    Scalar::ALL.into_iter().find(|&s| to_dlpack(s) == (code, bits))
}

/// numpy's array-interface type string (`<f4`), when numpy has the dtype.
pub fn typestr(s: Scalar) -> Option<String> {
    let kind = match s {
        Scalar::Bool => 'b',
        Scalar::BF16 => return None,
        s if s.is_float() => 'f',
        s if s.is_signed() => 'i',
        _ => 'u',
    };
    let order = if s.size() == 1 {
        '|'
    } else if cfg!(target_endian = "little") {
        '<'
    } else {
        '>'
    };
    Some(format!("{order}{kind}{}", s.size()))
}
