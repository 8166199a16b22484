//! Prints how long a small kernel takes to compile and how much a tiny launch costs.
//!
//! `cargo run --release -p kiln-cpu --example launch_overhead`

use std::time::Instant;

use kiln_cpu::{CCompiler, CpuProgram, Pool, cpu_renderer};
use kiln_device::kiln_ir::{KernelBuilder, Scalar};
use kiln_device::{Buffer, Compiler, Kernel, Renderer};

fn main() -> Result<(), kiln_device::Error> {
    let mut k = KernelBuilder::new();
    let n = k.var("n", 1, 1 << 24);
    let (a, b, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n), k.param(2, Scalar::F32, &n));
    let i = k.global(0, &n);
    let sum = a.at(&i).load() + b.at(&i).load();
    k.store(&c.at(&i), &sum);
    let sink = k.finish()?;

    let cc = CCompiler::detect()?;
    println!("compiler: {} ({})", cc.path().display(), cc.version());
    let mut best = f64::MAX;
    for round in 0..5 {
        let t = Instant::now();
        let spec = cpu_renderer().render(&sink, Some(&format!("add{round}")))?;
        let t_render = t.elapsed();
        let compiled = cc.compile(&spec)?;
        let t_compile = t.elapsed();
        let _program = CpuProgram::load(&compiled)?;
        let t_load = t.elapsed();
        best = best.min(t_load.as_secs_f64());
        println!(
            "render {:>7.1} us  compile {:>6.1} ms  load {:>6.1} us  total {:>6.1} ms",
            t_render.as_secs_f64() * 1e6,
            (t_compile - t_render).as_secs_f64() * 1e3,
            (t_load - t_compile).as_secs_f64() * 1e6,
            t_load.as_secs_f64() * 1e3
        );
    }
    println!("best render+compile+load: {:.1} ms", best * 1e3);

    let device = kiln_cpu::open(&kiln_cpu::CPU)?;
    println!("device: {} | pool threads: {}", device.description(), Pool::global().threads());
    let kernel: Kernel = device.compile(&sink, Some("add"))?;
    for len in [16usize, 1 << 20] {
        let data = vec![1.0f32; len];
        let x = Buffer::from_slice(device.allocator(), &data)?;
        let y = Buffer::from_slice(device.allocator(), &data)?;
        let z = device.buffer(Scalar::F32, len)?;
        let vals = [len as i64];
        let iters = if len < 1000 { 200_000 } else { 200 };
        for _ in 0..iters / 10 {
            kernel.launch(&[&x, &y, &z], &vals)?;
        }
        let t = Instant::now();
        for _ in 0..iters {
            kernel.launch(&[&x, &y, &z], &vals)?;
        }
        let per_launch = t.elapsed().as_secs_f64() / iters as f64;
        let (views, dims) = kernel.check(&[&x, &y, &z], &vals)?;
        let t = Instant::now();
        for _ in 0..iters {
            // SAFETY: `check` validated the views and dims; the buffers outlive the loop.
            unsafe { kernel.execute(&views, &vals, &dims)? };
        }
        let per_execute = t.elapsed().as_secs_f64() / iters as f64;
        println!(
            "n = {len:>8}: Kernel::launch {:>8.2} us   Program::execute {:>8.2} us",
            per_launch * 1e6,
            per_execute * 1e6
        );
    }
    Ok(())
}
