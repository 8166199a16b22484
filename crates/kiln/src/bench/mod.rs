//! `kiln bench`: kiln's main job. Every entry first checks its output against a reference
//! computed on the host, then times repetitions and reports median, min and max, next to a
//! baseline measured in the same run where one exists.
//!
//! Ratios are always "higher is better": kiln / baseline for throughputs, baseline / kiln
//! for times. Nothing here is hard-coded: each figure comes from this run's clocks.
//!
//! - this module: the command's arguments (the device is parsed and opened here, in
//!   [`run`], and nowhere else), the list of entries and the timing helpers they share;
//! - `entries`: what each entry runs and verifies;
//! - `baselines`: what the entries are compared with;
//! - `report`: the statistics, the table and the `--json` report;
//! - [`kernels`]: the benchmark kernels.

mod baselines;
mod entries;
pub mod kernels;
pub mod plan;
mod report;

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use clap::builder::PossibleValuesParser;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_device::kiln_ir::DeviceSpec;

pub use baselines::openblas;
pub use report::{BenchResult, Row, Skipped, Stats};

use crate::error::CliError;
use crate::session;

/// `kiln bench [--device D] [--json] [--quick] [--only NAME[,NAME...]]`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    long_about = "Runs kiln's benchmark suite on one device. Each entry verifies its result against a host \
reference before it is timed, and most are compared with a baseline measured in the same run (plain Rust \
loops on all cores; for matmul OpenBLAS's cblas_sgemm on kiln's thread count, in a process of its own \
with OPENBLAS_CORETYPE set from the CPU's widest ISA unless already set, when libopenblas.so.0 loads, \
else the matrixmultiply crate after kiln's reps, or as KILN_BENCH_MATMUL_BASELINE=auto|openblas|matrixmultiply says). \
bandwidth_limit is the memory bandwidth measured as STREAM does (its copy and add over arrays beyond the cache, \
on all cores, with plain and with non-temporal stores of the CPU's widest vector; the best median counts): \
the ceiling of the streaming entries, and add_f32_16m's baseline. compile_cold times one small kernel rendered, compiled and \
loaded without the cache; compile_throughput counts kernels per second for 64 new small kernels compiled as \
one batch on all cores (Device::compile_many), against the same number compiled one by one. warm_run_process is the wall time of a whole `kiln run` \
process (an 8-element add on a warm kernel cache), against a bare `kiln --version` process. \
allreduce_devices/R/SIZE is an all_reduce (sum, f32, SIZE bytes a rank) over R devices of this process \
(CPU:0..R-1 on the CPU) through an in-process channel, in GB/s of one rank's bytes, against R threads each \
copying one rank's bytes (the machine's copy bandwidth). allreduce_mpi/R/SIZE, run under mpirun with 4 ranks \
or more and named with --only (`mpirun --oversubscribe -np 4 kiln bench --only allreduce_mpi --json`, from \
a kiln built with the `mpi` feature), is the same over an MPI channel of the job's first R ranks, against \
MPI_Allreduce on the same memory; every rank checks its sum and rank 0 reports.",
    after_help = "On a terminal, progress is shown on stderr (not with --json). Quote medians: these machines \
are shared and noisy."
)]
pub struct BenchArgs {
    /// The device to benchmark
    #[arg(short, long, value_name = "D", default_value = "CPU", value_parser = session::parse_device)]
    pub device: DeviceSpec,
    /// The device's compiler pairs to run the entries with, one after another, instead of its
    /// default (`kiln devices` lists them: the CPU's `cc`, `llvm`, `cc-avx2`, `cc-sse2`); `all`
    /// for every pair. The report compares each later pair with the first.
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub compiler: Vec<String>,
    /// Print {"device", "results": [...]} instead of a table
    #[arg(long)]
    pub json: bool,
    /// Fewer repetitions and a smaller compile_throughput batch (for a smoke run; figures are noisier)
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
    "matmul_f32_4096",
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
    "allreduce_devices",
    "allreduce_mpi",
];

/// Entries that run only when `--only` names them: `allreduce_mpi` runs under `mpirun`.
const OPT_IN: &[&str] = &["allreduce_mpi"];

fn kiln_err(context: &str, source: kiln_device::Error) -> CliError {
    CliError::Kiln { context: context.to_string(), source }
}

/// The error of allocating or uploading a bench buffer: [`CliError::CannotRun`] when the device
/// cannot hold a buffer that size (beyond one of its fixed limits, [`kiln_device::Error::Limit`],
/// or its memory, [`kiln_device::Error::OutOfMemory`]), so that the entry is reported as skipped;
/// any other failure is the error it is.
fn alloc_err(what: &str, e: kiln_device::Error) -> CliError {
    match e.root_cause() {
        kiln_device::Error::Limit { .. } | kiln_device::Error::OutOfMemory { .. } => {
            CliError::CannotRun(format!("{what}: {e}"))
        }
        _ => kiln_err(what, e),
    }
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
        return baselines::matmul_baseline_child(args.baseline_threads, reps(args));
    }
    kiln_backends::register_all();
    let default = session::open_device(&args.device, None)?;
    let pairs: Vec<String> = match args.compiler.as_slice() {
        [] => default.compiler_names().into_iter().take(1).collect(),
        [all] if all == "all" => default.compiler_names(),
        names => names.to_vec(),
    };
    // One device per pair, each seeing that pair alone (as do the processes its entries start).
    let mut benches = Vec::new();
    for pair in &pairs {
        let args = BenchArgs { compiler: vec![pair.clone()], ..args.clone() };
        let device = session::open_device(&args.device, Some(pair))?;
        if args.disk_hit_child {
            return entries::disk_hit_child(&device);
        }
        benches.push((pair, entries::Bench { device, reps: reps(&args), quick: args.quick }, args));
    }
    let named = |name: &str| args.only.as_ref().is_some_and(|o| o.iter().any(|n| n == name));
    let applies = |name: &str| benches.iter().all(|(_, bench, _)| bench.applies(name));
    if let Some(name) = ENTRIES.iter().find(|name| named(name) && !applies(name)) {
        return Err(CliError::Usage(format!(
            "bench entry `{name}` runs on GPU devices (CUDA) only, not on {}",
            args.device
        )));
    }
    // Every entry of a whole run is reported: one that does not apply to this device, or that
    // cannot run on it, as skipped with the reason.
    let chosen: Vec<&'static str> =
        ENTRIES.iter().copied().filter(|name| named(name) || (args.only.is_none() && !OPT_IN.contains(name))).collect();
    // Entry by entry, every pair in turn, so that the pairs of one entry are timed close together.
    let progress = progress_bar(chosen.len() * benches.len(), args.json);
    let mut results = Vec::new();
    for name in chosen {
        for (pair, bench, args) in &benches {
            progress.set_message(format!("{name} ({pair})"));
            for r in bench.rows(name, args)? {
                progress.println(match &r {
                    Ok(r) => format!("{:<24} {pair:>9} {:>10.3} {} (median)", r.name, r.kiln.median, r.unit),
                    Err(skipped) => format!("{:<24} {pair:>9} skipped: {}", skipped.name, skipped.reason),
                });
                results.push(report::PairResult { compiler: pair.to_string(), result: r });
            }
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    // Under mpirun every rank measures; rank 0 reports.
    if named("allreduce_mpi") && kiln_mpi::world_rank().is_ok_and(|r| r != 0) {
        return Ok(String::new());
    }
    Ok(if args.json {
        report::to_json(&args.device, &results)?
    } else {
        report::to_table(default.spec(), default.description(), &results)
    })
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

/// This `kiln` executable, to re-run as a child process.
fn kiln_exe() -> Result<std::path::PathBuf, CliError> {
    std::env::current_exe().map_err(|e| CliError::Io {
        action: "finding",
        path: "the kiln executable".into(),
        source: e,
    })
}
