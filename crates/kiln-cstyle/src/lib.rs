//! kiln's code generator: one walk over a kernel's linear order, spelled by a [`Dialect`].
//!
//! [`CStyle`] turns a kernel (a SINK) into C-like source plus its [`ProgramSpec`]. Everything
//! that is the same in every language lives here: naming, scoping, loops, blocks,
//! accumulators and carried values, the meaning of every op. A dialect (C for the CPU, OpenCL
//! C, CUDA C, WGSL) only says how things are *spelled*: type names, vector syntax, the kernel
//! signature, how launch indices come into being, math function names, conversions, loads
//! and stores. Its [`Syntax`] writes the statements and the few expressions whose form
//! differs between languages; C's is the default, and a language that is not C overrides it on
//! the same walk ([`lower`] then [`emit`]). What a language lacks altogether is rewritten
//! in the IR before the walk (a renderer's decompositor), not spelled around here.
//!
//! # Emission model
//! - CONST, PARAM, DEFINE_VAR, SPECIAL, INDEX, BIND and AFTER are inline expressions; every
//!   other value gets one declaration ([`Syntax::declare`]: `alu3`, `val0`, `cast1`, ...),
//!   so every expression is self-contained and operator precedence never matters.
//! - The nodes the SPECIAL extents depend on are emitted first (the kernel prologue), then
//!   [`Dialect::open_launch`] introduces the launch indices (the CPU opens loops there, OpenCL
//!   reads work-item ids), then the rest of the kernel in linear order.
//! - RANGE opens a loop ([`Syntax::open_loop`], in C `for (ridxN = 0; ridxN < extent; ridxN++) {`);
//!   the first END naming it closes it ([`Syntax::close_loop`] may rewrite its body). IF opens
//!   `if (cond) {`; its ENDIF closes it.
//! - DEFINE_LOCAL declares work-group local memory ([`Dialect::local_memory`], `lmemN`) at the
//!   top of the kernel body, before the launch indices open (OpenCL C allows `__local`
//!   declarations only at kernel function scope). BARRIER is one statement
//!   ([`Dialect::barrier`]). Both need work groups: a kernel with direct launch indices
//!   (`idxN`) cannot use them, and a dialect without work groups refuses them.
//! - A STORE hinted non-temporal ([`kiln_ir::StoreHint`]) to global memory is spelled by
//!   [`Dialect::store_nontemporal`] (a plain store by default); [`Dialect::kernel_end`]
//!   closes the body (e.g. with the store fence such stores need).
//! - DEFINE_ACC declares a mutable variable before its loops. ASSIGN evaluates to its new value;
//!   the write-back to the accumulator is deferred to the end of the enclosing block, so every
//!   read of the accumulator inside one iteration sees the value from the iteration's start,
//!   wherever the linearizer placed it relative to the ASSIGN.
//! - A valued END whose value is an accumulator (through ASSIGN/END/AFTER) is that accumulator
//!   after the loop. Any other valued END is carried: a variable declared before the loop
//!   (zero-initialised, so a loop that runs zero times yields zero) and set at the end of every
//!   iteration.
//!
//! # Semantics (identical in every dialect)
//! - Integer ADD/SUB/MUL/NEG wrap (two's complement); IDIV truncates toward zero, MOD takes the
//!   sign of the dividend, and both are defined for every operand: `x / 0 == 0`, `x % 0 == x`,
//!   `MIN / -1 == MIN` (it wraps) and `MIN % -1 == 0`, on every integer type, scalar and
//!   vector. C traps on those, so the divisor is replaced by 1 there (a select, no branch);
//!   a constant divisor that cannot trap stays a plain `/` or `%`.
//! - SHL/SHR use the shift count modulo the bit width (like Rust's `wrapping_shl`); SHR is
//!   arithmetic for signed and logical for unsigned types; SHL of signed values shifts the
//!   unsigned bit pattern, so it never overflows.
//! - MAX/MIN of floats are IEEE `fmax`/`fmin` (a NaN operand yields the other operand).
//! - MULACC is a fused multiply-add (`fma`) for floats, `a*b + c` (wrapping) for integers.
//! - f16/bf16 arithmetic is computed in f32 and rounded once per op, unless the dialect says
//!   the type is native ([`Dialect::float_via_f32`]).
//! - CAST float → integer saturates and maps NaN to 0 (Rust's `as`); anything → bool is `!= 0`.
//!   BITCAST reinterprets bytes without aliasing tricks (dialects use unions or builtins).
//! - Bool values are 0/1; NEG of a bool is NOT.
//!
//! # Layout
//! - [`dialect`]: the [`Dialect`] contract, its [`Syntax`] of statements (C's by default), and
//!   the values they spell from.
//! - [`reserved`]: the names no kernel or variable may take.
//! - [`literal`]: number literals.
//! - `emit`: the emitter (the walk above).
//! - [`gpu`]: the GPU dialect ([`Gpu`]): a [`GpuLanguage`] (OpenCL C, CUDA C++) is data plus
//!   a few hooks.
//!
//! # Example
//! ```
//! use kiln_cstyle::{CStyle, Gpu, GpuLanguage};
//! use kiln_device::Renderer;
//! use kiln_ir::{DeviceSpec, KernelBuilder, Scalar};
//!
//! /// A made-up GPU language: OpenCL C's spelling, as data.
//! struct Toy;
//! impl GpuLanguage for Toy {
//!     const HEADER: &'static str = "// toy";
//!     const FUNCTION: &'static str = "static inline";
//!     const KERNEL: &'static str = "__kernel void";
//!     const BUFFER: &'static str = "__global ";
//!     const BUFFER_OFFSETS: bool = false;
//!     const SHARED: &'static str = "__local";
//!     const BARRIER: &'static str = "barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)";
//!     const GROUP_ID: [&'static str; 3] = ["get_group_id(0)", "get_group_id(1)", "get_group_id(2)"];
//!     const LOCAL_ID: [&'static str; 3] = ["get_local_id(0)", "get_local_id(1)", "get_local_id(2)"];
//!     const GLOBAL_ID: [&'static str; 3] = ["get_global_id(0)", "get_global_id(1)", "get_global_id(2)"];
//!     const GUARD_DIRECT: bool = false;
//!     const NATIVE_WIDTHS: &'static [u8] = &[2, 4];
//!     const OVERLOADED_MATH: bool = true;
//!     const LONG: &'static str = "L";
//!     const CPLUSPLUS: bool = false;
//!     const FLOAT_FROM_BITS: &'static str = "as_float";
//!     const BITS_OF_FLOAT: &'static str = "as_uint";
//!     const DOUBLE_FROM_BITS: &'static str = "as_double";
//!     const BITCAST: Option<&'static str> = Some("as_");
//!     const F64_EXTENSION: Option<&'static str> = None;
//!     const F16_HELPERS: &'static str = "/* f16 helpers */";
//!     const F64_TO_F16: &'static str = "/* f64 -> f16 */";
//!     const INTEGERS: [&'static str; 8] = ["char", "short", "int", "long", "uchar", "ushort", "uint", "ulong"];
//! }
//!
//! let mut k = KernelBuilder::new();
//! let (a, out) = (k.param(0, Scalar::F32, 64), k.param(1, Scalar::F32, 64));
//! let i = k.global(0, 64);
//! k.store(&out.at(&i), &(a.at(&i).load() * 2.0));
//! let renderer = CStyle::new(Gpu::new(Toy, true), DeviceSpec::new("OPENCL", 0));
//! let spec = renderer.render(&k.finish().unwrap(), Some("twice")).unwrap();
//! assert!(spec.src.contains("__kernel void twice(__global float* data0, __global float* data1)"), "{}", spec.src);
//! ```

pub mod dialect;
mod emit;
pub mod gpu;
pub mod literal;
pub mod reserved;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use kiln_device::{Error, ProgramSpec, Renderer, Result};
use kiln_ir::{DeviceSpec, Op, UOp, linearize, validate};

pub use dialect::{
    Address, Dialect, KernelParam, KernelVar, LaunchIndex, MathFn, Prelude, Syntax, c_vector_operator, unsupported_wmma,
};
pub use gpu::{Gpu, GpuLanguage};
pub use literal::{c_float_literal, c_int_literal, int_literal, saturating_cast, wrap_int};
pub use reserved::kernel_name;

use emit::Emitter;

/// Renders kernels with one dialect for one device family: a backend's [`Renderer`] is
/// `CStyle<its dialect>`. Rendering keeps no state between kernels, so one renderer serves
/// every thread.
#[derive(Debug, Clone)]
pub struct CStyle<D> {
    /// How the target language spells things.
    pub dialect: D,
    /// The device family every rendered [`ProgramSpec`] is for.
    pub device: DeviceSpec,
}

impl<D: Dialect> CStyle<D> {
    /// A renderer for `device` in `dialect`.
    pub fn new(dialect: D, device: DeviceSpec) -> Self {
        CStyle { dialect, device }
    }
}

impl<D: Dialect + Send + Sync> Renderer for CStyle<D> {
    /// Renders the kernel rooted at `ast` (a SINK). The entry point is `name` made into a C
    /// identifier, or `k_` plus the start of the kernel's content hash. Metadata comes from
    /// [`ProgramSpec::from_sink`]. A kernel this core or the dialect cannot express (or that
    /// [`Dialect::refuse`]s) is an [`Error::Render`] naming the node; a malformed kernel is
    /// the validator's error ([`Error::Ir`]).
    fn render(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        self.dialect.refuse(ast, &self.device)?;
        let (mut spec, linear) = lower(ast, name, &self.device, |ast| self.dialect.optimize(ast))?;
        spec.src = emit(&self.dialect, &spec, &linear)?;
        Ok(spec)
    }

    fn describe(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        self.dialect.refuse(ast, &self.device)?;
        describe(ast, name, &self.device)
    }

    fn identity(&self) -> Option<String> {
        self.dialect.identity()
    }

    fn device(&self) -> &DeviceSpec {
        &self.device
    }
}

/// The first half of rendering, the same for every language: checks that `ast` is a valid
/// kernel (a SINK), derives its [`ProgramSpec`] (no source yet; the entry point is `name`
/// made into an identifier, or `k_` plus the start of the content hash), then applies
/// `rewrite` (a dialect's optimizations, a language's decompositor) and linearizes the result.
///
/// # Errors
/// [`Error::Render`] for a root other than SINK; the validator's and the linearizer's errors
/// ([`Error::Ir`]), also for a rewritten kernel that no longer validates.
pub fn lower(
    ast: &Arc<UOp>,
    name: Option<&str>,
    device: &DeviceSpec,
    rewrite: impl FnOnce(&Arc<UOp>) -> Arc<UOp>,
) -> Result<(ProgramSpec, Vec<Arc<UOp>>)> {
    let spec = describe(ast, name, device)?;
    let rewritten = rewrite(ast);
    if !Arc::ptr_eq(&rewritten, ast) {
        validate(&rewritten)?;
    }
    Ok((spec, linearize(&rewritten)?))
}

/// What every language's renderer knows of `ast` before rendering it: checks that it is a
/// valid kernel (a SINK: [`ProgramSpec::from_sink`] validates it) and derives its [`ProgramSpec`] without source; the entry point is
/// `name` made into an identifier, or `k_` plus the start of the content hash.
///
/// # Errors
/// [`Error::Render`] for a root other than SINK; the validator's errors ([`Error::Ir`]).
pub fn describe(ast: &Arc<UOp>, name: Option<&str>, device: &DeviceSpec) -> Result<ProgramSpec> {
    if ast.op() != Op::Sink {
        return Err(Error::Render(format!("a kernel is rooted at SINK, got {}", ast.op())));
    }
    ProgramSpec::from_sink(&kernel_name(name, ast), String::new(), device.clone(), ast)
}

/// The second half: the source of the kernel in `linear` (its linear order, from [`lower`])
/// in `dialect`, by the core's one walk.
///
/// # Errors
/// [`Error::Render`] naming the node the core or the dialect cannot express.
pub fn emit<D: Dialect + ?Sized>(dialect: &D, spec: &ProgramSpec, linear: &[Arc<UOp>]) -> Result<String> {
    Emitter::new(dialect).run(spec, linear)
}
