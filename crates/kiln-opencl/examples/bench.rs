//! OpenCL backend figures (printed, never asserted): add and sum bandwidth over 16M f32,
//! and the per-call cost of a tiny launch, synchronous and through a queue.
//!
//! `POCL_CACHE_DIR=/tmp/pocl-cache cargo run --release -p kiln-opencl --example bench [OPENCL:n]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_device::kiln_ir::{DeviceSpec, KernelBuilder, Scalar, Val};
use kiln_device::{Buffer, Device, HardwareQueue, Kernel, QueueFactory, Result, TimelineSignal};

const N: usize = 16 << 20;
/// Partial sums of the reduction: work item i sums the i-th run of N / PARTS consecutive
/// floats (on PoCL a work item runs its loop alone, so a contiguous run streams; a strided
/// layout, i + PARTS·j, is ~30x slower there).
const PARTS: usize = 4096;

/// Runs `f` until `min` has passed (at least 3 times) and returns the fastest call.
fn best(min: Duration, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    f()?; // warm-up: first-touch allocation, program load
    let (start, mut best, mut runs) = (Instant::now(), Duration::MAX, 0);
    while runs < 3 || start.elapsed() < min {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
        runs += 1;
    }
    Ok(best)
}

fn add_kernel(dev: &Device) -> Result<Kernel> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 1 << 30);
    let (a, b, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n), k.param(2, Scalar::F32, &n));
    let i = k.global(0, &n);
    k.store(&c.at(&i), &(a.at(&i).load() + b.at(&i).load()));
    dev.compile(&k.finish()?, Some("bench_add"))
}

fn sum_kernel(dev: &Device) -> Result<Kernel> {
    let chunk = (N / PARTS) as i64;
    let mut k = KernelBuilder::new();
    let a = k.param(0, Scalar::F32, N as i64);
    let out = k.param(1, Scalar::F32, PARTS as i64);
    let i = k.global(0, PARTS as i64);
    let j = k.range(chunk);
    let acc = k.acc(&Val::f32(0.0), &[&j]);
    let total = acc.update(&(acc.get() + a.at(&(&i * chunk + &j)).load()));
    k.store(&out.at(&i), &total);
    dev.compile(&k.finish()?, Some("bench_sum"))
}

fn main() -> Result<()> {
    let spec: DeviceSpec = std::env::args().nth(1).unwrap_or_else(|| "OPENCL:0".into()).parse()?;
    let dev = kiln_opencl::open(&spec)?;
    println!("{spec}: {}", dev.description());
    let min = Duration::from_secs(2);

    let ones = vec![1.0f32; N];
    let (a, b) = (Buffer::from_slice(dev.allocator(), &ones)?, Buffer::from_slice(dev.allocator(), &ones)?);
    let c = dev.buffer(Scalar::F32, N)?;
    let add = add_kernel(&dev)?;
    let t = best(min, || add.launch(&[&a, &b, &c], &[N as i64]))?;
    let bytes = 3.0 * (N * 4) as f64;
    println!("add  16M f32: {:8.3} ms  {:6.2} GB/s (2 reads + 1 write)", ms(t), bytes / t.as_secs_f64() / 1e9);

    let partial = dev.buffer(Scalar::F32, PARTS)?;
    let sum = sum_kernel(&dev)?;
    let t = best(min, || sum.launch(&[&a, &partial], &[]))?;
    let total: f32 = partial.to_vec::<f32>()?.iter().sum();
    println!(
        "sum  16M f32: {:8.3} ms  {:6.2} GB/s ({PARTS} partial sums, total {total})",
        ms(t),
        (N * 4) as f64 / t.as_secs_f64() / 1e9
    );

    // Launch overhead: one work item, so the figure is all dispatch.
    let (x, y, z) = (dev.buffer(Scalar::F32, 1)?, dev.buffer(Scalar::F32, 1)?, dev.buffer(Scalar::F32, 1)?);
    x.copy_from_slice(&[1.0f32])?;
    y.copy_from_slice(&[2.0f32])?;
    let calls = 1000;
    let t = best(min, || (0..calls).try_for_each(|_| add.launch(&[&x, &y, &z], &[1])))?;
    println!("launch (synchronous execute):  {:7.2} us/call", t.as_secs_f64() * 1e6 / calls as f64);

    let factory = kiln_opencl::queue_factory(kiln_opencl::cl_device(&spec)?);
    let mut q = factory.create_compute_queue()?;
    let signal = factory.create_signal()?;
    let mut value = 0;
    let t = best(min, || {
        for _ in 0..calls {
            q.exec(&add, &[&x, &y, &z], &[1]);
        }
        value += 1;
        q.signal(&signal, value).submit()?;
        signal.wait(value, Duration::from_secs(60))
    })?;
    println!("launch (queue, {calls} per submit): {:7.2} us/call", t.as_secs_f64() * 1e6 / calls as f64);
    let _keep: Arc<Device> = dev;
    Ok(())
}

fn ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1e3
}
