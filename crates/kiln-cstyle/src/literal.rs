//! Number literals: C spellings of integer and float constants, and the integer wrapping
//! a constant goes through on its way into its type.

use kiln_ir::Scalar;

/// A C99 integer literal of `s` (`v` already in range), 64-bit ones with `LL`/`ULL`.
pub fn c_int_literal(v: i64, s: Scalar) -> String {
    int_literal(v, s, "LL")
}

/// An integer literal of `s` (`v` already in range) whose 64-bit ones carry `long` (`LL` in
/// C99 and CUDA, `L` in OpenCL C, where `long` is 64 bits and `long long` is reserved) and
/// `U` before it when unsigned. The most negative values are spelled as a difference: the
/// literal `9223372036854775808` would not fit the signed type.
pub fn int_literal(v: i64, s: Scalar, long: &str) -> String {
    match s {
        Scalar::I64 if v == i64::MIN => format!("(-9223372036854775807{long} - 1)"),
        Scalar::I64 if v < 0 => format!("({v}{long})"),
        Scalar::I64 => format!("{v}{long}"),
        Scalar::U64 => format!("{}U{long}", v as u64),
        Scalar::U32 => format!("{}u", v as u32),
        Scalar::I32 if v == i32::MIN as i64 => "(-2147483647 - 1)".into(),
        _ if v < 0 => format!("({v})"),
        _ => v.to_string(),
    }
}

/// Wraps an integer constant into the range of `s` (two's complement), like a C conversion.
pub fn wrap_int(v: i64, s: Scalar) -> i64 {
    match s {
        Scalar::Bool => (v != 0) as i64,
        Scalar::I8 => v as i8 as i64,
        Scalar::I16 => v as i16 as i64,
        Scalar::I32 => v as i32 as i64,
        Scalar::U8 => v as u8 as i64,
        Scalar::U16 => v as u16 as i64,
        Scalar::U32 => v as u32 as i64,
        _ => v,
    }
}

/// A finite f32/f64 constant as the shortest decimal that reads back exactly (C99 compilers
/// round decimal literals correctly), e.g. `0.1f`, `1e-45f`, `(-2.5)`.
pub fn c_float_literal(v: f64, s: Scalar) -> String {
    let (text, suffix) = if s == Scalar::F64 { (format!("{v:?}"), "") } else { (format!("{:?}", v as f32), "f") };
    if text.starts_with('-') { format!("({text}{suffix})") } else { format!("{text}{suffix}") }
}

/// The definition of `name`, a saturating conversion from the float `from` (C type `ft`) to
/// the integer `to` (C type `tt`) with Rust's `as` semantics: NaN gives 0, values beyond
/// the range give its end. `qualifiers` are the helper's (`static inline`). The bounds are
/// compared as floats: MIN is a power of two (or 0), exact in any float; MAX rounds to the
/// nearest float, which is ≥ MAX, so `x >= hi` catches exactly the values that do not fit.
pub fn saturating_cast(qualifiers: &str, name: &str, (from, ft): (Scalar, &str), (to, tt): (Scalar, &str)) -> String {
    let (min, max): (i128, i128) = match to {
        Scalar::I8 => (i8::MIN.into(), i8::MAX.into()),
        Scalar::I16 => (i16::MIN.into(), i16::MAX.into()),
        Scalar::I32 => (i32::MIN.into(), i32::MAX.into()),
        Scalar::I64 => (i64::MIN.into(), i64::MAX.into()),
        Scalar::U8 => (0, u8::MAX.into()),
        Scalar::U16 => (0, u16::MAX.into()),
        Scalar::U32 => (0, u32::MAX.into()),
        _ => (0, u64::MAX.into()),
    };
    let lo = c_float_literal(min as f64, from);
    let hi = c_float_literal(if from == Scalar::F32 { max as f32 as f64 } else { max as f64 }, from);
    let (imin, imax) = (c_int_literal(min as i64, to), c_int_literal(max as u64 as i64, to));
    format!(
        "{qualifiers} {tt} {name}({ft} x) {{ return x != x ? ({tt})0 : x <= {lo} ? {imin} : x >= {hi} ? {imax} : ({tt})x; }}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_and_float_literals() {
        assert_eq!(c_int_literal(i64::MIN, Scalar::I64), "(-9223372036854775807LL - 1)");
        assert_eq!(int_literal(i64::MIN, Scalar::I64, "L"), "(-9223372036854775807L - 1)");
        assert_eq!(c_int_literal(-1, Scalar::U64), "18446744073709551615ULL");
        assert_eq!(int_literal(5, Scalar::U64, "L"), "5UL");
        assert_eq!(c_int_literal(i32::MIN.into(), Scalar::I32), "(-2147483647 - 1)");
        assert_eq!(c_int_literal(wrap_int(300, Scalar::U8), Scalar::U8), "44");
        assert_eq!(c_float_literal(0.1, Scalar::F32), "0.1f");
        assert_eq!(c_float_literal(-2.5, Scalar::F64), "(-2.5)");
    }

    #[test]
    fn saturating_casts_compare_against_the_float_bounds() {
        let def = saturating_cast("static inline", "cvt", (Scalar::F32, "float"), (Scalar::I8, "int8_t"));
        assert_eq!(
            def,
            "static inline int8_t cvt(float x) { return x != x ? (int8_t)0 : x <= (-128.0f) ? (-128) : \
             x >= 127.0f ? 127 : (int8_t)x; }"
        );
        // u32::MAX is no f32: the bound is the next float up, 2^32 (shortest: 4294967300).
        let def = saturating_cast("static inline", "cvt", (Scalar::F32, "float"), (Scalar::U32, "uint32_t"));
        assert!(def.contains("x >= 4294967300.0f ? 4294967295u"), "{def}");
    }
}
