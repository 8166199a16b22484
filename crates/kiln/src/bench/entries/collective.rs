//! Collective entries: all_reduce over in-process channels between devices of this process
//! (`allreduce_devices`), and over MPI between the processes `mpirun` started
//! (`allreduce_mpi`). Each row is one rank count and one buffer size (f32, the bytes each rank
//! holds); its figure is that size over the time of one all_reduce (what nccl-tests call the
//! algorithm bandwidth), after every rank checked the sum.

use std::sync::Arc;
use std::time::Instant;

use kiln_device::kiln_ir::Scalar;
use kiln_device::{Channel, Device, LocalChannel, ReduceOp};
use kiln_runtime::{ExecutionPlan, PlanRun};

use super::{Bench, skipped_if_cannot_run, upload_to};
use crate::bench::report::{BenchResult, Row, Skipped, Stats};
use crate::bench::{alloc_err, kiln_err, per_sec, time_reps, wrong};
use crate::error::CliError;

/// Bytes each rank holds, and the rows' names: `[ranks 2, ranks 4][size]`.
const SIZES: [usize; 3] = [1 << 20, 16 << 20, 256 << 20];
const DEVICE_ROWS: [[&str; 3]; 2] = [
    ["allreduce_devices/2/1MiB", "allreduce_devices/2/16MiB", "allreduce_devices/2/256MiB"],
    ["allreduce_devices/4/1MiB", "allreduce_devices/4/16MiB", "allreduce_devices/4/256MiB"],
];
const MPI_ROWS: [[&str; 3]; 2] = [
    ["allreduce_mpi/2/1MiB", "allreduce_mpi/2/16MiB", "allreduce_mpi/2/256MiB"],
    ["allreduce_mpi/4/1MiB", "allreduce_mpi/4/16MiB", "allreduce_mpi/4/256MiB"],
];

/// Rank `r`'s element `i`: small integers, so every sum is exact in f32.
fn value(rank: usize, i: usize) -> f32 {
    ((rank + 1) * (i % 7)) as f32
}

/// The sum over `count` ranks of element `i`.
fn sum(count: usize, i: usize) -> f32 {
    (0..count).map(|r| value(r, i)).sum()
}

/// Checks `got` against the sum over `count` ranks.
fn check(name: &str, count: usize, got: &[f32]) -> Result<(), CliError> {
    match got.iter().enumerate().find(|(i, v)| **v != sum(count, *i)) {
        Some((i, v)) => Err(wrong(name, format!("element {i} of the all_reduce is {v}, want {}", sum(count, i)))),
        None => Ok(()),
    }
}

fn row(
    name: &'static str,
    bytes: usize,
    kiln: &[f64],
    baseline: Vec<f64>,
    baseline_name: &'static str,
) -> Result<BenchResult, CliError> {
    Ok(BenchResult {
        name,
        unit: "GB/s",
        higher_is_better: true,
        verified: true,
        kiln: Stats::of(per_sec(kiln, bytes as f64 / 1e9))?,
        baseline: Some(Stats::of(per_sec(&baseline, bytes as f64 / 1e9))?),
        baseline_name: baseline_name.into(),
    })
}

impl Bench {
    /// Rank `r`'s device: device `r` of the backend under test where it has one (`CPU:1`,
    /// ...), else the device under test itself.
    fn rank_device(&self, r: usize) -> Arc<Device> {
        match r {
            0 => self.device.clone(),
            r => kiln_device::open_device(&format!("{}:{r}", self.device.spec().base_type()))
                .unwrap_or_else(|_| self.device.clone()),
        }
    }

    /// all_reduce (sum, f32) over 2 and 4 ranks of one process, one device each, against the
    /// machine's copy bandwidth: as many threads as ranks, each copying one rank's buffer. A
    /// row whose buffers a device cannot hold (WebGPU's storage binding limit, its memory) is
    /// skipped with the reason; the others still run and are checked.
    pub(super) fn allreduce_devices(&self) -> Result<Vec<Row>, CliError> {
        let mut rows = Vec::new();
        for (names, count) in DEVICE_ROWS.iter().zip([2usize, 4]) {
            let devices: Vec<Arc<Device>> = (0..count).map(|r| self.rank_device(r)).collect();
            for (name, bytes) in names.iter().zip(SIZES) {
                rows.push(skipped_if_cannot_run(name, self.allreduce_row(name, &devices, bytes))?);
            }
        }
        Ok(rows)
    }

    /// One row of [`Bench::allreduce_devices`]: `bytes` a rank over `devices`.
    fn allreduce_row(
        &self,
        name: &'static str,
        devices: &[Arc<Device>],
        bytes: usize,
    ) -> Result<BenchResult, CliError> {
        let (count, n) = (devices.len(), bytes / 4);
        let chans = LocalChannel::world(count).map_err(|e| kiln_err("creating a channel", e))?;
        let mut plans = Vec::new();
        let mut recvs = Vec::new();
        for (r, (dev, chan)) in devices.iter().zip(chans).enumerate() {
            let data: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
            let send = upload_to(dev, &data)?;
            let recv = dev.buffer(Scalar::F32, n).map_err(|e| alloc_err("allocating", e))?;
            let mut plan = ExecutionPlan::new(dev).map_err(|e| kiln_err("creating a plan", e))?;
            let chan: Arc<dyn Channel> = chan;
            plan.all_reduce(&chan, &send, &recv, ReduceOp::Sum).map_err(|e| kiln_err("recording", e))?;
            plans.push(plan);
            recvs.push(recv);
        }
        let mut run = || -> Result<(), CliError> {
            let runs: Vec<PlanRun<'_>> = plans
                .iter_mut()
                .map(|p| p.submit(&[]))
                .collect::<Result<_, _>>()
                .map_err(|e| kiln_err("submitting", e))?;
            for run in runs {
                run.wait().map_err(|e| kiln_err("the all_reduce", e))?;
            }
            Ok(())
        };
        run()?;
        for recv in &recvs {
            check(name, count, &self.read(recv)?)?;
        }
        let kiln = time_reps(self.reps, &mut run)?;
        drop((plans, recvs));
        let baseline = copy_baseline(count, n, self.reps);
        row(name, bytes, &kiln, baseline, "copy, one thread per rank")
    }

    /// all_reduce (sum, f32) over MPI with 2 and 4 ranks (the first ranks of the job), against
    /// `MPI_Allreduce` on the same host memory. Every rank checks its sum (and the ranks agree
    /// on it before anything is timed); the report is rank 0's.
    ///
    /// In a kiln without MPI every row is skipped, saying so.
    pub(super) fn allreduce_mpi(&self) -> Result<Vec<Row>, CliError> {
        let world = match kiln_mpi::MpiChannel::world() {
            Ok(world) => world,
            Err(e @ kiln_device::Error::Unavailable(_)) => {
                let reason = format!("no MPI: {e}");
                let names = MPI_ROWS.iter().flatten();
                return Ok(names.map(|&name| Err(Skipped { name, reason: reason.clone() })).collect());
            }
            Err(e) => return Err(kiln_err("joining the MPI job", e)),
        };
        if world.count() < 4 {
            return Err(CliError::Usage(format!(
                "allreduce_mpi measures 2 and 4 ranks: run it with 4 or more, e.g. `mpirun --oversubscribe -np 4 kiln \
                 bench --only allreduce_mpi` (this job has {})",
                world.count()
            )));
        }
        let mut rows = Vec::new();
        for (names, count) in MPI_ROWS.iter().zip([2usize, 4]) {
            // Ranks outside the group wait asleep at the barrier below while the group measures.
            world.barrier().map_err(|e| kiln_err("waiting for every rank", e))?;
            let group = world.first(count).map_err(|e| kiln_err("splitting the MPI job", e))?;
            for (name, bytes) in names.iter().zip(SIZES) {
                let Some(chan) = &group else {
                    continue;
                };
                let n = bytes / 4;
                let rank = chan.rank();
                let data: Vec<f32> = (0..n).map(|i| value(rank, i)).collect();
                let send = self.upload(&data)?;
                let recv = self.zeros(n)?;
                let dyn_chan: Arc<dyn Channel> = chan.clone();
                let mut plan = ExecutionPlan::new(&self.device).map_err(|e| kiln_err("creating a plan", e))?;
                plan.all_reduce(&dyn_chan, &send, &recv, ReduceOp::Sum).map_err(|e| kiln_err("recording", e))?;
                let mut run = || plan.run(&[]).map_err(|e| kiln_err("the all_reduce", e));
                run()?;
                let checked = check(name, count, &self.read(&recv)?);
                let all_ok = chan.agree_ok(checked.is_ok()).map_err(|e| kiln_err("comparing the ranks' checks", e))?;
                checked?;
                if !all_ok {
                    return Err(wrong(name, "another rank's sum was wrong".into()));
                }
                let kiln = time_reps(self.reps, &mut run)?;
                // The baseline after kiln's reps, on the same memory (which travels with each
                // call and comes back with its result).
                let (data, out) =
                    chan.baseline_all_reduce_f32(data, vec![0f32; n]).map_err(|e| kiln_err("MPI_Allreduce", e))?;
                check(name, count, &out)?;
                let mut memory = Some((data, out));
                let baseline = time_reps(self.reps, || {
                    let (data, out) =
                        memory.take().ok_or_else(|| wrong(name, "the baseline lost its buffers".into()))?;
                    memory = Some(chan.baseline_all_reduce_f32(data, out).map_err(|e| kiln_err("MPI_Allreduce", e))?);
                    Ok(())
                })?;
                rows.push(Ok(row(name, bytes, &kiln, baseline, "MPI_Allreduce (the same memory)")?));
            }
        }
        world.barrier().map_err(|e| kiln_err("waiting for every rank", e))?;
        Ok(rows)
    }
}

/// Seconds per copy of `n` f32 by each of `count` threads at once, one buffer pair each.
fn copy_baseline(count: usize, n: usize, reps: usize) -> Vec<f64> {
    let mut pairs: Vec<(Vec<f32>, Vec<f32>)> =
        (0..count).map(|r| ((0..n).map(|i| value(r, i)).collect(), vec![0f32; n])).collect();
    let mut once = || {
        let start = Instant::now();
        std::thread::scope(|s| {
            for (src, dst) in pairs.iter_mut() {
                s.spawn(move || dst.copy_from_slice(src));
            }
        });
        start.elapsed().as_secs_f64()
    };
    once();
    (0..reps).map(|_| once()).collect()
}
