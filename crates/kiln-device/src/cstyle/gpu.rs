//! What the GPU dialects (OpenCL C, CUDA C++) spell alike, written once.
//!
//! Both keep f16 and bf16 as their bits (a 16-bit unsigned integer) in registers and memory
//! and compute them in f32 through kiln's helper functions `kiln_{f16,bf16}_to_f32` and
//! `kiln_f32_to_{f16,bf16}`, so no device needs native half support. On top of that they
//! share how a cast is routed through f32, how a bitcast the language cannot spell goes
//! through a union, and how a vector that is a struct of an array is stored lane by lane.
//! A dialect opts in with [`HalfBits`] (its few differing spellings) and calls these
//! functions from its [`Dialect`] methods.

use kiln_ir::{DType, Scalar};

use super::{Address, Dialect, Prelude};
use crate::error::{Error, Result};

/// How a dialect spells the primitives kiln's helper functions are written in.
#[derive(Debug, Clone, Copy)]
pub struct HelperSpelling {
    /// The qualifiers of a helper function: `static inline`, `static __device__ __forceinline__`.
    pub function: &'static str,
    /// The 16-bit unsigned integer type.
    pub u16: &'static str,
    /// The 32-bit unsigned integer type.
    pub u32: &'static str,
    /// The built-in that reinterprets a 32-bit unsigned as a float.
    pub float_from_bits: &'static str,
    /// The built-in that reinterprets a float as a 32-bit unsigned.
    pub bits_of_float: &'static str,
}

/// A dialect whose f16/bf16 values are their bits, computed in f32 (see the module docs).
pub trait HalfBits: Dialect {
    /// The spelling of the helper functions this module writes.
    const HELPERS: HelperSpelling;

    /// Registers `kiln_f16_to_f32` and `kiln_f32_to_f16` (round to nearest even).
    fn need_f16(&self, p: &mut Prelude);

    /// `e`, an f64, rounded once to f16 bits (a detour through f32 could round twice).
    fn f64_to_f16(&self, e: &str, p: &mut Prelude) -> String;

    /// `e` converted from float `from` to integer `to`, saturating, NaN to 0.
    fn float_to_int(&self, e: &str, from: Scalar, to: Scalar, p: &mut Prelude) -> String;

    /// A reinterpretation the language spells itself (OpenCL's `as_T`), else `None` and
    /// [`bitcast`] writes a union helper. `tt` is the C type of `to`.
    fn native_bitcast(&self, _e: &str, _from: DType, _to: DType, _tt: &str) -> Option<String> {
        None
    }
}

/// The C type of a value dtype (scalar or vector), registering what it needs.
pub fn value_type<D: Dialect + ?Sized>(d: &D, dt: DType, p: &mut Prelude) -> String {
    match dt {
        DType::Vector(s, w) => d.vector_type(s, w, p),
        DType::Scalar(s) => d.scalar_type(s, p),
        _ => "void".into(),
    }
}

/// Registers `kiln_bf16_to_f32` and `kiln_f32_to_bf16`: bf16 is the high half of an f32;
/// rounding is to nearest even, and a NaN stays a (quiet) NaN.
fn need_bf16<D: HalfBits>(p: &mut Prelude) {
    let HelperSpelling { function: fun, u16, u32, float_from_bits, bits_of_float } = D::HELPERS;
    p.need("bf16", |_| {
        format!(
            "{fun} float kiln_bf16_to_f32({u16} b) {{ return {float_from_bits}(({u32})b << 16); }}\n\
             {fun} {u16} kiln_f32_to_bf16(float f) {{\n\
             \x20 {u32} u = {bits_of_float}(f);\n\
             \x20 if ((u & 0x7fffffffu) > 0x7f800000u) return ({u16})((u >> 16) | 0x40u);\n\
             \x20 return ({u16})((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n\
             }}"
        )
    });
}

/// `e` (a value of `s`) as f32: [`Dialect::to_f32`].
pub fn to_f32<D: HalfBits>(d: &D, e: &str, s: Scalar, p: &mut Prelude) -> String {
    match s {
        Scalar::F32 => e.to_string(),
        Scalar::F16 => {
            d.need_f16(p);
            format!("kiln_f16_to_f32({e})")
        }
        Scalar::BF16 => {
            need_bf16::<D>(p);
            format!("kiln_bf16_to_f32({e})")
        }
        _ => format!("((float)({e}))"),
    }
}

/// `e` (an f32) rounded to `s`: [`Dialect::from_f32`].
pub fn from_f32<D: HalfBits>(d: &D, e: &str, s: Scalar, p: &mut Prelude) -> String {
    match s {
        Scalar::F32 => e.to_string(),
        Scalar::F16 => {
            d.need_f16(p);
            format!("kiln_f32_to_f16({e})")
        }
        Scalar::BF16 => {
            need_bf16::<D>(p);
            format!("kiln_f32_to_bf16({e})")
        }
        other => format!("(({})({e}))", d.scalar_type(other, p)),
    }
}

/// A scalar conversion with the core's semantics: [`Dialect::cast`]. f16/bf16 go through
/// f32 (f64 → f16 rounds once, through [`HalfBits::f64_to_f16`]); float → integer is
/// [`HalfBits::float_to_int`]; anything → bool is `!= 0`.
pub fn cast<D: HalfBits>(d: &D, e: &str, from: Scalar, to: Scalar, p: &mut Prelude) -> String {
    let half = |s: Scalar| matches!(s, Scalar::F16 | Scalar::BF16);
    if from == to {
        return e.to_string();
    }
    if half(from) {
        let f = to_f32(d, e, from, p);
        return if to == Scalar::Bool { format!("({f} != 0.0f)") } else { cast(d, &f, Scalar::F32, to, p) };
    }
    if to == Scalar::Bool {
        return format!("(({e}) != 0)");
    }
    if half(to) {
        if to == Scalar::F16 && from == Scalar::F64 {
            return d.f64_to_f16(e, p);
        }
        let f = cast(d, e, from, Scalar::F32, p);
        return from_f32(d, &f, to, p);
    }
    if from.is_float() && to.is_int() {
        return d.float_to_int(e, from, to, p);
    }
    format!("(({})({e}))", d.scalar_type(to, p))
}

/// Reinterprets the bytes of `e`: [`Dialect::bitcast`]. A bool result is `!= 0` (any
/// non-zero byte is true); what the language cannot spell goes through a union helper.
///
/// # Errors
/// [`Error::Render`] when the sizes differ.
pub fn bitcast<D: HalfBits>(d: &D, e: &str, from: DType, to: DType, p: &mut Prelude) -> Result<String> {
    if from.size() != to.size() {
        return Err(Error::Render(format!("bitcast {from} -> {to} changes the size")));
    }
    let (ft, tt) = (value_type(d, from, p), value_type(d, to, p));
    if ft == tt {
        return Ok(e.to_string());
    }
    match (from, to) {
        (_, DType::Scalar(Scalar::Bool)) => return Ok(format!("(({e}) != 0)")),
        (DType::Scalar(Scalar::Bool), DType::Scalar(_)) => return Ok(format!("(({tt})({e}))")),
        _ => {}
    }
    if let Some(native) = d.native_bitcast(e, from, to, &tt) {
        return Ok(native);
    }
    let name = format!("kiln_bitcast_{}_{}", ft.replace(' ', "_"), tt.replace(' ', "_"));
    let fun = D::HELPERS.function;
    p.need(&name, |_| format!("{fun} {tt} {name}({ft} x) {{ union {{ {ft} a; {tt} b; }} u; u.a = x; return u.b; }}"));
    Ok(format!("{name}({e})"))
}

/// Element `k` after `addr` as an lvalue or rvalue.
pub fn element(addr: &Address, k: u8) -> String {
    if k == 0 { format!("({})[{}]", addr.base, addr.index) } else { format!("({})[({}) + {k}]", addr.base, addr.index) }
}

/// A store of `value` element by element: a scalar, or a vector that is a struct of an
/// array `v` (without the final `;`).
pub fn store_elements(addr: &Address, value: &str, dtype: DType) -> String {
    match dtype {
        DType::Vector(_, w) => {
            let parts: Vec<String> = (0..w).map(|k| format!("{} = ({value}).v[{k}];", element(addr, k))).collect();
            format!("{{ {} }}", parts.join(" "))
        }
        _ => format!("{} = {value}", element(addr, 0)),
    }
}
