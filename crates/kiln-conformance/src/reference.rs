//! The reference semantics every backend must reproduce, written in plain Rust.
//!
//! These are the rules of `kiln_cstyle` (the "Semantics" section), stated once more
//! independently of any renderer:
//! - integer ADD/SUB/MUL/NEG/ABS/MULACC wrap (two's complement); IDIV truncates toward zero
//!   and MOD takes the sign of the dividend (Rust's `/` and `%`), with `x / 0 == 0`,
//!   `x % 0 == x`, `MIN / -1 == MIN` (wrapping) and `MIN % -1 == 0`;
//! - SHL/SHR take the shift count modulo the bit width; SHR is arithmetic on signed and
//!   logical on unsigned types;
//! - float MAX/MIN are IEEE `fmax`/`fmin` (a NaN operand yields the other operand); MULACC
//!   is a fused multiply-add;
//! - f16/bf16 arithmetic is computed in f32 and rounded once per op;
//! - CAST is Rust's `as` (float → integer saturates, NaN → 0), anything → bool is `!= 0`,
//!   bool → anything is 0/1; BITCAST reinterprets the bytes;
//! - NEG of a bool is NOT;
//! - WMMA (`D = A·B + C`, see [`wmma`]) starts every element of D from C's, adds one fused
//!   multiply-add per k in increasing k, in f32, and rounds once to the accumulator dtype.
//!
//! Floating-point results are compared in units in the last place ([`ulps`]) with the
//! per-op bounds of [`max_ulps`], which follow the OpenCL C accuracy table (the loosest
//! contract among kiln's targets); exact ops must match bit for bit up to the sign of zero.

use kiln_device::kiln_ir::{Op, Scalar, Wmma};

use crate::host::{Value, normalize, round_float, wrap_int};

/// Unary ALU ops that are meaningful on dtype `s`.
pub fn unary_ops(s: Scalar) -> &'static [Op] {
    match s {
        Scalar::Bool => &[Op::Not, Op::Neg],
        s if s.is_float() => {
            &[Op::Neg, Op::Sqrt, Op::Recip, Op::Exp2, Op::Log2, Op::Exp, Op::Log, Op::Sin, Op::Cos, Op::Trunc, Op::Abs]
        }
        _ => &[Op::Neg, Op::Not, Op::Abs],
    }
}

/// Binary ALU ops (not comparisons) that are meaningful on dtype `s`.
pub fn binary_ops(s: Scalar) -> &'static [Op] {
    match s {
        Scalar::Bool => &[Op::And, Op::Or, Op::Xor, Op::Max, Op::Min],
        s if s.is_float() => &[Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Max, Op::Min, Op::Pow],
        _ => &[
            Op::Add,
            Op::Sub,
            Op::Mul,
            Op::Idiv,
            Op::Mod,
            Op::Max,
            Op::Min,
            Op::And,
            Op::Or,
            Op::Xor,
            Op::Shl,
            Op::Shr,
        ],
    }
}

/// The comparisons (result bool).
pub const COMPARISONS: [Op; 4] = [Op::Lt, Op::Le, Op::Eq, Op::Ne];

/// Ternary ops meaningful on `s` (WHERE takes a bool condition first).
pub fn ternary_ops(s: Scalar) -> &'static [Op] {
    if s == Scalar::Bool { &[Op::Where] } else { &[Op::Where, Op::MulAcc] }
}

/// The result of `op` on `args` (already normalized to `s`; WHERE's first argument is the
/// bool condition). `None` when the op is not defined on `s`.
pub fn alu(op: Op, s: Scalar, args: &[Value]) -> Option<Value> {
    if op == Op::Where {
        let [c, a, b] = args else { return None };
        return Some(if c.as_bool() { *a } else { *b });
    }
    if op.is_comparison() {
        let [a, b] = args else { return None };
        return Some(Value::B(compare(op, s, *a, *b)));
    }
    match s {
        Scalar::Bool => bool_op(op, args),
        Scalar::F64 => f64_op(op, &args.iter().map(|a| a.as_f64()).collect::<Vec<_>>()).map(Value::F),
        Scalar::F32 => {
            f32_op(op, &args.iter().map(|a| a.as_f64() as f32).collect::<Vec<_>>()).map(|v| Value::F(v as f64))
        }
        Scalar::F16 | Scalar::BF16 => f32_op(op, &args.iter().map(|a| a.as_f64() as f32).collect::<Vec<_>>())
            .map(|v| Value::F(round_float(v as f64, s))),
        _ => int_op(op, s, &args.iter().map(|a| a.as_i128()).collect::<Vec<_>>()).map(|v| Value::I(wrap_int(v, s))),
    }
}

fn compare(op: Op, s: Scalar, a: Value, b: Value) -> bool {
    if s.is_float() {
        let (a, b) = (a.as_f64(), b.as_f64());
        match op {
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Eq => a == b,
            _ => a != b,
        }
    } else {
        let (a, b) = (a.as_i128(), b.as_i128());
        match op {
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Eq => a == b,
            _ => a != b,
        }
    }
}

fn bool_op(op: Op, args: &[Value]) -> Option<Value> {
    let b: Vec<bool> = args.iter().map(|a| a.as_bool()).collect();
    Some(Value::B(match (op, b.as_slice()) {
        (Op::Not | Op::Neg, [a]) => !a,
        (Op::And | Op::Min, [a, b]) => a & b,
        (Op::Or | Op::Max, [a, b]) => a | b,
        (Op::Xor, [a, b]) => a ^ b,
        _ => return None,
    }))
}

/// Integer semantics on exact values; the caller wraps the result to the dtype. Operands
/// are at most 64 bits wide, so wrapping in 128 bits keeps every bit the dtype holds.
fn int_op(op: Op, s: Scalar, a: &[i128]) -> Option<i128> {
    let bits = (s.size() * 8) as i128;
    let count = |b: i128| (b & (bits - 1)) as u32;
    Some(match (op, a) {
        (Op::Neg, [x]) => x.wrapping_neg(),
        (Op::Not, [x]) => !x,
        (Op::Abs, [x]) => x.abs(),
        (Op::Add, [x, y]) => x.wrapping_add(*y),
        (Op::Sub, [x, y]) => x.wrapping_sub(*y),
        (Op::Mul, [x, y]) => x.wrapping_mul(*y),
        // MIN / -1 is exact in 128 bits; wrapping it to the dtype gives MIN.
        (Op::Idiv, [_, 0]) => 0,
        (Op::Mod, [x, 0]) => *x,
        (Op::Idiv, [x, y]) => x / y,
        (Op::Mod, [x, y]) => x % y,
        (Op::Max, [x, y]) => *x.max(y),
        (Op::Min, [x, y]) => *x.min(y),
        (Op::And, [x, y]) => x & y,
        (Op::Or, [x, y]) => x | y,
        (Op::Xor, [x, y]) => x ^ y,
        // Shifting the sign-extended (signed) or zero-extended (unsigned) exact value gives
        // the arithmetic resp. logical shift once wrapped back to the type.
        (Op::Shl, [x, y]) => x.wrapping_shl(count(*y)),
        (Op::Shr, [x, y]) => x >> count(*y),
        (Op::MulAcc, [x, y, z]) => x.wrapping_mul(*y).wrapping_add(*z),
        _ => return None,
    })
}

macro_rules! float_op {
    ($name:ident, $t:ty) => {
        fn $name(op: Op, a: &[$t]) -> Option<$t> {
            Some(match (op, a) {
                (Op::Neg, [x]) => -x,
                (Op::Sqrt, [x]) => x.sqrt(),
                (Op::Recip, [x]) => 1.0 / x,
                (Op::Exp2, [x]) => x.exp2(),
                (Op::Log2, [x]) => x.log2(),
                (Op::Exp, [x]) => x.exp(),
                (Op::Log, [x]) => x.ln(),
                (Op::Sin, [x]) => x.sin(),
                (Op::Cos, [x]) => x.cos(),
                (Op::Trunc, [x]) => x.trunc(),
                (Op::Abs, [x]) => x.abs(),
                (Op::Add, [x, y]) => x + y,
                (Op::Sub, [x, y]) => x - y,
                (Op::Mul, [x, y]) => x * y,
                (Op::Div, [x, y]) => x / y,
                (Op::Max, [x, y]) => x.max(*y),
                (Op::Min, [x, y]) => x.min(*y),
                (Op::Pow, [x, y]) => x.powf(*y),
                (Op::MulAcc, [x, y, z]) => x.mul_add(*y, *z),
                _ => return None,
            })
        }
    };
}
float_op!(f32_op, f32);
float_op!(f64_op, f64);

/// `D = A·B + C` for every thread of a WMMA's thread group at once: `a`, `b` and `c` hold the
/// fragments of threads `0..w.threads` one after another (thread `t`'s A fragment is
/// `a[t * w.a_elems()..][..w.a_elems()]`), values of the input and accumulator dtypes; the
/// result is the D fragments in the same order. The fragments are gathered into whole
/// matrices by the layout of [`kiln_device::kiln_ir::wmma`], so the cross-thread op of a
/// warp is evaluated exactly as its one-thread form. Each element of D is C's element,
/// then `acc = fma(a, b, acc)` in f32 for k = 0, 1, ..., then rounded to the accumulator
/// dtype. `None` when a slice has the wrong length.
pub fn wmma(w: &Wmma, a: &[f64], b: &[f64], c: &[f64]) -> Option<Vec<f64>> {
    let threads = w.threads as usize;
    let (n, k) = (w.n as usize, w.k as usize);
    if a.len() != threads * w.a_elems() || b.len() != threads * w.b_elems() || c.len() != threads * w.c_elems() {
        return None;
    }
    let gather = |frags: &[f64], elems: usize, cols: usize, coord: fn(&Wmma, usize, usize) -> (usize, usize)| {
        let mut whole = vec![0f32; frags.len()];
        for (j, v) in frags.iter().enumerate() {
            let (r, col) = coord(w, j / elems, j % elems);
            whole[r * cols + col] = *v as f32;
        }
        whole
    };
    let (ma, mb, mc) = (
        gather(a, w.a_elems(), k, Wmma::a_coord),
        gather(b, w.b_elems(), n, Wmma::b_coord),
        gather(c, w.c_elems(), n, Wmma::c_coord),
    );
    let mut d = vec![0f64; c.len()];
    for (j, out) in d.iter_mut().enumerate() {
        let (r, col) = w.c_coord(j / w.c_elems(), j % w.c_elems());
        let mut acc = mc[r * n + col];
        for kk in 0..k {
            acc = ma[r * k + kk].mul_add(mb[kk * n + col], acc);
        }
        *out = round_float(acc as f64, w.acc);
    }
    Some(d)
}

/// How far (in ulps of `s`) a backend's float result for `op` may be from the reference.
pub fn max_ulps(op: Op, s: Scalar) -> u64 {
    let exact = matches!(
        op,
        Op::Neg | Op::Abs | Op::Trunc | Op::Add | Op::Sub | Op::Mul | Op::Max | Op::Min | Op::MulAcc | Op::Where
    );
    if exact || !s.is_float() {
        return 0;
    }
    if matches!(s, Scalar::F16 | Scalar::BF16) {
        // One f32 result within a few f32 ulps rounds to the same half, or a neighbour.
        return 1;
    }
    match op {
        Op::Div | Op::Sqrt | Op::Recip if s == Scalar::F64 => 0,
        Op::Div | Op::Sqrt | Op::Recip => 3,
        Op::Exp2 | Op::Log2 | Op::Exp | Op::Log => 3,
        Op::Sin | Op::Cos => 4,
        Op::Pow => 16,
        _ => 0,
    }
}

/// Distance between two values of float type `s` in units in the last place: 0 when equal
/// (`0.0 == -0.0`) or both NaN, `u64::MAX` when exactly one is NaN.
pub fn ulps(a: f64, b: f64, s: Scalar) -> u64 {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() { 0 } else { u64::MAX };
    }
    if a == b {
        return 0;
    }
    // Map the bit patterns onto a line where adjacent floats differ by one.
    let ordered = |x: f64| -> i128 {
        let (bits, sign_bit): (u64, u64) = match s {
            Scalar::F16 => (half::f16::from_f64(x).to_bits() as u64, 1 << 15),
            Scalar::BF16 => (half::bf16::from_f64(x).to_bits() as u64, 1 << 15),
            Scalar::F32 => ((x as f32).to_bits() as u64, 1 << 31),
            _ => (x.to_bits(), 1 << 63),
        };
        if bits & sign_bit != 0 { -((bits & !sign_bit) as i128) } else { bits as i128 }
    };
    (ordered(a) - ordered(b)).unsigned_abs().min(u64::MAX as u128) as u64
}

/// Whether `got` is an acceptable result for `op` on dtype `s` when the reference is `want`.
pub fn accepts(op: Op, s: Scalar, got: Value, want: Value) -> bool {
    match (got, want) {
        (Value::F(g), Value::F(w)) => ulps(g, w, s) <= max_ulps(op, s),
        _ => got.same(want),
    }
}

/// Rust's `v as <to>` for a value of dtype `from` (bool: `!= 0` and 0/1).
pub fn cast(v: Value, from: Scalar, to: Scalar) -> Value {
    let v = normalize(v, from);
    match (v, to) {
        (v, Scalar::Bool) => Value::B(v.as_bool()),
        (Value::B(b), to) => normalize(Value::I(b as i128), to),
        (Value::I(i), Scalar::F64) => Value::F(i as f64),
        // Round the exact integer once (no detour through f64).
        (Value::I(i), Scalar::F32) => Value::F(i as f32 as f64),
        (Value::I(i), to @ (Scalar::F16 | Scalar::BF16)) => Value::F(round_float(i as f32 as f64, to)),
        (Value::I(i), to) => Value::I(wrap_int(i, to)),
        (Value::F(f), to) if to.is_float() => Value::F(round_float(f, to)),
        (Value::F(f), to) => Value::I(saturate(f, to)),
    }
}

/// Rust's saturating float → integer `as` (NaN → 0).
fn saturate(f: f64, to: Scalar) -> i128 {
    match to {
        Scalar::I8 => f as i8 as i128,
        Scalar::I16 => f as i16 as i128,
        Scalar::I32 => f as i32 as i128,
        Scalar::I64 => f as i64 as i128,
        Scalar::U8 => f as u8 as i128,
        Scalar::U16 => f as u16 as i128,
        Scalar::U32 => f as u32 as i128,
        Scalar::U64 => f as u64 as i128,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i(v: i128) -> Value {
        Value::I(v)
    }

    #[test]
    fn integer_rules() {
        let r = |op, s, a: &[i128]| alu(op, s, &a.iter().map(|x| i(*x)).collect::<Vec<_>>()).unwrap().as_i128();
        assert_eq!(r(Op::Idiv, Scalar::I32, &[-7, 2]), -3);
        assert_eq!(r(Op::Mod, Scalar::I32, &[-7, 2]), -1);
        assert_eq!(r(Op::Add, Scalar::I32, &[i32::MAX as i128, 1]), i32::MIN as i128);
        assert_eq!(r(Op::Shr, Scalar::I32, &[-8, 1]), -4);
        assert_eq!(r(Op::Shr, Scalar::U32, &[u32::MAX as i128, 31]), 1);
        assert_eq!(r(Op::Shl, Scalar::I32, &[1, 33]), 2);
        assert_eq!(r(Op::Shl, Scalar::U8, &[0x81, 1]), 2);
        assert_eq!(r(Op::Neg, Scalar::U8, &[1]), 255);
        assert_eq!(r(Op::Abs, Scalar::I8, &[-128]), -128);
        assert_eq!(r(Op::Not, Scalar::U16, &[0]), 0xffff);
        assert_eq!(r(Op::Mul, Scalar::U64, &[u64::MAX as i128, u64::MAX as i128]), 1);
        assert_eq!(r(Op::Shl, Scalar::U64, &[u64::MAX as i128, 63]), 1 << 63);
        assert_eq!(r(Op::Idiv, Scalar::I32, &[7, 0]), 0);
        assert_eq!(r(Op::Mod, Scalar::I32, &[-7, 0]), -7);
        assert_eq!(r(Op::Idiv, Scalar::I32, &[i32::MIN as i128, -1]), i32::MIN as i128);
        assert_eq!(r(Op::Mod, Scalar::I32, &[i32::MIN as i128, -1]), 0);
        assert_eq!(r(Op::Idiv, Scalar::I8, &[-128, -1]), -128);
        assert_eq!(r(Op::Idiv, Scalar::U64, &[u64::MAX as i128, 0]), 0);
        assert_eq!(r(Op::Mod, Scalar::U64, &[u64::MAX as i128, 0]), u64::MAX as i128);
    }

    #[test]
    fn float_and_bool_rules() {
        let f = |v: f64| Value::F(v);
        let max = alu(Op::Max, Scalar::F32, &[f(f64::NAN), f(2.0)]).unwrap();
        assert!(max.same(f(2.0)));
        assert!(alu(Op::Lt, Scalar::F32, &[f(f64::NAN), f(1.0)]).unwrap().same(Value::B(false)));
        assert!(alu(Op::Neg, Scalar::Bool, &[Value::B(true)]).unwrap().same(Value::B(false)));
        let h = alu(Op::Add, Scalar::F16, &[f(2048.0), f(1.0)]).unwrap();
        assert!(h.same(f(2048.0)), "f16 rounds once per op: {h}");
        assert_eq!(ulps(1.0, 1.0 + f32::EPSILON as f64, Scalar::F32), 1);
        assert_eq!(ulps(-0.0, 0.0, Scalar::F64), 0);
        assert_eq!(ulps(f64::NAN, 0.0, Scalar::F64), u64::MAX);
        assert_eq!(ulps(-1.0, 1.0, Scalar::F16), 2 * 0x3c00);
    }

    #[test]
    fn wmma_is_an_fma_chain_per_element_for_either_layout() {
        let single = Wmma::single(2, 2, 3, Scalar::F32, Scalar::F32);
        // A = [[1, 2, 3], [4, 5, 6]], B = [[1, 0], [0, 1], [1, 1]], C = [[0.5, 0], [0, -1]].
        let d = wmma(&single, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[0.5, 0.0, 0.0, -1.0]);
        assert_eq!(d, Some(vec![4.5, 5.0, 10.0, 10.0]));
        assert_eq!(wmma(&single, &[1.0], &[], &[]), None);
        // Fused, in order: (1 + 2^-24) * (1 - 2^-24) + -1 is -2^-48, not 0.
        let one = Wmma::single(1, 1, 1, Scalar::F32, Scalar::F32);
        let e = 2f64.powi(-24);
        assert_eq!(wmma(&one, &[1.0 + 2.0 * e], &[1.0 - e], &[-1.0]), Some(vec![e - 2.0 * e * e]));
        // Rounded once to f16 at the end: 2048 + 1 + 1 = 2050 (f16 per step would give 2048).
        let half = Wmma::single(1, 1, 2, Scalar::F16, Scalar::F16);
        assert_eq!(wmma(&half, &[1.0, 1.0], &[1.0, 1.0], &[2048.0]), Some(vec![2050.0]));
        // A warp: the identity times B's values, laid out by the mma.sync layout, gives C + B.
        let w = Wmma::warp(16, 8, 8, Scalar::F32, Scalar::F32);
        let (mut a, mut b, mut c) = (vec![0.0; 32 * 4], vec![0.0; 32 * 2], vec![0.0; 32 * 4]);
        for lane in 0..32 {
            for i in 0..4 {
                let (r, col) = w.a_coord(lane, i);
                a[lane * 4 + i] = if r == col { 1.0 } else { 0.0 };
                let (r, col) = w.c_coord(lane, i);
                c[lane * 4 + i] = (r * 8 + col) as f64;
            }
            for i in 0..2 {
                let (r, col) = w.b_coord(lane, i);
                b[lane * 2 + i] = (r * 100 + col) as f64;
            }
        }
        let d = wmma(&w, &a, &b, &c).unwrap_or_default();
        for lane in 0..32 {
            for i in 0..4 {
                let (r, col) = w.c_coord(lane, i);
                let want = (r * 8 + col) as f64 + if r < 8 { (r * 100 + col) as f64 } else { 0.0 };
                assert_eq!(d[lane * 4 + i], want, "lane {lane} element {i}");
            }
        }
    }

    #[test]
    fn casts_are_rusts_as() {
        assert!(cast(Value::F(-3.7), Scalar::F32, Scalar::U8).same(i(0)));
        assert!(cast(Value::F(1e10), Scalar::F64, Scalar::I32).same(i(i32::MAX as i128)));
        assert!(cast(Value::F(f64::NAN), Scalar::F32, Scalar::I64).same(i(0)));
        assert!(cast(Value::F(f64::NAN), Scalar::F32, Scalar::Bool).same(Value::B(true)));
        assert!(cast(i(-1), Scalar::I32, Scalar::U16).same(i(0xffff)));
        assert!(cast(Value::B(true), Scalar::Bool, Scalar::F32).same(Value::F(1.0)));
        assert!(cast(i(16_777_217), Scalar::I32, Scalar::F32).same(Value::F(16_777_216.0)));
        assert!(cast(i(70000), Scalar::I32, Scalar::F16).same(Value::F(f64::INFINITY)));
    }
}
