//! `kiln compile`: render a kernel file for a device and print the source, the metadata
//! derived from it, or the linear order the renderer walked.

use std::path::PathBuf;

use kiln_ir::DeviceSpec;

use crate::args::{ArgParser, Token, unknown};
use crate::error::{CliError, Context};
use crate::session::{self, KernelFile};
use crate::show;

pub const USAGE: &str = "\
kiln compile FILE [--device D] [--emit source|spec|linear] [--check]

Renders FILE for device D (default CPU) and prints:
  --emit source   the rendered kernel source (default)
  --emit spec     the metadata: buffer slots, ins/outs, variables, launch size expressions
  --emit linear   the kernel in the linear order the renderer walks
  --check         also compile and load it (reports compiler errors; uses the kernel cache)";

/// What `kiln compile` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Emit {
    #[default]
    Source,
    Spec,
    Linear,
}

#[derive(Debug, Default)]
pub struct CompileArgs {
    pub file: Option<PathBuf>,
    pub device: Option<DeviceSpec>,
    pub emit: Emit,
    pub check: bool,
}

impl CompileArgs {
    pub fn parse(p: &mut ArgParser) -> Result<CompileArgs, CliError> {
        let mut a = CompileArgs::default();
        while let Some(tok) = p.next_token()? {
            match tok {
                Token::Positional(f) if a.file.is_none() => a.file = Some(PathBuf::from(f)),
                Token::Flag(f, _) => match f.as_str() {
                    "--device" | "-d" => a.device = Some(session::parse_device(&p.value()?)?),
                    "--emit" => {
                        a.emit = match p.value()?.as_str() {
                            "source" | "src" => Emit::Source,
                            "spec" => Emit::Spec,
                            "linear" => Emit::Linear,
                            other => {
                                return Err(CliError::Usage(format!(
                                    "--emit {other}: expected source, spec or linear"
                                )));
                            }
                        }
                    }
                    "--check" => a.check = true,
                    _ => return Err(unknown("compile", Token::Flag(f, None))),
                },
                tok => return Err(unknown("compile", tok)),
            }
        }
        if a.file.is_none() {
            return Err(CliError::Usage("`kiln compile` needs a kernel FILE".into()));
        }
        Ok(a)
    }
}

pub fn run(args: &CompileArgs) -> Result<String, CliError> {
    let file = args.file.as_deref().ok_or_else(|| CliError::Usage("`kiln compile` needs a kernel FILE".into()))?;
    let kernel_file = KernelFile::load(file)?;
    let device = session::open_device(args.device.as_ref().unwrap_or(&DeviceSpec::Cpu))?;
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
