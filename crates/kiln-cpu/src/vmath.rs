//! The CPU dialect's vector math: f32/f64 vector EXP, EXP2, LOG and LOG2 computed in vector
//! registers (range reduction and a minimax polynomial, with AVX/FMA where the target has
//! them), and FMA, MAX and MIN through the x86 builtins, each with a lane loop as the portable
//! fallback (see the renderer's module docs, "Vector math").

use std::fmt::Write as _;

use kiln_cstyle::{Dialect, Prelude, Syntax};
use kiln_device::kiln_ir::{DType, Op, Scalar};

use crate::renderer::{CpuDialect, tag};

impl CpuDialect {
    /// The whole-vector spelling of `op` on `dtype` for [`Dialect::vector_alu`]: a vector math
    /// function or an x86 builtin behind its guard; `None` for every other op and type.
    pub(crate) fn vector_math(&self, op: Op, dtype: DType, args: &[String], p: &mut Prelude) -> Option<String> {
        let DType::Vector(s @ (Scalar::F32 | Scalar::F64), w) = dtype else { return None };
        let math = match op {
            Op::Exp => Some("exp"),
            Op::Exp2 => Some("exp2"),
            Op::Log => Some("log"),
            Op::Log2 => Some("log2"),
            _ => None,
        };
        if let (Some(f), [x]) = (math, args) {
            return Some(format!("{}({x})", self.vmath(f, s, w, p)));
        }
        let fname = match op {
            Op::MulAcc => "fma",
            Op::Max => "max",
            Op::Min => "min",
            _ => return None,
        };
        let ty = self.vector_type(s, w, p);
        let it = self.vector_type(if s == Scalar::F32 { Scalar::I32 } else { Scalar::I64 }, w, p);
        let name = format!("kiln_{fname}_{}", tag(s, w));
        let def = name.clone();
        // a lane: libm's `fmaf`, or the scalar MAX/MIN (the same rule as the x86 forms)
        let lane_fn = if op == Op::MulAcc {
            format!("fma{}", if s == Scalar::F32 { "f" } else { "" })
        } else {
            self.max_min(op, s, p)
        };
        // Padded widths (not a power of two) match no register size and keep the lane loop.
        let bytes = w as usize * s.size();
        if op != Op::MulAcc && bytes == 16 {
            self.sel(s, w, p); // the SSE2 MAX/MIN blend (see `x86_max_min`)
        }
        p.need(&name, move |_| {
            let (params, lane_args) = if op == Op::MulAcc {
                (format!("{ty} a, {ty} b, {ty} c"), "a[i], b[i], c[i]")
            } else {
                (format!("{ty} a, {ty} b"), "a[i], b[i]")
            };
            let cases = if op == Op::MulAcc {
                x86_fma(s, bytes).into_iter().map(|(g, call)| (g, format!("return {call};"))).collect()
            } else {
                x86_max_min(fname, s, bytes, &it, &tag(s, w))
            };
            let lanes = format!("{ty} r;\n  for (int i = 0; i < {w}; i++) r[i] = {lane_fn}({lane_args});\n  return r;");
            format!("static inline {ty} {def}({params}) {{\n{}}}\n", guarded(&cases, &lanes))
        });
        Some(format!("{name}({})", args.join(", ")))
    }

    /// `kiln_max_T`/`kiln_min_T` for scalar `s` (f32 or f64): MAX/MIN of floats on kiln's CPU,
    /// `a` where `a > b` (`<` for MIN) or `b` is NaN, else `b`. That is `fmax`'s NaN rule with the
    /// second operand on equal zeros, lane for lane what the x86 vector forms (`x86_max_min`)
    /// compute, so a MAX gives the same bits as a scalar and as a lane of a vector (which lets
    /// kiln-ir lift it into vectors). Returns the function's name.
    pub(crate) fn max_min(&self, op: Op, s: Scalar, p: &mut Prelude) -> String {
        let (f, cmp) = if op == Op::Max { ("max", ">") } else { ("min", "<") };
        let ty = self.scalar_type(s, p);
        let name = format!("kiln_{f}_{}", tag(s, 1));
        let def = name.clone();
        p.need(&name, move |_| {
            format!("static inline {ty} {def}({ty} a, {ty} b) {{ return (a {cmp} b || b != b) ? a : b; }}\n")
        });
        name
    }

    /// `kiln_madd_T` (a*b + c, fused where the target has vector FMA), `kiln_any_T` (whether a
    /// lane mask has a lane set) and `kiln_sel_T` (a lane select by an all-ones/all-zeros mask)
    /// for the float vector `s`x`w`: the building blocks of the vector math functions.
    fn vmath_support(&self, s: Scalar, w: u8, p: &mut Prelude) {
        let t = tag(s, w);
        let ty = self.vector_type(s, w, p);
        let it = self.vector_type(if s == Scalar::F32 { Scalar::I32 } else { Scalar::I64 }, w, p);
        let bytes = (w as usize).next_power_of_two() * s.size();
        p.need(&format!("kiln_madd_{t}"), |_| {
            let cases: Vec<_> = x86_fma(s, bytes).into_iter().map(|(g, call)| (g, format!("return {call};"))).collect();
            format!(
                "/* a*b + c: one rounding where the target has vector FMA, else two. */\n\
                 static inline {ty} kiln_madd_{t}({ty} a, {ty} b, {ty} c) {{\n{}}}\n",
                guarded(&cases, "return a * b + c;")
            )
        });
        // AVX-512 tests a register for a set bit with a mask compare, AVX with `vptest`, SSE2
        // with `pmovmskb`.
        let any_fast = match bytes {
            16 => {
                Some(("defined(__SSE2__)", format!("__builtin_ia32_pmovmskb128(({})m) != 0", gnu_vector("char", 16))))
            }
            32 => {
                let q = gnu_vector("long long", 32);
                Some(("defined(__AVX__)", format!("!__builtin_ia32_ptestz256(({q})m, ({q})m)")))
            }
            64 => {
                let q = gnu_vector("long long", 64);
                Some((
                    "defined(__AVX512F__)",
                    format!("__builtin_ia32_cmpq512_mask(({q})m, ({q}){{0}}, 4 /* NE */, (unsigned char)-1) != 0"),
                ))
            }
            _ => None,
        };
        p.need(&format!("kiln_any_{t}"), |_| {
            let cases: Vec<_> = any_fast.into_iter().map(|(g, test)| (g, format!("return {test};"))).collect();
            let words = bytes / 8;
            let lanes = format!(
                "uint64_t w[{words}], o = 0;\n  memcpy(w, &m, {bytes});\n  \
                 for (int i = 0; i < {words}; i++) o |= w[i];\n  return o != 0;"
            );
            format!(
                "/* Whether any lane of the mask m is set. */\n\
                 static inline bool kiln_any_{t}({it} m) {{\n{}}}\n",
                guarded(&cases, &lanes)
            )
        });
        self.sel(s, w, p);
    }

    /// `kiln_sel_T` for the f32/f64 vector `s`x`w`: the lanes of `a` where the lane mask `m`
    /// is all ones, of `b` where it is zero.
    fn sel(&self, s: Scalar, w: u8, p: &mut Prelude) {
        let t = tag(s, w);
        let ty = self.vector_type(s, w, p);
        let it = self.vector_type(if s == Scalar::F32 { Scalar::I32 } else { Scalar::I64 }, w, p);
        p.need(&format!("kiln_sel_{t}"), |_| {
            format!(
                "/* Lanes of a where m is all ones, of b where m is zero. */\n\
                 static inline {ty} kiln_sel_{t}({it} m, {ty} a, {ty} b) {{\n  return ({ty})((m & ({it})a) | (~m & ({it})b));\n}}\n"
            )
        });
    }

    /// The vector math function `kiln_<f>_<s>x<w>` (f: exp, exp2, log, log2) for a float vector
    /// (see [`VMATH_GUARD`] and the templates below); returns its name.
    fn vmath(&self, f: &'static str, s: Scalar, w: u8, p: &mut Prelude) -> String {
        let t = tag(s, w);
        let name = format!("kiln_{f}_{t}");
        let ty = self.vector_type(s, w, p);
        let f32 = s == Scalar::F32;
        let it = self.vector_type(if f32 { Scalar::I32 } else { Scalar::I64 }, w, p);
        let ut = self.vector_type(if f32 { Scalar::U32 } else { Scalar::U64 }, w, p);
        let def = name.clone();
        p.need(&name, move |p| {
            self.vmath_support(s, w, p);
            let body = match (f, f32) {
                ("exp" | "exp2", _) => {
                    let core = format!("kiln_{f}core_{t}");
                    let template = match (f, f32) {
                        ("exp", true) => EXP_CORE_F32,
                        ("exp2", true) => EXP2_CORE_F32,
                        ("exp", false) => EXP_CORE_F64,
                        _ => EXP2_CORE_F64,
                    };
                    p.need(&core, |_| subst(template, &ty, &it, &ut, &t));
                    exp_body(&core, f == "exp", f32)
                }
                ("log" | "log2", false) => {
                    p.need(&format!("kiln_logparts_{t}"), |_| subst(LOGPARTS_F64, &ty, &it, &ut, &t));
                    format!("{}{LOG_SPECIALS}", if f == "log" { LOG_F64 } else { LOG2_F64 })
                }
                // f32 logarithms are computed in f64 and rounded once: < 0.51 ulp.
                _ => {
                    let d = self.vmath(f, Scalar::F64, w, p);
                    let dt = self.vector_type(Scalar::F64, w, p);
                    format!("  return __builtin_convertvector({d}(__builtin_convertvector(x, {dt})), {ty});\n")
                }
            };
            let libm = if f32 { format!("{f}f") } else { f.to_string() };
            format!(
                "static inline {ty} {def}({ty} x) {{\n#if {VMATH_GUARD}\n{}#else\n  {ty} r;\n  for (int i = 0; i < {w}; i++) r[i] = {libm}(x[i]);\n  return r;\n#endif\n}}\n",
                subst(&body, &ty, &it, &ut, &t)
            )
        });
        name
    }
}

/// Fills a vector math template: `$V` the float vector type, `$I`/`$U` the signed/unsigned
/// integer vectors of the same lane count and width, `$T` the float vector's tag.
fn subst(template: &str, v: &str, i: &str, u: &str, t: &str) -> String {
    template.replace("$V", v).replace("$I", i).replace("$U", u).replace("$T", t)
}

/// The GNU vector type of `bytes` bytes of `elem`, spelled inline (for the casts the x86
/// builtins' operand types need).
fn gnu_vector(elem: &str, bytes: usize) -> String {
    format!("{elem} __attribute__((vector_size({bytes})))")
}

/// `body` under the first of `cases` (a preprocessor condition and the code for it) that
/// holds, else `fallback`: the lines of a function body.
fn guarded(cases: &[(&str, String)], fallback: &str) -> String {
    let mut out = String::new();
    for (i, (cond, body)) in cases.iter().enumerate() {
        let _ = write!(out, "#{} {cond}\n  {body}\n", if i == 0 { "if" } else { "elif" });
    }
    if cases.is_empty() { format!("  {fallback}\n") } else { format!("{out}#else\n  {fallback}\n#endif\n") }
}

/// The x86 builtin that computes `a*b + c` with one rounding on a `bytes`-byte vector of `s`
/// (f32 or f64) named `a`, `b`, `c`, and the condition under which the target has it. The
/// builtins are those behind `<immintrin.h>`'s `_mm*_fmadd_p[sd]`, with the same names and
/// operands in gcc ≥ 12 and clang ≥ 14; calling them directly spares every kernel that header
/// (about 0.2 s of compile time).
fn x86_fma(s: Scalar, bytes: usize) -> Option<(&'static str, String)> {
    let pd = if s == Scalar::F32 { "ps" } else { "pd" };
    match bytes {
        16 => Some(("defined(__FMA__)", format!("__builtin_ia32_vfmadd{pd}(a, b, c)"))),
        32 => Some(("defined(__FMA__)", format!("__builtin_ia32_vfmadd{pd}256(a, b, c)"))),
        64 => {
            let mask = if s == Scalar::F32 { "unsigned short" } else { "unsigned char" };
            // All lanes (mask -1), the current rounding mode (4: _MM_FROUND_CUR_DIRECTION).
            Some(("defined(__AVX512F__)", format!("__builtin_ia32_vfmadd{pd}512_mask(a, b, c, ({mask})-1, 4)")))
        }
        _ => None,
    }
}

/// `fmax`/`fmin` (`f`: "max" or "min") of the `bytes`-byte vectors `a`, `b` of `s` (f32 or
/// f64, `it` the lane mask type, `t` the vector's tag) through the x86 builtins, each body with
/// the condition under which it applies. `maxp[sd]`/`minp[sd]` give `a > b ? a : b` (`<` for
/// min) per lane, so `b` when either is NaN; lanes where `b` is NaN then take `a`. The NaN test
/// is on `b` so that in `acc = max(acc, x)` the loop-carried chain through `a` is one or two
/// instructions: AVX-512 merges the max into `a` under the mask of lanes where `b` is a number
/// (one masked `vmaxps`; its 64-byte builtins differ between gcc and clang), AVX blends with
/// `vblendvps`, SSE2 by bits.
fn x86_max_min(f: &str, s: Scalar, bytes: usize, it: &str, t: &str) -> Vec<(&'static str, String)> {
    let pd = if s == Scalar::F32 { "ps" } else { "pd" };
    let mask = if s == Scalar::F32 { "unsigned short" } else { "unsigned char" };
    match bytes {
        16 => vec![(
            "defined(__SSE2__)",
            format!("return kiln_sel_{t}(({it})(b != b), a, __builtin_ia32_{f}{pd}(a, b));"),
        )],
        32 => vec![(
            "defined(__AVX__)",
            format!(
                "return __builtin_ia32_blendv{pd}256(__builtin_ia32_{f}{pd}256(a, b), a, (__typeof__(a))(b != b));"
            ),
        )],
        64 => {
            // 7: _CMP_ORD_Q (b is a number); 4: _MM_FROUND_CUR_DIRECTION.
            let number = format!("__builtin_ia32_cmp{pd}512_mask(b, b, 7, ({mask})-1, 4)");
            vec![
                (
                    "defined(__AVX512F__) && defined(__clang__)",
                    format!("return __builtin_ia32_select{pd}_512({number}, __builtin_ia32_{f}{pd}512(a, b, 4), a);"),
                ),
                ("defined(__AVX512F__)", format!("return __builtin_ia32_{f}{pd}512_mask(a, b, a, {number}, 4);")),
            ]
        }
        _ => Vec::new(),
    }
}

/// Where the vector math templates replace the libm lane loop: targets with float SIMD (on
/// others the lane loop is as fast and the results are libm's).
const VMATH_GUARD: &str = "defined(__SSE2__) || defined(__ARM_NEON)";

// The vector math templates. Each assumes IEEE binary32/binary64 lanes and round-to-nearest.
// Polynomial coefficients are minimax fits (Remez, weighted for relative error of the
// result, then rounded to the lane type).
// Largest errors measured against correctly rounded results (every f32 input; 20M f64
// samples per function), with FMA / without: f32 exp 1.01 / 0.98 ulp, exp2 0.95 / 1.23,
// log and log2 0.50 (computed in f64); f64 exp 1.03 / 1.02, exp2 0.94 / 1.21, log 0.83,
// log2 0.88. The test `vector_exp_and_log_match_libm_within_ulps` holds them to 2 ulps of
// libm (1 for the f32 logarithms).

/// The body of `kiln_exp_T`/`kiln_exp2_T` around its core (`kiln_expcore_T`/`kiln_exp2core_T`,
/// which returns e^r or 2^r and sets `t`, a float whose low mantissa bits hold n): when every
/// lane's result is a normal number, 2^n is added to the exponent bits directly; otherwise
/// (NaN, or a lane near or past the overflow/underflow edge) x is clamped (NaN stays NaN) and
/// 2^n applied as two exact power-of-two factors, so overflow gives +inf and underflow rounds
/// once into the subnormals. Both paths give the same bits for lanes with normal results.
fn exp_body(core: &str, natural: bool, f32: bool) -> String {
    let (fast, hi, lo) = match (natural, f32) {
        (true, true) => ("86.0f", "89.0f", "-104.0f"),
        (false, true) => ("125.0f", "129.0f", "-151.0f"),
        (true, false) => ("707.0", "710.0", "-746.0"),
        (false, false) => ("1020.0", "1025.0", "-1076.0"),
    };
    let (sign, mant, magic, bias) = if f32 {
        ("0x7fffffff", 23, "0x4b400000", 127)
    } else {
        ("0x7fffffffffffffff", 52, "0x4338000000000000", 1023)
    };
    let (half, mid) = (2 * (bias + 1), bias + 1);
    format!(
        "  $V t;
  if (__builtin_expect(!kiln_any_$T(~($I)(($V)(($U)x & {sign}) <= {fast})), 1)) {{
    $V e = {core}(x, &t);
    return ($V)(($U)e + (($U)t << {mant}));
  }}
  const $V z = {{0}};
  x = kiln_sel_$T(($I)(x > {hi}), z + {hi}, x);
  x = kiln_sel_$T(($I)(x < {lo}), z + ({lo}), x);
  $V e = {core}(x, &t);
  $I k = ($I)t - {magic};
  $I k1 = ($I)((($U)(k + {half})) >> 1) - {mid}; /* floor(k/2) */
  return e * ($V)((($U)(k1 + {bias})) << {mant}) * ($V)((($U)(k - k1 + {bias})) << {mant});
"
    )
}

/// e^x = 2^n * e^r, n = round(x/ln2), r = x - n*ln2 with ln2 = hi + lo and n*hi exact; e^r =
/// 1 + r + r^2*q(r) on |r| <= ln2/2 (q error < 2^-28). Needs |x| <= 104.
const EXP_CORE_F32: &str = "static inline $V kiln_expcore_$T($V x, $V *t) {
  const $V z = {0};
  *t = kiln_madd_$T(x, z + 0x1.715476p+0f, z + 0x1.8p23f);
  $V n = *t - 0x1.8p23f;
  $V r = kiln_madd_$T(n, z - 0x1.63p-1f, x);
  r = kiln_madd_$T(n, z + 0x1.bd0106p-13f, r);
  $V q = kiln_madd_$T(z + 0x1.6a1a5ep-10f, r, z + 0x1.123fd2p-7f);
  q = kiln_madd_$T(q, r, z + 0x1.555916p-5f);
  q = kiln_madd_$T(q, r, z + 0x1.55548ap-3f);
  q = kiln_madd_$T(q, r, z + 0x1.fffffcp-2f);
  return kiln_madd_$T(r * r, q, r) + 1.0f;
}
";

/// 2^x = 2^n * 2^r, n = round(x), r = x - n exactly; 2^r = 1 + r*q(r) on |r| <= 1/2 (q error
/// < 2^-28). Needs |x| <= 2^22.
const EXP2_CORE_F32: &str = "static inline $V kiln_exp2core_$T($V x, $V *t) {
  const $V z = {0};
  *t = x + 0x1.8p23f;
  $V r = x - (*t - 0x1.8p23f);
  $V q = kiln_madd_$T(z + 0x1.41fbbcp-13f, r, z + 0x1.5f3e52p-10f);
  q = kiln_madd_$T(q, r, z + 0x1.3b2d4cp-7f);
  q = kiln_madd_$T(q, r, z + 0x1.c6aee8p-5f);
  q = kiln_madd_$T(q, r, z + 0x1.ebfbdcp-3f);
  q = kiln_madd_$T(q, r, z + 0x1.62e43p-1f);
  return kiln_madd_$T(r, q, z + 1.0f);
}
";

/// As [`EXP_CORE_F32`] in binary64 (q error < 2^-57). Needs |x| <= 746.
const EXP_CORE_F64: &str = "static inline $V kiln_expcore_$T($V x, $V *t) {
  const $V z = {0};
  *t = kiln_madd_$T(x, z + 0x1.71547652b82fep+0, z + 0x1.8p52);
  $V n = *t - 0x1.8p52;
  $V r = kiln_madd_$T(n, z - 0x1.62e42feep-1, x);
  r = kiln_madd_$T(n, z - 0x1.a39ef35793c76p-33, r);
  $V q = kiln_madd_$T(z + 0x1.ad7ab769bd1b4p-26, r, z + 0x1.28b16f4084527p-22);
  q = kiln_madd_$T(q, r, z + 0x1.71df2ee51c306p-19);
  q = kiln_madd_$T(q, r, z + 0x1.a01995e58cbb5p-16);
  q = kiln_madd_$T(q, r, z + 0x1.a01a01231b577p-13);
  q = kiln_madd_$T(q, r, z + 0x1.6c16c1859f66ep-10);
  q = kiln_madd_$T(q, r, z + 0x1.11111111299d8p-7);
  q = kiln_madd_$T(q, r, z + 0x1.555555555023ep-5);
  q = kiln_madd_$T(q, r, z + 0x1.55555555554f0p-3);
  q = kiln_madd_$T(q, r, z + 0x1.000000000000bp-1);
  return kiln_madd_$T(r * r, q, r) + 1.0;
}
";

/// As [`EXP2_CORE_F32`] in binary64 (q error < 2^-58). Needs |x| <= 2^51.
const EXP2_CORE_F64: &str = "static inline $V kiln_exp2core_$T($V x, $V *t) {
  const $V z = {0};
  *t = x + 0x1.8p52;
  $V r = x - (*t - 0x1.8p52);
  $V q = kiln_madd_$T(z + 0x1.e79bb6fc55606p-32, r, z + 0x1.e61b4f9a207f5p-28);
  q = kiln_madd_$T(q, r, z + 0x1.b5267cdfd91eep-24);
  q = kiln_madd_$T(q, r, z + 0x1.62bfc79d4b59fp-20);
  q = kiln_madd_$T(q, r, z + 0x1.ffcbfba980f96p-17);
  q = kiln_madd_$T(q, r, z + 0x1.4309130ed8cd5p-13);
  q = kiln_madd_$T(q, r, z + 0x1.5d87fe78cd6cfp-10);
  q = kiln_madd_$T(q, r, z + 0x1.3b2ab6fba011ap-7);
  q = kiln_madd_$T(q, r, z + 0x1.c6b08d7049fe8p-5);
  q = kiln_madd_$T(q, r, z + 0x1.ebfbdff82c5a4p-3);
  q = kiln_madd_$T(q, r, z + 0x1.62e42fefa39efp-1);
  return kiln_madd_$T(r, q, z + 1.0);
}
";

/// The shared part of the binary64 logarithms: x > 0 (subnormals scaled up by 2^54) is split
/// as 2^k * (1 + f) with sqrt(1/2) <= 1 + f < sqrt(2); returns k and sets h = f*f/2 and
/// tail = s*(h + R(s*s)) with s = f/(2 + f), so that log(1 + f) = f - h + tail (R error
/// < 2^-58). Lanes with x <= 0, inf or NaN hold garbage; the callers replace them.
const LOGPARTS_F64: &str = "static inline $V kiln_logparts_$T($V x, $V *f, $V *h, $V *tail) {
  const $V z = {0};
  $I sub = ($I)(x < 0x1p-1022);
  x = kiln_sel_$T(sub, x * 0x1p54, x);
  $U u = ($U)x + 0x95f619980c433; /* (1.0 - sqrt(1/2)) in bits: carries into k when 1 + f >= sqrt(2) */
  $U kb = (u >> 52) + ($U)(sub & -54);
  $V m = ($V)((u & 0xfffffffffffff) + 0x3fe6a09e667f3bcd);
  *f = m - 1.0;
  *h = 0.5 * *f * *f;
  $V s = *f / (*f + 2.0);
  $V zz = s * s;
  $V q = kiln_madd_$T(z + 0x1.2f0d8ee3130bep-3, zz, z + 0x1.39a0f4fa4075ap-3);
  q = kiln_madd_$T(q, zz, z + 0x1.7466462ce5e7ap-3);
  q = kiln_madd_$T(q, zz, z + 0x1.c71c51e7f56c4p-3);
  q = kiln_madd_$T(q, zz, z + 0x1.2492494217a45p-2);
  q = kiln_madd_$T(q, zz, z + 0x1.999999997fb31p-2);
  q = kiln_madd_$T(q, zz, z + 0x1.5555555555593p-1);
  *tail = s * (*h + q * zz);
  return ($V)(kb + (0x4338000000000000 - 1023)) - 0x1.8p52;
}
";

/// log(x) = k*ln2 + log(1 + f), ln2 = hi + lo with k*hi exact.
const LOG_F64: &str = "  const $V z = {0};
  $V f, h, tail;
  $V k = kiln_logparts_$T(x, &f, &h, &tail);
  $V y = k * 0x1.62e42feep-1 - ((h - (tail + k * 0x1.a39ef35793c76p-33)) - f);
";

/// log2(x) = k + log(1 + f)/ln2, with f - h split so its high part times the high part of
/// 1/ln2 is exact, and k added last with its rounding error carried.
const LOG2_F64: &str = "  const $V z = {0};
  $V f, h, tail;
  $V k = kiln_logparts_$T(x, &f, &h, &tail);
  $V hi = ($V)(($U)(f - h) & 0xffffffff00000000);
  $V lo = (f - hi) - h + tail;
  $V vh = hi * 0x1.71547652p+0;
  $V vl = (lo + hi) * 0x1.705fc2eefa2p-33 + lo * 0x1.71547652p+0;
  $V y = k + vh;
  vl = vl + ((k - y) + vh);
  y = vl + y;
";

/// Special cases of the logarithms, as libm: log(±0) = -inf, log(x < 0) = NaN, log(+inf) =
/// +inf, log(NaN) = NaN.
const LOG_SPECIALS: &str = "  y = kiln_sel_$T(($I)(x == 0.0), z - __builtin_inf(), y);
  y = kiln_sel_$T(($I)(x < 0.0), z + __builtin_nan(\"\"), y);
  return kiln_sel_$T(~($I)(x < __builtin_inf()), x, y);
";
