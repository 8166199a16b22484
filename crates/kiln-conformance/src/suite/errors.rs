//! The bad-input catalogue: every way a caller can get a kernel or a launch wrong must be a
//! typed error that says what was wrong, never a panic, a hang, or a silent launch. After
//! each refused launch the output is untouched and the device still works.

use std::sync::Arc;

use kiln_device::kiln_ir::{Arg, DType, IrError, KernelBuilder, Op, Scalar, UOp, Val, parse, parse_kernel};
use kiln_device::{Buffer, Device, Error, Kernel};

use crate::kernels::compile;
use crate::{Failure, Outcome, ensure, expect_err};

/// A text kernel `c[i] = a[i] + b[i]` for `i < n`.
const ADD_TEXT: &str = "\
# kiln kernel v1
%n   = DEFINE_VAR i32 \"n\" 1 64
%a   = PARAM ptr<f32> 0 (%n)
%b   = PARAM ptr<f32> 1 (%n)
%c   = PARAM ptr<f32> 2 (%n)
%i   = SPECIAL i32 \"idx0\" (%n)
%pa  = INDEX ptr<f32> (%a, %i)
%pb  = INDEX ptr<f32> (%b, %i)
%pc  = INDEX ptr<f32> (%c, %i)
%x   = LOAD f32 (%pa)
%y   = LOAD f32 (%pb)
%sum = ADD f32 (%x, %y)
%st  = STORE void (%pc, %sum)
SINK void (%st)
";

fn parse_error_at(what: &str, text: &str, line: usize, col: Option<usize>) -> Outcome {
    match parse_kernel(text) {
        Err(IrError::Parse { line: l, col: c, message }) => {
            ensure!(l == line, "{what}: error at line {l}, want line {line} ({message})");
            if let Some(col) = col {
                ensure!(c == col, "{what}: error at column {c}, want column {col} ({message})");
            }
            ensure!(!message.is_empty(), "{what}: empty message");
            Ok(())
        }
        other => Err(Failure::Violation(format!("{what}: expected a positioned parse error, got {other:?}"))),
    }
}

/// Kernel text: a valid kernel runs; malformed text, an unknown op and a dtype error are
/// reported at their line and column.
pub fn kernel_text(dev: &Arc<Device>) -> Outcome {
    let sink = parse_kernel(ADD_TEXT)?;
    let kernel = compile(dev, &sink, "conf_text_add")?;
    let a = Buffer::from_slice(dev.allocator(), &[1f32, 2.0, 3.0])?;
    let b = Buffer::from_slice(dev.allocator(), &[10f32, 20.0, 30.0])?;
    let c = Buffer::from_slice(dev.allocator(), &[0f32; 3])?;
    kernel.launch(&[&a, &b, &c], &[3])?;
    ensure!(c.to_vec::<f32>()? == [11.0, 22.0, 33.0], "the text kernel computed {:?}", c.to_vec::<f32>()?);

    let unclosed = ADD_TEXT.replace("PARAM ptr<f32> 1 (%n)", "PARAM ptr<f32> 1 (%n");
    parse_error_at("an unclosed operand list", &unclosed, 4, None)?;
    let unknown = ADD_TEXT.replace("%sum = ADD f32", "%sum = FROB f32");
    parse_error_at("an unknown op", &unknown, 12, Some(8))?;
    let mismatch = ADD_TEXT
        .replace("PARAM ptr<f32> 1", "PARAM ptr<i32> 1")
        .replace("%pb  = INDEX ptr<f32>", "%pb  = INDEX ptr<i32>")
        .replace("%y   = LOAD f32", "%y   = LOAD i32");
    parse_error_at("an ADD of f32 and i32", &mismatch, 12, Some(8))?;
    let bad_dtype = ADD_TEXT.replace("%x   = LOAD f32", "%x   = LOAD f33");
    parse_error_at("an unknown dtype", &bad_dtype, 10, None)?;
    parse_error_at("empty text", "", 1, None)?;
    Ok(())
}

/// Values must fit their dtype: a variable whose bounds do not fit it, or a constant that
/// does not (an integer out of range, a finite float beyond f32), is the validator's error,
/// never a wrapped value or a compiler error; so an i32 variable can never be bound to a
/// value beyond i32, and such a launch is refused naming the variable. Infinite and NaN
/// constants are values and render on every backend.
pub fn values_fit_their_dtypes(dev: &Arc<Device>) -> Outcome {
    let wide = ADD_TEXT.replace("DEFINE_VAR i32 \"n\" 1 64", "DEFINE_VAR i32 \"n\" 1 4294967295");
    parse_error_at("an i32 variable with max 4294967295", &wide, 2, Some(8))?;
    let widest = ADD_TEXT.replace("DEFINE_VAR i32 \"n\" 1 64", "DEFINE_VAR i32 \"n\" 1 2147483647");
    let kernel = compile(dev, &parse_kernel(&widest)?, "conf_widest_var")?;
    let buf = Buffer::from_slice(dev.allocator().clone(), &[0f32; 4])?;
    let err = expect_err(
        "binding the i32 `n` to 3000000000",
        kernel.launch(&[&buf, &buf, &buf], &[3_000_000_000]),
        |e| matches!(e, Error::Ir(IrError::VarOutOfRange { name, value: 3_000_000_000, .. }) if name == "n"),
    )?;
    ensure!(err.to_string().contains("`n`"), "the message does not name the variable: {err}");

    for bad in ["3.5e38", "-1e39"] {
        // parse, not parse_kernel: the device must validate what it is given.
        let text = format!(
            "%n = CONST i32 1\n%c = PARAM ptr<f32> 0 (%n)\n%i = CONST i32 0\n%pc = INDEX ptr<f32> (%c, %i)\n\
             %v = CONST f32 {bad}\n%st = STORE (%pc, %v)\nSINK (%st)"
        );
        let compiled = dev.compile(&parse(&text)?, Some("conf_f32_overflow"));
        expect_err(&format!("a CONST f32 {bad}"), compiled, is_type_error("CONST"))?;
    }

    let mut k = KernelBuilder::new();
    let out = k.param(0, Scalar::F32, 4);
    let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MAX];
    for (j, v) in specials.iter().enumerate() {
        k.store(&out.at(&Val::int(j as i64)), &Val::f32(*v));
    }
    let kernel = compile(dev, &k.finish()?, "conf_special_floats")?;
    let buf = Buffer::from_slice(dev.allocator().clone(), &[0f32; 4])?;
    kernel.launch(&[&buf], &[])?;
    let got = buf.to_vec::<f32>()?;
    let same = got.iter().zip(&specials).all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()));
    ensure!(same, "inf, -inf, nan and f32::MAX constants came back as {got:?}");
    Ok(())
}

/// A launch that must be refused: what it is, its variable values, the accepted error.
type Case<'a> = (&'a str, Vec<i64>, &'a dyn Fn(&Error) -> bool);

fn is_type_error(op: &'static str) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::Ir(IrError::Type { op: o, .. }) if *o == op)
}

/// Malformed graphs handed to [`Device::compile`] are refused with the validator's typed
/// error (naming the node's op), or a render error for what only the renderer can see.
pub fn malformed_graphs(dev: &Arc<Device>) -> Outcome {
    let n = UOp::index_const(8);
    let p = UOp::new(Op::Param, DType::ptr(Scalar::F32), Arg::Int(0), vec![n.clone()]);
    let i = UOp::new(Op::Special, DType::I32, Arg::Str("idx0".into()), vec![n.clone()]);
    let addr = UOp::new(Op::Index, DType::ptr(Scalar::F32), Arg::None, vec![p.clone(), i.clone()]);
    let x = UOp::new(Op::Load, DType::F32, Arg::None, vec![addr.clone()]);
    let sink = |effects: Vec<Arc<UOp>>| UOp::new(Op::Sink, DType::Void, Arg::None, effects);
    let store = |at: &Arc<UOp>, v: &Arc<UOp>| UOp::new(Op::Store, DType::Void, Arg::None, vec![at.clone(), v.clone()]);

    // ALU dtype mismatch: f32 + i32.
    let bad_add = UOp::new(Op::Add, DType::F32, Arg::None, vec![x.clone(), i.clone()]);
    let e = expect_err("ADD f32 + i32", dev.compile(&sink(vec![store(&addr, &bad_add)]), None), is_type_error("ADD"))?;
    ensure!(e.to_string().contains("different dtypes"), "ADD f32 + i32: unhelpful message `{e}`");

    // A float op on integers.
    let bad_sqrt = UOp::new(Op::Sqrt, DType::I32, Arg::None, vec![i.clone()]);
    let q = UOp::new(Op::Param, DType::ptr(Scalar::I32), Arg::Int(1), vec![n.clone()]);
    let qa = UOp::new(Op::Index, DType::ptr(Scalar::I32), Arg::None, vec![q, i.clone()]);
    expect_err(
        "SQRT of an i32",
        dev.compile(&sink(vec![store(&addr, &x), store(&qa, &bad_sqrt)]), None),
        is_type_error("SQRT"),
    )?;

    // A store through a value that is not a pointer.
    let e = expect_err("STORE through an f32", dev.compile(&sink(vec![store(&x, &x)]), None), is_type_error("STORE"))?;
    ensure!(e.to_string().contains("non-pointer"), "STORE through an f32: unhelpful message `{e}`");

    // A launch index the backends do not know.
    let w = UOp::new(Op::Special, DType::I32, Arg::Str("widx0".into()), vec![n.clone()]);
    let wa = UOp::new(Op::Index, DType::ptr(Scalar::F32), Arg::None, vec![p.clone(), w]);
    let one = UOp::const_float(DType::F32, 1.0);
    expect_err("SPECIAL `widx0`", dev.compile(&sink(vec![store(&wa, &one)]), None), |e| matches!(e, Error::Render(_)))?;

    // Buffer slots with a gap (0 and 2).
    let p2 = UOp::new(Op::Param, DType::ptr(Scalar::F32), Arg::Int(2), vec![n.clone()]);
    let a2 = UOp::new(Op::Index, DType::ptr(Scalar::F32), Arg::None, vec![p2, i.clone()]);
    expect_err("parameter slots 0 and 2", dev.compile(&sink(vec![store(&addr, &one), store(&a2, &one)]), None), |e| {
        matches!(e, Error::Render(_))
    })?;

    // A loop that is never closed.
    let r = UOp::new(Op::Range, DType::I32, Arg::Int(0), vec![n.clone()]);
    let ra = UOp::new(Op::Index, DType::ptr(Scalar::F32), Arg::None, vec![p.clone(), r]);
    expect_err("an unclosed RANGE", dev.compile(&sink(vec![store(&ra, &one)]), None), |e| {
        matches!(e, Error::Ir(IrError::Structure(_)) | Error::Render(_))
    })?;

    // A kernel that is not rooted at SINK.
    expect_err("a STORE as the root", dev.compile(&store(&addr, &one), None), |e| {
        matches!(e, Error::Render(_) | Error::Ir(_))
    })?;
    Ok(())
}

/// `out[i] = a[i]` for `i < n - 2` over two variables (`big`, `n`); the second launch axis
/// has extent `big³ / big²` (1 for `big = 1`, an overflow for `big = 2²²`); its index
/// (always 0) joins the address as `min(j, 0)` so the axis is part of the kernel.
fn checked_kernel(dev: &Device) -> Result<Kernel, Failure> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 64);
    let big = k.var("big", 1, 1 << 30);
    let a = k.param(0, Scalar::I32, &n);
    let out = k.param(1, Scalar::F32, &n);
    let i = k.global(0, &n - 2);
    let j = k.global(1, &(&big * &big * &big) / &(&big * &big));
    let at = &i + j.min(0);
    k.store(&out.at(&at), &a.at(&at).load().cast(DType::F32));
    compile(dev, &k.finish()?, "conf_checked")
}

/// Launch arguments are checked before anything runs: variable count and bounds, launch
/// dimensions (≤ 0, overflow), buffer count, size and dtype. Refused launches leave the
/// output untouched and the kernel usable.
pub fn launch_checks(dev: &Arc<Device>) -> Outcome {
    let kernel = checked_kernel(dev)?;
    ensure!(kernel.spec.var_names == ["big", "n"], "var_names {:?}, want [big, n]", kernel.spec.var_names);
    let a = Buffer::from_slice(dev.allocator(), &(0..64).collect::<Vec<i32>>())?;
    let out = Buffer::from_slice(dev.allocator(), &[-1f32; 64])?;
    let untouched = |what: &str| -> Outcome {
        ensure!(out.to_vec::<f32>()?.iter().all(|v| *v == -1.0), "{what}: a refused launch wrote the output");
        Ok(())
    };
    let launch = |bufs: &[&Buffer], vals: &[i64]| kernel.launch(bufs, vals);
    let is_launch = |e: &Error| matches!(e, Error::Launch(_));
    let out_of_range = |e: &Error| matches!(e, Error::Ir(IrError::VarOutOfRange { .. }));

    let cases: [Case; 8] = [
        ("n = 65 above its max 64", vec![1, 65], &out_of_range),
        ("big = 0 below its min 1", vec![0, 10], &out_of_range),
        ("no variable values", vec![], &is_launch),
        ("one of two variable values", vec![10], &is_launch),
        ("three variable values", vec![1, 10, 3], &is_launch),
        ("launch extent n - 2 = 0", vec![1, 2], &is_launch),
        ("launch extent n - 2 = -1", vec![1, 1], &is_launch),
        ("launch extent big³/big² overflowing", vec![1 << 22, 10], &|e| {
            matches!(e, Error::Ir(IrError::Eval(_)) | Error::Launch(_))
        }),
    ];
    for (what, vals, ok) in cases {
        expect_err(what, launch(&[&a, &out], &vals), ok)?;
        untouched(what)?;
    }

    let small = Buffer::from_slice(dev.allocator(), &[0i32; 9])?;
    let as_i32 = dev.buffer(Scalar::I32, 64)?;
    let as_f64 = dev.buffer(Scalar::F64, 64)?;
    let buffer_cases: [(&str, Vec<&Buffer>); 5] = [
        ("one of two buffers", vec![&a]),
        ("three buffers for two", vec![&a, &out, &out]),
        ("a 9-element buffer where n = 10 are needed", vec![&small, &out]),
        ("an i32 buffer for an f32 parameter", vec![&a, &as_i32]),
        ("an f64 buffer for an i32 parameter", vec![&as_f64, &out]),
    ];
    for (what, bufs) in buffer_cases {
        expect_err(what, launch(&bufs, &[1, 10]), is_launch)?;
        untouched(what)?;
    }

    // The kernel still works, and exactly n - 2 elements are written.
    launch(&[&a, &out], &[1, 10])?;
    let got = out.to_vec::<f32>()?;
    let want: Vec<f32> = (0..64).map(|v| if v < 8 { v as f32 } else { -1.0 }).collect();
    ensure!(got == want, "after the refused launches, a valid launch wrote {got:?}");
    Ok(())
}

/// A work group larger than the device allows is refused with [`Error::Launch`] before
/// anything runs; a device that can run it must compute the right result.
pub fn oversized_work_group(dev: &Arc<Device>) -> Outcome {
    let local = 1i64 << 14;
    let mut k = KernelBuilder::new();
    let out = k.param(0, Scalar::I32, 2 * local);
    let (g, l) = (k.special("gidx0", 2), k.special("lidx0", local));
    let flat = &g * local + &l;
    k.store(&out.at(&flat), &(&flat + 1));
    let kernel = compile(dev, &k.finish()?, "conf_big_group")?;
    let buf = Buffer::from_slice(dev.allocator(), &vec![0i32; 2 * local as usize])?;
    match kernel.launch(&[&buf], &[]) {
        Ok(()) => {
            let got = buf.to_vec::<i32>()?;
            let bad = got.iter().enumerate().filter(|(e, v)| **v != *e as i32 + 1).count();
            ensure!(bad == 0, "a work group of {local} items ran but {bad} results are wrong");
        }
        Err(Error::Launch(m)) => {
            println!("note: {} refuses work groups of {local}: {m}", dev.spec());
            ensure!(buf.to_vec::<i32>()?.iter().all(|v| *v == 0), "a refused launch wrote the output");
        }
        Err(e) => return Err(Failure::Violation(format!("a work group of {local} items: wrong error {e:?}"))),
    }
    Ok(())
}

/// A buffer of another device is refused at launch.
pub fn foreign_buffer(dev: &Arc<Device>, peer: &Arc<Device>) -> Outcome {
    let kernel = checked_kernel(dev)?;
    let a = Buffer::from_slice(peer.allocator(), &[1i32; 64])?;
    let out = Buffer::from_slice(dev.allocator(), &[-1f32; 64])?;
    ensure!(
        dev.spec().base_type() != peer.spec().base_type(),
        "the peer {} is a device of the same backend as {}: pair it with another backend, or list this test \
         as unsupported in the backend's registration",
        peer.spec(),
        dev.spec()
    );
    let e = expect_err(
        &format!("a {} buffer passed to a {} kernel", peer.spec(), dev.spec()),
        kernel.launch(&[&a, &out], &[1, 10]),
        |e| matches!(e, Error::Launch(_)),
    )?;
    ensure!(e.to_string().contains(&peer.spec().to_string()), "the error does not name the buffer's device: {e}");
    ensure!(out.to_vec::<f32>()?.iter().all(|v| *v == -1.0), "a refused launch wrote the output");
    Ok(())
}
