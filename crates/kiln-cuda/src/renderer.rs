//! CUDA C++ from the kernel IR: the shared C-family core ([`kiln_device::cstyle`]) with the
//! CUDA dialect below. The core decides what every op means; this file only spells it.
//!
//! Spelling choices:
//! - The entry point is `extern "C" __global__`, so its symbol is its name (no C++ mangling)
//!   and [`crate::program`] finds it with `cuModuleGetFunction`.
//! - Buffers arrive as plain device pointers `T* dataN`: the host adds a view's byte offset
//!   to the `CUdeviceptr` before the launch, so views need no offset arguments.
//! - `gidxN` = `blockIdx.{x,y,z}`, `lidxN` = `threadIdx.{x,y,z}`, `core_id` = `blockIdx.x`.
//!   `idxN` = `blockIdx * blockDim + threadIdx`, computed in 64 bits: a direct launch rounds
//!   its grid up to whole blocks, so the body is guarded by `idxN < extent`.
//! - No header is included: NVRTC needs none of the toolkit's headers (the PyPI NVRTC wheel
//!   ships none). f16 and bf16 are their bits (`unsigned short`) in registers and memory,
//!   computed in f32 with kiln's own round-to-nearest-even conversions, like OpenCL.
//! - Vectors are structs of an array (`kiln_floatx4 { float v[4]; }`), computed lane by lane:
//!   CUDA's `float4` has no arithmetic operators without the toolkit's helper headers.
//! - Bool is `bool` in registers and `unsigned char` in memory and in vectors, so a byte
//!   other than 0/1 in a bool buffer reads as `true`, never as an invalid `bool`.
//! - float → integer casts saturate and map NaN to 0 with explicit compares (a C++ cast of an
//!   out-of-range float is undefined behaviour the optimizer may exploit).

use std::sync::Arc;

use kiln_device::cstyle::gpu::{self, HalfBits, HelperSpelling, element, store_elements, value_type};
use kiln_device::cstyle::{
    Address, CStyle, Dialect, KernelParam, KernelVar, LaunchIndex, MathFn, Prelude, bf16_bits, c_float_literal,
    c_int_literal, f16_bits,
};
use kiln_device::kiln_ir::{DType, DeviceSpec, Op, Scalar, UOp};
use kiln_device::{ProgramSpec, Renderer, Result};

/// How CUDA C++ spells the C-family core's constructs.
#[derive(Debug, Clone, Default)]
pub struct CudaDialect;

/// The CUDA C++ name of a scalar in registers.
fn scalar_name(s: Scalar) -> &'static str {
    match s {
        Scalar::Bool => "bool",
        Scalar::I8 => "signed char",
        Scalar::I16 => "short",
        Scalar::I32 => "int",
        Scalar::I64 => "long long",
        Scalar::U8 => "unsigned char",
        Scalar::U16 | Scalar::F16 | Scalar::BF16 => "unsigned short",
        Scalar::U32 => "unsigned int",
        Scalar::U64 => "unsigned long long",
        Scalar::F32 => "float",
        Scalar::F64 => "double",
    }
}

/// The element name of a scalar in memory and in vectors.
fn element_name(s: Scalar) -> &'static str {
    if s == Scalar::Bool { "unsigned char" } else { scalar_name(s) }
}

/// A one-word tag of a scalar's memory type, for helper and typedef names.
fn tag(s: Scalar) -> String {
    element_name(s).replace(' ', "_")
}

fn need_f16(p: &mut Prelude) {
    p.need("f16", |_| {
        // IEEE binary16 <-> binary32, round to nearest even, NaN stays NaN (quiet).
        "static __device__ __forceinline__ float kiln_f16_to_f32(unsigned short h) {\n\
         \x20 unsigned int s = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;\n\
         \x20 if (e == 0x1fu) return __uint_as_float(s | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));\n\
         \x20 if (e == 0u) return __uint_as_float(s) + (s ? -1.0f : 1.0f) * (float)m * 5.9604644775390625e-8f;\n\
         \x20 return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));\n\
         }\n\
         static __device__ __forceinline__ unsigned short kiln_f32_to_f16(float f) {\n\
         \x20 unsigned int u = __float_as_uint(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;\n\
         \x20 if (a > 0x7f800000u) return (unsigned short)(s | 0x7e00u | ((a >> 13) & 0x3ffu));\n\
         \x20 if (a >= 0x477ff000u) return (unsigned short)(s | 0x7c00u);\n\
         \x20 if (a < 0x38800000u) {\n\
         \x20   unsigned int m = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23);\n\
         \x20   if (shift > 24u) return (unsigned short)s;\n\
         \x20   unsigned int r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);\n\
         \x20   r += (rem > half || (rem == half && (r & 1u))) ? 1u : 0u;\n\
         \x20   return (unsigned short)(s | r);\n\
         \x20 }\n\
         \x20 a += 0xfffu + ((a >> 13) & 1u) - 0x38000000u;\n\
         \x20 return (unsigned short)(s | (a >> 13));\n\
         }"
        .into()
    });
}

impl HalfBits for CudaDialect {
    const HELPERS: HelperSpelling = HelperSpelling {
        function: "static __device__ __forceinline__",
        u16: "unsigned short",
        u32: "unsigned int",
        float_from_bits: "__uint_as_float",
        bits_of_float: "__float_as_uint",
    };

    fn need_f16(&self, p: &mut Prelude) {
        need_f16(p);
    }

    /// One rounding from double: the double is first rounded to float with round-to-odd
    /// (`__double2float_rz` plus a sticky bit), which makes the second rounding exact.
    fn f64_to_f16(&self, e: &str, p: &mut Prelude) -> String {
        p.need("f64_to_f16", |p| {
            need_f16(p);
            "static __device__ __forceinline__ unsigned short kiln_f64_to_f16(double d) {\n\
             \x20 float f = __double2float_rz(d);\n\
             \x20 unsigned int u = __float_as_uint(f);\n\
             \x20 if (d == d && (double)f != d && (u & 0x7fffffffu) < 0x7f800000u) u |= 1u;\n\
             \x20 return kiln_f32_to_f16(__uint_as_float(u));\n\
             }"
            .into()
        });
        format!("kiln_f64_to_f16({e})")
    }

    /// A saturating float → integer conversion (NaN → 0), like Rust's `as`.
    fn float_to_int(&self, e: &str, from: Scalar, to: Scalar, p: &mut Prelude) -> String {
        let (min, max): (i128, i128) = match to {
            Scalar::I8 => (i8::MIN.into(), i8::MAX.into()),
            Scalar::I16 => (i16::MIN.into(), i16::MAX.into()),
            Scalar::I32 => (i32::MIN.into(), i32::MAX.into()),
            Scalar::I64 => (i64::MIN.into(), i64::MAX.into()),
            Scalar::U8 => (0, u8::MAX.into()),
            Scalar::U16 => (0, u16::MAX.into()),
            Scalar::U32 => (0, u32::MAX.into()),
            _ => (0, u64::MAX.into()),
        };
        let (ft, tt) = (scalar_name(from), scalar_name(to));
        let name = format!("kiln_{}_to_{}", from.name(), to.name());
        // MIN is a power of two (or 0): exact in any float. MAX rounds to the nearest float,
        // which is ≥ MAX, so `x >= hi` catches exactly the values that do not fit.
        let lo = c_float_literal(min as f64, from);
        let hi = c_float_literal(if from == Scalar::F32 { max as f32 as f64 } else { max as f64 }, from);
        let (imin, imax) = (c_int_literal(min as i64, to), c_int_literal(max as u64 as i64, to));
        let def = name.clone();
        p.need(&name, move |_| {
            format!(
                "static __device__ __forceinline__ {tt} {def}({ft} x) {{ return x != x ? ({tt})0 : x <= {lo} ? {imin} : x >= {hi} ? {imax} : ({tt})x; }}"
            )
        });
        format!("{name}({e})")
    }
}

impl Dialect for CudaDialect {
    fn header(&self) -> String {
        "// CUDA C++ rendered by kiln".into()
    }

    fn scalar_type(&self, s: Scalar, _p: &mut Prelude) -> String {
        scalar_name(s).into()
    }

    fn memory_type(&self, s: Scalar, _p: &mut Prelude) -> String {
        element_name(s).into()
    }

    fn vector_type(&self, s: Scalar, w: u8, p: &mut Prelude) -> String {
        let (elem, name) = (element_name(s), format!("kiln_{}x{w}", tag(s)));
        p.need(&name, |_| format!("struct {name} {{ {elem} v[{w}]; }};"));
        name
    }

    fn lane(&self, v: &str, dtype: DType, lane: u8) -> String {
        match dtype {
            DType::Vector(Scalar::Bool, _) => format!("((bool)({v}).v[{lane}])"),
            DType::Vector(..) => format!("({v}).v[{lane}]"),
            _ => v.to_string(),
        }
    }

    fn vector_literal(&self, dtype: DType, lanes: &[String], p: &mut Prelude) -> String {
        let ty = value_type(self, dtype, p);
        // Each lane is converted to the element type explicitly: brace initialization refuses
        // the implicit narrowing of a promoted `int` expression to a `short` or `char` element.
        let elem = element_name(dtype.scalar().unwrap_or(Scalar::U8));
        let lanes: Vec<String> = lanes.iter().map(|l| format!("({elem})({l})")).collect();
        format!("{ty}{{{{{}}}}}", lanes.join(", "))
    }

    fn native_vector_op(&self, _op: Op, _dtype: DType) -> bool {
        false
    }

    fn to_f32(&self, e: &str, s: Scalar, p: &mut Prelude) -> String {
        gpu::to_f32(self, e, s, p)
    }

    fn from_f32(&self, e: &str, s: Scalar, p: &mut Prelude) -> String {
        gpu::from_f32(self, e, s, p)
    }

    fn math(&self, f: MathFn, s: Scalar, args: &[String], _p: &mut Prelude) -> String {
        // The C names: `sqrtf` for float, `sqrt` for double (CUDA's math library has both).
        let suffix = if s == Scalar::F64 { "" } else { "f" };
        format!("{}{suffix}({})", f.c_name(), args.join(", "))
    }

    fn cast(&self, e: &str, from: Scalar, to: Scalar, p: &mut Prelude) -> String {
        gpu::cast(self, e, from, to, p)
    }

    /// NVRTC supports union punning (it is how CUDA's own headers reinterpret bits).
    fn bitcast(&self, e: &str, from: DType, to: DType, p: &mut Prelude) -> Result<String> {
        gpu::bitcast(self, e, from, to, p)
    }

    fn float_const(&self, v: f64, s: Scalar, _p: &mut Prelude) -> String {
        match s {
            Scalar::F16 => format!("((unsigned short){:#06x})", f16_bits(v)),
            Scalar::BF16 => format!("((unsigned short){:#06x})", bf16_bits(v)),
            Scalar::F64 if v.is_finite() => c_float_literal(v, s),
            Scalar::F64 => format!("__longlong_as_double({:#x}LL)", v.to_bits() as i64),
            _ => {
                let f = v as f32;
                if f.is_finite() {
                    c_float_literal(v, Scalar::F32)
                } else {
                    format!("__uint_as_float({:#x}u)", f.to_bits())
                }
            }
        }
    }

    fn int_const(&self, v: i64, s: Scalar) -> String {
        match s {
            Scalar::Bool => (if v != 0 { "true" } else { "false" }).into(),
            _ => c_int_literal(v, s),
        }
    }

    fn signature(&self, name: &str, params: &[KernelParam], vars: &[KernelVar], p: &mut Prelude) -> String {
        let mut args: Vec<String> = Vec::new();
        for kp in params {
            let t = self.memory_type(kp.scalar, p);
            args.push(format!("{t}* {}", kp.name));
        }
        for v in vars {
            let t = value_type(self, v.dtype, p);
            args.push(format!("{t} {}", v.name));
        }
        format!("extern \"C\" __global__ void {name}({}) {{", args.join(", "))
    }

    fn prologue(&self, _params: &[KernelParam], _vars: &[KernelVar], _p: &mut Prelude) -> Vec<String> {
        Vec::new()
    }

    fn open_launch(&self, indices: &[LaunchIndex], p: &mut Prelude) -> Result<Vec<String>> {
        const XYZ: [&str; 3] = ["x", "y", "z"];
        let mut lines = Vec::new();
        for ix in indices {
            let (t, n, a) = (value_type(self, ix.dtype, p), &ix.name, XYZ[ix.axis]);
            match ix.kind {
                'l' => lines.push(format!("const {t} {n} = ({t})threadIdx.{a};")),
                'i' => {
                    let wide = format!("kiln_{n}");
                    lines.push(format!(
                        "const unsigned long long {wide} = (unsigned long long)blockIdx.{a} * blockDim.{a} + threadIdx.{a};"
                    ));
                    lines.push(format!("if ({wide} < (unsigned long long)({})) {{", ix.extent));
                    lines.push(format!("const {t} {n} = ({t}){wide};"));
                }
                _ => lines.push(format!("const {t} {n} = ({t})blockIdx.{a};")),
            }
        }
        Ok(lines)
    }

    fn load(&self, addr: &Address, dtype: DType, p: &mut Prelude) -> String {
        let at = |k: u8| element(addr, k);
        match dtype {
            DType::Vector(_, w) => {
                let ty = value_type(self, dtype, p);
                let lanes: Vec<String> = (0..w).map(at).collect();
                format!("{ty}{{{{{}}}}}", lanes.join(", "))
            }
            DType::Scalar(Scalar::Bool) => format!("({} != 0)", at(0)),
            _ => at(0),
        }
    }

    fn store(&self, addr: &Address, value: &str, dtype: DType, _p: &mut Prelude) -> String {
        store_elements(addr, value, dtype)
    }

    /// Block-shared memory; loads and stores index it like global memory.
    fn local_memory(&self, name: &str, s: Scalar, len: usize, p: &mut Prelude) -> Result<String> {
        Ok(format!("__shared__ {} {name}[{len}]", self.memory_type(s, p)))
    }

    /// `__syncthreads()` waits for every thread of the block and makes the shared and global
    /// memory accesses made before it by any of them visible to all of them: BARRIER's meaning.
    fn barrier(&self, _p: &mut Prelude) -> Result<String> {
        Ok("__syncthreads()".into())
    }
}

/// Renders kernels as CUDA C++. The source does not depend on the GPU: the architecture is
/// the compiler's business, so one rendering serves every CUDA device.
pub struct CudaRenderer {
    core: CStyle<CudaDialect>,
}

impl CudaRenderer {
    pub fn new(device: DeviceSpec) -> CudaRenderer {
        CudaRenderer { core: CStyle::new(CudaDialect, device) }
    }
}

impl Renderer for CudaRenderer {
    fn render(&self, ast: &Arc<UOp>, name: Option<&str>) -> Result<ProgramSpec> {
        self.core.render(ast, name)
    }

    fn device(&self) -> &DeviceSpec {
        &self.core.device
    }

    fn cache_key(&self) -> String {
        "cuda-c v1".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_device::kiln_ir::KernelBuilder;

    fn render(sink: &Arc<UOp>) -> String {
        CudaRenderer::new(DeviceSpec::new(crate::BACKEND, 0)).render(sink, Some("k")).unwrap().src
    }

    #[test]
    fn shared_memory_and_barriers_are_spelled_for_cuda() {
        let text = include_str!("../../../examples/kernels/matmul_tiled.kiln");
        let src = render(&kiln_device::kiln_ir::parse_kernel(text).unwrap());
        let decl = src.find("__shared__ float lmem0[256];").expect("shared memory at kernel scope");
        assert!(decl < src.find("blockIdx").unwrap_or(0), "declared before the launch indices:\n{src}");
        assert_eq!(src.matches("__syncthreads();").count(), 2, "{src}");
        assert!(src.contains("if (alu") && src.contains("(lmem1)["), "{src}");
    }

    #[test]
    fn launch_indices_are_spelled_for_cuda() {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 20);
        let (a, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::Bool, &n));
        let g = k.special("gidx0", &n / 4);
        let l = k.special("lidx0", 4);
        let i = &g * 4 + &l;
        k.store(&c.at(&i), &a.at(&i).load().lt(1.0));
        let src = render(&k.finish().unwrap());
        assert!(src.contains("extern \"C\" __global__ void k(float* data0, unsigned char* data1, int n)"), "{src}");
        assert!(src.contains("(int)blockIdx.x") && src.contains("(int)threadIdx.x"), "{src}");
    }

    #[test]
    fn direct_launches_guard_the_rounded_up_grid() {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 20);
        let a = k.param(0, Scalar::F32, &n);
        let i = k.global(0, &n);
        k.store(&a.at(&i), &kiln_device::kiln_ir::Val::f32(2.0));
        let src = render(&k.finish().unwrap());
        assert!(src.contains("blockIdx.x * blockDim.x + threadIdx.x"), "{src}");
        assert!(src.contains("if (kiln_idx0 < (unsigned long long)(n)) {"), "{src}");
    }

    #[test]
    fn constants_and_types_use_cuda_spellings() {
        let d = CudaDialect;
        let mut p = Prelude::default();
        assert_eq!(d.int_const(i64::MIN, Scalar::I64), "(-9223372036854775807LL - 1)");
        assert_eq!(d.int_const(5, Scalar::U64), "5ULL");
        assert_eq!(d.float_const(f64::INFINITY, Scalar::F32, &mut p), "__uint_as_float(0x7f800000u)");
        assert_eq!(d.float_const(f64::NEG_INFINITY, Scalar::F64, &mut p), "__longlong_as_double(0xfff0000000000000LL)");
        assert_eq!(d.float_const(1.0, Scalar::F16, &mut p), "((unsigned short)0x3c00)");
        assert_eq!(d.vector_type(Scalar::Bool, 4, &mut p), "kiln_unsigned_charx4");
        assert_eq!(d.lane("v", DType::Vector(Scalar::F32, 16), 15), "(v).v[15]");
        assert_eq!(d.math(MathFn::Fma, Scalar::F32, &["a".into(), "b".into(), "c".into()], &mut p), "fmaf(a, b, c)");
        assert_eq!(d.cast("x", Scalar::F32, Scalar::I8, &mut p), "kiln_f32_to_i8(x)");
        assert!(p.items().iter().any(|i| i.contains("x != x ? (signed char)0 : x <= (-128.0f) ? (-128)")));
    }
}
