//! kiln-ir: the kernel language kiln compiles.
//!
//! A kernel is a hash-consed [`UOp`] DAG rooted at SINK. Build one with [`KernelBuilder`] or
//! parse it from text ([`parse()`]); [`validate`] checks it, [`linearize`] orders it for a
//! renderer, [`print()`] writes it back out (the round trip is exact).
//!
//! This is the bottom layer of kiln (see `docs/architecture.md`): it knows nothing of devices
//! beyond their names ([`DeviceSpec`]). `kiln-device` renders, compiles and runs what is
//! built here. Besides the graph itself the crate owns the dtypes ([`Scalar`], [`DType`]),
//! the pattern [`rewrite`] rules, size expressions ([`eval_int`], [`variables`]), and the
//! [`bounds`] proof that every LOAD and STORE stays inside its buffer, with the [`guard()`]
//! rewrite for the accesses left to launch time. Every malformed input is an [`IrError`]
//! that points at the node or the line.
//!
//! Nodes are hash-consed: two structurally equal graphs are the same `Arc`, and
//! [`UOp::content_hash`] is stable across processes (it keys kiln's disk cache).
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_ir::{KernelBuilder, Scalar};
//! // c[i] = a[i] · b[i] for i < n
//! let mut k = KernelBuilder::new();
//! let n = k.var("n", 1, 4096);
//! let (a, b, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n), k.param(2, Scalar::F32, &n));
//! let i = k.global(0, &n);
//! k.store(&c.at(&i), &(a.at(&i).load() * b.at(&i).load()));
//! let sink = k.finish()?; // validated
//! let text = kiln_ir::print(&sink);
//! assert!(text.contains("MUL f32"));
//! // Parsing the text gives back the very same node.
//! assert!(std::sync::Arc::ptr_eq(&kiln_ir::parse(&text)?, &sink));
//! // The order a renderer walks: operands before their users, the SINK last.
//! let order = kiln_ir::linearize(&sink)?;
//! assert_eq!(order.last().map(|u| u.op()), Some(kiln_ir::Op::Sink));
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod bounds;
mod builder;
mod dtype;
mod epilogue;
mod guard;
mod jam;
mod lanes;
mod linearize;
mod outer;
pub mod rewrite;
mod symbolic;
#[cfg(test)]
mod test_rng;
mod text;
mod uop;
mod validate;
pub mod wmma;

pub use builder::{Acc, IntoVal, KernelBuilder, Val};
pub use dtype::half::{bf16_bits, f16_bits};
pub use dtype::{AddrSpace, DType, DeviceSpec, Scalar};
pub use guard::{Guarded, GuardedAccess, guard};
pub use linearize::{MAX_CHAIN_DEPTH, MAX_LOOPS, chain_depth, check_chain_depth, linearize};
pub use outer::vectorize_outer_products;
pub use symbolic::{eval_int, variables, variables_sorted};
pub use text::{
    MAX_KERNEL_FILE_BYTES, edit_distance, entry_name, locate_node, parse, parse_kernel, print, read_kernel_file,
};
pub use uop::{Arg, ContentHash, Op, StoreHint, UOp};
pub use validate::{MAX_LOCAL_BYTES, validate, validate_sorted};
pub use wmma::Wmma;

/// Everything that can be wrong with a kernel or a size expression.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IrError {
    /// Kernel text that does not parse.
    #[error("line {line}, column {col}: {message}")]
    Parse {
        /// 1-based line of the offending token.
        line: usize,
        /// 1-based column (in characters) of the offending token.
        col: usize,
        /// What was expected or what is wrong there.
        message: String,
    },
    /// A node that breaks an operand or dtype rule. `node` is its `%N` number in `print` order.
    #[error("%{node} {op}: {message}")]
    Type {
        /// The node's `%N` number in `print` order, so the message points into printed text.
        node: usize,
        /// The node's op name as the text format spells it (`ADD`, `LOAD`, ...).
        op: &'static str,
        /// The rule that is broken.
        message: String,
    },
    /// Loops that cannot be laid out (an unclosed range, a cycle through END).
    #[error("kernel structure: {message}", message = .0)]
    Structure(String),
    /// A variable the caller did not bind.
    #[error("variable `{0}` has no value: bind it at launch")]
    MissingVar(String),
    /// A variable bound outside its declared bounds.
    #[error("variable `{name}` = {value} is outside its bounds [{min}, {max}]")]
    VarOutOfRange {
        /// The variable's name (`DEFINE_VAR`'s argument).
        name: String,
        /// The value the caller bound.
        value: i64,
        /// The smallest allowed value (inclusive).
        min: i64,
        /// The largest allowed value (inclusive).
        max: i64,
    },
    /// A size expression that cannot be evaluated (overflow, division by zero, bad op).
    #[error("size expression: {0}")]
    Eval(String),
    /// Anything else malformed (bad dtype or device name).
    #[error("{0}")]
    Invalid(String),
}
