//! Evaluation of integer expressions over bound variables (launch sizes, PARAM sizes).
//!
//! Every step is checked: a missing variable, a value outside its declared `[min, max]`,
//! an overflow or a division by zero is an [`IrError`], never a panic or a wrapped value.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use crate::IrError;
use crate::dtype::DType;
use crate::uop::{Arg, Op, UOp};

/// Evaluates `expr`, looking variables up by name with `lookup`.
///
/// Never recurses deeper than a small fixed bound and visits each node once however deep
/// or shared the expression is: a size expression built as a 100,000-deep chain, or as a DAG
/// whose tree unfolding is exponential, is evaluated on an ordinary thread stack in time
/// linear in its nodes.
///
/// # Errors
/// [`IrError::MissingVar`] when `lookup` has no value for a variable,
/// [`IrError::VarOutOfRange`] when its value is outside the variable's bounds, and
/// [`IrError::Eval`] on overflow (of i64, or of the dtype a node is declared in: the kernel
/// would compute a wrapped value), division by zero, or an op that is not integer arithmetic
/// (a load, a float constant).
pub fn eval_int(expr: &Arc<UOp>, lookup: &dyn Fn(&str) -> Option<i64>) -> Result<i64, IrError> {
    let mut budget = SHALLOW_NODES;
    match eval_shallow(expr, lookup, SHALLOW_DEPTH, &mut budget) {
        Some(result) => result,
        None => eval_deep(expr, lookup),
    }
}

/// Size expressions are almost always a handful of nodes: those are evaluated depth-first
/// without allocating; anything deeper or larger goes to [`eval_deep`].
const SHALLOW_DEPTH: usize = 32;
const SHALLOW_NODES: usize = 256;

/// Depth-first evaluation within `depth` levels and `budget` node visits; `None` when the
/// expression is larger than that.
fn eval_shallow(
    node: &Arc<UOp>,
    lookup: &dyn Fn(&str) -> Option<i64>,
    depth: usize,
    budget: &mut usize,
) -> Option<Result<i64, IrError>> {
    if depth == 0 || *budget == 0 {
        return None;
    }
    *budget -= 1;
    let mut too_big = false;
    let result = step(node, lookup, &mut |src| match eval_shallow(src, lookup, depth - 1, budget) {
        Some(r) => r,
        None => {
            too_big = true;
            Err(IrError::Eval(String::new()))
        }
    });
    (!too_big).then_some(result)
}

/// Evaluates every node below `expr` once, children first, without recursion. A node's
/// failure is kept as its value, so an error in a WHERE branch that is not taken is ignored,
/// as in the depth-first evaluation.
fn eval_deep(expr: &Arc<UOp>, lookup: &dyn Fn(&str) -> Option<i64>) -> Result<i64, IrError> {
    let mut values: HashMap<*const UOp, Result<i64, IrError>> = HashMap::default();
    for node in expr.toposort() {
        let missing = || Err(IrError::Eval("an operand was not evaluated".into()));
        let v = step(&node, lookup, &mut |src| values.get(&Arc::as_ptr(src)).cloned().unwrap_or_else(missing));
        values.insert(Arc::as_ptr(&node), v);
    }
    values.remove(&Arc::as_ptr(expr)).unwrap_or_else(|| Err(IrError::Eval("empty expression".into())))
}

/// The value of one node, given `value` for its operands (asked only for the ones it needs).
fn step(
    expr: &UOp,
    lookup: &dyn Fn(&str) -> Option<i64>,
    value: &mut dyn FnMut(&Arc<UOp>) -> Result<i64, IrError>,
) -> Result<i64, IrError> {
    let overflow = |what: &str| IrError::Eval(format!("integer overflow evaluating {what}"));
    let mut operand = |i: usize| match expr.src().get(i) {
        Some(src) => value(src),
        None => Err(IrError::Eval(format!("{} is missing operand {i}", expr.op()))),
    };
    let v = match expr.op() {
        Op::Const => match expr.arg() {
            Arg::Int(v) => *v,
            Arg::Bool(b) => *b as i64,
            other => {
                return Err(IrError::Eval(format!("non-integer constant {other} in a size expression")));
            }
        },
        Op::DefineVar => {
            let Arg::Var { name, min, max } = expr.arg() else {
                return Err(IrError::Eval("DEFINE_VAR without a name".into()));
            };
            let v = lookup(name).ok_or_else(|| IrError::MissingVar(name.clone()))?;
            if v < *min || v > *max {
                return Err(IrError::VarOutOfRange { name: name.clone(), value: v, min: *min, max: *max });
            }
            v
        }
        Op::Bind => operand(1)?,
        Op::Cast | Op::After => operand(0)?,
        Op::Neg => operand(0)?.checked_neg().ok_or_else(|| overflow("NEG"))?,
        Op::Abs => operand(0)?.checked_abs().ok_or_else(|| overflow("ABS"))?,
        op if op.is_binary() => {
            let a = operand(0)?;
            let b = operand(1)?;
            let r = match op {
                Op::Add => a.checked_add(b),
                Op::Sub => a.checked_sub(b),
                Op::Mul => a.checked_mul(b),
                Op::Idiv | Op::Mod if b == 0 => {
                    return Err(IrError::Eval(format!("division by zero ({a} {op} 0)")));
                }
                Op::Idiv => a.checked_div(b),
                Op::Mod => a.checked_rem(b),
                Op::Max => Some(a.max(b)),
                Op::Min => Some(a.min(b)),
                Op::Lt => Some((a < b) as i64),
                Op::Le => Some((a <= b) as i64),
                Op::Eq => Some((a == b) as i64),
                Op::Ne => Some((a != b) as i64),
                Op::And => Some(a & b),
                Op::Or => Some(a | b),
                Op::Xor => Some(a ^ b),
                Op::Shl => u32::try_from(b).ok().and_then(|b| a.checked_shl(b)),
                Op::Shr => u32::try_from(b).ok().and_then(|b| a.checked_shr(b)),
                _ => {
                    return Err(IrError::Eval(format!("{op} is not allowed in a size expression")));
                }
            };
            r.ok_or_else(|| overflow(&format!("{a} {op} {b}")))?
        }
        Op::Where => {
            if operand(0)? != 0 {
                operand(1)?
            } else {
                operand(2)?
            }
        }
        op => {
            return Err(IrError::Eval(format!("{op} is not allowed in a size expression")));
        }
    };
    // The kernel computes the expression in its dtype: a value that does not fit would be
    // wrapped there, so a launch (or buffer size) computed from it could differ from this one.
    if let DType::Scalar(s) = expr.dtype()
        && let Some((lo, hi)) = s.int_range()
        && !(lo..=hi).contains(&i128::from(v))
    {
        return Err(IrError::Eval(format!(
            "{} gives {v}, which does not fit {s}, the dtype the kernel computes it in (it would wrap there): \
             declare the expression in a wider integer dtype or bound its variables lower",
            expr.op()
        )));
    }
    Ok(v)
}

/// The DEFINE_VARs below `root`, sorted by name, each once.
pub fn variables(root: &Arc<UOp>) -> Vec<Arc<UOp>> {
    variables_sorted(&root.toposort())
}

/// [`variables`] of the graph whose `toposort()` is `order`.
pub fn variables_sorted(order: &[Arc<UOp>]) -> Vec<Arc<UOp>> {
    let mut vars: Vec<Arc<UOp>> = order.iter().filter(|n| n.op() == Op::DefineVar).cloned().collect();
    vars.sort_by(|a, b| a.arg_name().cmp(&b.arg_name()));
    vars.dedup_by(|a, b| a.arg_name() == b.arg_name());
    vars
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn var(name: &str, min: i64, max: i64) -> Arc<UOp> {
        UOp::new(Op::DefineVar, DType::I32, Arg::Var { name: name.into(), min, max }, vec![])
    }

    #[test]
    fn evaluates_with_bounds_and_overflow_checks() {
        let n = var("n", 1, 100);
        let e = UOp::new(Op::Mul, DType::I32, Arg::None, vec![n.clone(), UOp::index_const(4)]);
        assert_eq!(eval_int(&e, &|_| Some(5)).unwrap(), 20);
        assert!(matches!(eval_int(&e, &|_| Some(101)), Err(IrError::VarOutOfRange { .. })));
        assert!(matches!(eval_int(&e, &|_| None), Err(IrError::MissingVar(_))));
        let big = UOp::new(
            Op::Mul,
            DType::I64,
            Arg::None,
            vec![UOp::const_int(DType::I64, i64::MAX), UOp::const_int(DType::I64, 2)],
        );
        assert!(matches!(eval_int(&big, &|_| None), Err(IrError::Eval(_))));
        let div0 = UOp::new(Op::Idiv, DType::I32, Arg::None, vec![n, UOp::index_const(0)]);
        assert!(eval_int(&div0, &|_| Some(3)).is_err());
        let malformed = UOp::new(Op::Bind, DType::I32, Arg::None, vec![]);
        assert!(matches!(eval_int(&malformed, &|_| None), Err(IrError::Eval(m)) if m.contains("missing operand")));
    }

    /// A value that does not fit its node's dtype is refused, though it fits i64: the kernel
    /// computes the node in that dtype and would wrap it (n·n in i32 at n = 46341).
    #[test]
    fn a_value_outside_its_dtype_is_refused() {
        let n = var("n", 1, 65536);
        let sq = |dt| UOp::new(Op::Mul, dt, Arg::None, vec![n.clone(), n.clone()]);
        assert_eq!(eval_int(&sq(DType::I32), &|_| Some(46340)).unwrap(), 46340 * 46340);
        let err = eval_int(&sq(DType::I32), &|_| Some(46341)).unwrap_err();
        assert!(matches!(&err, IrError::Eval(m) if m.contains("does not fit i32")), "{err}");
        assert_eq!(eval_int(&sq(DType::I64), &|_| Some(65536)).unwrap(), 1 << 32);
        let narrow = UOp::new(Op::Cast, DType::Scalar(crate::Scalar::U8), Arg::None, vec![n]);
        assert!(eval_int(&narrow, &|_| Some(256)).is_err());
        assert_eq!(eval_int(&narrow, &|_| Some(255)).unwrap(), 255);
    }

    /// A 100,000-deep chain `((n + 1) + 1) + ...` on a thread with an ordinary 8 MiB stack.
    #[test]
    fn a_deep_size_expression_evaluates_on_an_ordinary_stack() {
        let deep = std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(|| {
                let mut e = var("n", 0, 10);
                for _ in 0..100_000 {
                    e = UOp::new(Op::Add, DType::I64, Arg::None, vec![e, UOp::const_int(DType::I64, 1)]);
                }
                let v = eval_int(&e, &|_| Some(7));
                // A branch not taken may fail; the deep evaluation ignores it like the shallow one.
                let zero = UOp::const_int(DType::I64, 0);
                let bad = UOp::new(Op::Idiv, DType::I64, Arg::None, vec![e.clone(), zero.clone()]);
                let pick = UOp::new(Op::Where, DType::I64, Arg::None, vec![UOp::const_bool(false), bad, e]);
                (v, eval_int(&pick, &|_| Some(7)))
            })
            .unwrap();
        let (v, picked) = deep.join().expect("evaluating a deep expression overflowed the stack");
        assert_eq!(v.unwrap(), 100_007);
        assert_eq!(picked.unwrap(), 100_007);
    }

    /// `x = x + x`, 200 times: 2^200 paths, 201 distinct nodes.
    #[test]
    fn a_shared_size_expression_is_evaluated_once_per_node() {
        let mut e = var("n", 0, 10);
        for _ in 0..200 {
            e = UOp::new(Op::Add, DType::I64, Arg::None, vec![e.clone(), e]);
        }
        assert!(matches!(eval_int(&e, &|_| Some(1)), Err(IrError::Eval(m)) if m.contains("overflow")));
        let mut small = var("n", 0, 10);
        for _ in 0..20 {
            small = UOp::new(Op::Add, DType::I64, Arg::None, vec![small.clone(), small]);
        }
        assert_eq!(eval_int(&small, &|_| Some(1)).unwrap(), 1 << 20);
    }
}
