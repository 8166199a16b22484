//! `kiln run-plan`: load a saved plan (`kiln_runtime::saved`) on a device, run it once on
//! `.npy` inputs by name, and save or summarize its outputs. No Python, no recorder: the plan
//! file is all a model needs.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln_ir::DeviceSpec;
use kiln_runtime::Profile;
use kiln_runtime::saved::{HostTensor, LoadOptions, LoadProgress, LoadedPlan, PlanFileError, TensorRef};

use crate::error::CliError;
use crate::npy::{self, NpyArray};
use crate::run::{Destination, check_destinations, first_repeat};
use crate::session;

/// `kiln run-plan MODEL.kplan [--in NAME=FILE.npy]... [--out NAME=FILE.npy]... [--var NAME=VALUE]... [--device D] [--compiler C]`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Every input of the plan needs an --in; its dtype and shape must be the plan's, where a named \
dimension (a plan variable such as `batch`) takes the array's size. Outputs without --out are summarized on stdout. \
While kernels compile, progress is shown on stderr when it is a terminal.")]
pub struct RunPlanArgs {
    /// The plan file (see docs/saved-plans.md)
    pub file: PathBuf,
    /// The device to load the plan on (a plan saved on one device loads on any)
    #[arg(short, long, value_name = "D", default_value = "CPU", value_parser = session::parse_device)]
    pub device: DeviceSpec,
    /// The device's compiler pair to use instead of its default (`kiln devices` lists them)
    #[arg(long, value_name = "NAME")]
    pub compiler: Option<String>,
    /// Fill input NAME from a NumPy file
    #[arg(long = "in", value_name = "NAME=FILE.npy", value_parser = parse_name_file)]
    pub ins: Vec<(String, PathBuf)>,
    /// Save output NAME after the run
    #[arg(long = "out", value_name = "NAME=FILE.npy", value_parser = parse_name_file)]
    pub outs: Vec<(String, PathBuf)>,
    /// Bind a plan variable no input's shape names (the others come from the inputs)
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = session::parse_var)]
    pub vars: Vec<(String, i64)>,
    /// Print how long loading and the run took, on stderr
    #[arg(long)]
    pub timings: bool,
    /// Run the plan this many times on the same inputs (each run's outputs must equal the
    /// first's, bit for bit); with --timings, the median of the runs after the first is printed
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// After the runs, run once more timing every node: write the trace to FILE (Chrome trace
    /// JSON: chrome://tracing, Perfetto) and print the kernels that took longest, on stderr
    #[arg(long, value_name = "FILE.json")]
    pub profile: Option<PathBuf>,
}

/// Parses `NAME=FILE.npy` (a clap value parser).
fn parse_name_file(text: &str) -> Result<(String, PathBuf), String> {
    let (name, file) = session::split_pair(text, "NAME=FILE.npy (e.g. x=input.npy)")?;
    Ok((name, PathBuf::from(file)))
}

impl RunPlanArgs {
    /// Names given twice and destinations that are one file.
    fn check(&self) -> Result<(), CliError> {
        for (flag, list) in [("--in", &self.ins), ("--out", &self.outs)] {
            if let Some(name) = first_repeat(list.iter().map(|(n, _)| n)) {
                return Err(CliError::Usage(format!("{flag} names `{name}` twice; give each once")));
            }
        }
        if let Some(name) = first_repeat(self.vars.iter().map(|(n, _)| n)) {
            return Err(CliError::Usage(format!("--var {name} is given twice; give each variable once")));
        }
        check_destinations(self.outs.iter().map(|(n, p)| (format!("--out {n}={}", p.display()), p.as_path())))
    }
}

/// A plan error with what the command was doing; an input that does not fit is a mismatch
/// naming the input and what the plan expects.
fn plan_error(what: impl FnOnce() -> String) -> impl FnOnce(PlanFileError) -> CliError {
    move |e| match e {
        PlanFileError::Input { name, message } => CliError::Mismatch(format!("input `{name}`: {message}")),
        source => CliError::Plan { context: what(), source: Box::new(source) },
    }
}

/// The bar shown on a terminal while kernels compile, from the first report on (when the
/// kernel count is known); hidden elsewhere.
fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::hidden();
    if let Ok(style) =
        ProgressStyle::with_template("kiln run-plan: compiling kernels [{pos}/{len}] {spinner} ({elapsed})")
    {
        bar.set_style(style);
    }
    bar
}

/// Moves `bar` to `p`, showing it (on a terminal) at the first report.
fn show_progress(bar: &ProgressBar, p: LoadProgress) {
    if bar.length() != Some(p.total as u64) {
        bar.set_length(p.total as u64);
        if std::io::stderr().is_terminal() {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.enable_steady_tick(Duration::from_millis(120));
        }
    }
    // Reports come from several threads: never move back.
    if p.compiled as u64 > bar.position() {
        bar.set_position(p.compiled as u64);
    }
}

/// Runs `kiln run-plan`; returns the text for stdout.
pub fn run(args: &RunPlanArgs) -> Result<String, CliError> {
    args.check()?;
    let mut outs = Vec::with_capacity(args.outs.len());
    for (name, path) in &args.outs {
        outs.push((name.clone(), Destination::open("cannot write output file", path)?));
    }
    let device = session::open_device(&args.device, args.compiler.as_deref())?;

    let start = Instant::now();
    let bar = progress_bar();
    let report = |p: LoadProgress| show_progress(&bar, p);
    let options = LoadOptions { progress: Some(&report), ..LoadOptions::default() };
    let loaded = LoadedPlan::load_with(&args.file, &device, &options);
    bar.finish_and_clear();
    let mut plan =
        loaded.map_err(plan_error(|| format!("cannot load plan {} on {}", args.file.display(), args.device)))?;
    let loaded_in = start.elapsed();

    // Names first, before any input file is read.
    let list = |specs: Vec<String>| if specs.is_empty() { "none".to_string() } else { specs.join(", ") };
    let inputs = list(plan.inputs().map(|t| format!("{} ({} {})", t.name, t.dtype, t.shape_text())).collect());
    let outputs = list(plan.outputs().map(|t| format!("{} ({} {})", t.name, t.dtype, t.shape_text())).collect());
    for (name, _) in &args.ins {
        if plan.input_buffer(name).is_none() {
            return Err(CliError::Mismatch(format!(
                "--in {name}: the plan has no input `{name}`; its inputs: {inputs}"
            )));
        }
    }
    for (name, _) in &args.outs {
        if plan.output_buffer(name).is_none() {
            return Err(CliError::Mismatch(format!(
                "--out {name}: the plan has no output `{name}`; its outputs: {outputs}"
            )));
        }
    }
    if let Some(t) = plan.inputs().find(|t| !args.ins.iter().any(|(n, _)| *n == t.name)) {
        return Err(CliError::Mismatch(format!(
            "input `{}` ({} {}) has no --in; the plan's inputs: {inputs}",
            t.name,
            t.dtype,
            t.shape_text()
        )));
    }
    let arrays = args
        .ins
        .iter()
        .map(|(name, path)| Ok((name.as_str(), read_npy(path)?)))
        .collect::<Result<Vec<_>, CliError>>()?;
    let refs: Vec<(&str, TensorRef<'_>)> =
        arrays.iter().map(|(name, a)| (*name, TensorRef { dtype: a.scalar, shape: &a.shape, data: &a.data })).collect();
    let vars: Vec<(&str, i64)> = args.vars.iter().map(|(n, v)| (n.as_str(), *v)).collect();

    let failed = || format!("plan {} failed", args.file.display());
    let start = Instant::now();
    let results = plan.run_with(&refs, &vars).map_err(plan_error(failed))?;
    let ran_in = start.elapsed();
    let mut again = Vec::new();
    for run in 2..=args.runs {
        let start = Instant::now();
        let later = plan.run_with(&refs, &vars).map_err(plan_error(failed))?;
        again.push(start.elapsed());
        if let Some(out) = later.iter().zip(&results).find(|(a, b)| a.data != b.data).map(|(a, _)| &a.name) {
            return Err(CliError::Mismatch(format!(
                "run {run} of plan {} gave other bits for output `{out}` than the first run on the same inputs",
                args.file.display()
            )));
        }
    }
    again.sort();

    if let Some(path) = &args.profile {
        let profile = plan.profile_with(&refs, &vars).map_err(plan_error(failed))?;
        std::fs::write(path, profile.to_chrome_trace())
            .map_err(|e| CliError::io("cannot write the profile", path, e))?;
        eprint!("{}", profile_summary(&profile, 12));
    }

    let mut stdout = String::new();
    for out in results {
        match outs.iter().position(|(n, _)| *n == out.name).map(|i| outs.swap_remove(i).1) {
            Some(dest) => write_npy(dest, out)?,
            None => stdout.push_str(&summary(&out)),
        }
    }
    if args.timings {
        let s = plan.stats();
        eprintln!(
            "loaded {} ({} kernels, {} nodes, {} of constants, {} mapped) on {} in {:.2} ms; ran in {:.2} ms",
            crate::show::bytes(s.file_bytes as usize),
            s.kernels,
            s.nodes,
            crate::show::bytes(s.constant_bytes as usize),
            crate::show::bytes(s.mapped_bytes as usize),
            args.device,
            loaded_in.as_secs_f64() * 1e3,
            ran_in.as_secs_f64() * 1e3
        );
        if let Some(median) = again.get(again.len() / 2) {
            eprintln!("{} more runs: median {:.2} ms, same outputs", again.len(), median.as_secs_f64() * 1e3);
        }
    }
    Ok(stdout)
}

/// What a profiled run spent its time on: the wall time, how much of it some node ran, and
/// the `top` kernels (by name) that took longest in all, with their share of the wall time.
fn profile_summary(profile: &Profile, top: usize) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let wall = ms(profile.wall).max(f64::MIN_POSITIVE);
    // the time some node ran: the union of the nodes' intervals
    let mut spans: Vec<(Duration, Duration)> = profile.events.iter().map(|e| (e.start, e.end)).collect();
    spans.sort();
    let (mut busy, mut open): (Duration, Option<(Duration, Duration)>) = (Duration::ZERO, None);
    for (start, end) in spans {
        open = match open {
            Some((s, e)) if start <= e => Some((s, e.max(end))),
            Some((s, e)) => {
                busy += e - s;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    busy += open.map_or(Duration::ZERO, |(s, e)| e - s);
    let mut by_name: Vec<(&str, usize, Duration)> = Vec::new();
    for e in &profile.events {
        match by_name.iter_mut().find(|(n, _, _)| *n == e.name) {
            Some((_, count, total)) => {
                *count += 1;
                *total += e.end - e.start;
            }
            None => by_name.push((&e.name, 1, e.end - e.start)),
        }
    }
    by_name.sort_by_key(|&(_, _, total)| std::cmp::Reverse(total));
    let mut out = format!(
        "profiled run: {} nodes in {:.3} ms, some node running for {:.3} ms of it ({:.0}%); the longest:\n",
        profile.events.len(),
        wall,
        ms(busy),
        100.0 * ms(busy) / wall
    );
    for (name, count, total) in by_name.iter().take(top) {
        let times = if *count > 1 { format!(" ({count} runs)") } else { String::new() };
        out.push_str(&format!("  {:9.3} ms {:5.1}%  {name}{times}\n", ms(*total), 100.0 * ms(*total) / wall));
    }
    out
}

fn read_npy(path: &Path) -> Result<NpyArray, CliError> {
    let bytes = std::fs::read(path).map_err(|e| CliError::io("cannot read input file", path, e))?;
    npy::read(&bytes).map_err(|source| CliError::Npy { path: path.to_path_buf(), source })
}

fn write_npy(dest: Destination, out: HostTensor) -> Result<(), CliError> {
    let npy_error = |source| CliError::Npy { path: dest.path.clone(), source };
    let array = NpyArray { scalar: out.dtype, shape: out.shape, data: out.data };
    let bytes = npy::write(&array).map_err(npy_error)?;
    dest.commit(&bytes)
}

/// `y: f32 (2, 8) [0.1, 0.2, ...]`: at most 8 leading elements.
fn summary(out: &HostTensor) -> String {
    let n = out.data.len() / out.dtype.size().max(1);
    let shown: Vec<String> = (0..n.min(8)).map(|i| npy::element_text(out.dtype, &out.data, i)).collect();
    let more = if n > 8 { format!(", ... ({} more)", n - 8) } else { String::new() };
    let shape = NpyArray { scalar: out.dtype, shape: out.shape.clone(), data: Vec::new() }.shape_text();
    format!("{}: {} {shape} [{}{more}]\n", out.name, out.dtype, shown.join(", "))
}
