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
    macro_rules! by_op {
        ($t:ty, $sum:expr) => {
            match op {
                ReduceOp::Sum => apply::<$t>(acc, x, $sum),
                ReduceOp::Max => apply::<$t>(acc, x, max_nan),
                ReduceOp::Min => apply::<$t>(acc, x, min_nan),
            }
        };
    }
    macro_rules! half {
        ($t:ty) => {
            match op {
                ReduceOp::Sum => apply::<$t>(acc, x, |a, b| <$t>::from_f32(a.to_f32() + b.to_f32())),
                ReduceOp::Max => apply::<$t>(acc, x, |a, b| <$t>::from_f32(max_nan(a.to_f32(), b.to_f32()))),
                ReduceOp::Min => apply::<$t>(acc, x, |a, b| <$t>::from_f32(min_nan(a.to_f32(), b.to_f32()))),
            }
        };
    }
    match dtype {
        Scalar::Bool => return Err(Error::Buffer("bool buffers cannot be reduced; use u8".into())),
        Scalar::I8 => by_op!(i8, i8::wrapping_add),
        Scalar::I16 => by_op!(i16, i16::wrapping_add),
        Scalar::I32 => by_op!(i32, i32::wrapping_add),
        Scalar::I64 => by_op!(i64, i64::wrapping_add),
        Scalar::U8 => by_op!(u8, u8::wrapping_add),
        Scalar::U16 => by_op!(u16, u16::wrapping_add),
        Scalar::U32 => by_op!(u32, u32::wrapping_add),
        Scalar::U64 => by_op!(u64, u64::wrapping_add),
        Scalar::F16 => half!(half::f16),
        Scalar::BF16 => half!(half::bf16),
        Scalar::F32 => by_op!(f32, |a, b| a + b),
        Scalar::F64 => by_op!(f64, |a, b| a + b),
    }
    Ok(())
}

/// The element types reductions combine: plain numbers, every bit pattern valid.
trait Element: Copy + PartialOrd {
    const SIZE: usize;
    fn read(bytes: &[u8]) -> Self;
    fn write(self, bytes: &mut [u8]);
}

macro_rules! element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn read(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(&bytes[..Self::SIZE]);
                <$t>::from_ne_bytes(b)
            }
            fn write(self, bytes: &mut [u8]) {
                bytes[..Self::SIZE].copy_from_slice(&self.to_ne_bytes());
            }
        }
    )*};
}
element!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64, half::f16, half::bf16);

/// `acc[i] = f(acc[i], x[i])` over the elements of type `T` in two byte slices of equal length
/// (whole elements): on the slices as `T` where both are aligned for it (so the loop
/// vectorizes), else element by element through bytes.
#[inline(always)]
fn apply<T: Element>(acc: &mut [u8], x: &[u8], f: impl Fn(T, T) -> T) {
    // SAFETY: `T` is a plain number type (see `Element`'s impls): every bit pattern is a valid
    // value and it has no padding, so viewing initialised bytes as `T` is sound; `align_to`
    // only yields the aligned middle part.
    let (head_a, a, _) = unsafe { acc.align_to_mut::<T>() };
    // SAFETY: as above, read only.
    let (head_x, b, _) = unsafe { x.align_to::<T>() };
    if head_a.is_empty() && head_x.is_empty() && a.len() == b.len() && a.len() * T::SIZE == x.len() {
        for (a, b) in a.iter_mut().zip(b) {
            *a = f(*a, *b);
        }
        return;
    }
    for (a, b) in acc.chunks_exact_mut(T::SIZE).zip(x.chunks_exact(T::SIZE)) {
        f(T::read(a), T::read(b)).write(a);
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

    /// Slices that are not aligned for the dtype take the byte-wise path, with the same result.
    #[test]
    fn unaligned_slices_reduce_alike() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..37).map(|i| 3.0 - i as f32).collect();
        let mut want = bytes(&a);
        reduce_into(ReduceOp::Sum, Scalar::F32, &mut want, &bytes(&b)).unwrap();
        let (mut acc, mut x) = (vec![0u8; 1], vec![0u8; 3]);
        acc.extend(bytes(&a));
        x.extend(bytes(&b));
        reduce_into(ReduceOp::Sum, Scalar::F32, &mut acc[1..], &x[3..]).unwrap();
        assert_eq!(&acc[1..], &want[..]);
        let sum: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
        assert_eq!(want, bytes(&sum));
    }

    #[test]
    fn mismatched_lengths_and_bool_are_errors() {
        let mut acc = vec![0u8; 8];
        assert!(matches!(reduce_into(ReduceOp::Sum, Scalar::F32, &mut acc, &[0u8; 4]), Err(Error::Buffer(_))));
        assert!(matches!(reduce_into(ReduceOp::Sum, Scalar::F32, &mut acc[..6], &[0u8; 6]), Err(Error::Buffer(_))));
        assert!(matches!(reduce_into(ReduceOp::Max, Scalar::Bool, &mut acc, &[0u8; 8]), Err(Error::Buffer(_))));
    }
}
