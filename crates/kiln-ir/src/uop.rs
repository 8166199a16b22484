//! The hash-consed UOp DAG.
//!
//! A UOp is `(op, dtype, arg, src)`. Every UOp is interned: constructing a node equal to a
//! live one returns the same `Arc`, so structural equality is pointer equality and common
//! subexpressions are shared for free. The identity of a node is its [`ContentHash`], a
//! SHA-256 over a fixed byte encoding of op, dtype, arg and the children's hashes; it does
//! not depend on the process, pointer values or the Rust version, so it keys the disk cache.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use sha2::{Digest, Sha256};

use crate::dtype::{AddrSpace, DType, DeviceSpec};
use crate::wmma::Wmma;

/// Every operation a kernel can contain.
///
/// Operand conventions (the `src` list) are documented per op; [`crate::validate`] checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    // --- structure ---
    /// Root of a kernel. src: the effects (STORE/END) it consists of.
    Sink,
    /// A kernel buffer parameter. arg: slot. src: `[element count]` (an integer expression
    /// over DEFINE_VARs). dtype: pointer.
    Param,
    /// A runtime integer variable. arg: `Var { name, min, max }`.
    DefineVar,
    /// A constant. arg: `Int`/`Float`/`Bool`.
    Const,
    /// A launch index. arg: name (`gidx0`, `lidx1`, `idx0`, `core_id`). src: `[extent]`.
    /// It runs over `0..extent` (the extent is ≥ 1 at every launch, an expression over the
    /// variables): `gidxN` numbers the work-groups on axis N, `lidxN` the work items within a
    /// group, `idxN` the work items directly (the backend picks the grouping when no `gidxN`
    /// sits next to it, else groups are one item; it cannot be mixed with `lidxN`), and
    /// `core_id` is global axis 0 (on the CPU: one chunk per core).
    /// N < 3. One launch runs every combination of the extents once.
    Special,
    /// A loop. arg: axis id (smaller id = outer when nested). src: `[extent]`. Runs 0..extent.
    Range,
    /// Closes a loop. src: `[range, values computed inside...]`. Its value (when not void) is
    /// the value of src`[1]` after the loop finishes (e.g. a finished accumulator).
    End,
    /// Binds a variable to a value. src: `[define_var, value]`.
    Bind,
    /// A value ordered after effects. src: `[value, deps...]`. Evaluates to src`[0]`.
    After,

    // --- memory ---
    /// Pointer arithmetic. src: `[buffer pointer, element index]`. dtype: pointer (its width
    /// is the access width of the LOAD/STORE that uses it).
    Index,
    /// Read through a pointer. src: `[index]` or `[index, alt, gate]`: when the gate is false the
    /// memory is not touched and the result is `alt`.
    Load,
    /// Write through a pointer. src: `[index, value]` or `[index, value, gate]`. arg: a
    /// [`StoreHint`] (`Arg::None` for a plain store).
    Store,
    /// A local accumulator. arg: its id, unique within the kernel (two accumulators with the
    /// same init and ranges are different variables; without the id hash-consing would merge
    /// them). src: `[initial value, reduce ranges...]`. Defined just outside the outermost of
    /// its reduce ranges.
    DefineAcc,
    /// Update an accumulator. src: `[acc, new value]`. Evaluates to the new value.
    Assign,

    // --- unary ALU (the operand has the result dtype) ---
    /// `-x`; integers wrap (`-MIN == MIN`), and on bool it is NOT.
    Neg,
    /// Bitwise complement of an integer, logical negation of a bool (not for floats).
    Not,
    /// Square root (floats; NaN below zero).
    Sqrt,
    /// `1 / x` (floats; ±inf at ±0).
    Recip,
    /// `2^x` (floats).
    Exp2,
    /// Base-2 logarithm (floats; -inf at 0, NaN below zero).
    Log2,
    /// `e^x` (floats).
    Exp,
    /// Natural logarithm (floats; -inf at 0, NaN below zero).
    Log,
    /// Sine of radians (floats).
    Sin,
    /// Cosine of radians (floats).
    Cos,
    /// Rounds toward zero, keeping the float dtype (floats).
    Trunc,
    /// Absolute value; for signed integers `ABS(MIN) == MIN` (it wraps).
    Abs,

    // --- binary ALU (both operands of the result dtype, comparisons give bool) ---
    /// `a + b`; integers wrap.
    Add,
    /// `a - b`; integers wrap.
    Sub,
    /// `a * b`; integers wrap.
    Mul,
    /// Float division.
    Div,
    /// Integer division truncating toward zero. Defined for every operand: `x / 0 == 0`, and
    /// `MIN / -1 == MIN` (it wraps), on every backend.
    Idiv,
    /// Integer remainder, with the sign of the dividend (`x == x / d * d + x % d`). Defined
    /// for every operand: `x % 0 == x` and `MIN % -1 == 0`, on every backend.
    Mod,
    /// The larger operand. For floats IEEE `fmax`: a NaN operand yields the other operand.
    /// Of `-0.0` and `+0.0` either may be returned (as C's and OpenCL's `fmax` allow: x86's
    /// `maxps` returns the second, GPUs `+0.0`); a NaN-propagating maximum is
    /// `WHERE(CMPLT(a, b), b, a)`, which tinygrad's renderers use.
    Max,
    /// The smaller operand. For floats IEEE `fmin`: a NaN operand yields the other operand.
    /// Of `-0.0` and `+0.0` either may be returned, as for [`Op::Max`].
    Min,
    /// `a^b` (floats, C `pow`).
    Pow,
    /// Bitwise AND of integers, logical AND of bools.
    And,
    /// Bitwise OR of integers, logical OR of bools.
    Or,
    /// Bitwise XOR of integers, logical XOR of bools.
    Xor,
    /// `a << (b mod bit width)` (integers); never overflows, the shifted-out bits are lost.
    Shl,
    /// `a >> (b mod bit width)` (integers): arithmetic for signed, logical for unsigned types.
    Shr,
    /// `a < b`, a bool (one per lane). With these four comparisons `a > b` is `b < a` and
    /// `a >= b` is `b <= a`. Any comparison with a NaN is false, except CMPNE.
    Lt,
    /// `a <= b`, a bool (one per lane).
    Le,
    /// `a == b`, a bool (one per lane); `-0.0 == 0.0`.
    Eq,
    /// `a != b`, a bool (one per lane); true when either operand is NaN.
    Ne,

    // --- ternary ALU ---
    /// src: `[cond, a, b]`.
    /// `cond ? a : b`, lane by lane when `cond` is a bool vector (a scalar `cond` picks whole
    /// vectors). Both `a` and `b` are computed; only the choice depends on `cond`.
    Where,
    /// src: `[a, b, c]` → a*b + c.
    /// Fused (one rounding, C `fma`) for floats; wrapping for integers.
    MulAcc,

    // --- types and vectors ---
    /// Value conversion to dtype.
    Cast,
    /// Reinterpretation of the bits (sizes must match).
    Bitcast,
    /// Build a vector from scalars (one src per lane, or one src broadcast to every lane).
    Vectorize,
    /// Extract lane `arg` of a vector.
    Gep,

    // --- compiled kernels as values ---
    /// A compiled kernel. src: `[sink, device, linear?, source?, binary?]` (stages as present).
    Program,
    /// The device a PROGRAM targets. arg: `Device`.
    Device,
    /// The linearized kernel. src: nodes in emission order.
    Linear,
    /// Rendered source. arg: `Str`.
    Source,
    /// Compiled bytes. arg: `Bytes`.
    Binary,

    // --- work groups (GPU kernel constructs) ---
    /// Work-group shared memory: one array per work group, visible to all its work items,
    /// uninitialised at kernel start. arg: an id, unique within the kernel (as for
    /// DEFINE_ACC: two arrays of equal type and size are still two arrays). src: `[element
    /// count]`, a positive integer CONST (the size is static). dtype: a local pointer
    /// (`lptr<f32>`), used like a PARAM through INDEX, LOAD and STORE.
    DefineLocal,
    /// A work-group barrier: every work item of the group reaches it before any goes on, and
    /// the stores (local or global memory) made before it by any item of the group are
    /// visible to the loads after it by every item of the group. src: the nodes it comes
    /// after (the stores it publishes, or the END of a loop that reads local memory); loads
    /// that need its ordering address memory through `AFTER(buffer, barrier)`. It must be
    /// reached by all or none of a group's items, so it may not sit inside an IF block or a
    /// loop whose trip count can differ between work items.
    Barrier,
    /// Opens a guarded block: the nodes that depend on it (typically through
    /// `AFTER(buffer, if)` on the address of a STORE) run only where `cond` holds. src:
    /// `[cond (bool), deps...]`; the deps (e.g. a RANGE) place the block inside their loops.
    /// A block holds straight-line code: no loop (RANGE) and no BARRIER inside it.
    If,
    /// Closes the block of an IF. src: `[if, effects inside the block...]`.
    EndIf,

    // --- matrix units ---
    /// `D = A·B + C` on register fragments (tinygrad's `Ops.WMMA`). arg: a [`Wmma`] (shape,
    /// input and accumulator dtypes, threads). src: `[a, b, c]`, each thread's fragment of
    /// A, B and C as vectors of `input`, `input` and `acc` lanes; dtype: the D fragment, laid
    /// out like C. The layouts and the arithmetic are in [`crate::wmma`]. A backend renders
    /// only the forms its device declares (`DeviceProperties::wmma`); others refuse the
    /// kernel with a render error.
    Wmma,
}

impl Op {
    /// Every op, in tag order: an op's position here is its byte in [`ContentHash`]es, so new
    /// ops are appended, never inserted (that would orphan every disk cache entry).
    pub const ALL: &'static [Op] = &[
        Op::Sink,
        Op::Param,
        Op::DefineVar,
        Op::Const,
        Op::Special,
        Op::Range,
        Op::End,
        Op::Bind,
        Op::After,
        Op::Index,
        Op::Load,
        Op::Store,
        Op::DefineAcc,
        Op::Assign,
        Op::Neg,
        Op::Not,
        Op::Sqrt,
        Op::Recip,
        Op::Exp2,
        Op::Log2,
        Op::Exp,
        Op::Log,
        Op::Sin,
        Op::Cos,
        Op::Trunc,
        Op::Abs,
        Op::Add,
        Op::Sub,
        Op::Mul,
        Op::Div,
        Op::Idiv,
        Op::Mod,
        Op::Max,
        Op::Min,
        Op::Pow,
        Op::And,
        Op::Or,
        Op::Xor,
        Op::Shl,
        Op::Shr,
        Op::Lt,
        Op::Le,
        Op::Eq,
        Op::Ne,
        Op::Where,
        Op::MulAcc,
        Op::Cast,
        Op::Bitcast,
        Op::Vectorize,
        Op::Gep,
        Op::Program,
        Op::Device,
        Op::Linear,
        Op::Source,
        Op::Binary,
        Op::DefineLocal,
        Op::Barrier,
        Op::If,
        Op::EndIf,
        Op::Wmma,
    ];

    /// The upper-case name used in the text format.
    pub fn name(self) -> &'static str {
        match self {
            Op::Sink => "SINK",
            Op::Param => "PARAM",
            Op::DefineVar => "DEFINE_VAR",
            Op::Const => "CONST",
            Op::Special => "SPECIAL",
            Op::Range => "RANGE",
            Op::End => "END",
            Op::Bind => "BIND",
            Op::After => "AFTER",
            Op::Index => "INDEX",
            Op::Load => "LOAD",
            Op::Store => "STORE",
            Op::DefineAcc => "DEFINE_ACC",
            Op::Assign => "ASSIGN",
            Op::Neg => "NEG",
            Op::Not => "NOT",
            Op::Sqrt => "SQRT",
            Op::Recip => "RECIP",
            Op::Exp2 => "EXP2",
            Op::Log2 => "LOG2",
            Op::Exp => "EXP",
            Op::Log => "LOG",
            Op::Sin => "SIN",
            Op::Cos => "COS",
            Op::Trunc => "TRUNC",
            Op::Abs => "ABS",
            Op::Add => "ADD",
            Op::Sub => "SUB",
            Op::Mul => "MUL",
            Op::Div => "DIV",
            Op::Idiv => "IDIV",
            Op::Mod => "MOD",
            Op::Max => "MAX",
            Op::Min => "MIN",
            Op::Pow => "POW",
            Op::And => "AND",
            Op::Or => "OR",
            Op::Xor => "XOR",
            Op::Shl => "SHL",
            Op::Shr => "SHR",
            Op::Lt => "CMPLT",
            Op::Le => "CMPLE",
            Op::Eq => "CMPEQ",
            Op::Ne => "CMPNE",
            Op::Where => "WHERE",
            Op::MulAcc => "MULACC",
            Op::Cast => "CAST",
            Op::Bitcast => "BITCAST",
            Op::Vectorize => "VECTORIZE",
            Op::Gep => "GEP",
            Op::Program => "PROGRAM",
            Op::Device => "DEVICE",
            Op::Linear => "LINEAR",
            Op::Source => "SOURCE",
            Op::Binary => "BINARY",
            Op::DefineLocal => "DEFINE_LOCAL",
            Op::Barrier => "BARRIER",
            Op::If => "IF",
            Op::EndIf => "ENDIF",
            Op::Wmma => "WMMA",
        }
    }

    /// The op whose text-format name is `name` (case-sensitive), if any.
    pub fn from_name(name: &str) -> Option<Op> {
        // A table, since a kernel's text names an op on every line.
        static BY_NAME: OnceLock<HashMap<&'static str, Op>> = OnceLock::new();
        BY_NAME.get_or_init(|| Op::ALL.iter().map(|&op| (op.name(), op)).collect()).get(name).copied()
    }

    /// An ALU op with one operand (NEG ... ABS).
    pub fn is_unary(self) -> bool {
        matches!(
            self,
            Op::Neg
                | Op::Not
                | Op::Sqrt
                | Op::Recip
                | Op::Exp2
                | Op::Log2
                | Op::Exp
                | Op::Log
                | Op::Sin
                | Op::Cos
                | Op::Trunc
                | Op::Abs
        )
    }

    /// An ALU op with two operands, comparisons included.
    pub fn is_binary(self) -> bool {
        matches!(
            self,
            Op::Add
                | Op::Sub
                | Op::Mul
                | Op::Div
                | Op::Idiv
                | Op::Mod
                | Op::Max
                | Op::Min
                | Op::Pow
                | Op::And
                | Op::Or
                | Op::Xor
                | Op::Shl
                | Op::Shr
                | Op::Lt
                | Op::Le
                | Op::Eq
                | Op::Ne
        )
    }

    /// CMPLT, CMPLE, CMPEQ or CMPNE: the binary ops that yield bool.
    pub fn is_comparison(self) -> bool {
        matches!(self, Op::Lt | Op::Le | Op::Eq | Op::Ne)
    }

    /// WHERE or MULACC.
    pub fn is_ternary(self) -> bool {
        matches!(self, Op::Where | Op::MulAcc)
    }

    /// An op that computes a value from its operands alone (no memory, no structure).
    pub fn is_alu(self) -> bool {
        self.is_unary() || self.is_binary() || self.is_ternary()
    }

    fn tag(self) -> u8 {
        // The position in ALL is the stable tag: new ops are appended, never inserted.
        Op::ALL.iter().position(|o| *o == self).unwrap_or(usize::MAX) as u8
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The non-UOp payload of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// No payload: every op not listed below.
    None,
    /// An integer CONST (a `u64` constant holds its value's bits), PARAM slot, RANGE axis,
    /// DEFINE_ACC id or GEP lane.
    Int(i64),
    /// Floats compare by bits so that NaN constants intern and round-trip exactly.
    Float(f64),
    /// A bool CONST.
    Bool(bool),
    /// A SPECIAL's launch index name, a PROGRAM's kernel name or a SOURCE's text.
    Str(String),
    /// A DEFINE_VAR: the variable every launch binds by name, within `min..=max`.
    Var {
        /// The name callers bind it by (`("n", 1024)`); kernels order their values by name.
        name: String,
        /// The smallest value a launch may bind (inclusive).
        min: i64,
        /// The largest value a launch may bind (inclusive).
        max: i64,
    },
    /// The device a PROGRAM targets.
    Device(DeviceSpec),
    /// A BINARY's compiled bytes.
    Bytes(Vec<u8>),
    /// A WMMA's shape, dtypes and fragment layout.
    Wmma(Wmma),
}

impl Eq for Arg {}

impl Hash for Arg {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let mut bytes = Vec::new();
        self.encode(&mut bytes);
        bytes.hash(state);
    }
}

impl Arg {
    fn encode(&self, out: &mut Vec<u8>) {
        fn s(out: &mut Vec<u8>, v: &[u8]) {
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            out.extend_from_slice(v);
        }
        match self {
            Arg::None => out.push(0),
            Arg::Int(v) => {
                out.push(1);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Arg::Float(v) => {
                out.push(2);
                out.extend_from_slice(&v.to_bits().to_le_bytes());
            }
            Arg::Bool(v) => out.extend_from_slice(&[3, *v as u8]),
            Arg::Str(v) => {
                out.push(4);
                s(out, v.as_bytes());
            }
            Arg::Var { name, min, max } => {
                out.push(5);
                s(out, name.as_bytes());
                out.extend_from_slice(&min.to_le_bytes());
                out.extend_from_slice(&max.to_le_bytes());
            }
            Arg::Device(d) => {
                out.push(6);
                s(out, d.to_string().as_bytes());
            }
            Arg::Bytes(v) => {
                out.push(7);
                s(out, v);
            }
            Arg::Wmma(w) => {
                out.push(8);
                for d in [w.m, w.n, w.k, w.threads] {
                    out.extend_from_slice(&d.to_le_bytes());
                }
                out.extend_from_slice(&[w.input as u8, w.acc as u8]);
            }
        }
    }
}

/// How a STORE may write memory. A hint never changes what a kernel computes: a backend
/// without the kind of store it asks for writes plainly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StoreHint {
    /// An ordinary store through the caches (STORE's argument is [`Arg::None`]).
    #[default]
    Normal,
    /// The value will not be read again soon: the store may bypass the caches (a
    /// non-temporal, write-combining store), so that streaming an output larger than the
    /// caches neither evicts the inputs nor reads every output line before writing it.
    /// STORE's argument is `Arg::Str("nontemporal")`, in text `STORE void "nontemporal" (...)`.
    NonTemporal,
}

impl StoreHint {
    /// The STORE argument that carries this hint.
    pub fn arg(self) -> Arg {
        match self {
            StoreHint::Normal => Arg::None,
            StoreHint::NonTemporal => Arg::Str(Self::NONTEMPORAL.into()),
        }
    }

    /// The hint a STORE's argument names; `None` for an argument that names no hint
    /// ([`crate::validate`] rejects such a STORE).
    pub fn from_arg(arg: &Arg) -> Option<StoreHint> {
        match arg {
            Arg::None => Some(StoreHint::Normal),
            Arg::Str(s) if s == Self::NONTEMPORAL => Some(StoreHint::NonTemporal),
            _ => None,
        }
    }

    const NONTEMPORAL: &'static str = "nontemporal";
}

/// A stable 256-bit identity of a UOp graph.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    /// The 64 lower-case hex digits (the form cache file names use).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentHash({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// One node of a kernel graph. Create nodes with [`UOp::new`] or the builder.
pub struct UOp {
    op: Op,
    dtype: DType,
    arg: Arg,
    src: Vec<Arc<UOp>>,
    hash: ContentHash,
}

impl PartialEq for UOp {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
    }
}

impl Eq for UOp {}

impl Hash for UOp {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.hash.hash(state)
    }
}

impl fmt::Debug for UOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.op, self.dtype)?;
        if self.arg != Arg::None {
            write!(f, " {}", self.arg)?;
        }
        if !self.src.is_empty() {
            write!(f, " ({} srcs)", self.src.len())?;
        }
        Ok(())
    }
}

/// Dropping a graph never recurses: a long chain of nodes would otherwise overflow the
/// stack through nested `Arc` drops.
impl Drop for UOp {
    fn drop(&mut self) {
        let mut stack = std::mem::take(&mut self.src);
        while let Some(node) = stack.pop() {
            if let Ok(mut owned) = Arc::try_unwrap(node) {
                stack.append(&mut owned.src);
            }
        }
    }
}

struct Interner {
    live: HashMap<ContentHash, Weak<UOp>>,
    sweep_at: usize,
}

/// The interner's shards: a node lives in the shard its hash's first byte picks, so that
/// threads building graphs at once (a plan's kernels parsed on every core) seldom wait on
/// each other.
const INTERNER_SHARDS: usize = 16;

fn interner(hash: &ContentHash) -> &'static Mutex<Interner> {
    static TABLE: OnceLock<[Mutex<Interner>; INTERNER_SHARDS]> = OnceLock::new();
    let shards = TABLE
        .get_or_init(|| std::array::from_fn(|_| Mutex::new(Interner { live: Default::default(), sweep_at: 1024 })));
    &shards[hash.0[0] as usize % INTERNER_SHARDS]
}

impl UOp {
    /// Creates (or finds) the node `(op, dtype, arg, src)`. Never fails: well-formedness is
    /// checked separately by [`crate::validate`], so that a malformed graph can be reported
    /// with all its context instead of failing at the first constructor.
    pub fn new(op: Op, dtype: DType, arg: Arg, src: Vec<Arc<UOp>>) -> Arc<UOp> {
        let hash = Self::compute_hash(op, dtype, &arg, &src);
        let mut table = interner(&hash).lock().unwrap_or_else(|poison| poison.into_inner());
        if let Some(existing) = table.live.get(&hash).and_then(Weak::upgrade) {
            return existing;
        }
        let node = Arc::new(UOp { op, dtype, arg, src, hash });
        table.live.insert(hash, Arc::downgrade(&node));
        if table.live.len() >= table.sweep_at {
            table.live.retain(|_, w| w.strong_count() > 0);
            table.sweep_at = (table.live.len() * 2).max(1024);
        }
        node
    }

    fn compute_hash(op: Op, dtype: DType, arg: &Arg, src: &[Arc<UOp>]) -> ContentHash {
        // The node's own fields are encoded into a small buffer (an argument's bytes may be
        // long); its operands' hashes go straight into the digest.
        let mut head = Vec::with_capacity(32);
        head.push(op.tag());
        encode_dtype(dtype, &mut head);
        arg.encode(&mut head);
        head.extend_from_slice(&(src.len() as u32).to_le_bytes());
        let mut h = Sha256::new();
        h.update(&head);
        for s in src {
            h.update(s.hash.0);
        }
        ContentHash(h.finalize().into())
    }

    /// What this node computes.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The type of this node's value (`void` for effects).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The non-node payload (slot, name, constant, ...); [`Arg::None`] for most ops.
    pub fn arg(&self) -> &Arg {
        &self.arg
    }

    /// The operands, in the order the op's documentation gives.
    pub fn src(&self) -> &[Arc<UOp>] {
        &self.src
    }

    /// Stable identity of this node and everything below it.
    pub fn content_hash(&self) -> ContentHash {
        self.hash
    }

    /// The same node with other children.
    pub fn with_src(&self, src: Vec<Arc<UOp>>) -> Arc<UOp> {
        UOp::new(self.op, self.dtype, self.arg.clone(), src)
    }

    /// The integer payload of a CONST, PARAM slot, RANGE axis, DEFINE_LOCAL id or GEP lane.
    pub fn arg_int(&self) -> Option<i64> {
        match self.arg {
            Arg::Int(v) => Some(v),
            _ => None,
        }
    }

    /// The hint of a STORE (plain for any other node, and for an argument that names no hint).
    pub fn store_hint(&self) -> StoreHint {
        if self.op == Op::Store { StoreHint::from_arg(&self.arg).unwrap_or_default() } else { StoreHint::Normal }
    }

    /// The name of a SPECIAL or DEFINE_VAR.
    pub fn arg_name(&self) -> Option<&str> {
        match &self.arg {
            Arg::Str(s) => Some(s),
            Arg::Var { name, .. } => Some(name),
            _ => None,
        }
    }

    /// Every node reachable from `self`, children before parents, each once.
    /// Iterative, so deep graphs cannot overflow the stack.
    pub fn toposort(self: &Arc<Self>) -> Vec<Arc<UOp>> {
        thread_local! {
            // The visited set, kept with its capacity between walks: every pass walks its
            // graph, and growing a set to a kernel's size each time costs as much as the walk.
            static SEEN: std::cell::RefCell<HashSet<*const UOp>> = std::cell::RefCell::default();
        }
        // A set grown past this (a huge graph) is shrunk back after its walk.
        const KEEP: usize = 1 << 16;
        SEEN.with(|seen| match seen.try_borrow_mut() {
            Ok(mut seen) => {
                seen.clear();
                let out = self.toposort_with(&mut seen);
                if seen.capacity() > KEEP {
                    seen.clear();
                    seen.shrink_to(KEEP);
                }
                out
            }
            Err(_) => self.toposort_with(&mut HashSet::default()),
        })
    }

    fn toposort_with(self: &Arc<Self>, seen: &mut HashSet<*const UOp>) -> Vec<Arc<UOp>> {
        let mut out = Vec::new();
        // Every node below `self` lives as long as `self` does: the walk borrows them and
        // clones only what it returns.
        let mut stack: Vec<(&Arc<UOp>, bool)> = vec![(self, false)];
        while let Some((node, expanded)) = stack.pop() {
            if expanded {
                out.push(node.clone());
                continue;
            }
            if !seen.insert(Arc::as_ptr(node)) {
                continue;
            }
            stack.push((node, true));
            for s in node.src.iter().rev() {
                if !seen.contains(&Arc::as_ptr(s)) {
                    stack.push((s, false));
                }
            }
        }
        out
    }

    // --- small constructors used everywhere ---

    /// An integer CONST of `dtype` (no range check: [`crate::validate`] rejects a value that
    /// does not fit).
    pub fn const_int(dtype: DType, v: i64) -> Arc<UOp> {
        UOp::new(Op::Const, dtype, Arg::Int(v), vec![])
    }

    /// A float CONST of `dtype`; `v` is rounded to the dtype when the kernel is rendered
    /// ([`crate::validate`] rejects a finite value that would round to infinity).
    pub fn const_float(dtype: DType, v: f64) -> Arc<UOp> {
        UOp::new(Op::Const, dtype, Arg::Float(v), vec![])
    }

    /// A bool CONST.
    pub fn const_bool(v: bool) -> Arc<UOp> {
        UOp::new(Op::Const, DType::BOOL, Arg::Bool(v), vec![])
    }

    /// An index-typed integer constant.
    pub fn index_const(v: i64) -> Arc<UOp> {
        UOp::const_int(DType::INDEX, v)
    }
}

fn encode_dtype(dtype: DType, out: &mut Vec<u8>) {
    match dtype {
        DType::Void => out.push(0),
        DType::Scalar(s) => out.extend_from_slice(&[1, s as u8]),
        DType::Vector(s, w) => out.extend_from_slice(&[2, s as u8, w]),
        DType::Ptr { scalar, width, space } => {
            out.extend_from_slice(&[3, scalar as u8, width, matches!(space, AddrSpace::Local) as u8])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_graphs_are_the_same_arc() {
        let a = UOp::index_const(3);
        let b = UOp::index_const(3);
        assert!(Arc::ptr_eq(&a, &b));
        let x = UOp::new(Op::Add, DType::I32, Arg::None, vec![a.clone(), b.clone()]);
        let y = UOp::new(Op::Add, DType::I32, Arg::None, vec![a, b]);
        assert!(Arc::ptr_eq(&x, &y));
        assert_ne!(UOp::const_float(DType::F32, 0.0), UOp::const_float(DType::F32, -0.0));
    }

    #[test]
    fn content_hash_is_stable() {
        // Pinned: changing the encoding silently would orphan every disk cache entry.
        let c = UOp::const_int(DType::I32, 7);
        let e = UOp::new(Op::Neg, DType::I32, Arg::None, vec![c]);
        assert_eq!(e.content_hash().to_hex(), {
            let mut inner = vec![Op::Const.tag(), 1, super::super::Scalar::I32 as u8, 1];
            inner.extend_from_slice(&7i64.to_le_bytes());
            inner.extend_from_slice(&0u32.to_le_bytes());
            let ih: [u8; 32] = Sha256::digest(&inner).into();
            let mut outer = vec![Op::Neg.tag(), 1, super::super::Scalar::I32 as u8, 0];
            outer.extend_from_slice(&1u32.to_le_bytes());
            outer.extend_from_slice(&ih);
            ContentHash(Sha256::digest(&outer).into()).to_hex()
        });
        assert_eq!(Op::Const.tag(), 3);
        assert_eq!(Op::Neg.tag(), 14);
    }

    #[test]
    fn a_deep_chain_drops_without_recursion() {
        let mut x = UOp::const_int(DType::I64, -1);
        for _ in 0..200_000 {
            x = UOp::new(Op::Neg, DType::I64, Arg::None, vec![x]);
        }
        assert_eq!(x.toposort().len(), 200_001);
        drop(x); // would overflow the test thread's stack if drops nested
    }

    #[test]
    fn toposort_puts_children_first() {
        let a = UOp::index_const(1);
        let b = UOp::new(Op::Neg, DType::I32, Arg::None, vec![a.clone()]);
        let c = UOp::new(Op::Add, DType::I32, Arg::None, vec![b.clone(), a.clone()]);
        let order = c.toposort();
        assert_eq!(order.len(), 3);
        assert!(Arc::ptr_eq(&order[0], &a));
        assert!(Arc::ptr_eq(&order[2], &c));
    }

    #[test]
    fn op_names_are_unique_and_parse() {
        for op in Op::ALL {
            assert_eq!(Op::from_name(op.name()), Some(*op));
        }
    }
}
