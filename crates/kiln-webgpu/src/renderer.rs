//! kiln IR → WGSL, on kiln-cstyle's core: the one walk over a kernel's linear order that the
//! C family uses, with [`Wgsl`] as the language (its [`Syntax`] and [`Dialect`]). What WGSL
//! lacks is rewritten in the IR first (the [`Renderer::decompositor`]); the rest of its words
//! are in [`crate::wgsl`].
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
//! Float → integer casts saturate (NaN → 0), `fmax`/`fmin` take the number over a NaN, float
//! comparisons test NaN by the bits, and shift amounts are taken modulo the width; integer
//! division by zero is the core's (`x / 0 == 0`, `x % 0 == x`). Bool arithmetic, NEG of
//! unsigned integers and WHERE of vectors by one bool are rewritten into ops WGSL has.

use std::sync::Arc;

use kiln_cstyle::{
    Address, Dialect, KernelParam, KernelVar, LaunchIndex, MathFn, Prelude, Syntax, emit, lower, unsupported_wmma,
    wrap_int,
};
use kiln_device::{Error, ProgramSpec, Renderer, Result};
use kiln_ir::rewrite::RewriteRules;
use kiln_ir::{AddrSpace, Arg, DType, DeviceSpec, Op, Scalar, UOp, Wmma};

use crate::loops::LoopPlan;
use crate::wgsl::{self, int_lit, reg};

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
        // Every dtype WGSL or the adapter lacks is refused up front, naming it.
        for n in ast.toposort() {
            if let Some(s) = n.dtype().scalar() {
                check(s, self.caps)?;
            }
        }
        let rules = self.decompositor().unwrap_or_default();
        let (mut spec, linear) = lower(ast, name, &self.device, |ast| rules.rewrite(ast))?;
        let words = 3 + spec.params.len() + spec.vars.len();
        if words > ARGS {
            return Err(Error::Render(format!(
                "{} buffers and {} variables need {words} argument words; the WebGPU backend passes at most {ARGS}",
                spec.params.len(),
                spec.vars.len()
            )));
        }
        let f16 = linear.iter().any(|n| n.dtype().scalar() == Some(Scalar::F16));
        let group = work_group_size(&spec)?;
        let plan = LoopPlan::new(&linear, self.loop_budget);
        let language = Wgsl { spec: &spec, f16, group, plan };
        spec.src = emit(&language, &spec, &linear)?;
        Ok(spec)
    }

    /// The kernel's metadata without its WGSL: what the kernel cache needs for a binary it
    /// found by [`Renderer::identity`] (WGSL's rewrites change no launch, buffer or variable).
    fn describe(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        kiln_cstyle::describe(ast, name, &self.device)
    }

    /// The adapter's features and loop budget: all the WGSL depends on besides the kernel.
    fn identity(&self) -> Option<String> {
        Some(format!("wgsl f16={} int64={} loop_budget={:?}", self.caps.f16, self.caps.int64, self.loop_budget))
    }

    fn device(&self) -> &DeviceSpec {
        &self.device
    }

    /// What WGSL lacks, in ops it has: bool arithmetic as logic, NEG of unsigned integers as
    /// `0 - x`, WHERE of vectors by one bool with the bool broadcast (WGSL selects only
    /// scalars and vectors, not arrays), buffer indices of other integer types converted to
    /// the index type, and integer constants converted when rendering (naga does not
    /// convert 64-bit constants).
    fn decompositor(&self) -> Option<RewriteRules> {
        let rules = RewriteRules::new().with(bool_arithmetic).with(unsigned_neg).with(broadcast_where);
        Some(rules.with(index_type).with(fold_int_cast))
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

/// Refuses a scalar WGSL or the adapter lacks, naming it.
fn check(s: Scalar, caps: Caps) -> Result<()> {
    match s {
        Scalar::F16 if !caps.f16 => Err(missing(s, "SHADER_F16")),
        Scalar::I64 | Scalar::U64 if !caps.int64 => Err(missing(s, "SHADER_INT64")),
        Scalar::F64 => Err(Error::Render("dtype f64: WGSL has no 64-bit float type".into())),
        _ => Ok(()),
    }
}

fn missing(s: Scalar, feature: &str) -> Error {
    Error::Render(format!("dtype {} needs the adapter feature {feature}, which this WebGPU adapter lacks", s.name()))
}

/// Bool ADD, SUB, MUL, MAX, MIN, XOR, CMPLT and CMPLE as the logic WGSL has for bools.
fn bool_arithmetic(n: &Arc<UOp>) -> Option<Arc<UOp>> {
    let [a, b] = n.src() else { return None };
    if a.dtype().scalar() != Some(Scalar::Bool) || !n.op().is_alu() {
        return None;
    }
    let node = |op, src| UOp::new(op, n.dtype(), Arg::None, src);
    let not_a = || UOp::new(Op::Not, a.dtype(), Arg::None, vec![a.clone()]);
    Some(match n.op() {
        Op::Add | Op::Max => node(Op::Or, vec![a.clone(), b.clone()]),
        Op::Mul | Op::Min => node(Op::And, vec![a.clone(), b.clone()]),
        Op::Sub | Op::Xor => node(Op::Ne, vec![a.clone(), b.clone()]),
        Op::Lt => node(Op::And, vec![not_a(), b.clone()]),
        Op::Le => node(Op::Or, vec![not_a(), b.clone()]),
        _ => return None,
    })
}

/// NEG of an unsigned integer (WGSL has no unary minus for it) as `0 - x`.
fn unsigned_neg(n: &Arc<UOp>) -> Option<Arc<UOp>> {
    let s = n.dtype().scalar().filter(|s| n.op() == Op::Neg && s.is_int() && !s.is_signed())?;
    let mut zero = UOp::const_int(DType::Scalar(s), 0);
    if n.dtype().width() > 1 {
        zero = UOp::new(Op::Vectorize, n.dtype(), Arg::None, vec![zero]);
    }
    Some(UOp::new(Op::Sub, n.dtype(), Arg::None, vec![zero, n.src()[0].clone()]))
}

/// WHERE of vectors by one bool, with the bool broadcast to the vectors' lanes.
fn broadcast_where(n: &Arc<UOp>) -> Option<Arc<UOp>> {
    let [c, t, f] = n.src() else { return None };
    if n.op() != Op::Where || c.dtype() != DType::BOOL || n.dtype().width() < 2 {
        return None;
    }
    let lanes = DType::Vector(Scalar::Bool, n.dtype().width());
    let c = UOp::new(Op::Vectorize, lanes, Arg::None, vec![c.clone()]);
    Some(n.with_src(vec![c, t.clone(), f.clone()]))
}

/// INDEX by an integer of another type than the index type, by the index converted.
fn index_type(n: &Arc<UOp>) -> Option<Arc<UOp>> {
    let [base, idx, rest @ ..] = n.src() else { return None };
    if n.op() != Op::Index || idx.dtype() == DType::INDEX || idx.dtype().scalar().is_none() {
        return None;
    }
    let idx = UOp::new(Op::Cast, DType::INDEX, Arg::None, vec![idx.clone()]);
    Some(n.with_src([vec![base.clone(), idx], rest.to_vec()].concat()))
}

/// CAST of an integer CONST to an integer type, as the CONST of that type.
fn fold_int_cast(n: &Arc<UOp>) -> Option<Arc<UOp>> {
    let (Op::Cast, Some(to), [c]) = (n.op(), n.dtype().scalar(), n.src()) else { return None };
    let from = c.dtype().scalar().filter(|s| s.is_int() && c.op() == Op::Const)?;
    let v = c.arg_int()?;
    to.is_int().then(|| UOp::const_int(n.dtype(), wrap_int(wrap_int(v, from), to)))
}

/// WGSL for one kernel: what the language needs to know of it beyond the core's walk.
struct Wgsl<'a> {
    spec: &'a ProgramSpec,
    /// Whether the kernel uses f16 (`enable f16;`).
    f16: bool,
    /// The constant work-group size, or `None` for one set per launch.
    group: Option<[u32; 3]>,
    plan: LoopPlan,
}

/// The uniform word `k` of the argument block.
fn arg_word(k: usize) -> String {
    format!("kiln_args[{}][{}]", k / 4, k % 4)
}

impl Syntax for Wgsl<'_> {
    fn scalar_type(&self, s: Scalar, _: &mut Prelude) -> String {
        reg(s).into()
    }

    fn declare(&self, ty: &str, name: &str, init: &str) -> String {
        format!("let {name}: {ty} = {init};")
    }

    fn element(&self, base: Address, index: String, scalar: Scalar, space: AddrSpace) -> Address {
        let index = if base.index == "0" { index } else { format!("({} + {index})", base.index) };
        Address { base: base.base, index, scalar, space }
    }

    fn declare_mut(&self, ty: &str, name: &str, init: &str) -> String {
        format!("var {name}: {ty} = {init};")
    }

    /// An unrolled loop steps its base index `{index}_b` by the factor (see `close_loop`).
    fn open_loop(&self, range: &UOp, ty: &str, index: &str, extent: &str) -> String {
        let s = range.dtype().scalar().unwrap_or(Scalar::I32);
        match self.plan.unroll(range.content_hash()) {
            factor if factor > 1 => {
                let (base, step) = (format!("{index}_b"), int_lit(factor as i64, s));
                format!("for (var {base}: {ty} = {}; {base} < {extent}; {base} += {step}) {{", int_lit(0, s))
            }
            _ => format!("for (var {index}: {ty} = {}; {index} < {extent}; {index}++) {{", int_lit(0, s)),
        }
    }

    fn select(&self, cond: &str, t: &str, f: &str) -> String {
        format!("select({f}, {t}, {cond})")
    }

    /// The body of an unrolled loop `factor` times, iteration `base + k` in copy `k`. Each copy
    /// is a block of its own (its names do not clash) and declares the loop index; a copy past
    /// the extent ends the loop, as does a pass that reached it, before the base could overflow.
    fn close_loop(&self, range: &UOp, index: &str, extent: &str, body: Vec<String>, pad: &str) -> Vec<String> {
        let factor = self.plan.unroll(range.content_hash());
        if factor < 2 {
            return body;
        }
        let s = range.dtype().scalar().unwrap_or(Scalar::I32);
        let (base, ty) = (format!("{index}_b"), reg(s));
        let mut out = Vec::new();
        for k in 0..factor {
            out.push(format!("{pad}{{"));
            if k == 0 {
                out.push(format!("{pad}  let {index}: {ty} = {base};"));
            } else {
                let k = int_lit(k as i64, s);
                out.push(format!("{pad}  if ({extent} - {base} <= {k}) {{ break; }}"));
                out.push(format!("{pad}  let {index}: {ty} = {base} + {k};"));
            }
            out.extend(body.iter().map(|l| format!("  {l}")));
            out.push(format!("{pad}}}"));
        }
        out.push(format!("{pad}if ({extent} - {base} <= {}) {{ break; }}", int_lit(factor as i64, s)));
        out
    }

    fn gated(&self, gate: &str, stmt: &str) -> String {
        format!("if ({gate}) {{ {stmt} }}")
    }

    /// A buffer is indexed from its view's offset.
    fn buffer(&self, param: &KernelParam) -> Address {
        let index = format!("kiln_off{}", param.slot);
        Address { base: param.name.clone(), index, scalar: param.scalar, space: param.space }
    }

    fn gated_load(&self, ty: &str, name: &str, load: &str, alt: &str, gate: &str) -> Vec<String> {
        vec![self.declare_mut(ty, name, alt), format!("if ({gate}) {{ {name} = {load}; }}")]
    }

    fn var_name(&self, _: &str, position: usize) -> String {
        format!("kiln_var{position}")
    }

    fn shift(&self, op: Op, s: Scalar, a: &str, b: &str, _: &mut Prelude) -> String {
        let amount = if s.is_signed() || s == Scalar::U64 { format!("u32({b})") } else { b.to_string() };
        let symbol = if op == Op::Shl { "<<" } else { ">>" };
        format!("({a} {symbol} ({amount} & {}u))", s.size() * 8 - 1)
    }

    fn wrap(&self, e: &str, s: Scalar, _: &mut Prelude) -> String {
        wgsl::wrap(e, s)
    }

    /// Float comparisons that hold for NaN operands by their bits too: a driver may compile
    /// `a < b` as `!(a >= b)` (NVIDIA's Vulkan driver did, for WHERE(CMPLT)).
    fn scalar_op(&self, op: Op, s: Scalar, a: &[String], p: &mut Prelude) -> Option<String> {
        let symbol = match op {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Eq => "==",
            Op::Ne => "!=",
            _ => return None,
        };
        if !s.is_float() {
            return None;
        }
        let (na, nb) = (wgsl::isnan(&a[0], s, p), wgsl::isnan(&a[1], s, p));
        Some(if op == Op::Ne {
            format!("(({} != {}) || {na} || {nb})", a[0], a[1])
        } else {
            format!("(({} {symbol} {}) && !{na} && !{nb})", a[0], a[1])
        })
    }
}

impl Dialect for Wgsl<'_> {
    /// `enable f16;` where used, the uniform argument block and the buffers.
    fn header(&self) -> String {
        let mut out = if self.f16 { "enable f16;\n".to_string() } else { String::new() };
        out += &format!("// kiln kernel `{}`\n", self.spec.name);
        out += &format!("@group(0) @binding(0) var<uniform> kiln_args: array<vec4<u32>, {}>;", ARGS / 4);
        for p in &self.spec.params {
            let elem = if wgsl::packed(p.scalar) { "atomic<u32>" } else { reg(p.scalar) };
            out += &format!(
                "\n@group(0) @binding({}) var<storage, read_write> data{}: array<{elem}>;",
                p.slot + 1,
                p.slot
            );
        }
        out
    }

    fn vector_type(&self, s: Scalar, w: u8, _: &mut Prelude) -> String {
        format!("array<{}, {w}>", reg(s))
    }

    fn lane(&self, v: &str, dtype: DType, lane: u8) -> String {
        if dtype.width() > 1 { format!("{v}[{lane}]") } else { v.to_string() }
    }

    fn vector_literal(&self, dtype: DType, lanes: &[String], p: &mut Prelude) -> String {
        let s = dtype.scalar().unwrap_or(Scalar::F32);
        format!("{}({})", self.vector_type(s, dtype.width(), p), lanes.join(", "))
    }

    fn native_vector_op(&self, _: Op, _: DType) -> bool {
        false
    }

    /// bf16 is computed in its f32 register and rounded after every operation; f16 is native.
    fn float_via_f32(&self, s: Scalar) -> bool {
        s == Scalar::BF16
    }

    fn to_f32(&self, e: &str, _: Scalar, _: &mut Prelude) -> String {
        e.to_string()
    }

    fn from_f32(&self, e: &str, _: Scalar, p: &mut Prelude) -> String {
        wgsl::round_bf16(e, p)
    }

    /// WGSL's builtins where they have the IR meaning; kiln's own `exp`, `sin`, `cos` and
    /// `pow` (accuracy, C's special cases) and NaN-aware `fmax`/`fmin`.
    fn math(&self, f: MathFn, s: Scalar, a: &[String], p: &mut Prelude) -> String {
        match f {
            MathFn::Sqrt | MathFn::Trunc | MathFn::Fabs | MathFn::Fma => {
                let name = if f == MathFn::Fabs { "abs" } else { f.c_name() };
                format!("{name}({})", a.join(", "))
            }
            MathFn::Exp2 | MathFn::Log2 | MathFn::Log => wgsl::via_f32(s, f.c_name(), a),
            MathFn::Exp => wgsl::own("kiln_exp_f32", s, a, p),
            MathFn::Sin => wgsl::own("kiln_sin_f32", s, a, p),
            MathFn::Cos => wgsl::own("kiln_cos_f32", s, a, p),
            MathFn::Pow => wgsl::own("kiln_pow_f32", s, a, p),
            MathFn::Fmax | MathFn::Fmin => {
                let name = if f == MathFn::Fmax { "max" } else { "min" };
                let (na, nb) = (wgsl::isnan(&a[0], s, p), wgsl::isnan(&a[1], s, p));
                format!("select(select({name}({0}, {1}), {0}, {nb}), {1}, {na})", a[0], a[1])
            }
        }
    }

    fn cast(&self, e: &str, from: Scalar, to: Scalar, p: &mut Prelude) -> String {
        wgsl::cast(e, from, to, p)
    }

    fn bitcast(&self, e: &str, from: DType, to: DType, p: &mut Prelude) -> Result<String> {
        match (from, to) {
            (DType::Scalar(a), DType::Scalar(b)) if a.size() == b.size() => Ok(wgsl::bitcast(e, a, b, p)),
            (DType::Vector(a, w), DType::Vector(b, w2)) if w == w2 && a.size() == b.size() => {
                let lanes: Vec<String> = (0..w).map(|i| wgsl::bitcast(&format!("{e}[{i}]"), a, b, p)).collect();
                Ok(self.vector_literal(to, &lanes, p))
            }
            _ => wgsl::repack(e, from, to, p),
        }
    }

    fn float_const(&self, v: f64, s: Scalar, _: &mut Prelude) -> String {
        if s.is_float() { wgsl::float_lit(v, s) } else { int_lit(v as i64, s) }
    }

    fn int_const(&self, v: i64, s: Scalar) -> String {
        int_lit(v, s)
    }

    /// The pipeline-overridable work-group size where it is set per launch, and the entry.
    fn signature(&self, _: &str, _: &[KernelParam], _: &[KernelVar], _: &mut Prelude) -> String {
        let (overrides, size) = match self.group {
            Some([x, y, z]) => (String::new(), format!("{x}, {y}, {z}")),
            None => (
                WORK_GROUP_OVERRIDES.map(|name| format!("override {name}: u32 = 1u;\n")).concat(),
                WORK_GROUP_OVERRIDES.join(", "),
            ),
        };
        format!(
            "{overrides}@compute @workgroup_size({size})\nfn kiln_main(@builtin(workgroup_id) wid: vec3<u32>, \
             @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{"
        )
    }

    /// The fold of the dispatch grid into kiln's group indices, the buffers' offsets and the
    /// variables, from the argument block.
    fn prologue(&self, params: &[KernelParam], vars: &[KernelVar], _: &mut Prelude) -> Vec<String> {
        let [g0, g1, g2] = [0, 1, 2].map(arg_word);
        let mut lines = vec![
            "let kiln_lin = wid.x + nwg.x * (wid.y + nwg.y * wid.z);".to_string(),
            format!("if (kiln_lin >= {g0} * {g1} * {g2}) {{ return; }}"),
            // Divisions only where kiln's launch has groups on axes 1 and 2 (a division per
            // item costs more than the add it launches on a software device).
            "var kiln_g0 = kiln_lin;".into(),
            "var kiln_g1 = 0u;".into(),
            "var kiln_g2 = 0u;".into(),
            format!("if ({g1} * {g2} != 1u) {{"),
            format!("  kiln_g0 = kiln_lin % {g0};"),
            format!("  kiln_g1 = (kiln_lin / {g0}) % {g1};"),
            format!("  kiln_g2 = kiln_lin / ({g0} * {g1});"),
            "}".into(),
        ];
        for (k, p) in params.iter().enumerate() {
            lines.push(format!("let kiln_off{} = i32({});", p.slot, arg_word(3 + k)));
        }
        for v in vars {
            lines.push(format!("let {} = bitcast<i32>({});", v.name, arg_word(3 + params.len() + v.position)));
        }
        lines
    }

    /// Each launch index from the folded group indices and the local invocation id; direct
    /// indices (`idxN`) past their extent skip the kernel's body.
    fn open_launch(&self, indices: &[LaunchIndex], _: &mut Prelude) -> Result<Vec<String>> {
        let direct_group = self.group.map_or(DIRECT_GROUP, |g| g[0]);
        let mut lines = Vec::new();
        let mut guards = Vec::new();
        for ix in indices {
            let xyz = ["x", "y", "z"][ix.axis];
            let v = match ix.kind {
                'l' => format!("i32(lid.{xyz})"),
                'i' => {
                    guards.push(format!("({} < {})", ix.name, ix.extent));
                    let size = if ix.axis == 0 { direct_group } else { 1 };
                    format!("i32(kiln_g{} * {size}u + lid.{xyz})", ix.axis)
                }
                _ => format!("i32(kiln_g{})", ix.axis),
            };
            lines.push(format!("let {} = {v};", ix.name));
        }
        if !guards.is_empty() {
            lines.push(format!("if ({}) {{", guards.join(" && ")));
        }
        Ok(lines)
    }

    fn load(&self, addr: &Address, dtype: DType, p: &mut Prelude) -> String {
        if dtype.width() < 2 {
            return wgsl::load_element(addr, 0);
        }
        let lanes: Vec<String> = (0..dtype.width()).map(|k| wgsl::load_element(addr, k)).collect();
        self.vector_literal(dtype, &lanes, p)
    }

    fn store(&self, addr: &Address, value: &str, dtype: DType, _: &mut Prelude) -> String {
        if dtype.width() < 2 {
            return wgsl::store_element(addr, 0, value);
        }
        (0..dtype.width())
            .map(|k| wgsl::store_element(addr, k, &format!("{value}[{k}]")))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Work-group arrays are declared at module scope.
    fn local_memory(&self, name: &str, s: Scalar, len: usize, p: &mut Prelude) -> Result<Option<String>> {
        p.need(name, |_| format!("var<workgroup> {name}: array<{}, {len}>;", reg(s)));
        Ok(None)
    }

    fn barrier(&self, _: &mut Prelude) -> Result<String> {
        Ok("storageBarrier(); workgroupBarrier()".into())
    }

    /// WGSL has no matrix-multiply instruction (subgroup matrices are an unratified proposal).
    fn wmma(&self, w: &Wmma, _: &[String; 3], _: &mut Prelude) -> Result<String> {
        Err(unsupported_wmma(w, "WebGPU declares no matrix unit (WGSL has no matrix-multiply instruction)"))
    }
}
