//! Reductions on host memory: what the in-process and MPI channels apply to staged bytes.

use kiln_ir::Scalar;

use super::ReduceOp;
use crate::error::{Error, Result};

/// `acc[i] = op(acc[i], x[i])` over the elements of `dtype` in two byte slices of equal
/// length (native byte order, any alignment). f16 and bf16 combine in f32 and round the result;
/// integers wrap on overflow; max and min propagate NaN.
///
/// # Errors
/// [`Error::Buffer`] for slices of different lengths or not a whole number of elements, and
/// for `bool`, which has no reduction.
pub fn reduce_into(op: ReduceOp, dtype: Scalar, acc: &mut [u8], x: &[u8]) -> Result<()> {
    if acc.len() != x.len() || !acc.len().is_multiple_of(dtype.size()) {
        return Err(Error::Buffer(format!(
            "reduce {} bytes into {} bytes of {dtype}: the lengths must match and hold whole elements",
            x.len(),
            acc.len()
        )));
    }
    macro_rules! native {
        ($t:ty, $add:expr, $max:expr, $min:expr) => {{
            let f: fn($t, $t) -> $t = match op {
                ReduceOp::Sum => $add,
                ReduceOp::Max => $max,
                ReduceOp::Min => $min,
            };
            combine(acc, x, |a: [u8; std::mem::size_of::<$t>()], b| {
                f(<$t>::from_ne_bytes(a), <$t>::from_ne_bytes(b)).to_ne_bytes()
            })
        }};
    }
    macro_rules! int {
        ($t:ty) => {
            native!($t, <$t>::wrapping_add, Ord::max, Ord::min)
        };
    }
    macro_rules! half {
        ($t:ty) => {{
            let f = float_op(op);
            combine(acc, x, |a: [u8; 2], b| {
                <$t>::from_f32(f(<$t>::from_ne_bytes(a).to_f32(), <$t>::from_ne_bytes(b).to_f32())).to_ne_bytes()
            })
        }};
    }
    match dtype {
        Scalar::Bool => return Err(Error::Buffer("bool buffers cannot be reduced; use u8".into())),
        Scalar::I8 => int!(i8),
        Scalar::I16 => int!(i16),
        Scalar::I32 => int!(i32),
        Scalar::I64 => int!(i64),
        Scalar::U8 => int!(u8),
        Scalar::U16 => int!(u16),
        Scalar::U32 => int!(u32),
        Scalar::U64 => int!(u64),
        Scalar::F16 => half!(half::f16),
        Scalar::BF16 => half!(half::bf16),
        Scalar::F32 => native!(f32, |a, b| a + b, max_nan, min_nan),
        Scalar::F64 => native!(f64, |a, b| a + b, max_nan, min_nan),
    }
    Ok(())
}

/// Applies `f` to each pair of `N`-byte elements, into `acc`.
#[inline(always)]
fn combine<const N: usize>(acc: &mut [u8], x: &[u8], f: impl Fn([u8; N], [u8; N]) -> [u8; N]) {
    for (a, b) in acc.chunks_exact_mut(N).zip(x.chunks_exact(N)) {
        let (Ok(av), Ok(bv)) = (<[u8; N]>::try_from(&*a), <[u8; N]>::try_from(b)) else { continue };
        a.copy_from_slice(&f(av, bv));
    }
}

fn float_op(op: ReduceOp) -> fn(f32, f32) -> f32 {
    match op {
        ReduceOp::Sum => |a, b| a + b,
        ReduceOp::Max => max_nan,
        ReduceOp::Min => min_nan,
    }
}

/// The larger value; NaN if either is (as NumPy's `maximum`, and tinygrad's MAX).
fn max_nan<T: PartialOrd + Copy>(a: T, b: T) -> T {
    match a.partial_cmp(&b) {
        Some(std::cmp::Ordering::Less) => b,
        Some(_) => a,
        None => nan_of(a, b),
    }
}

/// The smaller value; NaN if either is.
fn min_nan<T: PartialOrd + Copy>(a: T, b: T) -> T {
    match a.partial_cmp(&b) {
        Some(std::cmp::Ordering::Greater) => b,
        Some(_) => a,
        None => nan_of(a, b),
    }
}

/// Whichever of two unordered values is a NaN (one is: they compare as unordered).
fn nan_of<T: PartialOrd + Copy>(a: T, b: T) -> T {
    let unordered = |x: T| x.partial_cmp(&x).is_none();
    if unordered(a) { a } else { b }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
        // SAFETY: plain numbers: every byte is initialised.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }.to_vec()
    }

    #[test]
    fn reductions_combine_each_dtype() {
        let mut acc = bytes(&[1.0f32, -2.0, f32::NAN, 4.0]);
        reduce_into(ReduceOp::Max, Scalar::F32, &mut acc, &bytes(&[0.5f32, 3.0, 1.0, f32::NAN])).unwrap();
        let got: Vec<f32> = acc.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(&got[..2], &[1.0, 3.0]);
        assert!(got[2].is_nan() && got[3].is_nan(), "NaN propagates: {got:?}");

        let mut acc = bytes(&[i32::MAX, 5, -7]);
        reduce_into(ReduceOp::Sum, Scalar::I32, &mut acc, &bytes(&[1i32, 6, 3])).unwrap();
        assert_eq!(acc, bytes(&[i32::MIN, 11, -4]), "integers wrap");

        let mut acc = bytes(&[9u64, 2]);
        reduce_into(ReduceOp::Min, Scalar::U64, &mut acc, &bytes(&[3u64, 8])).unwrap();
        assert_eq!(acc, bytes(&[3u64, 2]));

        let h = |v: f32| half::bf16::from_f32(v);
        let mut acc = bytes(&[h(1.5), h(-3.0)]);
        reduce_into(ReduceOp::Sum, Scalar::BF16, &mut acc, &bytes(&[h(2.25), h(1.0)])).unwrap();
        assert_eq!(acc, bytes(&[h(3.75), h(-2.0)]));
        let f = |v: f32| half::f16::from_f32(v);
        let mut acc = bytes(&[f(0.5)]);
        reduce_into(ReduceOp::Max, Scalar::F16, &mut acc, &bytes(&[f(-1.0)])).unwrap();
        assert_eq!(acc, bytes(&[f(0.5)]));
    }

    #[test]
    fn mismatched_lengths_and_bool_are_errors() {
        let mut acc = vec![0u8; 8];
        assert!(matches!(reduce_into(ReduceOp::Sum, Scalar::F32, &mut acc, &[0u8; 4]), Err(Error::Buffer(_))));
        assert!(matches!(reduce_into(ReduceOp::Sum, Scalar::F32, &mut acc[..6], &[0u8; 6]), Err(Error::Buffer(_))));
        assert!(matches!(reduce_into(ReduceOp::Max, Scalar::Bool, &mut acc, &[0u8; 8]), Err(Error::Buffer(_))));
    }
}
