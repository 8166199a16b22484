//! The device-copy baseline of the GPU backends (CUDA, WebGPU): a device-to-device copy of
//! the same bytes a streaming entry moves, through the allocator's device copy (which waits
//! for it, as every kiln launch here waits for its kernel), verified before it is timed.

use crate::bench::entries::Bench;
use crate::bench::report::{BenchResult, Stats};
use crate::bench::{kiln_err, per_sec, time_reps, wrong};
use crate::error::CliError;

impl Bench {
    /// A copy of `traffic / 2` bytes: `traffic` bytes read and written.
    pub(in crate::bench) fn copy_baseline(&self, r: BenchResult, traffic: usize) -> Result<BenchResult, CliError> {
        let n = traffic / 8;
        let src: Vec<f32> = (0..n).map(|i| (i % 1021) as f32).collect();
        let (from, to) = (self.upload(&src)?, self.zeros(n)?);
        let copy = || to.copy_from(&from).map_err(|e| kiln_err("device copy baseline", e));
        copy()?;
        if self.read(&to)? != src {
            return Err(wrong(r.name, "the device copy baseline did not copy its input".into()));
        }
        let t = time_reps(self.reps, copy)?;
        Ok(BenchResult {
            baseline: Some(Stats::of(per_sec(&t, traffic as f64 / 1e9))?),
            baseline_name: "device copy, same bytes".into(),
            ..r
        })
    }
}
