//! CUDA C++ from the kernel IR: kiln's C-family code generator ([`kiln_cstyle`]) with CUDA
//! C++ as data for its GPU dialect. The core decides what every op means; this file only
//! says how CUDA spells it.
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
//! - Vectors are structs of an array (`kiln_floatx4 { float v[4]; }`), computed lane by lane
//!   (no native widths): CUDA's `float4` has no arithmetic operators without the toolkit's
//!   helper headers.
//! - Bool is `bool` in registers and `unsigned char` in memory and in vectors, so a byte
//!   other than 0/1 in a bool buffer reads as `true`, never as an invalid `bool`.
//! - float → integer casts saturate and map NaN to 0 with explicit compares (a C++ cast of an
//!   out-of-range float is undefined behaviour the optimizer may exploit).
//! - WMMA's warp forms ([`Wmma::WARP_SHAPES`]) are one inline-PTX `mma.sync.aligned` each
//!   (see [`CudaCpp::wmma`]); the one-thread form is the CPU's and is refused.

use kiln_cstyle::{CStyle, Gpu, GpuLanguage, Prelude, unsupported_wmma};
use kiln_device::Result;
use kiln_device::kiln_ir::{DeviceSpec, Scalar, Wmma};

/// CUDA C++ as data for the GPU dialect ([`kiln_cstyle::gpu`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaCpp;

/// The CUDA C++ dialect.
pub type CudaDialect = Gpu<CudaCpp>;

/// Renders kernels as CUDA C++. The source does not depend on the GPU: the architecture is
/// the compiler's business, so one rendering serves every CUDA device.
pub type CudaRenderer = CStyle<CudaDialect>;

/// The WMMA forms a CUDA device of compute capability `major.minor` runs with `mma.sync`:
/// every warp form on sm_80 and later; the m16n8k8 f16 forms on sm_75 (Turing); none before.
pub fn cuda_wmma_forms(major: u32, minor: u32) -> Vec<Wmma> {
    let sm = major * 10 + minor;
    Wmma::warp_shapes().into_iter().filter(|w| sm >= 80 || (sm >= 75 && w.k == 8 && w.input == Scalar::F16)).collect()
}

/// The PTX type of an `mma.sync` operand of `s`; f32 inputs are tf32.
fn ptx_type(s: Scalar, input: bool) -> &'static str {
    match s {
        Scalar::F16 => "f16",
        Scalar::BF16 => "bf16",
        _ if input => "tf32",
        _ => "f32",
    }
}

/// The 32-bit registers of fragment `frag` (elements of `s`, `elems` of them) as `"r"`
/// operands: two 16-bit elements per register, the lower-indexed in the low half (PTX's
/// `.f16x2`/`.bf16x2` packing), or one f32's bits (tf32 reads the top 19 of them).
fn packed_registers(frag: &str, s: Scalar, elems: usize) -> Vec<String> {
    if s.size() == 2 {
        (0..elems / 2)
            .map(|j| {
                format!("\"r\"((unsigned int){frag}.v[{}] | ((unsigned int){frag}.v[{}] << 16))", 2 * j, 2 * j + 1)
            })
            .collect()
    } else {
        (0..elems).map(|j| format!("\"r\"(__float_as_uint({frag}.v[{j}]))")).collect()
    }
}

/// The renderer for the CUDA device `device`.
pub fn cuda_renderer(device: DeviceSpec) -> CudaRenderer {
    CStyle::new(Gpu::new(CudaCpp, true), device)
}

impl GpuLanguage for CudaCpp {
    const HEADER: &'static str = "// CUDA C++ rendered by kiln";
    const FUNCTION: &'static str = "static __device__ __forceinline__";
    const KERNEL: &'static str = "extern \"C\" __global__ void";
    const BUFFER: &'static str = "";
    const BUFFER_OFFSETS: bool = false;
    const SHARED: &'static str = "__shared__";
    /// `__syncthreads()` waits for every thread of the block and makes the shared and global
    /// memory accesses made before it by any of them visible to all of them.
    const BARRIER: &'static str = "__syncthreads()";
    const GROUP_ID: [&'static str; 3] = ["blockIdx.x", "blockIdx.y", "blockIdx.z"];
    const LOCAL_ID: [&'static str; 3] = ["threadIdx.x", "threadIdx.y", "threadIdx.z"];
    const GLOBAL_ID: [&'static str; 3] = [
        "(unsigned long long)blockIdx.x * blockDim.x + threadIdx.x",
        "(unsigned long long)blockIdx.y * blockDim.y + threadIdx.y",
        "(unsigned long long)blockIdx.z * blockDim.z + threadIdx.z",
    ];
    const GUARD_DIRECT: bool = true;
    const INTEGERS: [&'static str; 8] = [
        "signed char",
        "short",
        "int",
        "long long",
        "unsigned char",
        "unsigned short",
        "unsigned int",
        "unsigned long long",
    ];
    const NATIVE_WIDTHS: &'static [u8] = &[];
    const OVERLOADED_MATH: bool = false;
    const LONG: &'static str = "LL";
    const CPLUSPLUS: bool = true;
    const FLOAT_FROM_BITS: &'static str = "__uint_as_float";
    const BITS_OF_FLOAT: &'static str = "__float_as_uint";
    const DOUBLE_FROM_BITS: &'static str = "__longlong_as_double";
    const BITCAST: Option<&'static str> = None;
    const F64_EXTENSION: Option<&'static str> = None;
    /// IEEE binary16 <-> binary32, round to nearest even, NaN stays NaN (quiet).
    const F16_HELPERS: &'static str = "\
static __device__ __forceinline__ float kiln_f16_to_f32(unsigned short h) {
  unsigned int s = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return __uint_as_float(s | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
  if (e == 0u) return __uint_as_float(s) + (s ? -1.0f : 1.0f) * (float)m * 5.9604644775390625e-8f;
  return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}
static __device__ __forceinline__ unsigned short kiln_f32_to_f16(float f) {
  unsigned int u = __float_as_uint(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(s | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (unsigned short)(s | 0x7c00u);
  if (a < 0x38800000u) {
    unsigned int m = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23);
    if (shift > 24u) return (unsigned short)s;
    unsigned int r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    r += (rem > half || (rem == half && (r & 1u))) ? 1u : 0u;
    return (unsigned short)(s | r);
  }
  a += 0xfffu + ((a >> 13) & 1u) - 0x38000000u;
  return (unsigned short)(s | (a >> 13));
}";
    /// `kiln_wmma_<shape>_<input>_<acc>`: one `mma.sync.aligned.<shape>.row.col` on the
    /// warp's fragments, whose lanes [`kiln_device::kiln_ir::wmma`] lays out as the PTX ISA
    /// does for these shapes (A row-major, B column-major: `.row.col`). The fragments are kiln's
    /// struct vectors; their 16-bit elements are packed two per register, an f32 accumulator
    /// is four `"f"` registers, an f16 one two packed `"r"` registers unpacked after the
    /// instruction. The sum's order and internal precision are the hardware's, and tf32
    /// inputs keep only their top 19 bits.
    fn wmma(w: &Wmma, types: [&str; 3], p: &mut Prelude) -> Result<String> {
        if w.threads != 32 {
            return Err(unsupported_wmma(
                w,
                "CUDA renders the 32-thread warp forms with mma.sync; the one-thread form is the CPU's",
            ));
        }
        if let Some(why) = w.check() {
            return Err(unsupported_wmma(w, &why));
        }
        let name = format!("kiln_wmma_{}_{}_{}", w.shape_name(), w.input.name(), w.acc.name());
        let def = name.clone();
        let [at, bt, ct] = types;
        p.need(&name, |_| {
            let a = packed_registers("a", w.input, w.a_elems());
            let b = packed_registers("b", w.input, w.b_elems());
            let (outputs, c, unpack): (Vec<String>, Vec<String>, String) = if w.acc == Scalar::F32 {
                let outs = (0..w.c_elems()).map(|i| format!("\"=f\"(d.v[{i}])")).collect();
                (outs, (0..w.c_elems()).map(|i| format!("\"f\"(c.v[{i}])")).collect(), String::new())
            } else {
                let regs = w.c_elems() / 2;
                let outs = (0..regs).map(|i| format!("\"=r\"(r[{i}])")).collect();
                let unpack = (0..w.c_elems())
                    .map(|i| format!("  d.v[{i}] = (unsigned short)(r[{}] >> {});\n", i / 2, 16 * (i % 2)))
                    .collect::<String>();
                (outs, packed_registers("c", w.acc, w.c_elems()), format!("  unsigned int r[{regs}];\n{unpack}"))
            };
            let mut next = 0;
            let mut group = |n: usize| {
                let g: Vec<String> = (next..next + n).map(|i| format!("%{i}")).collect();
                next += n;
                format!("{{{}}}", g.join(", "))
            };
            let (gd, ga, gb, gc) = (group(outputs.len()), group(a.len()), group(b.len()), group(c.len()));
            let instr = format!(
                "mma.sync.aligned.{}.row.col.{}.{}.{}.{}",
                w.shape_name(),
                ptx_type(w.acc, false),
                ptx_type(w.input, true),
                ptx_type(w.input, true),
                ptx_type(w.acc, false)
            );
            // The unpacking of an f16 D goes after the asm; its register array before it.
            let (decl, after) = match unpack.split_once('\n') {
                Some((decl, after)) if !unpack.is_empty() => (format!("{decl}\n"), after.to_string()),
                _ => (String::new(), String::new()),
            };
            let inputs: Vec<String> = a.into_iter().chain(b).chain(c).collect();
            format!(
                "/* WMMA {w}: D = A·B + C on the warp's mma.sync fragments. */\n\
                 static __device__ __forceinline__ {ct} {def}({at} a, {bt} b, {ct} c) {{\n  {ct} d;\n{decl}  \
                 asm(\"{instr} {gd}, {ga}, {gb}, {gc};\"\n      : {}\n      : {});\n{after}  return d;\n}}",
                outputs.join(", "),
                inputs.join(", ")
            )
        });
        Ok(name)
    }

    /// One rounding from double: the double is first rounded to float with round-to-odd
    /// (`__double2float_rz` plus a sticky bit), which makes the second rounding exact.
    const F64_TO_F16: &'static str = "\
static __device__ __forceinline__ unsigned short kiln_f64_to_f16(double d) {
  float f = __double2float_rz(d);
  unsigned int u = __float_as_uint(f);
  if (d == d && (double)f != d && (u & 0x7fffffffu) < 0x7f800000u) u |= 1u;
  return kiln_f32_to_f16(__uint_as_float(u));
}";
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use kiln_cstyle::{Dialect, MathFn, Prelude, testing};
    use kiln_device::Renderer;
    use kiln_device::kiln_ir::{DType, KernelBuilder, Scalar, UOp};

    fn render(sink: &Arc<UOp>) -> String {
        cuda_renderer(DeviceSpec::new(crate::BACKEND, 0)).render(sink, Some("k")).unwrap().src
    }

    #[test]
    fn shared_memory_and_barriers_are_spelled_for_cuda() {
        let src = render(&testing::tiled_matmul());
        testing::assert_work_groups(&src, "__shared__ float lmem0[256];", "blockIdx", "__syncthreads();");
    }

    #[test]
    fn launch_indices_are_spelled_for_cuda() {
        let src = render(&testing::grouped_compare());
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
        let d = Gpu::new(CudaCpp, true);
        let mut p = Prelude::default();
        assert_eq!(d.int_const(i64::MIN, Scalar::I64), "(-9223372036854775807LL - 1)");
        assert_eq!(d.int_const(5, Scalar::U64), "5ULL");
        assert_eq!(d.float_const(f64::INFINITY, Scalar::F32, &mut p), "__uint_as_float(0x7f800000u)");
        assert_eq!(
            d.float_const(f64::NEG_INFINITY, Scalar::F64, &mut p),
            "__longlong_as_double(0xfff0000000000000ULL)"
        );
        assert_eq!(d.float_const(1.0, Scalar::F16, &mut p), "((unsigned short)0x3c00)");
        assert_eq!(d.vector_type(Scalar::Bool, 4, &mut p), "kiln_unsigned_charx4");
        assert_eq!(d.lane("v", DType::Vector(Scalar::F32, 16), 15), "(v).v[15]");
        assert_eq!(d.math(MathFn::Fma, Scalar::F32, &["a".into(), "b".into(), "c".into()], &mut p), "fmaf(a, b, c)");
        assert_eq!(d.cast("x", Scalar::F32, Scalar::I8, &mut p), "kiln_f32_to_i8(x)");
        assert!(p.items().iter().any(|i| i.contains("x != x ? (signed char)0 : x <= (-128.0f) ? (-128)")));
    }

    /// Each warp form is one mma.sync with tinygrad's operand types and register counts.
    #[test]
    fn wmma_warp_forms_are_one_mma_sync_each() {
        use kiln_device::kiln_ir::Wmma;
        for (w, instr, regs) in Wmma::warp_shapes()
            .into_iter()
            .zip([
                (
                    "m16n8k16.row.col.f32.f16.f16.f32",
                    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13}",
                ),
                (
                    "m16n8k16.row.col.f32.bf16.bf16.f32",
                    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13}",
                ),
                ("m16n8k16.row.col.f16.f16.f16.f16", "{%0, %1}, {%2, %3, %4, %5}, {%6, %7}, {%8, %9}"),
                ("m16n8k8.row.col.f32.f16.f16.f32", "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10}"),
                ("m16n8k8.row.col.f16.f16.f16.f16", "{%0, %1}, {%2, %3}, {%4}, {%5, %6}"),
                (
                    "m16n8k8.row.col.f32.tf32.tf32.f32",
                    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13}",
                ),
            ])
            .map(|(w, (i, r))| (w, i, r))
        {
            let mut k = KernelBuilder::new();
            let [a, b, c] = w.operand_dtypes();
            let lane = k.special("lidx0", 32);
            let frag = |k: &mut KernelBuilder, slot: usize, dt: DType| {
                let p = k.param(slot, dt.scalar().unwrap_or(Scalar::F32), 32 * dt.width() as i64);
                p.at_vec(&(&lane * dt.width() as i64), dt.width())
            };
            let (pa, pb, pc) = (frag(&mut k, 0, a), frag(&mut k, 1, b), frag(&mut k, 2, c));
            k.store(&pc, &pa.load().wmma(&pb.load(), &pc.load(), w));
            let src = render(&k.finish().unwrap());
            assert!(src.contains(&format!("asm(\"mma.sync.aligned.{instr} {regs};\"")), "{w}:\n{src}");
        }
        assert_eq!(cuda_wmma_forms(9, 0).len(), 6);
        assert_eq!(cuda_wmma_forms(7, 5).iter().map(|w| (w.k, w.input)).collect::<Vec<_>>(), [(8, Scalar::F16); 2]);
        assert!(cuda_wmma_forms(7, 0).is_empty());
    }
}
