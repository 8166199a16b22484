//! Well-formedness of a kernel: operand counts, operand kinds and dtypes.
//!
//! Constructors never fail; [`validate`] is the one place that decides whether a graph is a
//! kernel. Renderers call it first, so a malformed graph is a typed error, never bad code.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use crate::IrError;
use crate::dtype::{AddrSpace, DType, Scalar};
use crate::uop::{Arg, Op, StoreHint, UOp};

/// The most work-group local memory (DEFINE_LOCAL bytes, all arrays together) a kernel may
/// declare: 32 KiB, the least an OpenCL device (full profile) offers and below CUDA's 48 KiB
/// of static shared memory, so a kernel that validates fits every backend with work groups.
pub const MAX_LOCAL_BYTES: usize = 32 * 1024;

/// Checks every node reachable from `root`. Node numbers in messages are positions in
/// `root.toposort()`, which is also the numbering the text printer uses (`%N`).
///
/// # Errors
/// [`IrError::Type`] naming the first node (in that order) that breaks a rule: a wrong
/// operand count, operand kind or dtype, an argument of the wrong kind, a constant that does
/// not fit its dtype, a variable defined twice with different bounds, or one buffer slot
/// declared with two element types.
pub fn validate(root: &Arc<UOp>) -> Result<(), IrError> {
    validate_sorted(&root.toposort())
}

/// [`validate`] for a caller that has the root's `toposort()` already (`order`): it walks the
/// graph once for both.
///
/// # Errors
/// As [`validate`].
pub fn validate_sorted(order: &[Arc<UOp>]) -> Result<(), IrError> {
    let mut var_bounds: HashMap<&str, (i64, i64)> = HashMap::default();
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
    let mut slots: HashMap<i64, DType> = HashMap::default();
    let mut locals: HashMap<i64, &Arc<UOp>> = HashMap::default();
    let mut local_bytes = 0usize;
    for (i, node) in order.iter().enumerate() {
        if node.op() == Op::DefineLocal {
            let id = node.arg_int().unwrap_or(-1);
            let err = |message: String| IrError::Type { node: i, op: "DEFINE_LOCAL", message };
            if locals.insert(id, node).is_some() {
                return Err(err(format!("local memory id {id} is declared twice with different types or sizes")));
            }
            let count = node.src()[0].arg_int().unwrap_or(0) as usize;
            local_bytes =
                local_bytes.saturating_add(count.saturating_mul(node.dtype().scalar().map_or(1, Scalar::size)));
            if local_bytes > MAX_LOCAL_BYTES {
                return Err(err(format!(
                    "the kernel declares {local_bytes} bytes of local memory so far; at most {MAX_LOCAL_BYTES} are \
                     supported: use smaller tiles"
                )));
            }
        }
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
            | Op::DefineLocal
            | Op::Gep
            | Op::Program
            | Op::Device
            | Op::Source
            | Op::Binary
            | Op::Store
            | Op::Wmma
    );
    if !takes_arg && *n.arg() != Arg::None {
        return Err(format!("takes no argument, got {}", n.arg()));
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
        Op::Sink => void(dt),
        Op::Param => {
            count(&[1])?;
            if !matches!(dt, DType::Ptr { space: AddrSpace::Global, .. }) {
                return Err(format!("must have a global pointer dtype (e.g. ptr<f32>), got {dt}"));
            }
            match n.arg() {
                Arg::Int(slot) if *slot >= 0 => {}
                other => return Err(format!("needs a slot number >= 0, got {other}")),
            }
            int_scalar(&src[0], "the element count")
        }
        Op::DefineVar => {
            count(&[0])?;
            int_scalar(n, "a variable")?;
            let Arg::Var { name, min, max } = n.arg() else {
                return Err(format!("needs a name and bounds, got {}", n.arg()));
            };
            if min > max {
                return Err(format!("`{name}` has min {min} > max {max}"));
            }
            for (what, v) in [("min", min), ("max", max)] {
                fits_int(*v as i128, dt).map_err(|range| format!("`{name}` has {what} {v}, outside {dt} {range}"))?;
            }
            Ok(())
        }
        Op::Const => {
            count(&[0])?;
            match (n.arg(), dt) {
                // A u64 constant holds the value's bits (`v as u64`): every i64 is one.
                (Arg::Int(_), DType::Scalar(Scalar::U64)) => Ok(()),
                (Arg::Int(v), DType::Scalar(s)) if s.is_int() => {
                    fits_int(*v as i128, dt).map_err(|range| format!("value {v} does not fit {dt} {range}"))
                }
                (Arg::Float(v), DType::Scalar(s)) if s.is_float() => match s.float_limits() {
                    Some((max, overflow)) if v.is_finite() && v.abs() >= overflow => Err(format!(
                        "value {v:e} is beyond the {dt} range (largest finite value {max:e}); \
                         write inf or -inf for an infinity"
                    )),
                    _ => Ok(()),
                },
                (Arg::Bool(_), DType::Scalar(Scalar::Bool)) => Ok(()),
                (arg, DType::Scalar(Scalar::Bool)) => Err(format!("a bool constant is true or false, got {arg}")),
                (arg, _) => Err(format!("value {arg} does not fit dtype {dt}")),
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
                (Op::Special, a) => Err(format!("needs a name such as \"gidx0\", got {a}")),
                (_, a) => Err(format!("needs an axis number, got {a}")),
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
            if StoreHint::from_arg(n.arg()).is_none() {
                return Err(format!("a store hint is \"nontemporal\" or none, got {}", n.arg()));
            }
            void(dt)
        }
        Op::DefineAcc => {
            if src.is_empty() {
                return Err("needs an initial value".into());
            }
            if !matches!(n.arg(), Arg::Int(_)) {
                return Err(format!("needs an accumulator id, got {}", n.arg()));
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
                let want = DType::vec(Scalar::Bool, a.width());
                return if dt == want {
                    Ok(())
                } else {
                    Err(format!("a comparison yields {want}, not {dt}: write {} {want} (...)", op.name()))
                };
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
                a => Err(format!("lane {a} out of range for {}", src[0].dtype())),
            }
        }
        Op::DefineLocal => {
            count(&[1])?;
            if !matches!(dt, DType::Ptr { space: AddrSpace::Local, .. }) {
                return Err(format!("must have a local pointer dtype (e.g. lptr<f32>), got {dt}"));
            }
            match n.arg() {
                Arg::Int(id) if *id >= 0 => {}
                other => return Err(format!("needs an id >= 0, got {other}")),
            }
            match (src[0].op(), src[0].dtype(), src[0].arg()) {
                (Op::Const, DType::Scalar(s), Arg::Int(v)) if s.is_int() && *v > 0 => Ok(()),
                _ => Err("the element count must be a positive integer CONST (local memory has a static size)".into()),
            }
        }
        Op::Barrier => {
            if src.is_empty() {
                return Err("needs the nodes it comes after (the stores it publishes)".into());
            }
            void(dt)
        }
        Op::If => {
            if src.is_empty() || src[0].dtype() != DType::BOOL {
                return Err("first operand must be the bool condition".into());
            }
            void(dt)
        }
        Op::EndIf => {
            if src.is_empty() || src[0].op() != Op::If {
                return Err("first operand must be the IF it closes".into());
            }
            void(dt)
        }
        Op::Wmma => {
            count(&[3])?;
            let Arg::Wmma(w) = n.arg() else {
                return Err(format!(
                    "needs a shape, dtypes and threads (`m16n8k16 f16 f32 threads 32`), got {}",
                    n.arg()
                ));
            };
            if let Some(why) = w.check() {
                return Err(why);
            }
            let [a, b, c] = w.operand_dtypes();
            same(c, dt, "the result (the D fragment)")?;
            for (want, s, what) in [(a, &src[0], "A"), (b, &src[1], "B"), (c, &src[2], "C")] {
                if s.dtype() != want {
                    return Err(format!("the {what} fragment of {w} is {want} per thread, got {}", s.dtype()));
                }
            }
            Ok(())
        }
        Op::Program | Op::Device | Op::Linear | Op::Source | Op::Binary => Ok(()),
        op => Err(format!("{op} is not allowed here")),
    }
}

/// Whether `v` lies in the range of the integer dtype `dt`; the error is the range as text.
fn fits_int(v: i128, dt: DType) -> Result<(), String> {
    match dt.scalar().and_then(Scalar::int_range) {
        Some((lo, hi)) if (lo..=hi).contains(&v) => Ok(()),
        Some((lo, hi)) => Err(format!("(range {lo}..={hi})")),
        None => Ok(()),
    }
}

fn value_type(dt: DType) -> Result<(), String> {
    match dt {
        DType::Scalar(_) | DType::Vector(..) => Ok(()),
        _ => Err(format!("needs a value dtype, got {dt}")),
    }
}

fn void(dt: DType) -> Result<(), String> {
    if dt == DType::Void { Ok(()) } else { Err(format!("must be void, not {dt}")) }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse, parse_kernel};

    /// The message `validate` gives for the one-line graph `line`, or `None` when it accepts it.
    fn verdict(line: &str) -> Option<String> {
        let root = parse(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        match validate(&root) {
            Ok(()) => None,
            Err(IrError::Type { message, .. }) => Some(message),
            Err(other) => panic!("{line}: not a Type error: {other:?}"),
        }
    }

    #[test]
    fn integer_values_must_fit_their_dtype() {
        for (line, needle) in [
            ("%c = CONST i16 40000", "value 40000 does not fit i16 (range -32768..=32767)"),
            ("%c = CONST i32 4294967295", "value 4294967295 does not fit i32 (range -2147483648..=2147483647)"),
            ("%c = CONST u8 300", "value 300 does not fit u8 (range 0..=255)"),
            ("%c = CONST u32 -1", "value -1 does not fit u32"),
            ("%c = CONST i8 -129", "does not fit i8"),
            ("%v = DEFINE_VAR i16 \"n\" 1 100000", "`n` has max 100000, outside i16 (range -32768..=32767)"),
            ("%v = DEFINE_VAR u32 \"n\" -1 10", "`n` has min -1, outside u32"),
            ("%v = DEFINE_VAR i32 \"n\" 1 4294967295", "`n` has max 4294967295, outside i32"),
            ("%v = DEFINE_VAR i32 \"n\" 5 1", "`n` has min 5 > max 1"),
            ("%c = CONST bool 1", "a bool constant is true or false, got 1"),
            ("%c = CONST bool 1.5", "a bool constant is true or false, got 1.5"),
        ] {
            let m = verdict(line).unwrap_or_else(|| panic!("{line} was accepted"));
            assert!(m.contains(needle), "{line}: `{m}` lacks `{needle}`");
        }
        for line in [
            "%c = CONST i16 -32768",
            "%c = CONST i16 32767",
            "%c = CONST u8 255",
            "%c = CONST i64 -9223372036854775808",
            "%c = CONST u64 18446744073709551615",
            "%c = CONST u32 4294967295",
            "%c = CONST bool true",
            "%v = DEFINE_VAR i32 \"n\" -2147483648 2147483647",
            "%v = DEFINE_VAR u8 \"n\" 0 255",
        ] {
            assert_eq!(verdict(line), None, "{line}");
        }
        // The text form of a u64 constant is its value; its argument holds the bits.
        let max = parse("%c = CONST u64 18446744073709551615").unwrap();
        assert_eq!(max.arg(), &Arg::Int(-1));
        assert!(crate::print(&max).contains("CONST u64 18446744073709551615\n"));
        assert!(parse("%c = CONST u64 -1").is_err(), "a negative u64 constant has no meaning");
    }

    #[test]
    fn finite_floats_beyond_their_dtype_are_rejected() {
        for line in [
            "%c = CONST f32 3.5e38",
            "%c = CONST f32 -1e39",
            "%c = CONST f32 3.4028235677973366e38", // half an ulp above f32::MAX: rounds to inf
            "%c = CONST f16 65520.0",
            "%c = CONST f16 -1e5",
            "%c = CONST bf16 3.4e38",
        ] {
            let m = verdict(line).unwrap_or_else(|| panic!("{line} was accepted"));
            assert!(m.contains("beyond the") && m.contains("largest finite value") && m.contains("inf"), "{m}");
        }
        for line in [
            "%c = CONST f32 3.4028234663852886e38",
            "%c = CONST f32 -3.4028235e38",
            "%c = CONST f32 1e-50", // underflow rounds to zero: fine
            "%c = CONST f16 65504.0",
            "%c = CONST f16 65519.0",
            "%c = CONST f32 inf",
            "%c = CONST f32 -inf",
            "%c = CONST f32 nan",
            "%c = CONST f64 1.7976931348623157e308",
        ] {
            assert_eq!(verdict(line), None, "{line}");
        }
    }

    #[test]
    fn integer_literals_in_hex_octal_and_binary() {
        for (text, want) in [
            ("0x10", 16),
            ("-0x10", -16),
            ("0X1F", 31),
            ("0b101", 5),
            ("0o17", 15),
            ("+7", 7),
            ("0x7fffffff", i32::MAX as i64),
        ] {
            let c = parse(&format!("%c = CONST i32 {text}")).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(c.arg(), &Arg::Int(want), "{text}");
        }
        let u = parse("%c = CONST u64 0xffffffffffffffff").unwrap();
        assert_eq!(u.arg(), &Arg::Int(-1));
        let v = parse("%v = DEFINE_VAR i32 \"n\" 0x1 0x100").unwrap();
        assert_eq!(v.arg(), &Arg::Var { name: "n".into(), min: 1, max: 256 });
        for bad in ["0x", "0xg", "0b2", "0x1.5"] {
            let Err(IrError::Parse { message, .. }) = parse(&format!("%c = CONST i32 {bad}")) else {
                panic!("{bad} parsed")
            };
            assert!(message.contains("is not") && !message.contains("bytes"), "{bad}: {message}");
        }
        // BINARY keeps reading 0x as bytes.
        assert_eq!(parse("%b = BINARY void 0x0102").unwrap().arg(), &Arg::Bytes(vec![1, 2]));
    }

    #[test]
    fn a_comparison_with_a_value_dtype_says_it_yields_bool() {
        let text = "%a = CONST f32 1.0\n%b = CONST f32 2.0\n%lt = CMPLT f32 (%a, %b)\n%n = CONST i32 1\n\
                    %p = PARAM ptr<f32> 0 (%n)\n%i = CONST i32 0\n%x = INDEX ptr<f32> (%p, %i)\n\
                    %v = WHERE f32 (%lt, %a, %b)\n%st = STORE (%x, %v)\nSINK (%st)";
        match parse_kernel(text) {
            Err(IrError::Parse { line: 3, message, .. }) => {
                assert!(message.contains("a comparison yields bool, not f32: write CMPLT bool"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn messages_show_arguments_in_the_text_format() {
        let add = UOp::new(Op::Add, DType::I32, Arg::Int(7), vec![]);
        assert!(matches!(validate(&add), Err(IrError::Type { message, .. }) if message == "takes no argument, got 7"));
        let m = verdict("%c = CONST bool 1").unwrap_or_default();
        assert!(!m.contains("Int("), "{m}");
        let gep = UOp::new(
            Op::Gep,
            DType::F32,
            Arg::Int(9),
            vec![UOp::new(
                Op::Vectorize,
                DType::Vector(Scalar::F32, 4),
                Arg::None,
                vec![UOp::const_float(DType::F32, 1.0)],
            )],
        );
        let Err(IrError::Type { message, .. }) = validate(&gep) else { panic!("lane 9 of 4 accepted") };
        assert!(message.starts_with("lane 9 out of range"), "{message}");
        let slot = UOp::new(Op::Param, DType::ptr(Scalar::F32), Arg::Str("x".into()), vec![UOp::index_const(1)]);
        let Err(IrError::Type { message, .. }) = validate(&slot) else { panic!("a named slot accepted") };
        assert!(message.ends_with("got \"x\""), "{message}");
    }

    #[test]
    fn work_group_constructs_are_checked() {
        for (text, needle) in [
            ("%n = CONST i32 0\n%t = DEFINE_LOCAL lptr<f32> 0 (%n)", "must be a positive integer CONST"),
            ("%n = DEFINE_VAR i32 \"n\" 1 8\n%t = DEFINE_LOCAL lptr<f32> 0 (%n)", "static size"),
            ("%n = CONST i32 4\n%t = DEFINE_LOCAL ptr<f32> 0 (%n)", "must have a local pointer dtype"),
            ("%n = CONST i32 4\n%t = DEFINE_LOCAL lptr<f32> -1 (%n)", "needs an id >= 0"),
            ("%n = CONST i32 8193\n%t = DEFINE_LOCAL lptr<f32> 0 (%n)", "32772 bytes of local memory"),
            ("%n = CONST i32 4\n%p = PARAM lptr<f32> 0 (%n)", "must have a global pointer dtype"),
            ("%c = CONST i32 1\n%f = IF void (%c)", "first operand must be the bool condition"),
            ("%c = CONST bool true\n%f = IF f32 (%c)", "must be void"),
            ("%c = CONST bool true\n%e = ENDIF void (%c)", "first operand must be the IF it closes"),
            ("%b = BARRIER void", "needs the nodes it comes after"),
            (
                "%n = CONST i32 4\n%m = CONST i32 8\n%t = DEFINE_LOCAL lptr<f32> 0 (%n)\n\
                 %u = DEFINE_LOCAL lptr<f32> 0 (%m)\nSINK void (%t, %u)",
                "local memory id 0 is declared twice",
            ),
        ] {
            let m = verdict(text).unwrap_or_else(|| panic!("{text} was accepted"));
            assert!(m.contains(needle), "{text}: `{m}` lacks `{needle}`");
        }
        for text in [
            "%n = CONST i32 8192\n%t = DEFINE_LOCAL lptr<f32> 0 (%n)",
            "%n = CONST u8 16\n%t = DEFINE_LOCAL lptr<f16x4> 3 (%n)",
            "%c = CONST bool true\n%f = IF (%c)\n%e = ENDIF (%f)",
        ] {
            assert_eq!(verdict(text), None, "{text}");
        }
    }

    /// Lines 7 and 8 of a [`group_kernel`]: `%is0` = `lidx0 == 0`.
    const IS0: &str = "%z = CONST i32 0\n%is0 = CMPEQ bool (%l, %z)\n";

    /// A group of 4 items; each stores 1.0 to `tmp[lidx0]`; `tail` adds lines and the SINK.
    fn group_kernel(tail: &str) -> Result<Arc<UOp>, IrError> {
        parse_kernel(&format!(
            "%c4 = CONST i32 4\n%l = SPECIAL i32 \"lidx0\" (%c4)\n%tmp = DEFINE_LOCAL lptr<f32> 0 (%c4)\n\
             %p = INDEX lptr<f32> (%tmp, %l)\n%one = CONST f32 1.0\n%st = STORE void (%p, %one)\n{tail}"
        ))
    }

    fn structure_error(tail: &str) -> String {
        match group_kernel(tail) {
            Err(IrError::Structure(m)) => m,
            other => panic!("{tail}: expected a structure error, got {other:?}"),
        }
    }

    #[test]
    fn barriers_every_item_may_not_reach_are_refused() {
        let m = structure_error(&format!(
            "{IS0}%if = IF void (%is0)\n%bar = BARRIER void (%st, %if)\n%e = ENDIF void (%if, %bar)\nSINK (%e)"
        ));
        assert!(
            m.contains("BARRIER %bar (line 10) is inside IF block %if (line 9)") && m.contains("after the ENDIF"),
            "{m}"
        );
        let m =
            structure_error("%r = RANGE i32 0 (%l)\n%b = BARRIER void (%st, %r)\n%e = END void (%r, %b)\nSINK (%e)");
        assert!(m.contains("BARRIER %b (line 8) is inside loop %r (line 7) whose extent may differ"), "{m}");
        // A barrier after the IF block, and one in a loop of a uniform extent, are fine.
        group_kernel(&format!(
            "{IS0}%if = IF void (%is0, %st)\n%e = ENDIF void (%if)\n%bar = BARRIER void (%e)\nSINK (%bar)"
        ))
        .unwrap();
        group_kernel("%r = RANGE i32 0 (%c4)\n%b = BARRIER void (%st, %r)\n%e = END void (%r, %b)\nSINK (%e)").unwrap();
    }

    #[test]
    fn if_blocks_hold_straight_line_code_and_keep_their_values() {
        let inside = "%z = CONST i32 0\n%is0 = CMPEQ bool (%l, %z)\n%if = IF void (%is0)\n%t2 = AFTER lptr<f32> (%tmp, %if)\n%x = LOAD f32 (%p)\n\
                      %x2 = AFTER f32 (%x, %if)\n%p2 = INDEX lptr<f32> (%t2, %z)\n%st2 = STORE void (%p2, %x2)\n\
                      %e = ENDIF void (%if, %st2)\n";
        let m = structure_error(&format!(
            "{inside}%late = AFTER f32 (%x2, %e)\n%st3 = STORE void (%p, %late)\nSINK (%st, %st3)"
        ));
        assert!(m.contains("%late (line 16) uses a value of IF block %if (line 9) after its ENDIF"), "{m}");
        group_kernel(&format!("{inside}SINK (%e, %st)")).unwrap();
        let m = structure_error(&format!(
            "{IS0}%if = IF void (%is0)\n%ext = AFTER i32 (%c4, %if)\n%r = RANGE i32 0 (%ext)\n%p2 = INDEX lptr<f32> (%tmp, %r)\n\
             %st2 = STORE void (%p2, %one)\n%er = END void (%r, %st2)\n%e = ENDIF void (%if, %er)\nSINK (%st, %e)"
        ));
        assert!(m.contains("loop %r (line 11) depends on IF %if (line 9)"), "{m}");
        let m = structure_error(&format!(
            "{IS0}%if = IF void (%is0)\n%t2 = AFTER lptr<f32> (%tmp, %if)\n%p2 = INDEX lptr<f32> (%t2, %z)\n\
             %st2 = STORE void (%p2, %one)\nSINK (%st, %st2)"
        ));
        assert!(m.contains("IF %if (line 9) is never closed by an ENDIF"), "{m}");
    }
}
