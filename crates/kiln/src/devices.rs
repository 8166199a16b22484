//! `kiln devices`: every device of every backend this binary knows, and why a backend is
//! unavailable when it is.

use std::fmt::Write;

use crate::cache;
use crate::error::CliError;
use crate::show::bytes;

/// `kiln devices [--verbose]`.
#[derive(Debug, Default, clap::Args)]
#[command(after_help = "Lists every device of every backend this kiln registers (the CPU; OPENCL:n when an OpenCL \
driver is present; CUDA:n when the NVIDIA driver is present; WEBGPU:n, one per wgpu adapter), with each open device's compiler pairs, the default \
first (the CPU's: llvm, LLVM 16 in process for the host's instruction set, the default where libLLVM 16 is installed and KILN_CC is unset; cc, the C compiler for the same set; cc-avx2 and cc-sse2 for older ones; pick one with --compiler, or the default with KILN_CPU_COMPILER); a pair a device cannot offer on this machine is listed as not offered, with the reason. \
A backend that cannot be used is listed as unavailable with the reason. \
The CPU row names its default pair, and the C compiler its C pairs run and why that one: KILN_CC when set, \
else clang when it is on PATH, else cc.")]
pub struct DevicesArgs {
    /// Also open each device and show its allocator counters and the kernel cache
    #[arg(short, long)]
    pub verbose: bool,
}

/// Runs `kiln devices`; returns the text for stdout.
pub fn run(args: &DevicesArgs) -> Result<String, CliError> {
    let rows = kiln_backends::probe(args.verbose);
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for r in &rows {
        match &r.status {
            Ok(desc) => {
                let _ = writeln!(out, "{:<width$}  available    {desc}", r.name);
                if !r.compilers.is_empty() {
                    let _ = writeln!(out, "{:<width$}    compilers: {} (default first)", "", r.compilers.join(", "));
                }
                for (pair, why) in &r.missing {
                    let _ = writeln!(out, "{:<width$}    not offered: {pair}: {}", "", why.replace('\n', " "));
                }
            }
            Err(why) => {
                let _ = writeln!(out, "{:<width$}  unavailable  {}", r.name, why.replace('\n', " "));
            }
        }
        if let (true, Some(s)) = (args.verbose, r.stats) {
            let budget = s.budget.map(bytes).unwrap_or_else(|| "none".into());
            let _ = writeln!(
                out,
                "{:<width$}    memory: allocated {}, cached {}, high-water {}, hits {}, misses {}, budget {budget}",
                "",
                bytes(s.in_use),
                bytes(s.cached),
                bytes(s.high_water),
                s.hits,
                s.misses
            );
        }
        if let (true, Some(c)) = (args.verbose, r.cache) {
            let _ = writeln!(out, "{:<width$}    kernel cache: {}", "", cache::counters(&c));
        }
    }
    if args.verbose {
        out.push_str(&cache::stats_text()?);
    }
    Ok(out)
}
