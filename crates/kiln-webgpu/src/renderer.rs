//! kiln IR → WGSL.
//!
//! One walk over the kernel's linear order, as kiln-cstyle's emitter walks it, writing WGSL
//! instead of C (WGSL has no ternary, no casts by parenthesis, no pointers to elements and no
//! narrow integers, so the C core does not fit it).
//!
//! # The shader's interface
//! - `@group(0) @binding(0)`: a uniform block of `u32` words, [`ARGS`] long at most: the
//!   work-group counts of kiln's launch (3 words), each buffer parameter's element offset
//!   (its view's start) and each variable's value (bit-cast `i32`), in that order.
//! - `@binding(1 + slot)`: buffer parameter `slot`, bound whole (`array<T>`); every access adds
//!   the parameter's offset. Bounds come from kiln's proof, not from WGSL's robust access.
//! - Launch: WebGPU caps each dispatch axis at 65,535 work groups. The runtime dispatches
//!   kiln's `G0·G1·G2` groups as a 2-D grid ([`grid`]) and the shader folds the grid back into
//!   kiln's three group indices, so the kernel never sees the fold.
//!
//! # Types
//! Registers: `bool`, `i32` (i8, i16, i32), `u32` (u8, u16, u32), `f32` (f32 and bf16), and
//! `f16`, `i64`, `u64` where the adapter has them. Narrow integers live in 32-bit registers and
//! are wrapped back into their range after every operation that can leave it; bf16 results are
//! rounded to bf16 (ties to even) after every operation. In buffers, 8- and 16-bit integers,
//! bf16 and bools are packed into `atomic<u32>` words (stores are an atomic AND then OR of the
//! element's bits, so neighbours written by other items are kept), as tinygrad's WGSL renderer
//! packs them. Vectors are `array<T, N>` values, computed lane by lane. f64 has no WGSL type:
//! rendering a kernel that uses it is [`Error::Render`] naming the dtype, as is i64/u64 or f16
//! on an adapter without the feature.
//!
//! # Loops
//! A RANGE is a `for` loop over `0..extent`. For an adapter with a loop budget (Mesa's
//! llvmpipe cuts a work item's loops short after 65,535 passes in all: [`crate::loops`]), an
//! innermost loop whose declared bounds need more is unrolled: each pass runs `k` copies of
//! the body, copy `j` in a block of its own with the index `base + j`, leaving the loop when
//! the index reaches the extent.
//!
//! # Semantics kiln fixes and WGSL does not
//! Integer division by zero (`x / 0 == 0`, `x % 0 == x`), float → integer casts (saturating,
//! NaN → 0), `fmax`/`fmin` with a NaN operand, and shift amounts (modulo the width) are
//! rendered explicitly; MULACC on floats is `fma`.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

use kiln_cstyle::{acc_of, extent_closure, kernel_name, wrap_int};
use kiln_device::{Error, ProgramSpec, Renderer, Result, special_axis};
use kiln_ir::{AddrSpace, Arg, ContentHash, DType, DeviceSpec, Op, Scalar, UOp, linearize, validate};

use crate::loops::LoopPlan;

/// Words in the uniform argument block: group counts, then offsets, then variables.
pub const ARGS: usize = 256;
/// The work-group size of kernels launched with direct indices (`idxN`), on axis 0.
pub const DIRECT_GROUP: u32 = 64;
/// WebGPU's limit on work groups per dispatch axis.
pub const MAX_GROUPS_PER_AXIS: u32 = 65_535;

/// What the adapter offers that the WGSL depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caps {
    /// `SHADER_F16`: `f16` values and storage.
    pub f16: bool,
    /// `SHADER_INT64`: `i64`/`u64` values and storage.
    pub int64: bool,
}

/// Renders kiln kernels to WGSL for one device.
pub struct WgslRenderer {
    device: DeviceSpec,
    caps: Caps,
    loop_budget: Option<u64>,
}

impl WgslRenderer {
    pub fn new(device: DeviceSpec, caps: Caps) -> WgslRenderer {
        WgslRenderer { device, caps, loop_budget: None }
    }

    /// A renderer for an adapter that cuts a work item's loops short after `budget` passes
    /// (Mesa's llvmpipe: [`crate::loops`]): long innermost loops are unrolled to fit it.
    pub fn with_loop_budget(mut self, budget: Option<u64>) -> WgslRenderer {
        self.loop_budget = budget;
        self
    }

    pub fn caps(&self) -> Caps {
        self.caps
    }
}

impl Renderer for WgslRenderer {
    fn render(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        if ast.op() != Op::Sink {
            return Err(Error::Render(format!("a kernel is rooted at SINK, got {}", ast.op())));
        }
        validate(ast)?;
        let name = kernel_name(name, ast);
        let mut spec = ProgramSpec::from_sink(&name, String::new(), self.device.clone(), ast)?;
        let linear = linearize(ast)?;
        let plan = LoopPlan::new(&linear, self.loop_budget);
        spec.src = Emitter::new(self.caps, plan).run(&spec, &linear)?;
        Ok(spec)
    }

    fn device(&self) -> &DeviceSpec {
        &self.device
    }
}

/// The names of the pipeline-overridable work-group size of a kernel whose local extents
/// are not constants (they are set per launch, one pipeline per size).
pub const WORK_GROUP_OVERRIDES: [&str; 3] = ["kiln_wg0", "kiln_wg1", "kiln_wg2"];

/// The work-group size a kernel is compiled with: its constant local extents,
/// [`DIRECT_GROUP`] items on axis 0 for a kernel with direct indices, or `None` when a local
/// extent depends on the variables (each launch sets it through [`WORK_GROUP_OVERRIDES`]).
pub fn work_group_size(spec: &ProgramSpec) -> Result<Option<[u32; 3]>> {
    let Some(local) = &spec.local_size else { return Ok(Some([DIRECT_GROUP, 1, 1])) };
    let mut out = [1u32; 3];
    for (axis, e) in local.iter().enumerate() {
        let Some(v) = e.arg_int().filter(|_| e.op() == Op::Const) else { return Ok(None) };
        out[axis] = u32::try_from(v).ok().filter(|v| *v >= 1).ok_or_else(|| {
            Error::Render(format!("the work-group size on axis {axis} is {v}; it must be in 1..=2^32-1"))
        })?;
    }
    Ok(Some(out))
}

/// Kiln's work-group counts for a launch of `global` (items for direct indices, groups
/// otherwise) with work groups of `group`.
pub fn group_counts(direct: bool, global: [usize; 3], group: [u32; 3]) -> [u64; 3] {
    std::array::from_fn(|k| if direct { (global[k] as u64).div_ceil(group[k] as u64) } else { global[k] as u64 })
}

/// The dispatch grid for `groups` kiln work groups: `G0·G1·G2` groups laid out row by row in
/// at most [`MAX_GROUPS_PER_AXIS`] columns and as many rows; `None` when they do not fit. (A
/// third axis is never used: the shader folds the grid back in `u32`, and the linear index of
/// a dispatched group past 2^32 would wrap onto a group that already ran.)
pub fn grid(groups: [u64; 3]) -> Option<[u32; 3]> {
    let total = groups.iter().try_fold(1u64, |a, g| a.checked_mul(*g))?;
    let cap = MAX_GROUPS_PER_AXIS as u64;
    let rows = total.div_ceil(cap);
    (rows <= cap).then_some([total.min(cap) as u32, rows as u32, rows.div_ceil(cap) as u32])
}

/// The register type of scalar `s`.
fn reg(s: Scalar, caps: Caps) -> Result<&'static str> {
    Ok(match s {
        Scalar::Bool => "bool",
        Scalar::I8 | Scalar::I16 | Scalar::I32 => "i32",
        Scalar::U8 | Scalar::U16 | Scalar::U32 => "u32",
        Scalar::F32 | Scalar::BF16 => "f32",
        Scalar::F16 if caps.f16 => "f16",
        Scalar::I64 if caps.int64 => "i64",
        Scalar::U64 if caps.int64 => "u64",
        Scalar::F16 | Scalar::I64 | Scalar::U64 => {
            return Err(Error::Render(format!(
                "dtype {} needs the adapter feature {}, which this WebGPU adapter lacks",
                s.name(),
                if s == Scalar::F16 { "SHADER_F16" } else { "SHADER_INT64" }
            )));
        }
        Scalar::F64 => return Err(Error::Render("dtype f64: WGSL has no 64-bit float type".into())),
    })
}

/// Whether buffers of `s` are packed into `atomic<u32>` words.
fn packed(s: Scalar) -> bool {
    s.size() < 4 && s != Scalar::F16
}

/// `e` (a register of `s`) brought back into the range of `s` (narrow integers only).
fn wrap(e: &str, s: Scalar) -> String {
    match s {
        Scalar::I8 => format!("(bitcast<i32>(bitcast<u32>({e}) << 24u) >> 24u)"),
        Scalar::I16 => format!("(bitcast<i32>(bitcast<u32>({e}) << 16u) >> 16u)"),
        Scalar::U8 => format!("({e} & 0xffu)"),
        Scalar::U16 => format!("({e} & 0xffffu)"),
        _ => e.to_string(),
    }
}

/// An integer constant `v` in the register type of integer scalar `s` (narrow integers are
/// 32-bit registers, so `v` need not fit `s` itself).
fn reg_int_lit(v: i64, s: Scalar) -> String {
    let r = match s {
        Scalar::I8 | Scalar::I16 => Scalar::I32,
        Scalar::U8 | Scalar::U16 => Scalar::U32,
        other => other,
    };
    int_lit(v, r)
}

/// An integer constant of scalar `s` (already wrapped into its range).
fn int_lit(v: i64, s: Scalar) -> String {
    let v = wrap_int(v, s);
    match s {
        Scalar::Bool => (v != 0).to_string(),
        Scalar::I8 | Scalar::I16 | Scalar::I32 if v == i32::MIN as i64 => "i32(-2147483648)".into(),
        Scalar::I8 | Scalar::I16 | Scalar::I32 => format!("{v}i"),
        Scalar::U8 | Scalar::U16 | Scalar::U32 => format!("{}u", v as u32),
        Scalar::I64 if v == i64::MIN => "i64(-9223372036854775807li - 1li)".into(),
        Scalar::I64 => format!("{v}li"),
        Scalar::U64 => format!("{}lu", v as u64),
        Scalar::F16 | Scalar::BF16 => float_lit(v as f64, s),
        _ => float_lit(v as f64, Scalar::F32),
    }
}

/// A float constant of `s` (f32, f16, or bf16 in an f32 register), rounded to `s`;
/// non-finite values through their f32 bits.
fn float_lit(v: f64, s: Scalar) -> String {
    let f = match s {
        Scalar::F16 => half::f16::from_f64(v).to_f32(),
        Scalar::BF16 => half::bf16::from_f64(v).to_f32(),
        _ => v as f32,
    };
    let lit = if f.is_finite() { format!("{f:?}f") } else { format!("bitcast<f32>({}u)", f.to_bits()) };
    if s == Scalar::F16 { format!("f16({lit})") } else { lit }
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

/// The value of an integer CONST (wrapped into its dtype).
fn const_int(n: &UOp) -> Option<i64> {
    match (n.op(), n.dtype().scalar(), n.arg_int()) {
        (Op::Const, Some(s), Some(v)) if s.is_int() => Some(wrap_int(v, s)),
        _ => None,
    }
}

/// A value: an expression, or the address of buffer or local elements.
#[derive(Clone, Debug)]
enum Value {
    Expr(String),
    Addr(Address),
}

/// Where an element sits: `base` (a buffer or local array), the element index expression
/// (already including the buffer's view offset) and its scalar.
#[derive(Clone, Debug)]
struct Address {
    base: String,
    index: String,
    scalar: Scalar,
    space: AddrSpace,
}

struct Block {
    range: Option<ContentHash>,
    commits: Vec<(String, String)>,
    /// For an unrolled loop: how its body is repeated when the loop closes.
    unrolled: Option<Unrolled>,
}

/// An unrolled loop: each pass runs `factor` iterations from `{index}_b` (one copy of the
/// body each, the body's lines starting at line `start`).
struct Unrolled {
    start: usize,
    index: String,
    ty: String,
    extent: String,
    factor: u32,
    scalar: Scalar,
}

#[derive(Clone)]
struct Carry {
    name: String,
    value: ContentHash,
    dtype: DType,
}

struct Emitter {
    caps: Caps,
    plan: LoopPlan,
    values: HashMap<ContentHash, Value>,
    lines: Vec<String>,
    module: Vec<String>,
    indent: usize,
    blocks: Vec<Block>,
    counter: usize,
    carries: HashMap<ContentHash, Vec<Carry>>,
    offsets: HashMap<usize, String>,
    helpers: HashSet<&'static str>,
}

fn render_err(node: &UOp, msg: impl std::fmt::Display) -> Error {
    Error::Render(format!("{} {}: {msg}", node.op(), node.dtype()))
}

/// The uniform word `k` of the argument block.
fn arg_word(k: usize) -> String {
    format!("kiln_args[{}][{}]", k / 4, k % 4)
}

impl Emitter {
    fn new(caps: Caps, plan: LoopPlan) -> Emitter {
        Emitter {
            caps,
            plan,
            values: HashMap::new(),
            lines: Vec::new(),
            module: Vec::new(),
            indent: 1,
            blocks: vec![Block { range: None, commits: Vec::new(), unrolled: None }],
            counter: 0,
            carries: HashMap::new(),
            offsets: HashMap::new(),
            helpers: HashSet::new(),
        }
    }

    fn run(mut self, spec: &ProgramSpec, linear: &[Arc<UOp>]) -> Result<String> {
        let words = 3 + spec.params.len() + spec.vars.len();
        if words > ARGS {
            return Err(Error::Render(format!(
                "{} buffers and {} variables need {words} argument words; the WebGPU backend passes at most {ARGS}",
                spec.params.len(),
                spec.vars.len()
            )));
        }
        for n in linear {
            if matches!(n.op(), Op::Program | Op::Device | Op::Linear | Op::Source | Op::Binary) {
                return Err(render_err(n, "compiled-program stages cannot appear inside a kernel"));
            }
            // Every dtype WGSL or the adapter lacks is refused up front, naming it.
            if let Some(s) = n.dtype().scalar() {
                reg(s, self.caps)?;
            }
        }
        let group = work_group_size(spec)?;
        let direct = spec.local_size.is_none();
        let direct_group = group.map_or(DIRECT_GROUP, |g| g[0]);

        // Buffers.
        let mut decls = Vec::new();
        for p in &spec.params {
            let elem = if packed(p.scalar) { "atomic<u32>".to_string() } else { reg(p.scalar, self.caps)?.to_string() };
            decls.push(format!(
                "@group(0) @binding({}) var<storage, read_write> data{}: array<{elem}>;",
                p.slot + 1,
                p.slot
            ));
            self.offsets.insert(p.slot, format!("kiln_off{}", p.slot));
        }
        for n in linear {
            match (n.op(), n.arg()) {
                (Op::Param, Arg::Int(slot)) => {
                    self.values.insert(n.content_hash(), Value::Expr(format!("data{slot}")));
                }
                (Op::DefineVar, Arg::Var { name, .. }) => {
                    let position = spec.var_names.iter().position(|v| v == name).unwrap_or(0);
                    self.values.insert(n.content_hash(), Value::Expr(format!("kiln_var{position}")));
                }
                _ => {}
            }
        }

        // Carried END values are declared before their loop.
        for n in linear {
            if n.op() == Op::End && n.dtype() != DType::Void && acc_of(n).is_none() {
                let name = self.fresh("end");
                self.carries.entry(n.src()[0].content_hash()).or_default().push(Carry {
                    name: name.clone(),
                    value: n.src()[1].content_hash(),
                    dtype: n.dtype(),
                });
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
        }

        // The fold of the dispatch grid into kiln's group indices.
        self.line("let kiln_lin = wid.x + nwg.x * (wid.y + nwg.y * wid.z);".into());
        self.line(format!("if (kiln_lin >= {} * {} * {}) {{ return; }}", arg_word(0), arg_word(1), arg_word(2)));
        // Divisions only where kiln's launch has groups on axes 1 and 2 (a division per item
        // costs more than the add it launches on a software device).
        self.line("var kiln_g0 = kiln_lin;".into());
        self.line("var kiln_g1 = 0u;".into());
        self.line("var kiln_g2 = 0u;".into());
        self.line(format!("if ({} * {} != 1u) {{", arg_word(1), arg_word(2)));
        self.line(format!("  kiln_g0 = kiln_lin % {};", arg_word(0)));
        self.line(format!("  kiln_g1 = (kiln_lin / {}) % {};", arg_word(0), arg_word(1)));
        self.line(format!("  kiln_g2 = kiln_lin / ({} * {});", arg_word(0), arg_word(1)));
        self.line("}".into());
        for (k, p) in spec.params.iter().enumerate() {
            self.line(format!("let kiln_off{} = i32({});", p.slot, arg_word(3 + k)));
        }
        for i in 0..spec.vars.len() {
            self.line(format!("let kiln_var{i} = bitcast<i32>({});", arg_word(3 + spec.params.len() + i)));
        }

        // Launch extents (hoisted) and the launch indices.
        let specials: Vec<&Arc<UOp>> = linear.iter().filter(|n| n.op() == Op::Special).collect();
        let hoisted = extent_closure(&specials)?;
        for n in linear.iter().filter(|n| hoisted.contains(&n.content_hash())) {
            self.node(n)?;
        }
        let mut guards = Vec::new();
        let mut seen = HashSet::new();
        for s in &specials {
            let name = s.arg_name().unwrap_or_default().to_string();
            let (kind, axis) =
                special_axis(&name).ok_or_else(|| render_err(s, format!("unknown launch index `{name}`")))?;
            if !seen.insert(name.clone()) {
                return Err(render_err(s, format!("launch index `{name}` appears twice")));
            }
            let xyz = ["x", "y", "z"][axis];
            let v = match kind {
                'l' => format!("i32(lid.{xyz})"),
                'i' => {
                    let extent = self.expr(&s.src()[0])?;
                    guards.push(format!("(kiln_{name} < {extent})"));
                    let size = if axis == 0 { direct_group } else { 1 };
                    format!("i32(kiln_g{axis} * {size}u + lid.{xyz})")
                }
                _ => format!("i32(kiln_g{axis})"),
            };
            let v = if kind == 'i' {
                self.line(format!("let kiln_{name} = {v};"));
                format!("kiln_{name}")
            } else {
                v
            };
            let local = self.fresh("sp");
            self.line(format!("let {local} = {v};"));
            self.values.insert(s.content_hash(), Value::Expr(local));
        }
        if direct && linear.iter().any(|n| matches!(n.op(), Op::DefineLocal | Op::Barrier)) {
            return Err(Error::Render(
                "work-group local memory and barriers need work groups: launch with gidxN/lidxN, not idxN".into(),
            ));
        }
        let guarded = !guards.is_empty();
        if guarded {
            self.line(format!("if ({}) {{", guards.join(" && ")));
            self.indent += 1;
        }
        for n in linear.iter().filter(|n| !hoisted.contains(&n.content_hash())) {
            self.node(n)?;
        }
        if self.blocks.len() != 1 {
            return Err(Error::Render("a loop is still open at the end of the kernel".into()));
        }
        for (acc, value) in std::mem::take(&mut self.blocks[0].commits) {
            self.line(format!("{acc} = {value};"));
        }
        if guarded {
            self.indent -= 1;
            self.line("}".into());
        }

        let mut out = String::new();
        if self.uses(linear, Scalar::F16) {
            out.push_str("enable f16;\n");
        }
        let _ = writeln!(out, "// kiln kernel `{}`", spec.name);
        let _ = writeln!(out, "@group(0) @binding(0) var<uniform> kiln_args: array<vec4<u32>, {}>;", ARGS / 4);
        for d in &decls {
            out.push_str(d);
            out.push('\n');
        }
        for m in &self.module {
            out.push_str(m);
            out.push('\n');
        }
        let mut helpers: Vec<&&str> = self.helpers.iter().collect();
        helpers.sort();
        for h in helpers {
            out.push_str(h);
            out.push('\n');
        }
        let size = match group {
            Some([x, y, z]) => format!("{x}, {y}, {z}"),
            None => {
                for name in WORK_GROUP_OVERRIDES {
                    let _ = writeln!(out, "override {name}: u32 = 1u;");
                }
                WORK_GROUP_OVERRIDES.join(", ")
            }
        };
        let _ = writeln!(
            out,
            "\n@compute @workgroup_size({size})\nfn kiln_main(@builtin(workgroup_id) wid: vec3<u32>, \
             @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{"
        );
        for l in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
        out.push_str("}\n");
        Ok(out)
    }

    fn uses(&self, linear: &[Arc<UOp>], s: Scalar) -> bool {
        linear.iter().any(|n| n.dtype().scalar() == Some(s) || n.src().iter().any(|x| x.dtype().scalar() == Some(s)))
    }

    /// `e` (an f32) rounded to bf16.
    fn round_bf16(&mut self, e: &str) -> String {
        self.helpers.insert(BF16_ROUND);
        format!("kiln_bf16({e})")
    }

    /// `isnan(e)` for a float register of `s`.
    fn isnan(&mut self, e: &str, s: Scalar) -> String {
        self.helpers.insert(ISNAN_F32);
        if s == Scalar::F16 {
            self.helpers.insert(ISNAN_F16);
            format!("kiln_isnan_f16({e})")
        } else {
            self.helpers.insert(ISNAN_F32);
            format!("kiln_isnan_f32({e})")
        }
    }

    fn line(&mut self, text: String) {
        self.lines.push(format!("{}{text}", "  ".repeat(self.indent)));
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}", self.counter)
    }

    fn value(&self, n: &UOp) -> Result<Value> {
        self.values.get(&n.content_hash()).cloned().ok_or_else(|| render_err(n, "used before it is defined"))
    }

    fn expr(&mut self, n: &UOp) -> Result<String> {
        if n.op() == Op::Const {
            return self.constant(n);
        }
        match self.value(n)? {
            Value::Expr(e) => Ok(e),
            Value::Addr(_) => Err(render_err(n, "a pointer used as a value (WGSL has no element pointers)")),
        }
    }

    fn address(&mut self, n: &UOp) -> Result<Address> {
        match self.value(n)? {
            Value::Addr(a) => Ok(a),
            Value::Expr(base) => match n.dtype() {
                DType::Ptr { scalar, space, .. } => {
                    let index = self.base_offset(n);
                    Ok(Address { base, index, scalar, space })
                }
                other => Err(render_err(n, format!("is used as an address but has dtype {other}"))),
            },
        }
    }

    /// The element offset of a buffer parameter's view (`0` for local memory).
    fn base_offset(&self, n: &UOp) -> String {
        let mut node = n;
        while matches!(node.op(), Op::After | Op::Cast) {
            node = &node.src()[0];
        }
        match (node.op(), node.arg_int()) {
            (Op::Param, Some(slot)) => self.offsets.get(&(slot as usize)).cloned().unwrap_or_else(|| "0i".into()),
            _ => "0i".into(),
        }
    }

    fn ty(&self, n: &UOp, dt: DType) -> Result<String> {
        match dt {
            DType::Scalar(s) => Ok(reg(s, self.caps)?.to_string()),
            DType::Vector(s, w) => Ok(format!("array<{}, {w}>", reg(s, self.caps)?)),
            other => Err(render_err(n, format!("has no value type for {other}"))),
        }
    }

    fn declare(&mut self, n: &UOp, prefix: &str, init: String) -> Result<()> {
        let ty = self.ty(n, n.dtype())?;
        let name = self.fresh(prefix);
        self.line(format!("let {name}: {ty} = {init};"));
        self.values.insert(n.content_hash(), Value::Expr(name));
        Ok(())
    }

    fn constant(&mut self, n: &UOp) -> Result<String> {
        let DType::Scalar(s) = n.dtype() else {
            return Err(render_err(n, "constants are scalars (broadcast vectors with VECTORIZE)"));
        };
        reg(s, self.caps)?;
        Ok(match n.arg() {
            Arg::Bool(b) => int_lit(*b as i64, s),
            Arg::Int(v) if s.is_float() => float_lit(*v as f64, s),
            Arg::Int(v) => int_lit(*v, s),
            Arg::Float(v) if s.is_float() => float_lit(*v, s),
            Arg::Float(v) => int_lit(*v as i64, s),
            other => return Err(render_err(n, format!("unsupported constant {other}"))),
        })
    }

    fn node(&mut self, n: &Arc<UOp>) -> Result<()> {
        let src = n.src();
        match n.op() {
            Op::Sink | Op::Param | Op::DefineVar | Op::Special | Op::Const => {}
            Op::Bind => {
                let v = self.value_or_const(&src[1])?;
                self.values.insert(n.content_hash(), v);
            }
            Op::After => {
                let v = self.value_or_const(&src[0])?;
                self.values.insert(n.content_hash(), v);
            }
            Op::Range => {
                let ty = self.ty(n, n.dtype())?;
                let extent = self.expr(&src[0])?;
                let name = self.fresh("ridx");
                for carry in self.carries.get(&n.content_hash()).cloned().unwrap_or_default() {
                    let ty = self.ty(n, carry.dtype)?;
                    let zero = self.zero(n, carry.dtype)?;
                    self.line(format!("var {}: {ty} = {zero};", carry.name));
                }
                let zero = self.zero(n, n.dtype())?;
                let factor = self.plan.unroll(n.content_hash());
                let scalar = n.dtype().scalar().unwrap_or(Scalar::I32);
                let unrolled = if factor > 1 {
                    // Each pass runs `factor` iterations (see `end`); the base index steps by it.
                    let base = format!("{name}_b");
                    let step = reg_int_lit(factor as i64, scalar);
                    self.line(format!("for (var {base}: {ty} = {zero}; {base} < {extent}; {base} += {step}) {{"));
                    Some(Unrolled { start: self.lines.len(), index: name.clone(), ty, extent, factor, scalar })
                } else {
                    self.line(format!("for (var {name}: {ty} = {zero}; {name} < {extent}; {name}++) {{"));
                    None
                };
                self.indent += 1;
                self.blocks.push(Block { range: Some(n.content_hash()), commits: Vec::new(), unrolled });
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
            Op::End | Op::EndIf => self.end(n)?,
            Op::If => {
                let cond = self.expr(&src[0])?;
                self.line(format!("if ({cond}) {{"));
                self.indent += 1;
                self.blocks.push(Block { range: Some(n.content_hash()), commits: Vec::new(), unrolled: None });
            }
            Op::DefineLocal => {
                let (DType::Ptr { scalar, .. }, Some(len)) = (n.dtype(), src[0].arg_int()) else {
                    return Err(render_err(n, "local memory needs a pointer dtype and a constant size"));
                };
                let name = self.fresh("lmem");
                let ty = reg(scalar, self.caps)?;
                self.module.push(format!("var<workgroup> {name}: array<{ty}, {len}>;"));
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
            Op::Barrier => {
                self.line("storageBarrier();".into());
                self.line("workgroupBarrier();".into());
            }
            Op::Index => {
                let base = self.address(&src[0])?;
                let idx = self.expr(&src[1])?;
                // Buffers are indexed in i32 (kiln's index type); an index of another integer
                // type is converted (its value is in range: kiln proved the access).
                let idx = match (src[1].dtype() == DType::INDEX, const_int(&src[1])) {
                    (true, _) => idx,
                    // naga cannot convert a 64-bit constant: the value is converted here.
                    (false, Some(v)) => int_lit(v, Scalar::I32),
                    (false, None) => format!("i32({idx})"),
                };
                let DType::Ptr { scalar, space, .. } = n.dtype() else {
                    return Err(render_err(n, "INDEX must yield a pointer"));
                };
                let index = if base.index == "0i" { idx } else { format!("({} + {idx})", base.index) };
                self.values.insert(n.content_hash(), Value::Addr(Address { base: base.base, index, scalar, space }));
            }
            Op::Load => {
                let addr = self.address(&src[0])?;
                let ty = self.ty(n, n.dtype())?;
                let load = self.load(&addr, n.dtype())?;
                let name = self.fresh("val");
                if src.len() == 3 {
                    let (alt, gate) = (self.expr(&src[1])?, self.expr(&src[2])?);
                    self.line(format!("var {name}: {ty} = {alt};"));
                    self.line(format!("if ({gate}) {{ {name} = {load}; }}"));
                } else {
                    self.line(format!("let {name}: {ty} = {load};"));
                }
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
            Op::Store => {
                let addr = self.address(&src[0])?;
                let value = self.expr(&src[1])?;
                let stmt = self.store(&addr, &value, src[1].dtype())?;
                if src.len() == 3 {
                    let gate = self.expr(&src[2])?;
                    self.line(format!("if ({gate}) {{ {stmt} }}"));
                } else {
                    self.line(stmt);
                }
            }
            Op::DefineAcc => {
                let ty = self.ty(n, n.dtype())?;
                let init = self.expr(&src[0])?;
                let name = self.fresh("acc");
                self.line(format!("var {name}: {ty} = {init};"));
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
            Op::Assign => {
                let acc = self.expr(&src[0])?;
                let value = self.expr(&src[1])?;
                if let Some(block) = self.blocks.last_mut() {
                    block.commits.push((acc, value.clone()));
                }
                self.values.insert(n.content_hash(), Value::Expr(value));
            }
            op if op.is_alu() => {
                let args = src.iter().map(|s| Ok((self.expr(s)?, s.dtype()))).collect::<Result<Vec<_>>>()?;
                let e = self.alu(n, op, &args)?;
                self.declare(n, "alu", e)?;
            }
            Op::Cast if n.dtype().scalar().is_some_and(|s| s.is_int()) && const_int(&src[0]).is_some() => {
                // An integer constant cast to an integer type is wrapped here (naga's constant
                // evaluator does not convert 64-bit integers).
                let (v, to) = (const_int(&src[0]).unwrap_or(0), n.dtype().scalar().unwrap_or(Scalar::I32));
                self.declare(n, "cast", int_lit(v, to))?;
            }
            Op::Cast | Op::Bitcast => {
                let v = self.expr(&src[0])?;
                let bitcast = n.op() == Op::Bitcast;
                let e = match (src[0].dtype(), n.dtype()) {
                    (DType::Scalar(a), DType::Scalar(b)) => self.convert(n, &v, a, b, bitcast)?,
                    (DType::Vector(a, w), DType::Vector(b, w2)) if w == w2 => {
                        let ty = self.ty(n, n.dtype())?;
                        let lanes = (0..w)
                            .map(|i| self.convert(n, &format!("{v}[{i}]"), a, b, bitcast))
                            .collect::<Result<Vec<_>>>()?;
                        format!("{ty}({})", lanes.join(", "))
                    }
                    (a, b) if bitcast => self.repack(n, &v, a, b)?,
                    (a, b) => return Err(render_err(n, format!("cannot convert {a} to {b} in WGSL"))),
                };
                self.declare(n, "cast", e)?;
            }
            Op::Vectorize => {
                let w = n.dtype().width() as usize;
                let lanes: Vec<String> = if src.len() == 1 {
                    vec![self.expr(&src[0])?; w]
                } else {
                    src.iter().map(|s| self.expr(s)).collect::<Result<_>>()?
                };
                let ty = self.ty(n, n.dtype())?;
                self.declare(n, "vec", format!("{ty}({})", lanes.join(", ")))?;
            }
            Op::Gep => {
                let v = self.expr(&src[0])?;
                let lane = n.arg_int().unwrap_or(0);
                self.declare(n, "gep", format!("{v}[{lane}]"))?;
            }
            // WGSL has no matrix-multiply instruction (subgroup matrices are an unratified
            // proposal): the backend declares no WMMA form.
            Op::Wmma => {
                return Err(render_err(
                    n,
                    format!(
                        "unsupported op WMMA {}: WebGPU declares no matrix unit (WGSL has no matrix-multiply \
                         instruction); write the contraction as MULACC loops",
                        n.arg()
                    ),
                ));
            }
            op => return Err(render_err(n, format!("{op} cannot be rendered to WGSL"))),
        }
        Ok(())
    }

    fn value_or_const(&mut self, n: &UOp) -> Result<Value> {
        if n.op() == Op::Const { Ok(Value::Expr(self.constant(n)?)) } else { self.value(n) }
    }

    fn zero(&self, n: &UOp, dt: DType) -> Result<String> {
        match dt {
            DType::Scalar(s) => Ok(int_lit(0, s)),
            DType::Vector(s, w) => {
                let ty = self.ty(n, dt)?;
                Ok(format!("{ty}({})", vec![int_lit(0, s); w as usize].join(", ")))
            }
            other => Err(render_err(n, format!("cannot carry a {other} out of a loop"))),
        }
    }

    /// Element `k` of `addr` (as a register value of its scalar).
    fn load_elem(&mut self, addr: &Address, k: u8) -> String {
        let idx = if k == 0 { addr.index.clone() } else { format!("({} + {k})", addr.index) };
        let s = addr.scalar;
        if addr.space != AddrSpace::Global || !packed(s) {
            return format!("{}[{idx}]", addr.base);
        }
        let bits = s.size() * 8;
        let per = 4 / s.size();
        let mask = if bits == 8 { "0xffu" } else { "0xffffu" };
        let word = format!(
            "((atomicLoad(&{}[u32({idx}) / {per}u]) >> ((u32({idx}) % {per}u) * {bits}u)) & {mask})",
            addr.base
        );
        match s {
            Scalar::Bool => format!("({word} != 0u)"),
            Scalar::I8 | Scalar::I16 => wrap(&format!("bitcast<i32>({word})"), s),
            Scalar::BF16 => format!("bitcast<f32>({word} << 16u)"),
            _ => word,
        }
    }

    fn load(&mut self, addr: &Address, dt: DType) -> Result<String> {
        Ok(match dt {
            DType::Vector(s, w) => {
                let lanes: Vec<String> = (0..w).map(|k| self.load_elem(addr, k)).collect();
                format!("array<{}, {w}>({})", reg(s, self.caps)?, lanes.join(", "))
            }
            _ => self.load_elem(addr, 0),
        })
    }

    fn store_elem(&mut self, addr: &Address, k: u8, value: &str) -> String {
        let idx = if k == 0 { addr.index.clone() } else { format!("({} + {k})", addr.index) };
        let s = addr.scalar;
        if addr.space != AddrSpace::Global || !packed(s) {
            return format!("{}[{idx}] = {value};", addr.base);
        }
        let bits = s.size() * 8;
        let per = 4 / s.size();
        let mask = if bits == 8 { "0xffu" } else { "0xffffu" };
        let v = match s {
            Scalar::Bool => format!("select(0u, 1u, {value})"),
            Scalar::I8 | Scalar::I16 => format!("bitcast<u32>({value})"),
            Scalar::BF16 => format!("(bitcast<u32>({value}) >> 16u)"),
            _ => value.to_string(),
        };
        let (w, sh) = (self.fresh("kw"), self.fresh("ks"));
        format!(
            "{{ let {w} = u32({idx}) / {per}u; let {sh} = (u32({idx}) % {per}u) * {bits}u; \
             atomicAnd(&{b}[{w}], ~({mask} << {sh})); atomicOr(&{b}[{w}], ({v} & {mask}) << {sh}); }}",
            b = addr.base
        )
    }

    fn store(&mut self, addr: &Address, value: &str, dt: DType) -> Result<String> {
        Ok(match dt {
            DType::Vector(_, w) => {
                (0..w).map(|k| self.store_elem(addr, k, &format!("{value}[{k}]"))).collect::<Vec<_>>().join(" ")
            }
            _ => self.store_elem(addr, 0, value),
        })
    }

    fn end(&mut self, n: &Arc<UOp>) -> Result<()> {
        let range = n.src()[0].content_hash();
        if self.blocks.last().is_some_and(|b| b.range == Some(range)) {
            let block = self.blocks.pop().unwrap_or(Block { range: None, commits: Vec::new(), unrolled: None });
            for (acc, value) in block.commits {
                self.line(format!("{acc} = {value};"));
            }
            let carries: Vec<(String, ContentHash)> = self
                .carries
                .get(&range)
                .map(|cs| cs.iter().map(|c| (c.name.clone(), c.value)).collect())
                .unwrap_or_default();
            for (name, value) in carries {
                let v = match self.values.get(&value) {
                    Some(Value::Expr(e)) => e.clone(),
                    _ => return Err(render_err(n, "the value carried out of the loop is not defined in it")),
                };
                self.line(format!("{name} = {v};"));
            }
            if let Some(u) = block.unrolled {
                self.repeat_body(u);
            }
            self.indent -= 1;
            self.line("}".into());
        } else if self.blocks.iter().any(|b| b.range == Some(range)) {
            return Err(render_err(n, "closes a loop while an inner loop is still open"));
        }
        if n.dtype() != DType::Void
            && let Some(acc) = acc_of(n)
        {
            let v = self.value(&acc)?;
            if let Value::Expr(name) = &v {
                let mut pending = Vec::new();
                for block in &mut self.blocks {
                    block.commits.retain(|(a, value)| {
                        let keep = a != name;
                        if !keep {
                            pending.push(value.clone());
                        }
                        keep
                    });
                }
                for value in pending {
                    self.line(format!("{name} = {value};"));
                }
            }
            self.values.insert(n.content_hash(), v);
        }
        Ok(())
    }

    /// Repeats the body of an unrolled loop (its lines since `u.start`, with the loop's
    /// commits and carries) `u.factor` times, iteration `base + k` in copy `k`. Each copy is a
    /// block of its own (its names do not clash) and declares the loop index; a copy past the
    /// extent ends the loop, as does a pass that reached it, before the base could overflow.
    fn repeat_body(&mut self, u: Unrolled) {
        let body = self.lines.split_off(u.start);
        let base = format!("{}_b", u.index);
        for k in 0..u.factor {
            self.line("{".into());
            self.indent += 1;
            if k == 0 {
                self.line(format!("let {}: {} = {base};", u.index, u.ty));
            } else {
                let k = reg_int_lit(k as i64, u.scalar);
                self.line(format!("if ({} - {base} <= {k}) {{ break; }}", u.extent));
                self.line(format!("let {}: {} = {base} + {k};", u.index, u.ty));
            }
            let pad = "  ".repeat(self.indent - 1);
            for l in &body {
                // The body was written one level in; each copy sits one level deeper.
                let text = l.strip_prefix(&pad).unwrap_or(l);
                self.lines.push(format!("{}{text}", "  ".repeat(self.indent)));
            }
            self.indent -= 1;
            self.line("}".into());
        }
        let step = reg_int_lit(u.factor as i64, u.scalar);
        self.line(format!("if ({} - {base} <= {step}) {{ break; }}", u.extent));
    }

    /// A scalar conversion (CAST) or reinterpretation (BITCAST) of register `v` from `a` to `b`.
    fn convert(&mut self, n: &UOp, v: &str, a: Scalar, b: Scalar, bitcast: bool) -> Result<String> {
        let rb = reg(b, self.caps)?;
        let ra = reg(a, self.caps)?;
        if a == b {
            return Ok(v.to_string());
        }
        if bitcast {
            if a.size() != b.size() {
                return Err(render_err(n, format!("bitcast between {} and {} of different sizes", a.name(), b.name())));
            }
            return Ok(match (a, b) {
                // 16-bit floats go through their bits as a u32 (naga's `bitcast` keeps the
                // component count, so a lone f16 cannot be reinterpreted directly).
                _ if a.size() == 2 && (a.is_float() || b.is_float()) => {
                    let bits = match a {
                        Scalar::F16 => {
                            self.helpers.insert(F16_BITS);
                            format!("kiln_f16_bits({v})")
                        }
                        Scalar::BF16 => format!("(bitcast<u32>({v}) >> 16u)"),
                        Scalar::I16 => format!("(bitcast<u32>({v}) & 0xffffu)"),
                        _ => v.to_string(),
                    };
                    match b {
                        Scalar::F16 => {
                            self.helpers.insert(F16_FROM_BITS);
                            format!("kiln_f16_from_bits({bits})")
                        }
                        Scalar::BF16 => format!("bitcast<f32>({bits} << 16u)"),
                        Scalar::I16 => wrap(&format!("bitcast<i32>({bits})"), b),
                        _ => bits,
                    }
                }
                _ if ra == rb => v.to_string(),
                _ if a.size() < 4 => wrap(&format!("bitcast<{rb}>({v})"), b),
                _ => format!("bitcast<{rb}>({v})"),
            });
        }
        if b == Scalar::Bool {
            let zero = int_lit(0, a);
            if a.is_float() {
                let nan = self.isnan(v, a);
                return Ok(format!("(({v} != {zero}) || {nan})"));
            }
            return Ok(format!("({v} != {zero})"));
        }
        if a == Scalar::Bool {
            return Ok(format!("select({}, {}, {v})", int_lit(0, b), int_lit(1, b)));
        }
        if b.is_float() {
            let c = format!("{rb}({v})");
            return Ok(if b == Scalar::BF16 { self.round_bf16(&c) } else { c });
        }
        if a.is_float() {
            // Saturating, NaN → 0 (Rust's `as`), computed in f32 (f16's range is inside it).
            let x = if a == Scalar::F16 { format!("f32({v})") } else { v.to_string() };
            let (min, max) = b.int_range().unwrap_or((0, 0));
            let (lo, hi) = (min as f64, max as f64 + 1.0);
            let (lo_lit, hi_lit) = (float_lit(lo, Scalar::F32), float_lit(hi, Scalar::F32));
            let name = self.fresh("sat");
            self.line(format!("let {name} = {x};"));
            let inner = if b.size() < 4 { format!("{rb}(i32({name}))") } else { format!("{rb}({name})") };
            let min_v = int_lit(min as i64, b);
            let max_v = if b == Scalar::U64 { "18446744073709551615lu".into() } else { int_lit(max as i64, b) };
            let nan = self.isnan(&name, Scalar::F32);
            return Ok(format!(
                "select(select(select({inner}, {max_v}, {name} >= {hi_lit}), {min_v}, {name} <= {lo_lit}), {}, {nan})",
                int_lit(0, b)
            ));
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
        } else if a.is_signed() {
            format!("bitcast<u64>(i64({v}))")
        } else {
            format!("u64({v})")
        };
        Ok(wrap(&conv, b))
    }

    /// A BITCAST between lane counts (`u8x4` → `u32`, `f32` → `f16x2`): the source lanes'
    /// bits, regrouped into the target lanes (lanes of at most 32 bits).
    fn repack(&mut self, n: &UOp, v: &str, from: DType, to: DType) -> Result<String> {
        let (Some(a), Some(b)) = (from.scalar(), to.scalar()) else {
            return Err(render_err(n, format!("cannot bitcast {from} to {to}")));
        };
        let (wa, wb) = (from.width() as usize, to.width() as usize);
        if a.size() > 4 || b.size() > 4 || a.size() * wa != b.size() * wb {
            return Err(render_err(n, format!("bitcast of {from} to {to}: WGSL regroups lanes of at most 32 bits")));
        }
        let bits_of = |size: usize| match size {
            1 => Scalar::U8,
            2 => Scalar::U16,
            _ => Scalar::U32,
        };
        let lane = |e: &str, w: usize, i: usize| if w == 1 { e.to_string() } else { format!("{e}[{i}]") };
        let mut src = Vec::with_capacity(wa);
        for i in 0..wa {
            src.push(self.convert(n, &lane(v, wa, i), a, bits_of(a.size()), true)?);
        }
        let mut out = Vec::with_capacity(wb);
        for j in 0..wb {
            let bits = if a.size() < b.size() {
                let r = b.size() / a.size();
                let parts: Vec<String> =
                    (0..r).map(|k| format!("({} << {}u)", src[j * r + k], k * a.size() * 8)).collect();
                format!("({})", parts.join(" | "))
            } else {
                let r = a.size() / b.size();
                let mask = (1u64 << (b.size() * 8)) - 1;
                format!("(({} >> {}u) & {mask}u)", src[j / r], (j % r) * b.size() * 8)
            };
            out.push(self.convert(n, &bits, bits_of(b.size()), b, true)?);
        }
        if wb == 1 {
            return Ok(out.remove(0));
        }
        Ok(format!("{}({})", self.ty(n, to)?, out.join(", ")))
    }

    fn alu(&mut self, n: &UOp, op: Op, args: &[(String, DType)]) -> Result<String> {
        let operand = args.get(if op == Op::Where { 1 } else { 0 }).map(|a| a.1).unwrap_or(DType::Void);
        match operand {
            DType::Scalar(s) => {
                let exprs: Vec<String> = args.iter().map(|a| a.0.clone()).collect();
                self.scalar_alu(n, op, s, &exprs)
            }
            DType::Vector(s, w) => {
                let ty = self.ty(n, n.dtype())?;
                let mut lanes = Vec::with_capacity(w as usize);
                for i in 0..w {
                    let exprs: Vec<String> = args
                        .iter()
                        .map(|(e, dt)| if matches!(dt, DType::Vector(..)) { format!("{e}[{i}]") } else { e.clone() })
                        .collect();
                    lanes.push(self.scalar_alu(n, op, s, &exprs)?);
                }
                Ok(format!("{ty}({})", lanes.join(", ")))
            }
            other => Err(render_err(n, format!("arithmetic on {other}"))),
        }
    }

    /// `f(a...)` on float registers of `s`, computed in f32 (f16's transcendentals are
    /// computed in f32 and rounded once).
    fn via_f32(&self, s: Scalar, f: &str, a: &[String]) -> String {
        if s == Scalar::F16 {
            let args: Vec<String> = a.iter().map(|e| format!("f32({e})")).collect();
            format!("f16({f}({}))", args.join(", "))
        } else {
            format!("{f}({})", a.join(", "))
        }
    }

    fn scalar_alu(&mut self, n: &UOp, op: Op, s: Scalar, a: &[String]) -> Result<String> {
        if op == Op::Where {
            return Ok(format!("select({}, {}, {})", a[2], a[1], a[0]));
        }
        let bits = s.size() * 8;
        let shift = |b: &str| -> String {
            let amount = if s.is_signed() || s == Scalar::U64 { format!("u32({b})") } else { b.to_string() };
            format!("({amount} & {}u)", bits - 1)
        };
        if s == Scalar::Bool {
            return Ok(match op {
                Op::Neg | Op::Not => format!("(!{})", a[0]),
                Op::And | Op::Mul | Op::Min => format!("({} && {})", a[0], a[1]),
                Op::Or | Op::Max | Op::Add => format!("({} || {})", a[0], a[1]),
                Op::Xor | Op::Ne | Op::Sub => format!("({} != {})", a[0], a[1]),
                Op::Eq => format!("({} == {})", a[0], a[1]),
                Op::Lt => format!("(!{} && {})", a[0], a[1]),
                Op::Le => format!("(!{} || {})", a[0], a[1]),
                op => return Err(render_err(n, format!("{op} is not an ALU op on bool in WGSL"))),
            });
        }
        let r = match op {
            Op::Neg if s.is_float() || s.is_signed() => format!("(-{})", a[0]),
            Op::Neg => format!("({} - {})", int_lit(0, s), a[0]),
            Op::Not if s.is_int() => format!("(~{})", a[0]),
            Op::Sqrt => format!("sqrt({})", a[0]),
            Op::Exp2 => self.via_f32(s, "exp2", a),
            Op::Log2 => self.via_f32(s, "log2", a),
            Op::Exp => {
                self.helpers.insert(EXP_F32);
                self.via_f32(s, "kiln_exp_f32", a)
            }
            Op::Log => self.via_f32(s, "log", a),
            Op::Sin | Op::Cos => {
                self.helpers.insert(SINCOS_F32);
                let f = if op == Op::Sin { "kiln_sin_f32" } else { "kiln_cos_f32" };
                self.via_f32(s, f, a)
            }
            Op::Trunc => format!("trunc({})", a[0]),
            Op::Recip => format!("({} / {})", float_lit(1.0, s), a[0]),
            Op::Abs if s.is_float() || s.is_signed() => format!("abs({})", a[0]),
            Op::Abs => a[0].clone(),
            Op::Max | Op::Min if s.is_float() => {
                let f = if op == Op::Max { "max" } else { "min" };
                let (na, nb) = (self.isnan(&a[0], s), self.isnan(&a[1], s));
                format!("select(select({f}({0}, {1}), {0}, {nb}), {1}, {na})", a[0], a[1])
            }
            Op::Ne if s.is_float() => {
                let (na, nb) = (self.isnan(&a[0], s), self.isnan(&a[1], s));
                format!("(({} != {}) || {na} || {nb})", a[0], a[1])
            }
            // A NaN operand makes an ordered comparison false by the bits too: a driver may
            // compile `a < b` as `!(a >= b)` (NVIDIA's Vulkan driver did, for WHERE(CMPLT)).
            Op::Lt | Op::Le | Op::Eq if s.is_float() => {
                let (na, nb) = (self.isnan(&a[0], s), self.isnan(&a[1], s));
                let symbol = match op {
                    Op::Lt => "<",
                    Op::Le => "<=",
                    _ => "==",
                };
                format!("(({} {symbol} {}) && !{na} && !{nb})", a[0], a[1])
            }
            Op::Max => format!("max({}, {})", a[0], a[1]),
            Op::Min => format!("min({}, {})", a[0], a[1]),
            Op::Pow => {
                self.helpers.insert(ISNAN_F32);
                self.helpers.insert(POW_F32);
                self.via_f32(s, "kiln_pow_f32", a)
            }
            Op::MulAcc if s.is_float() => format!("fma({}, {}, {})", a[0], a[1], a[2]),
            Op::MulAcc => format!("({} * {} + {})", a[0], a[1], a[2]),
            Op::Shl => format!("({} << {})", a[0], shift(&a[1])),
            Op::Shr => format!("({} >> {})", a[0], shift(&a[1])),
            Op::Idiv | Op::Mod if s.is_int() => {
                let zero = int_lit(0, s);
                let one = int_lit(1, s);
                let is_zero = format!("({} == {zero})", a[1]);
                let symbol = if op == Op::Idiv { "/" } else { "%" };
                let by_zero = if op == Op::Idiv { zero } else { a[0].clone() };
                format!("select(({} {symbol} select({}, {one}, {is_zero})), {by_zero}, {is_zero})", a[0], a[1])
            }
            Op::Add => format!("({} + {})", a[0], a[1]),
            Op::Sub => format!("({} - {})", a[0], a[1]),
            Op::Mul => format!("({} * {})", a[0], a[1]),
            Op::Div => format!("({} / {})", a[0], a[1]),
            Op::And if s.is_int() => format!("({} & {})", a[0], a[1]),
            Op::Or if s.is_int() => format!("({} | {})", a[0], a[1]),
            Op::Xor if s.is_int() => format!("({} ^ {})", a[0], a[1]),
            Op::Lt => format!("({} < {})", a[0], a[1]),
            Op::Le => format!("({} <= {})", a[0], a[1]),
            Op::Eq => format!("({} == {})", a[0], a[1]),
            Op::Ne => format!("({} != {})", a[0], a[1]),
            op => return Err(render_err(n, format!("{op} is not an ALU op on {}", s.name()))),
        };
        if s == Scalar::BF16 && !op.is_comparison() {
            return Ok(self.round_bf16(&r));
        }
        let wraps =
            matches!(op, Op::Neg | Op::Not | Op::Add | Op::Sub | Op::Mul | Op::Shl | Op::MulAcc | Op::Abs | Op::Idiv);
        Ok(if wraps && s.is_int() && s.size() < 4 { wrap(&r, s) } else { r })
    }
}
