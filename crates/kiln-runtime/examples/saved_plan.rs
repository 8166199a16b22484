//! Saved plans, measured: records the sample model (`kiln_runtime::saved::SampleMlp`), saves it,
//! and loads it on each device in fresh processes, first with an empty kernel cache, then with
//! the cache that load filled (a second start), and again in one process (the memory cache);
//! medians of three processes each and of five loads in process.
//! Every load's output is checked against the host reference before a figure is printed.
//!
//! ```text
//! cargo run --release -p kiln-runtime --example saved_plan -- [--out FILE.kplan] [--shape B,I,H,O] [DEVICE]...
//! ```
//!
//! `--out` keeps the plan file (for `kiln run-plan`); the default shape is 64,784,1024,10 and the
//! default device `CPU`. The child mode (`--load FILE DEVICE B,I,H,O`) is what the parent runs.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kiln_device::kiln_ir::Scalar;
use kiln_runtime::saved::{LoadedPlan, MlpShape, SampleMlp, SavedPlan, TensorRef};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn parse_shape(text: &str) -> Result<MlpShape> {
    let v: Vec<usize> = text.split(',').map(str::parse).collect::<std::result::Result<_, _>>()?;
    let [max_batch, inputs, hidden, outputs] = v[..] else { return Err(format!("--shape B,I,H,O, got {text}").into()) };
    Ok(MlpShape { max_batch, inputs, hidden, outputs })
}

fn shape_text(s: MlpShape) -> String {
    format!("{},{},{},{}", s.max_batch, s.inputs, s.hidden, s.outputs)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Loads `path` on `device`, runs it on a full batch, checks the output against the host, and
/// returns (load, first run).
fn load_and_check(path: &Path, device: &str, shape: MlpShape) -> Result<(Duration, Duration)> {
    let device = kiln_device::open_device(device)?;
    let start = Instant::now();
    let mut plan = LoadedPlan::load(path, &device)?;
    let load = start.elapsed();
    let rows = shape.max_batch;
    let x: Vec<f32> = (0..rows * shape.inputs).map(|i| ((i * 7) % 19) as f32 / 8.0 - 1.0).collect();
    let data: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let start = Instant::now();
    let out = plan.run(&[("x", TensorRef { dtype: Scalar::F32, shape: &[rows, shape.inputs], data: &data })])?;
    let run = start.elapsed();
    let want = shape.reference(&x);
    let got: Vec<f32> = out[0].data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    if got.len() != want.len() || got.iter().zip(&want).any(|(g, w)| (g - w).abs() > 1e-4 * w.abs().max(1.0)) {
        return Err(format!("{device:?}: the loaded plan's output differs from the host reference").into());
    }
    Ok((load, run))
}

/// The child: one load in a fresh process, its figures on stdout.
fn child(args: &[String]) -> Result<()> {
    let [path, device, shape] = args else { return Err("--load FILE DEVICE B,I,H,O".into()) };
    kiln_backends::register_all();
    let (load, run) = load_and_check(Path::new(path), device, parse_shape(shape)?)?;
    println!("{} {}", ms(load), ms(run));
    Ok(())
}

/// Runs the child with `KILN_CACHE_DIR=cache`; returns (load, run, process wall time).
fn in_child(path: &Path, device: &str, shape: MlpShape, cache: &Path) -> Result<(f64, f64, f64)> {
    let start = Instant::now();
    let out = Command::new(std::env::current_exe()?)
        .args(["--load", &path.display().to_string(), device, &shape_text(shape)])
        .env("KILN_CACHE_DIR", cache)
        .env_remove("KILN_CACHE")
        .output()?;
    let wall = ms(start.elapsed());
    if !out.status.success() {
        return Err(format!("the child failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text.split_whitespace().map(str::parse).collect::<std::result::Result<_, _>>()?;
    let [load, run] = v[..] else { return Err(format!("the child printed {text}").into()) };
    Ok((load, run, wall))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median of each of the three figures.
fn median3(v: &[(f64, f64, f64)]) -> (f64, f64, f64) {
    let pick = |f: fn(&(f64, f64, f64)) -> f64| median(&mut v.iter().map(f).collect::<Vec<_>>());
    (pick(|t| t.0), pick(|t| t.1), pick(|t| t.2))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--load") {
        return child(&args[1..]);
    }
    let (mut out, mut shape, mut devices) =
        (None, MlpShape { max_batch: 64, inputs: 784, hidden: 1024, outputs: 10 }, Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = it.next().map(PathBuf::from),
            "--shape" => shape = parse_shape(it.next().ok_or("--shape B,I,H,O")?)?,
            d => devices.push(d.to_string()),
        }
    }
    if devices.is_empty() {
        devices.push("CPU".into());
    }
    kiln_backends::register_all();
    let scratch = tempfile::tempdir()?;
    let path = out.unwrap_or_else(|| scratch.path().join("mlp.kplan"));

    let cpu = kiln_device::open_device("CPU")?;
    let model = SampleMlp::record(&cpu, shape, shape.max_batch)?;
    let start = Instant::now();
    let saved = SavedPlan::from_plan(&model.plan, &model.interface)?;
    saved.write(&path)?;
    let save = start.elapsed();
    println!(
        "sample MLP {} (batch, inputs, hidden, outputs): {} kernels, saved in {:.2} ms to {} ({} bytes, {} of them constants)",
        shape_text(shape),
        saved.kernel_count(),
        ms(save),
        path.display(),
        saved.file_len(),
        saved.constant_bytes()
    );
    for device in &devices {
        // Three fresh processes with an empty kernel cache, each followed by one that finds the
        // cache it filled; medians of each.
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let cache = tempfile::tempdir()?;
            cold.push(in_child(&path, device, shape, cache.path())?);
            warm.push(in_child(&path, device, shape, cache.path())?);
        }
        // In this process: the first load fills the memory cache, the next ones are served by it.
        load_and_check(&path, device, shape)?;
        let mut memory: Vec<f64> =
            (0..5).map(|_| load_and_check(&path, device, shape).map(|(l, _)| ms(l))).collect::<Result<_>>()?;
        let (c, w) = (median3(&cold), median3(&warm));
        println!(
            "{device}: load {:.2} ms with an empty kernel cache (first run {:.2} ms, process {:.0} ms), \
             {:.2} ms with the disk cache (first run {:.2} ms, process {:.0} ms), {:.2} ms with the memory cache",
            c.0,
            c.1,
            c.2,
            w.0,
            w.1,
            w.2,
            median(&mut memory)
        );
    }
    Ok(())
}
