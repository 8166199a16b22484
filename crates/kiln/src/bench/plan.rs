//! Measurements of plan replay, for the `bench` command and the `plan_bench` example, and
//! the tiny kernels they replay.
//! Nothing here asserts on time; it only measures and reports.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_device::kiln_ir::{DType, KernelBuilder, Scalar, UOp, Val};
use kiln_device::{Buffer, Device, Kernel, Result};

use kiln_runtime::{ExecutionPlan, PlanOptions};

/// Host cost of replaying a chain of tiny dependent kernels.
#[derive(Clone, Debug)]
pub struct ReplayReport {
    /// Kernels in the recorded chain (each depends on the one before).
    pub kernels: usize,
    /// Whether the plan fused runs of kernels into one queue command ([`PlanOptions::fuse`]).
    pub fused: bool,
    /// Replays measured (at least 1).
    pub runs: usize,
    /// Wall time of one `run` divided by the kernel count (best of `runs`): everything the
    /// host and the queue do per kernel, plus the kernel itself (a one-element add).
    pub per_kernel: Duration,
    /// Median of the same.
    pub per_kernel_median: Duration,
    /// Time until every queue accepted its batch (recording + submit), per kernel (best).
    pub submit_per_kernel: Duration,
    /// One `Kernel::launch` per kernel on the calling thread, per kernel (best): the floor
    /// without queues (argument checks + the call).
    pub direct_launch_per_kernel: Duration,
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plan replay{}, {} dependent tiny kernels, {} runs: {:.3} µs/kernel best, {:.3} µs/kernel median \
             (submit {:.3} µs/kernel); direct Kernel::launch {:.3} µs/kernel",
            if self.fused { "" } else { " (unfused)" },
            self.kernels,
            self.runs,
            us(self.per_kernel),
            us(self.per_kernel_median),
            us(self.submit_per_kernel),
            us(self.direct_launch_per_kernel),
        )
    }
}

/// Two independent compute-bound kernels: serially on one queue vs. a plan on two queues.
#[derive(Clone, Debug)]
pub struct ParallelReport {
    /// Work items per kernel (1 keeps each kernel on one core, so any overlap comes from
    /// the queues; more lets the backend split each kernel over its own cores too).
    pub elements: usize,
    /// Loop iterations per work item (the `iters` variable of [`spin_kernel`]).
    pub iterations: i64,
    /// Both kernels one after another with `Kernel::launch` (best of runs).
    pub serial: Duration,
    /// Both kernels at once on two plain threads with `Kernel::launch` (best of runs): what
    /// this machine gives two concurrent kernels, the bound for the two-queue plan.
    pub two_threads: Duration,
    /// Both kernels in a plan with one compute queue (best of runs).
    pub one_queue: Duration,
    /// Both kernels in a plan with two compute queues (best of runs).
    pub two_queues: Duration,
    /// Queues the two kernels were assigned in the two-queue plan.
    pub queues: [usize; 2],
}

impl fmt::Display for ParallelReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "two independent compute-bound kernels ({} elements x {} iterations): serial {:.3} ms, two threads {:.3} ms, \
             plan on 1 queue {:.3} ms, plan on 2 queues {:.3} ms (queues {:?}, speed-up {:.2}x over serial)",
            self.elements,
            self.iterations,
            ms(self.serial),
            ms(self.two_threads),
            ms(self.one_queue),
            ms(self.two_queues),
            self.queues,
            self.serial.as_secs_f64() / self.two_queues.as_secs_f64().max(1e-12),
        )
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `x[0] += 1` on a one-element f32 buffer (slot 0 is read and written).
///
/// # Errors
/// None in practice: the kernel is fixed; a failure would be a validation bug in kiln-ir
/// ([`kiln_device::Error::Ir`]).
pub fn increment_kernel() -> Result<Arc<UOp>> {
    let mut k = KernelBuilder::new();
    let x = k.param(0, Scalar::F32, 1usize);
    let i = k.global(0, 1usize);
    let v = x.at(&i).load() + 1.0f32;
    k.store(&x.at(&i), &v);
    Ok(k.finish()?)
}

/// `y[i] = r` after `iters` steps of `r = r * 0.999 + x[i]` (from 0), over `n` elements;
/// `iters` is a variable so one binary serves every problem size.
///
/// # Errors
/// [`kiln_device::Error::Ir`] when `n` exceeds the `i32` index range.
pub fn spin_kernel(n: usize) -> Result<Arc<UOp>> {
    let mut k = KernelBuilder::new();
    let iters = k.var("iters", 1, 1 << 30);
    let x = k.param(0, Scalar::F32, n);
    let y = k.param(1, Scalar::F32, n);
    let i = k.global(0, n);
    let r = k.range(&iters);
    let acc = k.acc(&Val::constant(DType::F32, 0.0), &[&r]);
    let xi = x.at(&i).load();
    let total = acc.update(&(acc.get() * 0.999f32 + xi));
    k.store(&y.at(&i), &total);
    Ok(k.finish()?)
}

fn best_and_median(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort_unstable();
    let best = samples.first().copied().unwrap_or_default();
    let median = samples.get(samples.len() / 2).copied().unwrap_or_default();
    (best, median)
}

/// Records `kernels` increments of one buffer (a dependent chain) and replays the plan
/// `runs` times.
///
/// # Errors
/// What compiling the kernel, allocating its buffer, or recording and running the plan on
/// `device` returns: e.g. [`kiln_device::Error::CompilerMissing`] without a C compiler, or
/// [`kiln_device::Error::Unavailable`] for a device without queues.
pub fn replay_overhead(device: &Device, kernels: usize, runs: usize) -> Result<ReplayReport> {
    replay_overhead_with(device, kernels, runs, PlanOptions::default())
}

/// [`replay_overhead`] with fusion off: every kernel is its own queue command.
///
/// # Errors
/// As [`replay_overhead`].
pub fn replay_overhead_unfused(device: &Device, kernels: usize, runs: usize) -> Result<ReplayReport> {
    replay_overhead_with(device, kernels, runs, PlanOptions { fuse: false, ..PlanOptions::default() })
}

fn replay_overhead_with(device: &Device, kernels: usize, runs: usize, options: PlanOptions) -> Result<ReplayReport> {
    let kernel: Kernel = device.compile(&increment_kernel()?, Some("increment"))?;
    let x = Buffer::from_slice(device.allocator(), &[0.0f32])?;
    let mut plan = ExecutionPlan::with_options(device, options)?;
    for _ in 0..kernels {
        plan.exec(&kernel, &[&x], &[])?;
    }
    plan.run(&[])?; // schedules, creates queues and checks once
    let (mut total, mut submit) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs.max(1) {
        let t0 = Instant::now();
        let handle = plan.submit(&[])?;
        let t1 = Instant::now();
        handle.wait()?;
        let t2 = Instant::now();
        submit.push((t1 - t0) / kernels.max(1) as u32);
        total.push((t2 - t0) / kernels.max(1) as u32);
    }
    let mut direct = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t0 = Instant::now();
        for _ in 0..kernels {
            kernel.launch(&[&x], &[])?;
        }
        direct.push(t0.elapsed() / kernels.max(1) as u32);
    }
    let (per_kernel, per_kernel_median) = best_and_median(total);
    Ok(ReplayReport {
        kernels,
        fused: options.fuse,
        runs: runs.max(1),
        per_kernel,
        per_kernel_median,
        submit_per_kernel: best_and_median(submit).0,
        direct_launch_per_kernel: best_and_median(direct).0,
    })
}

/// Runs two independent [`spin_kernel`]s of `elements` work items serially and as a plan on
/// one and on two queues.
///
/// # Errors
/// As [`replay_overhead`], and [`kiln_device::Error::Ir`] when `elements` exceeds the `i32`
/// index range or `iterations` is outside `1..=2^30`.
pub fn parallel_branches(device: &Device, elements: usize, iterations: i64, runs: usize) -> Result<ParallelReport> {
    let n = elements.max(1);
    let kernel = device.compile(&spin_kernel(n)?, Some("spin"))?;
    let input: Vec<f32> = (0..n).map(|i| i as f32 * 1e-3).collect();
    let xa = Buffer::from_slice(device.allocator(), &input)?;
    let xb = Buffer::from_slice(device.allocator(), &input)?;
    let ya = device.buffer(Scalar::F32, n)?;
    let yb = device.buffer(Scalar::F32, n)?;
    let vars = [("iters", iterations)];
    let runs = runs.max(1);

    let mut serial = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        kernel.launch(&[&xa, &ya], &[iterations])?;
        kernel.launch(&[&xb, &yb], &[iterations])?;
        serial.push(t0.elapsed());
    }
    let mut threads = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| kernel.launch(&[&xa, &ya], &[iterations]));
            let b = s.spawn(|| kernel.launch(&[&xb, &yb], &[iterations]));
            (a.join(), b.join())
        });
        for r in [a, b] {
            r.map_err(|_| kiln_device::Error::Launch("a benchmark thread panicked".into()))??;
        }
        threads.push(t0.elapsed());
    }
    let timed_plan = |compute_queues: usize| -> Result<(Duration, Vec<usize>)> {
        let options = PlanOptions { compute_queues, ..PlanOptions::default() };
        let mut plan = ExecutionPlan::with_options(device, options)?;
        plan.exec(&kernel, &[&xa, &ya], &vars)?;
        plan.exec(&kernel, &[&xb, &yb], &vars)?;
        plan.run(&[])?;
        let mut samples = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t0 = Instant::now();
            plan.run(&[])?;
            samples.push(t0.elapsed());
        }
        Ok((best_and_median(samples).0, plan.queue_assignment()?))
    };
    let (one_queue, _) = timed_plan(1)?;
    let (two_queues, assignment) = timed_plan(2)?;
    Ok(ParallelReport {
        elements: n,
        iterations,
        serial: best_and_median(serial).0,
        two_threads: best_and_median(threads).0,
        one_queue,
        two_queues,
        queues: [assignment.first().copied().unwrap_or(0), assignment.get(1).copied().unwrap_or(0)],
    })
}
