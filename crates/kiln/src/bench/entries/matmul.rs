//! The matmul entry, against OpenBLAS (in a process of its own) or the matrixmultiply crate.

use std::borrow::Cow;

use kiln_device::kiln_ir::DeviceSpec;

use super::{Bench, BenchArgs};
use crate::bench::baselines::{self, MATMUL_N, matmul_inputs, openblas};
use crate::bench::report::{BenchResult, Stats};
use crate::bench::{kernels, kiln_err, per_sec, time_reps, wrong};
use crate::error::CliError;

/// The side of the GPU matmul entry (GPU devices only; see [`super::Bench::applies`]); the CPU's is
/// [`MATMUL_N`].
pub(in crate::bench) const GPU_MATMUL_N: usize = 4096;

/// The host product of `a` and `b` (n×n), after checking that `c` equals it exactly. The inputs
/// are [`matmul_inputs`]: every product and partial sum is exact in f32, so any summation order
/// must agree exactly.
fn check_product(entry: &str, c: &[f32], a: &[f32], b: &[f32], n: usize) -> Result<Vec<f32>, CliError> {
    let mut reference = vec![0f32; n * n];
    baselines::matmul(a, b, &mut reference, n);
    match (0..n * n).find(|&i| c.get(i) != reference.get(i)) {
        Some(i) => {
            Err(wrong(entry, format!("C[{}, {}] = {:?} but the reference is {}", i / n, i % n, c.get(i), reference[i])))
        }
        None => Ok(reference),
    }
}

impl Bench {
    /// `matmul_f32_4096`: the GPU-shaped matmul ([`super::gpu::matmul_f32`]), verified
    /// exactly against the host product; its baseline is the device's own (cuBLAS on CUDA).
    pub(super) fn matmul_gpu(&self) -> Result<BenchResult, CliError> {
        let n = GPU_MATMUL_N;
        let (a, b) = matmul_inputs(n);
        let mm = self.compile(super::gpu::matmul_f32(n), "matmul_gpu_f32")?;
        let (ba, bb, bc) = (self.upload(&a)?, self.upload(&b)?, self.zeros(n * n)?);
        let run = || self.launch(&mm, &[&ba, &bb, &bc]);
        run()?;
        check_product("matmul_f32_4096", &self.read(&bc)?, &a, &b, n)?;
        let t = time_reps(self.reps, run)?;
        Ok(BenchResult {
            name: "matmul_f32_4096",
            unit: "GFLOP/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, 2.0 * (n * n * n) as f64 / 1e9))?,
            baseline: None,
            baseline_name: "".into(),
        })
    }

    pub(super) fn matmul(&self, args: &BenchArgs) -> Result<BenchResult, CliError> {
        let wanted = openblas::Wanted::from_env()
            .map_err(|e| kiln_err("choosing the matmul baseline", kiln_device::Error::Invalid(e)))?;
        let n = MATMUL_N;
        let (a, b) = matmul_inputs(n);
        let tile = kernels::MatmulTile::for_width(self.width());
        let pack = self.compile(kernels::pack_b_f32(self.axis(), n, tile), "pack_b_f32")?;
        // The CPU backend splits the strips over its cores; elsewhere, one tile per item.
        let sink = if *self.device.spec() == DeviceSpec::new("CPU", 0) {
            kernels::matmul_f32(self.axis(), n, tile)
        } else {
            kernels::matmul_tile_f32(n, tile)
        };
        let mm = self.compile(sink, "matmul_f32")?;
        let (ba, bb, bp, bc) = (self.upload(&a)?, self.upload(&b)?, self.zeros(n * n)?, self.zeros(n * n)?);
        let run = || -> Result<(), CliError> {
            self.launch(&pack, &[&bb, &bp])?;
            self.launch(&mm, &[&ba, &bp, &bc])
        };
        run()?;
        let reference = check_product("matmul_f32_1024", &self.read(&bc)?, &a, &b, n)?;
        let flops = 2.0 * (n * n * n) as f64 / 1e9;
        let t = time_reps(self.reps, run)?;
        // Every baseline runs after kiln's reps: OpenBLAS in a process of its own, so that its
        // threads never share this one with kiln's workers; matrixmultiply here.
        let from_child = match wanted {
            openblas::Wanted::MatrixMultiply => None,
            openblas::Wanted::Auto | openblas::Wanted::OpenBlas => {
                match baselines::openblas_in_child(args, &self.device)? {
                    openblas::ChildReport::Timed { name, seconds } => Some((name, seconds)),
                    openblas::ChildReport::Unavailable { why } if wanted == openblas::Wanted::OpenBlas => {
                        return Err(kiln_err(
                            "choosing the matmul baseline",
                            kiln_device::Error::Invalid(format!("{}=openblas: {why}", openblas::BASELINE_ENV)),
                        ));
                    }
                    openblas::ChildReport::Unavailable { .. } => None,
                }
            }
        };
        let (name, base): (Cow<'static, str>, Vec<f64>) = match from_child {
            Some((name, seconds)) => (name.into(), seconds),
            None => {
                let mut out = vec![f32::NAN; n * n];
                let base = time_reps(self.reps, || {
                    baselines::matmul(&a, &b, &mut out, n);
                    Ok(())
                })?;
                if let Some(i) = (0..n * n).find(|&i| out[i] != reference[i]) {
                    return Err(wrong(
                        "matmul_f32_1024",
                        format!(
                            "the baseline gives C[{}, {}] = {}, the reference {}",
                            i / n,
                            i % n,
                            out[i],
                            reference[i]
                        ),
                    ));
                }
                (openblas::MATRIXMULTIPLY_NAME.into(), base)
            }
        };
        Ok(BenchResult {
            name: "matmul_f32_1024",
            unit: "GFLOP/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, flops))?,
            baseline: Some(Stats::of(per_sec(&base, flops))?),
            baseline_name: name,
        })
    }
}
