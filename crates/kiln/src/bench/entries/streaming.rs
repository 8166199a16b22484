//! Memory-bound entries: the bandwidth limit, add (plain and guarded), sum and softmax.

use std::sync::Arc;

use kiln_device::kiln_ir::{Op, Scalar, UOp};

use super::Bench;
use crate::bench::baselines::{self, stream};
use crate::bench::report::{BenchResult, Stats};
use crate::bench::{kernels, kiln_err, per_sec, time_reps, wrong};
use crate::error::CliError;

/// Elements of `add_f32_16m` and `bandwidth_limit`, and the bytes one pass of the add moves
/// (two f32 reads and one f32 write per element).
const ADD_N: usize = 1 << 24;
const ADD_BYTES: f64 = 12.0 * ADD_N as f64 / 1e9;

impl Bench {
    /// The inputs of `add_f32_16m` and `bandwidth_limit`: 16M f32 each, exact sums.
    fn add_inputs() -> (Vec<f32>, Vec<f32>) {
        let n = ADD_N;
        ((0..n).map(|i| (i % 1000) as f32 * 0.25).collect(), (0..n).map(|i| (i % 777) as f32 * 0.5).collect())
    }

    /// The memory bandwidth this machine reaches, STREAM's way ([`stream::limit`]) over the
    /// add's inputs.
    pub(super) fn bandwidth_limit(&self) -> Result<BenchResult, CliError> {
        let limit = self.stream_limit("bandwidth_limit")?;
        Ok(BenchResult {
            name: "bandwidth_limit",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(limit.gbps)?,
            baseline: None,
            baseline_name: limit.variant.into(),
        })
    }

    /// [`stream::limit`] over the add's inputs, for `entry`.
    fn stream_limit(&self, entry: &str) -> Result<stream::Limit, CliError> {
        let (a, b) = Self::add_inputs();
        stream::limit(&a, &b, self.reps).map_err(|e| wrong(entry, e))
    }

    /// The add of `n` f32: [`super::gpu::add_f32`] on a GPU, else the CPU-shaped
    /// [`kernels::add_f32`] (`nontemporal` when the data does not fit in the cache).
    fn add_kernel(&self, n: usize) -> Result<Arc<UOp>, CliError> {
        let built = if self.gpu_shaped() {
            super::gpu::add_f32(n)
        } else {
            kernels::add_f32(self.axis(), n, self.width(), exceeds_cache(self.device.properties(), 4 * n))
        };
        built.map_err(|e| kiln_err("building the add_f32 kernel", e.into()))
    }

    /// kiln's `add` against the bandwidth limit measured right after it.
    pub(super) fn add(&self) -> Result<BenchResult, CliError> {
        let n = ADD_N;
        let (a, b) = Self::add_inputs();
        let k = self.compile(Ok::<_, kiln_device::Error>(self.add_kernel(n)?), "add_f32")?;
        let (ba, bb, bc) = (self.upload(&a)?, self.upload(&b)?, self.zeros(n)?);
        self.launch(&k, &[&ba, &bb, &bc])?;
        let c = self.read(&bc)?;
        if let Some(i) = (0..n).find(|&i| c[i] != a[i] + b[i]) {
            return Err(wrong("add_f32_16m", format!("c[{i}] = {} but a[{i}] + b[{i}] = {}", c[i], a[i] + b[i])));
        }
        let t = time_reps(self.reps, || self.launch(&k, &[&ba, &bb, &bc]))?;
        // The limit runs after kiln's reps, not between them: its threads would otherwise
        // share the cores with kiln's pool workers, which spin for a while after each launch.
        let limit = self.stream_limit("add_f32_16m")?;
        Ok(BenchResult {
            name: "add_f32_16m",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, ADD_BYTES))?,
            baseline: Some(Stats::of(limit.gbps)?),
            baseline_name: format!("bandwidth_limit: {}", limit.variant).into(),
        })
    }

    /// The cost of a guard: `add` with its three accesses compiled as guarded ones (what a
    /// launch runs when no proof reaches them, [`kiln_ir::guard`]), against the proven `add`
    /// (no check in its code), each timed on its own.
    pub(super) fn add_guarded(&self) -> Result<BenchResult, CliError> {
        let n = ADD_N;
        let (a, b) = Self::add_inputs();
        let sink = self.add_kernel(n)?;
        let accesses: Vec<usize> = sink
            .toposort()
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.op(), Op::Load | Op::Store))
            .map(|(i, _)| i)
            .collect();
        let guarded = kiln_device::kiln_ir::guard(&sink, &accesses)
            .map_err(|e| kiln_err("guarding the add_f32 kernel", e.into()))?;
        let proven = self.compile(Ok::<_, kiln_device::Error>(sink), "add_f32")?;
        let k = self.compile(Ok::<_, kiln_device::Error>(guarded.sink), "add_f32_guarded")?;
        let faults =
            self.device.buffer(Scalar::I64, 2 * accesses.len()).map_err(|e| kiln_err("allocating faults", e))?;
        faults.copy_from_slice(&vec![0i64; 2 * accesses.len()]).map_err(|e| kiln_err("clearing faults", e))?;
        let (ba, bb, bc) = (self.upload(&a)?, self.upload(&b)?, self.zeros(n)?);
        self.launch(&k, &[&ba, &bb, &bc, &faults])?;
        let c = self.read(&bc)?;
        if let Some(i) = (0..n).find(|&i| c[i] != a[i] + b[i]) {
            return Err(wrong(
                "add_f32_16m_guarded",
                format!("c[{i}] = {} but a[{i}] + b[{i}] = {}", c[i], a[i] + b[i]),
            ));
        }
        let fired = faults.to_vec::<i64>().map_err(|e| kiln_err("reading faults", e))?;
        if fired.iter().any(|&f| f != 0) {
            return Err(wrong("add_f32_16m_guarded", format!("a guard fired on an in-bounds add: {fired:?}")));
        }
        let t = time_reps(self.reps, || self.launch(&k, &[&ba, &bb, &bc, &faults]))?;
        let base = time_reps(self.reps, || self.launch(&proven, &[&ba, &bb, &bc]))?;
        Ok(BenchResult {
            name: "add_f32_16m_guarded",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, ADD_BYTES))?,
            baseline: Some(Stats::of(per_sec(&base, ADD_BYTES))?),
            baseline_name: "add_f32_16m as proven (no check in its code)".into(),
        })
    }

    pub(super) fn sum(&self) -> Result<BenchResult, CliError> {
        let n = 1usize << 24;
        let a: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1024) as f32 / 1024.0 - 0.5).collect();
        let (partial, finish, chunks) = match self.gpu_sum_kernels(n)? {
            Some(gpu) => gpu,
            None => {
                let chunks = 64;
                let partial =
                    self.compile(kernels::sum_partials_f32(self.axis(), n, chunks, self.width()), "sum_partials_f32")?;
                (partial, self.compile(kernels::sum_finish_f32(chunks), "sum_finish_f32")?, chunks)
            }
        };
        let (ba, bp, bo) = (self.upload(&a)?, self.zeros(chunks)?, self.zeros(1)?);
        let run = || -> Result<(), CliError> {
            self.launch(&partial, &[&ba, &bp])?;
            self.launch(&finish, &[&bp, &bo])
        };
        run()?;
        let got = self.read(&bo)?[0] as f64;
        let want: f64 = a.iter().map(|&x| x as f64).sum();
        // f32 accumulation in any order: bounded by a small multiple of eps · Σ|a|.
        let bound = 1e-6 * a.iter().map(|&x| (x as f64).abs()).sum::<f64>();
        if (got - want).abs() > bound {
            return Err(wrong("sum_f32_16m", format!("sum = {got}, reference (f64) = {want}")));
        }
        let bytes = 4.0 * n as f64 / 1e9;
        let t = time_reps(self.reps, run)?;
        let mut base_sum = 0f32;
        let base = time_reps(self.reps, || {
            base_sum = baselines::sum(&a);
            Ok(())
        })?;
        if ((base_sum as f64) - want).abs() > bound {
            return Err(wrong("sum_f32_16m", format!("the Rust baseline gives {base_sum}, reference {want}")));
        }
        Ok(BenchResult {
            name: "sum_f32_16m",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, bytes))?,
            baseline: Some(Stats::of(per_sec(&base, bytes))?),
            baseline_name: "Rust streaming sum, all cores".into(),
        })
    }

    pub(super) fn softmax(&self) -> Result<BenchResult, CliError> {
        let (rows, cols) = (4096usize, 1024usize);
        let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 31) % 97) as f32 * 0.05 - 2.0).collect();
        let nontemporal = exceeds_cache(self.device.properties(), 4 * rows * cols);
        let k =
            self.compile(kernels::softmax_f32(self.axis(), rows, cols, self.width(), nontemporal), "softmax_f32")?;
        let (bx, by) = (self.upload(&x)?, self.zeros(rows * cols)?);
        self.launch(&k, &[&bx, &by])?;
        let y = self.read(&by)?;
        for r in (0..rows).step_by(97) {
            let row = &x[r * cols..(r + 1) * cols];
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
            for c in 0..cols {
                let want = (row[c] as f64 - m).exp() / s;
                let got = y[r * cols + c] as f64;
                if (got - want).abs() > 1e-5 * want.max(1e-3) + 1e-7 {
                    return Err(wrong("softmax_f32_4096x1024", format!("y[{r}, {c}] = {got}, reference {want}")));
                }
            }
        }
        let bytes = 8.0 * (rows * cols) as f64 / 1e9;
        let t = time_reps(self.reps, || self.launch(&k, &[&bx, &by]))?;
        Ok(BenchResult {
            name: "softmax_f32_4096x1024",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, bytes))?,
            baseline: None,
            baseline_name: "".into(),
        })
    }
}

/// Whether a kernel that writes an output of `bytes` should store it non-temporally: when it
/// does not fit in the largest cache the device reports, or in 8 MiB where it reports none
/// (backends without non-temporal stores ignore the hint).
fn exceeds_cache(props: &kiln_device::DeviceProperties, bytes: usize) -> bool {
    const FALLBACK: usize = 8 << 20;
    bytes > props.largest_cache_bytes().unwrap_or(FALLBACK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_outputs_beyond_every_cache_are_stored_nontemporally() {
        let none = kiln_device::DeviceProperties::default();
        assert!(!exceeds_cache(&none, 64 << 10) && exceeds_cache(&none, 9 << 20));
        let cpu = kiln_device::DeviceProperties { l1d_bytes: Some(32 << 10), l3_bytes: Some(32 << 20), ..none };
        assert!(!exceeds_cache(&cpu, 16 << 20) && exceeds_cache(&cpu, 64 << 20));
    }
}
