//! Micro-benchmarks of CPU dispatch: a tiny kernel launched on the calling thread, and the
//! same kernel through a queue (record → submit → worker → signal → host wait). Each
//! benchmark checks the kernel's result once before it is timed.
//!
//! `cargo bench -p kiln-cpu --bench dispatch`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use kiln_device::kiln_ir::{KernelBuilder, Scalar};
use kiln_device::{Buffer, Kernel};

fn increment(dev: &kiln_device::Device) -> Kernel {
    let mut k = KernelBuilder::new();
    let x = k.param(0, Scalar::F32, 16usize);
    let i = k.global(0, 16usize);
    let v = x.at(&i).load() + 1.0f32;
    k.store(&x.at(&i), &v);
    dev.compile(&k.finish().expect("kernel"), Some("increment16")).expect("compile")
}

fn dispatch(c: &mut Criterion) {
    let dev = kiln_cpu::open(&kiln_cpu::CPU).expect("CPU device");
    let kernel = increment(&dev);
    let x = Buffer::from_slice(dev.allocator(), &[0.0f32; 16]).expect("buffer");
    kernel.launch(&[&x], &[]).expect("launch");
    assert_eq!(x.to_vec::<f32>().expect("read"), [1.0; 16], "the kernel must compute x + 1");

    let mut g = c.benchmark_group("dispatch");
    g.bench_function("launch_tiny_kernel", |b| b.iter(|| kernel.launch(black_box(&[&x]), &[]).expect("launch")));

    let queues = dev.queues().expect("CPU queues");
    let mut q = queues.create_dyn_compute_queue().expect("queue");
    let s = queues.create_dyn_signal().expect("signal");
    let mut value = 0u64;
    g.bench_function("queue_roundtrip_tiny_kernel", |b| {
        b.iter(|| {
            value += 1;
            q.exec(&kernel, &[&x], &[]).signal(&s, value);
            q.submit().expect("submit");
            s.wait(value, Duration::from_secs(10)).expect("wait");
        })
    });
    g.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
