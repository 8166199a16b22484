//! An ergonomic way to write kernels in Rust.
//!
//! [`Val`] wraps a node and overloads the arithmetic operators; plain numbers on the right
//! of an operator become constants of the left operand's dtype. [`KernelBuilder`] hands out
//! parameters, variables, launch indices and loops, collects the stores, and `finish()`
//! validates and returns the SINK. Nothing here panics on a badly typed kernel: construction
//! records what you asked for and `finish()` reports what is wrong.
//!
//! ```
//! use kiln_ir::{KernelBuilder, Scalar};
//! let mut k = KernelBuilder::new();
//! let n = k.var("n", 1, 1 << 20);
//! let (a, b, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n), k.param(2, Scalar::F32, &n));
//! let i = k.global(0, &n);
//! let sum = a.at(&i).load() + b.at(&i).load();
//! k.store(&c.at(&i), &sum);
//! let sink = k.finish().unwrap();
//! assert_eq!(sink.src().len(), 1);
//! ```

use std::ops;
use std::sync::Arc;

use crate::IrError;
use crate::dtype::{AddrSpace, DType, Scalar};
use crate::uop::{Arg, Op, StoreHint, UOp};
use crate::validate::validate;
use crate::wmma::Wmma;

/// A node being built. Cheap to clone (an `Arc`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Val(pub Arc<UOp>);

impl Val {
    /// The node, for code that works on the graph directly.
    pub fn node(&self) -> &Arc<UOp> {
        &self.0
    }

    /// The node's dtype (it decides the dtype of numbers used as the other operand).
    pub fn dtype(&self) -> DType {
        self.0.dtype()
    }

    fn un(&self, op: Op) -> Val {
        Val(UOp::new(op, self.dtype(), Arg::None, vec![self.0.clone()]))
    }

    fn bin(&self, op: Op, rhs: &Val) -> Val {
        let dt = if op.is_comparison() { DType::vec(Scalar::Bool, self.dtype().width()) } else { self.dtype() };
        Val(UOp::new(op, dt, Arg::None, vec![self.0.clone(), rhs.0.clone()]))
    }

    /// A constant of this value's dtype (broadcast to its lanes for vectors).
    pub fn splat(&self, v: f64) -> Val {
        Val::constant(self.dtype(), v)
    }

    /// A constant of `dtype`; vectors are broadcast from one scalar.
    pub fn constant(dtype: DType, v: f64) -> Val {
        let lane = dtype.lane();
        let c = match lane.scalar() {
            Some(Scalar::Bool) => UOp::const_bool(v != 0.0),
            Some(s) if s.is_float() => UOp::const_float(lane, v),
            _ => UOp::const_int(lane, v as i64),
        };
        match dtype {
            DType::Vector(..) => Val(UOp::new(Op::Vectorize, dtype, Arg::None, vec![c])),
            _ => Val(c),
        }
    }

    /// An index (`i32`) constant, e.g. an offset in index arithmetic.
    pub fn int(v: i64) -> Val {
        Val(UOp::index_const(v))
    }

    /// An `f32` constant.
    pub fn f32(v: f32) -> Val {
        Val(UOp::const_float(DType::F32, v as f64))
    }

    /// Square root (floats).
    pub fn sqrt(&self) -> Val {
        self.un(Op::Sqrt)
    }
    /// `2^self` (floats).
    pub fn exp2(&self) -> Val {
        self.un(Op::Exp2)
    }
    /// Base-2 logarithm (floats).
    pub fn log2(&self) -> Val {
        self.un(Op::Log2)
    }
    /// `e^self` (floats).
    pub fn exp(&self) -> Val {
        self.un(Op::Exp)
    }
    /// Natural logarithm (floats).
    pub fn log(&self) -> Val {
        self.un(Op::Log)
    }
    /// Sine of radians (floats).
    pub fn sin(&self) -> Val {
        self.un(Op::Sin)
    }
    /// Cosine of radians (floats).
    pub fn cos(&self) -> Val {
        self.un(Op::Cos)
    }
    /// `1 / self` (floats).
    pub fn recip(&self) -> Val {
        self.un(Op::Recip)
    }
    /// Absolute value (signed integers wrap: `abs(MIN) == MIN`).
    pub fn abs(&self) -> Val {
        self.un(Op::Abs)
    }
    /// Rounds toward zero, staying a float.
    pub fn trunc(&self) -> Val {
        self.un(Op::Trunc)
    }
    /// Bitwise complement of an integer, logical negation of a bool.
    pub fn not(&self) -> Val {
        self.un(Op::Not)
    }
    /// The larger of the two; for floats a NaN operand yields the other one (`fmax`).
    pub fn max(&self, o: impl IntoVal) -> Val {
        let o = o.into_val(self.dtype());
        self.bin(Op::Max, &o)
    }
    /// The smaller of the two; for floats a NaN operand yields the other one (`fmin`).
    pub fn min(&self, o: impl IntoVal) -> Val {
        let o = o.into_val(self.dtype());
        self.bin(Op::Min, &o)
    }
    /// `self^o` (floats).
    pub fn pow(&self, o: impl IntoVal) -> Val {
        let o = o.into_val(self.dtype());
        self.bin(Op::Pow, &o)
    }
    /// Integer division truncating toward zero (`x / 0 == 0`); `/` on an integer `Val` is the same.
    pub fn idiv(&self, o: impl IntoVal) -> Val {
        let o = o.into_val(self.dtype());
        self.bin(Op::Idiv, &o)
    }
    /// `self < o` as bool lanes (`a > b` is `b.lt(a)`).
    pub fn lt(&self, o: impl IntoVal) -> Val {
        let o = o.into_val(self.dtype());
        self.bin(Op::Lt, &o)
    }
    /// `self <= o` as bool lanes (`a >= b` is `b.le(a)`).
    pub fn le(&self, o: impl IntoVal) -> Val {
        let o = o.into_val(self.dtype());
        self.bin(Op::Le, &o)
    }
    /// `self == o` as bool lanes (a method, not `PartialEq`, because it builds a node).
    pub fn eq(&self, o: impl IntoVal) -> Val {
        let o = o.into_val(self.dtype());
        self.bin(Op::Eq, &o)
    }
    /// `self != o` as bool lanes (true when either is NaN).
    pub fn ne(&self, o: impl IntoVal) -> Val {
        let o = o.into_val(self.dtype());
        self.bin(Op::Ne, &o)
    }
    /// `self ? a : b`.
    pub fn select(&self, a: &Val, b: impl IntoVal) -> Val {
        let b = b.into_val(a.dtype());
        Val(UOp::new(Op::Where, a.dtype(), Arg::None, vec![self.0.clone(), a.0.clone(), b.0]))
    }
    /// `self * b + c` in one rounding where the target has FMA.
    pub fn mul_acc(&self, b: &Val, c: &Val) -> Val {
        Val(UOp::new(Op::MulAcc, self.dtype(), Arg::None, vec![self.0.clone(), b.0.clone(), c.0.clone()]))
    }
    /// `D = A·B + C` ([`Op::Wmma`]): `self` is this thread's A fragment, `b` and `c` its B
    /// and C fragments, laid out as [`crate::wmma`] says for `arg`; the result is the D fragment.
    pub fn wmma(&self, b: &Val, c: &Val, arg: Wmma) -> Val {
        let dt = arg.operand_dtypes()[2];
        Val(UOp::new(Op::Wmma, dt, Arg::Wmma(arg), vec![self.0.clone(), b.0.clone(), c.0.clone()]))
    }
    /// Converts the value to `dtype` lane by lane: float → integer saturates (NaN → 0),
    /// integer → integer wraps, anything → bool is `!= 0`.
    pub fn cast(&self, dtype: DType) -> Val {
        Val(UOp::new(Op::Cast, dtype, Arg::None, vec![self.0.clone()]))
    }
    /// Reinterprets the bits as `dtype`, which must have the same size.
    pub fn bitcast(&self, dtype: DType) -> Val {
        Val(UOp::new(Op::Bitcast, dtype, Arg::None, vec![self.0.clone()]))
    }
    /// Lane `i` of a vector.
    pub fn gep(&self, i: u8) -> Val {
        Val(UOp::new(Op::Gep, self.dtype().lane(), Arg::Int(i as i64), vec![self.0.clone()]))
    }
    /// This scalar broadcast to `width` lanes.
    pub fn broadcast(&self, width: u8) -> Val {
        let dt = DType::vec(self.dtype().scalar().unwrap_or(Scalar::F32), width);
        Val(UOp::new(Op::Vectorize, dt, Arg::None, vec![self.0.clone()]))
    }
    /// A vector from scalar lanes.
    pub fn vectorize(lanes: &[Val]) -> Val {
        let lane = lanes.first().map(Val::dtype).unwrap_or(DType::F32);
        let dt = DType::vec(lane.scalar().unwrap_or(Scalar::F32), lanes.len() as u8);
        Val(UOp::new(Op::Vectorize, dt, Arg::None, lanes.iter().map(|l| l.0.clone()).collect()))
    }

    /// The address of element `idx` of this buffer (scalar access).
    pub fn at(&self, idx: &Val) -> Val {
        self.at_vec(idx, 1)
    }

    /// The address of `width` consecutive elements starting at `idx` (vector access).
    pub fn at_vec(&self, idx: &Val, width: u8) -> Val {
        let dt = match self.dtype() {
            DType::Ptr { scalar, space, .. } => DType::Ptr { scalar, width: width.max(1), space },
            other => other, // validate() reports the misuse with context
        };
        Val(UOp::new(Op::Index, dt, Arg::None, vec![self.0.clone(), idx.0.clone()]))
    }

    /// This value, ordered after the effects `deps` (e.g. a pointer read only after a loop
    /// that stores through it has ended).
    pub fn after(&self, deps: &[&Val]) -> Val {
        let mut src = vec![self.0.clone()];
        src.extend(deps.iter().map(|d| d.0.clone()));
        Val(UOp::new(Op::After, self.dtype(), Arg::None, src))
    }

    /// Loads through this address.
    pub fn load(&self) -> Val {
        let dt = self.dtype().pointee().unwrap_or(self.dtype());
        Val(UOp::new(Op::Load, dt, Arg::None, vec![self.0.clone()]))
    }

    /// Loads through this address where `gate` holds; elsewhere gives `alt` (memory untouched).
    pub fn load_gated(&self, gate: &Val, alt: impl IntoVal) -> Val {
        let dt = self.dtype().pointee().unwrap_or(self.dtype());
        let alt = alt.into_val(dt);
        Val(UOp::new(Op::Load, dt, Arg::None, vec![self.0.clone(), alt.0, gate.0.clone()]))
    }
}

/// Things usable as an operand: another [`Val`] or a number (a constant of the other
/// operand's dtype).
pub trait IntoVal {
    /// This operand as a node; a number becomes a constant of `like` (the other operand's
    /// dtype, broadcast for vectors).
    fn into_val(self, like: DType) -> Val;
}

impl IntoVal for Val {
    fn into_val(self, _: DType) -> Val {
        self
    }
}
impl IntoVal for &Val {
    fn into_val(self, _: DType) -> Val {
        self.clone()
    }
}
macro_rules! number_into_val {
    ($($t:ty),*) => {$(
        impl IntoVal for $t {
            fn into_val(self, like: DType) -> Val {
                Val::constant(like, self as f64)
            }
        }
    )*};
}
number_into_val!(i32, i64, usize, u32, f32, f64);

macro_rules! binop {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<R: IntoVal> ops::$trait<R> for Val {
            type Output = Val;
            fn $method(self, rhs: R) -> Val {
                let rhs = rhs.into_val(self.dtype());
                self.bin($op, &rhs)
            }
        }
        impl<R: IntoVal> ops::$trait<R> for &Val {
            type Output = Val;
            fn $method(self, rhs: R) -> Val {
                let rhs = rhs.into_val(self.dtype());
                self.bin($op, &rhs)
            }
        }
    };
}
binop!(Add, add, Op::Add);
binop!(Sub, sub, Op::Sub);
binop!(Mul, mul, Op::Mul);
binop!(Rem, rem, Op::Mod);
binop!(BitAnd, bitand, Op::And);
binop!(BitOr, bitor, Op::Or);
binop!(BitXor, bitxor, Op::Xor);
binop!(Shl, shl, Op::Shl);
binop!(Shr, shr, Op::Shr);

/// `/` is float division for floats and truncating division for integers.
impl<R: IntoVal> ops::Div<R> for &Val {
    type Output = Val;
    fn div(self, rhs: R) -> Val {
        let rhs = rhs.into_val(self.dtype());
        self.bin(if self.dtype().is_float() { Op::Div } else { Op::Idiv }, &rhs)
    }
}
impl<R: IntoVal> ops::Div<R> for Val {
    type Output = Val;
    fn div(self, rhs: R) -> Val {
        &self / rhs
    }
}
impl ops::Neg for Val {
    type Output = Val;
    fn neg(self) -> Val {
        self.un(Op::Neg)
    }
}
impl ops::Neg for &Val {
    type Output = Val;
    fn neg(self) -> Val {
        self.un(Op::Neg)
    }
}

/// Collects the effects of a kernel and hands out its inputs.
#[derive(Default)]
pub struct KernelBuilder {
    effects: Vec<Arc<UOp>>,
    next_axis: i64,
    next_acc: i64,
}

/// An accumulator under construction.
#[derive(Clone, Debug)]
pub struct Acc {
    acc: Val,
    ranges: Vec<Val>,
}

impl Acc {
    /// The current value (read inside the loop).
    pub fn get(&self) -> Val {
        self.acc.clone()
    }

    /// Sets the accumulator to `v` for the next iteration and returns the value the
    /// accumulator has after all its reduce loops have run.
    pub fn update(&self, v: &Val) -> Val {
        let assign = Val(UOp::new(Op::Assign, self.acc.dtype(), Arg::None, vec![self.acc.0.clone(), v.0.clone()]));
        let mut out = assign;
        for r in self.ranges.iter().rev() {
            out = Val(UOp::new(Op::End, out.dtype(), Arg::None, vec![r.0.clone(), out.0.clone()]));
        }
        out
    }
}

impl KernelBuilder {
    /// An empty kernel: no effects, loop axes and accumulator ids counted from 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// An integer variable bound at launch, with inclusive bounds.
    pub fn var(&mut self, name: &str, min: i64, max: i64) -> Val {
        Val(UOp::new(Op::DefineVar, DType::INDEX, Arg::Var { name: name.into(), min, max }, vec![]))
    }

    /// Buffer parameter `slot` of `len` elements of `scalar`.
    pub fn param(&mut self, slot: usize, scalar: Scalar, len: impl IntoVal) -> Val {
        let len = len.into_val(DType::INDEX);
        let dt = DType::Ptr { scalar, width: 1, space: AddrSpace::Global };
        Val(UOp::new(Op::Param, dt, Arg::Int(slot as i64), vec![len.0]))
    }

    /// Direct global launch index `idx{axis}` (axis < 3) over `0..extent`; the backend picks any
    /// local size unless a `gidxN` is also used (then groups are one item).
    pub fn global(&mut self, axis: u8, extent: impl IntoVal) -> Val {
        self.special(&format!("idx{axis}"), extent)
    }

    /// A launch index by name: `gidxN`/`lidxN` (grouped) or `idxN` (direct global).
    pub fn special(&mut self, name: &str, extent: impl IntoVal) -> Val {
        let extent = extent.into_val(DType::INDEX);
        Val(UOp::new(Op::Special, DType::INDEX, Arg::Str(name.into()), vec![extent.0]))
    }

    /// Opens a loop over `0..extent`. Loops opened later nest inside earlier ones when used together.
    pub fn range(&mut self, extent: impl IntoVal) -> Val {
        let extent = extent.into_val(DType::INDEX);
        let axis = self.next_axis;
        self.next_axis += 1;
        Val(UOp::new(Op::Range, DType::INDEX, Arg::Int(axis), vec![extent.0]))
    }

    /// An accumulator starting at `init`, reduced over `ranges`.
    pub fn acc(&mut self, init: &Val, ranges: &[&Val]) -> Acc {
        let mut src = vec![init.0.clone()];
        src.extend(ranges.iter().map(|r| r.0.clone()));
        self.next_acc += 1;
        Acc {
            acc: Val(UOp::new(Op::DefineAcc, init.dtype(), Arg::Int(self.next_acc), src)),
            ranges: ranges.iter().map(|r| (*r).clone()).collect(),
        }
    }

    /// Stores `v` at `addr`; returns the store effect (already recorded for the SINK unless
    /// it lies in a loop: close loops with [`KernelBuilder::end`]).
    pub fn store(&mut self, addr: &Val, v: &Val) -> Val {
        self.store_hinted(addr, v, StoreHint::Normal)
    }

    /// [`KernelBuilder::store`] with a [`StoreHint`], e.g. a non-temporal store for an output
    /// that is written once and not read again soon.
    pub fn store_hinted(&mut self, addr: &Val, v: &Val, hint: StoreHint) -> Val {
        let s = Val(UOp::new(Op::Store, DType::Void, hint.arg(), vec![addr.0.clone(), v.0.clone()]));
        self.effects.push(s.0.clone());
        s
    }

    /// Stores `v` at `addr` where `gate` holds.
    pub fn store_gated(&mut self, addr: &Val, v: &Val, gate: &Val) -> Val {
        let s = Val(UOp::new(Op::Store, DType::Void, Arg::None, vec![addr.0.clone(), v.0.clone(), gate.0.clone()]));
        self.effects.push(s.0.clone());
        s
    }

    /// Closes `range` after `effects` (stores inside the loop). The recorded effects are
    /// replaced by the END.
    pub fn end(&mut self, range: &Val, effects: &[&Val]) -> Val {
        self.effects.retain(|e| !effects.iter().any(|x| Arc::ptr_eq(&x.0, e)));
        let mut src = vec![range.0.clone()];
        src.extend(effects.iter().map(|e| e.0.clone()));
        let e = Val(UOp::new(Op::End, DType::Void, Arg::None, src));
        self.effects.push(e.0.clone());
        e
    }

    /// Validates and returns the kernel's SINK.
    ///
    /// # Errors
    /// [`IrError::Type`] for a node that breaks an operand or dtype rule ([`crate::validate`],
    /// e.g. adding an f32 to an i32), [`IrError::Structure`] for loops that cannot be laid out
    /// ([`crate::linearize`], e.g. more than [`crate::MAX_LOOPS`]).
    pub fn finish(self) -> Result<Arc<UOp>, IrError> {
        let sink = UOp::new(Op::Sink, DType::Void, Arg::None, self.effects);
        validate(&sink)?;
        crate::linearize::linearize(&sink)?;
        Ok(sink)
    }
}
