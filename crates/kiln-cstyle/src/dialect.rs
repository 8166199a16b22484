//! The contract between the core and a language: what [`Dialect`] and its [`Syntax`] spell,
//! and the values they spell from.

use std::collections::HashSet;
use std::sync::Arc;

use kiln_device::{Error, Result};
use kiln_ir::{AddrSpace, DType, DeviceSpec, Op, Scalar, UOp, Wmma};

use crate::literal::c_int_literal;
use crate::reserved::var_c_name;

/// Helper definitions (typedefs, inline functions, pragmas) a rendered kernel needs, in the
/// order they must appear. Dialects register what they use while spelling expressions.
#[derive(Debug, Default)]
pub struct Prelude {
    items: Vec<String>,
    seen: HashSet<String>,
}

impl Prelude {
    /// Adds the definition `key` once. `define` may register the definitions it depends on
    /// first (through the `Prelude` it is given); they then come before it.
    pub fn need(&mut self, key: &str, define: impl FnOnce(&mut Prelude) -> String) {
        if self.seen.insert(key.to_string()) {
            let text = define(self);
            self.items.push(text);
        }
    }

    /// Whether `key` was registered, so a dialect can spell an expression differently when a
    /// helper is already in the file.
    pub fn contains(&self, key: &str) -> bool {
        self.seen.contains(key)
    }

    /// The definitions, dependencies first.
    pub fn items(&self) -> &[String] {
        &self.items
    }
}

/// A math library function. Dialects receive the compute scalar (F32 or F64, or F16/BF16
/// when [`Dialect::float_via_f32`] is false for it) and spell the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MathFn {
    /// `sqrt(x)`, correctly rounded (IEEE); NaN for negative `x`.
    Sqrt,
    /// `exp2(x)` = 2^x.
    Exp2,
    /// `log2(x)`; NaN for negative `x`, -inf for 0.
    Log2,
    /// `exp(x)` = e^x.
    Exp,
    /// `log(x)`, the natural logarithm; NaN for negative `x`, -inf for 0.
    Log,
    /// `sin(x)`, `x` in radians.
    Sin,
    /// `cos(x)`, `x` in radians.
    Cos,
    /// `trunc(x)`: rounds toward zero.
    Trunc,
    /// `fabs(x)`: clears the sign bit (also of NaN and -0).
    Fabs,
    /// `pow(x, y)` = x^y.
    Pow,
    /// `fmax(a, b)`: IEEE maximum, a NaN operand yields the other operand.
    Fmax,
    /// `fmin(a, b)`: IEEE minimum, a NaN operand yields the other operand.
    Fmin,
    /// `fma(a, b, c)` = a*b + c with one rounding.
    Fma,
}

impl MathFn {
    /// The C99 `<math.h>` name for `double` (append `f` for `float`).
    pub fn c_name(self) -> &'static str {
        match self {
            MathFn::Sqrt => "sqrt",
            MathFn::Exp2 => "exp2",
            MathFn::Log2 => "log2",
            MathFn::Exp => "exp",
            MathFn::Log => "log",
            MathFn::Sin => "sin",
            MathFn::Cos => "cos",
            MathFn::Trunc => "trunc",
            MathFn::Fabs => "fabs",
            MathFn::Pow => "pow",
            MathFn::Fmax => "fmax",
            MathFn::Fmin => "fmin",
            MathFn::Fma => "fma",
        }
    }

    /// The C99 call on operands of `s`: `sqrtf(x)` for float, `sqrt(x)` for double.
    pub fn c_call(self, s: Scalar, args: &[String]) -> String {
        let suffix = if s == Scalar::F64 { "" } else { "f" };
        format!("{}{suffix}({})", self.c_name(), args.join(", "))
    }
}

/// Whether C's infix operator for `op` (or unary `-`) applied to whole vectors of `s` has
/// the IR meaning lane by lane: ADD, SUB, MUL and NEG on numbers, DIV on floats, AND, OR
/// and XOR on integers; never on bool or on f16/bf16 (their bits are not their values).
pub fn c_vector_operator(op: Op, s: Scalar) -> bool {
    if matches!(s, Scalar::Bool | Scalar::F16 | Scalar::BF16) {
        return false;
    }
    match op {
        Op::Add | Op::Sub | Op::Mul | Op::Neg => true,
        Op::Div => s.is_float(),
        Op::And | Op::Or | Op::Xor => s.is_int(),
        _ => false,
    }
}

/// A kernel buffer parameter as the signature/prologue sees it.
#[derive(Clone, Debug)]
pub struct KernelParam {
    /// The positional index of the buffer in a launch ([`kiln_device::ProgramSpec::globals`] order).
    pub slot: usize,
    /// The C name (`data0`, ...).
    pub name: String,
    /// The element type behind the pointer.
    pub scalar: Scalar,
    /// The address space of the pointer (global for launch buffers).
    pub space: AddrSpace,
    /// Some STORE writes through it: a dialect may qualify a read-only one (`const`).
    pub written: bool,
    /// Some LOAD reads through it.
    pub read: bool,
}

/// A runtime integer variable as the signature/prologue sees it.
#[derive(Clone, Debug)]
pub struct KernelVar {
    /// The C name (the IR name when it is a safe identifier).
    pub name: String,
    /// The name in the kernel (`DEFINE_VAR`), for messages and metadata.
    pub ir_name: String,
    /// The register type of the variable (an integer type).
    pub dtype: DType,
    /// Index in `ProgramSpec::var_names` (the `vals` order).
    pub position: usize,
}

/// A launch index (SPECIAL) as [`Dialect::open_launch`] sees it.
#[derive(Clone, Debug)]
pub struct LaunchIndex {
    /// The IR name, also the C name (`gidx0`, `lidx1`, `idx0`, `core_id`).
    pub name: String,
    /// `'g'` group/global, `'l'` local, `'i'` direct global index (no local size).
    pub kind: char,
    /// The dimension, 0..3 (`core_id` is axis 0 of kind `'g'`).
    pub axis: usize,
    /// The register type of the index (an integer type).
    pub dtype: DType,
    /// The extent as a C expression, valid before the launch opens.
    pub extent: String,
}

/// Where a LOAD reads or a STORE writes: `base + index` in elements of `scalar`.
#[derive(Clone, Debug)]
pub struct Address {
    /// The pointer expression: a parameter's or a local array's C name.
    pub base: String,
    /// The element offset as a C expression (`"0"` for the base itself).
    pub index: String,
    /// The element type in memory representation (see [`Dialect::memory_type`]).
    pub scalar: Scalar,
    /// Where the memory lives: global (a buffer) or local ([`Dialect::local_memory`]).
    pub space: AddrSpace,
}

impl Address {
    /// `base + index` as a pointer expression.
    pub fn pointer(&self) -> String {
        if self.index == "0" { self.base.clone() } else { format!("({} + {})", self.base, self.index) }
    }
}

/// How one language spells values, memory and the kernel around the core's walk; its
/// statements are its [`Syntax`]. See the crate docs for what the core decides.
///
/// Methods get the [`Prelude`] to register helper definitions they use. Expressions returned
/// must be self-contained (parenthesized where precedence could matter).
pub trait Dialect: Syntax {
    /// Refuses a kernel this dialect's device cannot run before anything is rendered (e.g.
    /// f64 on an OpenCL device without `cl_khr_fp64`). Default: every kernel is rendered.
    ///
    /// # Errors
    /// [`Error::Render`] saying what the device lacks and what to do instead.
    fn refuse(&self, _ast: &Arc<UOp>, _device: &DeviceSpec) -> Result<()> {
        Ok(())
    }

    /// Everything besides the kernel and kiln's source that decides this dialect's output
    /// (see `Renderer::identity`); `None`, the default, keys the kernel cache by the rendered
    /// source.
    fn identity(&self) -> Option<String> {
        None
    }

    /// Rewrites a validated kernel before it is linearized: optimizations for this target
    /// that keep the kernel's meaning bit for bit (the CPU's vector tiles). Default: none.
    fn optimize(&self, ast: &Arc<UOp>) -> Arc<UOp> {
        ast.clone()
    }

    /// Lines at the very top of the file (includes, pragmas).
    fn header(&self) -> String;

    /// The element type behind a buffer pointer (defaults to the register type).
    fn memory_type(&self, s: Scalar, p: &mut Prelude) -> String {
        self.scalar_type(s, p)
    }

    /// The type of `w` lanes of `s`.
    fn vector_type(&self, s: Scalar, w: u8, p: &mut Prelude) -> String;

    /// Lane `lane` of the vector expression `v` (of `dtype`), as a value of the lane's register type.
    fn lane(&self, v: &str, dtype: DType, lane: u8) -> String;

    /// A vector of `dtype` built from one expression per lane.
    fn vector_literal(&self, dtype: DType, lanes: &[String], p: &mut Prelude) -> String;

    /// Whether `a OP b` (or `OP a`) applies to whole vectors of `dtype` with the IR meaning.
    /// Asked only for ADD, SUB, MUL, DIV, AND, OR, XOR, NEG; everything else goes lane by lane.
    fn native_vector_op(&self, op: Op, dtype: DType) -> bool;

    /// A whole-vector spelling of ALU `op` on operands of `dtype` (e.g. a fused multiply-add
    /// intrinsic), with exactly the lane-by-lane semantics; `None` falls back to lanes.
    fn vector_alu(&self, _op: Op, _dtype: DType, _args: &[String], _p: &mut Prelude) -> Option<String> {
        None
    }

    /// Whether arithmetic on this float type is done in f32 (true for f16/bf16 unless native).
    fn float_via_f32(&self, s: Scalar) -> bool {
        matches!(s, Scalar::F16 | Scalar::BF16)
    }

    /// `e` (a value of `s`) as f32.
    fn to_f32(&self, e: &str, s: Scalar, p: &mut Prelude) -> String;

    /// `e` (an f32) rounded to `s`.
    #[allow(clippy::wrong_self_convention)] // "from f32" names the conversion, not a constructor
    fn from_f32(&self, e: &str, s: Scalar, p: &mut Prelude) -> String;

    /// A call of a math function on operands of the compute scalar `s`.
    fn math(&self, f: MathFn, s: Scalar, args: &[String], p: &mut Prelude) -> String;

    /// A scalar value conversion with the semantics in the module docs (`from != to`).
    fn cast(&self, e: &str, from: Scalar, to: Scalar, p: &mut Prelude) -> String;

    /// Reinterprets the bytes of `e` (equal sizes).
    ///
    /// # Errors
    /// [`Error::Render`] when the dialect cannot spell this reinterpretation.
    fn bitcast(&self, e: &str, from: DType, to: DType, p: &mut Prelude) -> Result<String>;

    /// A float constant of `s` (any value: finite, infinite or NaN with its payload).
    fn float_const(&self, v: f64, s: Scalar, p: &mut Prelude) -> String;

    /// An integer constant of `s`; `v` is already wrapped into `s`'s range.
    fn int_const(&self, v: i64, s: Scalar) -> String {
        c_int_literal(v, s)
    }

    /// The kernel's signature including the opening `{`.
    fn signature(&self, name: &str, params: &[KernelParam], vars: &[KernelVar], p: &mut Prelude) -> String;

    /// Statements at the start of the body (e.g. unpacking buffers and variables).
    fn prologue(&self, params: &[KernelParam], vars: &[KernelVar], p: &mut Prelude) -> Vec<String>;

    /// Statements that bring the launch indices into scope (each under its `name`). A line
    /// ending in `{` opens a block; the core closes them all at the end of the kernel.
    ///
    /// # Errors
    /// [`Error::Render`] when the dialect cannot launch this combination of indices (kinds,
    /// axes) on its backend.
    fn open_launch(&self, indices: &[LaunchIndex], p: &mut Prelude) -> Result<Vec<String>>;

    /// An expression loading a value of `dtype` (scalar or vector) from `addr`.
    fn load(&self, addr: &Address, dtype: DType, p: &mut Prelude) -> String;

    /// A statement (without the final `;`) storing `value` of `dtype` at `addr`.
    fn store(&self, addr: &Address, value: &str, dtype: DType, p: &mut Prelude) -> String;

    /// A statement like [`Dialect::store`] for a STORE hinted [`kiln_ir::StoreHint::NonTemporal`]: it
    /// may bypass the caches, and must store exactly the same bytes at any address `store`
    /// accepts (an address the non-temporal instruction cannot take gets a plain store).
    /// Such stores may be weakly ordered: a dialect that emits them makes them visible
    /// before the kernel (each of its calls) returns, with [`Dialect::kernel_end`]. The
    /// default is the plain store: backends without such stores ignore the hint.
    fn store_nontemporal(&self, addr: &Address, value: &str, dtype: DType, p: &mut Prelude) -> String {
        self.store(addr, value, dtype, p)
    }

    /// Statements at the very end of the kernel body, after the launch has closed: the
    /// place to publish what the body's stores left pending (e.g. a store fence after
    /// non-temporal stores; `p` says which helpers the body used). Default: none.
    fn kernel_end(&self, _p: &mut Prelude) -> Vec<String> {
        Vec::new()
    }

    /// A declaration (without the final `;`) of work-group local memory: an array `name` of
    /// `len` elements of `s` in memory representation ([`Dialect::memory_type`]), shared by
    /// the work items of one group and uninitialised (OpenCL `__local T name[len]`, CUDA
    /// `__shared__ T name[len]`); `None` where the language declares it outside the kernel
    /// (registered in the prelude). Loads and stores reach it through an [`Address`] whose
    /// space is [`AddrSpace::Local`]. The default refuses: a backend without work groups.
    ///
    /// # Errors
    /// [`Error::Render`] when the backend has no work-group local memory (the default).
    fn local_memory(&self, _name: &str, _s: Scalar, _len: usize, _p: &mut Prelude) -> Result<Option<String>> {
        Err(Error::Render(
            "work-group local memory (DEFINE_LOCAL) needs a backend with work groups, which this one is not: \
             run the kernel on OpenCL, CUDA or WebGPU"
                .into(),
        ))
    }

    /// A work-group barrier statement (without the final `;`) with BARRIER's meaning: every
    /// work item of the group arrives before any continues, and the local and global memory
    /// stores made before it by any item of the group are visible to every item's loads
    /// after it (OpenCL `barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)`, CUDA
    /// `__syncthreads()`). The core never places one where only some items of a group
    /// arrive (inside an IF block). The default refuses: a backend without work groups.
    ///
    /// # Errors
    /// [`Error::Render`] when the backend has no work groups (the default).
    fn barrier(&self, _p: &mut Prelude) -> Result<String> {
        Err(Error::Render(
            "a work-group barrier (BARRIER) needs a backend with work groups, which this one is not: \
             run the kernel on OpenCL, CUDA or WebGPU"
                .into(),
        ))
    }

    /// `D = A·B + C` ([`Op::Wmma`]) as an expression of the D fragment's type (the vector of
    /// `w.acc` lanes that C is), from `args`, the A, B and C fragment expressions. A dialect
    /// renders exactly the forms its device declares (`DeviceProperties::wmma`), with the
    /// layout and arithmetic of [`kiln_ir::wmma`]; typically a helper function registered in
    /// the prelude, one per distinct form. The default refuses: a backend without a matrix
    /// unit.
    ///
    /// # Errors
    /// [`Error::Render`] naming the form when the backend does not render it.
    fn wmma(&self, w: &Wmma, _args: &[String; 3], _p: &mut Prelude) -> Result<String> {
        Err(unsupported_wmma(w, "this backend declares no matrix unit"))
    }
}

/// The error of a dialect that does not render the WMMA form `w`, saying `why` and what to do.
pub fn unsupported_wmma(w: &Wmma, why: &str) -> Error {
    Error::Render(format!(
        "unsupported op WMMA {w}: {why}; the device's properties (`wmma`) list the forms it renders: use one of \
         those, or write the contraction as MULACC loops"
    ))
}

/// How a language writes its statements and the few expressions whose form differs between
/// the languages on the core: declarations, selects, loops, gated loads and stores, element
/// addresses, shifts and the wrap of narrow integers. Every method but
/// [`Syntax::scalar_type`] has C's spelling as its default, so a C-family dialect only names
/// its types; WGSL overrides the rest. Expressions returned must be self-contained
/// (parenthesized where precedence could matter); statements end in `;` or `}`.
pub trait Syntax {
    /// The register type of a scalar (`float`, `int32_t`, `bool`, `f32`, ...).
    fn scalar_type(&self, s: Scalar, p: &mut Prelude) -> String;

    /// The name of the kernel variable `ir_name`, `position` in the launch's `vals`.
    fn var_name(&self, ir_name: &str, position: usize) -> String {
        var_c_name(ir_name, position)
    }

    /// Where buffer parameter `param` starts: its name, at element `0`.
    fn buffer(&self, param: &KernelParam) -> Address {
        Address { base: param.name.clone(), index: "0".into(), scalar: param.scalar, space: param.space }
    }

    /// The address of element `index` past `base` (INDEX). C takes the base's own element
    /// offset into a pointer.
    fn element(&self, base: Address, index: String, scalar: Scalar, space: AddrSpace) -> Address {
        let base = if base.index == "0" { base.base } else { base.pointer() };
        Address { base, index, scalar, space }
    }

    /// A declaration of `name` of type `ty`, never assigned again.
    fn declare(&self, ty: &str, name: &str, init: &str) -> String {
        format!("const {ty} {name} = {init};")
    }

    /// A declaration of the variable `name` of type `ty` (an accumulator, a carried value).
    fn declare_mut(&self, ty: &str, name: &str, init: &str) -> String {
        format!("{ty} {name} = {init};")
    }

    /// `t` where `cond` holds, else `f`; both may be evaluated.
    fn select(&self, cond: &str, t: &str, f: &str) -> String {
        format!("({cond} ? {t} : {f})")
    }

    /// A statement that runs only where `gate` holds.
    fn gated(&self, gate: &str, stmt: &str) -> String {
        format!("if ({gate}) {stmt}")
    }

    /// The declaration of `name` (type `ty`): `load` where `gate` holds, else `alt`. The
    /// load must not run where the gate is false.
    fn gated_load(&self, ty: &str, name: &str, load: &str, alt: &str, gate: &str) -> Vec<String> {
        vec![self.declare(ty, name, &self.select(gate, load, alt))]
    }

    /// The line that opens the loop of `range` over `index` (type `ty`) from 0 to `extent`.
    fn open_loop(&self, _range: &UOp, ty: &str, index: &str, extent: &str) -> String {
        format!("for ({ty} {index} = 0; {index} < {extent}; {index}++) {{")
    }

    /// The lines of a loop's body as it closes (`pad`: their indentation), given those the
    /// core wrote for it; a language that repeats the body (unrolling) rewrites them here.
    fn close_loop(&self, _range: &UOp, _index: &str, _extent: &str, body: Vec<String>, _pad: &str) -> Vec<String> {
        body
    }

    /// SHL or SHR (`op`) of `a` by `b` on integers of `s`: the count taken modulo the bit
    /// width; SHL of signed values shifts the unsigned bits (C's signed overflow is undefined).
    fn shift(&self, op: Op, s: Scalar, a: &str, b: &str, p: &mut Prelude) -> String {
        let mask = s.size() * 8 - 1;
        if op == Op::Shr {
            return format!("({a} >> ({b} & {mask}))");
        }
        if !s.is_signed() {
            return format!("({a} << ({b} & {mask}))");
        }
        let (st, ut) = (self.scalar_type(s, p), self.scalar_type(unsigned_of(s), p));
        format!("(({st})(({ut}){a} << ({b} & {mask})))")
    }

    /// `e`, the result of an operation on bools or integers narrower than 32 bits (which a
    /// language may compute in wider registers), brought back into the range of `s`.
    fn wrap(&self, e: &str, s: Scalar, p: &mut Prelude) -> String {
        format!("(({}){e})", self.scalar_type(s, p))
    }

    /// A language's own spelling of ALU `op` on scalar operands of `s`, where the core's
    /// would not have the IR meaning in it (e.g. float comparisons that must hold for NaN
    /// by their bits); `None` takes the core's.
    fn scalar_op(&self, _op: Op, _s: Scalar, _args: &[String], _p: &mut Prelude) -> Option<String> {
        None
    }
}

/// The unsigned integer type of the same size.
fn unsigned_of(s: Scalar) -> Scalar {
    match s {
        Scalar::I8 => Scalar::U8,
        Scalar::I16 => Scalar::U16,
        Scalar::I32 => Scalar::U32,
        Scalar::I64 => Scalar::U64,
        other => other,
    }
}
