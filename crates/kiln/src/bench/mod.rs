//! `kiln bench`: kiln's main job. Every entry first checks its output against a reference
//! computed on the host, then times repetitions and reports median, min and max, next to a
//! baseline measured in the same run where one exists.
//!
//! Ratios are always "higher is better": kiln / baseline for throughputs, baseline / kiln
//! for times. Nothing here is hard-coded: each figure comes from this run's clocks.

#[cfg(feature = "cuda")]
mod cuda;
mod gpu;
pub mod kernels;
pub mod openblas;

use std::fmt::Write as _;
use std::io::{IsTerminal as _, Write as _};
use std::process::Command as Process;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::builder::PossibleValuesParser;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_device::kiln_ir::{DeviceSpec, Op, Scalar, UOp};
use kiln_device::{Buffer, Device, Kernel};
use kiln_runtime::{ExecutionPlan, PlanOptions};
use serde::Serialize;

use crate::error::CliError;
use crate::npy::{self, NpyArray};
use crate::session;

/// `kiln bench [--device D] [--json] [--quick] [--only NAME[,NAME...]]`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    long_about = "Runs kiln's benchmark suite on one device. Each entry verifies its result against a host \
reference before it is timed, and most are compared with a baseline measured in the same run (plain Rust \
loops on all cores; for matmul OpenBLAS's cblas_sgemm on kiln's thread count, in a process of its own \
with OPENBLAS_CORETYPE set from the CPU's widest ISA unless already set, when libopenblas.so.0 loads, \
else the matrixmultiply crate after kiln's reps, or as KILN_BENCH_MATMUL_BASELINE=auto|openblas|matrixmultiply says). compile_cold times one small kernel rendered, compiled and \
loaded without the cache; compile_throughput counts kernels per second for 64 new small kernels compiled as \
one batch on all cores (Device::compile_many), against the same number compiled one by one. warm_run_process is the wall time of a whole `kiln run` \
process (an 8-element add on a warm kernel cache), against a bare `kiln --version` process.",
    after_help = "On a terminal, progress is shown on stderr (not with --json). Quote medians: these machines \
are shared and noisy."
)]
pub struct BenchArgs {
    /// The device to benchmark
    #[arg(short, long, value_name = "D", default_value = "CPU", value_parser = session::parse_device)]
    pub device: DeviceSpec,
    /// Print {"device", "results": [...]} instead of a table
    #[arg(long)]
    pub json: bool,
    /// Fewer repetitions (for a smoke run; figures are noisier)
    #[arg(long)]
    pub quick: bool,
    /// Run only these entries (comma-separated names)
    #[arg(long, value_name = "NAME,...", value_delimiter = ',', value_parser = PossibleValuesParser::new(ENTRIES))]
    pub only: Option<Vec<String>>,
    /// Internal: run as the child process of the `cache_disk_hit` entry.
    #[arg(long, hide = true)]
    pub disk_hit_child: bool,
    /// Internal: time this entry's OpenBLAS baseline in this process (the child of the
    /// `matmul_f32_1024` entry), so that OpenBLAS never loads beside kiln's own reps.
    #[arg(long, hide = true, value_name = "NAME", value_parser = PossibleValuesParser::new(["matmul_f32_1024"]))]
    pub baseline_child: Option<String>,
    /// Internal: the baseline child's OpenBLAS threads (the parent's kiln thread count).
    #[arg(long, hide = true, value_name = "N", default_value_t = 1)]
    pub baseline_threads: usize,
}

/// Every entry, in report order.
pub const ENTRIES: &[&str] = &[
    "bandwidth_limit",
    "add_f32_16m",
    "add_f32_16m_guarded",
    "sum_f32_16m",
    "matmul_f32_1024",
    "softmax_f32_4096x1024",
    "queue_roundtrip",
    "plan_replay_per_kernel",
    "signal_wake",
    "two_queue_overlap",
    "compile_cold",
    "compile_throughput",
    "cache_mem_hit",
    "cache_disk_hit",
    "warm_run_process",
    "alloc_cached",
    "device_reset",
];

/// Median, min and max of one series, in the entry's unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    fn of(mut v: Vec<f64>) -> Result<Stats, CliError> {
        if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
            return Err(kiln_err(
                "timing",
                kiln_device::Error::Invalid("a benchmark produced no finite sample".into()),
            ));
        }
        v.sort_by(f64::total_cmp);
        Ok(Stats { median: v[v.len() / 2], min: v[0], max: v[v.len() - 1] })
    }
}

/// One reported line.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub name: &'static str,
    pub unit: &'static str,
    /// True for throughputs (GB/s, GFLOP/s), false for times and the overlap ratio.
    pub higher_is_better: bool,
    pub verified: bool,
    pub kiln: Stats,
    pub baseline: Option<Stats>,
    /// What the baseline is, for the table.
    pub baseline_name: &'static str,
}

impl BenchResult {
    /// kiln relative to the baseline, higher is better.
    pub fn ratio(&self) -> Option<f64> {
        let b = self.baseline?;
        Some(if self.higher_is_better { self.kiln.median / b.median } else { b.median / self.kiln.median })
    }
}

fn kiln_err(context: &str, source: kiln_device::Error) -> CliError {
    CliError::Kiln { context: context.to_string(), source }
}

fn wrong(name: &str, what: String) -> CliError {
    kiln_err(
        &format!("bench entry {name} failed verification"),
        kiln_device::Error::Invalid(format!("{what}; no figure is reported for a wrong result")),
    )
}

/// Times `reps` calls of `f` and returns seconds per call.
fn time_reps(reps: usize, mut f: impl FnMut() -> Result<(), CliError>) -> Result<Vec<f64>, CliError> {
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        out.push(t.elapsed().as_secs_f64());
    }
    Ok(out)
}

fn per_sec(samples: &[f64], amount: f64) -> Vec<f64> {
    samples.iter().map(|s| amount / s).collect()
}

fn scaled(samples: &[f64], factor: f64) -> Vec<f64> {
    samples.iter().map(|s| s * factor).collect()
}

/// Runs `kiln bench` and returns what to print on stdout.
pub fn run(args: &BenchArgs) -> Result<String, CliError> {
    if args.baseline_child.is_some() {
        // Before any device opens: the child holds OpenBLAS's threads and nothing else.
        return matmul_baseline_child(args.baseline_threads, reps(args));
    }
    session::register_backends();
    let device = session::open_device(&args.device)?;
    if args.disk_hit_child {
        return disk_hit_child(&device);
    }
    let bench = Bench { device, reps: reps(args) };
    let chosen: Vec<&'static str> =
        ENTRIES.iter().copied().filter(|name| args.only.as_ref().is_none_or(|o| o.iter().any(|n| n == name))).collect();
    let progress = progress_bar(chosen.len(), args.json);
    let mut results = Vec::new();
    for name in chosen {
        progress.set_message(name);
        let r = bench.entry(name, args)?;
        progress.println(format!("{name:<24} {:>10.3} {} (median)", r.kiln.median, r.unit));
        progress.inc(1);
        results.push(r);
    }
    progress.finish_and_clear();
    Ok(if args.json { to_json(&args.device, &results)? } else { to_table(&bench.device, &results) })
}

/// Timed repetitions per entry.
fn reps(args: &BenchArgs) -> usize {
    if args.quick { 3 } else { 11 }
}

/// What the run is doing, on stderr: a bar with the entry being measured and a line per
/// finished entry. Hidden with `--json` and when stderr is not a terminal (a log or a pipe
/// gets only the report).
fn progress_bar(entries: usize, json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(entries as u64);
    if let Ok(style) = ProgressStyle::with_template("kiln bench [{pos}/{len}] {spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

struct Bench {
    device: Arc<Device>,
    reps: usize,
}

impl Bench {
    fn axis(&self) -> kernels::Axis {
        if *self.device.spec() == DeviceSpec::new("CPU", 0) { "gidx0" } else { "idx0" }
    }

    /// The f32 lanes of the add, sum and softmax kernels: the device's widest vector.
    fn width(&self) -> u8 {
        kernels::width_for(self.device.properties().f32_lanes())
    }

    fn compile<E: Into<kiln_device::Error>>(&self, sink: Result<Arc<UOp>, E>, name: &str) -> Result<Kernel, CliError> {
        let sink = sink.map_err(|e| kiln_err(&format!("building the {name} kernel"), e.into()))?;
        self.device.compile(&sink, Some(name)).map_err(|e| kiln_err(&format!("compiling the {name} kernel"), e))
    }

    fn upload(&self, data: &[f32]) -> Result<Buffer, CliError> {
        Buffer::from_slice(self.device.allocator(), data).map_err(|e| kiln_err("uploading bench input", e))
    }

    fn zeros(&self, n: usize) -> Result<Buffer, CliError> {
        let b = self.device.buffer(Scalar::F32, n).map_err(|e| kiln_err("allocating bench output", e))?;
        b.copy_from_slice(&vec![0f32; n]).map_err(|e| kiln_err("clearing bench output", e))?;
        Ok(b)
    }

    fn launch(&self, k: &Kernel, bufs: &[&Buffer]) -> Result<(), CliError> {
        k.launch(bufs, &[]).map_err(|e| kiln_err(&format!("running {}", k.spec.name), e))
    }

    fn read(&self, b: &Buffer) -> Result<Vec<f32>, CliError> {
        b.to_vec::<f32>().map_err(|e| kiln_err("reading bench output", e))
    }

    fn entry(&self, name: &'static str, args: &BenchArgs) -> Result<BenchResult, CliError> {
        let result = match name {
            "bandwidth_limit" => self.bandwidth_limit(),
            "add_f32_16m" => self.add(),
            "add_f32_16m_guarded" => self.add_guarded(),
            "sum_f32_16m" => self.sum(),
            "matmul_f32_1024" => self.matmul(args),
            "softmax_f32_4096x1024" => self.softmax(),
            "queue_roundtrip" => self.queue_roundtrip(),
            "plan_replay_per_kernel" => self.plan_replay(),
            "signal_wake" => self.signal_wake(),
            "two_queue_overlap" => self.two_queue_overlap(),
            "compile_cold" => self.compile_cold(),
            "compile_throughput" => self.compile_throughput(),
            "cache_mem_hit" => self.cache_mem_hit(),
            "cache_disk_hit" => self.cache_disk_hit(args),
            "warm_run_process" => self.warm_run_process(args),
            "alloc_cached" => self.alloc_cached(),
            "device_reset" => self.device_reset(),
            other => Err(CliError::Usage(format!("unknown bench entry `{other}`"))),
        }?;
        #[cfg(feature = "cuda")]
        let result = self.cuda_baseline(result)?;
        Ok(result)
    }

    /// The inputs of `add_f32_16m` and `bandwidth_limit`: 16M f32 each, exact sums.
    fn add_inputs() -> (Vec<f32>, Vec<f32>) {
        let n = ADD_N;
        ((0..n).map(|i| (i % 1000) as f32 * 0.25).collect(), (0..n).map(|i| (i % 777) as f32 * 0.5).collect())
    }

    fn bandwidth_limit(&self) -> Result<BenchResult, CliError> {
        let (a, b) = Self::add_inputs();
        let mut limit = StreamLimit::new(&a, &b);
        for _ in 0..self.reps {
            limit.rep();
        }
        let t = limit.finish("bandwidth_limit")?;
        Ok(BenchResult {
            name: "bandwidth_limit",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, ADD_BYTES))?,
            baseline: None,
            baseline_name: "",
        })
    }

    /// kiln's `add` against [`StreamLimit`] measured right after it.
    fn add(&self) -> Result<BenchResult, CliError> {
        let n = ADD_N;
        let (a, b) = Self::add_inputs();
        let nontemporal = exceeds_cache(self.device.properties(), 4 * n);
        let k = self.compile(kernels::add_f32(self.axis(), n, self.width(), nontemporal), "add_f32")?;
        let (ba, bb, bc) = (self.upload(&a)?, self.upload(&b)?, self.zeros(n)?);
        self.launch(&k, &[&ba, &bb, &bc])?;
        let c = self.read(&bc)?;
        if let Some(i) = (0..n).find(|&i| c[i] != a[i] + b[i]) {
            return Err(wrong("add_f32_16m", format!("c[{i}] = {} but a[{i}] + b[{i}] = {}", c[i], a[i] + b[i])));
        }
        let t = time_reps(self.reps, || self.launch(&k, &[&ba, &bb, &bc]))?;
        // The limit runs after kiln's reps, not between them: its threads would otherwise
        // share the cores with kiln's pool workers, which spin for a while after each launch.
        let mut limit = StreamLimit::new(&a, &b);
        for _ in 0..self.reps {
            limit.rep();
        }
        let base = limit.finish("add_f32_16m")?;
        Ok(BenchResult {
            name: "add_f32_16m",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, ADD_BYTES))?,
            baseline: Some(Stats::of(per_sec(&base, ADD_BYTES))?),
            baseline_name: "bandwidth_limit (Rust streaming add, all cores)",
        })
    }

    /// The cost of a guard: `add` with its three accesses compiled as guarded ones (what a
    /// launch runs when no proof reaches them, [`kiln_ir::guard`]), against the proven `add`
    /// (no check in its code), each timed on its own.
    fn add_guarded(&self) -> Result<BenchResult, CliError> {
        let n = ADD_N;
        let (a, b) = Self::add_inputs();
        let nontemporal = exceeds_cache(self.device.properties(), 4 * n);
        let sink = kernels::add_f32(self.axis(), n, self.width(), nontemporal)
            .map_err(|e| kiln_err("building the add_f32 kernel", e.into()))?;
        let accesses: Vec<usize> = sink
            .toposort()
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.op(), Op::Load | Op::Store))
            .map(|(i, _)| i)
            .collect();
        let guarded = kiln_device::kiln_ir::guard(&sink, &accesses)
            .map_err(|e| kiln_err("guarding the add_f32 kernel", e.into()))?;
        let proven = self.compile(Ok::<_, kiln_device::Error>(sink), "add_f32")?;
        let k = self.compile(Ok::<_, kiln_device::Error>(guarded.sink), "add_f32_guarded")?;
        let faults =
            self.device.buffer(Scalar::I64, 2 * accesses.len()).map_err(|e| kiln_err("allocating faults", e))?;
        faults.copy_from_slice(&vec![0i64; 2 * accesses.len()]).map_err(|e| kiln_err("clearing faults", e))?;
        let (ba, bb, bc) = (self.upload(&a)?, self.upload(&b)?, self.zeros(n)?);
        self.launch(&k, &[&ba, &bb, &bc, &faults])?;
        let c = self.read(&bc)?;
        if let Some(i) = (0..n).find(|&i| c[i] != a[i] + b[i]) {
            return Err(wrong(
                "add_f32_16m_guarded",
                format!("c[{i}] = {} but a[{i}] + b[{i}] = {}", c[i], a[i] + b[i]),
            ));
        }
        let fired = faults.to_vec::<i64>().map_err(|e| kiln_err("reading faults", e))?;
        if fired.iter().any(|&f| f != 0) {
            return Err(wrong("add_f32_16m_guarded", format!("a guard fired on an in-bounds add: {fired:?}")));
        }
        let t = time_reps(self.reps, || self.launch(&k, &[&ba, &bb, &bc, &faults]))?;
        let base = time_reps(self.reps, || self.launch(&proven, &[&ba, &bb, &bc]))?;
        Ok(BenchResult {
            name: "add_f32_16m_guarded",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, ADD_BYTES))?,
            baseline: Some(Stats::of(per_sec(&base, ADD_BYTES))?),
            baseline_name: "add_f32_16m as proven (no check in its code)",
        })
    }

    fn sum(&self) -> Result<BenchResult, CliError> {
        let n = 1usize << 24;
        let a: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1024) as f32 / 1024.0 - 0.5).collect();
        let (partial, finish, chunks) = match self.gpu_sum_kernels(n)? {
            Some(gpu) => gpu,
            None => {
                let chunks = 64;
                let partial =
                    self.compile(kernels::sum_partials_f32(self.axis(), n, chunks, self.width()), "sum_partials_f32")?;
                (partial, self.compile(kernels::sum_finish_f32(chunks), "sum_finish_f32")?, chunks)
            }
        };
        let (ba, bp, bo) = (self.upload(&a)?, self.zeros(chunks)?, self.zeros(1)?);
        let run = || -> Result<(), CliError> {
            self.launch(&partial, &[&ba, &bp])?;
            self.launch(&finish, &[&bp, &bo])
        };
        run()?;
        let got = self.read(&bo)?[0] as f64;
        let want: f64 = a.iter().map(|&x| x as f64).sum();
        // f32 accumulation in any order: bounded by a small multiple of eps · Σ|a|.
        let bound = 1e-6 * a.iter().map(|&x| (x as f64).abs()).sum::<f64>();
        if (got - want).abs() > bound {
            return Err(wrong("sum_f32_16m", format!("sum = {got}, reference (f64) = {want}")));
        }
        let bytes = 4.0 * n as f64 / 1e9;
        let t = time_reps(self.reps, run)?;
        let mut base_sum = 0f32;
        let base = time_reps(self.reps, || {
            base_sum = baseline::sum(&a);
            Ok(())
        })?;
        if ((base_sum as f64) - want).abs() > bound {
            return Err(wrong("sum_f32_16m", format!("the Rust baseline gives {base_sum}, reference {want}")));
        }
        Ok(BenchResult {
            name: "sum_f32_16m",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, bytes))?,
            baseline: Some(Stats::of(per_sec(&base, bytes))?),
            baseline_name: "Rust streaming sum, all cores",
        })
    }

    fn matmul(&self, args: &BenchArgs) -> Result<BenchResult, CliError> {
        let wanted = openblas::Wanted::from_env()
            .map_err(|e| kiln_err("choosing the matmul baseline", kiln_device::Error::Invalid(e)))?;
        let n = MATMUL_N;
        let (a, b) = matmul_inputs(n);
        let tile = kernels::MatmulTile::for_width(self.width());
        let pack = self.compile(kernels::pack_b_f32(self.axis(), n, tile), "pack_b_f32")?;
        // The CPU backend splits the strips over its cores; elsewhere, one tile per item.
        let sink = if *self.device.spec() == DeviceSpec::new("CPU", 0) {
            kernels::matmul_f32(self.axis(), n, tile)
        } else {
            kernels::matmul_tile_f32(n, tile)
        };
        let mm = self.compile(sink, "matmul_f32")?;
        let (ba, bb, bp, bc) = (self.upload(&a)?, self.upload(&b)?, self.zeros(n * n)?, self.zeros(n * n)?);
        let run = || -> Result<(), CliError> {
            self.launch(&pack, &[&bb, &bp])?;
            self.launch(&mm, &[&ba, &bp, &bc])
        };
        run()?;
        let c = self.read(&bc)?;
        let mut reference = vec![0f32; n * n];
        baseline::matmul(&a, &b, &mut reference, n);
        // Inputs are multiples of 1/8 with small numerators: every product and partial sum
        // is exact in f32, so any summation order must agree exactly.
        if let Some(i) = (0..n * n).find(|&i| c[i] != reference[i]) {
            return Err(wrong(
                "matmul_f32_1024",
                format!("C[{}, {}] = {} but the reference is {}", i / n, i % n, c[i], reference[i]),
            ));
        }
        let flops = 2.0 * (n * n * n) as f64 / 1e9;
        let t = time_reps(self.reps, run)?;
        // Every baseline runs after kiln's reps: OpenBLAS in a process of its own, so that its
        // threads never share this one with kiln's workers; matrixmultiply here.
        let from_child = match wanted {
            openblas::Wanted::MatrixMultiply => None,
            openblas::Wanted::Auto | openblas::Wanted::OpenBlas => match openblas_in_child(args, kiln_threads())? {
                openblas::ChildReport::Timed { name, seconds } => Some((name, seconds)),
                openblas::ChildReport::Unavailable { why } if wanted == openblas::Wanted::OpenBlas => {
                    return Err(kiln_err(
                        "choosing the matmul baseline",
                        kiln_device::Error::Invalid(format!("{}=openblas: {why}", openblas::BASELINE_ENV)),
                    ));
                }
                openblas::ChildReport::Unavailable { .. } => None,
            },
        };
        let (name, base): (&'static str, Vec<f64>) = match from_child {
            // Leaked once per run, so that the report keeps its `&'static str` names.
            Some((name, seconds)) => (Box::leak(name.into_boxed_str()), seconds),
            None => {
                let mut out = vec![f32::NAN; n * n];
                let base = time_reps(self.reps, || {
                    baseline::matmul(&a, &b, &mut out, n);
                    Ok(())
                })?;
                if let Some(i) = (0..n * n).find(|&i| out[i] != reference[i]) {
                    return Err(wrong(
                        "matmul_f32_1024",
                        format!(
                            "the baseline gives C[{}, {}] = {}, the reference {}",
                            i / n,
                            i % n,
                            out[i],
                            reference[i]
                        ),
                    ));
                }
                (openblas::MATRIXMULTIPLY_NAME, base)
            }
        };
        Ok(BenchResult {
            name: "matmul_f32_1024",
            unit: "GFLOP/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, flops))?,
            baseline: Some(Stats::of(per_sec(&base, flops))?),
            baseline_name: name,
        })
    }

    fn softmax(&self) -> Result<BenchResult, CliError> {
        let (rows, cols) = (4096usize, 1024usize);
        let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 31) % 97) as f32 * 0.05 - 2.0).collect();
        let nontemporal = exceeds_cache(self.device.properties(), 4 * rows * cols);
        let k =
            self.compile(kernels::softmax_f32(self.axis(), rows, cols, self.width(), nontemporal), "softmax_f32")?;
        let (bx, by) = (self.upload(&x)?, self.zeros(rows * cols)?);
        self.launch(&k, &[&bx, &by])?;
        let y = self.read(&by)?;
        for r in (0..rows).step_by(97) {
            let row = &x[r * cols..(r + 1) * cols];
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
            for c in 0..cols {
                let want = (row[c] as f64 - m).exp() / s;
                let got = y[r * cols + c] as f64;
                if (got - want).abs() > 1e-5 * want.max(1e-3) + 1e-7 {
                    return Err(wrong("softmax_f32_4096x1024", format!("y[{r}, {c}] = {got}, reference {want}")));
                }
            }
        }
        let bytes = 8.0 * (rows * cols) as f64 / 1e9;
        let t = time_reps(self.reps, || self.launch(&k, &[&bx, &by]))?;
        Ok(BenchResult {
            name: "softmax_f32_4096x1024",
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(per_sec(&t, bytes))?,
            baseline: None,
            baseline_name: "",
        })
    }

    fn queues(&self) -> Result<Arc<dyn kiln_device::DynQueueFactory>, CliError> {
        self.device.queues().ok_or_else(|| {
            kiln_err(
                "queue benchmarks",
                kiln_device::Error::Unavailable(format!("{} has no queues", self.device.spec())),
            )
        })
    }

    /// One tiny kernel: record → submit → the queue's worker runs it → signal → host wait.
    fn queue_roundtrip(&self) -> Result<BenchResult, CliError> {
        let factory = self.queues()?;
        let k = self.compile(kiln_runtime::bench::increment_kernel(), "increment")?;
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
            baseline_name: "",
        })
    }

    /// A recorded plan of 1000 dependent tiny kernels, replayed; per kernel.
    fn plan_replay(&self) -> Result<BenchResult, CliError> {
        let kernels = 1000usize;
        let k = self.compile(kiln_runtime::bench::increment_kernel(), "increment")?;
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
            baseline_name: "",
        })
    }

    /// Ping-pong between two threads over two signals; one wake is half a round trip.
    fn signal_wake(&self) -> Result<BenchResult, CliError> {
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
            baseline_name: "",
        })
    }

    /// Two independent compute-bound one-work-item kernels: a plan on two queues vs the
    /// same two kernels one after the other. Reported as the ratio (lower is better).
    fn two_queue_overlap(&self) -> Result<BenchResult, CliError> {
        let iterations = 20_000_000i64;
        let k = self.compile(kiln_runtime::bench::spin_kernel(1), "spin")?;
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
            baseline_name: "",
        })
    }

    /// Render + compile + load of kernels no cache has seen (a fresh constant in each).
    fn compile_cold(&self) -> Result<BenchResult, CliError> {
        let nonce =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let reps = self.reps.min(5);
        let mut samples = Vec::with_capacity(reps);
        for r in 0..reps {
            let c = ((nonce % 1_000_000) as f32) + r as f32;
            let sink = add_const_kernel(c).map_err(|e| kiln_err("building the compile kernel", e.into()))?;
            let t = Instant::now();
            let spec =
                self.device.renderer().render(&sink, Some("compile_cold")).map_err(|e| kiln_err("rendering", e))?;
            let compiled = self.device.compiler().compile(&spec).map_err(|e| kiln_err("compiling", e))?;
            let program = (self.device.runtime())(&compiled).map_err(|e| kiln_err("loading", e))?;
            samples.push(t.elapsed().as_secs_f64() * 1e3);
            let k = Kernel::new(compiled.spec.clone(), program);
            let x = self.upload(&[1.0, 2.0])?;
            self.launch(&k, &[&x])?;
            if self.read(&x)? != [1.0 + c, 2.0 + c] {
                return Err(wrong("compile_cold", "the freshly compiled kernel computed a wrong result".into()));
            }
        }
        Ok(BenchResult {
            name: "compile_cold",
            unit: "ms",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(samples)?,
            baseline: None,
            baseline_name: "",
        })
    }

    /// Kernels compiled per second, cold: a batch of [`THROUGHPUT_KERNELS`] distinct small
    /// kernels through `Device::compile_many` (all cores), against the baseline of as many
    /// other ones compiled one after another with `Device::compile`, alternately in one run.
    /// Every kernel is new to the cache (its constant comes from the clock and the sample's
    /// index), and every one is launched once and checked.
    fn compile_throughput(&self) -> Result<BenchResult, CliError> {
        let nonce =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let n = THROUGHPUT_KERNELS;
        // Distinct integers below 2^24, exact in f32 (also plus 1 and 2).
        let mut next = (nonce % 60_000) as usize * 4 * n;
        let mut fresh = || -> Result<Vec<(f32, Arc<UOp>)>, CliError> {
            (0..n)
                .map(|_| {
                    next += 1;
                    let c = next as f32;
                    add_const_kernel(c).map(|k| (c, k)).map_err(|e| kiln_err("building a compile kernel", e.into()))
                })
                .collect()
        };
        // Every kernel was compiled (none came from a cache) and computes x + c.
        let check = |compiled: Vec<Kernel>, kernels: &[(f32, Arc<UOp>)], misses: u64| -> Result<(), CliError> {
            let compiles = self.device.cache().stats().misses - misses;
            if compiles != n as u64 {
                return Err(wrong(
                    "compile_throughput",
                    format!("{compiles} of {n} kernels were compiled, the rest cached"),
                ));
            }
            for (k, &(c, _)) in compiled.iter().zip(kernels) {
                let x = self.upload(&[1.0, 2.0])?;
                self.launch(k, &[&x])?;
                if self.read(&x)? != [1.0 + c, 2.0 + c] {
                    return Err(wrong("compile_throughput", format!("kernel {} computed a wrong result", k.spec.name)));
                }
            }
            Ok(())
        };
        let (mut batch, mut one_by_one) = (Vec::new(), Vec::new());
        for _ in 0..self.reps.min(3) {
            let kernels = fresh()?;
            let names: Vec<String> = (0..n).map(|i| format!("throughput{i}")).collect();
            let jobs: Vec<(Arc<UOp>, Option<&str>)> =
                kernels.iter().zip(&names).map(|((_, k), name)| (k.clone(), Some(name.as_str()))).collect();
            let misses = self.device.cache().stats().misses;
            let t = Instant::now();
            let compiled = self.device.compile_many(&jobs).into_iter().collect::<Result<Vec<_>, _>>();
            batch.push(n as f64 / t.elapsed().as_secs_f64());
            check(compiled.map_err(|e| kiln_err("compiling a batch", e))?, &kernels, misses)?;

            let kernels = fresh()?;
            let misses = self.device.cache().stats().misses;
            let t = Instant::now();
            let compiled = jobs
                .iter()
                .zip(&kernels)
                .map(|((_, name), (_, k))| self.device.compile(k, *name))
                .collect::<Result<Vec<_>, _>>();
            one_by_one.push(n as f64 / t.elapsed().as_secs_f64());
            check(compiled.map_err(|e| kiln_err("compiling", e))?, &kernels, misses)?;
        }
        Ok(BenchResult {
            name: "compile_throughput",
            unit: "kernels/s",
            higher_is_better: true,
            verified: true,
            kiln: Stats::of(batch)?,
            baseline: Some(Stats::of(one_by_one)?),
            baseline_name: "one by one (Device::compile)",
        })
    }

    fn cache_mem_hit(&self) -> Result<BenchResult, CliError> {
        let sink = add_const_kernel(3.0).map_err(|e| kiln_err("building the cache kernel", e.into()))?;
        let first = self.device.compile(&sink, Some("cache_probe")).map_err(|e| kiln_err("compiling", e))?;
        let before = self.device.cache().stats();
        let n = 1000;
        let mut samples = Vec::with_capacity(self.reps);
        let mut last = None;
        for _ in 0..self.reps {
            let t = Instant::now();
            for _ in 0..n {
                last = Some(self.device.compile(&sink, Some("cache_probe")).map_err(|e| kiln_err("compiling", e))?);
            }
            samples.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
        let after = self.device.cache().stats();
        let hits = after.memory_hits - before.memory_hits;
        let same = last.is_some_and(|k| Arc::ptr_eq(&k.program, &first.program));
        if hits != (n * self.reps) as u64 || after.misses != before.misses || !same {
            return Err(wrong("cache_mem_hit", format!("{hits} memory hits for {} lookups", n * self.reps)));
        }
        let x = self.upload(&[1.0, 2.0])?;
        self.launch(&first, &[&x])?;
        if self.read(&x)? != [4.0, 5.0] {
            return Err(wrong("cache_mem_hit", "the cached kernel computed a wrong result".into()));
        }
        Ok(BenchResult {
            name: "cache_mem_hit",
            unit: "µs",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(samples)?,
            baseline: None,
            baseline_name: "",
        })
    }

    /// `Device::reset` and 10 cached kernels running again (reloaded without compiling),
    /// each verified; runs last, since it ends the generation of everything made before.
    fn device_reset(&self) -> Result<BenchResult, CliError> {
        let sinks = (1..=10)
            .map(|c| add_const_kernel(c as f32))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| kiln_err("building the reset kernels", e.into()))?;
        // A reset reloads every kernel the device holds: measure it with exactly these ten,
        // whatever the entries before this one loaded.
        self.device.cache().clear_memory();
        for s in &sinks {
            self.device.compile(s, Some("reset_probe")).map_err(|e| kiln_err("compiling", e))?;
        }
        let before = self.device.cache().stats();
        let mut samples = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            let t = Instant::now();
            self.device.reset().map_err(|e| kiln_err("resetting the device", e))?;
            let mut outs = Vec::with_capacity(sinks.len());
            for s in &sinks {
                let k = self.device.compile(s, Some("reset_probe")).map_err(|e| kiln_err("compiling", e))?;
                let x = self.upload(&[1.0, 2.0])?;
                self.launch(&k, &[&x])?;
                outs.push(x);
            }
            samples.push(t.elapsed().as_secs_f64() * 1e3);
            for (c, x) in (1..).zip(&outs) {
                if self.read(x)? != [1.0 + c as f32, 2.0 + c as f32] {
                    return Err(wrong("device_reset", format!("kernel {c} computed a wrong result after the reset")));
                }
            }
        }
        if self.device.cache().stats().misses != before.misses {
            return Err(wrong("device_reset", "a kernel was compiled again after the reset".into()));
        }
        Ok(BenchResult {
            name: "device_reset",
            unit: "ms",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(samples)?,
            baseline: None,
            baseline_name: "",
        })
    }

    /// A new `kiln` process loads a kernel from a disk cache filled by an earlier process.
    fn cache_disk_hit(&self, args: &BenchArgs) -> Result<BenchResult, CliError> {
        let (exe, dir) = exe_and_private_dir("kiln-bench-disk-")?;
        let child = |expect_hit: bool| -> Result<f64, CliError> {
            let out = Process::new(&exe)
                .args(["bench", "--disk-hit-child", "--device", &args.device.to_string()])
                .env("KILN_CACHE_DIR", dir.path())
                .env_remove("KILN_CACHE")
                .output()
                .map_err(|e| CliError::Io { action: "starting", path: exe.clone(), source: e })?;
            let text = String::from_utf8_lossy(&out.stdout);
            let (kind, ms) = text.trim().split_once(' ').unwrap_or(("", ""));
            let ms: f64 = ms.parse().unwrap_or(f64::NAN);
            if !out.status.success() || kind != if expect_hit { "hit" } else { "miss" } || !ms.is_finite() {
                return Err(wrong(
                    "cache_disk_hit",
                    format!(
                        "the child process reported `{}` (expected a {}): {}",
                        text.trim(),
                        if expect_hit { "disk hit" } else { "miss" },
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                ));
            }
            Ok(ms)
        };
        let result = (|| {
            child(false)?;
            let samples: Result<Vec<f64>, CliError> = (0..self.reps.min(7)).map(|_| child(true)).collect();
            samples
        })();
        Ok(BenchResult {
            name: "cache_disk_hit",
            unit: "ms",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(result?)?,
            baseline: None,
            baseline_name: "",
        })
    }

    /// The wall time of a whole `kiln run` process of an 8-element add on a warm kernel cache
    /// (a private `KILN_CACHE_DIR` filled by one run first): process start, parsing, opening
    /// the device, the disk-cache hit, the `.npy` inputs and output. Every run's output file is
    /// checked. The baseline, timed alternately with it, is a bare `kiln --version` process:
    /// the difference is what `kiln run` itself costs.
    fn warm_run_process(&self, args: &BenchArgs) -> Result<BenchResult, CliError> {
        let name = "warm_run_process";
        let (exe, dir) = exe_and_private_dir("kiln-bench-warm-")?;
        let path = |file: &str| dir.path().join(file);
        let n = 8;
        let (a, b): (Vec<f32>, Vec<f32>) = ((0..n).map(|i| i as f32).collect(), vec![1.0; n]);
        let npy_of = |file: &str, data: &[f32]| {
            let array = NpyArray::from_bytes(Scalar::F32, data.iter().flat_map(|x| x.to_le_bytes()).collect());
            array.and_then(|a| npy::write(&a)).map_err(|source| CliError::Npy { path: path(file), source })
        };
        // Written over in place (as `kiln run` writes its outputs), not truncated first.
        let write = |file: &str, bytes: &[u8]| {
            let p = path(file);
            std::fs::File::options()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&p)
                .and_then(|mut f| f.write_all(bytes).and_then(|()| f.set_len(bytes.len() as u64)))
                .map_err(|e| CliError::io("writing", &p, e))
        };
        write("add.kiln", include_str!("../../../../examples/kernels/add.kiln").as_bytes())?;
        write("a.npy", &npy_of("a.npy", &a)?)?;
        write("b.npy", &npy_of("b.npy", &b)?)?;
        // Each run's output replaces this, so a run that wrote nothing is caught.
        let poison = npy_of("c.npy", &[f32::NAN; 8])?;
        let slot = |i: usize, file: &str| format!("{i}={}", path(file).display());
        let run_args = [
            "run".into(),
            path("add.kiln").display().to_string(),
            "--device".into(),
            args.device.to_string(),
            "--var".into(),
            format!("n={n}"),
            "--in".into(),
            slot(0, "a.npy"),
            "--in".into(),
            slot(1, "b.npy"),
            "--out".into(),
            slot(2, "c.npy"),
        ];
        // Times one child process (started, run to its end); its stdout is dropped.
        let timed = |args: &[String]| -> Result<f64, CliError> {
            let mut cmd = Process::new(&exe);
            cmd.args(args).env("KILN_CACHE_DIR", path("cache")).env_remove("KILN_CACHE");
            let t = Instant::now();
            let done = cmd.stdout(std::process::Stdio::null()).output();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let done = done.map_err(|e| CliError::Io { action: "starting", path: exe.clone(), source: e })?;
            if !done.status.success() {
                let why = String::from_utf8_lossy(&done.stderr);
                return Err(wrong(name, format!("`kiln {}` failed ({}): {}", args.join(" "), done.status, why.trim())));
            }
            Ok(ms)
        };
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let out = path("c.npy");
        // Checks the output of the run just made, then poisons it for the next one.
        let check = || -> Result<(), CliError> {
            let bytes = std::fs::read(&out).map_err(|e| CliError::io("reading", &out, e))?;
            let got = npy::read(&bytes).map_err(|source| CliError::Npy { path: out.clone(), source })?;
            let got: Vec<f32> =
                got.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            if got != want {
                return Err(wrong(name, format!("`kiln run` wrote {got:?}, expected {want:?}")));
            }
            write("c.npy", &poison)
        };
        // The first run compiles and fills the cache; the timed ones load from it.
        timed(&run_args)?;
        check()?;
        let version = ["--version".to_string()];
        let reps = self.reps * 2 - 1;
        let (mut samples, mut bare) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
        for _ in 0..reps {
            samples.push(timed(&run_args)?);
            check()?;
            bare.push(timed(&version)?);
        }
        Ok(BenchResult {
            name,
            unit: "ms",
            higher_is_better: false,
            verified: true,
            kiln: Stats::of(samples)?,
            baseline: Some(Stats::of(bare)?),
            baseline_name: "`kiln --version` process",
        })
    }

    /// A cached allocation and free of a 64 KiB block through the device's allocator.
    fn alloc_cached(&self) -> Result<BenchResult, CliError> {
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
            baseline_name: "",
        })
    }
}

/// Elements of `add_f32_16m` and `bandwidth_limit`, and the bytes one pass moves (two f32
/// reads and one f32 write per element).
const ADD_N: usize = 1 << 24;
const ADD_BYTES: f64 = 12.0 * ADD_N as f64 / 1e9;

/// The memory bandwidth `add_f32_16m` can reach: the same streaming add (2 reads and 1
/// write of 16M f32, counted as 12 bytes per element) in plain Rust on all cores, once with
/// non-temporal stores where the ISA has them and once with plain stores per rep; the
/// variant with the better median is the limit.
struct StreamLimit<'a> {
    a: &'a [f32],
    b: &'a [f32],
    out: Vec<f32>,
    nontemporal: Vec<f64>,
    plain: Vec<f64>,
}

impl<'a> StreamLimit<'a> {
    fn new(a: &'a [f32], b: &'a [f32]) -> Self {
        StreamLimit { a, b, out: vec![0f32; a.len()], nontemporal: Vec::new(), plain: Vec::new() }
    }

    /// Times one pass of each variant.
    fn rep(&mut self) {
        for nontemporal in [true, false] {
            let t = Instant::now();
            baseline::stream_add(self.a, self.b, &mut self.out, nontemporal);
            let s = t.elapsed().as_secs_f64();
            if nontemporal { &mut self.nontemporal } else { &mut self.plain }.push(s);
        }
    }

    /// Verifies both variants' output and returns the seconds per pass of the faster one.
    fn finish(mut self, entry: &str) -> Result<Vec<f64>, CliError> {
        let (a, b) = (self.a, self.b);
        for nontemporal in [true, false] {
            self.out.fill(f32::NAN);
            baseline::stream_add(a, b, &mut self.out, nontemporal);
            if let Some(i) = (0..a.len()).find(|&i| self.out[i] != a[i] + b[i]) {
                let got = self.out[i];
                return Err(wrong(entry, format!("the streaming kernel wrote c[{i}] = {got}, want {}", a[i] + b[i])));
            }
        }
        let faster = Stats::of(self.nontemporal.clone())?.median <= Stats::of(self.plain.clone())?.median;
        Ok(if faster { self.nontemporal } else { self.plain })
    }
}

/// Whether a kernel that writes an output of `bytes` should store it non-temporally: when it
/// does not fit in the largest cache the device reports, or in 8 MiB where it reports none
/// (backends without non-temporal stores ignore the hint).
fn exceeds_cache(props: &kiln_device::DeviceProperties, bytes: usize) -> bool {
    const FALLBACK: usize = 8 << 20;
    bytes > props.largest_cache_bytes().unwrap_or(FALLBACK)
}

/// Kernels per sample of `compile_throughput`.
const THROUGHPUT_KERNELS: usize = 64;

/// `x[i] += c` over two elements: a kernel whose identity changes with `c`.
fn add_const_kernel(c: f32) -> Result<Arc<UOp>, kiln_device::kiln_ir::IrError> {
    let mut k = kiln_device::kiln_ir::KernelBuilder::new();
    let x = k.param(0, Scalar::F32, 2usize);
    let i = k.global(0, 2usize);
    let v = x.at(&i).load() + c;
    k.store(&x.at(&i), &v);
    k.finish()
}

/// The side of the matmul entry: n×n.
const MATMUL_N: usize = 1024;

/// The matmul entry's inputs, the same in the parent and the baseline child: multiples of 1/8
/// with small numerators, so that every summation order gives the exact product.
fn matmul_inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
    let a = (0..n * n).map(|i| ((i * 7) % 13) as f32 * 0.125 - 0.75).collect();
    let b = (0..n * n).map(|i| ((i * 5) % 11) as f32 * 0.125 - 0.625).collect();
    (a, b)
}

/// Runs `kiln bench --baseline-child matmul_f32_1024` and reads its report. OPENBLAS_CORETYPE
/// is set from the CPU's widest ISA ([`openblas::core_type`]) unless the user set it.
fn openblas_in_child(args: &BenchArgs, threads: usize) -> Result<openblas::ChildReport, CliError> {
    let exe = kiln_exe()?;
    let mut cmd = Process::new(&exe);
    cmd.args(["bench", "--baseline-child", "matmul_f32_1024", "--baseline-threads", &threads.to_string()]);
    if args.quick {
        cmd.arg("--quick");
    }
    let core = openblas::core_type().filter(|_| std::env::var_os(openblas::CORETYPE_ENV).is_none());
    if let Some(core) = core {
        cmd.env(openblas::CORETYPE_ENV, core);
    }
    let out = cmd.output().map_err(|e| CliError::Io { action: "starting", path: exe.clone(), source: e })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(wrong(
            "matmul_f32_1024",
            format!(
                "the OpenBLAS baseline process failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    openblas::ChildReport::parse(&stdout).map_err(|e| wrong("matmul_f32_1024", e))
}

/// The child side of the matmul entry's OpenBLAS baseline: load OpenBLAS with `threads`
/// threads, verify its product against matrixmultiply's (exact, see [`matmul_inputs`]), time
/// `reps` products and print one [`openblas::ChildReport`] line. Fails on a wrong product.
fn matmul_baseline_child(threads: usize, reps: usize) -> Result<String, CliError> {
    let blas = match openblas::OpenBlas::load(openblas::LIBRARY_NAMES, threads) {
        Ok(blas) => blas,
        Err(why) => return Ok(openblas::ChildReport::Unavailable { why }.to_line()),
    };
    let n = MATMUL_N;
    let (a, b) = matmul_inputs(n);
    let mut reference = vec![0f32; n * n];
    baseline::matmul(&a, &b, &mut reference, n);
    let mut out = vec![f32::NAN; n * n];
    blas.matmul(&a, &b, &mut out, n);
    let check = |out: &[f32]| match (0..n * n).find(|&i| out[i] != reference[i]) {
        Some(i) => Err(wrong(
            "matmul_f32_1024",
            format!(
                "the baseline ({}) gives C[{}, {}] = {}, the reference {}",
                blas.name(),
                i / n,
                i % n,
                out[i],
                reference[i]
            ),
        )),
        None => Ok(()),
    };
    check(&out)?;
    out.fill(f32::NAN);
    let seconds = time_reps(reps, || {
        blas.matmul(&a, &b, &mut out, n);
        Ok(())
    })?;
    check(&out)?;
    let name = format!("{}, own process", blas.name());
    Ok(openblas::ChildReport::Timed { name, seconds }.to_line())
}

/// The child side of `cache_disk_hit`: compile the probe kernel from the disk cache named by
/// KILN_CACHE_DIR, time it, verify it, and print `hit MS` or `miss MS`.
fn disk_hit_child(device: &Device) -> Result<String, CliError> {
    let sink = add_const_kernel(7.0).map_err(|e| kiln_err("building the probe kernel", e.into()))?;
    let t = Instant::now();
    let k = device.compile(&sink, Some("disk_probe")).map_err(|e| kiln_err("compiling", e))?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let stats = device.cache().stats();
    let x = Buffer::from_slice(device.allocator(), &[1.0f32, 2.0]).map_err(|e| kiln_err("uploading", e))?;
    k.launch(&[&x], &[]).map_err(|e| kiln_err("running", e))?;
    if x.to_vec::<f32>().map_err(|e| kiln_err("reading", e))? != [8.0, 9.0] {
        return Err(wrong("cache_disk_hit", "the kernel loaded from disk computed a wrong result".into()));
    }
    let kind = if stats.disk_hits == 1 && stats.misses == 0 { "hit" } else { "miss" };
    Ok(format!("{kind} {ms}\n"))
}

/// The `--json` report: `{"device": ..., "results": [{"name", "verified", "unit", "median",
/// "min", "max", "baseline", "baseline_median", "ratio"}, ...]}`; a missing or non-finite number
/// is `null`, and so is `baseline` (what the baseline is) for an entry without one.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    device: String,
    results: Vec<JsonResult<'a>>,
}

#[derive(Debug, Serialize)]
struct JsonResult<'a> {
    name: &'a str,
    verified: bool,
    unit: &'a str,
    median: f64,
    min: f64,
    max: f64,
    baseline: Option<&'a str>,
    baseline_median: Option<f64>,
    ratio: Option<f64>,
}

fn to_json(device: &DeviceSpec, results: &[BenchResult]) -> Result<String, CliError> {
    let report = JsonReport {
        device: device.to_string(),
        results: results
            .iter()
            .map(|r| JsonResult {
                name: r.name,
                verified: r.verified,
                unit: r.unit,
                median: r.kiln.median,
                min: r.kiln.min,
                max: r.kiln.max,
                baseline: r.baseline.map(|_| r.baseline_name),
                baseline_median: r.baseline.map(|b| b.median),
                ratio: r.ratio(),
            })
            .collect(),
    };
    let mut text = serde_json::to_string(&report)
        .map_err(|e| kiln_err("writing the JSON report", kiln_device::Error::Invalid(e.to_string())))?;
    text.push('\n');
    Ok(text)
}

fn to_table(device: &Device, results: &[BenchResult]) -> String {
    let mut s = format!("kiln bench on {} ({})\n\n", device.spec(), device.description());
    let _ = writeln!(
        s,
        "{:<24} {:>8} {:>10} {:>10} {:>10}   {:>10} {:>10} {:>10} {:>7}  baseline",
        "entry", "unit", "median", "min", "max", "b.median", "b.min", "b.max", "ratio"
    );
    for r in results {
        let b =
            |f: fn(&Stats) -> f64| r.baseline.as_ref().map(|x| format!("{:.3}", f(x))).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            s,
            "{:<24} {:>8} {:>10.3} {:>10.3} {:>10.3}   {:>10} {:>10} {:>10} {:>7}  {}",
            r.name,
            r.unit,
            r.kiln.median,
            r.kiln.min,
            r.kiln.max,
            b(|x| x.median),
            b(|x| x.min),
            b(|x| x.max),
            r.ratio().map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into()),
            r.baseline_name
        );
    }
    s.push_str("\nEvery entry was verified against a host reference before it was timed.\n");
    s.push_str("ratio: kiln / baseline for throughputs, baseline / kiln for times (higher is better).\n");
    s
}

/// The threads kiln's CPU kernels run on (its core pool): the OpenBLAS baseline gets as many.
fn kiln_threads() -> usize {
    #[cfg(feature = "cpu")]
    return kiln_cpu::Pool::global().threads();
    #[cfg(not(feature = "cpu"))]
    baseline::threads()
}

/// The baselines: plain Rust on all cores, and the matrixmultiply crate (OpenBLAS: [`openblas`]).
mod baseline {
    pub fn threads() -> usize {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }

    /// `c = a + b`, split into one contiguous chunk per core; with `nontemporal`, `c` is
    /// written with non-temporal stores where the ISA has them (x86-64).
    pub fn stream_add(a: &[f32], b: &[f32], c: &mut [f32], nontemporal: bool) {
        let chunk = c.len().div_ceil(threads());
        std::thread::scope(|s| {
            for ((c, a), b) in c.chunks_mut(chunk).zip(a.chunks(chunk)).zip(b.chunks(chunk)) {
                s.spawn(move || if nontemporal { add_nontemporal(a, b, c) } else { add_plain(a, b, c) });
            }
        });
    }

    fn add_plain(a: &[f32], b: &[f32], c: &mut [f32]) {
        for ((c, a), b) in c.iter_mut().zip(a).zip(b) {
            *c = a + b;
        }
    }

    /// [`add_plain`] with `movntps` stores of 4 lanes from the first 16-byte aligned element
    /// of `c` on (SSE, which every x86-64 has), and a store fence before it returns.
    #[cfg(target_arch = "x86_64")]
    fn add_nontemporal(a: &[f32], b: &[f32], c: &mut [f32]) {
        use std::arch::x86_64::{_mm_add_ps, _mm_loadu_ps, _mm_sfence, _mm_stream_ps};
        let n = c.len().min(a.len()).min(b.len());
        let head = c.as_ptr().align_offset(16).min(n);
        add_plain(&a[..head], &b[..head], &mut c[..head]);
        let body = head + (n - head) / 4 * 4;
        for i in (head..body).step_by(4) {
            // SAFETY: i + 4 <= body <= n, the length of all three slices, so the loads read
            // and the store writes in bounds; `c.as_ptr() + i` is 16-byte aligned (i starts
            // at the first aligned element and steps 16 bytes), as movntps requires.
            unsafe {
                let v = _mm_add_ps(_mm_loadu_ps(a.as_ptr().add(i)), _mm_loadu_ps(b.as_ptr().add(i)));
                _mm_stream_ps(c.as_mut_ptr().add(i), v);
            }
        }
        // SAFETY: sfence has no memory operands; it orders the stores above before later ones.
        unsafe { _mm_sfence() };
        add_plain(&a[body..n], &b[body..n], &mut c[body..n]);
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn add_nontemporal(a: &[f32], b: &[f32], c: &mut [f32]) {
        add_plain(a, b, c)
    }

    /// Sum streamed on all cores, eight independent lanes per thread so the compiler
    /// vectorizes it.
    pub fn sum(a: &[f32]) -> f32 {
        let chunk = a.len().div_ceil(threads());
        std::thread::scope(|s| {
            let parts: Vec<_> = a
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        let mut lanes = [0f32; 16];
                        let mut it = part.chunks_exact(16);
                        for v in &mut it {
                            for (l, x) in lanes.iter_mut().zip(v) {
                                *l += x;
                            }
                        }
                        lanes.iter().sum::<f32>() + it.remainder().iter().sum::<f32>()
                    })
                })
                .collect();
            parts.into_iter().map(|p| p.join().unwrap_or(f32::NAN)).sum()
        })
    }

    /// `c = a · b` (n×n, row-major) with the matrixmultiply crate (threaded).
    pub fn matmul(a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
        if a.len() < n * n || b.len() < n * n || c.len() < n * n {
            return; // leaves `c` as it was: the caller's verification reports it
        }
        // SAFETY: the three slices hold n×n elements (checked above), row-major with row
        // stride n and column stride 1, and `c` does not alias `a` or `b` (it is `&mut`).
        unsafe {
            matrixmultiply::sgemm(
                n,
                n,
                n,
                1.0,
                a.as_ptr(),
                n as isize,
                1,
                b.as_ptr(),
                n as isize,
                1,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            );
        }
    }
}

/// This `kiln` executable, to re-run as a child process.
fn kiln_exe() -> Result<std::path::PathBuf, CliError> {
    std::env::current_exe().map_err(|e| CliError::Io {
        action: "finding",
        path: "the kiln executable".into(),
        source: e,
    })
}

/// This `kiln` executable, for entries that time child processes, and a private folder with an
/// unpredictable name starting with `prefix` (removed when it drops).
fn exe_and_private_dir(prefix: &str) -> Result<(std::path::PathBuf, tempfile::TempDir), CliError> {
    let exe = kiln_exe()?;
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| CliError::io("creating a folder in", &std::env::temp_dir(), e))?;
    Ok((exe, dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_outputs_beyond_every_cache_are_stored_nontemporally() {
        let none = kiln_device::DeviceProperties::default();
        assert!(!exceeds_cache(&none, 64 << 10) && exceeds_cache(&none, 9 << 20));
        let cpu = kiln_device::DeviceProperties { l1d_bytes: Some(32 << 10), l3_bytes: Some(32 << 20), ..none };
        assert!(!exceeds_cache(&cpu, 16 << 20) && exceeds_cache(&cpu, 64 << 20));
    }

    #[test]
    fn the_json_report_escapes_names_and_keeps_its_schema() {
        let stats = Stats { median: 2.0, min: 1.0, max: 3.0 };
        let result = |name, baseline| BenchResult {
            name,
            unit: "GB/s",
            higher_is_better: true,
            verified: true,
            kiln: stats,
            baseline,
            baseline_name: "OpenBLAS 0.3 \"x\", 2 threads",
        };
        let odd = "q\"uote\\back\nslash";
        let results = [result(odd, Some(Stats { median: 4.0, ..stats })), result("plain", None)];
        let json = to_json(&DeviceSpec::new("OPENCL", 1), &results).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(v["device"], "OPENCL:1");
        let first = &v["results"][0];
        assert_eq!(first["name"], odd);
        assert_eq!(
            first.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()),
            Some(
                ["baseline", "baseline_median", "max", "median", "min", "name", "ratio", "unit", "verified"]
                    .map(String::from)
                    .to_vec()
            )
        );
        assert_eq!((first["median"].as_f64(), first["baseline_median"].as_f64()), (Some(2.0), Some(4.0)));
        assert_eq!(first["ratio"].as_f64(), Some(0.5));
        assert_eq!(first["baseline"], "OpenBLAS 0.3 \"x\", 2 threads", "the JSON names the baseline");
        let second = &v["results"][1];
        assert!(second["baseline"].is_null() && second["baseline_median"].is_null() && second["ratio"].is_null());
        let nan = [BenchResult { kiln: Stats { median: f64::NAN, ..stats }, ..result("nan", None) }];
        let v: serde_json::Value = serde_json::from_str(&to_json(&DeviceSpec::new("CPU", 0), &nan).unwrap()).unwrap();
        assert!(v["results"][0]["median"].is_null(), "a non-finite figure is null, as before");
    }
}
