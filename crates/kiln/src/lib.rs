//! The `kiln` command line: list devices, compile and run kernel text files, inspect the
//! kernel cache.
//!
//! Each subcommand is one module with a `USAGE` text, an argument parser and a function
//! that does the work and returns what to print on stdout. [`main`] dispatches on the
//! subcommand name through [`COMMANDS`]; adding a subcommand (such as `bench`, which builds
//! on [`session`] like `run` does) is one module plus one entry in that table.
//! Nothing here panics on user input: every failure is a [`CliError`], printed as
//! `error: <message>` with its cause chain, exit status 2 for usage errors and 1 otherwise.

pub mod args;
pub mod bench;
pub mod cache;
pub mod compile;
pub mod devices;
pub mod error;
pub mod npy;
pub mod run;
pub mod session;
pub mod show;
pub mod trace;

use std::ffi::OsString;
use std::io::Write;

use args::{ArgParser, Token};
use error::CliError;

/// A subcommand: its name, a one-line summary, its usage text and what it does with the
/// remaining arguments (returning its stdout).
pub struct Command {
    pub name: &'static str,
    pub summary: &'static str,
    pub usage: &'static str,
    pub run: fn(&mut ArgParser) -> Result<String, CliError>,
}

/// Every subcommand, in the order `kiln help` lists them.
pub const COMMANDS: &[Command] = &[
    Command {
        name: "devices",
        summary: "list the devices of every backend",
        usage: devices::USAGE,
        run: |p| devices::run(&devices::DevicesArgs::parse(p)?),
    },
    Command {
        name: "compile",
        summary: "render a kernel file and print its source, metadata or linear order",
        usage: compile::USAGE,
        run: |p| compile::run(&compile::CompileArgs::parse(p)?),
    },
    Command {
        name: "run",
        summary: "run a kernel file once on .npy inputs",
        usage: run::USAGE,
        run: |p| run::run(&run::RunArgs::parse(p)?),
    },
    Command {
        name: "bench",
        summary: "verify and time kiln's benchmark suite against same-run baselines",
        usage: bench::USAGE,
        run: |p| bench::run(&bench::BenchArgs::parse(p)?),
    },
    Command {
        name: "cache",
        summary: "show or clear the on-disk kernel cache",
        usage: cache::USAGE,
        run: |p| cache::run(&cache::CacheArgs::parse(p)?),
    },
];

fn help() -> String {
    let mut s =
        String::from("kiln: compile and run kernels on CPU and OpenCL devices\n\nUsage: kiln <command> [options]\n\n");
    for c in COMMANDS {
        s.push_str(&format!("  {:<9} {}\n", c.name, c.summary));
    }
    s.push_str("  help      show this text, or `kiln help <command>`\n\n");
    s.push_str("Examples:\n");
    s.push_str("  kiln devices --verbose\n");
    s.push_str("  kiln compile examples/kernels/add.kiln --emit spec\n");
    s.push_str("  kiln run examples/kernels/sum.kiln --var n=8 --in 0=examples/data/ramp8.npy\n\n");
    s.push_str(
        "Environment: KILN_CC (C compiler), KILN_CACHE_DIR (kernel cache folder), KILN_CACHE=0 (no disk cache)\n",
    );
    s
}

/// Runs the command line `args` (without the program name) and returns the exit status.
/// Output goes to stdout, errors to stderr as `error: ...`.
pub fn main(args: impl IntoIterator<Item = OsString>) -> i32 {
    session::register_backends();
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

fn dispatch(args: impl IntoIterator<Item = OsString>) -> Result<String, CliError> {
    let mut p = ArgParser::new(args)?;
    let name = match p.next_token()? {
        None => return Err(CliError::Usage(format!("missing command\n\n{}", help()))),
        Some(Token::Positional(name)) => name,
        Some(Token::Flag(f, _)) if matches!(f.as_str(), "-h" | "--help") => return Ok(help()),
        Some(Token::Flag(f, _)) if matches!(f.as_str(), "-V" | "--version") => {
            return Ok(format!("kiln {}\n", env!("CARGO_PKG_VERSION")));
        }
        Some(Token::Flag(f, _)) => return Err(CliError::Usage(format!("unknown option {f} (expected a command)"))),
    };
    if name == "help" {
        return match p.next_token()? {
            Some(Token::Positional(c)) => find(&c).map(|c| format!("{}\n", c.usage)),
            _ => Ok(help()),
        };
    }
    let command = find(&name)?;
    if wants_help(&p) {
        return Ok(format!("{}\n", command.usage));
    }
    (command.run)(&mut p)
}

fn find(name: &str) -> Result<&'static Command, CliError> {
    COMMANDS.iter().find(|c| c.name == name).ok_or_else(|| {
        let names: Vec<&str> = COMMANDS.iter().map(|c| c.name).collect();
        CliError::Usage(format!("unknown command `{name}` (commands: {})", names.join(", ")))
    })
}

/// Whether `-h`/`--help` appears among the remaining arguments (before any `--`).
fn wants_help(p: &ArgParser) -> bool {
    p.remaining().iter().take_while(|a| *a != "--").any(|a| a == "-h" || a == "--help")
}

/// The README's Rust example is compiled and run as a doctest, so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
