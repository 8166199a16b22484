//! Plan replay measurements on the CPU backend (prints only):
//! `cargo run --release -p kiln --example plan_bench [kernels] [iterations]`.

use kiln::bench::plan as bench;
use kiln_device::Result;
use kiln_device::kiln_ir::DeviceSpec;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let kernels: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let iterations: i64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let cpu = kiln_cpu::open(&DeviceSpec::new("CPU", 0))?;
    let device = cpu;
    println!("{}", device.description());
    println!("{}", bench::replay_overhead(&device, kernels, 30)?);
    println!("{}", bench::replay_overhead_unfused(&device, kernels, 30)?);
    println!("{}", bench::parallel_branches(&device, 1, iterations * 32, 5)?);
    println!("{}", bench::parallel_branches(&device, 64, iterations, 5)?);
    Ok(())
}
