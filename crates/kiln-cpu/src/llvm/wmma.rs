//! WMMA's one-thread form in LLVM IR: the C pair's portable micro-tile (see
//! `crate::renderer`'s `wmma_helper`), one internal function per form.
//!
//! The fragments are converted to f32 exactly; each row of D is a vector of N f32 accumulators
//! started from C's row, taking for k = 0, 1, ... one fused multiply-add (`llvm.fma`) of A's
//! element, broadcast and added to +0.0 as the C pair's `(row){0} + a` does, by B's row k; the
//! row is then rounded once to the accumulator dtype. So every element of D is the in-order
//! fma chain of [`kiln_device::kiln_ir::wmma`]: bit for bit the reference, and the C pair's
//! portable body. The C pair's AVX512-BF16 and AVX512-FP16 bodies are not rendered here.

use kiln_device::kiln_ir::{DType, Scalar, Wmma};

use super::code::{Code, Ty, from_f32, to_f32};

/// Calls the helper of the one-thread form `w` on the fragments `args` (A, B, C), defining it
/// once in `c`; returns the D fragment.
pub(super) fn call(c: &mut Code, w: &Wmma, args: &[String; 3]) -> String {
    let [adt, bdt, cdt] = w.operand_dtypes();
    let [at, bt, ct] = [adt, bdt, cdt].map(|dt| match dt {
        DType::Vector(s, l) => Ty::reg(s, l),
        other => Ty::reg(other.scalar().unwrap_or(Scalar::F32), 1),
    });
    let name = format!("kiln_wmma_{}_{}_{}", w.shape_name(), w.input.name(), w.acc.name());
    if !c.decls.contains_key(&name) {
        let mut h = Code::new();
        body(&mut h, w, at, bt, ct);
        let header = format!(
            "define internal {} @{name}({} %a, {} %b, {} %c) nounwind",
            ct.name(),
            at.name(),
            bt.name(),
            ct.name()
        );
        let text = h.function(&header, &[]);
        c.absorb(std::mem::take(&mut h.decls));
        c.decls.insert(name.clone(), text);
    }
    c.ins(format!(
        "call {} @{name}({} {}, {} {}, {} {})",
        ct.name(),
        at.name(),
        args[0],
        bt.name(),
        args[1],
        ct.name(),
        args[2]
    ))
}

/// `v` (of `ty`, lanes of `s`) as f32 lanes, exactly.
fn as_f32(h: &mut Code, v: &str, s: Scalar, ty: Ty) -> String {
    if s == Scalar::F32 { v.to_string() } else { to_f32(h, v, s, ty.w) }
}

/// Lanes `from..from + n` of `v` (`ty`, f32 lanes), as a vector of `n` (or one float).
fn row(h: &mut Code, v: &str, ty: Ty, from: usize, n: usize) -> String {
    if n == 1 || ty.w == 1 {
        return h.lane(v, ty, from as u8);
    }
    let mask: Vec<String> = (from..from + n).map(|i| format!("i32 {i}")).collect();
    h.ins(format!("shufflevector {t} {v}, {t} poison, <{n} x i32> <{}>", mask.join(", "), t = ty.name()))
}

fn body(h: &mut Code, w: &Wmma, at: Ty, bt: Ty, ct: Ty) {
    let (m, n, k) = (w.m as usize, w.n as usize, w.k as usize);
    let f = |t: Ty| t.with("float");
    let av = as_f32(h, "%a", w.input, at);
    let bv = as_f32(h, "%b", w.input, bt);
    let cv = as_f32(h, "%c", w.acc, ct);
    let row_ty = Ty::new("float", n as u8);
    let mut d_lanes = Vec::with_capacity(m * n);
    for i in 0..m {
        let mut acc = row(h, &cv, f(ct), i * n, n);
        for j in 0..k {
            let a = h.lane(&av, f(at), (i * k + j) as u8);
            let a = if n > 1 {
                // The C pair broadcasts as `(row){0} + a`: +0.0 for an element -0.0.
                let one = h.ins(format!("insertelement <1 x float> poison, float {a}, i32 0"));
                let splat =
                    h.ins(format!("shufflevector <1 x float> {one}, <1 x float> poison, <{n} x i32> zeroinitializer"));
                h.ins(format!("fadd {} zeroinitializer, {splat}", row_ty.name()))
            } else {
                a
            };
            let b = row(h, &bv, f(bt), j * n, n);
            acc = h.intrinsic("fma", row_ty, &[&a, &b, &acc]);
        }
        let out = if w.acc == Scalar::F32 { acc } else { from_f32(h, &acc, w.acc, n as u8) };
        let out_ty = Ty::reg(w.acc, n as u8);
        for j in 0..n {
            d_lanes.push(h.lane(&out, out_ty, j as u8));
        }
    }
    let d = h.build(ct, &d_lanes);
    h.stmt(format!("ret {} {d}", ct.name()));
}
