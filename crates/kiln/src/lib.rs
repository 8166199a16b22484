//! The `kiln` command line: list devices, compile and run kernel text files, run saved plans,
//! benchmark a device, inspect the kernel cache.
//!
//! The command line is declared with clap's derive API in [`Cli`]: each subcommand is one
//! module with a `clap::Args` struct (its flags and generated help) and a function that
//! does the work and returns what to print on stdout. [`main`] parses and dispatches;
//! adding a subcommand is one module plus one [`Command`] variant.
//! Nothing here panics on user input: every failure is a [`CliError`], printed as
//! `error: <message>` with its cause chain, exit status 2 for usage errors and 1 otherwise.
//!
//! The crate is the top of kiln (see `docs/architecture.md`): it opens devices through
//! `kiln-device`'s registry (the backends are `kiln-backends`' features `cpu`, `opencl`,
//! `cuda` and `webgpu`), replays plans with `kiln-runtime`, and adds what only a command line
//! needs: kernel files and `--var` values ([`session`]), `.npy` arrays ([`npy`]), human-readable views
//! ([`show`]), Chrome traces ([`trace`]) and the benchmark suite ([`bench`](mod@bench)).
//! The binary only calls [`main`] (on a thread with a big stack), so the library runs the
//! same command lines a shell does:
//!
//! ```
//! use std::ffi::OsString;
//! let add = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/kernels/add.kiln");
//! // `kiln compile add.kiln --emit spec`: the buffers, variables and access proofs, on stdout.
//! assert_eq!(kiln::main(["compile", add, "--emit", "spec"].map(OsString::from)), 0);
//! // A usage error is reported on stderr with exit status 2.
//! assert_eq!(kiln::main(["compile", add, "--emit", "nonsense"].map(OsString::from)), 2);
//! ```

pub mod bench;
pub mod cache;
pub mod compile;
pub mod devices;
pub mod error;
pub mod npy;
pub mod run;
pub mod run_plan;
pub mod session;
pub mod show;
pub mod trace;

use std::ffi::OsString;
use std::io::Write;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use error::CliError;

const AFTER_HELP: &str = "\
Examples:
  kiln devices --verbose
  kiln compile examples/kernels/add.kiln --emit spec
  kiln compile examples/kernels/add.kiln --target cuda:sm_90 --emit ptx
  kiln run examples/kernels/sum.kiln --var n=8 --in 0=examples/data/ramp8.npy
  kiln run-plan model.kplan --in x=x.npy --out y=y.npy --device OPENCL:0
  kiln bench --quick --only add_f32_16m

Environment: KILN_CC (C compiler), KILN_CACHE_DIR (kernel cache folder), KILN_CACHE=0 (no disk cache),
KILN_NVRTC (libnvrtc.so), KILN_PTXAS (ptxas)";

/// The whole command line.
#[derive(Debug, Parser)]
#[command(
    name = "kiln",
    version,
    about = "kiln: compile and run kernels on CPU, OpenCL, CUDA and WebGPU devices",
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// `None` when no subcommand was given: a usage error that prints the help.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Every subcommand, in the order `kiln --help` lists them.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the devices of every backend
    Devices(devices::DevicesArgs),
    /// Render a kernel file and print its source, metadata or linear order
    Compile(compile::CompileArgs),
    /// Run a kernel file once on .npy inputs
    Run(run::RunArgs),
    /// Load a saved plan on a device and run it once on .npy inputs by name
    RunPlan(run_plan::RunPlanArgs),
    /// Verify and time kiln's benchmark suite against same-run baselines
    Bench(bench::BenchArgs),
    /// Show or clear the on-disk kernel cache
    Cache(cache::CacheArgs),
    /// Print a shell completion script (e.g. `kiln completions bash > ~/.local/share/bash-completion/completions/kiln`)
    Completions {
        /// The shell to complete for
        shell: clap_complete::Shell,
    },
}

/// The command line: the derived [`Cli`], with every `--device` help naming the backends
/// of the device registry ([`session::with_device_help`]) and `compile`'s `--emit` and
/// `--target` the backends' offline targets ([`compile::with_target_help`]).
fn command() -> clap::Command {
    compile::with_target_help(session::with_device_help(Cli::command()))
}

/// Runs the command line `args` (without the program name) and returns the exit status.
/// Output goes to stdout (`--help` and `--version` included), errors to stderr as `error: ...`.
pub fn main(args: impl IntoIterator<Item = OsString>) -> i32 {
    kiln_backends::register_all();
    match dispatch(args) {
        Ok(out) => {
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`kiln ... | head`) is not an error worth reporting.
            let _ = stdout.write_all(out.as_bytes()).and_then(|_| stdout.flush());
            0
        }
        Err(e) => {
            eprintln!("error: {}", e.report());
            e.exit_code()
        }
    }
}

/// `e` with a "similar subcommand" tip where clap found none but a command is one typo away
/// (clap's similarity misses swapped letters: `kiln rnu`).
fn suggest_subcommand(mut e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::InvalidSubcommand || e.get(ContextKind::SuggestedSubcommand).is_some() {
        return e;
    }
    let Some(ContextValue::String(typed)) = e.get(ContextKind::InvalidSubcommand) else { return e };
    let typed = typed.clone();
    let near = command()
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .filter(|name| kiln_ir::edit_distance(&typed, name) <= 2.min(name.len() / 2))
        .min_by_key(|name| kiln_ir::edit_distance(&typed, name));
    if let Some(name) = near {
        e.insert(ContextKind::SuggestedSubcommand, ContextValue::String(name));
    }
    e
}

fn dispatch(args: impl IntoIterator<Item = OsString>) -> Result<String, CliError> {
    let parsed = command()
        .try_get_matches_from(std::iter::once(OsString::from("kiln")).chain(args))
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        // `--help`, `help` and `--version` are answers, not errors.
        Err(e) if !e.use_stderr() => {
            let mut text = e.to_string();
            if !text.ends_with('\n') {
                text.push('\n');
            }
            return Ok(text);
        }
        Err(e) => return Err(CliError::Args(suggest_subcommand(e))),
    };
    match cli.command {
        None => {
            let mut cli = command();
            let names: Vec<String> = cli.get_subcommands().map(|c| c.get_name().to_string()).collect();
            let message = format!("missing command (commands: {})", names.join(", "));
            Err(CliError::Args(cli.error(clap::error::ErrorKind::MissingSubcommand, message)))
        }
        Some(Command::Devices(a)) => devices::run(&a),
        Some(Command::Compile(a)) => compile::run(&a),
        Some(Command::Run(a)) => run::run(&a),
        Some(Command::RunPlan(a)) => run_plan::run(&a),
        Some(Command::Bench(a)) => bench::run(&a),
        Some(Command::Cache(a)) => cache::run(&a),
        Some(Command::Completions { shell }) => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command(), "kiln", &mut script);
            Ok(String::from_utf8_lossy(&script).into_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}

/// The README's Rust example is compiled and run as a doctest, so it cannot rot (it opens
/// the CPU backend).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
