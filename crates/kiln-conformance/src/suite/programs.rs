//! Programs: every ALU op on every dtype against the Rust reference ([`crate::reference`]),
//! casts, bitcasts, vectors, variables, launch dimensions and gated memory access.
//!
//! Compiles are the expensive part (tens of milliseconds each), so each check builds one
//! kernel that covers many cases: all ops of one dtype, all casts between a set of dtypes.

use std::sync::Arc;

use kiln_device::kiln_ir::{Arg, DType, KernelBuilder, Op, Scalar, StoreHint, UOp, Val};
use kiln_device::{Buffer, Device, Kernel};

use crate::host::{Value, decode, download, normalize, upload};
use crate::kernels::{compile, compile_optional};
use crate::reference::{self, COMPARISONS};
use crate::{Failure, Mismatches, Outcome, ensure};

/// Samples per operand: every op runs once on each sample index.
const N: usize = 16;

/// Dtypes a backend may lack; their kernels are skipped (with a note) when the renderer
/// refuses them.
fn is_optional(s: Scalar) -> bool {
    matches!(s, Scalar::F64 | Scalar::F16 | Scalar::BF16)
}

fn compile_for(dev: &Device, sink: &Arc<UOp>, name: &str, dtypes: &[Scalar]) -> Result<Option<Kernel>, Failure> {
    match dtypes.iter().find(|s| is_optional(**s)) {
        Some(&s) => compile_optional(dev, sink, name, s),
        None => compile(dev, sink, name).map(Some),
    }
}

fn node(op: Op, dtype: DType, srcs: &[&Val]) -> Val {
    Val(UOp::new(op, dtype, Arg::None, srcs.iter().map(|v| v.0.clone()).collect()))
}

/// The smallest and largest value of integer type `s`.
fn int_bounds(s: Scalar) -> (i128, i128) {
    let bits = (s.size() * 8) as u32;
    if s.is_signed() { (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1) } else { (0, (1i128 << bits) - 1) }
}

/// Three operand columns for dtype `s`, normalized to it. They include a zero divisor and
/// `MIN / -1`, whose results the IR defines.
fn samples(s: Scalar) -> [Vec<Value>; 3] {
    let norm = |v: Vec<Value>| v.into_iter().map(|v| normalize(v, s)).collect::<Vec<_>>();
    if s == Scalar::Bool {
        let a = (0..N).map(|i| Value::B(i % 2 == 1)).collect();
        let b = (0..N).map(|i| Value::B(i % 4 >= 2)).collect();
        let c = (0..N).map(|i| Value::B(i % 3 == 0)).collect();
        return [a, b, c];
    }
    if s.is_float() {
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        let a = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.75, 10.0, -7.25, 100.5, 1e-3, -1e3, nan, inf, -inf, 2.0];
        let b = [2.0, 3.0, -0.5, 4.0, 1.5, 2.0, -3.0, 0.25, 10.0, -1.0, nan, 7.0, 1.0, -2.0, 5.0, 0.0];
        let c = [1.0, -1.0, 0.5, 0.25, -3.0, 8.0, 1e3, -0.125, 2.0, 0.0, 1.0, -2.0, 3.0, inf, 1.0, -1.0];
        let col = |v: [f64; N]| norm(v.iter().map(|x| Value::F(*x)).collect());
        return [col(a), col(b), col(c)];
    }
    let (min, max) = int_bounds(s);
    let a = [0, 1, -1, 2, -2, 7, -7, 100, -100, 12345, -12345, max, min, max - 1, min + 1, 42];
    let b = [3, -3, 0, 7, -7, 5, 5, 1, -1, 13, 300, 2, -1, -1, -2, 31];
    let c = [5, -5, 0, 1, max, min, 3, -3, 77, -77, 1000, 0, 9, -9, 2, 100];
    let col = |v: [i128; N]| norm(v.iter().map(|x| Value::I(*x)).collect());
    [col(a), col(b), col(c)]
}

fn conditions() -> Vec<Value> {
    (0..N).map(|i| Value::B([0, 3, 4, 5, 8, 10, 13, 15].contains(&i))).collect()
}

/// Every unary, binary, comparison and ternary op meaningful on dtype `s`, in one kernel,
/// against the Rust reference (WHERE picks between a and c, so every operand is used).
/// Slots: a, b, c (operands), g (WHERE condition), out (one
/// block of N per value op), cmp (one block of N per comparison).
pub fn alu(dev: &Arc<Device>, s: Scalar) -> Outcome {
    alu_lanes(dev, s, 1)
}

/// [`alu`] on `width`-lane vectors of `s` (`width` divides N): every op lane-wise, the
/// comparisons as bool vectors, WHERE with a bool-vector condition. On the CPU, the wider
/// vectors take the instruction-set-specific paths of its dialect (AVX-512, AVX2, SSE2 on
/// the `cpu`, `cpu-avx2` and `cpu-sse2` backends).
pub fn alu_lanes(dev: &Arc<Device>, s: Scalar, width: u8) -> Outcome {
    let (w, dt) = (usize::from(width), DType::vec(s, width));
    ensure!(w > 0 && N.is_multiple_of(w), "suite bug: {width} lanes do not divide {N} samples");
    let ops: Vec<Op> = [reference::unary_ops(s), reference::binary_ops(s), reference::ternary_ops(s)].concat();
    let mut k = KernelBuilder::new();
    let (pa, pb, pc) = (k.param(0, s, N), k.param(1, s, N), k.param(2, s, N));
    let pg = k.param(3, Scalar::Bool, N);
    let out = k.param(4, s, N * ops.len());
    let cmp = k.param(5, Scalar::Bool, N * COMPARISONS.len());
    let i = k.global(0, N / w);
    let at = |p: &Val, block: usize| {
        let idx = &(&i * w as i64) + (block * N) as i64;
        if width == 1 { p.at(&idx) } else { p.at_vec(&idx, width) }
    };
    let (x, y, z, g) = (at(&pa, 0).load(), at(&pb, 0).load(), at(&pc, 0).load(), at(&pg, 0).load());
    for (j, &op) in ops.iter().enumerate() {
        let v = match op {
            Op::Where => node(op, dt, &[&g, &x, &z]),
            Op::MulAcc => node(op, dt, &[&x, &y, &z]),
            op if op.is_unary() => node(op, dt, &[&x]),
            op => node(op, dt, &[&x, &y]),
        };
        k.store(&at(&out, j), &v);
    }
    for (j, &op) in COMPARISONS.iter().enumerate() {
        k.store(&at(&cmp, j), &node(op, DType::vec(Scalar::Bool, width), &[&x, &y]));
    }
    let sink = k.finish()?;
    let name = if width == 1 { format!("conf_alu_{s}") } else { format!("conf_alu_{s}x{width}") };
    let Some(kernel) = compile_for(dev, &sink, &name, &[s])? else { return Ok(()) };

    let [a, b, c] = samples(s);
    let conds = conditions();
    let bufs = [upload(dev, s, &a)?, upload(dev, s, &b)?, upload(dev, s, &c)?, upload(dev, Scalar::Bool, &conds)?];
    let out_buf = dev.buffer(s, N * ops.len())?;
    out_buf.copyin(&vec![0; out_buf.nbytes()])?;
    let cmp_buf = dev.buffer(Scalar::Bool, N * COMPARISONS.len())?;
    cmp_buf.copyin(&vec![0; cmp_buf.nbytes()])?;
    kernel.launch(&[&bufs[0], &bufs[1], &bufs[2], &bufs[3], &out_buf, &cmp_buf], &[])?;

    let (got, got_cmp) = (download(&out_buf)?, download(&cmp_buf)?);
    let mut bad = Mismatches::new();
    let value_ops = ops.iter().enumerate().map(|(j, op)| (*op, &got[j * N..(j + 1) * N]));
    let cmp_ops = COMPARISONS.iter().enumerate().map(|(j, op)| (*op, &got_cmp[j * N..(j + 1) * N]));
    for (op, results) in value_ops.chain(cmp_ops) {
        for (i, g) in results.iter().enumerate() {
            let args = match op {
                Op::Where => vec![conds[i], a[i], c[i]],
                Op::MulAcc => vec![a[i], b[i], c[i]],
                op if op.is_unary() => vec![a[i]],
                _ => vec![a[i], b[i]],
            };
            let Some(want) = reference::alu(op, s, &args) else {
                return Err(Failure::Violation(format!("suite bug: no reference for {op} on {s}")));
            };
            if !reference::accepts(op, s, *g, want) {
                let args: Vec<String> = args.iter().map(|v| v.to_string()).collect();
                bad.push(format!("{s} {op}({}) = {g}, want {want}", args.join(", ")));
            }
        }
    }
    bad.finish(&format!("{} ALU ops on {dt}", dev.spec()))
}

/// IDIV and MOD on integer dtype `s` over a table of edge cases (zero divisors, `MIN / -1`,
/// the extremes, both signs), scalar and 4-lane vector, with a divisor from memory and with
/// constant divisors (0, -1, 16, 3; broadcast for vectors), against the reference: every
/// backend gives the results the IR defines, and none traps.
pub fn integer_division(dev: &Arc<Device>, s: Scalar) -> Outcome {
    let (min, max) = int_bounds(s);
    let xs = [0, 1, -1, 7, -7, min, max, min + 1];
    let ys = [0, 1, -1, 2, -2, 3, min, max];
    let pairs: Vec<(Value, Value)> = xs
        .iter()
        .flat_map(|x| ys.iter().map(move |y| (normalize(Value::I(*x), s), normalize(Value::I(*y), s))))
        .collect();
    let n = pairs.len(); // a multiple of 4
    let constants: Vec<Value> = [0, -1, 16, 3].iter().map(|c| normalize(Value::I(*c), s)).collect();
    let (dt, vt) = (DType::Scalar(s), DType::vec(s, 4));
    let mut k = KernelBuilder::new();
    let (px, py) = (k.param(0, s, n), k.param(1, s, n));
    let blocks = 4 + 4 * constants.len();
    let out = k.param(2, s, n * blocks);
    let i = k.global(0, n / 4);
    let base = &i * 4;
    let (xv, yv) = (px.at_vec(&base, 4).load(), py.at_vec(&base, 4).load());
    let mut block = 0;
    let store_vec = |k: &mut KernelBuilder, v: &Val, block: &mut usize| {
        k.store(&out.at_vec(&(&base + (*block * n) as i64), 4), v);
        *block += 1;
    };
    let scalar_lanes = |x: &dyn Fn(usize) -> Val, op: Op, y: &dyn Fn(usize) -> Val| -> Val {
        Val::vectorize(&(0..4).map(|l| node(op, dt, &[&x(l), &y(l)])).collect::<Vec<_>>())
    };
    let x_at = |l: usize| px.at(&(&base + l as i64)).load();
    let y_at = |l: usize| py.at(&(&base + l as i64)).load();
    for op in [Op::Idiv, Op::Mod] {
        let v = scalar_lanes(&x_at, op, &y_at);
        store_vec(&mut k, &v, &mut block);
    }
    for op in [Op::Idiv, Op::Mod] {
        store_vec(&mut k, &node(op, vt, &[&xv, &yv]), &mut block);
    }
    for c in &constants {
        let scalar_c = Val(UOp::const_int(dt, c.as_i128() as i64));
        let vector_c = scalar_c.broadcast(4);
        for op in [Op::Idiv, Op::Mod] {
            let v = scalar_lanes(&x_at, op, &|_| scalar_c.clone());
            store_vec(&mut k, &v, &mut block);
            store_vec(&mut k, &node(op, vt, &[&xv, &vector_c]), &mut block);
        }
    }
    let sink = k.finish()?;
    let kernel = compile(dev, &sink, &format!("conf_idiv_{s}"))?;

    let (x, y): (Vec<Value>, Vec<Value>) = pairs.iter().copied().unzip();
    let out_buf = dev.buffer(s, n * blocks)?;
    out_buf.copyin(&vec![0; out_buf.nbytes()])?;
    kernel.launch(&[&upload(dev, s, &x)?, &upload(dev, s, &y)?, &out_buf], &[])?;
    let got = download(&out_buf)?;

    let mut bad = Mismatches::new();
    let mut check = |block: usize, op: Op, what: &str, divisor: &dyn Fn(usize) -> Value| {
        for e in 0..n {
            let (g, d) = (got[block * n + e], divisor(e));
            match reference::alu(op, s, &[x[e], d]) {
                Some(want) if g.same(want) => {}
                Some(want) => bad.push(format!("{s} {what} {op}({}, {d}) = {g}, want {want}", x[e])),
                None => bad.push(format!("suite bug: no reference for {op} on {s}")),
            }
        }
    };
    check(0, Op::Idiv, "scalar", &|e| y[e]);
    check(1, Op::Mod, "scalar", &|e| y[e]);
    check(2, Op::Idiv, "vector", &|e| y[e]);
    check(3, Op::Mod, "vector", &|e| y[e]);
    for (j, c) in constants.iter().enumerate() {
        let b = 4 + 4 * j;
        check(b, Op::Idiv, "scalar by constant", &|_| *c);
        check(b + 1, Op::Idiv, "vector by constant", &|_| *c);
        check(b + 2, Op::Mod, "scalar by constant", &|_| *c);
        check(b + 3, Op::Mod, "vector by constant", &|_| *c);
    }
    bad.finish(&format!("{} integer division edge cases on {s}", dev.spec()))
}

/// Values worth casting from dtype `s`: zero, signs, fractions, the type's extremes and
/// values that overflow narrower types; NaN and infinities for floats.
fn cast_samples(s: Scalar) -> Vec<Value> {
    let v: Vec<Value> = if s == Scalar::Bool {
        (0..N).map(|i| Value::B(i % 3 != 1)).collect()
    } else if s.is_float() {
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 0.7, 255.9, 256.0, -129.5, 65504.0, 1e10, -1e10, nan, inf, -inf]
            .iter()
            .map(|f| Value::F(*f))
            .collect()
    } else {
        let (min, max) = int_bounds(s);
        [0, 1, -1, 2, 127, 128, 255, 256, -129, 32767, 65535, 65536, max, min, 12_345_678, -12_345_678]
            .iter()
            .map(|i| Value::I(*i))
            .collect()
    };
    v.into_iter().map(|v| normalize(v, s)).collect()
}

/// Every dtype kiln's C-family backends must support.
pub const CORE_DTYPES: [Scalar; 10] = [
    Scalar::Bool,
    Scalar::I8,
    Scalar::I16,
    Scalar::I32,
    Scalar::I64,
    Scalar::U8,
    Scalar::U16,
    Scalar::U32,
    Scalar::U64,
    Scalar::F32,
];

/// Casts from every dtype of `srcs` to every dtype of `dsts` for which `keep` holds, in one
/// kernel. Slots: one input per source, then one output per destination holding one block
/// of N per source.
fn cast_matrix(
    dev: &Device,
    name: &str,
    srcs: &[Scalar],
    dsts: &[Scalar],
    keep: impl Fn(Scalar, Scalar) -> bool,
) -> Outcome {
    let mut k = KernelBuilder::new();
    let ins: Vec<Val> = srcs.iter().enumerate().map(|(j, s)| k.param(j, *s, N)).collect();
    let outs: Vec<Val> = dsts.iter().enumerate().map(|(j, d)| k.param(srcs.len() + j, *d, N * srcs.len())).collect();
    let i = k.global(0, N);
    for (si, (s, p)) in srcs.iter().zip(&ins).enumerate() {
        let x = p.at(&i).load();
        for (d, o) in dsts.iter().zip(&outs) {
            if keep(*s, *d) {
                k.store(&o.at(&(&i + (si * N) as i64)), &x.cast(DType::Scalar(*d)));
            }
        }
    }
    let sink = k.finish()?;
    let all: Vec<Scalar> = srcs.iter().chain(dsts).copied().collect();
    let Some(kernel) = compile_for(dev, &sink, name, &all)? else { return Ok(()) };

    let inputs: Vec<(Vec<Value>, Buffer)> = srcs
        .iter()
        .map(|s| {
            let v = cast_samples(*s);
            let b = upload(dev, *s, &v)?;
            Ok((v, b))
        })
        .collect::<Result<_, Failure>>()?;
    let outputs: Vec<Buffer> = dsts
        .iter()
        .map(|d| {
            let b = dev.buffer(*d, N * srcs.len())?;
            b.copyin(&vec![0; b.nbytes()])?;
            Ok(b)
        })
        .collect::<Result<_, Failure>>()?;
    let bufs: Vec<&Buffer> = inputs.iter().map(|(_, b)| b).chain(&outputs).collect();
    kernel.launch(&bufs, &[])?;

    let mut bad = Mismatches::new();
    for (d, o) in dsts.iter().zip(&outputs) {
        let got = download(o)?;
        for (si, (s, (vals, _))) in srcs.iter().zip(&inputs).enumerate() {
            if !keep(*s, *d) {
                continue;
            }
            for (i, v) in vals.iter().enumerate() {
                let (g, w) = (got[si * N + i], reference::cast(*v, *s, *d));
                if !g.same(w) {
                    bad.push(format!("CAST {s} {v} -> {d} = {g}, want {w}"));
                }
            }
        }
    }
    bad.finish(&format!("{} casts ({name})", dev.spec()))
}

/// Casts between every pair of core dtypes (Rust `as` semantics, bool as `!= 0`).
pub fn casts(dev: &Arc<Device>) -> Outcome {
    cast_matrix(dev, "conf_casts", &CORE_DTYPES, &CORE_DTYPES, |_, _| true)
}

/// Casts between `extra` (f64, f16 or bf16) and every core dtype, both ways.
pub fn casts_with(dev: &Arc<Device>, extra: Scalar) -> Outcome {
    let all: Vec<Scalar> = CORE_DTYPES.iter().copied().chain([extra]).collect();
    cast_matrix(dev, &format!("conf_casts_{extra}"), &all, &all, |s, d| s == extra || d == extra)
}

/// A deterministic byte stream (splitmix64) for bit-pattern inputs.
fn pattern_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend((z ^ (z >> 31)).to_ne_bytes());
    }
    out.truncate(n);
    out
}

/// Bitcasts of the pairs `(from, to)` (equal byte sizes; vectors allowed) in one kernel: the
/// output bytes must equal the input bytes (a float NaN may come back as another NaN).
fn bitcast_group(dev: &Device, name: &str, pairs: &[(DType, DType)]) -> Outcome {
    let mut k = KernelBuilder::new();
    let i = k.global(0, N);
    let lanes = |d: DType| d.width().max(1) as usize;
    let scalar = |d: DType| d.scalar().unwrap_or(Scalar::U8);
    for (j, (from, to)) in pairs.iter().enumerate() {
        let p = k.param(2 * j, scalar(*from), N * lanes(*from));
        let o = k.param(2 * j + 1, scalar(*to), N * lanes(*to));
        let x = p.at_vec(&(&i * lanes(*from) as i64), lanes(*from) as u8).load();
        k.store(&o.at_vec(&(&i * lanes(*to) as i64), lanes(*to) as u8), &x.bitcast(*to));
    }
    let sink = k.finish()?;
    let dtypes: Vec<Scalar> = pairs.iter().flat_map(|(f, t)| [scalar(*f), scalar(*t)]).collect();
    let Some(kernel) = compile_for(dev, &sink, name, &dtypes)? else { return Ok(()) };

    let mut bufs = Vec::new();
    let mut inputs = Vec::new();
    for (j, (from, to)) in pairs.iter().enumerate() {
        let bytes = pattern_bytes(N * from.size(), j as u64 + 1);
        let inp = dev.buffer(scalar(*from), N * lanes(*from))?;
        inp.copyin(&bytes)?;
        let out = dev.buffer(scalar(*to), N * lanes(*to))?;
        out.copyin(&vec![0; out.nbytes()])?;
        inputs.push(bytes);
        bufs.push(inp);
        bufs.push(out);
    }
    kernel.launch(&bufs.iter().collect::<Vec<_>>(), &[])?;

    let mut bad = Mismatches::new();
    for (j, (from, to)) in pairs.iter().enumerate() {
        let mut got = vec![0u8; bufs[2 * j + 1].nbytes()];
        bufs[2 * j + 1].copyout(&mut got)?;
        let t = scalar(*to);
        for (e, (g, w)) in got.chunks_exact(t.size()).zip(inputs[j].chunks_exact(t.size())).enumerate() {
            let both_nan = t.is_float()
                && matches!((decode(g, t), decode(w, t)), (Ok(Value::F(a)), Ok(Value::F(b))) if a.is_nan() && b.is_nan());
            if g != w && !both_nan {
                bad.push(format!("BITCAST {from} -> {to}, element {e}: bytes {g:02x?}, want {w:02x?}"));
            }
        }
    }
    bad.finish(&format!("{} bitcasts ({name})", dev.spec()))
}

/// Bitcasts between same-size integer and f32 types, and between vectors and scalars.
pub fn bitcasts(dev: &Arc<Device>) -> Outcome {
    use Scalar::*;
    let s = DType::Scalar;
    let v = DType::Vector;
    bitcast_group(
        dev,
        "conf_bitcasts",
        &[
            (s(F32), s(U32)),
            (s(U32), s(F32)),
            (s(F32), s(I32)),
            (s(I32), s(F32)),
            (s(I8), s(U8)),
            (s(U8), s(I8)),
            (s(I16), s(U16)),
            (s(U64), s(I64)),
            (s(I64), s(U64)),
            (v(U8, 4), s(U32)),
            (s(U32), v(U8, 4)),
            (v(I16, 2), s(F32)),
            (s(F32), v(U16, 2)),
        ],
    )
}

/// Bitcasts involving f16/bf16 (their bits are plain 16-bit patterns).
pub fn bitcasts_half(dev: &Arc<Device>) -> Outcome {
    use Scalar::*;
    let s = DType::Scalar;
    bitcast_group(
        dev,
        "conf_bitcasts_half",
        &[(s(F16), s(U16)), (s(U16), s(F16)), (s(BF16), s(I16)), (s(I16), s(BF16)), (DType::Vector(F16, 2), s(U32))],
    )
}

/// Bitcasts involving f64.
pub fn bitcasts_f64(dev: &Arc<Device>) -> Outcome {
    use Scalar::*;
    let s = DType::Scalar;
    bitcast_group(
        dev,
        "conf_bitcasts_f64",
        &[(s(F64), s(U64)), (s(I64), s(F64)), (DType::Vector(I32, 2), s(F64)), (s(F64), DType::Vector(U8, 8))],
    )
}

/// Vector values: loads/stores of 3, 4, 5 and 8 lanes, lane-wise arithmetic and
/// comparisons, WHERE with a vector condition, GEP, VECTORIZE, broadcast, vector casts and
/// fused multiply-add.
pub fn vectors(dev: &Arc<Device>) -> Outcome {
    let f4 = DType::Vector(Scalar::F32, 4);
    let mut k = KernelBuilder::new();
    let (pa, pb) = (k.param(0, Scalar::F32, 4 * N), k.param(1, Scalar::F32, 4 * N));
    let outs: Vec<Val> = (2..8).map(|slot| k.param(slot, Scalar::F32, 4 * N)).collect();
    let sum_out = k.param(8, Scalar::F32, N);
    let int_out = k.param(9, Scalar::I32, 4 * N);
    let (p3, o3) = (k.param(10, Scalar::I32, 3 * N), k.param(11, Scalar::I32, 3 * N));
    let (p8, o8) = (k.param(12, Scalar::U8, 8 * N), k.param(13, Scalar::U8, 8 * N));
    let (p5, o5) = (k.param(14, Scalar::F32, 5 * N), k.param(15, Scalar::F32, 5 * N));
    let i = k.global(0, N);
    let at4 = &i * 4;
    let (va, vb) = (pa.at_vec(&at4, 4).load(), pb.at_vec(&at4, 4).load());
    ensure!(va.dtype() == f4, "a 4-wide load has dtype {}", va.dtype());
    let results = [
        &va + &vb,
        &va * &vb,
        va.lt(&vb).select(&va, &vb),
        Val::vectorize(&[vb.gep(3), vb.gep(2), vb.gep(1), vb.gep(0)]),
        va.gep(1).broadcast(4) + &vb,
        va.mul_acc(&vb, &va),
    ];
    for (o, r) in outs.iter().zip(&results) {
        k.store(&o.at_vec(&at4, 4), r);
    }
    k.store(&sum_out.at(&i), &(va.gep(0) + va.gep(3)));
    k.store(&int_out.at_vec(&at4, 4), &va.cast(DType::Vector(Scalar::I32, 4)));
    let at3 = &i * 3;
    k.store(&o3.at_vec(&at3, 3), &(p3.at_vec(&at3, 3).load() * 3 - 1));
    let at8 = &i * 8;
    k.store(&o8.at_vec(&at8, 8), &(p8.at_vec(&at8, 8).load() ^ 0x5a));
    let at5 = &i * 5;
    let v5 = p5.at_vec(&at5, 5).load();
    k.store(&o5.at_vec(&at5, 5), &(&v5 + &v5));
    let kernel = compile(dev, &k.finish()?, "conf_vectors")?;

    let a: Vec<f32> = (0..4 * N).map(|j| j as f32 * 0.5 - 3.0).collect();
    let b: Vec<f32> = (0..4 * N).map(|j| 2.0 - j as f32 * 0.25).collect();
    let i3: Vec<i32> = (0..3 * N as i32).map(|j| j * 7 - 40).collect();
    let u8s: Vec<u8> = (0..8 * N).map(|j| (j * 37 % 256) as u8).collect();
    let f5: Vec<f32> = (0..5 * N).map(|j| j as f32 * 1.25 - 9.0).collect();
    let alloc = || dev.allocator();
    let (ba, bb) = (Buffer::from_slice(alloc(), &a)?, Buffer::from_slice(alloc(), &b)?);
    let bouts: Vec<Buffer> =
        (0..6).map(|_| Buffer::from_slice(alloc(), &vec![0f32; 4 * N])).collect::<Result<_, _>>()?;
    let bsum = Buffer::from_slice(alloc(), &[0f32; N])?;
    let bint = Buffer::from_slice(alloc(), &[0i32; 4 * N])?;
    let (b3, bo3) = (Buffer::from_slice(alloc(), &i3)?, Buffer::from_slice(alloc(), &[0i32; 3 * N])?);
    let (b8, bo8) = (Buffer::from_slice(alloc(), &u8s)?, Buffer::from_slice(alloc(), &[0u8; 8 * N])?);
    let (b5, bo5) = (Buffer::from_slice(alloc(), &f5)?, Buffer::from_slice(alloc(), &vec![0f32; 5 * N])?);
    let mut bufs: Vec<&Buffer> = vec![&ba, &bb];
    bufs.extend(bouts.iter());
    bufs.extend([&bsum, &bint, &b3, &bo3, &b8, &bo8, &b5, &bo5]);
    kernel.launch(&bufs, &[])?;

    let mut bad = Mismatches::new();
    let names = ["ADD", "MUL", "WHERE(CMPLT)", "VECTORIZE(GEP 3..0)", "broadcast(GEP 1) + b", "MULACC"];
    for (r, (name, buf)) in names.iter().zip(&bouts).enumerate() {
        let got = buf.to_vec::<f32>()?;
        for j in 0..4 * N {
            let (base, lane) = (j - j % 4, j % 4);
            let want = match r {
                0 => a[j] + b[j],
                1 => a[j] * b[j],
                2 => {
                    if a[j] < b[j] {
                        a[j]
                    } else {
                        b[j]
                    }
                }
                3 => b[base + 3 - lane],
                4 => a[base + 1] + b[j],
                _ => a[j].mul_add(b[j], a[j]),
            };
            if got[j].to_bits() != want.to_bits() {
                bad.push(format!("f32x4 {name} element {j}: {} want {want}", got[j]));
            }
        }
    }
    for (j, g) in bsum.to_vec::<f32>()?.iter().enumerate() {
        let want = a[4 * j] + a[4 * j + 3];
        if *g != want {
            bad.push(format!("GEP 0 + GEP 3 at {j}: {g} want {want}"));
        }
    }
    for (j, g) in bint.to_vec::<i32>()?.iter().enumerate() {
        if *g != a[j] as i32 {
            bad.push(format!("CAST f32x4 -> i32x4 element {j}: {g} want {}", a[j] as i32));
        }
    }
    for (j, g) in bo3.to_vec::<i32>()?.iter().enumerate() {
        if *g != i3[j] * 3 - 1 {
            bad.push(format!("i32x3 v*3-1 element {j}: {g} want {}", i3[j] * 3 - 1));
        }
    }
    for (j, g) in bo8.to_vec::<u8>()?.iter().enumerate() {
        if *g != u8s[j] ^ 0x5a {
            bad.push(format!("u8x8 XOR element {j}: {g} want {}", u8s[j] ^ 0x5a));
        }
    }
    for (j, g) in bo5.to_vec::<f32>()?.iter().enumerate() {
        if *g != f5[j] + f5[j] {
            bad.push(format!("f32x5 ADD element {j}: {g} want {}", f5[j] + f5[j]));
        }
    }
    bad.finish(&format!("{} vector ops", dev.spec()))
}

/// 16-lane f32 vectors (64 bytes: one AVX-512 register) and their masks: loads and stores,
/// arithmetic, FMA, MAX/MIN (NaN lanes included), comparisons stored as bool vectors and used
/// by WHERE, a mask loaded from memory, GEP, VECTORIZE, broadcast and lane reductions (sum and
/// max, as the bench kernels reduce).
pub fn vectors_wide(dev: &Arc<Device>) -> Outcome {
    const W: usize = 16;
    let mut k = KernelBuilder::new();
    let (pa, pb) = (k.param(0, Scalar::F32, W * N), k.param(1, Scalar::F32, W * N));
    let outs: Vec<Val> = (2..10).map(|slot| k.param(slot, Scalar::F32, W * N)).collect();
    let masks: Vec<Val> = (10..12).map(|slot| k.param(slot, Scalar::Bool, W * N)).collect();
    let mask_in = k.param(12, Scalar::Bool, W * N);
    let (sum_out, max_out) = (k.param(13, Scalar::F32, N), k.param(14, Scalar::F32, N));
    let i = k.global(0, N);
    let at = &i * W as i64;
    let (va, vb) = (pa.at_vec(&at, W as u8).load(), pb.at_vec(&at, W as u8).load());
    ensure!(va.dtype() == DType::vec(Scalar::F32, W as u8), "a 16-wide load has dtype {}", va.dtype());
    let lt = va.lt(&vb);
    let results = [
        &va + &vb,
        &va * &vb,
        va.mul_acc(&vb, &va),
        va.max(&vb),
        va.min(&vb),
        lt.select(&va, &vb),
        mask_in.at_vec(&at, W as u8).load().select(&vb, &(&va - &vb)),
        Val::vectorize(&(0..W as u8).rev().map(|l| va.gep(l)).collect::<Vec<_>>()) + va.gep(5).broadcast(W as u8),
    ];
    for (o, r) in outs.iter().zip(&results) {
        k.store(&o.at_vec(&at, W as u8), r);
    }
    k.store(&masks[0].at_vec(&at, W as u8), &lt);
    k.store(&masks[1].at_vec(&at, W as u8), &va.ne(&vb));
    let (mut sum, mut max) = (vb.gep(0), vb.gep(0));
    for l in 1..W as u8 {
        sum = sum + vb.gep(l);
        max = max.max(vb.gep(l));
    }
    k.store(&sum_out.at(&i), &sum);
    k.store(&max_out.at(&i), &max);
    let kernel = compile(dev, &k.finish()?, "conf_vectors_wide")?;

    // NaN lanes in a and b (never both) and equal lanes (every 5th) exercise MAX/MIN and the
    // comparisons; b is exact in eighths, so lane sums are exact in any order.
    let a: Vec<f32> = (0..W * N)
        .map(|j| {
            if j % 7 == 3 {
                f32::NAN
            } else if j % 5 == 0 {
                1.5
            } else {
                j as f32 * 0.5 - 40.0
            }
        })
        .collect();
    let b: Vec<f32> = (0..W * N)
        .map(|j| match j {
            _ if j % 5 == 0 => 1.5,
            _ if j % 11 == 4 && j % 7 != 3 => f32::NAN,
            _ => 30.0 - ((j * 37) % 64) as f32 * 0.125,
        })
        .collect();
    let m: Vec<bool> = (0..W * N).map(|j| (j * 11) % 3 == 1).collect();
    let alloc = || dev.allocator();
    let bools = |v: &[bool]| -> Result<Buffer, Failure> {
        let buf = dev.buffer(Scalar::Bool, v.len())?;
        buf.copyin(&v.iter().map(|&x| x as u8).collect::<Vec<u8>>())?;
        Ok(buf)
    };
    let (ba, bb, bm) = (Buffer::from_slice(alloc(), &a)?, Buffer::from_slice(alloc(), &b)?, bools(&m)?);
    let bouts: Vec<Buffer> =
        (0..8).map(|_| Buffer::from_slice(alloc(), &vec![0f32; W * N])).collect::<Result<_, _>>()?;
    let bmasks: Vec<Buffer> = (0..2).map(|_| bools(&[false; W * N])).collect::<Result<_, _>>()?;
    let (bsum, bmax) = (Buffer::from_slice(alloc(), &[0f32; N])?, Buffer::from_slice(alloc(), &[0f32; N])?);
    let mut bufs: Vec<&Buffer> = vec![&ba, &bb];
    bufs.extend(bouts.iter().chain(&bmasks));
    bufs.extend([&bm, &bsum, &bmax]);
    kernel.launch(&bufs, &[])?;

    let same = |g: f32, w: f32| (g.is_nan() && w.is_nan()) || g == w;
    let mut bad = Mismatches::new();
    let names =
        ["ADD", "MUL", "MULACC", "MAX", "MIN", "WHERE(CMPLT)", "WHERE(mask from memory)", "VECTORIZE + broadcast"];
    for (r, (name, buf)) in names.iter().zip(&bouts).enumerate() {
        let got = buf.to_vec::<f32>()?;
        for j in 0..W * N {
            let (base, lane) = (j - j % W, j % W);
            let want = match r {
                0 => a[j] + b[j],
                1 => a[j] * b[j],
                2 => a[j].mul_add(b[j], a[j]),
                3 => a[j].max(b[j]),
                4 => a[j].min(b[j]),
                5 => {
                    if a[j] < b[j] {
                        a[j]
                    } else {
                        b[j]
                    }
                }
                6 => {
                    if m[j] {
                        b[j]
                    } else {
                        a[j] - b[j]
                    }
                }
                _ => a[base + W - 1 - lane] + a[base + 5],
            };
            if !same(got[j], want) {
                bad.push(format!("f32x16 {name} element {j}: {} want {want}", got[j]));
            }
        }
    }
    for (name, buf, cmp) in [("CMPLT", &bmasks[0], f32::lt as fn(&f32, &f32) -> bool), ("CMPNE", &bmasks[1], f32::ne)] {
        let mut got = vec![0u8; W * N];
        buf.copyout(&mut got)?;
        for (j, g) in got.iter().enumerate() {
            let want = cmp(&a[j], &b[j]);
            if *g != want as u8 {
                bad.push(format!("boolx16 {name} element {j}: {g} want {want}"));
            }
        }
    }
    let (sums, maxes) = (bsum.to_vec::<f32>()?, bmax.to_vec::<f32>()?);
    for g in 0..N {
        let lanes = &b[g * W..(g + 1) * W];
        let (sum, max) = (lanes.iter().sum::<f32>(), lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)));
        if !same(sums[g], sum) || !same(maxes[g], max) {
            bad.push(format!("lane reductions of vector {g}: sum {} max {}, want {sum} {max}", sums[g], maxes[g]));
        }
    }
    bad.finish(&format!("{} 16-wide vector ops", dev.spec()))
}

/// Symbolic sizes: buffer lengths, launch extents and loop bounds that are expressions over
/// variables, bound per launch (including a loop that runs zero times); variables are
/// positional in name order.
pub fn variables(dev: &Arc<Device>) -> Outcome {
    let mut k = KernelBuilder::new();
    // Declared out of name order on purpose: `vals` follow the sorted names (m, n, z).
    let z = k.var("z", 0, 4);
    let n = k.var("n", 1, 64);
    let m = k.var("m", 1, 8);
    let x = k.param(0, Scalar::F32, &n);
    let out = k.param(1, Scalar::F32, &n);
    let grid = k.param(2, Scalar::I32, &n * &m);
    let sums = k.param(3, Scalar::F32, &n);
    let zsums = k.param(4, Scalar::F32, &n);
    let i = k.global(0, &n);
    let j = k.global(1, &m);
    let xi = x.at(&i).load();
    // out[i] = x[i] * m + n (from the j = 0 items only): the value uses both variables.
    let first = j.eq(0);
    k.store_gated(&out.at(&i), &(&xi * m.cast(DType::F32) + n.cast(DType::F32)), &first);
    k.store(&grid.at(&(&j * &n + &i)), &(&i + &j * 100));
    // sums[i] = sum over r < m of (x[i] + r): a loop with a symbolic bound.
    let r = k.range(&m);
    let acc = k.acc(&Val::f32(0.0), &[&r]);
    let total = acc.update(&(acc.get() + &xi + r.cast(DType::F32)));
    k.store_gated(&sums.at(&i), &total, &first);
    // zsums[i] = sum over r < z of (x[i] + r), where z may be 0.
    let rz = k.range(&z);
    let zacc = k.acc(&Val::f32(0.0), &[&rz]);
    let ztotal = zacc.update(&(zacc.get() + &xi + rz.cast(DType::F32)));
    k.store_gated(&zsums.at(&i), &ztotal, &first);
    let kernel = compile(dev, &k.finish()?, "conf_variables")?;
    let names = &kernel.spec.var_names;
    ensure!(names == &["m", "n", "z"], "var_names {names:?}, want [m, n, z] (sorted by name)");

    let data: Vec<f32> = (0..64).map(|v| v as f32 * 0.5 + 1.0).collect();
    let xb = Buffer::from_slice(dev.allocator(), &data)?;
    let mut bad = Mismatches::new();
    for (mv, nv, zv) in [(3i64, 5i64, 0i64), (2, 17, 3), (8, 64, 4), (1, 1, 0)] {
        let ob = Buffer::from_slice(dev.allocator(), &[-1f32; 64])?;
        let gb = Buffer::from_slice(dev.allocator(), &[-1i32; 512])?;
        let sb = Buffer::from_slice(dev.allocator(), &[-1f32; 64])?;
        let zb = Buffer::from_slice(dev.allocator(), &[-1f32; 64])?;
        kernel.launch(&[&xb, &ob, &gb, &sb, &zb], &[mv, nv, zv])?;
        let (o, g, s, zs) = (ob.to_vec::<f32>()?, gb.to_vec::<i32>()?, sb.to_vec::<f32>()?, zb.to_vec::<f32>()?);
        let (mu, nu, zu) = (mv as usize, nv as usize, zv as usize);
        for e in 0..64 {
            let want = if e < nu { data[e] * mv as f32 + nv as f32 } else { -1.0 };
            if o[e] != want {
                bad.push(format!("m={mv} n={nv}: out[{e}] = {}, want {want}", o[e]));
            }
            let want_sum = if e < nu { (0..mu).fold(0f32, |acc, r| acc + data[e] + r as f32) } else { -1.0 };
            if s[e] != want_sum {
                bad.push(format!("m={mv} n={nv}: sums[{e}] = {}, want {want_sum}", s[e]));
            }
            let want_z = if e < nu { (0..zu).fold(0f32, |acc, r| acc + data[e] + r as f32) } else { -1.0 };
            if zs[e] != want_z {
                bad.push(format!("z={zv} n={nv}: zsums[{e}] = {}, want {want_z}", zs[e]));
            }
        }
        for (e, got) in g.iter().enumerate() {
            let want = if e < nu * mu { (e % nu + (e / nu) * 100) as i32 } else { -1 };
            if *got != want {
                bad.push(format!("m={mv} n={nv}: grid[{e}] = {got}, want {want}"));
            }
        }
    }
    bad.finish(&format!("{} symbolic sizes", dev.spec()))
}

/// Launch indices: grouped (`gidxN` × `lidxN`, with a symbolic group count) and direct
/// (`idx0..2`), and the two mixed (`gidx0` with `idx1`). Every work item writes its own
/// coordinates exactly once.
pub fn launch_dims(dev: &Arc<Device>) -> Outcome {
    let (l0n, l1n, g1n) = (4i64, 2i64, 2i64);
    let mut k = KernelBuilder::new();
    let groups = k.var("groups", 1, 8);
    let out = k.param(0, Scalar::I32, 8 * g1n * l0n * l1n);
    let g0 = k.special("gidx0", &groups);
    let g1 = k.special("gidx1", g1n);
    let l0 = k.special("lidx0", l0n);
    let l1 = k.special("lidx1", l1n);
    let flat = ((&g1 * &groups + &g0) * l1n + &l1) * l0n + &l0;
    let code = &g0 + &g1 * 16 + &l0 * 256 + &l1 * 4096;
    k.store(&out.at(&flat), &code);
    let grouped = compile(dev, &k.finish()?, "conf_launch_grouped")?;

    let mut k = KernelBuilder::new();
    let (e0, e1, e2) = (5i64, 3i64, 2i64);
    let out2 = k.param(0, Scalar::I32, e0 * e1 * e2);
    let (i0, i1, i2) = (k.global(0, e0), k.global(1, e1), k.global(2, e2));
    k.store(&out2.at(&((&i2 * e1 + &i1) * e0 + &i0)), &(&i0 + &i1 * 16 + &i2 * 256));
    let direct = compile(dev, &k.finish()?, "conf_launch_direct")?;

    // A group index next to a direct one: groups of one item, so `gidx0` counts its whole
    // extent (a driver-chosen group size once left most of this output unwritten on OpenCL).
    let mut k = KernelBuilder::new();
    let (m0, m1) = (64i64, 4i64);
    let out3 = k.param(0, Scalar::I32, m0 * m1);
    let (g0, i1) = (k.special("gidx0", m0), k.global(1, m1));
    k.store(&out3.at(&(&i1 * m0 + &g0)), &(&g0 + &i1 * 256));
    let mixed = compile(dev, &k.finish()?, "conf_launch_mixed")?;

    let mut bad = Mismatches::new();
    let dims = grouped.spec.launch_dims(&[3])?;
    ensure!(
        dims.global == [3, 2, 1] && dims.local == Some([4, 2, 1]),
        "grouped launch dims for groups=3: {dims:?}, want global [3, 2, 1], local [4, 2, 1]"
    );
    for groups in [3i64, 8] {
        let buf = Buffer::from_slice(dev.allocator(), &vec![-1i32; (8 * g1n * l0n * l1n) as usize])?;
        grouped.launch(&[&buf], &[groups])?;
        let got = buf.to_vec::<i32>()?;
        let mut want = vec![-1i32; got.len()];
        for (g1, g0, l1, l0) in itertools4(g1n, groups, l1n, l0n) {
            want[(((g1 * groups + g0) * l1n + l1) * l0n + l0) as usize] = (g0 + g1 * 16 + l0 * 256 + l1 * 4096) as i32;
        }
        for (e, (g, w)) in got.iter().zip(&want).enumerate() {
            if g != w {
                bad.push(format!("groups={groups}: out[{e}] = {g:#x}, want {w:#x}"));
            }
        }
    }
    let ddims = direct.spec.launch_dims(&[])?;
    ensure!(ddims.global == [5, 3, 2] && ddims.local.is_none(), "direct launch dims {ddims:?}, want [5, 3, 2] / None");
    let buf = Buffer::from_slice(dev.allocator(), &vec![-1i32; (e0 * e1 * e2) as usize])?;
    direct.launch(&[&buf], &[])?;
    for (e, g) in buf.to_vec::<i32>()?.iter().enumerate() {
        let e = e as i64;
        let want = (e % e0 + (e / e0 % e1) * 16 + (e / (e0 * e1)) * 256) as i32;
        if *g != want {
            bad.push(format!("direct: out[{e}] = {g:#x}, want {want:#x}"));
        }
    }
    let mdims = mixed.spec.launch_dims(&[])?;
    ensure!(mdims.local == Some([1, 1, 1]), "mixed launch dims {mdims:?}, want groups of [1, 1, 1]");
    let buf = Buffer::from_slice(dev.allocator(), &vec![-1i32; (m0 * m1) as usize])?;
    mixed.launch(&[&buf], &[])?;
    for (e, g) in buf.to_vec::<i32>()?.iter().enumerate() {
        let want = (e as i64 % m0 + e as i64 / m0 * 256) as i32;
        if *g != want {
            bad.push(format!("gidx0 with idx1: out[{e}] = {g:#x}, want {want:#x}"));
        }
    }
    bad.finish(&format!("{} launch dims", dev.spec()))
}

/// Kernels launched on views: only the window changes, scalar and vector accesses see the
/// window's elements, and a vector access needs no alignment beyond the element's (views
/// start at any element).
pub fn launch_on_views(dev: &Arc<Device>) -> Outcome {
    let scalar = compile(dev, &crate::kernels::affine(2.0, 1.0)?, "conf_affine_2_1")?;
    let mut k = KernelBuilder::new();
    let x = k.param(0, Scalar::F32, 4 * N);
    let y = k.param(1, Scalar::F32, 4 * N);
    let i = k.global(0, N);
    let v = x.at_vec(&(&i * 4), 4).load();
    k.store(&y.at_vec(&(&i * 4), 4), &(&v * 2.0 + 1.0));
    let vector = compile(dev, &k.finish()?, "conf_affine_vec4")?;

    let total = 4 * N + 16;
    let data: Vec<f32> = (0..total).map(|v| v as f32 * 0.5).collect();
    let xb = Buffer::from_slice(dev.allocator(), &data)?;
    let mut bad = Mismatches::new();
    for (name, kernel, len, vals) in [("scalar", &scalar, N, vec![N as i64]), ("f32x4", &vector, 4 * N, vec![])] {
        for (xo, yo) in [(0usize, 0usize), (1, 3), (5, 2), (7, 9)] {
            let yb = Buffer::from_slice(dev.allocator(), &vec![-1f32; total])?;
            kernel.launch(&[&xb.view(xo, len)?, &yb.view(yo, len)?], &vals)?;
            let got = yb.to_vec::<f32>()?;
            for (e, g) in got.iter().enumerate() {
                let want = if (yo..yo + len).contains(&e) { data[e - yo + xo] * 2.0 + 1.0 } else { -1.0 };
                if *g != want {
                    bad.push(format!("{name} on views x+{xo}, y+{yo}: y[{e}] = {g}, want {want}"));
                }
            }
        }
    }
    bad.finish(&format!("{} launches on views", dev.spec()))
}

/// Stores hinted non-temporal ([`StoreHint::NonTemporal`]) store exactly what plain stores
/// do, for scalars (4 and 8 bytes) and f32 vectors of 4, 8 and 16 lanes, on views that start
/// aligned and at odd element offsets (where a non-temporal instruction cannot take the
/// address the backend must fall back to a plain store), over enough work items that the CPU
/// splits the launch over its cores (each part must publish its stores before the launch
/// completes). Backends without non-temporal stores ignore the hint: on them the hinted
/// kernel renders to the very source of the plain one.
pub fn nontemporal_stores(dev: &Arc<Device>) -> Outcome {
    const ITEMS: usize = 4096; // × LOOP iterations: enough for the CPU to use every core
    const LOOP: usize = 8;
    let kernel = |s: Scalar, w: u8, hint: StoreHint| -> Result<Arc<UOp>, Failure> {
        let len = ITEMS * LOOP * w as usize;
        let mut k = KernelBuilder::new();
        let (x, y) = (k.param(0, s, len), k.param(1, s, len));
        let g = k.special("gidx0", ITEMS);
        let r = k.range(LOOP);
        let idx = (&g * LOOP as i64 + &r) * w as i64;
        let v = x.at_vec(&idx, w).load();
        let st = k.store_hinted(&y.at_vec(&idx, w), &(&v * 3 + 1), hint);
        k.end(&r, &[&st]);
        Ok(k.finish()?)
    };
    let mut bad = Mismatches::new();
    for (s, w) in [(Scalar::F32, 1u8), (Scalar::I64, 1), (Scalar::F32, 4), (Scalar::F32, 8), (Scalar::F32, 16)] {
        let nt = kernel(s, w, StoreHint::NonTemporal)?;
        let name = format!("conf_nt_{}x{w}", s.name());
        if *dev.spec() != kiln_device::kiln_ir::DeviceSpec::new("CPU", 0) {
            let plain = dev.renderer().render(&kernel(s, w, StoreHint::Normal)?, Some(&name))?;
            let hinted = dev.renderer().render(&nt, Some(&name))?;
            ensure!(hinted.src == plain.src, "{}: the non-temporal hint changed the {name} source", dev.spec());
        }
        let k = compile(dev, &nt, &name)?;
        let len = ITEMS * LOOP * w as usize;
        let total = len + 32;
        for (xo, yo) in [(0usize, 0usize), (16, 16), (1, 3), (5, 2)] {
            let case = format!("{name} on views x+{xo}, y+{yo}");
            let run = |x: &Buffer, y: &Buffer| k.launch(&[&x.view(xo, len)?, &y.view(yo, len)?], &[]);
            if s == Scalar::F32 {
                let x: Vec<f32> = (0..total).map(|v| (v % 1000) as f32 * 0.5).collect();
                check_views(dev, &case, &x, -1.0, (xo, yo, len), |v| v * 3.0 + 1.0, run, &mut bad)?;
            } else {
                let x: Vec<i64> = (0..total as i64).map(|v| v * 1_000_003 - (1 << 40)).collect();
                check_views(dev, &case, &x, -1, (xo, yo, len), |v| v * 3 + 1, run, &mut bad)?;
            }
        }
    }
    bad.finish(&format!("{} non-temporal stores", dev.spec()))
}

/// Uploads `x` and a `y` of `fill`, runs `run(x, y)` and checks that `y` holds `f(x[e - yo +
/// xo])` on the `len` elements from `yo` on and `fill` elsewhere (one mismatch per case).
#[allow(clippy::too_many_arguments)]
fn check_views<T: kiln_device::Element + PartialEq + Copy + std::fmt::Display>(
    dev: &Device,
    case: &str,
    x: &[T],
    fill: T,
    (xo, yo, len): (usize, usize, usize),
    f: impl Fn(T) -> T,
    run: impl Fn(&Buffer, &Buffer) -> Result<(), kiln_device::Error>,
    bad: &mut Mismatches,
) -> Outcome {
    let (xb, yb) =
        (Buffer::from_slice(dev.allocator(), x)?, Buffer::from_slice(dev.allocator(), &vec![fill; x.len()])?);
    run(&xb, &yb)?;
    let y = yb.to_vec::<T>()?;
    let want = |e: usize| if (yo..yo + len).contains(&e) { f(x[e - yo + xo]) } else { fill };
    if let Some(e) = (0..y.len()).find(|&e| y[e] != want(e)) {
        bad.push(format!("{case}: y[{e}] = {}, want {}", y[e], want(e)));
    }
    Ok(())
}

/// Launch sizes that do not divide evenly: a direct launch over a prime number of items and a
/// grouped launch with an odd local size. Every item is written exactly once.
pub fn odd_launch_sizes(dev: &Arc<Device>) -> Outcome {
    const ITEMS: usize = 100_003;
    let mut k = KernelBuilder::new();
    let out = k.param(0, Scalar::I32, ITEMS);
    let i = k.global(0, ITEMS);
    k.store(&out.at(&i), &(&i * 3 + 1));
    let direct = compile(dev, &k.finish()?, "conf_launch_prime")?;

    let (groups, local) = (13i64, 7i64);
    let mut k = KernelBuilder::new();
    let out2 = k.param(0, Scalar::I32, groups * local);
    let (g, l) = (k.special("gidx0", groups), k.special("lidx0", local));
    let flat = &g * local + &l;
    k.store(&out2.at(&flat), &(&flat + 1000));
    let grouped = compile(dev, &k.finish()?, "conf_launch_odd_local")?;

    let buf = Buffer::from_slice(dev.allocator(), &vec![-1i32; ITEMS])?;
    direct.launch(&[&buf], &[])?;
    let mut bad = Mismatches::new();
    for (e, g) in buf.to_vec::<i32>()?.iter().enumerate() {
        if *g != e as i32 * 3 + 1 {
            bad.push(format!("{ITEMS} direct items: out[{e}] = {g}"));
        }
    }
    let buf2 = Buffer::from_slice(dev.allocator(), &vec![-1i32; (groups * local) as usize])?;
    grouped.launch(&[&buf2], &[])?;
    for (e, g) in buf2.to_vec::<i32>()?.iter().enumerate() {
        if *g != e as i32 + 1000 {
            bad.push(format!("{groups} groups of {local}: out[{e}] = {g}"));
        }
    }
    bad.finish(&format!("{} odd launch sizes", dev.spec()))
}

/// One program launched from several threads at once on disjoint buffers (programs are
/// reentrant): every launch computes its own result.
pub fn concurrent_launches(dev: &Arc<Device>) -> Outcome {
    let kernel = compile(dev, &crate::kernels::affine(3.0, 0.5)?, "conf_affine_3")?;
    let threads: Vec<std::thread::JoinHandle<Outcome>> = (0..4)
        .map(|t| {
            let (dev, kernel) = (dev.clone(), kernel.clone());
            std::thread::spawn(move || {
                for round in 0..8 {
                    let n = 64 + 32 * t + round;
                    let x: Vec<f32> = (0..n).map(|i| (i * (t + 1)) as f32).collect();
                    let xb = Buffer::from_slice(dev.allocator(), &x)?;
                    let yb = Buffer::from_slice(dev.allocator(), &vec![0f32; n])?;
                    kernel.launch(&[&xb, &yb], &[n as i64])?;
                    let want: Vec<f32> = x.iter().map(|v| v * 3.0 + 0.5).collect();
                    ensure!(yb.to_vec::<f32>()? == want, "thread {t} round {round}: wrong result");
                }
                Ok(())
            })
        })
        .collect();
    for h in threads {
        h.join().map_err(|_| Failure::Violation("a launching thread panicked".into()))??;
    }
    Ok(())
}

/// All `(a, b, c, d)` with each coordinate below its extent.
fn itertools4(na: i64, nb: i64, nc: i64, nd: i64) -> impl Iterator<Item = (i64, i64, i64, i64)> {
    (0..na).flat_map(move |a| (0..nb).flat_map(move |b| (0..nc).flat_map(move |c| (0..nd).map(move |d| (a, b, c, d)))))
}

/// Gated loads and stores: where the gate is false the address is far out of bounds and
/// must not be touched (a touch faults or corrupts); the load yields its alternative.
pub fn gated_access(dev: &Arc<Device>) -> Outcome {
    let far = 1i64 << 28;
    let mut k = KernelBuilder::new();
    let x = k.param(0, Scalar::F32, N);
    let loaded = k.param(1, Scalar::F32, N);
    let stored = k.param(2, Scalar::F32, N);
    let i = k.global(0, N);
    let gate = i.lt(N as i64 / 2);
    let load_at = gate.select(&i, &i + far);
    let store_at = gate.select(&i, &i - far);
    let v = x.at(&load_at).load_gated(&gate, -1.0);
    k.store(&loaded.at(&i), &v);
    k.store_gated(&stored.at(&store_at), &(x.at(&i).load() * 2.0), &gate);
    let kernel = compile(dev, &k.finish()?, "conf_gated")?;

    let data: Vec<f32> = (0..N).map(|v| v as f32 + 0.5).collect();
    let xb = Buffer::from_slice(dev.allocator(), &data)?;
    let lb = Buffer::from_slice(dev.allocator(), &[7f32; N])?;
    let sb = Buffer::from_slice(dev.allocator(), &[7f32; N])?;
    kernel.launch(&[&xb, &lb, &sb], &[])?;
    let (l, s) = (lb.to_vec::<f32>()?, sb.to_vec::<f32>()?);
    let mut bad = Mismatches::new();
    for e in 0..N {
        let open = e < N / 2;
        let (wl, ws) = if open { (data[e], data[e] * 2.0) } else { (-1.0, 7.0) };
        if l[e] != wl {
            bad.push(format!("gated load at {e} (gate {open}): {} want {wl}", l[e]));
        }
        if s[e] != ws {
            bad.push(format!("gated store at {e} (gate {open}): {} want {ws}", s[e]));
        }
    }
    bad.finish(&format!("{} gated access", dev.spec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::encode_all;

    #[test]
    fn samples_include_the_division_edge_cases() {
        for s in Scalar::ALL.into_iter().filter(|s| s.is_int()) {
            let [a, b, _] = samples(s);
            let (min, _) = int_bounds(s);
            assert!(b.iter().any(|y| y.as_i128() == 0), "{s}: no zero divisor");
            let min_by_minus_one = a.iter().zip(&b).any(|(x, y)| x.as_i128() == min && y.as_i128() == -1);
            assert!(!s.is_signed() || min_by_minus_one, "{s}: no MIN / -1");
            assert_eq!(encode_all(&a, s).len(), N * s.size());
        }
    }

    #[test]
    fn every_alu_op_is_covered_on_some_dtype() {
        for op in Op::ALL.iter().filter(|op| op.is_alu()) {
            let covered = Scalar::ALL.into_iter().any(|s| {
                [reference::unary_ops(s), reference::binary_ops(s), reference::ternary_ops(s), &COMPARISONS[..]]
                    .concat()
                    .contains(op)
            });
            assert!(covered, "{op} is in no ALU kernel");
        }
    }

    #[test]
    fn every_listed_op_has_a_reference() {
        for s in Scalar::ALL {
            let [a, b, c] = samples(s);
            for op in [reference::unary_ops(s), reference::binary_ops(s), reference::ternary_ops(s)].concat() {
                let args = match op {
                    Op::Where => vec![Value::B(true), a[0], b[0]],
                    Op::MulAcc => vec![a[0], b[0], c[0]],
                    op if op.is_unary() => vec![a[0]],
                    _ => vec![a[0], b[0]],
                };
                assert!(reference::alu(op, s, &args).is_some(), "{op} on {s}");
            }
        }
    }
}
