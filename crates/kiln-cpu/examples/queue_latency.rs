//! Measures CPU queue and signal latency (prints figures; asserts nothing).
//!
//! `cargo run --release -p kiln-cpu --example queue_latency`
//!
//! - queue round trip: host records `exec(tiny kernel) + signal`, submits, and waits on the
//!   signal; one sample per batch. With a no-op program this is the queue's own overhead;
//!   with the real C kernel (when a C compiler is present) it includes the launch.
//! - signal wake: one thread sets a signal another thread is waiting on; the sample is the
//!   time from just before `set` to the waiter returning, for a waiter still spinning and
//!   for one that has parked.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use kiln_cpu::{CpuAllocator, CpuQueueFactory};
use kiln_device::kiln_ir::{KernelBuilder, Scalar, UOp};
use kiln_device::{
    Buffer, CpuTimelineSignal, HardwareQueue, Kernel, LaunchDims, Program, ProgramSpec, QueueFactory, RawView, Result,
    TimelineSignal,
};

const TIMEOUT: Duration = Duration::from_secs(10);
const IDLE: Duration = Duration::from_micros(200);

/// A program that does nothing: measures the queue, not the kernel.
struct Noop;

impl Program for Noop {
    unsafe fn execute(&self, _bufs: &[RawView], _vals: &[i64], _launch: &LaunchDims) -> Result<()> {
        Ok(())
    }

    fn name(&self) -> &str {
        "noop"
    }
}

fn add_one_sink() -> Result<Arc<UOp>> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 1 << 20);
    let a = k.param(0, Scalar::F32, &n);
    let c = k.param(1, Scalar::F32, &n);
    let i = k.global(0, &n);
    k.store(&c.at(&i), &(a.at(&i).load() + 1.0));
    Ok(k.finish()?)
}

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let q = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    println!(
        "{name:<44} median {:>7.2} µs   p10 {:>7.2}   p90 {:>7.2}   p99 {:>8.2}   (n = {})",
        q(0.5),
        q(0.1),
        q(0.9),
        q(0.99),
        samples.len()
    );
}

/// `idle`: a pause before each batch, long enough for the worker and the host to park.
fn queue_round_trip(
    name: &str,
    kernel: &Kernel,
    bufs: &[&Buffer],
    vals: &[i64],
    iters: u64,
    idle: Duration,
) -> Result<()> {
    let factory = CpuQueueFactory::new();
    let mut q = factory.create_compute_queue()?;
    let s = factory.create_signal()?;
    let mut samples = Vec::with_capacity(iters as usize);
    let warmup = 1000.min(iters);
    for i in 1..=iters + warmup {
        if !idle.is_zero() {
            thread::sleep(idle);
        }
        let t0 = Instant::now();
        q.exec(kernel, bufs, vals).signal(&s, i).submit()?;
        s.wait(i, TIMEOUT)?;
        if i > warmup {
            samples.push(t0.elapsed());
        }
    }
    summary(name, samples);
    Ok(())
}

fn signal_only_round_trip(iters: u64) -> Result<()> {
    let factory = CpuQueueFactory::new();
    let mut q = factory.create_compute_queue()?;
    let s = factory.create_signal()?;
    let mut samples = Vec::with_capacity(iters as usize);
    for i in 1..=iters + 1000 {
        let t0 = Instant::now();
        q.signal(&s, i).submit()?;
        s.wait(i, TIMEOUT)?;
        if i > 1000 {
            samples.push(t0.elapsed());
        }
    }
    summary("queue round trip, signal only", samples);
    Ok(())
}

/// The setter stamps the time just before `set`; the waiter measures when its wait returns.
/// `pause` is how long the setter lets the waiter wait first (0: still spinning).
fn signal_wake(name: &str, iters: u64, pause: Duration) -> Result<()> {
    let (ping, ready) = (Arc::new(CpuTimelineSignal::new()), Arc::new(CpuTimelineSignal::new()));
    let base = Instant::now();
    let stamp = Arc::new(AtomicU64::new(0));
    let waiter = {
        let (ping, ready, stamp) = (ping.clone(), ready.clone(), stamp.clone());
        thread::spawn(move || -> Result<Vec<Duration>> {
            let mut samples = Vec::with_capacity(iters as usize);
            for i in 1..=iters {
                ready.set(i);
                ping.wait(i, TIMEOUT)?;
                let now = base.elapsed().as_nanos() as u64;
                samples.push(Duration::from_nanos(now.saturating_sub(stamp.load(Ordering::Acquire))));
            }
            Ok(samples)
        })
    };
    for i in 1..=iters {
        ready.wait(i, TIMEOUT)?;
        if !pause.is_zero() {
            thread::sleep(pause);
        }
        stamp.store(base.elapsed().as_nanos() as u64, Ordering::Release);
        ping.set(i);
    }
    let samples = waiter.join().map_err(|_| kiln_device::Error::Invalid("waiter thread panicked".into()))??;
    summary(name, samples);
    Ok(())
}

fn main() -> Result<()> {
    println!("kiln CPU queue latency ({} hardware threads)", thread::available_parallelism().map_or(1, |n| n.get()));
    let sink = add_one_sink()?;
    let spec = Arc::new(ProgramSpec::from_sink("add_one", String::new(), kiln_cpu::CPU.clone(), &sink)?);
    let noop = Kernel::new(spec, Arc::new(Noop));
    let alloc = Arc::new(CpuAllocator::new());
    let (a, b) = (Buffer::from_slice(alloc.clone(), &[1.0f32; 16])?, Buffer::new(alloc, Scalar::F32, 16)?);

    signal_only_round_trip(20_000)?;
    queue_round_trip(
        "queue round trip, exec(no-op program) + signal",
        &noop,
        &[&a, &b],
        &[16],
        20_000,
        Duration::ZERO,
    )?;
    queue_round_trip("  same, after 200 µs idle (worker parked)", &noop, &[&a, &b], &[16], 2_000, IDLE)?;
    match kiln_cpu::open(&kiln_cpu::CPU).and_then(|dev| {
        let kernel = dev.compile(&sink, Some("add_one"))?;
        let (x, y) = (Buffer::from_slice(dev.allocator(), &[1.0f32; 16])?, dev.buffer(Scalar::F32, 16)?);
        Ok((kernel, x, y))
    }) {
        Ok((kernel, x, y)) => {
            queue_round_trip(
                "queue round trip, exec(C add_one, n=16) + signal",
                &kernel,
                &[&x, &y],
                &[16],
                20_000,
                Duration::ZERO,
            )?;
            queue_round_trip("  same, after 200 µs idle (worker parked)", &kernel, &[&x, &y], &[16], 2_000, IDLE)?;
            println!("  (check: y[0] = {})", y.to_vec::<f32>()?[0]);
        }
        Err(e) => println!("queue round trip with a real C kernel skipped: {e}"),
    }
    signal_wake("signal wake, ping-pong (waiter spinning)", 20_000, Duration::ZERO)?;
    signal_wake("signal wake, waiter parked (set after 200 µs)", 2_000, IDLE)?;
    Ok(())
}
