//! The text of LLVM IR functions: fresh SSA names and labels, instructions, the declarations
//! and helper definitions a function needs, and the spelling of types and constants.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kiln_device::kiln_ir::Scalar;

/// A value type: `w` lanes (1: a scalar) of the LLVM element type `elem`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ty {
    pub elem: &'static str,
    pub w: u8,
}

impl Ty {
    /// `w` lanes of `elem`.
    pub fn new(elem: &'static str, w: u8) -> Ty {
        Ty { elem, w }
    }

    /// The register type of `w` lanes of `s`: bool `i1`, f16/bf16 their bits (`i16`).
    pub fn reg(s: Scalar, w: u8) -> Ty {
        Ty::new(reg_elem(s), w)
    }

    /// The memory type of `w` lanes of `s`: as [`Ty::reg`], bool a byte.
    pub fn mem(s: Scalar, w: u8) -> Ty {
        Ty::new(if s == Scalar::Bool { "i8" } else { reg_elem(s) }, w)
    }

    /// The same lane count of another element type.
    pub fn with(self, elem: &'static str) -> Ty {
        Ty::new(elem, self.w)
    }

    /// The IR spelling: `float` or `<4 x float>`.
    pub fn name(self) -> String {
        if self.w == 1 { self.elem.to_string() } else { format!("<{} x {}>", self.w, self.elem) }
    }

    /// The overload suffix of an intrinsic: `f32`, `v4f32`, `v8i1`.
    pub fn mangle(self) -> String {
        let e = match self.elem {
            "float" => "f32",
            "double" => "f64",
            "half" => "f16",
            other => other,
        };
        if self.w == 1 { e.to_string() } else { format!("v{}{e}", self.w) }
    }

    /// The constant `lit` (an element literal) in every lane.
    pub fn splat(self, lit: &str) -> String {
        if self.w == 1 {
            return lit.to_string();
        }
        let lanes: Vec<String> = (0..self.w).map(|_| format!("{} {lit}", self.elem)).collect();
        format!("<{}>", lanes.join(", "))
    }

    /// Bytes of the C pair's register for this vector (its lane count rounded up to a power
    /// of two, as the C dialect pads its GNU vector types).
    pub fn padded_bytes(self) -> usize {
        (self.w as usize).next_power_of_two() * elem_bytes(self.elem)
    }
}

fn reg_elem(s: Scalar) -> &'static str {
    match s {
        Scalar::Bool => "i1",
        Scalar::I8 | Scalar::U8 => "i8",
        Scalar::I16 | Scalar::U16 | Scalar::F16 | Scalar::BF16 => "i16",
        Scalar::I32 | Scalar::U32 => "i32",
        Scalar::I64 | Scalar::U64 => "i64",
        Scalar::F32 => "float",
        Scalar::F64 => "double",
    }
}

fn elem_bytes(elem: &str) -> usize {
    match elem {
        "i1" | "i8" => 1,
        "i16" | "half" => 2,
        "i32" | "float" => 4,
        _ => 8,
    }
}

/// An integer of `s` with the bit pattern of `v` (already wrapped into `s`), as the IR's
/// signed decimal of that width; a bool is `true`/`false`.
pub(super) fn int_lit(v: i64, s: Scalar) -> String {
    match s {
        Scalar::Bool => if v != 0 { "true" } else { "false" }.to_string(),
        Scalar::I8 | Scalar::U8 => (v as i8).to_string(),
        Scalar::I16 | Scalar::U16 => (v as i16).to_string(),
        Scalar::I32 | Scalar::U32 => (v as i32).to_string(),
        _ => v.to_string(),
    }
}

/// A float literal of `elem` (`float` or `double`) for the value `v` (rounded to f32 for
/// `float`), exactly, NaN payloads included: the IR's hexadecimal double form.
pub(super) fn float_lit(v: f64, elem: &str) -> String {
    let bits = if elem == "float" { f64::from(v as f32).to_bits() } else { v.to_bits() };
    format!("0x{bits:016X}")
}

/// The value of a C99 hexadecimal float literal such as `0x1.715476p+0` (no suffix), for the
/// vector math constants, which are written as the C pair writes them.
pub(super) fn hexf(text: &str) -> f64 {
    let (neg, text) = text.strip_prefix('-').map_or((false, text), |t| (true, t));
    let body = text.trim_start_matches("0x");
    let (mantissa, exp) = body.split_once('p').unwrap_or((body, "0"));
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| s.chars().filter_map(|c| c.to_digit(16)).fold(0u64, |a, d| a * 16 + u64::from(d));
    let exp: i32 = exp.parse().unwrap_or(0);
    let v = (digits(int) as f64 + digits(frac) as f64 * 2f64.powi(-4 * frac.len() as i32)) * 2f64.powi(exp);
    if neg { -v } else { v }
}

/// One function's body being written, and what the module must declare for it.
#[derive(Default)]
pub(super) struct Code {
    /// Labels and instructions, in order.
    pub lines: Vec<String>,
    /// The label of the block being written.
    pub block: String,
    next: usize,
    /// Declarations and helper definitions by symbol, written once before the functions.
    pub decls: BTreeMap<String, String>,
}

impl Code {
    /// A body whose first block is `entry`.
    pub fn new() -> Code {
        Code { block: "entry".into(), ..Code::default() }
    }

    /// Emits `%tN = text` and returns `%tN`.
    pub fn ins(&mut self, text: impl AsRef<str>) -> String {
        let name = format!("%t{}", self.next);
        self.next += 1;
        self.lines.push(format!("  {name} = {}", text.as_ref()));
        name
    }

    /// Emits an instruction without a result.
    pub fn stmt(&mut self, text: impl AsRef<str>) {
        self.lines.push(format!("  {}", text.as_ref()));
    }

    /// A fresh label (without `%`).
    pub fn label(&mut self) -> String {
        let name = format!("L{}", self.next);
        self.next += 1;
        name
    }

    /// Starts block `label`.
    pub fn start(&mut self, label: &str) {
        self.lines.push(format!("{label}:"));
        self.block = label.to_string();
    }

    /// Registers `text` (a `declare` or a `define`) under `symbol`, once.
    pub fn declare(&mut self, symbol: &str, text: impl FnOnce() -> String) {
        if !self.decls.contains_key(symbol) {
            let text = text();
            self.decls.insert(symbol.to_string(), text);
        }
    }

    /// Takes the declarations another body needs (a helper's) into this one's.
    pub fn absorb(&mut self, decls: BTreeMap<String, String>) {
        for (k, v) in decls {
            self.decls.entry(k).or_insert(v);
        }
    }

    /// `call ret @name(args)`, declaring `name` as taking the argument types.
    pub fn call(&mut self, ret: &str, name: &str, args: &[(String, String)]) -> String {
        let tys: Vec<&str> = args.iter().map(|(t, _)| t.as_str()).collect();
        self.declare(name, || format!("declare {ret} @{name}({})", tys.join(", ")));
        let list: Vec<String> = args.iter().map(|(t, v)| format!("{t} {v}")).collect();
        let text = format!("call {ret} @{name}({})", list.join(", "));
        if ret == "void" {
            self.stmt(text);
            String::new()
        } else {
            self.ins(text)
        }
    }

    /// The intrinsic `llvm.<base>` overloaded on `ty`, on operands all of type `ty`.
    pub fn intrinsic(&mut self, base: &str, ty: Ty, args: &[&str]) -> String {
        let t = ty.name();
        let name = format!("llvm.{base}.{}", ty.mangle());
        let args: Vec<(String, String)> = args.iter().map(|a| (t.clone(), a.to_string())).collect();
        self.call(&t, &name, &args)
    }

    /// `select c, a, b` on values of `ty`, `c` of `i1` lanes (or one `i1`).
    pub fn select(&mut self, c: &str, ty: Ty, a: &str, b: &str) -> String {
        let ct = if ty.w == 1 { "i1".to_string() } else { ty.with("i1").name() };
        let t = ty.name();
        self.ins(format!("select {ct} {c}, {t} {a}, {t} {b}"))
    }

    /// Lane `i` of `v` (of `ty`); a scalar is its own lane 0.
    pub fn lane(&mut self, v: &str, ty: Ty, i: u8) -> String {
        if ty.w == 1 { v.to_string() } else { self.ins(format!("extractelement {} {v}, i32 {i}", ty.name())) }
    }

    /// A value of `ty` from one value per lane.
    pub fn build(&mut self, ty: Ty, lanes: &[String]) -> String {
        if ty.w == 1 {
            return lanes.first().cloned().unwrap_or_else(|| "poison".into());
        }
        let t = ty.name();
        // A vector of constants is a constant, and one value in every lane a splat: two
        // instructions where lane by lane takes one per lane, which LLVM's SLP vectorizer would
        // then search (a broadcast operand of every register tile's FMA is one).
        if lanes.len() == usize::from(ty.w) && lanes.iter().all(|l| is_constant(l)) {
            let elems: Vec<String> = lanes.iter().map(|l| format!("{} {l}", ty.elem)).collect();
            return format!("<{}>", elems.join(", "));
        }
        if let Some(first) = lanes.first()
            && lanes.len() == usize::from(ty.w)
            && lanes.iter().all(|l| l == first)
        {
            let one = self.ins(format!("insertelement {t} poison, {} {first}, i32 0", ty.elem));
            return self.ins(format!("shufflevector {t} {one}, {t} poison, <{} x i32> zeroinitializer", ty.w));
        }
        let mut v = "poison".to_string();
        for (i, lane) in lanes.iter().enumerate() {
            v = self.ins(format!("insertelement {t} {v}, {} {lane}, i32 {i}", ty.elem));
        }
        v
    }

    /// `f` applied lane by lane to the lanes of `args` (all of `ty`), giving lanes of `out`.
    pub fn per_lane(
        &mut self,
        ty: Ty,
        out: Ty,
        args: &[String],
        mut f: impl FnMut(&mut Code, &[String]) -> String,
    ) -> String {
        if ty.w == 1 {
            return f(self, args);
        }
        let mut lanes = Vec::with_capacity(ty.w as usize);
        for i in 0..ty.w {
            let l: Vec<String> = args.iter().map(|a| self.lane(a, ty, i)).collect();
            lanes.push(f(self, &l));
        }
        self.build(out, &lanes)
    }

    /// The body's text: `header`, the `entry` block opened by `allocas`, the lines, `}`.
    pub fn function(&self, header: &str, allocas: &[String]) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{header} {{");
        out.push_str("entry:\n");
        for a in allocas {
            let _ = writeln!(out, "  {a}");
        }
        for l in &self.lines {
            let _ = writeln!(out, "{l}");
        }
        out.push_str("}\n");
        out
    }
}

/// Whether `v`, an operand as the emitter writes it, is a constant (a number, `true`,
/// `false` or `poison`) rather than a register (`%...`).
fn is_constant(v: &str) -> bool {
    v.starts_with(|c: char| c.is_ascii_digit() || c == '-') || matches!(v, "true" | "false" | "poison")
}

/// `v`, f16 or bf16 bits (`w` lanes of `i16`), as f32, exactly.
pub(super) fn to_f32(c: &mut Code, v: &str, s: Scalar, w: u8) -> String {
    let (bits16, f) = (Ty::new("i16", w), Ty::new("float", w));
    if s == Scalar::F16 {
        let h = c.ins(format!("bitcast {} {v} to {}", bits16.name(), f.with("half").name()));
        c.ins(format!("fpext {} {h} to {}", f.with("half").name(), f.name()))
    } else {
        let wide = c.ins(format!("zext {} {v} to {}", bits16.name(), f.with("i32").name()));
        let hi = c.ins(format!("shl {} {wide}, {}", f.with("i32").name(), f.with("i32").splat("16")));
        c.ins(format!("bitcast {} {hi} to {}", f.with("i32").name(), f.name()))
    }
}

/// `v`, `w` lanes of f32, rounded to f16 or bf16 (to nearest even; NaN stays a quiet NaN).
pub(super) fn from_f32(c: &mut Code, v: &str, s: Scalar, w: u8) -> String {
    let f = Ty::new("float", w);
    let (i32t, i16t) = (f.with("i32"), f.with("i16"));
    if s == Scalar::F16 {
        let h = c.ins(format!("fptrunc {} {v} to {}", f.name(), f.with("half").name()));
        return c.ins(format!("bitcast {} {h} to {}", f.with("half").name(), i16t.name()));
    }
    // The C pair's kiln_f32_to_bf16.
    let it = i32t.name();
    let u = c.ins(format!("bitcast {} {v} to {it}", f.name()));
    let mag = c.ins(format!("and {it} {u}, {}", i32t.splat("2147483647")));
    let nan = c.ins(format!("icmp ugt {it} {mag}, {}", i32t.splat("2139095040")));
    let top = c.ins(format!("lshr {it} {u}, {}", i32t.splat("16")));
    let quiet = c.ins(format!("or {it} {top}, {}", i32t.splat("64")));
    let odd = c.ins(format!("and {it} {top}, {}", i32t.splat("1")));
    let bias = c.ins(format!("add {it} {odd}, {}", i32t.splat("32767")));
    let rounded = c.ins(format!("add {it} {u}, {bias}"));
    let kept = c.ins(format!("lshr {it} {rounded}, {}", i32t.splat("16")));
    let r = c.select(&nan, i32t, &quiet, &kept);
    c.ins(format!("trunc {it} {r} to {}", i16t.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_float_literals_and_ir_constants() {
        assert_eq!(hexf("0x1.8p23"), 12582912.0);
        assert_eq!(hexf("-0x1.63p-1"), -(1.0 + 6.0 / 16.0 + 3.0 / 256.0) / 2.0);
        assert_eq!(hexf("0x1.62e42fefa39efp-1"), std::f64::consts::LN_2);
        assert_eq!(float_lit(1.0, "float"), "0x3FF0000000000000");
        assert_eq!(float_lit(0.1, "float"), format!("0x{:016X}", f64::from(0.1f32).to_bits()));
        assert_eq!(int_lit(-1, Scalar::U64), "-1");
        assert_eq!(int_lit(255, Scalar::U8), "-1");
        assert_eq!(Ty::new("float", 4).splat("1.0"), "<float 1.0, float 1.0, float 1.0, float 1.0>");
        assert_eq!(Ty::new("double", 3).padded_bytes(), 32);
    }

    #[test]
    fn a_vector_of_one_value_is_a_splat_and_of_constants_a_constant() {
        let mut c = Code::new();
        let t = Ty::new("float", 4);
        assert_eq!(
            c.build(t, &["0x0".into(), "-1".into(), "0x0".into(), "0x0".into()]),
            "<float 0x0, float -1, float 0x0, float 0x0>"
        );
        let x = "%x".to_string();
        let splat = c.build(t, &[x.clone(), x.clone(), x.clone(), x.clone()]);
        let mixed = c.build(t, &[x.clone(), "%y".into(), x.clone(), x]);
        let text = c.lines.join("\n");
        assert!(text.contains("insertelement <4 x float> poison, float %x, i32 0"), "{text}");
        assert!(text.contains(&format!("{splat} = shufflevector <4 x float>")), "{text}");
        assert_eq!(text.matches("insertelement").count(), 1 + 4, "{text}");
        assert!(mixed.starts_with('%'));
    }
}
