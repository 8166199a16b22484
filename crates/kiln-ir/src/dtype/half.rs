//! The bits of f16 and bf16 values, rounded from f64 exactly once.
//!
//! kiln keeps f16 and bf16 as their 16-bit patterns wherever a backend lacks the types, so
//! every producer of such a value (a renderer spelling a constant, a test building input, the
//! conformance reference) needs the same correctly rounded bits: round to nearest, ties to
//! even, overflow to infinity, a NaN to a quiet NaN of the same sign.

/// `v` rounded to f32 with round-to-odd: `v` itself when it is an f32, else whichever of its
/// two f32 neighbours has an odd last bit. Rounding that once more to a format with at least
/// two fewer mantissa bits (f16, bf16) gives exactly the correctly rounded value of `v`. It is
/// the step `half`'s own `from_f64` lacks: that rounds through a plain f32 (with F16C) or drops
/// the low 32 bits of `v`, so a value just above a tie rounds down in f16 although a C
/// compiler rounds the same constant up.
fn f32_round_to_odd(v: f64) -> f32 {
    let nearest = v as f32;
    if !v.is_finite() || f64::from(nearest) == v {
        return nearest;
    }
    // Bit patterns are sign-magnitude: one less is one step toward zero.
    let truncated = if f64::from(nearest).abs() > v.abs() { nearest.to_bits() - 1 } else { nearest.to_bits() };
    f32::from_bits(truncated | 1)
}

/// The bits of `v` rounded to IEEE binary16 (to nearest, ties to even; overflow to infinity;
/// NaN to a quiet NaN of the same sign).
pub fn f16_bits(v: f64) -> u16 {
    half::f16::from_f32(f32_round_to_odd(v)).to_bits()
}

/// The bits of `v` rounded to bfloat16 (to nearest, ties to even; overflow to infinity;
/// NaN to a quiet NaN of the same sign).
pub fn bf16_bits(v: f64) -> u16 {
    half::bf16::from_f32(f32_round_to_odd(v)).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_to_narrow_floats_is_exact() {
        // Just above a tie, the bits that decide the rounding lie beyond f32 (and beyond the
        // top 32 bits of the f64): rounding through a plain f32 would give 1.0.
        assert_eq!(f16_bits(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), 0x3c01);
        assert_eq!(f16_bits(-(1.0 + 2f64.powi(-11) + 2f64.powi(-40))), 0xbc01);
        assert_eq!(f16_bits(65520.0 - 2f64.powi(-30)), 0x7bff); // just below the overflow tie
        assert_eq!(f16_bits(2f64.powi(-25) + 2f64.powi(-60)), 0x0001);
        assert_eq!(f16_bits(1e300), 0x7c00);
        assert_eq!(bf16_bits(1.0 + 2f64.powi(-8) + 2f64.powi(-40)), 0x3f81);
        assert_eq!(bf16_bits(2f64.powi(-134) + 2f64.powi(-170)), 0x0001); // a subnormal above the tie
        assert_eq!(bf16_bits(-1e300), 0xff80);
        // Exact values and ties are untouched by the round-to-odd step.
        let mut s = 0x1234_5678_9abc_def0u64;
        for _ in 0..20_000 {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let f = f32::from_bits(s as u32);
            if !f.is_nan() {
                assert_eq!(f16_bits(f64::from(f)), half::f16::from_f32(f).to_bits(), "{f:e}");
                assert_eq!(bf16_bits(f64::from(f)), half::bf16::from_f32(f).to_bits(), "{f:e}");
            }
        }
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(65504.0), 0x7bff);
        assert_eq!(f16_bits(65520.0), 0x7c00); // the tie rounds to even: infinity
        assert_eq!(f16_bits(2f64.powi(-24)), 0x0001);
        assert_eq!(f16_bits(2f64.powi(-25)), 0x0000); // tie to even: zero
        assert_eq!(f16_bits(-0.0), 0x8000);
        assert_eq!(f16_bits(f64::NAN) & 0x7e00, 0x7e00);
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_bits(1.0 + 2f64.powi(-8)), 0x3f80); // tie to even
        assert_eq!(bf16_bits(1.0 + 3.0 * 2f64.powi(-8)), 0x3f82);
        assert_eq!(f32_round_to_odd(1.0), 1.0);
        assert_eq!(f32_round_to_odd(1.0 + 2f64.powi(-40)).to_bits(), 1.0f32.to_bits() | 1);
    }
}
