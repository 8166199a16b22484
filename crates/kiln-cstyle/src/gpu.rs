//! The GPU dialect: OpenCL C and CUDA C++ spelled from one [`Dialect`] implementation,
//! [`Gpu`], over a [`GpuLanguage`] that is data plus a few hooks.
//!
//! What the GPU languages share, written once:
//! - f16 and bf16 are their bits (a 16-bit unsigned integer) in registers and memory,
//!   computed in f32 through kiln's helper functions `kiln_{f16,bf16}_to_f32` and
//!   `kiln_f32_to_{f16,bf16}`, so no device needs native half support.
//! - Bool is `bool` in registers and the 8-bit unsigned type in memory and in vectors, so a
//!   byte other than 0/1 in a bool buffer reads as `true`, never as an invalid `bool`.
//! - Vectors of a [`GpuLanguage::NATIVE_WIDTHS`] width are the language's vector types
//!   (`float4`: operators, `.sN` lanes, `vloadN`/`vstoreN`, math built-ins overloaded for
//!   them); every other vector is a struct of an array (`kiln_floatx5 { float v[5]; }`),
//!   computed lane by lane and stored element by element.
//! - A cast goes through f32 for the half types, rounds f64 to f16 once, and saturates float
//!   → integer (NaN → 0); a bitcast the language cannot spell goes through a union.
//! - Launch indices are the language's group, local and global ids, cast to the index type.

use std::sync::Arc;

use kiln_device::{Error, Result};
use kiln_ir::{DType, DeviceSpec, Op, Scalar, UOp, Wmma, bf16_bits, f16_bits};

use crate::dialect::{
    Address, Dialect, KernelParam, KernelVar, LaunchIndex, MathFn, Prelude, Syntax, c_vector_operator, unsupported_wmma,
};
use crate::literal::{c_float_literal, int_literal, saturating_cast};

/// A GPU language, in the spirit of tinygrad's `OpenCLRenderer`: the constants say how it
/// spells kernels, buffers, launch indices and helpers; the hooks are what is code.
pub trait GpuLanguage {
    /// The first line of every file.
    const HEADER: &'static str;
    /// The qualifiers of kiln's helper functions: `static inline`.
    const FUNCTION: &'static str;
    /// What stands before a kernel's name: `__kernel void`.
    const KERNEL: &'static str;
    /// The qualifier of a buffer pointer, with its trailing space: `__global `, or empty.
    const BUFFER: &'static str;
    /// Buffers arrive as a base pointer and a byte offset (`dataN_base, ulong dataN_off`),
    /// which the prologue adds; otherwise the host adds a view's offset to the pointer.
    const BUFFER_OFFSETS: bool;
    /// The qualifier of work-group local memory: `__local`, `__shared__`.
    const SHARED: &'static str;
    /// The work-group barrier statement with BARRIER's meaning (see [`Dialect::barrier`]).
    const BARRIER: &'static str;
    /// The group id (`gidxN`) on axes 0, 1, 2.
    const GROUP_ID: [&'static str; 3];
    /// The id within the group (`lidxN`) on axes 0, 1, 2.
    const LOCAL_ID: [&'static str; 3];
    /// The global id (`idxN`) on axes 0, 1, 2, as a 64-bit unsigned value when
    /// [`GpuLanguage::GUARD_DIRECT`].
    const GLOBAL_ID: [&'static str; 3];
    /// A direct launch rounds its grid up to whole groups: the body is guarded by
    /// `idxN < extent`, computed in 64 bits. Otherwise the launch covers the extent exactly.
    const GUARD_DIRECT: bool;
    /// The vector widths the language has types for (see the module docs).
    const NATIVE_WIDTHS: &'static [u8];
    /// The math functions are overloaded on float and double (`sqrt`), not suffixed (`sqrtf`).
    const OVERLOADED_MATH: bool;
    /// The suffix of 64-bit integer literals: `LL`, or `L` where `long` is 64 bits.
    const LONG: &'static str;
    /// The language is C++ (CUDA C++): a struct's tag names its type and struct values are
    /// brace inits `T{{...}}`. In C (OpenCL C) struct types are typedefs and struct values
    /// compound literals `((T){{...}})`.
    const CPLUSPLUS: bool;
    /// The built-in that reinterprets a 32-bit unsigned as a float.
    const FLOAT_FROM_BITS: &'static str;
    /// The built-in that reinterprets a float as a 32-bit unsigned.
    const BITS_OF_FLOAT: &'static str;
    /// The built-in that reinterprets a 64-bit integer as a double.
    const DOUBLE_FROM_BITS: &'static str;
    /// The prefix of the language's reinterpretation built-ins (`as_` of OpenCL's `as_T`),
    /// which take scalars and native vectors other than 3-lane ones; `None`: every bitcast
    /// goes through a union.
    const BITCAST: Option<&'static str>;
    /// The extension f64 needs (enabled by a pragma), if any.
    const F64_EXTENSION: Option<&'static str>;
    /// The definitions of `kiln_f16_to_f32` and `kiln_f32_to_f16` (round to nearest even).
    const F16_HELPERS: &'static str;
    /// The definition of `kiln_f64_to_f16`: an f64 rounded once to f16 bits (a detour
    /// through f32 could round twice). It may call the f16 helpers.
    const F64_TO_F16: &'static str;

    /// The integer type names: i8, i16, i32, i64, u8, u16, u32, u64 (`bool`, `float` and
    /// `double` are the same in every GPU language; f16 and bf16 are held in u16).
    const INTEGERS: [&'static str; 8];

    /// The register type of a scalar.
    fn type_name(s: Scalar) -> &'static str {
        let [i8, i16, i32, i64, u8, u16, u32, u64] = Self::INTEGERS;
        match s {
            Scalar::Bool => "bool",
            Scalar::I8 => i8,
            Scalar::I16 => i16,
            Scalar::I32 => i32,
            Scalar::I64 => i64,
            Scalar::U8 => u8,
            Scalar::U16 | Scalar::F16 | Scalar::BF16 => u16,
            Scalar::U32 => u32,
            Scalar::U64 => u64,
            Scalar::F32 => "float",
            Scalar::F64 => "double",
        }
    }

    /// Registers the helper function of the WMMA form `w` (see [`Dialect::wmma`]) and
    /// returns its name; `types` are the C types of the A, B and C (= D) fragments, as the
    /// dialect spells them (structs of an array `v` where the width is not native). The
    /// default refuses: a language without a matrix-unit instruction kiln renders.
    ///
    /// # Errors
    /// [`Error::Render`] (through [`unsupported_wmma`]) naming the form.
    fn wmma(w: &Wmma, _types: [&str; 3], _p: &mut Prelude) -> Result<String> {
        Err(unsupported_wmma(w, "this language has no matrix-unit instruction that kiln renders"))
    }

    /// `e` converted from float `from` to integer `to`, saturating, NaN to 0 (Rust's `as`).
    /// Default: kiln's helper ([`saturating_cast`]).
    fn float_to_int(e: &str, from: Scalar, to: Scalar, p: &mut Prelude) -> String {
        let name = format!("kiln_{}_to_{}", from.name(), to.name());
        let def = name.clone();
        p.need(&name, |_| {
            saturating_cast(Self::FUNCTION, &def, (from, Self::type_name(from)), (to, Self::type_name(to)))
        });
        format!("{name}({e})")
    }
}

/// The [`Dialect`] of a [`GpuLanguage`] (see the module docs).
#[derive(Debug, Clone)]
pub struct Gpu<L> {
    /// The language.
    pub lang: L,
    /// The device runs f64; without it, a kernel using f64 is refused at render time.
    pub fp64: bool,
}

impl<L: GpuLanguage> Gpu<L> {
    /// The dialect of `lang` for a device that does (or does not) run f64.
    pub fn new(lang: L, fp64: bool) -> Gpu<L> {
        Gpu { lang, fp64 }
    }

    fn native(w: u8) -> bool {
        L::NATIVE_WIDTHS.contains(&w)
    }

    /// The type name of `s` in memory and in vectors (bool is a byte).
    fn element(s: Scalar) -> &'static str {
        L::type_name(if s == Scalar::Bool { Scalar::U8 } else { s })
    }

    fn need_f64(&self, s: Scalar, p: &mut Prelude) {
        if let (Scalar::F64, Some(ext)) = (s, L::F64_EXTENSION) {
            p.need("fp64", |_| format!("#pragma OPENCL EXTENSION {ext} : enable"));
        }
    }

    fn need_f16(p: &mut Prelude) {
        p.need("f16", |_| L::F16_HELPERS.into());
    }

    /// Registers `kiln_bf16_to_f32` and `kiln_f32_to_bf16`: bf16 is the high half of an
    /// f32; rounding is to nearest even, and a NaN stays a (quiet) NaN.
    fn need_bf16(p: &mut Prelude) {
        let (fun, u16, u32) = (L::FUNCTION, L::type_name(Scalar::U16), L::type_name(Scalar::U32));
        let (from_bits, of_float) = (L::FLOAT_FROM_BITS, L::BITS_OF_FLOAT);
        p.need("bf16", |_| {
            format!(
                "{fun} float kiln_bf16_to_f32({u16} b) {{ return {from_bits}(({u32})b << 16); }}\n\
                 {fun} {u16} kiln_f32_to_bf16(float f) {{\n\
                 \x20 {u32} u = {of_float}(f);\n\
                 \x20 if ((u & 0x7fffffffu) > 0x7f800000u) return ({u16})((u >> 16) | 0x40u);\n\
                 \x20 return ({u16})((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n\
                 }}"
            )
        });
    }

    /// The C type of a value dtype (scalar or vector), registering what it needs.
    fn value_type(&self, dt: DType, p: &mut Prelude) -> String {
        match dt {
            DType::Vector(s, w) => self.vector_type(s, w, p),
            DType::Scalar(s) => self.scalar_type(s, p),
            _ => "void".into(),
        }
    }

    /// A struct vector of type `ty` from its element expressions.
    fn struct_value(ty: &str, elements: &[String]) -> String {
        let elements = elements.join(", ");
        if L::CPLUSPLUS { format!("{ty}{{{{{elements}}}}}") } else { format!("(({ty}){{{{{elements}}}}})") }
    }

    /// Whether the language's reinterpretation built-in takes values of `dt`.
    fn bitcast_builtin_takes(dt: DType) -> bool {
        match dt {
            DType::Scalar(s) => s != Scalar::Bool,
            DType::Vector(s, w) => s != Scalar::Bool && Self::native(w) && w != 3,
            _ => false,
        }
    }
}

/// Element `k` after `addr` as an lvalue or rvalue.
fn element(addr: &Address, k: u8) -> String {
    if k == 0 { format!("({})[{}]", addr.base, addr.index) } else { format!("({})[({}) + {k}]", addr.base, addr.index) }
}

impl<L: GpuLanguage> Syntax for Gpu<L> {
    fn scalar_type(&self, s: Scalar, p: &mut Prelude) -> String {
        self.need_f64(s, p);
        L::type_name(s).into()
    }
}

impl<L: GpuLanguage> Dialect for Gpu<L> {
    /// The language and whether the device runs f64: all a GPU dialect renders by.
    fn identity(&self) -> Option<String> {
        Some(format!("gpu {} fp64={}", std::any::type_name::<L>(), self.fp64))
    }

    /// f64 on a device without it.
    fn refuse(&self, ast: &Arc<UOp>, device: &DeviceSpec) -> Result<()> {
        if !self.fp64 && ast.toposort().iter().any(|n| n.dtype().scalar() == Some(Scalar::F64)) {
            return Err(Error::Render(format!(
                "the kernel uses f64 but {device} lacks {}: compute in f32 or use another device",
                L::F64_EXTENSION.unwrap_or("f64 support")
            )));
        }
        Ok(())
    }

    fn header(&self) -> String {
        L::HEADER.into()
    }

    fn memory_type(&self, s: Scalar, p: &mut Prelude) -> String {
        self.need_f64(s, p);
        Self::element(s).into()
    }

    fn vector_type(&self, s: Scalar, w: u8, p: &mut Prelude) -> String {
        let elem = self.memory_type(s, p);
        if Self::native(w) {
            return format!("{elem}{w}");
        }
        let name = format!("kiln_{}x{w}", elem.replace(' ', "_"));
        p.need(&name, |_| {
            if L::CPLUSPLUS {
                format!("struct {name} {{ {elem} v[{w}]; }};")
            } else {
                format!("typedef struct {{ {elem} v[{w}]; }} {name};")
            }
        });
        name
    }

    fn lane(&self, v: &str, dtype: DType, lane: u8) -> String {
        let DType::Vector(s, w) = dtype else { return v.to_string() };
        let e = if Self::native(w) { format!("({v}).s{lane:x}") } else { format!("({v}).v[{lane}]") };
        if s == Scalar::Bool { format!("((bool){e})") } else { e }
    }

    fn vector_literal(&self, dtype: DType, lanes: &[String], p: &mut Prelude) -> String {
        let ty = self.value_type(dtype, p);
        if Self::native(dtype.width()) {
            return format!("(({ty})({}))", lanes.join(", "));
        }
        // Each lane is converted to the element type explicitly: C++ brace initialization
        // refuses the implicit narrowing of a promoted `int` to a `short` or `char` element.
        let elem = Self::element(dtype.scalar().unwrap_or(Scalar::U8));
        let lanes: Vec<String> = lanes.iter().map(|l| format!("({elem})({l})")).collect();
        Self::struct_value(&ty, &lanes)
    }

    fn native_vector_op(&self, op: Op, dtype: DType) -> bool {
        matches!(dtype, DType::Vector(s, w) if Self::native(w) && c_vector_operator(op, s))
    }

    /// The math built-ins of a language with native vectors take float and double vectors
    /// and apply the scalar function to each lane, so a vector FMA (the matmul inner loop),
    /// max or exp is one call instead of a literal of per-lane calls that the compiler would
    /// have to re-vectorize.
    fn vector_alu(&self, op: Op, dtype: DType, args: &[String], p: &mut Prelude) -> Option<String> {
        let DType::Vector(s @ (Scalar::F32 | Scalar::F64), w) = dtype else { return None };
        if !Self::native(w) {
            return None;
        }
        let f = match op {
            Op::MulAcc => MathFn::Fma,
            Op::Max => MathFn::Fmax,
            Op::Min => MathFn::Fmin,
            Op::Sqrt => MathFn::Sqrt,
            Op::Exp2 => MathFn::Exp2,
            Op::Log2 => MathFn::Log2,
            Op::Exp => MathFn::Exp,
            Op::Log => MathFn::Log,
            Op::Sin => MathFn::Sin,
            Op::Cos => MathFn::Cos,
            Op::Trunc => MathFn::Trunc,
            Op::Abs => MathFn::Fabs,
            _ => return None,
        };
        Some(self.math(f, s, args, p))
    }

    fn to_f32(&self, e: &str, s: Scalar, p: &mut Prelude) -> String {
        match s {
            Scalar::F32 => e.to_string(),
            Scalar::F16 => {
                Self::need_f16(p);
                format!("kiln_f16_to_f32({e})")
            }
            Scalar::BF16 => {
                Self::need_bf16(p);
                format!("kiln_bf16_to_f32({e})")
            }
            _ => format!("((float)({e}))"),
        }
    }

    fn from_f32(&self, e: &str, s: Scalar, p: &mut Prelude) -> String {
        match s {
            Scalar::F32 => e.to_string(),
            Scalar::F16 => {
                Self::need_f16(p);
                format!("kiln_f32_to_f16({e})")
            }
            Scalar::BF16 => {
                Self::need_bf16(p);
                format!("kiln_f32_to_bf16({e})")
            }
            other => format!("(({})({e}))", self.scalar_type(other, p)),
        }
    }

    fn math(&self, f: MathFn, s: Scalar, args: &[String], p: &mut Prelude) -> String {
        self.need_f64(s, p);
        if L::OVERLOADED_MATH { format!("{}({})", f.c_name(), args.join(", ")) } else { f.c_call(s, args) }
    }

    /// f16/bf16 go through f32 (f64 → f16 rounds once, with [`GpuLanguage::F64_TO_F16`]);
    /// float → integer is [`GpuLanguage::float_to_int`]; anything → bool is `!= 0`.
    fn cast(&self, e: &str, from: Scalar, to: Scalar, p: &mut Prelude) -> String {
        let half = |s: Scalar| matches!(s, Scalar::F16 | Scalar::BF16);
        if from == to {
            return e.to_string();
        }
        if half(from) {
            let f = self.to_f32(e, from, p);
            return if to == Scalar::Bool { format!("({f} != 0.0f)") } else { self.cast(&f, Scalar::F32, to, p) };
        }
        if to == Scalar::Bool {
            return format!("(({e}) != 0)");
        }
        if half(to) {
            if to == Scalar::F16 && from == Scalar::F64 {
                p.need("f64_to_f16", |p| {
                    self.need_f64(Scalar::F64, p);
                    Self::need_f16(p);
                    L::F64_TO_F16.into()
                });
                return format!("kiln_f64_to_f16({e})");
            }
            let f = self.cast(e, from, Scalar::F32, p);
            return self.from_f32(&f, to, p);
        }
        if from.is_float() && to.is_int() {
            return L::float_to_int(e, from, to, p);
        }
        format!("(({})({e}))", self.scalar_type(to, p))
    }

    /// A bool result is `!= 0` (any non-zero byte is true); what the language's built-in
    /// cannot reinterpret goes through a union helper (NVRTC and OpenCL C both allow union
    /// punning).
    fn bitcast(&self, e: &str, from: DType, to: DType, p: &mut Prelude) -> Result<String> {
        if from.size() != to.size() {
            return Err(Error::Render(format!("bitcast {from} -> {to} changes the size")));
        }
        let (ft, tt) = (self.value_type(from, p), self.value_type(to, p));
        if ft == tt {
            return Ok(e.to_string());
        }
        match (from, to) {
            (_, DType::Scalar(Scalar::Bool)) => return Ok(format!("(({e}) != 0)")),
            (DType::Scalar(Scalar::Bool), DType::Scalar(_)) => return Ok(format!("(({tt})({e}))")),
            _ => {}
        }
        if let Some(prefix) = L::BITCAST
            && Self::bitcast_builtin_takes(from)
            && Self::bitcast_builtin_takes(to)
        {
            return Ok(format!("{prefix}{tt}({e})"));
        }
        let name = format!("kiln_bitcast_{}_{}", ft.replace(' ', "_"), tt.replace(' ', "_"));
        let fun = L::FUNCTION;
        p.need(&name, |_| {
            format!("{fun} {tt} {name}({ft} x) {{ union {{ {ft} a; {tt} b; }} u; u.a = x; return u.b; }}")
        });
        Ok(format!("{name}({e})"))
    }

    fn float_const(&self, v: f64, s: Scalar, p: &mut Prelude) -> String {
        let u16 = L::type_name(Scalar::U16);
        match s {
            Scalar::F16 => format!("(({u16}){:#06x})", f16_bits(v)),
            Scalar::BF16 => format!("(({u16}){:#06x})", bf16_bits(v)),
            Scalar::F64 => {
                self.need_f64(s, p);
                if v.is_finite() {
                    c_float_literal(v, s)
                } else {
                    format!("{}({:#x}U{})", L::DOUBLE_FROM_BITS, v.to_bits(), L::LONG)
                }
            }
            _ => {
                let f = v as f32;
                if f.is_finite() {
                    c_float_literal(v, Scalar::F32)
                } else {
                    format!("{}({:#x}u)", L::FLOAT_FROM_BITS, f.to_bits())
                }
            }
        }
    }

    fn int_const(&self, v: i64, s: Scalar) -> String {
        match s {
            Scalar::Bool => (if v != 0 { "true" } else { "false" }).into(),
            _ => int_literal(v, s, L::LONG),
        }
    }

    fn signature(&self, name: &str, params: &[KernelParam], vars: &[KernelVar], p: &mut Prelude) -> String {
        let mut args: Vec<String> = Vec::new();
        for kp in params {
            let t = self.memory_type(kp.scalar, p);
            if L::BUFFER_OFFSETS {
                args.push(format!("{}{t}* {}_base", L::BUFFER, kp.name));
                args.push(format!("{} {}_off", L::type_name(Scalar::U64), kp.name));
            } else {
                args.push(format!("{}{t}* {}", L::BUFFER, kp.name));
            }
        }
        for v in vars {
            let t = self.value_type(v.dtype, p);
            args.push(format!("{t} {}", v.name));
        }
        format!("{} {name}({}) {{", L::KERNEL, args.join(", "))
    }

    /// With [`GpuLanguage::BUFFER_OFFSETS`], rebuilds each `dataN` from its base and byte
    /// offset, so a view at any element offset works.
    fn prologue(&self, params: &[KernelParam], _vars: &[KernelVar], p: &mut Prelude) -> Vec<String> {
        if !L::BUFFER_OFFSETS {
            return Vec::new();
        }
        let (b, u8) = (L::BUFFER, L::type_name(Scalar::U8));
        params
            .iter()
            .map(|kp| {
                let t = self.memory_type(kp.scalar, p);
                let n = &kp.name;
                format!("{b}{t}* {n} = ({b}{t}*)(({b}{u8}*){n}_base + {n}_off);")
            })
            .collect()
    }

    fn open_launch(&self, indices: &[LaunchIndex], p: &mut Prelude) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        for ix in indices {
            let (t, n, a) = (self.value_type(ix.dtype, p), &ix.name, ix.axis);
            match ix.kind {
                'l' => lines.push(format!("const {t} {n} = ({t}){};", L::LOCAL_ID[a])),
                'i' if L::GUARD_DIRECT => {
                    let (wide, u64) = (format!("kiln_{n}"), L::type_name(Scalar::U64));
                    lines.push(format!("const {u64} {wide} = {};", L::GLOBAL_ID[a]));
                    lines.push(format!("if ({wide} < ({u64})({})) {{", ix.extent));
                    lines.push(format!("const {t} {n} = ({t}){wide};"));
                }
                'i' => lines.push(format!("const {t} {n} = ({t}){};", L::GLOBAL_ID[a])),
                _ => lines.push(format!("const {t} {n} = ({t}){};", L::GROUP_ID[a])),
            }
        }
        Ok(lines)
    }

    fn load(&self, addr: &Address, dtype: DType, p: &mut Prelude) -> String {
        match dtype {
            DType::Vector(_, w) if Self::native(w) => format!("vload{w}(0, {})", addr.pointer()),
            DType::Vector(_, w) => {
                let ty = self.value_type(dtype, p);
                let lanes: Vec<String> = (0..w).map(|k| element(addr, k)).collect();
                Self::struct_value(&ty, &lanes)
            }
            DType::Scalar(Scalar::Bool) => format!("({} != 0)", element(addr, 0)),
            _ => element(addr, 0),
        }
    }

    fn store(&self, addr: &Address, value: &str, dtype: DType, _p: &mut Prelude) -> String {
        match dtype {
            DType::Vector(_, w) if Self::native(w) => format!("vstore{w}({value}, 0, {})", addr.pointer()),
            DType::Vector(_, w) => {
                let parts: Vec<String> = (0..w).map(|k| format!("{} = ({value}).v[{k}];", element(addr, k))).collect();
                format!("{{ {} }}", parts.join(" "))
            }
            _ => format!("{} = {value}", element(addr, 0)),
        }
    }

    fn local_memory(&self, name: &str, s: Scalar, len: usize, p: &mut Prelude) -> Result<Option<String>> {
        Ok(Some(format!("{} {} {name}[{len}]", L::SHARED, self.memory_type(s, p))))
    }

    fn wmma(&self, w: &Wmma, args: &[String; 3], p: &mut Prelude) -> Result<String> {
        let [a, b, c] = w.operand_dtypes().map(|dt| self.value_type(dt, p));
        let name = L::wmma(w, [&a, &b, &c], p)?;
        Ok(format!("{name}({}, {}, {})", args[0], args[1], args[2]))
    }

    fn barrier(&self, _p: &mut Prelude) -> Result<String> {
        Ok(L::BARRIER.into())
    }
}
