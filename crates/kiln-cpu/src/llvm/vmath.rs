//! The C pair's vector math in LLVM IR: f32/f64 vector EXP, EXP2, LOG and LOG2 by the same
//! range reductions, polynomials, constants and operation order as `crate::vmath`'s templates,
//! so both pairs give the same bits. Its `kiln_madd` is `llvm.fma` exactly where it fuses (see
//! the renderer's `fused_madd`, passed in as `fuses`) and a multiply then an add elsewhere;
//! nothing else contracts.

use super::code::{Code, Ty, float_lit, hexf};

/// Registers `kiln_<f>_<f32|f64>x<w>` (f: `exp`, `exp2`, `log`, `log2`) for the float vector
/// `ty` in `c` and returns its name. `fuses(bytes)`: whether `kiln_madd` on a vector of `bytes`
/// bytes is `llvm.fma`.
pub(super) fn function(c: &mut Code, fuses: &dyn Fn(usize) -> bool, f: &str, ty: Ty) -> String {
    let f64 = ty.elem == "double";
    let name = format!("kiln_{f}_{}x{}", if f64 { "f64" } else { "f32" }, ty.w);
    if c.decls.contains_key(&name) {
        return name;
    }
    let mut h = Code::new();
    let m = Math { fuses, v: ty, i: ty.with(if f64 { "i64" } else { "i32" }) };
    match (f, f64) {
        ("exp" | "exp2", _) => m.exp(&mut h, f == "exp"),
        (_, true) => m.log(&mut h, f == "log"),
        // f32 logarithms are computed in f64 and rounded once: < 0.51 ulp.
        _ => {
            let d = ty.with("double");
            let inner = function(&mut h, fuses, f, d);
            let x = h.ins(format!("fpext {} %x to {}", ty.name(), d.name()));
            let y = h.ins(format!("call {} @{inner}({} {x})", d.name(), d.name()));
            let y = h.ins(format!("fptrunc {} {y} to {}", d.name(), ty.name()));
            h.stmt(format!("ret {} {y}", ty.name()));
        }
    }
    let t = ty.name();
    let text = h.function(&format!("define internal {t} @{name}({t} %x) nounwind"), &[]);
    c.absorb(std::mem::take(&mut h.decls));
    c.decls.insert(name.clone(), text);
    name
}

/// The vector math on float vectors `v` with integer lanes `i` of the same width.
struct Math<'a> {
    fuses: &'a dyn Fn(usize) -> bool,
    v: Ty,
    i: Ty,
}

impl Math<'_> {
    fn f64(&self) -> bool {
        self.v.elem == "double"
    }

    /// The constant written `c` (a C hexadecimal float) in every lane.
    fn k(&self, c: &str) -> String {
        self.v.splat(&float_lit(hexf(c), self.v.elem))
    }

    /// An integer constant in every lane.
    fn ki(&self, v: i64) -> String {
        self.i.splat(&v.to_string())
    }

    fn op(&self, h: &mut Code, i: &str, a: &str, b: &str) -> String {
        h.ins(format!("{i} {} {a}, {b}", self.v.name()))
    }

    fn iop(&self, h: &mut Code, i: &str, a: &str, b: &str) -> String {
        h.ins(format!("{i} {} {a}, {b}", self.i.name()))
    }

    fn to_int(&self, h: &mut Code, x: &str) -> String {
        h.ins(format!("bitcast {} {x} to {}", self.v.name(), self.i.name()))
    }

    fn to_float(&self, h: &mut Code, x: &str) -> String {
        h.ins(format!("bitcast {} {x} to {}", self.i.name(), self.v.name()))
    }

    /// The C pair's `kiln_madd`: `a*b + c`, one rounding where its target fuses.
    fn madd(&self, h: &mut Code, a: &str, b: &str, c: &str) -> String {
        if (self.fuses)(self.v.padded_bytes()) {
            h.intrinsic("fma", self.v, &[a, b, c])
        } else {
            let p = self.op(h, "fmul", a, b);
            self.op(h, "fadd", &p, c)
        }
    }

    /// `q = madd(q, x, c)` for each coefficient `c` in turn, from `q`.
    fn horner(&self, h: &mut Code, mut q: String, x: &str, coefficients: &[&str]) -> String {
        for c in coefficients {
            q = self.madd(h, &q, x, &self.k(c));
        }
        q
    }

    /// `kiln_expcore_T`/`kiln_exp2core_T`: `(e^r or 2^r, t)` where `t`'s low mantissa bits hold n.
    fn core(&self, h: &mut Code, x: &str, natural: bool) -> (String, String) {
        let shift = if self.f64() { "0x1.8p52" } else { "0x1.8p23" };
        if natural {
            let (log2e, ln2_hi, ln2_lo) = if self.f64() {
                ("0x1.71547652b82fep+0", "-0x1.62e42feep-1", "-0x1.a39ef35793c76p-33")
            } else {
                ("0x1.715476p+0", "-0x1.63p-1", "0x1.bd0106p-13")
            };
            let coefficients: &[&str] = if self.f64() {
                &[
                    "0x1.ad7ab769bd1b4p-26",
                    "0x1.28b16f4084527p-22",
                    "0x1.71df2ee51c306p-19",
                    "0x1.a01995e58cbb5p-16",
                    "0x1.a01a01231b577p-13",
                    "0x1.6c16c1859f66ep-10",
                    "0x1.11111111299d8p-7",
                    "0x1.555555555023ep-5",
                    "0x1.55555555554f0p-3",
                    "0x1.000000000000bp-1",
                ]
            } else {
                &["0x1.6a1a5ep-10", "0x1.123fd2p-7", "0x1.555916p-5", "0x1.55548ap-3", "0x1.fffffcp-2"]
            };
            let t = self.madd(h, x, &self.k(log2e), &self.k(shift));
            let n = self.op(h, "fsub", &t, &self.k(shift));
            let r = self.madd(h, &n, &self.k(ln2_hi), x);
            let r = self.madd(h, &n, &self.k(ln2_lo), &r);
            let q = self.madd(h, &self.k(coefficients[0]), &r, &self.k(coefficients[1]));
            let q = self.horner(h, q, &r, &coefficients[2..]);
            let rr = self.op(h, "fmul", &r, &r);
            let e = self.madd(h, &rr, &q, &r);
            (self.op(h, "fadd", &e, &self.k("0x1p0")), t)
        } else {
            let coefficients: &[&str] = if self.f64() {
                &[
                    "0x1.e79bb6fc55606p-32",
                    "0x1.e61b4f9a207f5p-28",
                    "0x1.b5267cdfd91eep-24",
                    "0x1.62bfc79d4b59fp-20",
                    "0x1.ffcbfba980f96p-17",
                    "0x1.4309130ed8cd5p-13",
                    "0x1.5d87fe78cd6cfp-10",
                    "0x1.3b2ab6fba011ap-7",
                    "0x1.c6b08d7049fe8p-5",
                    "0x1.ebfbdff82c5a4p-3",
                    "0x1.62e42fefa39efp-1",
                ]
            } else {
                &["0x1.41fbbcp-13", "0x1.5f3e52p-10", "0x1.3b2d4cp-7", "0x1.c6aee8p-5", "0x1.ebfbdcp-3", "0x1.62e43p-1"]
            };
            let t = self.op(h, "fadd", x, &self.k(shift));
            let n = self.op(h, "fsub", &t, &self.k(shift));
            let r = self.op(h, "fsub", x, &n);
            let q = self.madd(h, &self.k(coefficients[0]), &r, &self.k(coefficients[1]));
            let q = self.horner(h, q, &r, &coefficients[2..]);
            (self.madd(h, &r, &q, &self.k("0x1p0")), t)
        }
    }

    /// The body of `kiln_exp_T`/`kiln_exp2_T` (the C pair's `exp_body`): 2^n added to the
    /// exponent bits when every lane's result is normal, else x clamped and 2^n applied as two
    /// exact power-of-two factors.
    fn exp(&self, h: &mut Code, natural: bool) {
        let (fast, hi, lo) = match (natural, self.f64()) {
            (true, false) => (86.0, 89.0, -104.0),
            (false, false) => (125.0, 129.0, -151.0),
            (true, true) => (707.0, 710.0, -746.0),
            (false, true) => (1020.0, 1025.0, -1076.0),
        };
        let (sign, mant, magic, bias): (i64, i64, i64, i64) =
            if self.f64() { (i64::MAX, 52, 0x4338_0000_0000_0000, 1023) } else { (0x7fff_ffff, 23, 0x4b40_0000, 127) };
        let (vt, b) = (self.v.name(), self.v.with("i1"));
        let lit = |v: f64| self.v.splat(&float_lit(v, self.v.elem));
        let bits = self.to_int(h, "%x");
        let abs_bits = self.iop(h, "and", &bits, &self.ki(sign));
        let abs = self.to_float(h, &abs_bits);
        let near = h.ins(format!("fcmp ole {vt} {abs}, {}", lit(fast)));
        let all = h.call("i1", &format!("llvm.vector.reduce.and.{}", b.mangle()), &[(b.name(), near)]);
        let (fast_l, slow_l) = (h.label(), h.label());
        h.stmt(format!("br i1 {all}, label %{fast_l}, label %{slow_l}"));

        h.start(&fast_l);
        let (e, t) = self.core(h, "%x", natural);
        let eb = self.to_int(h, &e);
        let tb = self.to_int(h, &t);
        let n = self.iop(h, "shl", &tb, &self.ki(mant));
        let sum = self.iop(h, "add", &eb, &n);
        let y = self.to_float(h, &sum);
        h.stmt(format!("ret {vt} {y}"));

        h.start(&slow_l);
        let over = h.ins(format!("fcmp ogt {vt} %x, {}", lit(hi)));
        let x = h.select(&over, self.v, &lit(hi), "%x");
        let under = h.ins(format!("fcmp olt {vt} {x}, {}", lit(lo)));
        let x = h.select(&under, self.v, &lit(lo), &x);
        let (e, t) = self.core(h, &x, natural);
        let tb = self.to_int(h, &t);
        let k = self.iop(h, "sub", &tb, &self.ki(magic));
        let kh = self.iop(h, "add", &k, &self.ki(2 * (bias + 1)));
        let kh = self.iop(h, "lshr", &kh, &self.ki(1));
        let k1 = self.iop(h, "sub", &kh, &self.ki(bias + 1)); // floor(k/2)
        let p1 = self.iop(h, "add", &k1, &self.ki(bias));
        let p1 = self.iop(h, "shl", &p1, &self.ki(mant));
        let p1 = self.to_float(h, &p1);
        let k2 = self.iop(h, "sub", &k, &k1);
        let p2 = self.iop(h, "add", &k2, &self.ki(bias));
        let p2 = self.iop(h, "shl", &p2, &self.ki(mant));
        let p2 = self.to_float(h, &p2);
        let y = self.op(h, "fmul", &e, &p1);
        let y = self.op(h, "fmul", &y, &p2);
        h.stmt(format!("ret {vt} {y}"));
    }

    /// `kiln_log_f64xN`/`kiln_log2_f64xN`: the shared `kiln_logparts` split, the logarithm,
    /// and libm's special cases.
    fn log(&self, h: &mut Code, natural: bool) {
        let vt = self.v.name();
        // x > 0 (subnormals scaled by 2^54) as 2^k * (1 + f), sqrt(1/2) <= 1 + f < sqrt(2).
        let sub = h.ins(format!("fcmp olt {vt} %x, {}", self.k("0x1p-1022")));
        let scaled = self.op(h, "fmul", "%x", &self.k("0x1p54"));
        let x = h.select(&sub, self.v, &scaled, "%x");
        let u = self.to_int(h, &x);
        let u = self.iop(h, "add", &u, &self.ki(0x0009_5f61_9980_c433));
        let kb = self.iop(h, "lshr", &u, &self.ki(52));
        let adjust = h.select(&sub, self.i, &self.ki(-54), &self.ki(0));
        let kb = self.iop(h, "add", &kb, &adjust);
        let mb = self.iop(h, "and", &u, &self.ki(0xf_ffff_ffff_ffff));
        let mb = self.iop(h, "add", &mb, &self.ki(0x3fe6_a09e_667f_3bcd));
        let m = self.to_float(h, &mb);
        let f = self.op(h, "fsub", &m, &self.k("0x1p0"));
        let half_f = self.op(h, "fmul", &self.k("0x1p-1"), &f);
        let hh = self.op(h, "fmul", &half_f, &f);
        let f2 = self.op(h, "fadd", &f, &self.k("0x1p1"));
        let s = self.op(h, "fdiv", &f, &f2);
        let zz = self.op(h, "fmul", &s, &s);
        let q = self.madd(h, &self.k("0x1.2f0d8ee3130bep-3"), &zz, &self.k("0x1.39a0f4fa4075ap-3"));
        let q = self.horner(
            h,
            q,
            &zz,
            &[
                "0x1.7466462ce5e7ap-3",
                "0x1.c71c51e7f56c4p-3",
                "0x1.2492494217a45p-2",
                "0x1.999999997fb31p-2",
                "0x1.5555555555593p-1",
            ],
        );
        let qz = self.op(h, "fmul", &q, &zz);
        let inner = self.op(h, "fadd", &hh, &qz);
        let tail = self.op(h, "fmul", &s, &inner);
        let kb = self.iop(h, "add", &kb, &self.ki(0x4338_0000_0000_0000 - 1023));
        let k = self.to_float(h, &kb);
        let k = self.op(h, "fsub", &k, &self.k("0x1.8p52"));
        let y = if natural {
            // log(x) = k*ln2 + log(1 + f), ln2 = hi + lo with k*hi exact.
            let klo = self.op(h, "fmul", &k, &self.k("0x1.a39ef35793c76p-33"));
            let t = self.op(h, "fadd", &tail, &klo);
            let t = self.op(h, "fsub", &hh, &t);
            let t = self.op(h, "fsub", &t, &f);
            let khi = self.op(h, "fmul", &k, &self.k("0x1.62e42feep-1"));
            self.op(h, "fsub", &khi, &t)
        } else {
            // log2(x) = k + log(1 + f)/ln2, with f - h split so that its high part times the high
            // part of 1/ln2 is exact, and k added last with its rounding error carried.
            let fh = self.op(h, "fsub", &f, &hh);
            let fhb = self.to_int(h, &fh);
            let hib = self.iop(h, "and", &fhb, &self.ki(0xffff_ffff_0000_0000_u64 as i64));
            let hi = self.to_float(h, &hib);
            let lo = self.op(h, "fsub", &f, &hi);
            let lo = self.op(h, "fsub", &lo, &hh);
            let lo = self.op(h, "fadd", &lo, &tail);
            let vh = self.op(h, "fmul", &hi, &self.k("0x1.71547652p+0"));
            let lohi = self.op(h, "fadd", &lo, &hi);
            let vl = self.op(h, "fmul", &lohi, &self.k("0x1.705fc2eefa2p-33"));
            let lo2 = self.op(h, "fmul", &lo, &self.k("0x1.71547652p+0"));
            let vl = self.op(h, "fadd", &vl, &lo2);
            let y = self.op(h, "fadd", &k, &vh);
            let err = self.op(h, "fsub", &k, &y);
            let err = self.op(h, "fadd", &err, &vh);
            let vl = self.op(h, "fadd", &vl, &err);
            self.op(h, "fadd", &vl, &y)
        };
        // libm's special cases: log(±0) = -inf, log(x < 0) = NaN, log(+inf) = +inf, NaN stays.
        let lit = |v: f64| self.v.splat(&float_lit(v, self.v.elem));
        let zero = h.ins(format!("fcmp oeq {vt} %x, {}", lit(0.0)));
        let y = h.select(&zero, self.v, &lit(f64::NEG_INFINITY), &y);
        let negative = h.ins(format!("fcmp olt {vt} %x, {}", lit(0.0)));
        let y = h.select(&negative, self.v, &lit(f64::NAN), &y);
        let finite = h.ins(format!("fcmp olt {vt} %x, {}", lit(f64::INFINITY)));
        let y = h.select(&finite, self.v, &y, "%x");
        h.stmt(format!("ret {vt} {y}"));
    }
}
