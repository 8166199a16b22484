//! Host-side values of every kiln dtype: one [`Value`] model, its exact byte encoding, and
//! buffer upload/download by [`Scalar`], so one test body covers all dtypes (including
//! `bool`, `f16` and `bf16`, which have no [`kiln_device::Element`] impl).

use std::fmt;

use half::{bf16, f16};
use kiln_device::kiln_ir::{Scalar, bf16_bits, f16_bits};
use kiln_device::{Buffer, Device};

use crate::Failure;

/// One element of any dtype. Integers of every width fit `i128`; every float (f16, bf16,
/// f32) is exactly an `f64`.
#[derive(Clone, Copy, Debug)]
pub enum Value {
    B(bool),
    I(i128),
    F(f64),
}

impl Value {
    /// Whether `self` and `other` are the same value: NaN equals NaN, and floats compare
    /// by bits otherwise (so `-0.0` differs from `0.0`).
    pub fn same(self, other: Value) -> bool {
        match (self, other) {
            (Value::B(a), Value::B(b)) => a == b,
            (Value::I(a), Value::I(b)) => a == b,
            (Value::F(a), Value::F(b)) => (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits(),
            _ => false,
        }
    }

    pub fn as_f64(self) -> f64 {
        match self {
            Value::B(b) => b as u8 as f64,
            Value::I(i) => i as f64,
            Value::F(f) => f,
        }
    }

    pub fn as_i128(self) -> i128 {
        match self {
            Value::B(b) => b as i128,
            Value::I(i) => i,
            // Only used on integer dtypes; floats saturate like Rust's `as`.
            Value::F(f) => f as i128,
        }
    }

    pub fn as_bool(self) -> bool {
        match self {
            Value::B(b) => b,
            Value::I(i) => i != 0,
            Value::F(f) => f != 0.0,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::B(b) => write!(f, "{b}"),
            Value::I(i) => write!(f, "{i}"),
            Value::F(x) => write!(f, "{x:?}"),
        }
    }
}

/// `v` wrapped to the integer type `s` (two's complement truncation, like Rust's `as`).
pub fn wrap_int(v: i128, s: Scalar) -> i128 {
    match s {
        Scalar::I8 => v as i8 as i128,
        Scalar::I16 => v as i16 as i128,
        Scalar::I32 => v as i32 as i128,
        Scalar::I64 => v as i64 as i128,
        Scalar::U8 => v as u8 as i128,
        Scalar::U16 => v as u16 as i128,
        Scalar::U32 => v as u32 as i128,
        Scalar::U64 => v as u64 as i128,
        _ => v,
    }
}

/// `v` rounded to float type `s` (round to nearest even), as an exact f64. f16 and bf16 round
/// as the renderers round constants (`half`'s `from_f64` misrounds values just above a tie).
pub fn round_float(v: f64, s: Scalar) -> f64 {
    match s {
        Scalar::F16 => f16::from_bits(f16_bits(v)).to_f64(),
        Scalar::BF16 => bf16::from_bits(bf16_bits(v)).to_f64(),
        Scalar::F32 => v as f32 as f64,
        _ => v,
    }
}

/// `v` as a value of dtype `s`: the host-side normalization every input goes through, so
/// the reference computes with exactly what the device sees.
pub fn normalize(v: Value, s: Scalar) -> Value {
    match s {
        Scalar::Bool => Value::B(v.as_bool()),
        s if s.is_float() => Value::F(round_float(v.as_f64(), s)),
        s => Value::I(wrap_int(v.as_i128(), s)),
    }
}

/// Appends the native-endian bytes of `v` as dtype `s` (normalized first).
pub fn encode(v: Value, s: Scalar, out: &mut Vec<u8>) {
    let v = normalize(v, s);
    match (s, v) {
        (Scalar::Bool, v) => out.push(v.as_bool() as u8),
        (Scalar::I8, v) => out.extend((v.as_i128() as i8).to_ne_bytes()),
        (Scalar::I16, v) => out.extend((v.as_i128() as i16).to_ne_bytes()),
        (Scalar::I32, v) => out.extend((v.as_i128() as i32).to_ne_bytes()),
        (Scalar::I64, v) => out.extend((v.as_i128() as i64).to_ne_bytes()),
        (Scalar::U8, v) => out.extend((v.as_i128() as u8).to_ne_bytes()),
        (Scalar::U16, v) => out.extend((v.as_i128() as u16).to_ne_bytes()),
        (Scalar::U32, v) => out.extend((v.as_i128() as u32).to_ne_bytes()),
        (Scalar::U64, v) => out.extend((v.as_i128() as u64).to_ne_bytes()),
        (Scalar::F16, v) => out.extend(f16::from_f64(v.as_f64()).to_bits().to_ne_bytes()),
        (Scalar::BF16, v) => out.extend(bf16::from_f64(v.as_f64()).to_bits().to_ne_bytes()),
        (Scalar::F32, v) => out.extend((v.as_f64() as f32).to_ne_bytes()),
        (Scalar::F64, v) => out.extend(v.as_f64().to_ne_bytes()),
    }
}

/// Decodes one element of dtype `s` from exactly `s.size()` bytes. A bool byte other than
/// 0 or 1 is an error (kiln's bools are 0/1 in memory).
pub fn decode(bytes: &[u8], s: Scalar) -> Result<Value, String> {
    if bytes.len() != s.size() {
        return Err(format!("{} bytes for one {s}", bytes.len()));
    }
    let mut b8 = [0u8; 8];
    b8[..bytes.len()].copy_from_slice(bytes);
    let [a0, a1, a2, a3, ..] = b8;
    let b2 = [a0, a1];
    let b4 = [a0, a1, a2, a3];
    Ok(match s {
        Scalar::Bool => match a0 {
            0 => Value::B(false),
            1 => Value::B(true),
            other => return Err(format!("bool byte {other} is neither 0 nor 1")),
        },
        Scalar::I8 => Value::I(a0 as i8 as i128),
        Scalar::U8 => Value::I(a0 as i128),
        Scalar::I16 => Value::I(i16::from_ne_bytes(b2) as i128),
        Scalar::U16 => Value::I(u16::from_ne_bytes(b2) as i128),
        Scalar::I32 => Value::I(i32::from_ne_bytes(b4) as i128),
        Scalar::U32 => Value::I(u32::from_ne_bytes(b4) as i128),
        Scalar::I64 => Value::I(i64::from_ne_bytes(b8) as i128),
        Scalar::U64 => Value::I(u64::from_ne_bytes(b8) as i128),
        Scalar::F16 => Value::F(f16::from_bits(u16::from_ne_bytes(b2)).to_f64()),
        Scalar::BF16 => Value::F(bf16::from_bits(u16::from_ne_bytes(b2)).to_f64()),
        Scalar::F32 => Value::F(f32::from_ne_bytes(b4) as f64),
        Scalar::F64 => Value::F(f64::from_ne_bytes(b8)),
    })
}

/// Whether `a` and `b`, the bytes of one element of dtype `s` each, hold the same bits, or both
/// a NaN. Which NaN an operation returns (its sign and payload) is unspecified in C, in LLVM IR
/// and in IEEE 754, and compilers commute operands freely (x86's `addss` returns its first
/// operand's NaN, so `inf * 0 + NaN` gives the sign of whichever operand was put first): two
/// compilers of one kernel may write NaNs of different bits. Everything else, `-0.0` against
/// `0.0` included, must match bit for bit.
pub fn same_bits(a: &[u8], b: &[u8], s: Scalar) -> bool {
    let nan = |bytes: &[u8]| matches!(decode(bytes, s), Ok(Value::F(x)) if x.is_nan());
    a == b || (nan(a) && nan(b))
}

/// The bytes of `values` as dtype `s`.
pub fn encode_all(values: &[Value], s: Scalar) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * s.size());
    for v in values {
        encode(*v, s, &mut out);
    }
    out
}

/// A new buffer of dtype `s` on `dev` holding `values`.
pub fn upload(dev: &Device, s: Scalar, values: &[Value]) -> Result<Buffer, Failure> {
    let buf = dev.buffer(s, values.len())?;
    buf.copyin(&encode_all(values, s))?;
    Ok(buf)
}

/// The contents of `buf`, decoded by its dtype. Undecodable bytes (a bool that is not 0/1)
/// are a violation.
pub fn download(buf: &Buffer) -> Result<Vec<Value>, Failure> {
    let s = buf.dtype();
    let mut bytes = vec![0u8; buf.nbytes()];
    buf.copyout(&mut bytes)?;
    bytes
        .chunks_exact(s.size())
        .enumerate()
        .map(|(i, c)| decode(c, s).map_err(|m| Failure::Violation(format!("element {i} of a {s} buffer: {m}"))))
        .collect()
}

/// Launches `kernel` at `vals` over new buffers of `dev` holding `inputs` (each parameter's
/// bytes, in slot order) and returns every buffer's bytes afterwards.
///
/// # Errors
/// The device's errors: allocation, upload, launch (such as [`kiln_device::Error::OutOfBounds`]),
/// download.
pub fn launch_bytes(
    dev: &Device,
    kernel: &kiln_device::Kernel,
    inputs: &[Vec<u8>],
    vals: &[i64],
) -> Result<Vec<Vec<u8>>, kiln_device::Error> {
    let bufs = kernel
        .spec
        .params
        .iter()
        .zip(inputs)
        .map(|(p, bytes)| {
            let b = dev.buffer(p.scalar, bytes.len() / p.scalar.size())?;
            b.copyin(bytes)?;
            Ok(b)
        })
        .collect::<Result<Vec<Buffer>, kiln_device::Error>>()?;
    kernel.launch(&bufs.iter().collect::<Vec<_>>(), vals)?;
    bufs.iter()
        .map(|b| {
            let mut bytes = vec![0u8; b.nbytes()];
            b.copyout(&mut bytes)?;
            Ok(bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_bytes() {
        let samples = [Value::I(-3), Value::I(200), Value::F(2.5), Value::F(-0.0), Value::B(true), Value::F(f64::NAN)];
        for s in Scalar::ALL {
            for v in samples {
                let n = normalize(v, s);
                let mut bytes = Vec::new();
                encode(v, s, &mut bytes);
                assert_eq!(bytes.len(), s.size());
                assert!(decode(&bytes, s).unwrap().same(n), "{s} {v:?}");
            }
        }
        assert!(decode(&[7], Scalar::Bool).is_err());
        assert!(decode(&[0, 0], Scalar::I32).is_err());
    }

    #[test]
    fn normalization_is_rusts_as() {
        assert!(normalize(Value::I(300), Scalar::U8).same(Value::I(44)));
        assert!(normalize(Value::I(-1), Scalar::U32).same(Value::I(u32::MAX as i128)));
        assert!(normalize(Value::F(0.1), Scalar::F32).same(Value::F(0.1f32 as f64)));
        assert!(normalize(Value::F(65520.0), Scalar::F16).same(Value::F(f64::INFINITY)));
        // Just above a tie, a value rounds up, as the C compiler rounds an f16 constant.
        let above_tie = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(round_float(above_tie, Scalar::F16), 1.0 + 2f64.powi(-10));
        assert_eq!(round_float(1.0 + 2f64.powi(-8) + 2f64.powi(-40), Scalar::BF16), 1.0 + 2f64.powi(-7));
        assert!(Value::F(f64::NAN).same(Value::F(-f64::NAN)));
        let bits = |v: f32| v.to_ne_bytes();
        assert!(same_bits(&bits(f32::NAN), &bits(-f32::NAN), Scalar::F32));
        assert!(!same_bits(&bits(0.0), &bits(-0.0), Scalar::F32));
        assert!(!same_bits(&bits(1.0), &bits(f32::NAN), Scalar::F32));
        assert!(!same_bits(&0x7fc0_0000u32.to_ne_bytes(), &0xffc0_0000u32.to_ne_bytes(), Scalar::U32));
        assert!(!Value::F(0.0).same(Value::F(-0.0)));
    }
}
