//! Runtime entries: queues, signals, plans and the allocator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_device::Buffer;
use kiln_runtime::{ExecutionPlan, PlanOptions};

use super::Bench;
use crate::bench::report::{BenchResult, Stats};
use crate::bench::{kiln_err, scaled, time_reps, wrong};
use crate::error::CliError;

impl Bench {
    fn queues(&self) -> Result<Arc<dyn kiln_device::DynQueueFactory>, CliError> {
        self.device.queues().ok_or_else(|| {
            kiln_err(
                "queue benchmarks",
                kiln_device::Error::Unavailable(format!("{} has no queues", self.device.spec())),
            )
        })
    }

    /// One tiny kernel: record → submit → the queue's worker runs it → signal → host wait.
    pub(super) fn queue_roundtrip(&self) -> Result<BenchResult, CliError> {
        let factory = self.queues()?;
        let k = self.compile(crate::bench::plan::increment_kernel(), "increment")?;
        let x = self.zeros(1)?;
        let mut q = factory.create_dyn_compute_queue().map_err(|e| kiln_err("creating a queue", e))?;
        let s = factory.create_dyn_signal().map_err(|e| kiln_err("creating a signal", e))?;
        let mut value = 0u64;
        let reps = self.reps * 100;
        let mut one = || -> Result<(), CliError> {
            value += 1;
            q.exec(&k, &[&x], &[]).signal(&s, value);
            q.submit().map_err(|e| kiln_err("submitting", e))?;
            s.wait(value, Duration::from_secs(10)).map_err(|e| kiln_err("waiting for the queue", e))
        };
        for _ in 0..10 {
            one()?;
        }
        let t = time_reps(reps, &mut one)?;
        let got = self.read(&x)?[0];
        if got != value as f32 {
            return Err(wrong("queue_roundtrip", format!("{value} increments left {got}")));
        }
        Ok(BenchResult {
            name: "queue_roundtrip",
            unit: "µs",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(scaled(&t, 1e6))?,
            baseline: None,
            baseline_name: "".into(),
        })
    }

    /// A recorded plan of 1000 dependent tiny kernels, replayed; per kernel.
    pub(super) fn plan_replay(&self) -> Result<BenchResult, CliError> {
        let kernels = 1000usize;
        let k = self.compile(crate::bench::plan::increment_kernel(), "increment")?;
        let x = self.zeros(1)?;
        let mut plan = ExecutionPlan::new(&self.device).map_err(|e| kiln_err("creating a plan", e))?;
        for _ in 0..kernels {
            plan.exec(&k, &[&x], &[]).map_err(|e| kiln_err("recording", e))?;
        }
        let replay = |plan: &mut ExecutionPlan| plan.run(&[]).map_err(|e| kiln_err("replaying the plan", e));
        replay(&mut plan)?;
        let t = time_reps(self.reps * 5, || replay(&mut plan))?;
        let want = (kernels * (self.reps * 5 + 1)) as f32;
        let got = self.read(&x)?[0];
        if got != want {
            return Err(wrong("plan_replay_per_kernel", format!("replays left {got}, expected {want}")));
        }
        Ok(BenchResult {
            name: "plan_replay_per_kernel",
            unit: "µs",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(scaled(&t, 1e6 / kernels as f64))?,
            baseline: None,
            baseline_name: "".into(),
        })
    }

    /// Ping-pong between two threads over two signals; one wake is half a round trip.
    pub(super) fn signal_wake(&self) -> Result<BenchResult, CliError> {
        let factory = self.queues()?;
        let ping = factory.create_dyn_signal().map_err(|e| kiln_err("creating a signal", e))?;
        let pong = factory.create_dyn_signal().map_err(|e| kiln_err("creating a signal", e))?;
        let rounds = (self.reps * 200) as u64;
        let timeout = Duration::from_secs(10);
        let samples = std::thread::scope(|s| -> Result<Vec<f64>, CliError> {
            let echo = s.spawn(|| -> kiln_device::Result<()> {
                for i in 1..=rounds {
                    ping.wait(i, timeout)?;
                    pong.set(i);
                }
                Ok(())
            });
            let mut samples = Vec::with_capacity(rounds as usize);
            for i in 1..=rounds {
                let t = Instant::now();
                ping.set(i);
                pong.wait(i, timeout).map_err(|e| kiln_err("waiting for the echo thread", e))?;
                samples.push(t.elapsed().as_secs_f64() / 2.0);
            }
            echo.join()
                .map_err(|_| kiln_err("signal_wake", kiln_device::Error::Invalid("the echo thread panicked".into())))?
                .map_err(|e| kiln_err("the echo thread", e))?;
            Ok(samples)
        })?;
        if pong.value() != rounds {
            return Err(wrong("signal_wake", format!("the echo signal reached {} of {rounds}", pong.value())));
        }
        Ok(BenchResult {
            name: "signal_wake",
            unit: "µs",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(scaled(&samples, 1e6))?,
            baseline: None,
            baseline_name: "".into(),
        })
    }

    /// Two independent compute-bound one-work-item kernels: a plan on two queues vs the
    /// same two kernels one after the other. Reported as the ratio (lower is better).
    pub(super) fn two_queue_overlap(&self) -> Result<BenchResult, CliError> {
        let iterations = 20_000_000i64;
        let k = self.compile(crate::bench::plan::spin_kernel(1), "spin")?;
        let (xa, xb) = (self.upload(&[0.5])?, self.upload(&[0.25])?);
        let (ya, yb) = (self.zeros(1)?, self.zeros(1)?);
        let launch = |x: &Buffer, y: &Buffer| k.launch(&[x, y], &[iterations]).map_err(|e| kiln_err("running spin", e));
        let options = PlanOptions { compute_queues: 2, ..PlanOptions::default() };
        let mut plan =
            ExecutionPlan::with_options(&self.device, options).map_err(|e| kiln_err("creating a plan", e))?;
        let vars = [("iters", iterations)];
        plan.exec(&k, &[&xa, &ya], &vars).map_err(|e| kiln_err("recording", e))?;
        plan.exec(&k, &[&xb, &yb], &vars).map_err(|e| kiln_err("recording", e))?;
        let queues = plan.queue_assignment().map_err(|e| kiln_err("scheduling", e))?;
        if queues.len() != 2 || queues[0] == queues[1] {
            return Err(wrong("two_queue_overlap", format!("independent kernels were put on queues {queues:?}")));
        }
        plan.run(&[]).map_err(|e| kiln_err("running the plan", e))?;
        let spin = |x: f32| (0..iterations).fold(0f32, |r, _| r * 0.999 + x);
        for (y, x) in [(&ya, 0.5f32), (&yb, 0.25)] {
            let (got, want) = (self.read(y)?[0], spin(x));
            if (got - want).abs() > 1e-4 * want.abs() {
                return Err(wrong("two_queue_overlap", format!("spin({x}) = {got}, reference {want}")));
            }
        }
        let reps = self.reps.min(5);
        let mut ratios = Vec::with_capacity(reps);
        for _ in 0..reps {
            let serial = time_reps(1, || {
                launch(&xa, &ya)?;
                launch(&xb, &yb)
            })?[0];
            let parallel = time_reps(1, || plan.run(&[]).map_err(|e| kiln_err("running the plan", e)))?[0];
            ratios.push(parallel / serial);
        }
        Ok(BenchResult {
            name: "two_queue_overlap",
            unit: "ratio",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(ratios)?,
            baseline: None,
            baseline_name: "".into(),
        })
    }

    /// A cached allocation and free of a 64 KiB block through the device's allocator.
    pub(super) fn alloc_cached(&self) -> Result<BenchResult, CliError> {
        let alloc = &self.device.allocator();
        let bytes = 64 << 10;
        let warm = alloc.alloc(bytes).map_err(|e| kiln_err("allocating", e))?;
        // SAFETY: `warm` was just allocated with this size and is not used again.
        unsafe { alloc.free(warm, bytes) };
        let before = alloc.stats();
        let n = 10_000;
        let mut samples = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            let t = Instant::now();
            for _ in 0..n {
                let p = alloc.alloc(bytes).map_err(|e| kiln_err("allocating", e))?;
                // SAFETY: `p` was just allocated with this size and is not used again.
                unsafe { alloc.free(p, bytes) };
            }
            samples.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
        }
        let after = alloc.stats();
        if after.hits - before.hits != (n * self.reps) as u64 {
            return Err(wrong(
                "alloc_cached",
                format!("{} cache hits for {} allocations", after.hits - before.hits, n * self.reps),
            ));
        }
        let b = self.upload(&[1.5, 2.5, 3.5])?;
        if self.read(&b)? != [1.5, 2.5, 3.5] {
            return Err(wrong("alloc_cached", "a buffer from the cached allocator lost its contents".into()));
        }
        Ok(BenchResult {
            name: "alloc_cached",
            unit: "ns",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(samples)?,
            baseline: None,
            baseline_name: "".into(),
        })
    }
}
