//! The CPU dialect of C: GNU C11 as gcc ≥ 12 and clang ≥ 14 accept it.
//!
//! # Entry ABI
//! Every kernel is one exported function
//! ```c
//! void NAME(void **bufs, const int64_t *vals, int64_t kiln_core, int64_t kiln_ncores);
//! ```
//! `bufs` holds one host pointer per parameter slot (in slot order), `vals` the variable values
//! in `ProgramSpec::var_names` order. One call runs chunk `kiln_core` of `kiln_ncores`: the
//! launch indices become loops, global axis 0 outermost and split into `kiln_ncores`
//! contiguous chunks (`kiln_core` runs its own), then global axes 1 and 2, then the local
//! axes. Calls for different chunks touch disjoint iterations and may run concurrently.
//!
//! # Work groups
//! The CPU backend has no work groups: a kernel with work-group local memory (DEFINE_LOCAL)
//! or a barrier (BARRIER) is refused at render time with [`kiln_device::Error::Render`]
//! saying so and pointing to OpenCL, which runs them (PoCL does on the CPU). IF blocks are
//! plain C `if` blocks and run here.
//!
//! # Types
//! bool is `bool` in registers and a byte (0/1) in memory. f16 and bf16 are their bit patterns
//! in a `uint16_t`, in registers and in memory, with arithmetic in f32 (rounded once per op)
//! through `kiln_f16_to_f32`/`kiln_f32_to_f16` and `kiln_bf16_to_f32`/`kiln_f32_to_bf16`.
//! `_Float16` is not the storage type because not every C compiler kiln accepts has it:
//! clang before 15 rejects it on x86-64 (Debian 12's clang is 14). The f16 conversions are
//! `_Float16` casts where the compiler has the type and the target converts in hardware
//! (gcc ≥ 12 with F16C, AArch64), the F16C builtins where only the instructions are there
//! (clang 14), and portable bit arithmetic otherwise; all three give the same bits (see
//! `F16_HELPERS`). Vectors are GNU vector types `kiln_<dtype>`
//! (e.g. `kiln_f32x4`) with a power-of-two lane count; other widths are padded to the next
//! power of two and only their first lanes are read or written. Vector loads and stores go
//! through `memcpy`, so any element-aligned address works.
//!
//! # Non-temporal stores
//! A STORE hinted non-temporal becomes `kiln_stnt_T` on x86: `movntdq`/`vmovntdq` for 16-,
//! 32- and 64-byte vectors, `movnti` for 4- and 8-byte scalars, behind a runtime check that
//! the address is aligned for the instruction (else a plain store); other types and ISAs store
//! plainly. A kernel with such stores ends every call with `sfence`, so the stores are
//! visible before the call returns.
//!
//! # Vector instructions
//! Whole-vector arithmetic is GNU vector operations; FMA, MAX/MIN and mask tests on x86 are
//! the `__builtin_ia32_*` builtins both gcc and clang define, guarded by the target's macros
//! (`__FMA__`, `__AVX__`, `__AVX512F__`, ...), with a lane loop otherwise. No system header is
//! included: `<immintrin.h>` alone would cost more compile time than the kernel. Comparisons
//! and WHERE go lane by lane, which the compiler vectorizes (see [`CpuDialect`]'s `vector_alu`).
//!
//! # Vector math
//! EXP, EXP2, LOG and LOG2 on f32/f64 vectors are computed in vector registers (range
//! reduction and a minimax polynomial, with AVX/FMA where the target has them) instead of a
//! libm call per lane: within about 1 ulp of the correctly rounded result, with libm's results
//! for ±0, ±inf, NaN, overflow and underflow (subnormal results rounded once). Targets without
//! SSE2 or NEON keep the libm lane loop.

use std::fmt::Write as _;

use kiln_cstyle::{
    Address, CStyle, Dialect, KernelParam, KernelVar, LaunchIndex, MathFn, Prelude, Syntax, c_float_literal,
    c_vector_operator, saturating_cast, unsupported_wmma,
};
use kiln_device::kiln_ir::{DType, Op, Scalar, Wmma, bf16_bits, f16_bits};
use kiln_device::{Error, Result};

/// Renders kernels to C for [`crate::CCompiler`].
pub type CpuRenderer = CStyle<CpuDialect>;

/// The CPU renderer for 64-byte vectors (AVX-512's registers; a narrower target splits them).
pub fn cpu_renderer() -> CpuRenderer {
    cpu_renderer_for(64)
}

/// The CPU renderer for a target whose widest vector register is `vector_bytes` bytes.
pub fn cpu_renderer_for(vector_bytes: usize) -> CpuRenderer {
    CStyle::new(CpuDialect { vector_bytes }, crate::CPU.clone())
}

/// The spelling of C for the CPU backend (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct CpuDialect {
    /// The widest vector register of the target, in bytes: the register tiles that
    /// [`Dialect::optimize`] builds are at most this wide.
    pub vector_bytes: usize,
}

pub(crate) fn tag(s: Scalar, w: u8) -> String {
    if w > 1 { format!("{}x{w}", s.name()) } else { s.name().to_string() }
}

/// Parenthesizes `e` unless it is a plain identifier or number.
fn atom(e: &str) -> String {
    if e.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') { e.to_string() } else { format!("({e})") }
}

impl CpuDialect {
    /// `kiln_f16_to_f32` and `kiln_f32_to_f16` (see `F16_HELPERS`).
    fn f16_helpers(&self, p: &mut Prelude) {
        p.need("kiln_f16", |_| F16_HELPERS.to_string());
    }

    /// `kiln_f64_to_f32_odd` (see [`F64_TO_F32_ODD`]).
    fn f64_to_f32_odd(&self, p: &mut Prelude) {
        p.need("kiln_f64_to_f32_odd", |_| F64_TO_F32_ODD.to_string());
    }

    fn bf16_helpers(&self, p: &mut Prelude) {
        p.need("kiln_bf16", |_| {
            "static inline float kiln_bf16_to_f32(uint16_t b) {\n\
             \x20 uint32_t u = (uint32_t)b << 16;\n\
             \x20 float f;\n\
             \x20 memcpy(&f, &u, 4);\n\
             \x20 return f;\n\
             }\n\
             /* Round to nearest even; NaN stays a (quiet) NaN of the same sign. */\n\
             static inline uint16_t kiln_f32_to_bf16(float f) {\n\
             \x20 uint32_t u;\n\
             \x20 memcpy(&u, &f, 4);\n\
             \x20 if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);\n\
             \x20 u += 0x7fffu + ((u >> 16) & 1u);\n\
             \x20 return (uint16_t)(u >> 16);\n\
             }\n"
            .to_string()
        });
    }

    /// A saturating float → integer conversion (NaN → 0), like Rust's `as`.
    fn float_to_int(&self, e: &str, from: Scalar, to: Scalar, p: &mut Prelude) -> String {
        let f = if from == Scalar::F64 { Scalar::F64 } else { Scalar::F32 };
        let name = format!("kiln_{}_to_{}", f.name(), to.name());
        let (ft, tt) = (self.scalar_type(f, p), self.scalar_type(to, p));
        let def = name.clone();
        p.need(&name, |_| saturating_cast("static inline", &def, (f, ft.as_str()), (to, tt.as_str())));
        format!("{name}({e})")
    }

    /// A value of `s` (f32 or f64) with the IEEE bit pattern `bits`.
    fn float_from_bits(&self, bits: u64, s: Scalar) -> String {
        let (ut, ft) = if s == Scalar::F32 { ("uint32_t", "float") } else { ("uint64_t", "double") };
        format!("(((union {{ {ut} u; {ft} f; }}){{ .u = 0x{bits:x}u }}).f)")
    }
}

/// The WMMA forms the CPU declares for a target whose widest vector register is
/// `vector_bytes` bytes: the one-thread micro-tile `m4nLk4`, L the f32 lanes of one register
/// (4 to 16), for f32→f32, f16→f32, bf16→f32, f16→f16 and bf16→bf16. Each row of D is one
/// register of accumulators (f32, or f16 on AVX512-FP16). The renderer takes any one-thread
/// shape whose fragments fit a vector; these are the ones a compiler should tile for.
pub fn cpu_wmma_forms(vector_bytes: usize) -> Vec<Wmma> {
    let lanes = (vector_bytes / 4).clamp(4, 16) as u16;
    [
        (Scalar::F32, Scalar::F32),
        (Scalar::F16, Scalar::F32),
        (Scalar::BF16, Scalar::F32),
        (Scalar::F16, Scalar::F16),
        (Scalar::BF16, Scalar::BF16),
    ]
    .into_iter()
    .map(|(input, acc)| Wmma::single(4, lanes, 4, input, acc))
    .collect()
}

/// A WMMA helper's body on the target's matrix instructions (see [`CpuDialect::native_wmma`]).
struct NativeWmma {
    /// The preprocessor condition under which it replaces the portable body.
    guard: &'static str,
    /// How it rounds, for the helper's comment.
    note: &'static str,
    body: String,
}

/// The preprocessor condition under which a WMMA helper uses AVX512-BF16's `vdpbf16ps`
/// (GCC has `__builtin_shufflevector` from 12).
const AVX512_BF16_GUARD: &str = "defined(__AVX512BF16__) && (defined(__clang__) || __GNUC__ >= 12)";
/// The preprocessor condition under which a WMMA helper uses AVX512-FP16's `vfmadd231ph`.
const AVX512_FP16_GUARD: &str = "defined(__AVX512FP16__)";

impl CpuDialect {
    /// Registers `kiln_wmma_<shape>_<input>_<acc>`, the register micro-tile of the one-thread
    /// WMMA `w`, and returns its name.
    ///
    /// The portable body copies the fragments into f32 arrays (f16 and bf16 converted
    /// exactly, through `kiln_f16_to_f32`, which is a `_Float16` conversion where the compiler
    /// has the type, or `kiln_bf16_to_f32`); each row of D is a vector of N f32 accumulators,
    /// started from C's row, and takes for k = 0, 1, ... one vector fused multiply-add of A's
    /// element (broadcast) by B's row k, with the target's FMA instructions at its vector width
    /// (`kiln_fma_f32xN`, a `fmaf` lane loop where the target has none). Every element of D is
    /// thus the in-order fma chain of [`kiln_device::kiln_ir::wmma`], rounded once to the
    /// accumulator dtype (to nearest even): bit for bit the reference.
    ///
    /// Where the target has a matrix instruction for the form, a body of its own comes first
    /// under the preprocessor condition of that instruction set (see [`CpuDialect::native_wmma`]).
    fn wmma_helper(&self, w: &Wmma, p: &mut Prelude) -> String {
        let name = format!("kiln_wmma_{}_{}_{}", w.shape_name(), w.input.name(), w.acc.name());
        let def = name.clone();
        p.need(&name.clone(), move |p| {
            let (m, n, k) = (w.m as usize, w.n as usize, w.k as usize);
            let [adt, bdt, cdt] = w.operand_dtypes();
            let ty = |dt: DType, p: &mut Prelude| match dt {
                DType::Vector(s, lanes) => self.vector_type(s, lanes, p),
                other => self.scalar_type(other.scalar().unwrap_or(Scalar::F32), p),
            };
            let (at, bt, ct) = (ty(adt, p), ty(bdt, p), ty(cdt, p));
            let row_dt = DType::vec(Scalar::F32, n.min(255) as u8);
            let row = ty(row_dt, p);
            let fma = match row_dt {
                DType::Vector(..) => self.vector_alu(Op::MulAcc, row_dt, &["x".into(), "y".into(), "z".into()], p),
                _ => None,
            };
            let fma =
                fma.unwrap_or_else(|| self.math(MathFn::Fma, Scalar::F32, &["x".into(), "y".into(), "z".into()], p));
            let fma = |x: &str, y: &str, z: &str| fma.replace("(x, y, z)", &format!("({x}, {y}, {z})"));
            let broadcast =
                if n > 1 { format!("(({row}){{0}} + av[i * {k} + j])") } else { format!("av[i * {k} + j]") };
            let mut body = String::new();
            // The fragments as f32 arrays.
            for (arr, src, count, s) in
                [("av", "a", m * k, w.input), ("bv", "b", k * n, w.input), ("cv", "c", m * n, w.acc)]
            {
                let _ = writeln!(body, "{}", self.fragment_as_f32(arr, src, count, s, p));
            }
            let store = self.store_row(w, p);
            let (dv_ty, dv_size) = if w.acc == Scalar::F32 { ("float", 4) } else { ("uint16_t", 2) };
            let _ = write!(
                body,
                "  {dv_ty} dv[{mn}];\n  for (int i = 0; i < {m}; i++) {{\n    {row} acc = {{0}};\n    \
                 memcpy(&acc, cv + i * {n}, {nb});\n    for (int j = 0; j < {k}; j++) {{\n      \
                 {row} bk = {{0}};\n      memcpy(&bk, bv + j * {n}, {nb});\n      acc = {};\n    }}\n{store}\n  }}\n  \
                 {ct} d = {{0}};\n  memcpy(&d, dv, {});\n  return d;\n",
                fma(&broadcast, "bk", "acc"),
                m * n * dv_size,
                mn = m * n,
                nb = n * 4,
            );
            let (body, note) = match self.native_wmma(w, &ct, p) {
                Some(n) => (format!("#if {}\n{}#else\n{body}#endif\n", n.guard, n.body), n.note),
                None => (body, ""),
            };
            format!(
                "/* WMMA {w}: D = A·B + C on row-major fragments; each element of D is C's, then one fused\n   \
                 multiply-add per k in order, in f32, rounded once to {acc}{native}. */\n\
                 static inline {ct} {def}({at} a, {bt} b, {ct} c) {{\n{body}}}\n",
                acc = w.acc,
                native = note,
            )
        });
        name
    }

    /// `float {arr}[count]` holding the fragment `src` of `count` elements of dtype `s`.
    fn fragment_as_f32(&self, arr: &str, src: &str, count: usize, s: Scalar, p: &mut Prelude) -> String {
        if s == Scalar::F32 {
            format!("  float {arr}[{count}];\n  memcpy({arr}, &{src}, {});", count * 4)
        } else {
            let conv = self.to_f32(&format!("{arr}_h[i]"), s, p);
            format!(
                "  uint16_t {arr}_h[{count}];\n  float {arr}[{count}];\n  memcpy({arr}_h, &{src}, {});\n  \
                 for (int i = 0; i < {count}; i++) {arr}[i] = {conv};",
                count * 2
            )
        }
    }

    /// The statement storing row `i` of f32 accumulators `acc` into `dv`, D's elements in the
    /// accumulator dtype of `w`.
    fn store_row(&self, w: &Wmma, p: &mut Prelude) -> String {
        let n = w.n as usize;
        if w.acc == Scalar::F32 {
            format!("    memcpy(dv + i * {n}, &acc, {});", n * 4)
        } else {
            let lane = if n > 1 { "acc[j]" } else { "acc" };
            let conv = self.from_f32(lane, w.acc, p);
            format!("    for (int j = 0; j < {n}; j++) dv[i * {n} + j] = {conv};")
        }
    }

    /// The body of `w` on the target's matrix instructions, where it has one, with the
    /// preprocessor condition it needs and what the helper's comment says of how it rounds.
    /// `ct` is C's (and D's) type.
    ///
    /// - bf16 inputs, N = 16, even K: AVX512-BF16's `vdpbf16ps`. Each pair of B's rows is
    ///   interleaved once (`b[k][n], b[k+1][n]` per 32-bit lane), each pair of A's elements
    ///   broadcast as one 32-bit lane; a row of D is 16 f32 accumulators taking K/2 of them.
    /// - f16 → f16, N of 8, 16 or 32 (one xmm, ymm or zmm of f16): AVX512-FP16's
    ///   `vfmadd231ph`, a row of D being N f16 accumulators taking one fused multiply-add per k.
    fn native_wmma(&self, w: &Wmma, ct: &str, p: &mut Prelude) -> Option<NativeWmma> {
        let (m, n, k) = (w.m as usize, w.n as usize, w.k as usize);
        match (w.input, w.acc, n, k % 2) {
            (Scalar::BF16, _, 16, 0) => {
                let row = self.vector_type(Scalar::F32, 16, p);
                let pairs = self.vector_type(Scalar::U16, 32, p);
                let pair = self.vector_type(Scalar::U32, 16, p);
                let interleave: Vec<String> = (0..16).flat_map(|i| [i.to_string(), (i + 16).to_string()]).collect();
                let (dv_ty, dv_size) = if w.acc == Scalar::F32 { ("float", 4) } else { ("uint16_t", 2) };
                let body = format!(
                    "  uint16_t ah[{mk}], bh[{kn}];\n  memcpy(ah, &a, {mk2});\n  memcpy(bh, &b, {kn2});\n{cv}\n  \
                     {pairs} bp[{half}];\n  for (int j = 0; j < {half}; j++) {{\n    {pairs} rows;\n    \
                     memcpy(&rows, bh + j * 32, 64);\n    bp[j] = __builtin_shufflevector(rows, rows, {idx});\n  }}\n  \
                     {dv_ty} dv[{mn}];\n  for (int i = 0; i < {m}; i++) {{\n    {row} acc;\n    memcpy(&acc, cv + i * 16, 64);\n    \
                     for (int j = 0; j < {half}; j++) {{\n      uint32_t a2;\n      memcpy(&a2, ah + i * {k} + 2 * j, 4);\n      \
                     {pair} ap = ({pair}){{0}} + a2;\n      \
                     __asm__(\"vdpbf16ps %2, %1, %0\" : \"+v\"(acc) : \"v\"(ap), \"v\"(bp[j]));\n    }}\n{store}\n  }}\n  \
                     {ct} d;\n  memcpy(&d, dv, {dbytes});\n  return d;\n",
                    mk = m * k,
                    kn = k * n,
                    mk2 = m * k * 2,
                    kn2 = k * n * 2,
                    cv = self.fragment_as_f32("cv", "c", m * n, w.acc, p),
                    half = k / 2,
                    idx = interleave.join(", "),
                    mn = m * n,
                    store = self.store_row(w, p),
                    dbytes = m * n * dv_size,
                );
                Some(NativeWmma {
                    guard: AVX512_BF16_GUARD,
                    note: "; where the target has AVX512-BF16, vdpbf16ps adds k in pairs (odd k first), reads \
                           denormal inputs as zero and flushes denormal sums to zero",
                    body,
                })
            }
            (Scalar::F16, Scalar::F16, 8 | 16 | 32, _) => {
                let row = self.vector_type(Scalar::U16, n as u8, p);
                let body = format!(
                    "  uint16_t ah[{mk}], bh[{kn}], dh[{mn}];\n  memcpy(ah, &a, {mk2});\n  memcpy(bh, &b, {kn2});\n  \
                     memcpy(dh, &c, {mn2});\n  for (int i = 0; i < {m}; i++) {{\n    {row} acc;\n    \
                     memcpy(&acc, dh + i * {n}, {n2});\n    for (int j = 0; j < {k}; j++) {{\n      {row} bk;\n      \
                     memcpy(&bk, bh + j * {n}, {n2});\n      {row} ak = ({row}){{0}} + ah[i * {k} + j];\n      \
                     __asm__(\"vfmadd231ph %2, %1, %0\" : \"+v\"(acc) : \"v\"(ak), \"v\"(bk));\n    }}\n    \
                     memcpy(dh + i * {n}, &acc, {n2});\n  }}\n  {ct} d;\n  memcpy(&d, dh, {mn2});\n  return d;\n",
                    mk = m * k,
                    kn = k * n,
                    mn = m * n,
                    mk2 = m * k * 2,
                    kn2 = k * n * 2,
                    mn2 = m * n * 2,
                    n2 = n * 2,
                );
                Some(NativeWmma {
                    guard: AVX512_FP16_GUARD,
                    note: "; where the target has AVX512-FP16, the multiply-adds are vfmadd231ph in f16, each k \
                           rounded to f16",
                    body,
                })
            }
            _ => None,
        }
    }
}

/// What kernels use of `<stdbool.h>`, `<stdint.h>`, `<string.h>` and `<math.h>`, declared
/// here instead of included: parsing those headers costs more than compiling a small kernel
/// (see [`crate::compiler`]). The declarations match glibc's (the integer types come from the
/// compiler's own `__INT*_TYPE__`, as its `<stdint.h>` does), so a header included later
/// redeclares them compatibly. Kernels include no header at all: x86 vector instructions are
/// reached through the compilers' builtins (see `x86_fma`). gcc and clang know these functions as
/// builtins, so the calls are inlined wherever they would be with the headers; the rest are
/// libm calls resolved when the kernel's library is loaded (see [`crate::program`]).
const PRELUDE: &str = "#define bool _Bool
#define true 1
#define false 0
typedef __INT8_TYPE__ int8_t;
typedef __INT16_TYPE__ int16_t;
typedef __INT32_TYPE__ int32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __UINT64_TYPE__ uint64_t;
void *memcpy(void *, const void *, __SIZE_TYPE__);
float sqrtf(float); double sqrt(double);
float expf(float); double exp(double);
float exp2f(float); double exp2(double);
float logf(float); double log(double);
float log2f(float); double log2(double);
float sinf(float); double sin(double);
float cosf(float); double cos(double);
float truncf(float); double trunc(double);
float fabsf(float); double fabs(double);
float powf(float, float); double pow(double, double);
float fmaf(float, float, float); double fma(double, double, double);
";

/// `kiln_f16_to_f32` (exact) and `kiln_f32_to_f16` (round to nearest, ties to even; 65520 and
/// up to infinity; subnormals exact), with a NaN keeping its sign and the top bits of its
/// payload and becoming quiet, in both directions: what F16C's `vcvtph2ps`/`vcvtps2ph` do, so
/// the three spellings give the same bits for every input:
/// - `_Float16` casts where the compiler has the type (it defines `__FLT16_MAX__`: gcc ≥ 12,
///   clang ≥ 15 on x86-64; AArch64) and the target converts in hardware (F16C, or not x86):
///   the compiler vectorizes them. On x86 without F16C they would be libgcc calls.
/// - the F16C builtins (the ones behind `<immintrin.h>`'s `_cvtsh_ss`/`_cvtss_sh`, the same
///   in gcc and clang ≥ 14) where the target has F16C but the compiler lacks `_Float16`
///   (clang 14 on x86-64): one instruction each.
/// - portable bit arithmetic otherwise (x86-64 without F16C, e.g. `KILN_CPU_ISA=sse2`).
///
/// The test `f16_conversions_are_exact_with_every_compiler_and_isa` compares every f16 and
/// the f32 values around every f16 rounding boundary against the `half` crate, for each C
/// compiler on `PATH` at the native and SSE2 instruction sets.
const F16_HELPERS: &str =
    "#if defined(__FLT16_MAX__) && (defined(__F16C__) || !(defined(__x86_64__) || defined(__i386__)))
static inline float kiln_f16_to_f32(uint16_t b) {
  _Float16 h;
  memcpy(&h, &b, 2);
  return (float)h;
}
static inline uint16_t kiln_f32_to_f16(float f) {
  _Float16 h = (_Float16)f;
  uint16_t b;
  memcpy(&b, &h, 2);
  return b;
}
#elif defined(__F16C__)
typedef short kiln_f16c_v8hi __attribute__((vector_size(16)));
typedef float kiln_f16c_v4sf __attribute__((vector_size(16)));
static inline float kiln_f16_to_f32(uint16_t b) {
  return __builtin_ia32_vcvtph2ps((kiln_f16c_v8hi){(short)b})[0];
}
static inline uint16_t kiln_f32_to_f16(float f) {
  return (uint16_t)__builtin_ia32_vcvtps2ph((kiln_f16c_v4sf){f}, 0 /* to nearest even */)[0];
}
#else
static inline float kiln_f16_to_f32(uint16_t b) {
  uint32_t em = b & 0x7fffu, u;
  float f;
  if (em >= 0x7c00u) u = 0x7f800000u | (em << 13) | (em > 0x7c00u ? 0x400000u : 0u); /* inf; NaN made quiet */
  else if (em >= 0x400u) u = (em << 13) + 0x38000000u; /* normal: the exponent rebiased by 127 - 15 */
  else { f = (float)em * 0x1p-24f; memcpy(&u, &f, 4); } /* zero or subnormal: exact */
  u |= (uint32_t)(b & 0x8000u) << 16;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t kiln_f32_to_f16(float f) {
  uint32_t u, a, r;
  memcpy(&u, &f, 4);
  a = u & 0x7fffffffu;
  if (a > 0x7f800000u) r = 0x7e00u | ((a >> 13) & 0x3ffu); /* NaN: quiet, the payload's top bits */
  else if (a >= 0x477ff000u) r = 0x7c00u; /* 65520 and up (the tie above 65504 is odd) */
  else if (a >= 0x38800000u) r = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13; /* normal, to nearest even */
  else { /* below 2^-14: adding 0.5 (whose ulp is 2^-24) rounds to a multiple of 2^-24, to nearest even */
    float t;
    memcpy(&t, &a, 4);
    t += 0.5f;
    memcpy(&r, &t, 4);
    r -= 0x3f000000u;
  }
  return (uint16_t)(((u >> 16) & 0x8000u) | r);
}
#endif
";

/// `kiln_f64_to_f32_odd`: an f64 rounded to f32 by round-to-odd (itself when it is an f32,
/// else whichever of its two f32 neighbours has an odd last bit). Rounding that once more to
/// f16 or bf16 gives the f64 correctly rounded, as `kiln_ir::f16_bits` does for
/// constants; a plain `(float)` first would round twice (a value just above a tie would end
/// on the tie and round to even).
const F64_TO_F32_ODD: &str = "static inline float kiln_f64_to_f32_odd(double d) {
  float f = (float)d;
  if (d != d || (double)f == d) return f;
  uint32_t u;
  memcpy(&u, &f, 4);
  if (fabs((double)f) > fabs(d)) u -= 1u; /* one step toward zero: the bits are sign-magnitude */
  u |= 1u;
  memcpy(&f, &u, 4);
  return f;
}
";

impl Syntax for CpuDialect {
    fn scalar_type(&self, s: Scalar, _p: &mut Prelude) -> String {
        match s {
            Scalar::Bool => "bool",
            Scalar::I8 => "int8_t",
            Scalar::I16 => "int16_t",
            Scalar::I32 => "int32_t",
            Scalar::I64 => "int64_t",
            Scalar::U8 => "uint8_t",
            Scalar::U16 => "uint16_t",
            Scalar::U32 => "uint32_t",
            Scalar::U64 => "uint64_t",
            Scalar::F16 | Scalar::BF16 => "uint16_t",
            Scalar::F32 => "float",
            Scalar::F64 => "double",
        }
        .to_string()
    }

    /// MAX/MIN of f32/f64 as `kiln_max_T`/`kiln_min_T` (`max_min`: the vector forms' rule).
    fn scalar_op(&self, op: Op, s: Scalar, args: &[String], p: &mut Prelude) -> Option<String> {
        match (op, s, args) {
            (Op::Max | Op::Min, Scalar::F32 | Scalar::F64, [a, b]) => {
                Some(format!("{}({a}, {b})", self.max_min(op, s, p)))
            }
            _ => None,
        }
    }
}

impl Dialect for CpuDialect {
    fn identity(&self) -> Option<String> {
        Some(format!("c vector_bytes={}", self.vector_bytes))
    }

    /// Scalar outer-product accumulators (a contraction unrolled over two output axes) become
    /// vector accumulators: see [`kiln_device::kiln_ir::vectorize_outer_products`].
    fn optimize(&self, ast: &std::sync::Arc<kiln_device::kiln_ir::UOp>) -> std::sync::Arc<kiln_device::kiln_ir::UOp> {
        kiln_device::kiln_ir::vectorize_outer_products(ast, self.vector_bytes)
    }

    fn header(&self) -> String {
        PRELUDE.into()
    }

    fn memory_type(&self, s: Scalar, p: &mut Prelude) -> String {
        if s == Scalar::Bool { "uint8_t".into() } else { self.scalar_type(s, p) }
    }

    fn vector_type(&self, s: Scalar, w: u8, p: &mut Prelude) -> String {
        let name = format!("kiln_{}", tag(s, w));
        let elem = self.memory_type(s, p);
        let phys = (w as usize).next_power_of_two();
        let bytes = phys * s.size();
        let def_name = name.clone();
        p.need(&name, move |_| {
            let note = if phys != w as usize { format!(" /* {w} of {phys} lanes used */") } else { String::new() };
            format!("typedef {elem} {def_name} __attribute__((vector_size({bytes})));{note}\n")
        });
        name
    }

    fn lane(&self, v: &str, dtype: DType, lane: u8) -> String {
        if dtype.scalar() == Some(Scalar::Bool) {
            format!("((bool){}[{lane}])", atom(v))
        } else {
            format!("{}[{lane}]", atom(v))
        }
    }

    fn vector_literal(&self, dtype: DType, lanes: &[String], p: &mut Prelude) -> String {
        let ty = match dtype {
            DType::Vector(s, w) => self.vector_type(s, w, p),
            other => self.scalar_type(other.scalar().unwrap_or(Scalar::F32), p),
        };
        format!("(({ty}){{{}}})", lanes.join(", "))
    }

    fn native_vector_op(&self, op: Op, dtype: DType) -> bool {
        dtype.scalar().is_some_and(|s| c_vector_operator(op, s))
    }

    /// f32/f64 vector EXP, EXP2, LOG and LOG2 as the vector math functions (module docs), and
    /// FMA, MAX and MIN as the x86 builtins where the target has them (the compiler does not
    /// turn lane-by-lane `fmaf`/`fmaxf` into vector instructions), with a lane loop as the
    /// portable fallback; no header is needed (see `x86_fma`). MAX/MIN keep `fmax`/`fmin`
    /// NaN semantics, and pick as the scalar ones do (`max_min`).
    ///
    /// Comparisons and WHERE stay lane by lane: gcc 12 vectorizes those lanes into mask
    /// register code (a compare into `k1`, masked moves, the bool bytes stored with `vpmovdb`),
    /// while whole-vector GNU spellings (a comparison narrowed to the bool vector's bytes, then
    /// widened back to a lane mask for a blend by bits) measured 1.3x slower with AVX-512 and
    /// 2x slower on 8-lane AVX2 vectors for a compare-then-WHERE kernel; clang 14 runs both
    /// at the same speed.
    fn vector_alu(&self, op: Op, dtype: DType, args: &[String], p: &mut Prelude) -> Option<String> {
        self.vector_math(op, dtype, args, p)
    }

    fn to_f32(&self, e: &str, s: Scalar, p: &mut Prelude) -> String {
        match s {
            Scalar::F16 => {
                self.f16_helpers(p);
                format!("kiln_f16_to_f32({e})")
            }
            Scalar::BF16 => {
                self.bf16_helpers(p);
                format!("kiln_bf16_to_f32({e})")
            }
            Scalar::F32 => e.to_string(),
            _ => format!("((float){})", atom(e)),
        }
    }

    fn from_f32(&self, e: &str, s: Scalar, p: &mut Prelude) -> String {
        match s {
            Scalar::F16 => {
                self.f16_helpers(p);
                format!("kiln_f32_to_f16({e})")
            }
            Scalar::BF16 => {
                self.bf16_helpers(p);
                format!("kiln_f32_to_bf16({e})")
            }
            Scalar::F32 => e.to_string(),
            other => format!("(({}){})", self.scalar_type(other, p), atom(e)),
        }
    }

    fn math(&self, f: MathFn, s: Scalar, args: &[String], _p: &mut Prelude) -> String {
        f.c_call(s, args)
    }

    fn cast(&self, e: &str, from: Scalar, to: Scalar, p: &mut Prelude) -> String {
        if from == to {
            return e.to_string();
        }
        let half = |s: Scalar| matches!(s, Scalar::F16 | Scalar::BF16);
        if to == Scalar::Bool {
            let v = if half(from) { self.to_f32(e, from, p) } else { e.to_string() };
            return format!("({} != 0)", atom(&v));
        }
        if half(from) {
            let f = self.to_f32(e, from, p);
            return if to == Scalar::F32 { f } else { self.cast(&f, Scalar::F32, to, p) };
        }
        if half(to) {
            // An f64 is rounded to f32 by round-to-odd, so that rounding it once more to the
            // half type gives the correctly rounded value (one rounding, as the IR says). An
            // integer goes through f32 as the reference's does: exact below 2^24, and the
            // half types overflow or round the same above.
            let f = match from {
                Scalar::F32 => e.to_string(),
                Scalar::F64 => {
                    self.f64_to_f32_odd(p);
                    format!("kiln_f64_to_f32_odd({e})")
                }
                _ => format!("((float){})", atom(e)),
            };
            return self.from_f32(&f, to, p);
        }
        if from.is_float() && (to.is_int()) {
            return self.float_to_int(e, from, to, p);
        }
        format!("(({}){})", self.scalar_type(to, p), atom(e))
    }

    fn bitcast(&self, e: &str, from: DType, to: DType, p: &mut Prelude) -> Result<String> {
        let ty = |d: DType, p: &mut Prelude| match d {
            DType::Vector(s, w) => Ok(self.vector_type(s, w, p)),
            DType::Scalar(s) => Ok(self.scalar_type(s, p)),
            other => Err(Error::Render(format!("BITCAST of a {other}"))),
        };
        let f = ty(from, p)?;
        if to == DType::BOOL {
            // A bool holds only 0/1: any non-zero byte reads as true.
            return Ok(format!("(((union {{ {f} f; uint8_t t; }}){{ .f = {e} }}).t != 0)"));
        }
        let t = ty(to, p)?;
        Ok(format!("(((union {{ {f} f; {t} t; }}){{ .f = {e} }}).t)"))
    }

    fn float_const(&self, v: f64, s: Scalar, _p: &mut Prelude) -> String {
        match s {
            Scalar::BF16 => format!("((uint16_t)0x{:04x})", bf16_bits(v)),
            Scalar::F16 => format!("((uint16_t)0x{:04x})", f16_bits(v)),
            Scalar::F32 | Scalar::F64 if v.is_finite() => c_float_literal(v, s),
            Scalar::F32 | Scalar::F64 if v.is_infinite() => {
                let inf = if s == Scalar::F32 { "__builtin_inff()" } else { "__builtin_inf()" };
                if v < 0.0 { format!("(-{inf})") } else { inf.into() }
            }
            Scalar::F32 => self.float_from_bits(u64::from((v as f32).to_bits()), s), // NaN: the only case left
            _ => self.float_from_bits(v.to_bits(), Scalar::F64),
        }
    }

    fn signature(&self, name: &str, _params: &[KernelParam], _vars: &[KernelVar], _p: &mut Prelude) -> String {
        format!("void {name}(void **bufs, const int64_t *vals, int64_t kiln_core, int64_t kiln_ncores) {{")
    }

    fn prologue(&self, params: &[KernelParam], vars: &[KernelVar], p: &mut Prelude) -> Vec<String> {
        let mut lines = Vec::new();
        for (i, kp) in params.iter().enumerate() {
            let t = self.memory_type(kp.scalar, p);
            lines.push(format!("{t} *{} = ({t} *)bufs[{i}];", kp.name));
        }
        for v in vars {
            let t = match v.dtype {
                DType::Scalar(s) => self.scalar_type(s, p),
                _ => "int64_t".into(),
            };
            lines.push(format!("const {t} {} = ({t})vals[{}];", v.name, v.position));
        }
        lines
    }

    fn open_launch(&self, indices: &[LaunchIndex], p: &mut Prelude) -> Result<Vec<String>> {
        let mut order: Vec<&LaunchIndex> = indices.iter().collect();
        order.sort_by_key(|ix| (ix.kind == 'l', ix.axis));
        let mut lines = Vec::new();
        let chunked = order.first().filter(|ix| ix.kind != 'l' && ix.axis == 0);
        if chunked.is_none() {
            lines.push("if (kiln_core != 0) return; /* no global axis 0: one chunk does everything */".into());
        }
        for ix in &order {
            let t = match ix.dtype {
                DType::Scalar(s) => self.scalar_type(s, p),
                _ => "int64_t".into(),
            };
            let n = &ix.name;
            if chunked.is_some_and(|c| std::ptr::eq(*c, *ix)) {
                lines.push(format!("/* {n}: this call runs chunk kiln_core of kiln_ncores of 0..{} */", ix.extent));
                lines.push(format!("const int64_t kiln_n = {};", ix.extent));
                lines.push("const int64_t kiln_q = kiln_n / kiln_ncores, kiln_r = kiln_n % kiln_ncores;".into());
                lines.push(
                    "const int64_t kiln_lo = kiln_core * kiln_q + (kiln_core < kiln_r ? kiln_core : kiln_r);".into(),
                );
                lines.push("const int64_t kiln_hi = kiln_lo + kiln_q + (kiln_core < kiln_r);".into());
                lines.push(format!("for ({t} {n} = ({t})kiln_lo; {n} < kiln_hi; {n}++) {{"));
            } else {
                lines.push(format!("for ({t} {n} = 0; {n} < {}; {n}++) {{", ix.extent));
            }
        }
        Ok(lines)
    }

    fn load(&self, addr: &Address, dtype: DType, p: &mut Prelude) -> String {
        match dtype {
            DType::Vector(s, w) => {
                let vt = self.vector_type(s, w, p);
                let mt = self.memory_type(s, p);
                let name = format!("kiln_ld_{}", tag(s, w));
                let def = name.clone();
                let bytes = w as usize * s.size();
                let padded = (w as usize).next_power_of_two() != w as usize;
                p.need(&name, move |_| {
                    let init = if padded { " = {0}" } else { "" };
                    format!(
                        "static inline {vt} {def}(const {mt} *p) {{\n  {vt} v{init};\n  memcpy(&v, p, {bytes});\n  return v;\n}}\n"
                    )
                });
                format!("{name}({})", addr.pointer())
            }
            DType::Scalar(Scalar::Bool) => format!("({}[{}] != 0)", addr.base, addr.index),
            _ => format!("{}[{}]", addr.base, addr.index),
        }
    }

    fn store(&self, addr: &Address, value: &str, dtype: DType, p: &mut Prelude) -> String {
        match dtype {
            DType::Vector(s, w) => {
                let vt = self.vector_type(s, w, p);
                let mt = self.memory_type(s, p);
                let name = format!("kiln_st_{}", tag(s, w));
                let def = name.clone();
                let bytes = w as usize * s.size();
                p.need(&name, move |_| {
                    format!("static inline void {def}({mt} *p, {vt} v) {{\n  memcpy(p, &v, {bytes});\n}}\n")
                });
                format!("{name}({}, {value})", addr.pointer())
            }
            _ => format!("{}[{}] = {value}", addr.base, addr.index),
        }
    }

    /// On x86, `kiln_stnt_T`: a non-temporal store (`movntdq`/`vmovntdq` of 16/32/64 bytes,
    /// `movnti` of a 4- or 8-byte scalar) where the address is aligned for it, else the plain
    /// store, so any element-aligned address stays valid (views may start anywhere). A
    /// vector wider than the target's registers goes in register-sized parts. Everything
    /// else, and every other ISA, stores plainly. Inline assembly, not intrinsics: no
    /// header and no compiler-version-specific builtin is needed.
    fn store_nontemporal(&self, addr: &Address, value: &str, dtype: DType, p: &mut Prelude) -> String {
        let Some(s) = dtype.scalar() else { return self.store(addr, value, dtype, p) };
        let w = dtype.width();
        let bytes = w as usize * s.size();
        let vector = w > 1 && (w as usize).is_power_of_two() && matches!(bytes, 16 | 32 | 64);
        let scalar = w == 1 && s != Scalar::Bool && matches!(bytes, 4 | 8);
        if !vector && !scalar {
            return self.store(addr, value, dtype, p);
        }
        let vt = if vector { self.vector_type(s, w, p) } else { self.scalar_type(s, p) };
        let mt = self.memory_type(s, p);
        let name = format!("kiln_stnt_{}", tag(s, w));
        let def = name.clone();
        p.need(KILN_SFENCE, |_| SFENCE_DEF.to_string());
        p.need(&name, move |_| {
            let body = if vector { nt_vector_body(bytes) } else { nt_scalar_body(bytes) };
            format!(
                "/* A non-temporal store of {bytes} bytes where p is aligned for it, else a plain one. */\n\
                 static inline void {def}({mt} *p, {vt} v) {{\n{body}  __builtin_memcpy(p, &v, {bytes});\n}}\n"
            )
        });
        format!("{name}({}, {value})", addr.pointer())
    }

    /// Non-temporal stores are weakly ordered: a store fence at the end of every call makes
    /// them visible before the call returns, so the pool's (and the queue's) completion
    /// signal publishes them like every other store.
    fn kernel_end(&self, p: &mut Prelude) -> Vec<String> {
        if p.contains(KILN_SFENCE) {
            vec![format!("{KILN_SFENCE}(); /* publish the non-temporal stores */")]
        } else {
            Vec::new()
        }
    }

    /// The one-thread form only (see [`CpuDialect::wmma_helper`]); a warp form has no
    /// meaning on the CPU, whose work items share no registers.
    fn wmma(&self, w: &Wmma, args: &[String; 3], p: &mut Prelude) -> Result<String> {
        if w.threads != 1 {
            return Err(unsupported_wmma(
                w,
                "the CPU renders the one-thread form (threads 1); the 32-thread warp forms are CUDA's",
            ));
        }
        let name = self.wmma_helper(w, p);
        Ok(format!("{name}({}, {}, {})", args[0], args[1], args[2]))
    }

    fn local_memory(&self, _name: &str, _s: Scalar, _len: usize, _p: &mut Prelude) -> Result<Option<String>> {
        Err(no_work_groups("work-group local memory (DEFINE_LOCAL)"))
    }

    fn barrier(&self, _p: &mut Prelude) -> Result<String> {
        Err(no_work_groups("a work-group barrier (BARRIER)"))
    }
}

/// The store fence that publishes non-temporal stores (see [`Dialect::kernel_end`]).
const KILN_SFENCE: &str = "kiln_sfence";
const SFENCE_DEF: &str = "static inline void kiln_sfence(void) {\n#if defined(__SSE2__)\n  __asm__ __volatile__(\"sfence\" ::: \"memory\");\n#endif\n}\n";

/// The non-temporal part of `kiln_stnt_T` for a `bytes`-byte vector `v` at `p`: the widest
/// register the target has (zmm with AVX-512F, ymm with AVX, else xmm; VEX-encoded where AVX
/// is on, to avoid SSE/AVX transitions), in as many parts as `bytes` needs, when `p` is
/// aligned to that register's size; it returns, else falls through to the plain store. The
/// `"=m"` operand names the bytes written, so the compiler orders the store with the
/// kernel's other accesses.
fn nt_vector_body(bytes: usize) -> String {
    let targets =
        [(64, "__AVX512F__", "v", "vmovntdq"), (32, "__AVX__", "x", "vmovntdq"), (16, "__AVX__", "x", "vmovntdq")];
    let mut out = String::new();
    let mut guards = Vec::new();
    for (reg, guard, constraint, insn) in targets.into_iter().chain([(16, "__SSE2__", "x", "movntdq")]) {
        if reg > bytes || guards.contains(&guard) {
            continue;
        }
        let part = |off: usize| {
            format!(
                "    __builtin_memcpy(&r, (const char *)&v + {off}, {reg});\n    \
                 __asm__ __volatile__(\"{insn} %1, %0\" : \"=m\"(*(char (*)[{reg}])((char *)p + {off})) : \"{constraint}\"(r));\n"
            )
        };
        let parts: String = (0..bytes).step_by(reg).map(part).collect();
        let _ = write!(
            out,
            "#{} defined({guard})\n  if (((__UINTPTR_TYPE__)p & {}) == 0) {{\n    \
             long long r __attribute__((vector_size({reg})));\n{parts}    return;\n  }}\n",
            if guards.is_empty() { "if" } else { "elif" },
            reg - 1
        );
        guards.push(guard);
    }
    out.push_str("#endif\n");
    out
}

/// The non-temporal part of `kiln_stnt_T` for a 4- or 8-byte scalar: `movnti` from a general
/// register where `p` is naturally aligned.
fn nt_scalar_body(bytes: usize) -> String {
    let it = if bytes == 8 { "long long" } else { "int" };
    format!(
        "#if defined(__SSE2__)\n  if (((__UINTPTR_TYPE__)p & {}) == 0) {{\n    {it} r;\n    __builtin_memcpy(&r, &v, {bytes});\n    \
         __asm__ __volatile__(\"movnti %1, %0\" : \"=m\"(*(char (*)[{bytes}])p) : \"r\"(r));\n    return;\n  }}\n#endif\n",
        bytes - 1
    )
}

/// The refusal of a work-group construct (see the module docs).
pub(crate) fn no_work_groups(what: &str) -> Error {
    Error::Render(format!(
        "the CPU backend does not run kernels with {what}: it has no work groups; \
         run this kernel on OpenCL (e.g. `--device OPENCL:0`), which does"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_device::Renderer;
    use kiln_device::kiln_ir::KernelBuilder;

    /// A kernel that runs `forms` one after another on fragments loaded from slots 0..3.
    fn wmma_kernel(forms: &[Wmma]) -> std::sync::Arc<kiln_device::kiln_ir::UOp> {
        let mut k = KernelBuilder::new();
        let zero = kiln_device::kiln_ir::Val::int(0);
        for (i, w) in forms.iter().enumerate() {
            let [a, b, c] = w.operand_dtypes();
            let slot = 4 * i;
            let load = |k: &mut KernelBuilder, s: usize, dt: DType| {
                let p = k.param(s, dt.scalar().unwrap_or(Scalar::F32), 64);
                p.at_vec(&zero, dt.width()).load()
            };
            let (va, vb, vc) = (load(&mut k, slot, a), load(&mut k, slot + 1, b), load(&mut k, slot + 2, c));
            let d = va.wmma(&vb, &va.wmma(&vb, &vc, *w), *w);
            let out = k.param(slot + 3, w.acc, 64);
            k.store(&out.at_vec(&zero, c.width()), &d);
        }
        k.finish().unwrap()
    }

    #[test]
    fn wmma_is_one_helper_per_form_with_vector_fma_rows() {
        let f32_tile = Wmma::single(4, 16, 4, Scalar::F32, Scalar::F32);
        let f16_tile = Wmma::single(2, 8, 1, Scalar::F16, Scalar::F16);
        let src = cpu_renderer_for(64).render(&wmma_kernel(&[f32_tile, f16_tile]), Some("k")).unwrap().src;
        for helper in ["kiln_wmma_m4n16k4_f32_f32(", "kiln_wmma_m2n8k1_f16_f16("] {
            assert_eq!(
                src.matches(&format!("static inline kiln_f32x64 {helper}")).count()
                    + src.matches(&format!("static inline kiln_f16x16 {helper}")).count(),
                1,
                "{helper}:\n{src}"
            );
            assert_eq!(src.matches(helper).count(), 3, "one definition and two calls of {helper}:\n{src}");
        }
        // Rows of 16 f32 lanes take the target's vector FMA; f16 goes through f32 and back.
        assert!(src.contains("acc = kiln_fma_f32x16(((kiln_f32x16){0} + av[i * 4 + j]), bk, acc);"), "{src}");
        assert!(src.contains("kiln_f16_to_f32(av_h[i])") && src.contains("kiln_f32_to_f16(acc[j])"), "{src}");
    }

    #[test]
    fn warp_forms_are_refused_with_a_render_error() {
        for w in Wmma::warp_shapes() {
            match cpu_renderer().render(&wmma_kernel(&[w]), Some("k")) {
                Err(Error::Render(m)) => assert!(m.contains("unsupported op WMMA") && m.contains("CUDA"), "{m}"),
                other => panic!("{w}: {:?}", other.map(|s| s.src)),
            }
        }
        let forms = cpu_wmma_forms(32);
        assert_eq!(forms.len(), 5);
        assert!(forms.iter().all(|w| (w.m, w.n, w.k, w.threads) == (4, 8, 4, 1) && w.check().is_none()));
    }
}
