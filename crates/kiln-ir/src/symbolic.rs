//! Evaluation of integer expressions over bound variables (launch sizes, PARAM sizes).
//!
//! Every step is checked: a missing variable, a value outside its declared `[min, max]`,
//! an overflow or a division by zero is an [`IrError`], never a panic or a wrapped value.

use std::sync::Arc;

use crate::IrError;
use crate::uop::{Arg, Op, UOp};

/// Evaluates `expr`, looking variables up by name with `lookup`.
pub fn eval_int(expr: &Arc<UOp>, lookup: &dyn Fn(&str) -> Option<i64>) -> Result<i64, IrError> {
    let overflow = |what: &str| IrError::Eval(format!("integer overflow evaluating {what}"));
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
        Op::Bind => eval_int(&expr.src()[1], lookup)?,
        Op::Cast | Op::After => eval_int(&expr.src()[0], lookup)?,
        Op::Neg => eval_int(&expr.src()[0], lookup)?.checked_neg().ok_or_else(|| overflow("NEG"))?,
        Op::Abs => eval_int(&expr.src()[0], lookup)?.checked_abs().ok_or_else(|| overflow("ABS"))?,
        op if op.is_binary() => {
            let a = eval_int(&expr.src()[0], lookup)?;
            let b = eval_int(&expr.src()[1], lookup)?;
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
            if eval_int(&expr.src()[0], lookup)? != 0 {
                eval_int(&expr.src()[1], lookup)?
            } else {
                eval_int(&expr.src()[2], lookup)?
            }
        }
        op => {
            return Err(IrError::Eval(format!("{op} is not allowed in a size expression")));
        }
    };
    Ok(v)
}

/// The DEFINE_VARs below `root`, sorted by name, each once.
pub fn variables(root: &Arc<UOp>) -> Vec<Arc<UOp>> {
    let mut vars: Vec<Arc<UOp>> = root.toposort().into_iter().filter(|n| n.op() == Op::DefineVar).collect();
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
    }
}
