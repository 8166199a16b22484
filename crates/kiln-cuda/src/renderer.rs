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

use kiln_cstyle::{CStyle, Gpu, GpuLanguage};
use kiln_device::kiln_ir::DeviceSpec;

/// CUDA C++ as data for the GPU dialect ([`kiln_cstyle::gpu`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaCpp;

/// The CUDA C++ dialect.
pub type CudaDialect = Gpu<CudaCpp>;

/// Renders kernels as CUDA C++. The source does not depend on the GPU: the architecture is
/// the compiler's business, so one rendering serves every CUDA device.
pub type CudaRenderer = CStyle<CudaDialect>;

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
}
