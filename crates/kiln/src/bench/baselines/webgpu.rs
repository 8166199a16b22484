//! The baselines of a WebGPU device, measured in the same run with wgpu itself:
//! - add and sum: `copy_buffer_to_buffer` moving the same bytes (the allocator's device
//!   copy, waited for): the bandwidth a streaming kernel can reach on this adapter;
//! - queue round trip: one empty compute dispatch submitted and waited for, on a wgpu
//!   device of its own: the round trip wgpu and the driver cost without kiln.
//!
//! On lavapipe (Mesa's software Vulkan) these measure the runtime's overhead on the CPU,
//! not a GPU.

use crate::bench::entries::Bench;
use crate::bench::report::{BenchResult, Stats};
use crate::bench::{kiln_err, scaled, time_reps};
use crate::error::CliError;

impl Bench {
    /// `r` with its baseline replaced by the WebGPU device's own, where one applies.
    pub(in crate::bench) fn webgpu_baseline(&self, r: BenchResult) -> Result<BenchResult, CliError> {
        if self.device.spec().base_type() != kiln_webgpu::BACKEND {
            return Ok(r);
        }
        match r.name {
            // c = a + b reads 8 and writes 4 bytes per element; a sum reads 4.
            "add_f32_16m" => self.copy_baseline(r, 12 << 24),
            "sum_f32_16m" => self.copy_baseline(r, 4 << 24),
            "queue_roundtrip" => self.empty_dispatch_baseline(r),
            _ => Ok(r),
        }
    }

    /// wgpu's empty dispatch plus wait, in µs.
    fn empty_dispatch_baseline(&self, r: BenchResult) -> Result<BenchResult, CliError> {
        let empty = kiln_webgpu::EmptyDispatch::new(self.device.spec())
            .map_err(|e| kiln_err("opening wgpu for the round-trip baseline", e))?;
        let run = || empty.run().map_err(|e| kiln_err("the empty dispatch baseline", e));
        for _ in 0..10 {
            run()?;
        }
        let t = time_reps(self.reps * 100, run)?;
        Ok(BenchResult {
            baseline: Some(Stats::of(scaled(&t, 1e6))?),
            baseline_name: "wgpu empty dispatch + wait".into(),
            ..r
        })
    }
}
