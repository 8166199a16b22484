//! Element types and device names.
//!
//! A [`DType`] is a scalar, a short vector of one scalar, a pointer to either, or `void`
//! (the type of effects such as STORE and SINK). Every dtype has exactly one text form,
//! printed by `Display` and read back by `FromStr`, so the kernel text format is exact.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use crate::IrError;

pub mod half;

/// A scalar element type. Integers wrap (two's complement); floats are IEEE binary formats
/// (bf16 is the top half of an f32); `Bool` is one byte holding 0 or 1 in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scalar {
    /// `true`/`false`: one byte, 0 or 1, in memory.
    Bool,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer: the type of index arithmetic ([`DType::INDEX`]).
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE binary16. Backends compute in f32 and round once per op unless they have native f16.
    F16,
    /// bfloat16: an f32 with its low 16 mantissa bits dropped, computed in f32.
    BF16,
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
}

impl Scalar {
    /// Every scalar type, in declaration order (so tests can cover each one).
    pub const ALL: [Scalar; 13] = [
        Scalar::Bool,
        Scalar::I8,
        Scalar::I16,
        Scalar::I32,
        Scalar::I64,
        Scalar::U8,
        Scalar::U16,
        Scalar::U32,
        Scalar::U64,
        Scalar::F16,
        Scalar::BF16,
        Scalar::F32,
        Scalar::F64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            Scalar::Bool | Scalar::I8 | Scalar::U8 => 1,
            Scalar::I16 | Scalar::U16 | Scalar::F16 | Scalar::BF16 => 2,
            Scalar::I32 | Scalar::U32 | Scalar::F32 => 4,
            Scalar::I64 | Scalar::U64 | Scalar::F64 => 8,
        }
    }

    /// f16, bf16, f32 or f64.
    pub const fn is_float(self) -> bool {
        matches!(self, Scalar::F16 | Scalar::BF16 | Scalar::F32 | Scalar::F64)
    }

    /// A signed or unsigned integer (not `Bool`).
    pub const fn is_int(self) -> bool {
        !self.is_float() && !matches!(self, Scalar::Bool)
    }

    /// A signed integer (floats, bool and unsigned integers are not).
    pub const fn is_signed(self) -> bool {
        matches!(self, Scalar::I8 | Scalar::I16 | Scalar::I32 | Scalar::I64)
    }

    /// The smallest and largest value of an integer type (`None` for bool and floats).
    pub const fn int_range(self) -> Option<(i128, i128)> {
        let bits = (self.size() * 8) as u32;
        if !self.is_int() {
            None
        } else if self.is_signed() {
            Some((-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1))
        } else {
            Some((0, (1i128 << bits) - 1))
        }
    }

    /// The largest finite value of a float type, and the magnitude from which a finite value
    /// rounds to infinity in it (round to nearest, ties to even: the largest finite value
    /// plus half an ulp). `None` for integers, bool and f64 (every finite f64 fits).
    pub fn float_limits(self) -> Option<(f64, f64)> {
        // (stored mantissa bits, largest exponent)
        let (man, emax) = match self {
            Scalar::F16 => (10, 15),
            Scalar::BF16 => (7, 127),
            Scalar::F32 => (23, 127),
            _ => return None,
        };
        let max = (2.0 - 2f64.powi(-man)) * 2f64.powi(emax);
        let overflow = (2.0 - 2f64.powi(-man - 1)) * 2f64.powi(emax);
        Some((max, overflow))
    }

    /// The short name used in text and in NumPy-like contexts (`f32`, `u8`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Scalar::Bool => "bool",
            Scalar::I8 => "i8",
            Scalar::I16 => "i16",
            Scalar::I32 => "i32",
            Scalar::I64 => "i64",
            Scalar::U8 => "u8",
            Scalar::U16 => "u16",
            Scalar::U32 => "u32",
            Scalar::U64 => "u64",
            Scalar::F16 => "f16",
            Scalar::BF16 => "bf16",
            Scalar::F32 => "f32",
            Scalar::F64 => "f64",
        }
    }
}

impl FromStr for Scalar {
    type Err = IrError;
    fn from_str(s: &str) -> Result<Self, IrError> {
        Scalar::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| IrError::Invalid(format!("unknown scalar type `{s}`")))
    }
}

/// Where a pointer points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrSpace {
    /// Device memory reachable by every work item (kernel parameters).
    Global,
    /// Work-group shared memory.
    Local,
}

/// The type of a UOp's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// No value: effects (STORE, SINK, END of a loop without a result).
    Void,
    /// One scalar.
    Scalar(Scalar),
    /// `width` lanes of one scalar (2 ≤ width ≤ 64).
    Vector(Scalar, u8),
    /// A pointer to elements of `scalar`. Its length (PARAM's operand) and INDEX offsets count
    /// elements of `scalar`, not of the `width`-lane vectors it loads and stores.
    Ptr {
        /// The element type.
        scalar: Scalar,
        /// Lanes moved by one LOAD or STORE through it (1 = scalar access).
        width: u8,
        /// Global (kernel parameters) or work-group local memory.
        space: AddrSpace,
    },
}

impl DType {
    /// A scalar `bool` (comparisons, gates, WHERE conditions).
    pub const BOOL: DType = DType::Scalar(Scalar::Bool);
    /// A scalar `i32`.
    pub const I32: DType = DType::Scalar(Scalar::I32);
    /// A scalar `i64`.
    pub const I64: DType = DType::Scalar(Scalar::I64);
    /// A scalar `u8`.
    pub const U8: DType = DType::Scalar(Scalar::U8);
    /// A scalar `f16`.
    pub const F16: DType = DType::Scalar(Scalar::F16);
    /// A scalar `f32`.
    pub const F32: DType = DType::Scalar(Scalar::F32);
    /// A scalar `f64`.
    pub const F64: DType = DType::Scalar(Scalar::F64);
    /// The type of index arithmetic produced by the builder.
    pub const INDEX: DType = DType::I32;

    /// A vector of `width` lanes; `width == 1` gives the scalar.
    pub fn vec(scalar: Scalar, width: u8) -> DType {
        if width <= 1 { DType::Scalar(scalar) } else { DType::Vector(scalar, width) }
    }

    /// A global pointer to `scalar` elements.
    pub fn ptr(scalar: Scalar) -> DType {
        DType::Ptr { scalar, width: 1, space: AddrSpace::Global }
    }

    /// The scalar underneath (for pointers: the pointee's scalar).
    pub fn scalar(self) -> Option<Scalar> {
        match self {
            DType::Void => None,
            DType::Scalar(s) | DType::Vector(s, _) | DType::Ptr { scalar: s, .. } => Some(s),
        }
    }

    /// Number of lanes of a value (1 for scalars, 0 for void); for pointers, the access width.
    pub fn width(self) -> u8 {
        match self {
            DType::Void => 0,
            DType::Scalar(_) => 1,
            DType::Vector(_, w) | DType::Ptr { width: w, .. } => w,
        }
    }

    /// The value type a load through this pointer produces.
    pub fn pointee(self) -> Option<DType> {
        match self {
            DType::Ptr { scalar, width, .. } => Some(DType::vec(scalar, width)),
            _ => None,
        }
    }

    /// The same dtype with one lane (vectors) or unchanged.
    pub fn lane(self) -> DType {
        match self {
            DType::Vector(s, _) => DType::Scalar(s),
            other => other,
        }
    }

    /// A pointer of either address space.
    pub fn is_ptr(self) -> bool {
        matches!(self, DType::Ptr { .. })
    }

    /// A float scalar or vector (pointers to floats are not).
    pub fn is_float(self) -> bool {
        !self.is_ptr() && self.scalar().is_some_and(Scalar::is_float)
    }

    /// An integer scalar or vector (pointers to integers are not).
    pub fn is_int(self) -> bool {
        !self.is_ptr() && self.scalar().is_some_and(Scalar::is_int)
    }

    /// A bool scalar or vector.
    pub fn is_bool(self) -> bool {
        !self.is_ptr() && self.scalar() == Some(Scalar::Bool)
    }

    /// Bytes of one value (pointers: 8).
    pub fn size(self) -> usize {
        match self {
            DType::Void => 0,
            DType::Scalar(s) => s.size(),
            DType::Vector(s, w) => s.size() * w as usize,
            DType::Ptr { .. } => 8,
        }
    }
}

impl From<Scalar> for DType {
    fn from(s: Scalar) -> Self {
        DType::Scalar(s)
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DType::Void => f.write_str("void"),
            DType::Scalar(s) => write!(f, "{s}"),
            DType::Vector(s, w) => write!(f, "{s}x{w}"),
            DType::Ptr { scalar, width, space } => {
                let space = match space {
                    AddrSpace::Global => "ptr",
                    AddrSpace::Local => "lptr",
                };
                write!(f, "{space}<{}>", DType::vec(scalar, width))
            }
        }
    }
}

impl FromStr for DType {
    type Err = IrError;
    fn from_str(s: &str) -> Result<Self, IrError> {
        let bad =
            || IrError::Invalid(format!("unknown dtype `{s}` (examples: f32, f32x4, ptr<f32>, lptr<f32x4>, void)"));
        if s == "void" {
            return Ok(DType::Void);
        }
        for (prefix, space) in [("ptr<", AddrSpace::Global), ("lptr<", AddrSpace::Local)] {
            if let Some(inner) = s.strip_prefix(prefix).and_then(|r| r.strip_suffix('>')) {
                let inner: DType = inner.parse().map_err(|_| bad())?;
                return match inner {
                    DType::Scalar(scalar) => Ok(DType::Ptr { scalar, width: 1, space }),
                    DType::Vector(scalar, width) => Ok(DType::Ptr { scalar, width, space }),
                    _ => Err(bad()),
                };
            }
        }
        if let Some((base, width)) = s.split_once('x') {
            let scalar: Scalar = base.parse().map_err(|_| bad())?;
            let width: u8 = width.parse().map_err(|_| bad())?;
            if !(2..=64).contains(&width) {
                return Err(IrError::Invalid(format!("vector width in `{s}` must be 2..=64")));
            }
            return Ok(DType::Vector(scalar, width));
        }
        s.parse::<Scalar>().map(DType::Scalar).map_err(|_| bad())
    }
}

/// Names a device: its backend's name (`CPU`, `OPENCL`, `CUDA`, or any backend registered
/// with kiln-device) and the device's ordinal among that backend's devices.
///
/// The set of backends is open: kiln-ir knows no backend by name, and parsing accepts any
/// well-formed name. Whether a backend of that name exists is for kiln-device's registry
/// to say when the device is opened.
///
/// Printed `NAME` for ordinal 0 and `NAME:n` otherwise (`OPENCL` and `OPENCL:0` are the same
/// device), so a single-device backend such as the CPU reads as `CPU`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceSpec {
    backend: Cow<'static, str>,
    ordinal: u32,
}

impl DeviceSpec {
    /// Device `ordinal` of the backend `backend`, whose name must be upper case (as
    /// [`DeviceSpec::from_str`] spells it): `DeviceSpec::new("OPENCL", 1)`.
    pub const fn new(backend: &'static str, ordinal: u32) -> DeviceSpec {
        DeviceSpec { backend: Cow::Borrowed(backend), ordinal }
    }

    /// The backend name without ordinal: kernels compiled for `CUDA:0` serve `CUDA:1`.
    pub fn base_type(&self) -> &str {
        &self.backend
    }

    /// Which device of its backend this is (0 for a single-device backend such as the CPU).
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ordinal {
            0 => f.write_str(&self.backend),
            n => write!(f, "{}:{n}", self.backend),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = IrError;
    /// Accepts `NAME` or `NAME:n` (`CPU`, `OPENCL`, `opencl:1`, `CUDA:0`), case-insensitively:
    /// a name of ASCII letters, digits, `-` and `_` that starts with a letter, and a
    /// non-negative ordinal (0 when left out).
    fn from_str(s: &str) -> Result<Self, IrError> {
        let (name, ordinal) = match s.trim().split_once(':') {
            Some((name, o)) => {
                let ordinal = o.parse::<u32>().map_err(|_| {
                    IrError::Invalid(format!("device `{s}`: ordinal `{o}` is not a non-negative integer"))
                })?;
                (name.to_ascii_uppercase(), ordinal)
            }
            None => (s.trim().to_ascii_uppercase(), 0),
        };
        let well_formed = name.starts_with(|c: char| c.is_ascii_alphabetic())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !well_formed {
            return Err(IrError::Invalid(format!(
                "`{s}` is not a device name (expected a backend name and an optional ordinal, such as CPU, \
                 OPENCL or CUDA:1)"
            )));
        }
        Ok(DeviceSpec { backend: Cow::Owned(name), ordinal })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_text_round_trips() {
        let mut all = vec![DType::Void];
        for s in Scalar::ALL {
            all.push(DType::Scalar(s));
            all.push(DType::Vector(s, 4));
            all.push(DType::ptr(s));
            all.push(DType::Ptr { scalar: s, width: 8, space: AddrSpace::Local });
        }
        for d in all {
            assert_eq!(d.to_string().parse::<DType>().unwrap(), d, "{d}");
        }
        assert!("f33".parse::<DType>().is_err());
        assert!("f32x1".parse::<DType>().is_err());
        assert!("ptr<void>".parse::<DType>().is_err());
    }

    #[test]
    fn device_spec_parses_and_prints() {
        assert_eq!("CPU".parse::<DeviceSpec>().unwrap(), DeviceSpec::new("CPU", 0));
        assert_eq!("cuda:1".parse::<DeviceSpec>().unwrap(), DeviceSpec::new("CUDA", 1));
        assert_eq!("OPENCL:0".parse::<DeviceSpec>().unwrap(), "opencl".parse::<DeviceSpec>().unwrap());
        assert_eq!("OPENCL:0".parse::<DeviceSpec>().unwrap().to_string(), "OPENCL");
        assert_eq!(DeviceSpec::new("OPENCL", 2).to_string(), "OPENCL:2");
        assert_eq!(DeviceSpec::new("CUDA", 1).base_type(), "CUDA");
        // Any well-formed name parses: whether it is a backend is the registry's question.
        assert_eq!("cpu-avx2".parse::<DeviceSpec>().unwrap().base_type(), "CPU-AVX2");
        for bad in ["CUDA:x", "CUDA:-1", "", ":", "1CPU", "C PU", "CPU:1:2"] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
    }
}
