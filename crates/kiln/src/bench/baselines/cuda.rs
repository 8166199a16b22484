//! The baselines of a CUDA device, measured in the same run as kiln's figure: what the GPU
//! itself does with the same work, instead of the host loops the other devices compare to.
//! - add and sum: a device-to-device copy moving the same bytes (read + written), through
//!   the allocator's device copy (`cuMemcpyDtoDAsync`, then a synchronize, as every kiln
//!   launch here waits for its kernel; [`super::device_copy`]): the bandwidth a streaming
//!   kernel can reach.
//! - matmul: cuBLAS `sgemm` on the same matrices when libcublas loads; without it the host
//!   baseline stays (the table names which one it is).
//!
//! Each baseline is verified before it is timed, like kiln's figures.

use crate::bench::entries::{Bench, matmul_inputs};
use crate::bench::report::{BenchResult, Stats};
use crate::bench::{kiln_err, per_sec, time_reps, wrong};
use crate::error::CliError;

impl Bench {
    /// `r` with its baseline replaced by the CUDA device's own, where one applies.
    pub(in crate::bench) fn cuda_baseline(&self, r: BenchResult) -> Result<BenchResult, CliError> {
        if self.device.spec().base_type() != kiln_cuda::BACKEND {
            return Ok(r);
        }
        match r.name {
            // c = a + b reads 8 and writes 4 bytes per element; a sum reads 4.
            "add_f32_16m" => self.copy_baseline(r, 12 << 24),
            "sum_f32_16m" => self.copy_baseline(r, 4 << 24),
            "matmul_f32_1024" => self.sgemm_baseline(r, 1024),
            "matmul_f32_4096" => self.sgemm_baseline(r, 4096),
            _ => Ok(r),
        }
    }

    /// cuBLAS sgemm on n×n matrices, checked exactly against the host product.
    fn sgemm_baseline(&self, r: BenchResult, n: usize) -> Result<BenchResult, CliError> {
        let sgemm = match kiln_cuda::blas::Sgemm::new(self.device.spec()) {
            Ok(s) => s,
            Err(kiln_device::Error::Unavailable(_)) => return Ok(r),
            Err(e) => return Err(kiln_err("opening cuBLAS", e)),
        };
        // Exact in f32 in any summation order: cuBLAS must agree with the host product exactly.
        let (a, b) = matmul_inputs(n);
        let (ba, bb, bc) = (self.upload(&a)?, self.upload(&b)?, self.zeros(n * n)?);
        let run = || sgemm.row_major(&ba, &bb, &bc, n).map_err(|e| kiln_err("cuBLAS sgemm", e));
        run()?;
        let mut reference = vec![0f32; n * n];
        super::matmul(&a, &b, &mut reference, n);
        if self.read(&bc)? != reference {
            return Err(wrong(r.name, "cuBLAS sgemm disagrees with the host product".into()));
        }
        let t = time_reps(self.reps, run)?;
        Ok(BenchResult {
            baseline: Some(Stats::of(per_sec(&t, 2.0 * (n * n * n) as f64 / 1e9))?),
            baseline_name: "cuBLAS sgemm".into(),
            ..r
        })
    }
}
