//! The C-family renderer core: one walk over a kernel's linear order, spelled by a [`Dialect`].
//!
//! [`CStyle`] turns a kernel (a SINK) into C-like source plus its [`ProgramSpec`]. Everything
//! that is the same in every C family member lives here: naming, scoping, loops and
//! accumulators, the meaning of every op. A dialect (C for the CPU, OpenCL C, ...) only
//! says how things are *spelled*: type names, vector syntax, the kernel signature, how launch
//! indices come into being, math function names, conversions, loads and stores.
//!
//! # Emission model
//! - CONST, PARAM, DEFINE_VAR, SPECIAL, INDEX, BIND and AFTER are inline expressions; every
//!   other value gets one `const` declaration (`alu3`, `val0`, `cast1`, ...), so every
//!   expression is self-contained and operator precedence never matters.
//! - The nodes the SPECIAL extents depend on are emitted first (the kernel prologue), then
//!   [`Dialect::open_launch`] introduces the launch indices (the CPU opens loops there, OpenCL
//!   reads work-item ids), then the rest of the kernel in linear order.
//! - RANGE opens `for (ridxN = 0; ridxN < extent; ridxN++) {`; the first END naming it closes it.
//!   IF opens `if (cond) {`; its ENDIF closes it.
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

pub mod gpu;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kiln_ir::{AddrSpace, Arg, ContentHash, DType, DeviceSpec, Op, Scalar, StoreHint, UOp, linearize, validate};

use crate::error::{Error, Result};
use crate::program::{ProgramSpec, special_axis};

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
}

/// A kernel buffer parameter as the signature/prologue sees it.
#[derive(Clone, Debug)]
pub struct KernelParam {
    /// The positional index of the buffer in a launch ([`ProgramSpec::globals`] order).
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

/// How one C-family language spells things. See the module docs for what the core decides.
///
/// Methods get the [`Prelude`] to register helper definitions they use. Expressions returned
/// must be self-contained (parenthesized where precedence could matter).
pub trait Dialect {
    /// Lines at the very top of the file (includes, pragmas).
    fn header(&self) -> String;

    /// The register type of a scalar (`float`, `int32_t`, `bool`, ...).
    fn scalar_type(&self, s: Scalar, p: &mut Prelude) -> String;

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

    /// A statement like [`Dialect::store`] for a STORE hinted [`StoreHint::NonTemporal`]: it
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
    /// `__shared__ T name[len]`). Loads and stores reach it through an [`Address`] whose
    /// space is [`AddrSpace::Local`]. The default refuses: a backend without work groups.
    ///
    /// # Errors
    /// [`Error::Render`] when the backend has no work-group local memory (the default).
    fn local_memory(&self, _name: &str, _s: Scalar, _len: usize, _p: &mut Prelude) -> Result<String> {
        Err(Error::Render(
            "work-group local memory (DEFINE_LOCAL) needs a backend with work groups, which this one is not: \
             run the kernel on OpenCL or CUDA"
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
             run the kernel on OpenCL or CUDA"
                .into(),
        ))
    }
}

/// Renders kernels with one dialect for one device family.
#[derive(Debug, Clone)]
pub struct CStyle<D> {
    /// How the target language spells things.
    pub dialect: D,
    /// The device family every rendered [`ProgramSpec`] is for.
    pub device: DeviceSpec,
}

impl<D: Dialect> CStyle<D> {
    /// A renderer for `device` in `dialect`; rendering keeps no state between kernels, so one
    /// renderer serves every thread.
    pub fn new(dialect: D, device: DeviceSpec) -> Self {
        CStyle { dialect, device }
    }

    /// Renders the kernel rooted at `ast` (a SINK). The entry point is `name` made into a C
    /// identifier, or `k_` plus the start of the kernel's content hash. Metadata comes from
    /// [`ProgramSpec::from_sink`]. A kernel this core or the dialect cannot express is an
    /// [`Error::Render`] naming the node; a malformed kernel is the validator's error.
    ///
    /// # Errors
    /// [`Error::Render`] as above (also for a root that is not a SINK); [`Error::Ir`] when
    /// the kernel fails validation or linearization; the errors of
    /// [`ProgramSpec::from_sink`].
    pub fn render(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        if ast.op() != Op::Sink {
            return Err(Error::Render(format!("a kernel is rooted at SINK, got {}", ast.op())));
        }
        validate(ast)?;
        let name = kernel_name(name, ast);
        let mut spec = ProgramSpec::from_sink(&name, String::new(), self.device.clone(), ast)?;
        let linear = linearize(ast)?;
        spec.src = Emitter::new(&self.dialect).run(&spec, &linear)?;
        Ok(spec)
    }
}

/// A C identifier for the entry point.
pub fn kernel_name(name: Option<&str>, ast: &UOp) -> String {
    match name {
        Some(n) if !n.is_empty() => {
            let mut s: String =
                n.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
            if s.starts_with(|c: char| c.is_ascii_digit()) || is_reserved(&s) {
                s.insert_str(0, "k_");
            }
            s
        }
        _ => format!("k_{}", &ast.content_hash().to_hex()[..12]),
    }
}

/// Names the core generates or the dialects use, plus C/OpenCL keywords: a variable may not
/// take one of these as its C name.
fn is_reserved(name: &str) -> bool {
    const WORDS: &[&str] = &[
        "auto",
        "break",
        "case",
        "char",
        "const",
        "continue",
        "default",
        "do",
        "double",
        "else",
        "enum",
        "extern",
        "float",
        "for",
        "goto",
        "if",
        "inline",
        "int",
        "long",
        "register",
        "restrict",
        "return",
        "short",
        "signed",
        "sizeof",
        "static",
        "struct",
        "switch",
        "typedef",
        "union",
        "unsigned",
        "void",
        "volatile",
        "while",
        "bool",
        "true",
        "false",
        "half",
        "uint",
        "ulong",
        "uchar",
        "ushort",
        "kernel",
        "global",
        "local",
        "constant",
        "private",
        "main",
        "bufs",
        "vals",
        "core_id",
        "NULL",
        "INFINITY",
        "NAN",
        "memcpy",
        "size_t",
        // C++ keywords and CUDA built-in variables (the CUDA dialect is C++).
        "class",
        "new",
        "delete",
        "this",
        "template",
        "typename",
        "namespace",
        "using",
        "operator",
        "public",
        "protected",
        "virtual",
        "friend",
        "mutable",
        "explicit",
        "try",
        "catch",
        "throw",
        "nullptr",
        "asm",
        "and",
        "or",
        "not",
        "xor",
        "threadIdx",
        "blockIdx",
        "blockDim",
        "gridDim",
        "warpSize",
        // C23 keywords (the default of newer C compilers; GNU C has `typeof` in every mode).
        "typeof",
        "typeof_unqual",
        "alignas",
        "alignof",
        "constexpr",
        "static_assert",
        "thread_local",
        // More C++ keywords and alternative tokens, and CUDA's `dim3`.
        "decltype",
        "noexcept",
        "concept",
        "requires",
        "consteval",
        "constinit",
        "co_await",
        "co_yield",
        "co_return",
        "static_cast",
        "dynamic_cast",
        "reinterpret_cast",
        "const_cast",
        "typeid",
        "export",
        "bitand",
        "bitor",
        "compl",
        "and_eq",
        "or_eq",
        "xor_eq",
        "not_eq",
        "dim3",
        // Reserved by OpenCL C.
        "complex",
        "imaginary",
        "quad",
        "generic",
        "read_only",
        "write_only",
        "read_write",
        "vec_step",
        "MAXFLOAT",
        // A macro PoCL's OpenCL C headers define.
        "INTTYPE",
        // A macro in CUDA.
        "assert",
    ];
    // C reserves names starting with `_` at file scope, where kernels are (`_Bool`,
    // `_mm256_max_ps`); OpenCL C predefines macros that start with a word in capitals and an
    // `_` (`M_PI`, `FLT_MAX`, `CLK_RGBx`) or with `cl_` (`cl_khr_fp64`).
    let macro_like = name.starts_with("cl_")
        || name.split_once('_').is_some_and(|(head, _)| {
            head.starts_with(|c: char| c.is_ascii_uppercase())
                && head.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        });
    if WORDS.contains(&name)
        || name.starts_with('_')
        || macro_like
        || is_vector_type(name)
        || name.starts_with("kiln_")
        || name.ends_with("_t")
    {
        return true;
    }
    if is_builtin_function(name) {
        return true;
    }
    const PREFIXES: &[&str] =
        &["alu", "val", "cast", "acc", "vec", "gep", "end", "ridx", "data", "gidx", "lidx", "idx", "lmem", "var"];
    PREFIXES
        .iter()
        .any(|p| name.strip_prefix(p).is_some_and(|rest| rest.chars().next().is_none_or(|c| c.is_ascii_digit())))
}

/// OpenCL C and CUDA vector and matrix type names: `float4`, `uint8`, `half16`, `float4x4`,
/// `longlong2`.
fn is_vector_type(name: &str) -> bool {
    const SCALARS: &[&str] = &[
        "char",
        "uchar",
        "short",
        "ushort",
        "int",
        "uint",
        "long",
        "ulong",
        "longlong",
        "ulonglong",
        "float",
        "double",
        "half",
        "bool",
    ];
    SCALARS.iter().any(|s| {
        name.strip_prefix(s).is_some_and(|rest| {
            rest.starts_with(|c: char| c.is_ascii_digit()) && rest.chars().all(|c| c.is_ascii_digit() || c == 'x')
        })
    })
}

/// C library and OpenCL C built-in functions: a kernel or variable of that name would clash
/// with (or shadow) the function, e.g. a kernel named `dot` in OpenCL C.
fn is_builtin_function(name: &str) -> bool {
    const FUNCTIONS: &[&str] = &[
        "abs",
        "fabs",
        "exp",
        "exp2",
        "exp10",
        "expm1",
        "log",
        "log2",
        "log10",
        "log1p",
        "sqrt",
        "rsqrt",
        "cbrt",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "atan2",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "pow",
        "pown",
        "powr",
        "rootn",
        "floor",
        "ceil",
        "round",
        "rint",
        "trunc",
        "fmod",
        "remainder",
        "fma",
        "mad",
        "hypot",
        "fmin",
        "fmax",
        "fdim",
        "frexp",
        "ldexp",
        "modf",
        "erf",
        "erfc",
        "tgamma",
        "lgamma",
        "sincos",
        "copysign",
        "nextafter",
        "nan",
        "isnan",
        "isinf",
        "isfinite",
        "signbit",
        "min",
        "max",
        "clamp",
        "mix",
        "step",
        "smoothstep",
        "sign",
        "degrees",
        "radians",
        "dot",
        "cross",
        "length",
        "distance",
        "normalize",
        "select",
        "bitselect",
        "any",
        "all",
        "shuffle",
        "shuffle2",
        "barrier",
        "printf",
        "malloc",
        "calloc",
        "realloc",
        "free",
        "exit",
        "abort",
        "memset",
        "memmove",
        "memcmp",
        "strlen",
        "rotate",
        "clz",
        "ctz",
        "popcount",
        "mul24",
        "mad24",
        "upsample",
        "hadd",
        "rhadd",
        "prefetch",
        "work_group_barrier",
        // The rest of OpenCL C's built-in functions, and CUDA's device functions.
        "abs_diff",
        "acospi",
        "add_sat",
        "asinpi",
        "atan2pi",
        "atanpi",
        "bit_reverse",
        "bitfield_extract_signed",
        "bitfield_extract_unsigned",
        "bitfield_insert",
        "capture_event_profiling_info",
        "cospi",
        "create_user_event",
        "enqueue_marker",
        "fast_distance",
        "fast_length",
        "fast_normalize",
        "fract",
        "ilogb",
        "is_valid_event",
        "is_valid_reserve_id",
        "isequal",
        "isgreater",
        "isgreaterequal",
        "isless",
        "islessequal",
        "islessgreater",
        "isnormal",
        "isnotequal",
        "isordered",
        "isunordered",
        "lgamma_r",
        "logb",
        "mad_hi",
        "mad_sat",
        "maxmag",
        "minmag",
        "mul_hi",
        "release_event",
        "remquo",
        "retain_event",
        "set_user_event_status",
        "sinpi",
        "sub_sat",
        "tanpi",
        "clock",
        "clock64",
        "norm",
        "norm3d",
        "norm4d",
        "rnorm",
        "rnorm3d",
        "rnorm4d",
        "rhypot",
        "fdivide",
        "sincospi",
        "erfinv",
        "erfcinv",
        "erfcx",
        "normcdf",
        "normcdfinv",
        "j0",
        "j1",
        "jn",
        "y0",
        "y1",
        "yn",
        "cyl_bessel_i0",
        "cyl_bessel_i1",
        "lrint",
        "llrint",
        "lround",
        "llround",
        "scalbn",
        "scalbln",
        "nearbyint",
        "rcbrt",
        "umin",
        "umax",
        "llmin",
        "llmax",
        "ullmin",
        "ullmax",
        "umul24",
        "mulhi",
        "umulhi",
        "mul64hi",
        "umul64hi",
        "labs",
        "llabs",
    ];
    const PREFIXES: &[&str] = &[
        "get_",
        "convert_",
        "as_",
        "vload",
        "vstore",
        "atomic_",
        "atom_",
        "native_",
        "half_",
        "mem_fence",
        "read_mem_fence",
        "write_mem_fence",
        "read_image",
        "write_image",
        "async_work_group",
        "wait_group",
        "sub_group",
        "work_group_",
        "amd_",
        "intel_",
        "arm_",
        "dot_",
    ];
    let base = name.strip_suffix(['f', 'l']).filter(|b| FUNCTIONS.contains(b)).unwrap_or(name);
    FUNCTIONS.contains(&base) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The C name of the variable `ir_name` at `position`: the name itself when it is a plain,
/// unreserved identifier, else `var<position>_<name>`, which no variable's own name can be
/// (`var` and a digit is reserved), so two variables never share a C name.
fn var_c_name(ir_name: &str, position: usize) -> String {
    let clean = !ir_name.is_empty()
        && ir_name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !ir_name.starts_with(|c: char| c.is_ascii_digit());
    if clean && !is_reserved(ir_name) {
        ir_name.to_string()
    } else {
        let s: String = ir_name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
        format!("var{position}_{s}")
    }
}

/// A C99 integer literal of `s` (`v` already in range).
pub fn c_int_literal(v: i64, s: Scalar) -> String {
    match s {
        Scalar::I64 if v == i64::MIN => "(-9223372036854775807LL - 1)".into(),
        Scalar::I64 if v < 0 => format!("({v}LL)"),
        Scalar::I64 => format!("{v}LL"),
        Scalar::U64 => format!("{}ULL", v as u64),
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

/// `v` rounded to f32 with round-to-odd: `v` itself when it is an f32, else whichever of its
/// two f32 neighbours has an odd last bit. Rounding that once more to a format with at least
/// two fewer mantissa bits (f16, bf16) gives exactly the correctly rounded value of `v`. It is
/// the step `half`'s own `from_f64` lacks: that rounds through a plain f32 (with F16C) or drops
/// the low 32 bits of `v`, so a value just above a tie rounds down in f16 although the C
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

/// The value of a node as later nodes refer to it.
#[derive(Clone, Debug)]
enum Value {
    Expr(String),
    Addr(Address),
}

/// An open block: a loop or an IF block (`range`: its RANGE or IF) or the kernel body (`None`).
struct Block {
    range: Option<ContentHash>,
    /// Accumulator write-backs `(acc, value)` deferred to the end of this block.
    commits: Vec<(String, String)>,
}

/// A valued END that is not an accumulator: `name` is declared before the loop of `range`
/// and set to the value of `value` at the end of every iteration.
#[derive(Clone)]
struct Carry {
    name: String,
    value: ContentHash,
    dtype: DType,
}

struct Emitter<'a, D: ?Sized> {
    d: &'a D,
    p: Prelude,
    values: HashMap<ContentHash, Value>,
    lines: Vec<String>,
    indent: usize,
    blocks: Vec<Block>,
    counters: HashMap<&'static str, usize>,
    used_names: HashSet<String>,
    carries: HashMap<ContentHash, Vec<Carry>>,
}

fn render_err(node: &UOp, msg: impl std::fmt::Display) -> Error {
    Error::Render(format!("{} {}: {msg}", node.op(), node.dtype()))
}

impl<'a, D: Dialect + ?Sized> Emitter<'a, D> {
    fn new(d: &'a D) -> Self {
        Emitter {
            d,
            p: Prelude::default(),
            values: HashMap::new(),
            lines: Vec::new(),
            indent: 1,
            blocks: vec![Block { range: None, commits: Vec::new() }],
            counters: HashMap::new(),
            used_names: HashSet::new(),
            carries: HashMap::new(),
        }
    }

    fn run(mut self, spec: &ProgramSpec, linear: &[Arc<UOp>]) -> Result<String> {
        for n in linear {
            if matches!(n.op(), Op::Program | Op::Device | Op::Linear | Op::Source | Op::Binary) {
                return Err(render_err(n, "compiled-program stages cannot appear inside a kernel"));
            }
        }
        // Parameters and variables: names and declarations.
        let mut params: Vec<KernelParam> = spec
            .params
            .iter()
            .map(|pi| KernelParam {
                slot: pi.slot,
                name: format!("data{}", pi.slot),
                scalar: pi.scalar,
                space: AddrSpace::Global,
                written: spec.outs.contains(&pi.slot),
                read: spec.ins.contains(&pi.slot),
            })
            .collect();
        let mut vars: Vec<KernelVar> = Vec::new();
        for n in linear {
            match (n.op(), n.arg()) {
                (Op::Param, Arg::Int(slot)) => {
                    if let (DType::Ptr { space, .. }, Some(kp)) =
                        (n.dtype(), params.iter_mut().find(|kp| kp.slot as i64 == *slot))
                    {
                        kp.space = space;
                        self.values.insert(n.content_hash(), Value::Expr(kp.name.clone()));
                    }
                }
                (Op::DefineVar, Arg::Var { name, .. }) => {
                    let position = spec.var_names.iter().position(|v| v == name).unwrap_or(0);
                    let c_name = var_c_name(name, position);
                    if !vars.iter().any(|v| v.ir_name == *name) {
                        vars.push(KernelVar {
                            name: c_name.clone(),
                            ir_name: name.clone(),
                            dtype: n.dtype(),
                            position,
                        });
                    }
                    self.values.insert(n.content_hash(), Value::Expr(c_name));
                }
                _ => {}
            }
        }
        vars.sort_by_key(|v| v.position);
        for name in params.iter().map(|p| &p.name).chain(vars.iter().map(|v| &v.name)) {
            self.used_names.insert(name.clone());
        }

        // Launch indices, and the nodes their extents need (emitted before the launch opens).
        let specials: Vec<&Arc<UOp>> = linear.iter().filter(|n| n.op() == Op::Special).collect();
        let mut seen_names: HashMap<String, ContentHash> = HashMap::new();
        let mut slots: HashMap<(char, usize), String> = HashMap::new();
        for s in &specials {
            let name = s.arg_name().unwrap_or_default().to_string();
            let (kind, axis) =
                special_axis(&name).ok_or_else(|| render_err(s, format!("unknown launch index `{name}`")))?;
            if seen_names.insert(name.clone(), s.content_hash()).is_some_and(|h| h != s.content_hash()) {
                return Err(render_err(s, format!("launch index `{name}` appears with two different extents")));
            }
            let global_kind = if kind == 'l' { 'l' } else { 'g' };
            if let Some(other) = slots.insert((global_kind, axis), name.clone())
                && other != name
            {
                return Err(render_err(s, format!("`{other}` and `{name}` both claim launch axis {axis}")));
            }
            self.values.insert(s.content_hash(), Value::Expr(name.clone()));
            self.used_names.insert(name);
        }
        let direct = specials.iter().any(|s| s.arg_name().is_some_and(|n| n.starts_with("idx")));
        if direct && slots.keys().any(|(k, _)| *k == 'l') {
            return Err(Error::Render("direct launch indices (idxN) cannot be mixed with local ones (lidxN)".into()));
        }
        if let Some(n) = linear.iter().find(|n| matches!(n.op(), Op::DefineLocal | Op::Barrier))
            && direct
        {
            return Err(render_err(
                n,
                "work-group local memory and barriers need work groups: launch with gidxN/lidxN, not idxN",
            ));
        }
        // Launch extents and local memory come before the launch indices open.
        let mut hoisted = extent_closure(&specials)?;
        hoisted.extend(linear.iter().filter(|n| n.op() == Op::DefineLocal).map(|n| n.content_hash()));

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

        let mut head = String::new();
        let signature = self.d.signature(&spec.name, &params, &vars, &mut self.p);
        for line in self.d.prologue(&params, &vars, &mut self.p) {
            self.line(line);
        }
        for n in linear.iter().filter(|n| hoisted.contains(&n.content_hash())) {
            self.node(n)?;
        }
        let mut indices = Vec::new();
        for s in &specials {
            let name = s.arg_name().unwrap_or_default().to_string();
            let (kind, axis) = special_axis(&name).unwrap_or(('g', 0));
            let extent = self.expr(&s.src()[0])?;
            indices.push(LaunchIndex { name, kind, axis, dtype: s.dtype(), extent });
        }
        let launch = self.d.open_launch(&indices, &mut self.p)?;
        let mut launch_depth = 0;
        for line in launch {
            let opens = line.trim_end().ends_with('{');
            self.line(line);
            if opens {
                self.indent += 1;
                launch_depth += 1;
            }
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
        for _ in 0..launch_depth {
            self.indent -= 1;
            self.line("}".into());
        }
        for line in self.d.kernel_end(&mut self.p) {
            self.line(line);
        }

        head.push_str(&self.d.header());
        if !head.ends_with('\n') {
            head.push('\n');
        }
        for item in self.p.items() {
            head.push_str(item);
            if !item.ends_with('\n') {
                head.push('\n');
            }
        }
        head.push('\n');
        head.push_str(&signature);
        head.push('\n');
        for l in &self.lines {
            head.push_str(l);
            head.push('\n');
        }
        head.push_str("}\n");
        Ok(head)
    }

    fn line(&mut self, text: String) {
        self.lines.push(format!("{}{text}", "  ".repeat(self.indent)));
    }

    /// A new name `{prefix}{N}` not used anywhere in the kernel.
    fn fresh(&mut self, prefix: &'static str) -> String {
        loop {
            let c = self.counters.entry(prefix).or_insert(0);
            let name = format!("{prefix}{c}");
            *c += 1;
            if self.used_names.insert(name.clone()) {
                return name;
            }
        }
    }

    fn value(&self, n: &UOp) -> Result<Value> {
        self.values.get(&n.content_hash()).cloned().ok_or_else(|| render_err(n, "used before it is defined"))
    }

    /// The node as a value expression (pointers become `base + index`).
    fn expr(&mut self, n: &UOp) -> Result<String> {
        if n.op() == Op::Const {
            return self.constant(n);
        }
        Ok(match self.value(n)? {
            Value::Expr(e) => e,
            Value::Addr(a) => a.pointer(),
        })
    }

    fn address(&mut self, n: &UOp) -> Result<Address> {
        match self.value(n)? {
            Value::Addr(a) => Ok(a),
            Value::Expr(base) => match n.dtype() {
                DType::Ptr { scalar, space, .. } => Ok(Address { base, index: "0".into(), scalar, space }),
                other => Err(render_err(n, format!("is used as an address but has dtype {other}"))),
            },
        }
    }

    fn ty(&mut self, n: &UOp, dt: DType) -> Result<String> {
        match dt {
            DType::Scalar(s) => Ok(self.d.scalar_type(s, &mut self.p)),
            DType::Vector(s, w) => Ok(self.d.vector_type(s, w, &mut self.p)),
            other => Err(render_err(n, format!("has no value type for {other}"))),
        }
    }

    fn declare(&mut self, n: &UOp, prefix: &'static str, init: String) -> Result<()> {
        let ty = self.ty(n, n.dtype())?;
        let name = self.fresh(prefix);
        self.line(format!("const {ty} {name} = {init};"));
        self.values.insert(n.content_hash(), Value::Expr(name));
        Ok(())
    }

    fn constant(&mut self, n: &UOp) -> Result<String> {
        let DType::Scalar(s) = n.dtype() else {
            return Err(render_err(n, "constants are scalars (broadcast vectors with VECTORIZE)"));
        };
        Ok(match n.arg() {
            Arg::Bool(b) => self.d.int_const(*b as i64, s),
            Arg::Int(v) => self.d.int_const(wrap_int(*v, s), s),
            Arg::Float(v) => self.d.float_const(*v, s, &mut self.p),
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
                let axis = n.arg_int().unwrap_or(0);
                let mut name = format!("ridx{}", axis.to_string().replace('-', "m"));
                if !self.used_names.insert(name.clone()) {
                    name = self.fresh("ridx");
                }
                for carry in self.carries.get(&n.content_hash()).cloned().unwrap_or_default() {
                    let end = self.carry_decl(n, &carry)?;
                    self.line(end);
                }
                self.line(format!("for ({ty} {name} = 0; {name} < {extent}; {name}++) {{"));
                self.indent += 1;
                self.blocks.push(Block { range: Some(n.content_hash()), commits: Vec::new() });
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
            Op::End | Op::EndIf => self.end(n)?,
            Op::If => {
                let cond = self.expr(&src[0])?;
                self.line(format!("if ({cond}) {{"));
                self.indent += 1;
                self.blocks.push(Block { range: Some(n.content_hash()), commits: Vec::new() });
            }
            Op::DefineLocal => {
                let (DType::Ptr { scalar, .. }, Some(len)) = (n.dtype(), src[0].arg_int()) else {
                    return Err(render_err(n, "local memory needs a pointer dtype and a constant size"));
                };
                let name = self.fresh("lmem");
                let len = usize::try_from(len).map_err(|_| render_err(n, format!("size {len} is not a size")))?;
                let decl = self.d.local_memory(&name, scalar, len, &mut self.p)?;
                self.line(format!("{decl};"));
                self.values.insert(n.content_hash(), Value::Expr(name));
            }
            Op::Barrier => {
                let stmt = self.d.barrier(&mut self.p)?;
                self.line(format!("{stmt};"));
            }
            Op::Index => {
                let base = self.address(&src[0])?;
                let idx = self.expr(&src[1])?;
                let DType::Ptr { scalar, space, .. } = n.dtype() else {
                    return Err(render_err(n, "INDEX must yield a pointer"));
                };
                let addr = if base.index == "0" {
                    Address { base: base.base, index: idx, scalar, space }
                } else {
                    Address { base: base.pointer(), index: idx, scalar, space }
                };
                self.values.insert(n.content_hash(), Value::Addr(addr));
            }
            Op::Load => {
                let addr = self.address(&src[0])?;
                let load = self.d.load(&addr, n.dtype(), &mut self.p);
                let init = if src.len() == 3 {
                    let (alt, gate) = (self.expr(&src[1])?, self.expr(&src[2])?);
                    format!("({gate} ? {load} : {alt})")
                } else {
                    load
                };
                self.declare(n, "val", init)?;
            }
            Op::Store => {
                let addr = self.address(&src[0])?;
                let value = self.expr(&src[1])?;
                let stmt = match n.store_hint() {
                    StoreHint::NonTemporal if addr.space == AddrSpace::Global => {
                        self.d.store_nontemporal(&addr, &value, src[1].dtype(), &mut self.p)
                    }
                    _ => self.d.store(&addr, &value, src[1].dtype(), &mut self.p),
                };
                if src.len() == 3 {
                    let gate = self.expr(&src[2])?;
                    self.line(format!("if ({gate}) {stmt};"));
                } else {
                    self.line(format!("{stmt};"));
                }
            }
            Op::DefineAcc => {
                let ty = self.ty(n, n.dtype())?;
                let init = self.expr(&src[0])?;
                let name = self.fresh("acc");
                self.line(format!("{ty} {name} = {init};"));
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
            Op::Cast => {
                let e = self.convert(n, &src[0])?;
                self.declare(n, "cast", e)?;
            }
            Op::Bitcast => {
                let v = self.expr(&src[0])?;
                let e = self.d.bitcast(&v, src[0].dtype(), n.dtype(), &mut self.p)?;
                self.declare(n, "cast", e)?;
            }
            Op::Vectorize => {
                let lanes: Vec<String> = if src.len() == 1 {
                    vec![self.expr(&src[0])?; n.dtype().width() as usize]
                } else {
                    src.iter().map(|s| self.expr(s)).collect::<Result<_>>()?
                };
                let e = self.d.vector_literal(n.dtype(), &lanes, &mut self.p);
                self.declare(n, "vec", e)?;
            }
            Op::Gep => {
                let v = self.expr(&src[0])?;
                let lane = n.arg_int().unwrap_or(0) as u8;
                let e = self.d.lane(&v, src[0].dtype(), lane);
                self.declare(n, "gep", e)?;
            }
            op => return Err(render_err(n, format!("{op} cannot be rendered"))),
        }
        Ok(())
    }

    fn value_or_const(&mut self, n: &UOp) -> Result<Value> {
        if n.op() == Op::Const { Ok(Value::Expr(self.constant(n)?)) } else { self.value(n) }
    }

    fn carry_decl(&mut self, range: &UOp, carry: &Carry) -> Result<String> {
        let dt = carry.dtype;
        let ty = self.ty(range, dt)?;
        let zero = match dt {
            DType::Scalar(s) => self.zero(s),
            DType::Vector(s, w) => {
                let z = self.zero(s);
                self.d.vector_literal(dt, &vec![z; w as usize], &mut self.p)
            }
            _ => return Err(render_err(range, format!("cannot carry a {dt} out of a loop"))),
        };
        Ok(format!("{ty} {} = {zero};", carry.name))
    }

    fn zero(&mut self, s: Scalar) -> String {
        if s.is_float() { self.d.float_const(0.0, s, &mut self.p) } else { self.d.int_const(0, s) }
    }

    fn end(&mut self, n: &Arc<UOp>) -> Result<()> {
        let range = n.src()[0].content_hash();
        if self.blocks.last().is_some_and(|b| b.range == Some(range)) {
            let block = self.blocks.pop().unwrap_or(Block { range: None, commits: Vec::new() });
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
                    Some(Value::Addr(a)) => a.pointer(),
                    None => return Err(render_err(n, "the value carried out of the loop is not defined in it")),
                };
                self.line(format!("{name} = {v};"));
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
            // The END's value is the accumulator after its updates: write back any update
            // still pending in an enclosing block (one the linearizer placed outside the loop).
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

    /// CAST of `src` to `n.dtype()`.
    fn convert(&mut self, n: &UOp, src: &UOp) -> Result<String> {
        let v = self.expr(src)?;
        match (src.dtype(), n.dtype()) {
            (DType::Scalar(a), DType::Scalar(b)) => Ok(if a == b { v } else { self.d.cast(&v, a, b, &mut self.p) }),
            (DType::Vector(a, w), DType::Vector(b, _)) => {
                if a == b {
                    return Ok(v);
                }
                let lanes: Vec<String> = (0..w)
                    .map(|i| {
                        let l = self.d.lane(&v, src.dtype(), i);
                        self.d.cast(&l, a, b, &mut self.p)
                    })
                    .collect();
                Ok(self.d.vector_literal(n.dtype(), &lanes, &mut self.p))
            }
            (a, b) => Err(render_err(n, format!("cannot cast {a} to {b}"))),
        }
    }

    fn alu(&mut self, n: &UOp, op: Op, args: &[(String, DType)]) -> Result<String> {
        let operand = args.get(if op == Op::Where { 1 } else { 0 }).map(|a| a.1).unwrap_or(DType::Void);
        match operand {
            DType::Scalar(s) => {
                let exprs: Vec<String> = args.iter().map(|a| a.0.clone()).collect();
                self.scalar_alu(n, op, s, &exprs)
            }
            DType::Vector(s, w) => {
                if op == Op::Where && args[0].1 == DType::BOOL {
                    return Ok(format!("({} ? {} : {})", args[0].0, args[1].0, args[2].0));
                }
                let infix = matches!(op, Op::Add | Op::Sub | Op::Mul | Op::Div | Op::And | Op::Or | Op::Xor);
                if (infix || op == Op::Neg) && self.d.native_vector_op(op, operand) {
                    return Ok(if op == Op::Neg {
                        format!("(-{})", args[0].0)
                    } else {
                        format!("({} {} {})", args[0].0, infix_symbol(op), args[1].0)
                    });
                }
                let exprs: Vec<String> = args.iter().map(|a| a.0.clone()).collect();
                if let Some(e) = self.d.vector_alu(op, operand, &exprs, &mut self.p) {
                    return Ok(e);
                }
                let mut lanes = Vec::with_capacity(w as usize);
                for i in 0..w {
                    let exprs: Vec<String> = args.iter().map(|(e, dt)| self.d.lane(e, *dt, i)).collect();
                    lanes.push(self.scalar_alu(n, op, s, &exprs)?);
                }
                Ok(self.d.vector_literal(n.dtype(), &lanes, &mut self.p))
            }
            other => Err(render_err(n, format!("arithmetic on {other}"))),
        }
    }

    /// One lane of an ALU op on operands of scalar `s` (for WHERE: `s` is the value type).
    fn scalar_alu(&mut self, n: &UOp, op: Op, s: Scalar, args: &[String]) -> Result<String> {
        if op == Op::Where {
            return Ok(format!("({} ? {} : {})", args[0], args[1], args[2]));
        }
        let via = s.is_float() && self.d.float_via_f32(s);
        let cs = if via { Scalar::F32 } else { s };
        let a: Vec<String> =
            if via { args.iter().map(|e| self.d.to_f32(e, s, &mut self.p)).collect() } else { args.to_vec() };
        let math = |this: &mut Self, f: MathFn| this.d.math(f, cs, &a, &mut this.p);
        let bits = (s.size() * 8) as i64;
        let r = match op {
            Op::Neg if s == Scalar::Bool => format!("(!{})", a[0]),
            Op::Neg => format!("(-{})", a[0]),
            Op::Not if s == Scalar::Bool => format!("(!{})", a[0]),
            Op::Not => format!("(~{})", a[0]),
            Op::Sqrt => math(self, MathFn::Sqrt),
            Op::Exp2 => math(self, MathFn::Exp2),
            Op::Log2 => math(self, MathFn::Log2),
            Op::Exp => math(self, MathFn::Exp),
            Op::Log => math(self, MathFn::Log),
            Op::Sin => math(self, MathFn::Sin),
            Op::Cos => math(self, MathFn::Cos),
            Op::Trunc => math(self, MathFn::Trunc),
            Op::Recip => {
                let one = self.d.float_const(1.0, cs, &mut self.p);
                format!("({one} / {})", a[0])
            }
            Op::Abs if s.is_float() => math(self, MathFn::Fabs),
            Op::Abs if s.is_signed() => format!("({0} < 0 ? -{0} : {0})", a[0]),
            Op::Abs => a[0].clone(),
            Op::Max if s.is_float() => math(self, MathFn::Fmax),
            Op::Min if s.is_float() => math(self, MathFn::Fmin),
            Op::Max => format!("({0} > {1} ? {0} : {1})", a[0], a[1]),
            Op::Min => format!("({0} < {1} ? {0} : {1})", a[0], a[1]),
            Op::Pow => math(self, MathFn::Pow),
            Op::MulAcc if s.is_float() => math(self, MathFn::Fma),
            Op::MulAcc => format!("({} * {} + {})", a[0], a[1], a[2]),
            Op::Shl if s.is_signed() => {
                let (st, ut) = (self.d.scalar_type(s, &mut self.p), self.d.scalar_type(unsigned_of(s), &mut self.p));
                format!("(({st})(({ut}){} << ({} & {})))", a[0], a[1], bits - 1)
            }
            Op::Shl => format!("({} << ({} & {}))", a[0], a[1], bits - 1),
            Op::Shr => format!("({} >> ({} & {}))", a[0], a[1], bits - 1),
            Op::Idiv | Op::Mod if s.is_int() => self.int_division(n, op, s, &a[0], &a[1]),
            op if op.is_binary() => format!("({} {} {})", a[0], infix_symbol(op), a[1]),
            op => return Err(render_err(n, format!("{op} is not an ALU op on {s}"))),
        };
        if via && !op.is_comparison() {
            return Ok(self.d.from_f32(&r, s, &mut self.p));
        }
        // C promotes narrow integers and bools to int: bring the result back into the type so
        // lanes and inits hold exactly what the IR says.
        let wraps = matches!(op, Op::Neg | Op::Not | Op::Add | Op::Sub | Op::Mul | Op::Shl | Op::MulAcc | Op::Abs)
            || (s == Scalar::Bool && matches!(op, Op::And | Op::Or | Op::Xor | Op::Idiv | Op::Mod));
        if !op.is_comparison() && wraps && (s == Scalar::Bool || (s.is_int() && s.size() < 4)) {
            let t = self.d.scalar_type(s, &mut self.p);
            return Ok(format!("(({t}){r})"));
        }
        Ok(r)
    }

    /// IDIV or MOD of `x` by `d` (scalar `s`, an integer type) with the defined results of
    /// the module docs: `x / 0 == 0`, `x % 0 == x`, `MIN / -1 == MIN`, `MIN % -1 == 0`. The
    /// divisor is replaced by 1 where C would trap (a select, no branch), and the result by
    /// the defined value where the divisor is 0. A constant divisor other than 0 (and -1 for
    /// signed types) cannot trap: it stays a plain `/` or `%`, which compilers strength-reduce.
    fn int_division(&mut self, n: &UOp, op: Op, s: Scalar, x: &str, d: &str) -> String {
        let symbol = infix_symbol(op);
        let divisor = n.src().get(1).and_then(|d| const_int_operand(d));
        if divisor.is_some_and(|c| c != 0 && !(s.is_signed() && c == -1)) {
            return format!("({x} {symbol} {d})");
        }
        let (zero, one) = (self.d.int_const(0, s), self.d.int_const(1, s));
        let is_zero = format!("({d} == {zero})");
        let traps = match s.int_range() {
            Some((min, _)) if s.is_signed() => {
                let (min, minus_one) = (self.d.int_const(min as i64, s), self.d.int_const(-1, s));
                format!("({is_zero} | (({x} == {min}) & ({d} == {minus_one})))")
            }
            _ => is_zero.clone(),
        };
        let safe = format!("({x} {symbol} ({traps} ? {one} : {d}))");
        let by_zero = if op == Op::Idiv { zero } else { x.to_string() };
        format!("({is_zero} ? {by_zero} : {safe})")
    }
}

/// The integer value of an operand known when rendering: a CONST, or a VECTORIZE that
/// broadcasts one CONST.
fn const_int_operand(n: &UOp) -> Option<i64> {
    let c = match n.op() {
        Op::Vectorize if n.src().iter().all(|l| l.content_hash() == n.src()[0].content_hash()) => &n.src()[0],
        _ => n,
    };
    if c.op() == Op::Const { c.arg_int() } else { None }
}

fn infix_symbol(op: Op) -> &'static str {
    match op {
        Op::Add => "+",
        Op::Sub => "-",
        Op::Mul => "*",
        Op::Div | Op::Idiv => "/",
        Op::Mod => "%",
        Op::And => "&",
        Op::Or => "|",
        Op::Xor => "^",
        Op::Lt => "<",
        Op::Le => "<=",
        Op::Eq => "==",
        Op::Ne => "!=",
        _ => "?",
    }
}

/// The unsigned integer type of the same size.
pub fn unsigned_of(s: Scalar) -> Scalar {
    match s {
        Scalar::I8 => Scalar::U8,
        Scalar::I16 => Scalar::U16,
        Scalar::I32 => Scalar::U32,
        Scalar::I64 => Scalar::U64,
        other => other,
    }
}

/// The DEFINE_ACC a valued END (or ASSIGN/AFTER) stands for, if any.
fn acc_of(n: &Arc<UOp>) -> Option<Arc<UOp>> {
    let mut node = n.clone();
    loop {
        let next = match node.op() {
            Op::DefineAcc => return Some(node),
            Op::Assign | Op::After => node.src()[0].clone(),
            Op::End if node.dtype() != DType::Void && node.src().len() > 1 => node.src()[1].clone(),
            _ => return None,
        };
        node = next;
    }
}

/// Every node the SPECIAL extents depend on. They must be plain integer expressions over
/// constants and variables (they are evaluated before any launch index exists).
fn extent_closure(specials: &[&Arc<UOp>]) -> Result<HashSet<ContentHash>> {
    let mut out = HashSet::new();
    let mut stack: Vec<Arc<UOp>> = specials.iter().map(|s| s.src()[0].clone()).collect();
    while let Some(n) = stack.pop() {
        if !out.insert(n.content_hash()) {
            continue;
        }
        let ok = matches!(n.op(), Op::Const | Op::DefineVar | Op::Bind | Op::Cast) || n.op().is_alu();
        if !ok {
            return Err(render_err(
                &n,
                "a launch extent may only use constants, variables and arithmetic (no loads, loops or launch indices)",
            ));
        }
        stack.extend(n.src().iter().cloned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{KernelBuilder, Val};

    /// A minimal OpenCL-flavoured dialect: enough to check what the core decides.
    struct Toy;

    impl Dialect for Toy {
        fn header(&self) -> String {
            "// toy".into()
        }
        fn scalar_type(&self, s: Scalar, _: &mut Prelude) -> String {
            s.name().into()
        }
        fn vector_type(&self, s: Scalar, w: u8, p: &mut Prelude) -> String {
            let name = format!("{}x{w}", s.name());
            p.need(&name, |_| format!("typedef vec {}x{w};", s.name()));
            name
        }
        fn lane(&self, v: &str, _: DType, lane: u8) -> String {
            format!("{v}.s{lane}")
        }
        fn vector_literal(&self, dtype: DType, lanes: &[String], p: &mut Prelude) -> String {
            let t = match dtype {
                DType::Vector(s, w) => self.vector_type(s, w, p),
                _ => "?".into(),
            };
            format!("({t})({})", lanes.join(", "))
        }
        fn native_vector_op(&self, op: Op, _: DType) -> bool {
            op == Op::Add
        }
        fn to_f32(&self, e: &str, _: Scalar, _: &mut Prelude) -> String {
            format!("up({e})")
        }
        fn from_f32(&self, e: &str, _: Scalar, _: &mut Prelude) -> String {
            format!("down({e})")
        }
        fn math(&self, f: MathFn, _: Scalar, args: &[String], _: &mut Prelude) -> String {
            format!("{}({})", f.c_name(), args.join(", "))
        }
        fn cast(&self, e: &str, _: Scalar, to: Scalar, _: &mut Prelude) -> String {
            format!("convert_{}({e})", to.name())
        }
        fn bitcast(&self, e: &str, _: DType, to: DType, _: &mut Prelude) -> Result<String> {
            Ok(format!("as_{to}({e})"))
        }
        fn float_const(&self, v: f64, s: Scalar, _: &mut Prelude) -> String {
            c_float_literal(v, s)
        }
        fn signature(&self, name: &str, params: &[KernelParam], vars: &[KernelVar], _: &mut Prelude) -> String {
            let mut args: Vec<String> = params
                .iter()
                .map(|p| format!("{}{} *{}", if p.written { "" } else { "const " }, p.scalar.name(), p.name))
                .collect();
            args.extend(vars.iter().map(|v| format!("int {}", v.name)));
            format!("kernel void {name}({}) {{", args.join(", "))
        }
        fn prologue(&self, _: &[KernelParam], _: &[KernelVar], _: &mut Prelude) -> Vec<String> {
            Vec::new()
        }
        fn open_launch(&self, indices: &[LaunchIndex], _: &mut Prelude) -> Result<Vec<String>> {
            Ok(indices
                .iter()
                .map(|ix| format!("int {} = id('{}', {}); // < {}", ix.name, ix.kind, ix.axis, ix.extent))
                .collect())
        }
        fn load(&self, addr: &Address, _: DType, _: &mut Prelude) -> String {
            format!("{}[{}]", addr.base, addr.index)
        }
        fn store(&self, addr: &Address, value: &str, _: DType, _: &mut Prelude) -> String {
            format!("{}[{}] = {value}", addr.base, addr.index)
        }
    }

    fn render(sink: &Arc<UOp>) -> Result<ProgramSpec> {
        CStyle::new(Toy, DeviceSpec::new("CPU", 0)).render(sink, Some("k"))
    }

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
    }

    #[test]
    fn names_never_clash_with_builtin_functions() {
        let ast = UOp::index_const(0);
        assert_eq!(kernel_name(Some("dot"), &ast), "k_dot");
        assert_eq!(kernel_name(Some("expf"), &ast), "k_expf");
        assert_eq!(kernel_name(Some("get_sum"), &ast), "k_get_sum");
        // OpenCL C's and CUDA's own functions, and vendor extensions.
        for name in ["sinpi", "ilogb", "remquo", "norm3df", "norm3d", "clock64", "j0", "umin", "amd_bfe"] {
            assert_eq!(kernel_name(Some(name), &ast), format!("k_{name}"));
        }
        assert_eq!(kernel_name(Some("matmul"), &ast), "matmul");
        assert_eq!(kernel_name(Some("shelf"), &ast), "shelf");
    }

    /// Names a C, OpenCL C or CUDA compiler reads as a keyword, type or macro: as a kernel
    /// name (a `.kiln` file's stem) or a variable they made the generated source fail to compile.
    #[test]
    fn names_never_clash_with_keywords_or_types() {
        let ast = UOp::index_const(0);
        for name in [
            "_Bool",
            "_Complex",
            "_Generic",
            "_mm256_max_ps",
            "_x",
            "typeof",
            "alignas",
            "uint8",
            "float4x4",
            "M_PI",
            "FLT_MAX",
            "MAXFLOAT",
            "CLK_RGBx",
            "cl_khr_fp64",
            "read_only",
            "assert",
        ] {
            assert_eq!(kernel_name(Some(name), &ast), format!("k_{name}"));
            assert_eq!(var_c_name(name, 0), format!("var0_{name}"));
        }
        // A variable's own name never takes the name made for another (`var<position>_...`).
        assert_eq!(var_c_name("x!", 1), "var1_x_");
        assert_eq!(var_c_name("var1_x_", 0), "var0_var1_x_");
        for name in ["x_", "N", "Mx_1", "intx", "float_4", "integer", "uint8_", "halfway", "variance"] {
            assert_eq!(kernel_name(Some(name), &ast), name);
        }
    }

    #[test]
    fn names_and_literals() {
        let sink = UOp::new(Op::Sink, DType::Void, Arg::None, vec![]);
        assert_eq!(kernel_name(Some("my kernel-1"), &sink), "my_kernel_1");
        assert_eq!(kernel_name(Some("9lives"), &sink), "k_9lives");
        assert_eq!(kernel_name(Some("for"), &sink), "k_for");
        assert!(kernel_name(None, &sink).starts_with("k_"));
        assert_eq!(var_c_name("n", 0), "n");
        assert_eq!(var_c_name("alu3", 1), "var1_alu3");
        assert_eq!(var_c_name("a-b", 2), "var2_a_b");
        assert_eq!(c_int_literal(i64::MIN, Scalar::I64), "(-9223372036854775807LL - 1)");
        assert_eq!(c_int_literal(-1, Scalar::U64), "18446744073709551615ULL");
        assert_eq!(c_int_literal(wrap_int(300, Scalar::U8), Scalar::U8), "44");
        assert_eq!(c_float_literal(0.1, Scalar::F32), "0.1f");
        assert_eq!(c_float_literal(-2.5, Scalar::F64), "(-2.5)");
    }

    #[test]
    fn prelude_orders_dependencies_first_and_once() {
        let mut p = Prelude::default();
        p.need("b", |p| {
            p.need("a", |_| "A".into());
            "B".into()
        });
        p.need("a", |_| "A again".into());
        assert_eq!(p.items(), ["A", "B"]);
        assert!(p.contains("b"));
    }

    #[test]
    fn core_structure_hoists_extents_and_scopes_loops() {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 4, 1024);
        let (a, out) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
        let g = k.special("gidx0", &n / 4);
        let r = k.range(4);
        let acc = k.acc(&Val::f32(0.0), &[&r]);
        let total = acc.update(&(acc.get() + a.at(&(&g * 4 + &r)).load()));
        k.store(&out.at(&g), &total);
        let spec = render(&k.finish().unwrap()).unwrap();
        let src = &spec.src;
        assert!(src.starts_with("// toy\n"), "{src}");
        assert!(src.contains("kernel void k(const f32 *data0, f32 *data1, int n) {"), "{src}");
        // The extent n/4 is computed before the launch index that needs it.
        let extent = src.find("const i32 alu0 = (n / 4);").expect("hoisted extent");
        let launch = src.find("int gidx0 = id('g', 0); // < alu0").expect("launch index");
        assert!(extent < launch, "{src}");
        // The accumulator is declared before its loop and written back at the loop's end.
        let decl = src.find("f32 acc0 = 0.0f;").expect("acc");
        let open = src.find("for (i32 ridx0 = 0; ridx0 < 4; ridx0++) {").expect("loop");
        let commit = src.find("acc0 = alu").expect("commit");
        let store = src.find("data1[gidx0] = acc0;").expect("store of the finished acc");
        assert!(decl < open && open < commit && commit < store, "{src}");
        assert_eq!(src.matches('{').count(), src.matches('}').count(), "{src}");
        assert_eq!(spec.outs, vec![1]);
    }

    #[test]
    fn vectors_use_native_ops_or_go_lane_by_lane() {
        let mut k = KernelBuilder::new();
        let (a, out) = (k.param(0, Scalar::F32, 8), k.param(1, Scalar::F32, 8));
        let i = k.global(0, 2);
        let v = a.at_vec(&(&i * 4), 4).load();
        let r = (&v + &v) * &v;
        k.store(&out.at_vec(&(&i * 4), 4), &r);
        let src = render(&k.finish().unwrap()).unwrap().src;
        assert!(src.contains("typedef vec f32x4;"), "{src}");
        assert!(src.contains("const f32x4 alu1 = (val0 + val0);"), "{src}");
        assert!(src.contains("(f32x4)((alu1.s0 * val0.s0), (alu1.s1 * val0.s1)"), "{src}");
    }

    #[test]
    fn half_arithmetic_goes_through_f32() {
        let mut k = KernelBuilder::new();
        let (a, out) = (k.param(0, Scalar::F16, 4), k.param(1, Scalar::F16, 4));
        let i = k.global(0, 4);
        let v = a.at(&i).load();
        k.store(&out.at(&i), &(&v * &v).sqrt());
        let src = render(&k.finish().unwrap()).unwrap().src;
        assert!(src.contains("down((up(val0) * up(val0)))"), "{src}");
        assert!(src.contains("down(sqrt(up(alu0)))"), "{src}");
    }

    #[test]
    fn unrenderable_kernels_are_render_errors() {
        // Two different extents for one launch index.
        let mut k = KernelBuilder::new();
        let out = k.param(0, Scalar::I32, 16);
        let g1 = k.special("gidx0", 4);
        let g2 = k.special("gidx0", 8);
        k.store(&out.at(&g1), &g2);
        let sink = UOp::new(Op::Sink, DType::Void, Arg::None, k_effects(&out, &g1, &g2));
        assert!(matches!(render(&sink), Err(Error::Render(m)) if m.contains("two different extents")));
        // An extent that reads memory.
        let mut k = KernelBuilder::new();
        let (sizes, out) = (k.param(0, Scalar::I32, 1), k.param(1, Scalar::I32, 16));
        let g = k.special("gidx0", sizes.at(&Val::int(0)).load());
        k.store(&out.at(&g), &g);
        assert!(matches!(render(&k.finish().unwrap()), Err(Error::Render(m)) if m.contains("launch extent")));
        // Not a SINK.
        assert!(matches!(render(&UOp::index_const(1)), Err(Error::Render(_))));
    }

    #[test]
    fn loops_with_the_same_axis_get_distinct_names() {
        let range = |extent: i64| UOp::new(Op::Range, DType::I32, Arg::Int(5), vec![UOp::index_const(extent)]);
        let (outer, inner) = (range(3), range(2));
        let mut k = KernelBuilder::new();
        let out = k.param(0, Scalar::I32, 6);
        let idx = &Val(outer.clone()) * 2 + &Val(inner.clone());
        let st = k.store(&out.at(&idx), &idx);
        let e_inner = k.end(&Val(inner), &[&st]);
        k.end(&Val(outer), &[&e_inner]);
        let src = render(&k.finish().unwrap()).unwrap().src;
        assert!(src.contains("for (i32 ridx5 = 0; ridx5 < 3; ridx5++) {"), "{src}");
        assert!(src.contains("for (i32 ridx0 = 0; ridx0 < 2; ridx0++) {"), "{src}");
    }

    fn k_effects(out: &Val, g1: &Val, g2: &Val) -> Vec<Arc<UOp>> {
        let st = |g: &Val| UOp::new(Op::Store, DType::Void, Arg::None, vec![out.at(g).0.clone(), g.0.clone()]);
        vec![st(g1), st(g2)]
    }

    /// An IF block renders as a C `if` block; local memory and barriers need a dialect that
    /// spells them (the toy one keeps the refusing defaults) and a launch with work groups.
    #[test]
    fn if_blocks_render_and_work_group_constructs_need_work_groups() {
        let guarded = kiln_ir::parse_kernel(
            "%n = CONST i32 4\n%a = PARAM ptr<i32> 0 (%n)\n%i = SPECIAL i32 \"gidx0\" (%n)\n%z = CONST i32 0\n\
             %c = CMPNE bool (%i, %z)\n%if = IF (%c)\n%a1 = AFTER ptr<i32> (%a, %if)\n%p = INDEX ptr<i32> (%a1, %i)\n\
             %st = STORE (%p, %i)\n%e = ENDIF (%if, %st)\nSINK (%e)",
        )
        .unwrap();
        let src = render(&guarded).unwrap().src;
        assert!(src.contains("if (alu0) {\n") && src.contains("data0[gidx0] = gidx0;"), "{src}");
        let local = |index: &str| {
            kiln_ir::parse_kernel(&format!(
                "%n = CONST i32 4\n%i = SPECIAL i32 \"{index}\" (%n)\n%t = DEFINE_LOCAL lptr<i32> 0 (%n)\n\
                 %p = INDEX lptr<i32> (%t, %i)\n%st = STORE (%p, %i)\n%b = BARRIER (%st)\nSINK (%b)"
            ))
            .unwrap()
        };
        let Err(Error::Render(m)) = render(&local("lidx0")) else { panic!("the toy dialect has no local memory") };
        assert!(m.contains("needs a backend with work groups"), "{m}");
        let Err(Error::Render(m)) = render(&local("idx0")) else { panic!("idx0 has no work groups") };
        assert!(m.contains("launch with gidxN/lidxN, not idxN"), "{m}");
    }
}
