//! Well-formedness of a kernel: operand counts, operand kinds and dtypes.
//!
//! Constructors never fail; [`validate`] is the one place that decides whether a graph is a
//! kernel. Renderers call it first, so a malformed graph is a typed error, never bad code.

use std::collections::HashMap;
use std::sync::Arc;

use crate::IrError;
use crate::dtype::{DType, Scalar};
use crate::uop::{Arg, Op, UOp};

/// Checks every node reachable from `root`. Node numbers in messages are positions in
/// `root.toposort()`, which is also the numbering the text printer uses (`%N`).
pub fn validate(root: &Arc<UOp>) -> Result<(), IrError> {
    let order = root.toposort();
    let mut var_bounds: HashMap<&str, (i64, i64)> = HashMap::new();
    for (i, node) in order.iter().enumerate() {
        check_node(node).map_err(|message| IrError::Type { node: i, op: node.op().name(), message })?;
        if let Arg::Var { name, min, max } = node.arg()
            && var_bounds.insert(name.as_str(), (*min, *max)).is_some_and(|b| b != (*min, *max))
        {
            return Err(IrError::Type {
                node: i,
                op: node.op().name(),
                message: format!("variable `{name}` is defined twice with different bounds"),
            });
        }
    }
    let mut slots: HashMap<i64, DType> = HashMap::new();
    for (i, node) in order.iter().enumerate() {
        if node.op() == Op::Param {
            let slot = node.arg_int().unwrap_or(-1);
            if let Some(prev) = slots.insert(slot, node.dtype())
                && prev.scalar() != node.dtype().scalar()
            {
                return Err(IrError::Type {
                    node: i,
                    op: "PARAM",
                    message: format!("slot {slot} is declared as both {prev} and {}", node.dtype()),
                });
            }
        }
    }
    Ok(())
}

fn check_node(n: &UOp) -> Result<(), String> {
    let takes_arg = matches!(
        n.op(),
        Op::Param
            | Op::DefineVar
            | Op::Const
            | Op::Special
            | Op::Range
            | Op::DefineAcc
            | Op::Gep
            | Op::Program
            | Op::Device
            | Op::Source
            | Op::Binary
    );
    if !takes_arg && *n.arg() != Arg::None {
        return Err(format!("takes no argument, got {:?}", n.arg()));
    }
    let src = n.src();
    let dt = n.dtype();
    let count = |want: &[usize]| -> Result<(), String> {
        if want.contains(&src.len()) {
            Ok(())
        } else {
            Err(format!("takes {} operand(s), got {}", join(want), src.len()))
        }
    };
    let int_scalar = |u: &UOp, what: &str| -> Result<(), String> {
        match u.dtype() {
            DType::Scalar(s) if s.is_int() => Ok(()),
            other => Err(format!("{what} must be an integer scalar, got {other}")),
        }
    };
    match n.op() {
        Op::Sink => {
            if dt != DType::Void {
                return Err(format!("must be void, not {dt}"));
            }
            Ok(())
        }
        Op::Param => {
            count(&[1])?;
            if !dt.is_ptr() {
                return Err(format!("must have a pointer dtype (e.g. ptr<f32>), got {dt}"));
            }
            match n.arg() {
                Arg::Int(slot) if *slot >= 0 => {}
                other => return Err(format!("needs a slot number >= 0, got {other:?}")),
            }
            int_scalar(&src[0], "the element count")
        }
        Op::DefineVar => {
            count(&[0])?;
            match n.arg() {
                Arg::Var { min, max, .. } if min <= max => {}
                Arg::Var { name, min, max } => {
                    return Err(format!("`{name}` has min {min} > max {max}"));
                }
                other => return Err(format!("needs a name and bounds, got {other:?}")),
            }
            int_scalar(n, "a variable")
        }
        Op::Const => {
            count(&[0])?;
            match (n.arg(), dt) {
                (Arg::Int(_), DType::Scalar(s)) if s.is_int() => Ok(()),
                (Arg::Float(_), DType::Scalar(s)) if s.is_float() => Ok(()),
                (Arg::Bool(_), DType::Scalar(Scalar::Bool)) => Ok(()),
                (arg, _) => Err(format!("value {arg:?} does not fit dtype {dt}")),
            }
        }
        Op::Special | Op::Range => {
            count(&[1])?;
            int_scalar(n, "the index")?;
            int_scalar(&src[0], "the extent")?;
            if src[0].dtype() != dt {
                return Err(format!("extent dtype {} differs from index dtype {dt}", src[0].dtype()));
            }
            match (n.op(), n.arg()) {
                (Op::Special, Arg::Str(_)) | (Op::Range, Arg::Int(_)) => Ok(()),
                (Op::Special, a) => Err(format!("needs a name such as \"gidx0\", got {a:?}")),
                (_, a) => Err(format!("needs an axis number, got {a:?}")),
            }
        }
        Op::End => {
            if src.is_empty() || src[0].op() != Op::Range {
                return Err("first operand must be the RANGE it closes".into());
            }
            if dt != DType::Void && (src.len() < 2 || src[1].dtype() != dt) {
                return Err(format!("a valued END takes the dtype of its second operand, not {dt}"));
            }
            Ok(())
        }
        Op::Bind => {
            count(&[2])?;
            if src[0].op() != Op::DefineVar {
                return Err("first operand must be a DEFINE_VAR".into());
            }
            same(dt, src[0].dtype(), "the variable")?;
            same(dt, src[1].dtype(), "the bound value")
        }
        Op::After => {
            if src.is_empty() {
                return Err("needs a value operand".into());
            }
            same(dt, src[0].dtype(), "the value")
        }
        Op::Index => {
            count(&[2])?;
            let (DType::Ptr { scalar, space, .. }, DType::Ptr { scalar: s2, space: sp2, .. }) = (src[0].dtype(), dt)
            else {
                return Err(format!("indexes a pointer and yields one, got {} -> {dt}", src[0].dtype()));
            };
            if scalar != s2 || space != sp2 {
                return Err(format!("yields {dt} from a {} buffer", src[0].dtype()));
            }
            int_scalar(&src[1], "the index")
        }
        Op::Load => {
            count(&[1, 3])?;
            let Some(pointee) = src[0].dtype().pointee() else {
                return Err(format!("load through a non-pointer ({})", src[0].dtype()));
            };
            same(dt, pointee, "the pointer's element")?;
            if src.len() == 3 {
                same(dt, src[1].dtype(), "the alternative value")?;
                gate(&src[2])?;
            }
            Ok(())
        }
        Op::Store => {
            count(&[2, 3])?;
            let Some(pointee) = src[0].dtype().pointee() else {
                return Err(format!("store through a non-pointer ({})", src[0].dtype()));
            };
            same(pointee, src[1].dtype(), "the stored value")?;
            if src.len() == 3 {
                gate(&src[2])?;
            }
            if dt != DType::Void {
                return Err(format!("must be void, not {dt}"));
            }
            Ok(())
        }
        Op::DefineAcc => {
            if src.is_empty() {
                return Err("needs an initial value".into());
            }
            if !matches!(n.arg(), Arg::Int(_)) {
                return Err(format!("needs an accumulator id, got {:?}", n.arg()));
            }
            same(dt, src[0].dtype(), "the initial value")?;
            if src[1..].iter().any(|r| r.op() != Op::Range) {
                return Err("operands after the initial value must be RANGEs".into());
            }
            Ok(())
        }
        Op::Assign => {
            count(&[2])?;
            if src[0].op() != Op::DefineAcc {
                return Err("first operand must be a DEFINE_ACC".into());
            }
            same(dt, src[0].dtype(), "the accumulator")?;
            same(dt, src[1].dtype(), "the new value")
        }
        op if op.is_unary() => {
            count(&[1])?;
            same(dt, src[0].dtype(), "the operand")?;
            value_type(dt)?;
            let float_only = matches!(
                op,
                Op::Sqrt | Op::Recip | Op::Exp2 | Op::Log2 | Op::Exp | Op::Log | Op::Sin | Op::Cos | Op::Trunc
            );
            if float_only && !dt.is_float() {
                return Err(format!("needs a float operand, got {dt}"));
            }
            if op == Op::Not && dt.is_float() {
                return Err(format!("needs an integer or bool operand, got {dt}"));
            }
            Ok(())
        }
        op if op.is_binary() => {
            count(&[2])?;
            let (a, b) = (src[0].dtype(), src[1].dtype());
            if a != b {
                return Err(format!("operands have different dtypes: {a} and {b}"));
            }
            value_type(a)?;
            if op.is_comparison() {
                return same(dt, DType::vec(Scalar::Bool, a.width()), "a comparison result");
            }
            same(dt, a, "the operands")?;
            match op {
                Op::Div | Op::Pow if !dt.is_float() => Err(format!("needs float operands, got {dt}")),
                Op::Idiv | Op::Mod | Op::Shl | Op::Shr if !dt.is_int() => {
                    Err(format!("needs integer operands, got {dt}"))
                }
                Op::And | Op::Or | Op::Xor if dt.is_float() => Err(format!("needs integer or bool operands, got {dt}")),
                _ => Ok(()),
            }
        }
        Op::Where => {
            count(&[3])?;
            let c = src[0].dtype();
            if c != DType::BOOL && c != DType::vec(Scalar::Bool, dt.width()) {
                return Err(format!("condition must be bool, got {c}"));
            }
            same(dt, src[1].dtype(), "the true value")?;
            same(dt, src[2].dtype(), "the false value")
        }
        Op::MulAcc => {
            count(&[3])?;
            for s in src {
                same(dt, s.dtype(), "every operand")?;
            }
            value_type(dt)
        }
        Op::Cast => {
            count(&[1])?;
            value_type(dt)?;
            value_type(src[0].dtype())?;
            if src[0].dtype().width() != dt.width() {
                return Err(format!("cannot change the lane count ({} -> {dt})", src[0].dtype()));
            }
            Ok(())
        }
        Op::Bitcast => {
            count(&[1])?;
            value_type(dt)?;
            if src[0].dtype().size() != dt.size() {
                return Err(format!("size differs: {} -> {dt}", src[0].dtype()));
            }
            Ok(())
        }
        Op::Vectorize => {
            let DType::Vector(_, w) = dt else {
                return Err(format!("must produce a vector, got {dt}"));
            };
            if src.len() != 1 && src.len() != w as usize {
                return Err(format!("needs 1 or {w} operands, got {}", src.len()));
            }
            for s in src {
                same(dt.lane(), s.dtype(), "a lane")?;
            }
            Ok(())
        }
        Op::Gep => {
            count(&[1])?;
            let w = src[0].dtype().width();
            let DType::Vector(..) = src[0].dtype() else {
                return Err(format!("extracts from a vector, got {}", src[0].dtype()));
            };
            match n.arg() {
                Arg::Int(l) if (0..w as i64).contains(l) => same(dt, src[0].dtype().lane(), "the lane"),
                a => Err(format!("lane {a:?} out of range for {}", src[0].dtype())),
            }
        }
        Op::Program | Op::Device | Op::Linear | Op::Source | Op::Binary => Ok(()),
        op => Err(format!("{op} is not allowed here")),
    }
}

fn value_type(dt: DType) -> Result<(), String> {
    match dt {
        DType::Scalar(_) | DType::Vector(..) => Ok(()),
        _ => Err(format!("needs a value dtype, got {dt}")),
    }
}

fn gate(g: &UOp) -> Result<(), String> {
    if g.dtype() == DType::BOOL { Ok(()) } else { Err(format!("gate must be bool, got {}", g.dtype())) }
}

fn same(want: DType, got: DType, what: &str) -> Result<(), String> {
    if want == got { Ok(()) } else { Err(format!("dtype mismatch: expected {want} for {what}, got {got}")) }
}

fn join(v: &[usize]) -> String {
    v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" or ")
}
