//! Fault scenarios (cargo feature `fault-injection`): one per fault kind, injected into a
//! device of the backend under test ([`Device::with_faults`]: the backend's own parts behind
//! a [`FaultPlan`]), then the recovery contract of `kiln_device::context` checked:
//!
//! - no waiter hangs: every host wait is bounded ([`HANG_GUARD`]) and the harness's watchdog
//!   bounds the rest;
//! - nothing computed after the fault is reported as valid: the failed work's signals fail
//!   (with the typed root cause), its results cannot be read back;
//! - the allocator's accounting returns to its baseline once the handles are dropped;
//! - after `reset()` the same workload runs and gives the right result;
//! - stale handles (buffers, kernels, queues, queue factories, signals, plans) give
//!   `DeviceLost`;
//! - the kernel cache refills the reset device without compiling (the plan counts compiles).
//!
//! Each scenario runs on a fresh device (its own context and memory-only kernel cache), so
//! the scenarios run in parallel with the rest of the suite.

use std::sync::Arc;
use std::time::Instant;

use kiln_device::faults::{DEVICE_LOSS, FaultKind, FaultPlan, KERNEL_FAULT};
use kiln_device::{
    Allocator, Buffer, CacheConfig, Device, DynQueue, DynQueueFactory, Error, ErrorClass, Kernel, KernelCache,
    TimelineSignal,
};
use kiln_runtime::{ExecutionPlan, PlanOptions};

use crate::kernels::{affine, affine_in_place, compile};
use crate::suite::queues::host_wait;
use crate::suite::signals::HANG_GUARD;
use crate::{Failure, Outcome, ensure, expect_err, queues};

const N: usize = 64;

/// A fresh device of `base`'s backend with faults from a new plan, and the plan.
fn faulty(base: &Device) -> Result<(Arc<Device>, Arc<FaultPlan>), Failure> {
    let plan = FaultPlan::new();
    let dev = base.with_faults(plan.clone())?.with_cache(Arc::new(KernelCache::new(CacheConfig::memory_only())));
    Ok((Arc::new(dev), plan))
}

fn input() -> Vec<f32> {
    (0..N).map(|i| i as f32 * 0.5).collect()
}

/// What [`Work`] computes: `y = (2x + 1) * 3`.
fn expected() -> Vec<f32> {
    input().iter().map(|v| (v * 2.0 + 1.0) * 3.0).collect()
}

/// The workload of every scenario: `y = 2x + 1`, then `y *= 3` in place, on one queue,
/// signalling 1 and 2 after each kernel. Keeps every handle, to check them when stale.
struct Work {
    factory: Arc<dyn DynQueueFactory>,
    queue: DynQueue,
    signal: Arc<dyn TimelineSignal>,
    affine: Kernel,
    scale: Kernel,
    x: Buffer,
    y: Buffer,
    /// A plan over `x` and its output, when the scenario built one.
    plan: Option<(ExecutionPlan, Buffer)>,
}

impl Work {
    fn new(dev: &Device) -> Result<Work, Failure> {
        let factory = queues(dev)?;
        Ok(Work {
            queue: factory.create_dyn_compute_queue()?,
            signal: factory.create_dyn_signal()?,
            factory,
            affine: compile(dev, &affine(2.0, 1.0)?, "fault_affine")?,
            scale: compile(dev, &affine_in_place(3.0, 0.0)?, "fault_scale")?,
            x: Buffer::from_slice(dev.allocator(), &input())?,
            y: dev.buffer(kiln_device::kiln_ir::Scalar::F32, N)?,
            plan: None,
        })
    }

    /// Records and submits both kernels (signal values `base + 1`, `base + 2`).
    fn submit(&mut self, base: u64) -> Result<(), Error> {
        let n = [N as i64];
        self.queue
            .exec(&self.affine, &[&self.x, &self.y], &n)
            .signal(&self.signal, base + 1)
            .exec(&self.scale, &[&self.y], &n)
            .signal(&self.signal, base + 2)
            .submit()
    }

    /// Runs the workload to completion and checks its result.
    fn run(dev: &Device) -> Result<Work, Failure> {
        let mut w = Work::new(dev)?;
        w.submit(0)?;
        host_wait(&w.signal, 2, "the workload")?;
        let y = w.y.to_vec::<f32>()?;
        ensure!(y == expected(), "the workload on {} computed {y:?}, expected {:?}", dev.spec(), expected());
        Ok(w)
    }
}

/// Whether `e` was caused by the injected fatal error with native code `code`: the error
/// itself, or a failed signal, queue or lost device carrying it.
fn caused_by(e: &Error, code: i64) -> bool {
    match e.root_cause() {
        Error::DeviceFailed { cause, .. } => caused_by(cause, code),
        Error::Driver { code: Some(c), fatal: true, .. } => *c == code,
        _ => false,
    }
}

/// The checks every lost device must pass before its reset: the root cause is recorded and
/// typed, and new work of every kind is refused with it.
fn refuses_new_work(dev: &Device, code: i64) -> Outcome {
    ensure!(dev.is_lost(), "a fatal error did not mark {} lost", dev.spec());
    let cause = dev.context().lost_cause();
    ensure!(
        cause.as_ref().is_some_and(|c| caused_by(c, code)),
        "the lost device's root cause is {cause:?}, not the injected fault (code {code})"
    );
    let failed = |e: &Error| matches!(e, Error::DeviceFailed { .. }) && caused_by(e, code);
    expect_err("compiling on a lost device", dev.compile(&affine(5.0, 0.0)?, Some("fault_new")), failed)?;
    expect_err("allocating on a lost device", Buffer::from_slice(dev.allocator(), &[1.0f32]), failed)?;
    expect_err("a new queue on a lost device", queues(dev)?.create_dyn_compute_queue(), failed)?;
    Ok(())
}

/// Resets `dev` and checks the recovery contract: `stale` (of generation `g`) gives
/// `DeviceLost` everywhere, its memory returns to the old allocator once dropped, the kernel
/// cache reloads the workload's kernels without compiling, and the workload runs right.
fn reset_and_recover(dev: &Device, plan: &FaultPlan, stale: Work) -> Outcome {
    let g = dev.generation();
    let old_allocator = dev.allocator();
    dev.reset()?;
    ensure!(dev.generation() == g + 1 && !dev.is_lost(), "reset left {:?}", dev.context());
    let lost = |e: &Error| matches!(e, Error::DeviceLost { minted, current, .. } if *minted == g && *current == g + 1);
    let mut w = stale;
    expect_err("a stale buffer's host read", w.y.to_vec::<f32>(), lost)?;
    expect_err("a stale buffer's view", w.x.raw(), lost)?;
    expect_err("a stale kernel's launch", w.affine.launch(&[&w.x, &w.y], &[N as i64]), lost)?;
    expect_err("a stale queue's submit", w.submit(10), lost)?;
    expect_err("a new queue from a stale factory", w.factory.create_dyn_compute_queue(), lost)?;
    expect_err("a stale signal's wait", w.signal.wait(1000, HANG_GUARD), |e| e.class() == ErrorClass::DeviceLost)?;
    if let Some((p, _)) = &mut w.plan {
        expect_err("a stale plan's run", p.run(&[("n", N as i64)]), lost)?;
    }
    drop(w);
    settles(&*old_allocator, "the old generation's memory after every handle was dropped")?;

    let compiles = plan.seen(FaultKind::Compile);
    let w = Work::run(dev)?;
    ensure!(
        plan.seen(FaultKind::Compile) == compiles,
        "the reset device compiled {} kernel(s) again instead of reloading them from the kernel cache",
        plan.seen(FaultKind::Compile) - compiles
    );
    drop(w);
    settles(&*dev.allocator(), "the recovered workload's memory after it dropped its buffers")
}

/// Waits (bounded) until `allocator` has no memory in use: its baseline, as every scenario
/// starts on a fresh device. A queue's worker may drop the last command holding a buffer
/// just after the command's signal failed, hence the wait.
fn settles(allocator: &dyn Allocator, what: &str) -> Outcome {
    let start = Instant::now();
    while allocator.stats().in_use != 0 {
        ensure!(start.elapsed() < HANG_GUARD, "{what}: {} B still in use", allocator.stats().in_use);
        std::thread::yield_now();
    }
    Ok(())
}

/// A compile failure: `compile` returns the typed `Compile` error, the failure is not
/// cached (the next request compiles again and succeeds) and the device stays healthy.
pub fn compile_failure(base: &Arc<Device>) -> Outcome {
    let (dev, plan) = faulty(base)?;
    plan.after(FaultKind::Compile, 1);
    let e =
        expect_err("a compile with an injected failure", dev.compile(&affine(2.0, 1.0)?, Some("fault_affine")), |e| {
            matches!(e, Error::Compile { .. })
        })?;
    ensure!(e.class() == ErrorClass::Compile && !dev.is_lost(), "a compile failure is not fatal: {e:?}");
    let w = Work::run(&dev)?;
    ensure!(
        plan.seen(FaultKind::Compile) == 3,
        "the failed compile was cached ({} compiles)",
        plan.seen(FaultKind::Compile)
    );
    reset_and_recover(&dev, &plan, w)
}

/// An allocation failure: the buffer's first use returns `OutOfMemory` (directly, and as a
/// queue recording error that submits nothing); nothing leaks and the device stays healthy.
pub fn alloc_failure(base: &Arc<Device>) -> Outcome {
    let (dev, plan) = faulty(base)?;
    plan.after(FaultKind::Alloc, 1);
    let oom = |e: &Error| matches!(e, Error::OutOfMemory { requested, .. } if *requested >= N * 4);
    expect_err("an allocation with an injected failure", Buffer::from_slice(dev.allocator(), &input()), oom)?;

    let mut w = Work::new(&dev)?;
    plan.after(FaultKind::Alloc, 1);
    // `y` is allocated when the queue records the launch: the batch is refused whole.
    expect_err("a queue launch whose output cannot be allocated", w.submit(0), oom)?;
    ensure!(w.signal.value() == 0, "a refused batch set its signal to {}", w.signal.value());
    ensure!(!dev.is_lost(), "an allocation failure lost the device: {:?}", dev.context());
    w.submit(0)?;
    host_wait(&w.signal, 2, "the workload after an allocation failure")?;
    ensure!(w.y.to_vec::<f32>()? == expected(), "the workload after an allocation failure computed a wrong result");
    reset_and_recover(&dev, &plan, w)
}

/// A kernel fault: the second launch of a batch fails with a fatal driver error, which marks
/// the device lost; the signal behind it fails with that root cause (never reached), the
/// result cannot be read, new work is refused until the reset.
pub fn kernel_fault(base: &Arc<Device>) -> Outcome {
    let (dev, plan) = faulty(base)?;
    let mut w = Work::run(&dev)?;
    plan.after(FaultKind::Kernel, 2);
    // Submit may report the fault itself (a stream enqueues at submit) or hand it over.
    if let Err(e) = w.submit(2) {
        ensure!(caused_by(&e, KERNEL_FAULT), "submit failed with {e:?}, not the kernel fault");
    }
    let e = expect_err("waiting for the faulted kernel", w.signal.wait(4, HANG_GUARD), |e| caused_by(e, KERNEL_FAULT))?;
    ensure!(e.class() == ErrorClass::DeviceLost, "a kernel fault classifies as {:?}", e.class());
    ensure!(!w.signal.is_reached(4), "the faulted kernel's signal was reached");
    expect_err("reading the faulted kernel's output", w.y.to_vec::<f32>(), |e| caused_by(e, KERNEL_FAULT))?;
    refuses_new_work(&dev, KERNEL_FAULT)?;
    reset_and_recover(&dev, &plan, w)
}

/// A signal timeout: a bounded host wait returns `Timeout` without failing the signal or
/// the device; a later wait sees the work complete. A plan whose wait times out reports
/// `Timeout` and its next run is right.
pub fn signal_timeout(base: &Arc<Device>) -> Outcome {
    let (dev, plan) = faulty(base)?;
    let mut w = Work::new(&dev)?;
    w.submit(0)?;
    plan.after(FaultKind::Timeout, 1);
    let e = expect_err("a wait with an injected timeout", w.signal.wait(2, HANG_GUARD), |e| {
        matches!(e, Error::Timeout { target: 2, .. })
    })?;
    ensure!(e.class() == ErrorClass::Timeout && w.signal.failure().is_none(), "a timeout failed the signal: {e:?}");
    host_wait(&w.signal, 2, "the workload after a timed-out wait")?;
    ensure!(w.y.to_vec::<f32>()? == expected() && !dev.is_lost(), "the workload after a timeout is wrong");

    let (mut p, out) = plan_workload(&dev, &w.x)?;
    plan.after(FaultKind::Timeout, 1);
    expect_err("a plan run whose wait times out", p.run(&[("n", N as i64)]), |e| e.class() == ErrorClass::Timeout)?;
    run_plan(&mut p, &out, "a plan run after a timed-out one")?;
    w.plan = Some((p, out));
    reset_and_recover(&dev, &plan, w)
}

/// A device loss while a plan runs: the run fails with the typed root cause, the device is
/// lost and refuses new work (the plan too); after the reset the old plan gives
/// `DeviceLost` and a plan rebuilt on the device (kernels from the cache) runs right.
pub fn device_loss(base: &Arc<Device>) -> Outcome {
    let (dev, plan) = faulty(base)?;
    let mut w = Work::run(&dev)?;
    let (mut p, out) = plan_workload(&dev, &w.x)?;
    run_plan(&mut p, &out, "a plan run before the loss")?;
    plan.after(FaultKind::Loss, 1);
    let n = [("n", N as i64)];
    let e = expect_err("a plan run on a device lost during it", p.run(&n), |e| caused_by(e, DEVICE_LOSS))?;
    ensure!(e.class() == ErrorClass::DeviceLost, "a device loss classifies as {:?}", e.class());
    expect_err("reading a lost plan's output", out.to_vec::<f32>(), |e| caused_by(e, DEVICE_LOSS))?;
    refuses_new_work(&dev, DEVICE_LOSS)?;
    expect_err("a plan run on a lost device", p.run(&n), |e| caused_by(e, DEVICE_LOSS))?;
    w.plan = Some((p, out));
    reset_and_recover(&dev, &plan, w)?;

    let compiles = plan.seen(FaultKind::Compile);
    let x = Buffer::from_slice(dev.allocator(), &input())?;
    let (mut rebuilt, out) = plan_workload(&dev, &x)?;
    run_plan(&mut rebuilt, &out, "the plan rebuilt after the reset")?;
    ensure!(plan.seen(FaultKind::Compile) == compiles, "rebuilding the plan compiled its kernels again");
    Ok(())
}

/// A rank whose kernel faults before its all_reduce: its peer, waiting in the collective
/// with a channel timeout far beyond the test's, fails at once with a channel error naming
/// the rank that left; the faulted rank gets the kernel fault; after the reset, a new channel
/// all-reduces right.
pub fn collective_peer_fault(base: &Arc<Device>) -> Outcome {
    use kiln_device::{Channel, LocalChannel, ReduceOp};
    let (dev, plan) = faulty(base)?;
    let ends = LocalChannel::world_with_timeout(2, std::time::Duration::from_secs(3600))?;
    let ends: Vec<Arc<dyn Channel>> = ends.into_iter().map(|e| e as Arc<dyn Channel>).collect();
    let healthy_x = Buffer::from_slice(base.allocator(), &input())?;
    let mut healthy = ExecutionPlan::with_options(base, PlanOptions { timeout: HANG_GUARD, ..PlanOptions::default() })?;
    healthy.all_reduce(&ends[0], &healthy_x, &healthy_x, ReduceOp::Sum)?;
    let mut faulted = {
        let x = Buffer::from_slice(dev.allocator(), &input())?;
        let t = dev.buffer(kiln_device::kiln_ir::Scalar::F32, N)?;
        let options = PlanOptions { timeout: HANG_GUARD, ..PlanOptions::default() };
        let mut p = ExecutionPlan::with_options(&dev, options)?;
        p.exec(&compile(&dev, &affine(2.0, 1.0)?, "fault_affine")?, &[&x, &t], &[("n", N as i64)])?;
        p.all_reduce(&ends[1], &t, &t, ReduceOp::Sum)?;
        p
    };
    plan.after(FaultKind::Kernel, 1);
    let start = Instant::now();
    let waiting = healthy.submit(&[])?;
    expect_err("the rank whose kernel faults", faulted.run(&[]), |e| caused_by(e, KERNEL_FAULT))?;
    let e = expect_err("the peer of a rank that faulted", waiting.wait(), |e| {
        matches!(e.root_cause(), Error::Channel { .. })
    })?;
    ensure!(e.to_string().contains("rank 1 left"), "the peer's error does not name the rank that left: {e}");
    ensure!(start.elapsed() < HANG_GUARD, "the peer waited {:?} for a rank that had left", start.elapsed());
    dev.reset()?;
    let fresh = LocalChannel::world(2)?;
    let t = dev.buffer(kiln_device::kiln_ir::Scalar::F32, N).and_then(|b| {
        b.copy_from_slice(&input())?;
        Ok(b)
    })?;
    let mut plans = [ExecutionPlan::new(base)?, ExecutionPlan::new(&dev)?];
    let xs = [Buffer::from_slice(base.allocator(), &input())?, t];
    for ((p, end), x) in plans.iter_mut().zip(fresh).zip(&xs) {
        let end: Arc<dyn Channel> = end;
        p.all_reduce(&end, x, x, ReduceOp::Sum)?;
    }
    let [a, b] = &mut plans;
    let run = a.submit(&[])?;
    b.run(&[])?;
    run.wait()?;
    let want: Vec<f32> = input().iter().map(|v| v * 2.0).collect();
    for x in &xs {
        ensure!(x.to_vec::<f32>()? == want, "all_reduce after the reset gave {:?}", x.to_vec::<f32>()?);
    }
    Ok(())
}

/// A plan over `x` on two compute queues: `t = 2x + 1`, then `out = 3t`, and an independent
/// `u = 3x`; returns the plan and `out` (= [`expected`]). Every node writes a pure function
/// of its inputs, so a run that timed out and still completes late rewrites the same values.
fn plan_workload(dev: &Device, x: &Buffer) -> Result<(ExecutionPlan, Buffer), Failure> {
    let options = PlanOptions { compute_queues: 2, timeout: HANG_GUARD, ..PlanOptions::default() };
    let mut p = ExecutionPlan::with_options(dev, options)?;
    let f32s = || dev.buffer(kiln_device::kiln_ir::Scalar::F32, N);
    let (t, out, u) = (f32s()?, f32s()?, f32s()?);
    let (affine21, triple) =
        (compile(dev, &affine(2.0, 1.0)?, "fault_affine")?, compile(dev, &affine(3.0, 0.0)?, "fault_triple")?);
    let n = [("n", N as i64)];
    p.exec(&affine21, &[x, &t], &n)?;
    p.exec(&triple, &[&t, &out], &n)?;
    p.exec(&triple, &[x, &u], &n)?;
    Ok((p, out))
}

fn run_plan(p: &mut ExecutionPlan, out: &Buffer, what: &str) -> Outcome {
    p.run(&[("n", N as i64)]).map_err(|e| Failure::Violation(format!("{what}: {e}")))?;
    let got = out.to_vec::<f32>()?;
    ensure!(got == expected(), "{what} computed {got:?}, expected {:?}", expected());
    Ok(())
}
