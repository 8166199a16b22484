//! Records a plan with two independent branches that join, runs it profiled, writes the
//! Chrome trace (open it in ui.perfetto.dev or chrome://tracing) and prints how much the
//! branches' slices overlap in time.
//!
//! `cargo run --release -p kiln --example overlap_trace -- [trace.json]`

use std::error::Error;

use kiln_device::Buffer;
use kiln_device::kiln_ir::{DeviceSpec, KernelBuilder, Scalar};
use kiln_runtime::{ExecutionPlan, PlanOptions};

fn main() -> Result<(), Box<dyn Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "overlap-trace.json".into());
    let device = kiln_cpu::open(&DeviceSpec::new("CPU", 0))?;
    let spin = device.compile(&kiln::bench::plan::spin_kernel(1)?, Some("spin"))?;
    let mut k = KernelBuilder::new();
    let (a, b, c) = (k.param(0, Scalar::F32, 1usize), k.param(1, Scalar::F32, 1usize), k.param(2, Scalar::F32, 1usize));
    let i = k.global(0, 1usize);
    k.store(&c.at(&i), &(a.at(&i).load() + b.at(&i).load()));
    let join = device.compile(&k.finish()?, Some("join"))?;

    let (xa, xb) =
        (Buffer::from_slice(device.allocator(), &[0.5f32])?, Buffer::from_slice(device.allocator(), &[0.25f32])?);
    let (ya, yb, z) = (device.buffer(Scalar::F32, 1)?, device.buffer(Scalar::F32, 1)?, device.buffer(Scalar::F32, 1)?);
    let mut plan = ExecutionPlan::with_options(&device, PlanOptions { compute_queues: 2, ..PlanOptions::default() })?;
    let iters = [("iters", 20_000_000i64)];
    plan.exec(&spin, &[&xa, &ya], &iters)?; // branch A
    plan.exec(&spin, &[&xb, &yb], &iters)?; // branch B: independent of A
    plan.exec(&join, &[&ya, &yb, &z], &[])?; // reads both: waits for both queues
    plan.run(&[])?;
    let profile = plan.run_profiled(&[])?;
    profile.write_chrome_trace(&path)?;

    for e in &profile.events {
        println!("{:>6} on queue {}: {:>9.3} ms .. {:>9.3} ms", e.name, e.queue, ms(e.start), ms(e.end));
    }
    let spins: Vec<_> = profile.events.iter().filter(|e| e.name == "spin").collect();
    if let [a, b] = spins.as_slice() {
        let overlap = a.end.min(b.end).saturating_sub(a.start.max(b.start));
        let shorter = (a.end - a.start).min(b.end - b.start);
        println!(
            "branches on queues {} and {} overlap for {:.3} ms ({:.0}% of the shorter one)",
            a.queue,
            b.queue,
            ms(overlap),
            100.0 * overlap.as_secs_f64() / shorter.as_secs_f64().max(1e-12)
        );
    }
    println!("z = {} (ya + yb); trace written to {path}", z.to_vec::<f32>()?[0]);
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
