//! Benchmark kernels shaped for GPUs: many work groups of many items, coalesced loads, and
//! work-group local memory with barriers. The CPU backend has no work groups (it refuses
//! DEFINE_LOCAL and BARRIER), and PoCL, OpenCL on the CPU, runs them slower than the
//! CPU-shaped kernels (the group sum: ~0.8 GB/s against 5-8 GB/s for the partial sums, on a
//! loaded 2-core machine), so the bench uses them on CUDA only; the tests run them on OpenCL.

use std::sync::Arc;

use kiln_device::Kernel;
use kiln_device::kiln_ir::rewrite::RewriteRules;
use kiln_device::kiln_ir::{IrError, KernelBuilder, Op, Scalar, UOp, parse_kernel};

use super::Bench;
use crate::error::CliError;

/// Work items per group in [`sum_groups_f32`].
pub const GROUP: usize = 256;
/// Elements each item adds before the group's tree reduction.
pub const PER_ITEM: usize = 16;

/// `out[g] = sum(a[g·4096 .. (g+1)·4096])` for `n / 4096` groups of [`GROUP`] items: the
/// shipped `examples/kernels/group_sum.kiln` (which the conformance suite also runs) with its
/// variables bound as constants, `groups = n / 4096` and `per =` [`PER_ITEM`], so the GPU
/// compiler sees fixed trip counts.
///
/// Item `l` of group `g` first adds `a[g·4096 + k·256 + l]` for `k` in 0..16: in every step
/// the group's items read 256 consecutive floats (coalesced). Then the 256 partial sums are
/// reduced in local memory, halving eight times with a barrier after each step, and item 0
/// writes the group's sum. Two launches sum 16M floats: n = 2^24 gives 4096 partial sums,
/// and the same kernel with n = 4096 sums those.
///
/// # Errors
/// [`IrError`] when `n` is not a positive multiple of 4096 below 2^31.
pub fn sum_groups_f32(n: usize) -> Result<Arc<UOp>, IrError> {
    let span = GROUP * PER_ITEM;
    if n == 0 || !n.is_multiple_of(span) || n > i32::MAX as usize {
        return Err(IrError::Invalid(format!(
            "sum_groups_f32 needs a positive multiple of {span} below 2^31, got {n}"
        )));
    }
    let sink = parse_kernel(include_str!("../../../../../examples/kernels/group_sum.kiln"))?;
    let (groups, per) = ((n / span) as i64, PER_ITEM as i64);
    let bind = RewriteRules::new().with(move |u| match (u.op(), u.arg_name()) {
        (Op::DefineVar, Some("groups")) => Some(UOp::const_int(u.dtype(), groups)),
        (Op::DefineVar, Some("per")) => Some(UOp::const_int(u.dtype(), per)),
        _ => None,
    });
    Ok(bind.rewrite(&sink))
}

/// `c[i] = a[i] + b[i]` for `n` elements: one work item per element, so the items of a warp
/// touch consecutive floats (coalesced), in a direct launch (`idx0`) whose block the backend
/// picks. (kiln's CUDA C splits vector accesses into scalar ones, since a buffer window need
/// not be 16-byte aligned, so wider items would only stride the warp's accesses.)
///
/// # Errors
/// [`IrError`] when `n` is 0 or not below 2^31.
pub fn add_f32(n: usize) -> Result<Arc<UOp>, IrError> {
    if n == 0 || n > i32::MAX as usize {
        return Err(IrError::Invalid(format!("the GPU add needs 1 to 2^31 - 1 elements, got {n}")));
    }
    let mut k = KernelBuilder::new();
    let (a, b, c) = (k.param(0, Scalar::F32, n), k.param(1, Scalar::F32, n), k.param(2, Scalar::F32, n));
    let i = k.special("idx0", n as i64);
    k.store(&c.at(&i), &(a.at(&i).load() + b.at(&i).load()));
    k.finish()
}

impl Bench {
    /// Whether the device runs the GPU-shaped kernels of this module (see the module docs).
    pub(super) fn gpu_shaped(&self) -> bool {
        self.device.spec().base_type() == "CUDA"
    }

    /// The two kernels of `sum_f32_16m` on a GPU (the group sum over `n`, then over its
    /// partial sums) and the number of partial sums; `None` on devices that keep the
    /// CPU-shaped partial sums.
    pub(super) fn gpu_sum_kernels(&self, n: usize) -> Result<Option<(Kernel, Kernel, usize)>, CliError> {
        if !self.gpu_shaped() {
            return Ok(None);
        }
        let partials = n / (GROUP * PER_ITEM);
        let first = self.compile(sum_groups_f32(n), "sum_groups_f32")?;
        Ok(Some((first, self.compile(sum_groups_f32(partials), "sum_groups_finish_f32")?, partials)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_device::Buffer;

    /// Two launches of the group sum add 2^20 floats exactly (small integers: exact in any
    /// order) on OpenCL when present; the CPU refuses the kernel with a typed error; sizes
    /// that do not tile are refused when the kernel is built.
    #[test]
    fn two_launches_sum_exactly_where_there_are_work_groups() {
        crate::session::register_backends();
        assert!(sum_groups_f32(4095).is_err() && sum_groups_f32(0).is_err());
        let n = 1usize << 24;
        let first = sum_groups_f32(n).unwrap();
        let cpu = kiln_device::open_device("CPU").unwrap();
        assert!(cpu.compile(&first, Some("sum_groups")).is_err(), "the CPU has no work groups");
        let dev = match kiln_device::open_device("OPENCL:0") {
            Ok(d) => d,
            Err(e) if !kiln_device::required("opencl") => {
                return println!("skipped OPENCL:0: {e}");
            }
            Err(e) => panic!("OPENCL:0: {e}"),
        };
        let a: Vec<f32> = (0..n).map(|i| (i % 13) as f32 - 6.0).collect();
        let chunks = n / (GROUP * PER_ITEM);
        let buf = |v: &[f32]| Buffer::from_slice(dev.allocator(), v).unwrap();
        let (ba, bp, bo) = (buf(&a), buf(&vec![f32::NAN; chunks]), buf(&[f32::NAN]));
        dev.compile(&first, Some("sum_groups")).unwrap().launch(&[&ba, &bp], &[]).unwrap();
        let second = dev.compile(&sum_groups_f32(chunks).unwrap(), Some("sum_groups_finish")).unwrap();
        second.launch(&[&bp, &bo], &[]).unwrap();
        let partials: Vec<f32> = a.chunks(GROUP * PER_ITEM).map(|c| c.iter().sum()).collect();
        assert_eq!(bp.to_vec::<f32>().unwrap(), partials);
        assert_eq!(bo.to_vec::<f32>().unwrap(), vec![partials.iter().sum::<f32>()]);
    }

    /// The GPU add is exact on OpenCL when present (and wherever `idx0` runs: the CPU too);
    /// sizes outside its indices are refused when the kernel is built.
    #[test]
    fn the_gpu_add_is_exact() {
        crate::session::register_backends();
        assert!(add_f32(0).is_err() && add_f32(1 << 31).is_err());
        let n = 1usize << 16;
        let a: Vec<f32> = (0..n).map(|i| (i % 13) as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.5).collect();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        for (name, backend) in [("CPU", "cpu"), ("OPENCL:0", "opencl")] {
            let dev = match kiln_device::open_device(name) {
                Ok(d) => d,
                Err(e) if !kiln_device::required(backend) => {
                    println!("skipped {name}: {e}");
                    continue;
                }
                Err(e) => panic!("{name}: {e}"),
            };
            let buf = |v: &[f32]| Buffer::from_slice(dev.allocator(), v).unwrap();
            let (ba, bb, bc) = (buf(&a), buf(&b), buf(&vec![f32::NAN; n]));
            dev.compile(&add_f32(n).unwrap(), Some("add_gpu")).unwrap().launch(&[&ba, &bb, &bc], &[]).unwrap();
            assert_eq!(bc.to_vec::<f32>().unwrap(), want, "on {name}");
        }
    }

    /// The group sum and the add compile to an sm_90 cubin (H100) where NVRTC is installed.
    #[cfg(feature = "cuda")]
    #[test]
    fn group_sum_compiles_for_sm_90() {
        use kiln_cuda::{Arch, CudaCompiler, Output, cuda_renderer};
        use kiln_device::Renderer as _;
        let compiler = match CudaCompiler::new(Arch { major: 9, minor: 0 }, Output::Cubin) {
            Ok(c) => c,
            Err(e) => return println!("skipped: {e}"),
        };
        let renderer = cuda_renderer(kiln_device::kiln_ir::DeviceSpec::new(kiln_cuda::BACKEND, 0));
        let spec = renderer.render(&sum_groups_f32(1 << 24).unwrap(), Some("sum_groups")).unwrap();
        assert!(spec.src.contains("__shared__ float") && spec.src.contains("__syncthreads()"), "{}", spec.src);
        let add = renderer.render(&add_f32(1 << 24).unwrap(), Some("add_gpu")).unwrap();
        for spec in [spec, add] {
            let (ptx, cubin) = compiler.ptx_and_cubin(&spec.src, &spec.name).unwrap();
            assert!(!ptx.is_empty() && !cubin.is_empty());
        }
    }
}
