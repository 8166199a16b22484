//! WGSL's words for what the renderer spells: register types, literals, conversions, packed
//! buffer elements, and the helper functions kiln defines where WGSL's builtins do not have
//! the IR meaning (registered in the kernel's prelude when used).

use kiln_cstyle::{Address, Prelude, wrap_int};
use kiln_device::{Error, Result};
use kiln_ir::{AddrSpace, DType, Scalar};

/// The register type of scalar `s` (one the adapter has): narrow integers live in 32-bit
/// registers and bf16 in f32.
pub(crate) fn reg(s: Scalar) -> &'static str {
    match s {
        Scalar::Bool => "bool",
        Scalar::I8 | Scalar::I16 | Scalar::I32 => "i32",
        Scalar::U8 | Scalar::U16 | Scalar::U32 => "u32",
        Scalar::F16 => "f16",
        Scalar::I64 => "i64",
        Scalar::U64 => "u64",
        Scalar::F32 | Scalar::BF16 | Scalar::F64 => "f32",
    }
}

/// Whether buffers of `s` are packed into `atomic<u32>` words.
pub(crate) fn packed(s: Scalar) -> bool {
    s.size() < 4 && s != Scalar::F16
}

/// `e` (a register of `s`) brought back into the range of `s` (narrow integers only).
pub(crate) fn wrap(e: &str, s: Scalar) -> String {
    match s {
        Scalar::I8 => format!("(bitcast<i32>(bitcast<u32>({e}) << 24u) >> 24u)"),
        Scalar::I16 => format!("(bitcast<i32>(bitcast<u32>({e}) << 16u) >> 16u)"),
        Scalar::U8 => format!("({e} & 0xffu)"),
        Scalar::U16 => format!("({e} & 0xffffu)"),
        _ => e.to_string(),
    }
}

/// An integer constant `v` of scalar `s`, wrapped into its range, in its register type.
pub(crate) fn int_lit(v: i64, s: Scalar) -> String {
    let v = wrap_int(v, s);
    match s {
        Scalar::Bool => (v != 0).to_string(),
        Scalar::I8 | Scalar::I16 | Scalar::I32 if v == i32::MIN as i64 => "i32(-2147483648)".into(),
        Scalar::I8 | Scalar::I16 | Scalar::I32 => format!("{v}i"),
        Scalar::U8 | Scalar::U16 | Scalar::U32 => format!("{}u", v as u32),
        Scalar::I64 if v == i64::MIN => "i64(-9223372036854775807li - 1li)".into(),
        Scalar::I64 => format!("{v}li"),
        Scalar::U64 => format!("{}lu", v as u64),
        _ => float_lit(v as f64, s),
    }
}

/// A float constant of `s` (f32, f16, or bf16 in an f32 register), rounded to `s`;
/// non-finite values through their f32 bits.
pub(crate) fn float_lit(v: f64, s: Scalar) -> String {
    let f = match s {
        Scalar::F16 => half::f16::from_f64(v).to_f32(),
        Scalar::BF16 => half::bf16::from_f64(v).to_f32(),
        _ => v as f32,
    };
    let lit = if f.is_finite() { format!("{f:?}f") } else { format!("bitcast<f32>({}u)", f.to_bits()) };
    if s == Scalar::F16 { format!("f16({lit})") } else { lit }
}

/// `name(args)` on float registers of `s`, computed in f32 (f16's transcendentals are
/// computed in f32 and rounded once).
pub(crate) fn via_f32(s: Scalar, name: &str, args: &[String]) -> String {
    if s == Scalar::F16 {
        let args: Vec<String> = args.iter().map(|e| format!("f32({e})")).collect();
        format!("f16({name}({}))", args.join(", "))
    } else {
        format!("{name}({})", args.join(", "))
    }
}

/// `isnan(e)` for a float register of `s`.
pub(crate) fn isnan(e: &str, s: Scalar, p: &mut Prelude) -> String {
    need_isnan(p);
    if s == Scalar::F16 {
        p.need("kiln_isnan_f16", |_| ISNAN_F16.into());
        format!("kiln_isnan_f16({e})")
    } else {
        format!("kiln_isnan_f32({e})")
    }
}

fn need_isnan(p: &mut Prelude) {
    p.need("kiln_isnan_f32", |_| ISNAN_F32.into());
}

/// `e` (an f32) rounded to bf16.
pub(crate) fn round_bf16(e: &str, p: &mut Prelude) -> String {
    p.need("kiln_bf16", |_| BF16_ROUND.into());
    format!("kiln_bf16({e})")
}

/// The call of kiln's own `kiln_exp_f32`, `kiln_sin_f32`, `kiln_cos_f32` or `kiln_pow_f32`
/// (`name`) on float registers of `s`, computed in f32.
pub(crate) fn own(name: &'static str, s: Scalar, args: &[String], p: &mut Prelude) -> String {
    let (key, text) = match name {
        "kiln_exp_f32" => (name, EXP_F32),
        "kiln_pow_f32" => (name, POW_F32),
        _ => ("kiln_sincos_f32", SINCOS_F32),
    };
    p.need(key, |p| {
        need_isnan(p);
        text.into()
    });
    via_f32(s, name, args)
}

/// The conversion (CAST) of register `v` from `a` to `b` (`a != b`), with the IR's
/// semantics: float → integer saturates and maps NaN to 0, anything → bool is `!= 0`.
pub(crate) fn cast(v: &str, a: Scalar, b: Scalar, p: &mut Prelude) -> String {
    let (ra, rb) = (reg(a), reg(b));
    if b == Scalar::Bool {
        let nan = if a.is_float() { format!(" || {}", isnan(v, a, p)) } else { String::new() };
        return format!("(({v} != {}){nan})", int_lit(0, a));
    }
    if a == Scalar::Bool {
        return format!("select({}, {}, {v})", int_lit(0, b), int_lit(1, b));
    }
    if b.is_float() {
        let c = format!("{rb}({v})");
        return if b == Scalar::BF16 { round_bf16(&c, p) } else { c };
    }
    if a.is_float() {
        let name = format!("kiln_f32_to_{}", b.name());
        p.need(&name, |p| saturating(&name, b, p));
        let x = if a == Scalar::F16 { format!("f32({v})") } else { v.to_string() };
        return format!("{name}({x})");
    }
    // Integer to integer: convert the register (sign- or zero-extending from `a`), then wrap.
    let conv = if ra == rb {
        v.to_string()
    } else if a.size() == b.size() || (a.size() <= 4 && b.size() <= 4) {
        format!("bitcast<{rb}>({v})")
    } else if a.size() == 8 {
        // Truncation: the low 32 bits.
        format!("bitcast<{rb}>(u32({v} & {}))", if a.is_signed() { "0xffffffffli" } else { "0xfffffffflu" })
    } else if !a.is_signed() {
        // Zero-extended through u64 (naga sign-extends a u32 converted straight to i64).
        format!("bitcast<{rb}>(u64({v}))")
    } else if b.is_signed() {
        format!("i64({v})")
    } else {
        format!("bitcast<u64>(i64({v}))")
    };
    wrap(&conv, b)
}

/// `name`, the saturating conversion of an f32 to integer `b` (NaN → 0, Rust's `as`).
fn saturating(name: &str, b: Scalar, p: &mut Prelude) -> String {
    let (min, max) = b.int_range().unwrap_or((0, 0));
    let (lo, hi) = (float_lit(min as f64, Scalar::F32), float_lit(max as f64 + 1.0, Scalar::F32));
    let rb = reg(b);
    let inner = if b.size() < 4 { format!("{rb}(i32(x))") } else { format!("{rb}(x)") };
    let max = if b == Scalar::U64 { "18446744073709551615lu".into() } else { int_lit(max as i64, b) };
    format!(
        "fn {name}(x: f32) -> {rb} {{\n  if ({}) {{ return {}; }}\n  if (x <= {lo}) {{ return {}; }}\n  \
         if (x >= {hi}) {{ return {max}; }}\n  return {inner};\n}}",
        isnan("x", Scalar::F32, p),
        int_lit(0, b),
        int_lit(min as i64, b)
    )
}

/// The reinterpretation (BITCAST) of register `v` from `a` to `b`, scalars of equal size.
pub(crate) fn bitcast(v: &str, a: Scalar, b: Scalar, p: &mut Prelude) -> String {
    let (ra, rb) = (reg(a), reg(b));
    if a == b {
        return v.to_string();
    }
    if a.size() != 2 || !(a.is_float() || b.is_float()) {
        let c = if ra == rb { v.to_string() } else { format!("bitcast<{rb}>({v})") };
        return if a.size() < 4 { wrap(&c, b) } else { c };
    }
    // 16-bit floats go through their bits as a u32 (naga's `bitcast` keeps the component
    // count, so a lone f16 cannot be reinterpreted directly).
    let bits = match a {
        Scalar::F16 => {
            p.need("kiln_f16_bits", |_| F16_BITS.into());
            format!("kiln_f16_bits({v})")
        }
        Scalar::BF16 => format!("(bitcast<u32>({v}) >> 16u)"),
        Scalar::I16 => format!("(bitcast<u32>({v}) & 0xffffu)"),
        _ => v.to_string(),
    };
    match b {
        Scalar::F16 => {
            p.need("kiln_f16_from_bits", |_| F16_FROM_BITS.into());
            format!("kiln_f16_from_bits({bits})")
        }
        Scalar::BF16 => format!("bitcast<f32>({bits} << 16u)"),
        Scalar::I16 => wrap(&format!("bitcast<i32>({bits})"), b),
        _ => bits,
    }
}

/// A BITCAST between lane counts (`u8x4` → `u32`, `f32` → `f16x2`): the source lanes' bits,
/// regrouped into the target lanes (lanes of at most 32 bits).
pub(crate) fn repack(v: &str, from: DType, to: DType, p: &mut Prelude) -> Result<String> {
    let (Some(a), Some(b)) = (from.scalar(), to.scalar()) else {
        return Err(Error::Render(format!("BITCAST: cannot bitcast {from} to {to}")));
    };
    let (wa, wb) = (from.width() as usize, to.width() as usize);
    if a.size() > 4 || b.size() > 4 || a.size() * wa != b.size() * wb {
        return Err(Error::Render(format!("BITCAST of {from} to {to}: WGSL regroups lanes of at most 32 bits")));
    }
    let bits_of = |size: usize| [Scalar::U8, Scalar::U16, Scalar::U32][size.min(4) / 2];
    let lane = |w: usize, i: usize| if w == 1 { v.to_string() } else { format!("{v}[{i}]") };
    let src: Vec<String> = (0..wa).map(|i| bitcast(&lane(wa, i), a, bits_of(a.size()), p)).collect();
    let mut out = Vec::with_capacity(wb);
    for j in 0..wb {
        let bits = if a.size() < b.size() {
            let r = b.size() / a.size();
            let parts: Vec<String> = (0..r).map(|k| format!("({} << {}u)", src[j * r + k], k * a.size() * 8)).collect();
            format!("({})", parts.join(" | "))
        } else {
            let r = a.size() / b.size();
            let mask = (1u64 << (b.size() * 8)) - 1;
            format!("(({} >> {}u) & {mask}u)", src[j / r], (j % r) * b.size() * 8)
        };
        out.push(bitcast(&bits, bits_of(b.size()), b, p));
    }
    Ok(if wb == 1 { out.remove(0) } else { format!("array<{}, {wb}>({})", reg(b), out.join(", ")) })
}

/// Element `k` of `addr`: its index, and for a packed global element, the word and the
/// element's bit offset in it.
fn packed_element(addr: &Address, k: u8) -> (String, Option<(String, String)>) {
    let idx = if k == 0 { addr.index.clone() } else { format!("({} + {k})", addr.index) };
    let s = addr.scalar;
    if addr.space != AddrSpace::Global || !packed(s) {
        return (idx, None);
    }
    let per = 4 / s.size();
    let word = format!("{}[u32({idx}) / {per}u]", addr.base);
    let shift = format!("((u32({idx}) % {per}u) * {}u)", s.size() * 8);
    (idx, Some((word, shift)))
}

fn mask(s: Scalar) -> &'static str {
    if s.size() == 1 { "0xffu" } else { "0xffffu" }
}

/// Element `k` of `addr` as a register value of its scalar.
pub(crate) fn load_element(addr: &Address, k: u8) -> String {
    let s = addr.scalar;
    let (idx, packed) = packed_element(addr, k);
    let Some((word, shift)) = packed else { return format!("{}[{idx}]", addr.base) };
    let bits = format!("((atomicLoad(&{word}) >> {shift}) & {})", mask(s));
    match s {
        Scalar::Bool => format!("({bits} != 0u)"),
        Scalar::I8 | Scalar::I16 => wrap(&format!("bitcast<i32>({bits})"), s),
        Scalar::BF16 => format!("bitcast<f32>({bits} << 16u)"),
        _ => bits,
    }
}

/// The statement (without the final `;`) storing `value` as element `k` of `addr`; a packed
/// element is an atomic AND then OR of its bits, so neighbours written by other items stay.
pub(crate) fn store_element(addr: &Address, k: u8, value: &str) -> String {
    let s = addr.scalar;
    let (idx, packed) = packed_element(addr, k);
    let Some((word, shift)) = packed else { return format!("{}[{idx}] = {value}", addr.base) };
    let bits = match s {
        Scalar::Bool => format!("select(0u, 1u, {value})"),
        Scalar::I8 | Scalar::I16 => format!("bitcast<u32>({value})"),
        Scalar::BF16 => format!("(bitcast<u32>({value}) >> 16u)"),
        _ => value.to_string(),
    };
    let m = mask(s);
    format!("atomicAnd(&{word}, ~({m} << {shift})); atomicOr(&{word}, ({bits} & {m}) << {shift})")
}

/// `isnan` (by the bits: a float comparison may be reordered away by the driver's compiler).
const ISNAN_F32: &str = "fn kiln_isnan_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }";
const ISNAN_F16: &str = "fn kiln_isnan_f16(x: f16) -> bool { return kiln_isnan_f32(f32(x)); }";

/// C's `pow`: integral exponents of negative bases, `pow(x, 0) == 1`, `pow(1, y) == 1`.
const POW_F32: &str = "fn kiln_pow_f32(x: f32, y: f32) -> f32 {
  if (y == 0.0f || x == 1.0f) { return 1.0f; }
  if (kiln_isnan_f32(x) || kiln_isnan_f32(y)) { return x + y; }
  if (x >= 0.0f) { return pow(x, y); }
  if (trunc(y) != y) { return bitcast<f32>(0x7fc00000u); }
  let r = pow(-x, y);
  if (trunc(y * 0.5f) != y * 0.5f) { return -r; }
  return r;
}";

/// An f32 rounded to the nearest bf16 (ties to even; NaN stays a quiet NaN): bf16 values
/// live in f32 registers and every bf16 result is rounded once, as the reference rounds it.
const BF16_ROUND: &str = "fn kiln_bf16(x: f32) -> f32 {
  let b = bitcast<u32>(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) { return bitcast<f32>((b | 0x00400000u) & 0xffff0000u); }
  return bitcast<f32>(((b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u) << 16u);
}";

/// The bits of an f16, from its exact f32 value (pack2x16float needs a capability naga
/// does not grant every adapter).
const F16_BITS: &str = "fn kiln_f16_bits(h: f16) -> u32 {
  let b = bitcast<u32>(f32(h));
  let sign = (b >> 16u) & 0x8000u;
  let e = (b >> 23u) & 0xffu;
  let m = b & 0x7fffffu;
  if (e == 0xffu) { return sign | 0x7c00u | select(0u, 0x200u | (m >> 13u), m != 0u); }
  if (e == 0u) { return sign; }
  if (e < 113u) { return sign | ((m | 0x800000u) >> (126u - e)); }
  return sign | ((e - 112u) << 10u) | (m >> 13u);
}";

/// The f16 with bits `h` (the low 16 bits), through its exact f32 value.
const F16_FROM_BITS: &str = "fn kiln_f16_from_bits(h: u32) -> f16 {
  let sign = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (e == 0x1fu) { return f16(bitcast<f32>(sign | 0x7f800000u | (m << 13u))); }
  if (e == 0u) { return f16(select(1.0f, -1.0f, sign != 0u) * f32(m) * 5.9604645e-8f); }
  return f16(bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u)));
}";

/// `e^x` within a few ulp (drivers' `exp` is `exp2(x·log2 e)`, whose error grows with |x|):
/// `x = n·ln 2 + r` with ln 2 split in two (Cody and Waite), `e^r` by its Taylor series to
/// r^7 (|r| ≤ ln 2 / 2), scaled by `2^n`.
const EXP_F32: &str = "fn kiln_exp_f32(x: f32) -> f32 {
  if (x > 89.0f) { return bitcast<f32>(0x7f800000u); }
  if (x < -104.0f) { return 0.0f; }
  if (!(x == x)) { return x; }
  let n = round(x * 1.44269502f);
  let r = (x - n * 0.693145751953125f) - n * 1.42860682e-6f;
  let p = 1.0f + r * (1.0f + r * (0.5f + r * (0.16666667f + r * (0.041666668f + r * (0.008333334f + r * (0.0013888889f + r * 0.0001984127f))))));
  return ldexp(p, i32(n));
}";

/// `sin` (`c` false) and `cos` (`c` true) within a few ulps, as Cephes' `sinf`/`cosf`: the
/// argument reduced by π/4 in three parts (exact for |x| below 8192), then a minimax polynomial
/// on [-π/4, π/4]. A GPU's own `sin` may be an approximation: NVIDIA's Vulkan driver gave
/// sin(0.001) = 0.00099997 and sin(-1000) 7e-5 off.
const SINCOS_F32: &str = "fn kiln_sincos_f32(v: f32, c: bool) -> f32 {
  if ((bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u) { return bitcast<f32>(0x7fc00000u); }
  var x = abs(v);
  var neg = !c && v < 0.0f;
  var j = u32(x * 1.27323954f);
  var y = f32(j);
  if ((j & 1u) == 1u) { j = j + 1u; y = y + 1.0f; }
  j = j & 7u;
  if (j > 3u) { j = j - 4u; neg = !neg; }
  if (c && j > 1u) { neg = !neg; }
  x = ((x - y * 0.78515625f) - y * 2.4187564849853515625e-4f) - y * 3.77489497744594108e-8f;
  let z = x * x;
  let s = x + x * z * ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f);
  let k = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z - 0.5f * z + 1.0f;
  let r = select(s, k, (j == 1u || j == 2u) != c);
  return select(r, -r, neg);
}
fn kiln_sin_f32(x: f32) -> f32 { return kiln_sincos_f32(x, false); }
fn kiln_cos_f32(x: f32) -> f32 { return kiln_sincos_f32(x, true); }";
