//! `kiln compile`: render a kernel file for a device and print the source, the metadata
//! derived from it, or the linear order the renderer walked.

use std::path::PathBuf;

use kiln_ir::DeviceSpec;

use crate::error::{CliError, Context};
use crate::session::{self, KernelFile};
use crate::show;

/// What `kiln compile` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Emit {
    /// The rendered kernel source
    #[default]
    #[value(alias = "src")]
    Source,
    /// The metadata: buffer slots, ins/outs, variables, launch size expressions
    Spec,
    /// The kernel in the linear order the renderer walks
    Linear,
}

/// `kiln compile FILE [--device D] [--emit source|spec|linear] [--check]`.
#[derive(Debug, clap::Args)]
pub struct CompileArgs {
    /// The kernel text file
    pub file: PathBuf,
    /// The device to render for: CPU, OPENCL or OPENCL:n
    #[arg(short, long, value_name = "D", default_value = "CPU", value_parser = session::parse_device)]
    pub device: DeviceSpec,
    /// What to print
    #[arg(long, value_enum, default_value_t)]
    pub emit: Emit,
    /// Also compile and load it (reports compiler errors; uses the kernel cache)
    #[arg(long)]
    pub check: bool,
}

/// Runs `kiln compile`; returns the text for stdout.
pub fn run(args: &CompileArgs) -> Result<String, CliError> {
    let file = &args.file;
    let kernel_file = KernelFile::load(file)?;
    let device = session::open_device(&args.device)?;
    let spec = if args.check { (*kernel_file.compile(&device)?.spec).clone() } else { kernel_file.render(&device)? };
    Ok(match args.emit {
        Emit::Source => {
            let mut src = spec.src.clone();
            if !src.ends_with('\n') {
                src.push('\n');
            }
            src
        }
        Emit::Spec => show::spec(&spec),
        Emit::Linear => show::linear(&spec.linear().context(|| format!("cannot linearize {}", file.display()))?),
    })
}
