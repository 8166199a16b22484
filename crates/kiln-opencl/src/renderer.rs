//! OpenCL C from the kernel IR: kiln's C-family code generator ([`kiln_cstyle`]) with OpenCL
//! C as data for its GPU dialect. The core decides what every op means; this file only says
//! how OpenCL C spells it.
//!
//! Spelling choices:
//! - Buffers arrive as `__global T* dataN_base, ulong dataN_off` (see [`crate::program`]);
//!   the prologue rebuilds `dataN` from them, so a view at any element offset works without
//!   sub-buffers (whose origin must be aligned to `CL_DEVICE_MEM_BASE_ADDR_ALIGN`).
//! - `gidxN` = `get_group_id(N)`, `lidxN` = `get_local_id(N)`, `idxN` = `get_global_id(N)`.
//!   The launch covers the extents exactly, so no bounds guard is emitted.
//! - Vectors of 2, 3, 4, 8 or 16 lanes are OpenCL vectors (`float4`), loaded and stored with
//!   `vloadN`/`vstoreN` (element alignment suffices); other widths are a struct of an array.
//! - Bool is `bool` in registers and `uchar` in memory and in vectors (OpenCL C has neither
//!   bool pointers in kernel arguments nor bool vectors).
//! - f16 and bf16 are their bits (`ushort`) in registers and memory, computed in f32; f16
//!   converts with `vload_half`/`vstore_half_rte`, which are core OpenCL C, so no device
//!   needs `cl_khr_fp16`.
//! - f64 enables `cl_khr_fp64`; a device without it refuses f64 kernels at render time.
//! - float → integer casts use `convert_T_sat` (saturating, NaN → 0, as the core specifies).
//! - Local memory is `__local T lmemN[len]` at kernel scope; BARRIER is
//!   `barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)`: the IR's barrier publishes global
//!   stores within the group too, as CUDA's `__syncthreads()` does.

use kiln_cstyle::{CStyle, Gpu, GpuLanguage, Prelude};
use kiln_device::kiln_ir::{DeviceSpec, Scalar};

use crate::ClDevice;

/// OpenCL C as data for the GPU dialect ([`kiln_cstyle::gpu`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenClC;

/// The OpenCL C dialect.
pub type OpenClDialect = Gpu<OpenClC>;

/// Renders kernels as OpenCL C for one device (or a device family: [`opencl_renderer_for`]).
pub type OpenClRenderer = CStyle<OpenClDialect>;

/// The renderer for the OpenCL device `cl`.
pub fn opencl_renderer(cl: &ClDevice) -> OpenClRenderer {
    opencl_renderer_for(cl.spec.clone(), cl.info.has_extension("cl_khr_fp64"))
}

/// A renderer that needs no OpenCL runtime (e.g. to inspect source offline), for a device
/// that does (or does not) have `cl_khr_fp64`.
pub fn opencl_renderer_for(device: DeviceSpec, fp64: bool) -> OpenClRenderer {
    CStyle::new(Gpu::new(OpenClC, fp64), device)
}

impl GpuLanguage for OpenClC {
    const HEADER: &'static str = "// OpenCL C rendered by kiln";
    const FUNCTION: &'static str = "static inline";
    const KERNEL: &'static str = "__kernel void";
    const BUFFER: &'static str = "__global ";
    const BUFFER_OFFSETS: bool = true;
    const SHARED: &'static str = "__local";
    const BARRIER: &'static str = "barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)";
    const GROUP_ID: [&'static str; 3] = ["get_group_id(0)", "get_group_id(1)", "get_group_id(2)"];
    const LOCAL_ID: [&'static str; 3] = ["get_local_id(0)", "get_local_id(1)", "get_local_id(2)"];
    const GLOBAL_ID: [&'static str; 3] = ["get_global_id(0)", "get_global_id(1)", "get_global_id(2)"];
    const GUARD_DIRECT: bool = false;
    const INTEGERS: [&'static str; 8] = ["char", "short", "int", "long", "uchar", "ushort", "uint", "ulong"];
    const NATIVE_WIDTHS: &'static [u8] = &[2, 3, 4, 8, 16];
    const OVERLOADED_MATH: bool = true;
    /// OpenCL C's `long` is 64-bit and `long long` is reserved.
    const LONG: &'static str = "L";
    const CPLUSPLUS: bool = false;
    const FLOAT_FROM_BITS: &'static str = "as_float";
    const BITS_OF_FLOAT: &'static str = "as_uint";
    const DOUBLE_FROM_BITS: &'static str = "as_double";
    const BITCAST: Option<&'static str> = Some("as_");
    const F64_EXTENSION: Option<&'static str> = Some("cl_khr_fp64");
    /// `vload_half`/`vstore_half_rte` are core OpenCL C: no device needs `cl_khr_fp16`.
    const F16_HELPERS: &'static str = "\
static inline float kiln_f16_to_f32(ushort h) { return vload_half(0, (const __private half*)&h); }
static inline ushort kiln_f32_to_f16(float f) { ushort h; vstore_half_rte(f, 0, (__private half*)&h); return h; }";
    const F64_TO_F16: &'static str = "\
static inline ushort kiln_f64_to_f16(double d) { ushort h; vstore_half_rte(d, 0, (__private half*)&h); return h; }";

    /// `convert_T_sat`: saturating, NaN to 0.
    fn float_to_int(e: &str, _from: Scalar, to: Scalar, _p: &mut Prelude) -> String {
        format!("convert_{}_sat({e})", Self::type_name(to))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use kiln_cstyle::{Dialect, testing};
    use kiln_device::kiln_ir::{DType, KernelBuilder, UOp, Val};
    use kiln_device::{Error, Renderer};

    fn render(sink: &Arc<UOp>) -> String {
        opencl_renderer_for(DeviceSpec::new(crate::BACKEND, 0), true).render(sink, Some("k")).unwrap().src
    }

    #[test]
    fn launch_indices_and_buffer_offsets_are_spelled_for_opencl() {
        let src = render(&testing::grouped_compare());
        assert!(src.contains("__kernel void k(__global float* data0_base, ulong data0_off"), "{src}");
        assert!(src.contains("__global uchar* data1_base"), "{src}");
        assert!(src.contains("get_group_id(0)") && src.contains("get_local_id(0)"), "{src}");
        assert!(src.contains("int n)"), "{src}");
    }

    #[test]
    fn local_memory_barriers_and_if_blocks_are_spelled_for_opencl() {
        let src = render(&testing::tiled_matmul());
        let barrier = "barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);";
        testing::assert_work_groups(&src, "__local float lmem0[256];", "get_group_id", barrier);
    }

    #[test]
    fn f64_is_refused_without_cl_khr_fp64() {
        let mut k = KernelBuilder::new();
        let a = k.param(0, Scalar::F64, 4);
        let i = k.global(0, 4);
        k.store(&a.at(&i), &Val::constant(DType::F64, 1.0));
        let sink = k.finish().unwrap();
        let r = opencl_renderer_for(DeviceSpec::new(crate::BACKEND, 0), false).render(&sink, None);
        assert!(matches!(r, Err(Error::Render(m)) if m.contains("cl_khr_fp64")));
        assert!(render(&sink).contains("cl_khr_fp64 : enable"));
    }

    /// The kernel cache finds a kernel's binary by the renderer's identity, without rendering:
    /// two devices that render differently (with and without f64) name different identities,
    /// and the metadata described without rendering is the rendered one's.
    #[test]
    fn the_identity_names_what_the_source_depends_on_and_describe_matches_render() {
        let spec = DeviceSpec::new(crate::BACKEND, 0);
        let (with, without) = (opencl_renderer_for(spec.clone(), true), opencl_renderer_for(spec, false));
        assert_ne!(with.identity(), without.identity());
        assert!(with.identity().is_some());
        let sink = testing::grouped_compare();
        let (rendered, described) = (with.render(&sink, Some("k")).unwrap(), with.describe(&sink, Some("k")).unwrap());
        assert_eq!(
            (rendered.name, rendered.globals, rendered.var_names),
            (described.name, described.globals, described.var_names)
        );
    }

    #[test]
    fn constants_use_opencl_suffixes() {
        let d = Gpu::new(OpenClC, true);
        let mut p = Prelude::default();
        assert_eq!(d.int_const(i64::MIN, Scalar::I64), "(-9223372036854775807L - 1)");
        assert_eq!(d.int_const(5, Scalar::U64), "5UL");
        assert_eq!(d.float_const(f64::INFINITY, Scalar::F32, &mut p), "as_float(0x7f800000u)");
        assert_eq!(d.float_const(1.0, Scalar::F16, &mut p), "((ushort)0x3c00)");
        assert_eq!(d.lane("v", DType::Vector(Scalar::F32, 16), 15), "(v).sf");
        assert_eq!(d.vector_type(Scalar::F32, 5, &mut p), "kiln_floatx5");
    }

    /// Kernels rendered, compiled and run on the first OpenCL device, against host results.
    mod runs {
        use super::*;
        use kiln_device::kiln_ir::{bf16_bits, f16_bits};
        use kiln_device::{Buffer, Device, Element};

        use crate::test_device;

        fn buf<T: Element>(dev: &Device, data: &[T]) -> Buffer {
            Buffer::from_slice(dev.allocator(), data).unwrap()
        }

        fn close(got: &[f32], want: &[f32], tol: f32) {
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!((g - w).abs() <= tol * w.abs().max(1.0), "element {i}: got {g}, want {w}");
            }
        }

        #[test]
        fn elementwise_add_with_a_symbolic_size() {
            let Some(dev) = test_device() else { return };
            let mut k = KernelBuilder::new();
            let n = k.var("n", 1, 1 << 24);
            let (a, b, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n), k.param(2, Scalar::F32, &n));
            let i = k.global(0, &n);
            k.store(&c.at(&i), &(a.at(&i).load() + b.at(&i).load()));
            let kernel = dev.compile(&k.finish().unwrap(), Some("add")).unwrap();
            for n in [1usize, 7, 1000, 4099] {
                let xs: Vec<f32> = (0..n).map(|x| x as f32 * 0.25).collect();
                let ys: Vec<f32> = (0..n).map(|x| 1.0 - x as f32).collect();
                let (a, b, c) = (buf(&dev, &xs), buf(&dev, &ys), buf(&dev, &vec![0f32; n]));
                kernel.launch(&[&a, &b, &c], &[n as i64]).unwrap();
                let want: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| x + y).collect();
                assert_eq!(c.to_vec::<f32>().unwrap(), want, "n = {n}");
            }
            // Variables out of bounds and short buffers are refused before the launch.
            let a = buf(&dev, &[0f32; 4]);
            assert!(kernel.launch(&[&a, &a, &a], &[0]).is_err());
            assert!(kernel.launch(&[&a, &a, &a], &[5]).is_err());
        }

        #[test]
        fn grouped_launch_with_views_at_offsets() {
            let Some(dev) = test_device() else { return };
            let mut k = KernelBuilder::new();
            let n = k.var("n", 4, 1 << 20);
            let (a, c) = (k.param(0, Scalar::I32, &n), k.param(1, Scalar::I32, &n));
            let g = k.special("gidx0", &n / 4);
            let l = k.special("lidx0", 4);
            let i = &g * 4 + &l;
            k.store(&c.at(&i), &(a.at(&i).load() * 3 + &l));
            let kernel = dev.compile(&k.finish().unwrap(), Some("scale")).unwrap();
            let xs: Vec<i32> = (0..40).collect();
            let (a, c) = (buf(&dev, &xs), buf(&dev, &[0i32; 40]));
            let (av, cv) = (a.view(5, 32).unwrap(), c.view(3, 32).unwrap());
            kernel.launch(&[&av, &cv], &[32]).unwrap();
            let out = c.to_vec::<i32>().unwrap();
            assert_eq!(&out[..3], &[0, 0, 0]);
            for j in 0..32 {
                assert_eq!(out[3 + j], (5 + j as i32) * 3 + (j as i32 % 4), "element {j}");
            }
            assert_eq!(&out[35..], &[0; 5]);
        }

        #[test]
        fn oversized_work_groups_are_refused_before_the_driver() {
            let Some(dev) = test_device() else { return };
            let mut k = KernelBuilder::new();
            let a = k.param(0, Scalar::F32, 1 << 16);
            let l = k.special("lidx0", 1 << 16);
            k.store(&a.at(&l), &Val::f32(1.0));
            let kernel = dev.compile(&k.finish().unwrap(), Some("wide_group")).unwrap();
            let b = dev.buffer(Scalar::F32, 1 << 16).unwrap();
            let r = kernel.launch(&[&b], &[]);
            assert!(matches!(&r, Err(Error::Launch(m)) if m.contains("work-group")), "{r:?}");
        }

        #[test]
        fn reduction_over_rows() {
            let Some(dev) = test_device() else { return };
            let mut k = KernelBuilder::new();
            let (rows, cols) = (k.var("rows", 1, 4096), k.var("cols", 1, 4096));
            let a = k.param(0, Scalar::F32, &(&rows * &cols));
            let out = k.param(1, Scalar::F32, &rows);
            let i = k.global(0, &rows);
            let j = k.range(&cols);
            let acc = k.acc(&Val::f32(0.0), &[&j]);
            let total = acc.update(&(acc.get() + a.at(&(&i * &cols + &j)).load()));
            k.store(&out.at(&i), &total);
            let kernel = dev.compile(&k.finish().unwrap(), Some("row_sum")).unwrap();
            let (r, c) = (37usize, 129usize);
            let xs: Vec<f32> = (0..r * c).map(|x| ((x * 7) % 13) as f32 - 6.0).collect();
            let (a, o) = (buf(&dev, &xs), buf(&dev, &vec![0f32; r]));
            // vals follow var_names order: cols, rows.
            kernel.launch(&[&a, &o], &[c as i64, r as i64]).unwrap();
            let want: Vec<f32> = (0..r).map(|i| xs[i * c..(i + 1) * c].iter().sum()).collect();
            close(&o.to_vec::<f32>().unwrap(), &want, 1e-5);
        }

        #[test]
        fn matmul_on_a_two_dimensional_grid() {
            let Some(dev) = test_device() else { return };
            let (m, n, kk) = (24usize, 20usize, 33usize);
            let mut k = KernelBuilder::new();
            let a = k.param(0, Scalar::F32, (m * kk) as i64);
            let b = k.param(1, Scalar::F32, (kk * n) as i64);
            let c = k.param(2, Scalar::F32, (m * n) as i64);
            let gi = k.special("gidx1", (m / 4) as i64);
            let li = k.special("lidx1", 4);
            let gj = k.special("gidx0", (n / 4) as i64);
            let lj = k.special("lidx0", 4);
            let (i, j) = (&gi * 4 + &li, &gj * 4 + &lj);
            let r = k.range(kk as i64);
            let acc = k.acc(&Val::f32(0.0), &[&r]);
            let prod = a.at(&(&i * kk as i64 + &r)).load().mul_acc(&b.at(&(&r * n as i64 + &j)).load(), &acc.get());
            let total = acc.update(&prod);
            k.store(&c.at(&(&i * n as i64 + &j)), &total);
            let kernel = dev.compile(&k.finish().unwrap(), Some("matmul")).unwrap();
            let av: Vec<f32> = (0..m * kk).map(|x| (x % 7) as f32 * 0.5 - 1.0).collect();
            let bv: Vec<f32> = (0..kk * n).map(|x| (x % 5) as f32 * 0.25).collect();
            let (ab, bb, cb) = (buf(&dev, &av), buf(&dev, &bv), buf(&dev, &vec![0f32; m * n]));
            kernel.launch(&[&ab, &bb, &cb], &[]).unwrap();
            let mut want = vec![0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    want[i * n + j] = (0..kk).map(|r| av[i * kk + r] * bv[r * n + j]).sum();
                }
            }
            close(&cb.to_vec::<f32>().unwrap(), &want, 1e-5);
        }

        #[test]
        fn gated_loads_and_stores() {
            let Some(dev) = test_device() else { return };
            let mut k = KernelBuilder::new();
            let (n, m) = (k.var("n", 1, 1 << 20), k.var("m", 0, 1 << 20));
            let a = k.param(0, Scalar::F32, &m);
            let c = k.param(1, Scalar::F32, &n);
            let d = k.param(2, Scalar::I32, &n);
            let i = k.global(0, &n);
            let inside = i.lt(&m);
            k.store(&c.at(&i), &a.at(&i).load_gated(&inside, -1.0));
            k.store_gated(&d.at(&i), &(&i * 2), &inside.not());
            let kernel = dev.compile(&k.finish().unwrap(), Some("gated")).unwrap();
            // `a` is exactly m long: a load past it would read outside the allocation.
            let (a, c, d) = (buf(&dev, &[1f32, 2.0, 3.0]), buf(&dev, &[0f32; 6]), buf(&dev, &[7i32; 6]));
            kernel.launch(&[&a, &c, &d], &[3, 6]).unwrap();
            assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, -1.0, -1.0, -1.0]);
            assert_eq!(d.to_vec::<i32>().unwrap(), vec![7, 7, 7, 6, 8, 10]);
        }

        #[test]
        fn vectors_native_and_odd_widths() {
            let Some(dev) = test_device() else { return };
            for w in [4u8, 3, 5, 16] {
                let mut k = KernelBuilder::new();
                let n = 8 * w as i64;
                let (a, c) = (k.param(0, Scalar::F32, n), k.param(1, Scalar::F32, n));
                let lt = k.param(2, Scalar::Bool, n);
                let i = k.global(0, 8);
                let base = &i * w as i64;
                let v = a.at_vec(&base, w).load();
                let scaled = &v * Val::f32(2.0).broadcast(w) + Val::f32(1.0).broadcast(w);
                let small = v.lt(Val::f32(5.0).broadcast(w));
                let picked = small.select(&scaled, Val::f32(0.0).broadcast(w));
                // Swap lanes 0 and 1 through GEP + VECTORIZE.
                let mut lanes: Vec<Val> = (0..w).map(|l| picked.gep(l)).collect();
                lanes.swap(0, 1);
                k.store(&c.at_vec(&base, w), &Val::vectorize(&lanes));
                k.store(&lt.at_vec(&base, w), &small);
                let kernel = dev.compile(&k.finish().unwrap(), Some(&format!("vec{w}"))).unwrap();
                let xs: Vec<f32> = (0..n).map(|x| x as f32 * 0.5).collect();
                let (ab, cb) = (buf(&dev, &xs), buf(&dev, &vec![0f32; n as usize]));
                let lb = dev.buffer(Scalar::Bool, n as usize).unwrap();
                kernel.launch(&[&ab, &cb, &lb], &[]).unwrap();
                let mut want: Vec<f32> = xs.iter().map(|&x| if x < 5.0 { x * 2.0 + 1.0 } else { 0.0 }).collect();
                for chunk in want.chunks_mut(w as usize) {
                    chunk.swap(0, 1);
                }
                assert_eq!(cb.to_vec::<f32>().unwrap(), want, "width {w}");
                let mut flags = vec![0u8; n as usize];
                lb.copyout(&mut flags).unwrap();
                let want_flags: Vec<u8> = xs.iter().map(|&x| (x < 5.0) as u8).collect();
                assert_eq!(flags, want_flags, "width {w}");
            }
        }

        /// Float vector math renders as one built-in call per op on native widths (lanes on
        /// odd ones) and computes what the scalar ops compute lane by lane.
        #[test]
        fn vector_math_uses_whole_vector_builtins() {
            for w in [4u8, 5] {
                let mut k = KernelBuilder::new();
                let n = 4 * w as i64;
                let (a, b) = (k.param(0, Scalar::F32, n), k.param(1, Scalar::F32, n));
                let outs: Vec<Val> = (0..5).map(|s| k.param(2 + s, Scalar::F32, n)).collect();
                let base = &k.global(0, 4) * w as i64;
                let (x, y) = (a.at_vec(&base, w).load(), b.at_vec(&base, w).load());
                let results = [x.mul_acc(&y, &x), x.max(&y), x.min(&y), x.abs().trunc(), (&x * 0.25).exp()];
                for (out, r) in outs.iter().zip(&results) {
                    k.store(&out.at_vec(&base, w), r);
                }
                let sink = k.finish().unwrap();
                let src = render(&sink);
                if w == 4 {
                    for call in
                        ["fma(val0, val1, val0)", "fmax(val0, val1)", "fmin(val0, val1)", "fabs(val0)", "trunc(alu"]
                    {
                        assert!(src.contains(call), "{call} in {src}");
                    }
                } else {
                    assert!(src.contains("fma((val0).v[4], (val1).v[4], (val0).v[4])"), "{src}");
                }
                let Some(dev) = test_device() else { return };
                let kernel = dev.compile(&sink, Some(&format!("vmath{w}"))).unwrap();
                let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.75 - 7.3).collect();
                let ys: Vec<f32> = (0..n).map(|i| 3.1 - i as f32 * 0.5).collect();
                let bufs: Vec<Buffer> = [&xs, &ys].into_iter().map(|v| buf(&dev, v)).collect();
                let out_bufs: Vec<Buffer> = (0..5).map(|_| buf(&dev, &vec![0f32; n as usize])).collect();
                let all: Vec<&Buffer> = bufs.iter().chain(&out_bufs).collect();
                kernel.launch(&all, &[]).unwrap();
                let got: Vec<Vec<f32>> = out_bufs.iter().map(|b| b.to_vec::<f32>().unwrap()).collect();
                let exact = [
                    xs.iter().zip(&ys).map(|(x, y)| x.mul_add(*y, *x)).collect::<Vec<_>>(),
                    xs.iter().zip(&ys).map(|(x, y)| x.max(*y)).collect(),
                    xs.iter().zip(&ys).map(|(x, y)| x.min(*y)).collect(),
                    xs.iter().map(|x| x.abs().trunc()).collect(),
                ];
                for (op, want) in exact.iter().enumerate() {
                    assert_eq!(&got[op], want, "op {op}, width {w}");
                }
                let exps: Vec<f32> = xs.iter().map(|x| (x * 0.25).exp()).collect();
                close(&got[4], &exps, 1e-6);
            }
        }

        #[test]
        fn casts_bitcasts_and_math() {
            let Some(dev) = test_device() else { return };
            let mut k = KernelBuilder::new();
            let a = k.param(0, Scalar::F32, 6);
            let ints = k.param(1, Scalar::I8, 6);
            let bits = k.param(2, Scalar::U32, 6);
            let math = k.param(3, Scalar::F32, 6);
            let wide = k.param(4, Scalar::F64, 6);
            let i = k.global(0, 6);
            let x = a.at(&i).load();
            k.store(&ints.at(&i), &x.cast(DType::Scalar(Scalar::I8)));
            k.store(&bits.at(&i), &x.bitcast(DType::Scalar(Scalar::U32)));
            let y = x.abs().max(0.5);
            k.store(&math.at(&i), &(y.sqrt() + y.log2() + y.exp2().min(1e6) + y.sin() * y.cos() + y.pow(1.5)));
            k.store(&wide.at(&i), &(x.cast(DType::F64) * Val::constant(DType::F64, 0.1)));
            let kernel = dev.compile(&k.finish().unwrap(), Some("casts")).unwrap();
            let xs = [1.7f32, -2.9, 300.0, -1e9, f32::NAN, 0.25];
            let ab = buf(&dev, &xs);
            let (ib, bb, mb, wb) =
                (buf(&dev, &[0i8; 6]), buf(&dev, &[0u32; 6]), buf(&dev, &[0f32; 6]), buf(&dev, &[0f64; 6]));
            kernel.launch(&[&ab, &ib, &bb, &mb, &wb], &[]).unwrap();
            // Saturating float -> int, NaN -> 0 (Rust `as` semantics).
            let want_ints: Vec<i8> = xs.iter().map(|&x| x as i8).collect();
            assert_eq!(ib.to_vec::<i8>().unwrap(), want_ints);
            let want_bits: Vec<u32> = xs.iter().map(|x| x.to_bits()).collect();
            assert_eq!(bb.to_vec::<u32>().unwrap(), want_bits);
            let want_math: Vec<f32> = xs
                .iter()
                .map(|&x| {
                    let y = x.abs().max(0.5);
                    y.sqrt() + y.log2() + y.exp2().min(1e6) + y.sin() * y.cos() + y.powf(1.5)
                })
                .collect();
            close(&mb.to_vec::<f32>().unwrap(), &want_math, 1e-5);
            let got = wb.to_vec::<f64>().unwrap();
            for (g, &x) in got.iter().zip(&xs) {
                let w = x as f64 * 0.1;
                assert!(g == &w || (g.is_nan() && w.is_nan()), "{g} vs {w}");
            }
        }

        #[test]
        fn half_and_bfloat_are_computed_in_f32() {
            let Some(dev) = test_device() else { return };
            for s in [Scalar::F16, Scalar::BF16] {
                let mut k = KernelBuilder::new();
                let (a, c) = (k.param(0, s, 4), k.param(1, s, 4));
                let i = k.global(0, 4);
                let x = a.at(&i).load();
                k.store(&c.at(&i), &(&x * &x + Val::constant(DType::Scalar(s), 0.5)));
                let kernel = dev.compile(&k.finish().unwrap(), Some("halfs")).unwrap();
                let xs = [1.0f64, -2.5, 3.25, 0.125];
                let bits = |v: f64| if s == Scalar::F16 { f16_bits(v) } else { bf16_bits(v) };
                let input: Vec<u16> = xs.iter().map(|&v| bits(v)).collect();
                let a = Buffer::from_slice(dev.allocator(), &input).unwrap().reinterpret(s).unwrap();
                let c = dev.buffer(s, 4).unwrap();
                kernel.launch(&[&a, &c], &[]).unwrap();
                let mut out = vec![0u8; 8];
                c.copyout(&mut out).unwrap();
                let got: Vec<u16> = out.chunks(2).map(|b| u16::from_ne_bytes([b[0], b[1]])).collect();
                let want: Vec<u16> = xs.iter().map(|&v| bits(v * v + 0.5)).collect();
                assert_eq!(got, want, "{s}");
            }
        }
    }
}
