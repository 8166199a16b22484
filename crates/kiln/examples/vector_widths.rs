//! The bench's add, sum and softmax kernels at every vector width on one device, in one run:
//! `cargo run --release -p kiln --example vector_widths [-- DEVICE]` (default `CPU`). Widths
//! are interleaved rep by rep, so a noisy machine disturbs them alike; medians in GB/s.

use std::time::Instant;

use kiln::bench::kernels::{self, WIDTHS};
use kiln_device::{Buffer, Kernel};

/// One run of an entry at one width: its kernels, each with its buffers.
type Launches<'a> = Vec<(Kernel, Vec<&'a Buffer>)>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    kiln_backends::register_all();
    let name = std::env::args().nth(1).unwrap_or_else(|| "CPU".into());
    let dev = kiln_device::open_device(&name)?;
    let axis = if name == "CPU" { "gidx0" } else { "idx0" };
    println!("{name}: {}", dev.description());
    println!("the bench picks width {}", kernels::width_for(dev.properties().f32_lanes()));
    // As the bench runs them on a CPU with at most 32 MiB of cache: add (64 MiB out) stores
    // non-temporally, softmax (16 MiB) plainly.
    let (n, chunks, rows, cols) = (1usize << 24, 64, 4096, 1024);
    let buf = |len: usize| Buffer::from_slice(dev.allocator(), &vec![1f32; len]);
    let (a, b, c, partial, out) = (buf(n)?, buf(n)?, buf(n)?, buf(chunks)?, buf(1)?);
    let compile = |sink| dev.compile(&sink, None);
    let (mut add, mut sum, mut softmax): (Vec<Launches>, Vec<Launches>, Vec<Launches>) = Default::default();
    for w in WIDTHS {
        add.push(vec![(compile(kernels::add_f32(axis, n, w, true)?)?, vec![&a, &b, &c])]);
        sum.push(vec![
            (compile(kernels::sum_partials_f32(axis, n, chunks, w)?)?, vec![&a, &partial]),
            (compile(kernels::sum_finish_f32(chunks)?)?, vec![&partial, &out]),
        ]);
        softmax.push(vec![(compile(kernels::softmax_f32(axis, rows, cols, w, false)?)?, vec![&a, &c])]);
    }
    // (entry, GB moved per run, the launches of each width)
    let entries = [
        ("add_f32_16m", 12.0 * n as f64 / 1e9, add),
        ("sum_f32_16m", 4.0 * n as f64 / 1e9, sum),
        ("softmax_f32_4096x1024", 8.0 * (rows * cols) as f64 / 1e9, softmax),
    ];
    for (entry, gb, per_width) in &entries {
        let mut times = vec![Vec::new(); WIDTHS.len()];
        for rep in 0..12 {
            for (t, launches) in times.iter_mut().zip(per_width) {
                let start = Instant::now();
                for (k, bufs) in launches {
                    k.launch(bufs, &[])?;
                }
                if rep > 0 {
                    t.push(start.elapsed().as_secs_f64()); // rep 0 warms up
                }
            }
        }
        let medians: Vec<String> = WIDTHS
            .iter()
            .zip(&mut times)
            .map(|(w, t)| {
                t.sort_by(f64::total_cmp);
                format!("x{w} {:7.2}", gb / t[t.len() / 2])
            })
            .collect();
        println!("{entry:<24} GB/s  {}", medians.join("  "));
    }
    Ok(())
}
