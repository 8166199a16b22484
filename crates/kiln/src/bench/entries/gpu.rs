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

/// Side of the square output tile one work group of [`matmul_f32`] computes.
pub const MM_TILE: usize = 128;
/// Depth of the A and B tiles staged in local memory per step.
const MM_DEPTH: usize = 8;
/// Work items per group side: 16×16 items, each computing 8×8 outputs.
const MM_ITEMS: usize = 16;
const MM_PER: usize = MM_TILE / MM_ITEMS;

/// `C = A·B` for row-major n×n f32 matrices, shaped for a GPU: each 256-item group computes a
/// 128×128 tile of C; per step of depth 8 its items copy a 128×8 tile of A (transposed) and an
/// 8×128 tile of B into local memory, wait at a barrier, then each item accumulates its 8×8
/// outputs in registers from 8 + 8 local values per depth (64 fused multiply-adds), and waits
/// again before the next step overwrites the tiles. Item (x, y) owns rows `y + 16i` and
/// columns `x + 16j` of the tile, so a warp's local reads hit distinct banks or broadcast and
/// its global reads and writes of B and C are consecutive.
///
/// The kernel is written as kiln text (64 named accumulators), generated here and parsed.
///
/// # Errors
/// [`IrError`] when `n` is not a positive multiple of 128 up to 2^15.
pub fn matmul_f32(n: usize) -> Result<Arc<UOp>, IrError> {
    if n == 0 || !n.is_multiple_of(MM_TILE) || n > 1 << 15 {
        return Err(IrError::Invalid(format!(
            "the GPU matmul needs a positive multiple of {MM_TILE} up to 32768, got {n}"
        )));
    }
    let (t, d, items, per) = (MM_TILE, MM_DEPTH, MM_ITEMS, MM_PER);
    let loads = t * d / (items * items); // elements of each tile one item copies
    let mut k = String::from("# kiln kernel v1\n");
    let mut line = |s: String| {
        k.push_str(&s);
        k.push('\n');
    };
    line(format!("%nn = CONST i32 {}", n * n));
    line(format!("%n = CONST i32 {n}"));
    for (slot, name) in ["a", "b", "c"].iter().enumerate() {
        line(format!("%{name} = PARAM ptr<f32> {slot} (%nn)"));
    }
    line(format!("%groups = CONST i32 {}", n / t));
    line(format!("%items = CONST i32 {items}"));
    line("%bx = SPECIAL i32 \"gidx0\" (%groups)".into());
    line("%by = SPECIAL i32 \"gidx1\" (%groups)".into());
    line("%tx = SPECIAL i32 \"lidx0\" (%items)".into());
    line("%ty = SPECIAL i32 \"lidx1\" (%items)".into());
    line(format!("%tsize = CONST i32 {}", t * d));
    line("%as = DEFINE_LOCAL lptr<f32> 0 (%tsize)".into());
    line("%bs = DEFINE_LOCAL lptr<f32> 1 (%tsize)".into());
    line(format!("%ctile = CONST i32 {t}"));
    line(format!("%cdepth = CONST i32 {d}"));
    line(format!("%csteps = CONST i32 {}", n / d));
    line("%row0 = MUL i32 (%by, %ctile)".into());
    line("%col0 = MUL i32 (%bx, %ctile)".into());
    line("%ty16 = MUL i32 (%ty, %items)".into());
    line("%tid = ADD i32 (%ty16, %tx)".into());
    line("%zero = CONST f32 0.0".into());
    // The depth loop over K in steps of `d`.
    line("%kt = RANGE i32 0 (%csteps)".into());
    line("%k0 = MUL i32 (%kt, %cdepth)".into());
    let mut stores = Vec::new();
    for r in 0..loads {
        // A: element e of the 128×8 tile is row e / 8, depth e % 8 (8 consecutive floats of
        // a row per 8 items); stored transposed, as [depth][row].
        line(format!("%ae{r}c = CONST i32 {}", r * items * items));
        line(format!("%ae{r} = ADD i32 (%tid, %ae{r}c)"));
        line(format!("%am{r} = IDIV i32 (%ae{r}, %cdepth)"));
        line(format!("%ak{r} = MOD i32 (%ae{r}, %cdepth)"));
        line(format!("%ar{r} = ADD i32 (%row0, %am{r})"));
        line(format!("%arn{r} = MUL i32 (%ar{r}, %n)"));
        line(format!("%ac{r} = ADD i32 (%k0, %ak{r})"));
        line(format!("%ai{r} = ADD i32 (%arn{r}, %ac{r})"));
        line(format!("%ap{r} = INDEX ptr<f32> (%a, %ai{r})"));
        line(format!("%av{r} = LOAD f32 (%ap{r})"));
        line(format!("%akt{r} = MUL i32 (%ak{r}, %ctile)"));
        line(format!("%al{r} = ADD i32 (%akt{r}, %am{r})"));
        line(format!("%alp{r} = INDEX lptr<f32> (%as, %al{r})"));
        line(format!("%ast{r} = STORE void (%alp{r}, %av{r})"));
        // B: element e of the 8×128 tile is depth e / 128, column e % 128 (consecutive).
        line(format!("%bk{r} = IDIV i32 (%ae{r}, %ctile)"));
        line(format!("%bc{r} = MOD i32 (%ae{r}, %ctile)"));
        line(format!("%bkr{r} = ADD i32 (%k0, %bk{r})"));
        line(format!("%bkn{r} = MUL i32 (%bkr{r}, %n)"));
        line(format!("%bcc{r} = ADD i32 (%col0, %bc{r})"));
        line(format!("%bi{r} = ADD i32 (%bkn{r}, %bcc{r})"));
        line(format!("%bp{r} = INDEX ptr<f32> (%b, %bi{r})"));
        line(format!("%bv{r} = LOAD f32 (%bp{r})"));
        line(format!("%blp{r} = INDEX lptr<f32> (%bs, %ae{r})"));
        line(format!("%bst{r} = STORE void (%blp{r}, %bv{r})"));
        stores.push(format!("%ast{r}"));
        stores.push(format!("%bst{r}"));
    }
    line(format!("%bar1 = BARRIER void ({})", stores.join(", ")));
    line("%as1 = AFTER lptr<f32> (%as, %bar1)".into());
    line("%bs1 = AFTER lptr<f32> (%bs, %bar1)".into());
    // The inner loop over the staged depth.
    line("%kk = RANGE i32 1 (%cdepth)".into());
    line("%kkt = MUL i32 (%kk, %ctile)".into());
    for i in 0..per {
        line(format!("%ro{i}c = CONST i32 {}", i * items));
        line(format!("%ro{i} = ADD i32 (%ty, %ro{i}c)"));
        line(format!("%ali{i} = ADD i32 (%kkt, %ro{i})"));
        line(format!("%alq{i} = INDEX lptr<f32> (%as1, %ali{i})"));
        line(format!("%x{i} = LOAD f32 (%alq{i})"));
        line(format!("%co{i} = ADD i32 (%tx, %ro{i}c)"));
        line(format!("%bli{i} = ADD i32 (%kkt, %co{i})"));
        line(format!("%blq{i} = INDEX lptr<f32> (%bs1, %bli{i})"));
        line(format!("%y{i} = LOAD f32 (%blq{i})"));
    }
    let mut inner = Vec::new();
    for i in 0..per {
        for j in 0..per {
            let id = i * per + j;
            line(format!("%acc{id} = DEFINE_ACC f32 {id} (%zero, %kt, %kk)"));
            line(format!("%fma{id} = MULACC f32 (%x{i}, %y{j}, %acc{id})"));
            line(format!("%upd{id} = ASSIGN f32 (%acc{id}, %fma{id})"));
            line(format!("%in{id} = END f32 (%kk, %upd{id})"));
            inner.push(format!("%in{id}"));
        }
    }
    // Every item has read the tiles before the next step overwrites them.
    line(format!("%bar2 = BARRIER void ({})", inner.join(", ")));
    let mut effects = Vec::new();
    for i in 0..per {
        line(format!("%crow{i} = ADD i32 (%row0, %ro{i})"));
        line(format!("%crn{i} = MUL i32 (%crow{i}, %n)"));
        for j in 0..per {
            let id = i * per + j;
            line(format!("%out{id} = END f32 (%kt, %in{id}, %bar2)"));
            line(format!("%ccol{id} = ADD i32 (%col0, %co{j})"));
            line(format!("%ci{id} = ADD i32 (%crn{i}, %ccol{id})"));
            line(format!("%cp{id} = INDEX ptr<f32> (%c, %ci{id})"));
            line(format!("%cst{id} = STORE void (%cp{id}, %out{id})"));
            effects.push(format!("%cst{id}"));
        }
    }
    line(format!("SINK void ({})", effects.join(", ")));
    parse_kernel(&k)
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
        kiln_backends::register_all();
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
        kiln_backends::register_all();
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

    /// The GPU matmul computes the exact product on OpenCL when present (inputs whose every
    /// partial sum is exact in f32); the CPU refuses it (no work groups); sizes that do not
    /// tile are refused when the kernel is built.
    #[test]
    fn the_gpu_matmul_is_exact_where_there_are_work_groups() {
        kiln_backends::register_all();
        assert!(matmul_f32(0).is_err() && matmul_f32(100).is_err() && matmul_f32(1 << 16).is_err());
        let n = 256;
        let sink = matmul_f32(n).unwrap();
        let cpu = kiln_device::open_device("CPU").unwrap();
        assert!(cpu.compile(&sink, Some("matmul_gpu")).is_err(), "the CPU has no work groups");
        let dev = match kiln_device::open_device("OPENCL:0") {
            Ok(d) => d,
            Err(e) if !kiln_device::required("opencl") => return println!("skipped OPENCL:0: {e}"),
            Err(e) => panic!("OPENCL:0: {e}"),
        };
        let (a, b) = crate::bench::baselines::matmul_inputs(n);
        let mut want = vec![0f32; n * n];
        crate::bench::baselines::matmul(&a, &b, &mut want, n);
        let buf = |v: &[f32]| Buffer::from_slice(dev.allocator(), v).unwrap();
        let (ba, bb, bc) = (buf(&a), buf(&b), buf(&vec![f32::NAN; n * n]));
        dev.compile(&sink, Some("matmul_gpu")).unwrap().launch(&[&ba, &bb, &bc], &[]).unwrap();
        assert!(bc.to_vec::<f32>().unwrap() == want, "the GPU matmul disagrees with the host product");
    }

    /// The group sum, the add and the matmul compile to an sm_90 cubin (H100) where this build
    /// has the CUDA target and NVRTC is installed.
    #[test]
    fn group_sum_compiles_for_sm_90() {
        let Some(cuda) = kiln_backends::targets().find(|t| t.name == "cuda") else {
            return println!("skipped: this build has no CUDA target");
        };
        let kernels = [
            (sum_groups_f32(1 << 24).unwrap(), "sum_groups"),
            (add_f32(1 << 24).unwrap(), "add_gpu"),
            (matmul_f32(4096).unwrap(), "matmul_gpu"),
        ];
        for (sink, name) in kernels {
            let (spec, cubin) = match (cuda.compile)("sm_90", &sink, name, Some("cubin")) {
                Err(kiln_device::Error::CompilerMissing(e)) => return println!("skipped: {e}"),
                r => r.unwrap(),
            };
            if name == "sum_groups" {
                assert!(spec.src.contains("__shared__ float") && spec.src.contains("__syncthreads()"), "{}", spec.src);
            }
            assert!(cubin.is_some_and(|c| !c.is_empty()));
        }
    }
}
