//! `kiln compile`: render a kernel file for a device and print the source, the metadata
//! derived from it, or a listing of the linear order the renderer walked (for reading: it is
//! not kernel text and does not parse back); or, for an offline target of a backend
//! (`--target cuda:sm_90`), render it and write it in one of that target's formats (PTX or a
//! cubin, SPIR-V or MSL, ...) without opening any device. The targets and their formats are
//! the backends' own ([`kiln_device::OfflineTarget`], listed by kiln-backends).

use std::path::PathBuf;

use clap::builder::{PossibleValue, PossibleValuesParser};
use kiln_device::OfflineTarget;
use kiln_ir::DeviceSpec;

use crate::error::{CliError, Context};
use crate::session::{self, KernelFile};
use crate::show;

/// `kiln compile FILE [--device D | --target T] [--emit source|spec|linear|FORMAT] [--check] [-o FILE]`.
#[derive(Debug, clap::Args)]
#[command(after_help = "A --target compiles offline, for a device that need not be present: \
`kiln compile k.kiln --target cuda:sm_90 --emit cubin -o k.cubin` needs only NVRTC (and ptxas, if found).")]
pub struct CompileArgs {
    /// The kernel text file
    pub file: PathBuf,
    /// The device to render for
    #[arg(short, long, value_name = "D", default_value = "CPU", value_parser = session::parse_device)]
    pub device: DeviceSpec,
    /// The device's compiler pair to use instead of its default (`kiln devices` lists them:
    /// the CPU's `cc`, `llvm`, `cc-avx2`, `cc-sse2`)
    #[arg(long, value_name = "NAME")]
    pub compiler: Option<String>,
    /// What to print: the rendered source, the metadata, the linear order, or a format of the --target
    #[arg(long, default_value = "source")]
    pub emit: String,
    /// Also compile and load it (reports compiler errors; uses the kernel cache); with
    /// --target, compile it to the target's binary
    #[arg(long)]
    pub check: bool,
    /// Compile for a target instead of a device, without opening one
    #[arg(long, value_name = "T", conflicts_with = "device", value_parser = parse_target)]
    pub target: Option<Target>,
    /// Write the output to FILE instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `cmd`'s `compile --emit` accepting the three views and every format of the registered
/// backends' targets (clap lists them and suggests the nearest for a typo), and `--target`
/// help naming the targets.
pub fn with_target_help(cmd: clap::Command) -> clap::Command {
    let mut values = vec![
        PossibleValue::new("source").alias("src").help("The rendered kernel source"),
        PossibleValue::new("spec").help("The metadata: buffer slots, ins/outs, variables, launch size expressions"),
        PossibleValue::new("linear").help(
            "A listing of the kernel in the linear order the renderer walks, for reading: not kernel text (it does \
             not parse back; the kernel text is the input file)",
        ),
    ];
    let targets: Vec<&OfflineTarget> = kiln_backends::targets().collect();
    for t in &targets {
        for &(format, binary) in t.formats {
            let kind = if binary { "binary, so it needs -o FILE" } else { "text" };
            values.push(PossibleValue::new(format).help(format!("For --target {} ({kind})", t.usage)));
        }
    }
    let usages: Vec<&str> = targets.iter().map(|t| t.usage).collect();
    cmd.mut_subcommand("compile", |sub| {
        sub.mut_arg("emit", |a| a.value_parser(PossibleValuesParser::new(values))).mut_arg("target", |a| {
            a.help(format!("Compile for a target instead of a device, without opening one: {}", usages.join(", ")))
        })
    })
}

/// An offline compile target and the architecture after its colon.
#[derive(Debug, Clone)]
pub struct Target {
    target: &'static OfflineTarget,
    arch: String,
}

/// Parses `--target` text (a clap value parser): a registered target, its architecture checked.
pub fn parse_target(text: &str) -> Result<Target, String> {
    let (name, arch) = text.split_once(':').unwrap_or((text, ""));
    match kiln_backends::targets().find(|t| t.name.eq_ignore_ascii_case(name)) {
        Some(target) => {
            (target.check_arch)(arch).map(|()| Target { target, arch: arch.to_string() }).map_err(|e| e.to_string())
        }
        None => match kiln_backends::left_out().into_iter().find(|l| l.feature.eq_ignore_ascii_case(name)) {
            Some(l) => Err(format!(
                "this kiln was built without the `{0}` feature (cargo build --features kiln-backends/{0})",
                l.feature
            )),
            None => {
                let known: Vec<&str> = kiln_backends::targets().map(|t| t.usage).collect();
                Err(format!("unknown target `{text}` (expected {})", known.join(", or ")))
            }
        },
    }
}

/// Runs `kiln compile`; returns the text for stdout (nothing when `-o` took the output).
pub fn run(args: &CompileArgs) -> Result<String, CliError> {
    let file = &args.file;
    let kernel_file = KernelFile::load(file)?;
    let view = matches!(args.emit.as_str(), "source" | "src" | "spec" | "linear");
    let (spec, binary) = match &args.target {
        Some(target) => compile_for_target(&kernel_file, target, args, view)?,
        None if !view => {
            let needs = kiln_backends::targets().find(|t| t.formats.iter().any(|(f, _)| *f == args.emit));
            let usage = needs.map_or("a target that writes it", |t| t.usage);
            return Err(CliError::Usage(format!("--emit {} needs a target: add --target {usage}", args.emit)));
        }
        None => {
            let device = session::open_device(&args.device, args.compiler.as_deref())?;
            let spec =
                if args.check { (*kernel_file.compile(&device)?.spec).clone() } else { kernel_file.render(&device)? };
            (spec, None)
        }
    };
    let out: Vec<u8> = match args.emit.as_str() {
        "source" | "src" => {
            let mut src = spec.src.clone();
            if !src.ends_with('\n') {
                src.push('\n');
            }
            src.into_bytes()
        }
        "spec" => show::spec(&spec, &kernel_file.text).into_bytes(),
        "linear" => {
            show::linear(&spec.linear().context(|| format!("cannot linearize {}", file.display()))?).into_bytes()
        }
        _ => binary.unwrap_or_default(),
    };
    let binary_format =
        args.target.as_ref().is_some_and(|t| t.target.formats.iter().any(|&(f, bin)| bin && f == args.emit));
    match &args.output {
        Some(path) => {
            std::fs::write(path, &out).map_err(|e| CliError::io("cannot write the output", path, e))?;
            Ok(String::new())
        }
        None if binary_format => {
            Err(CliError::Usage(format!("--emit {} is binary: write it to a file with -o FILE", args.emit)))
        }
        None => Ok(String::from_utf8_lossy(&out).into_owned()),
    }
}

/// Renders `kernel` for `target` and, when `--emit` asks for one of its formats or `--check`
/// is given (its first format), compiles it; returns the spec and the output.
fn compile_for_target(
    kernel: &KernelFile,
    target: &Target,
    args: &CompileArgs,
    view: bool,
) -> Result<(kiln_device::ProgramSpec, Option<Vec<u8>>), CliError> {
    let t = target.target;
    let format = match args.emit.as_str() {
        f if !view => match t.formats.iter().find(|(name, _)| *name == f) {
            Some(&(name, _)) => Some(name),
            None => {
                let have: Vec<&str> = t.formats.iter().map(|(f, _)| *f).collect();
                return Err(CliError::Usage(format!("--target {} writes {}, not {f}", t.name, have.join(", "))));
            }
        },
        _ if args.check => t.formats.first().map(|(name, _)| *name),
        _ => None,
    };
    let shown = if target.arch.is_empty() { t.name.to_string() } else { format!("{}:{}", t.name, target.arch) };
    (t.compile)(&target.arch, &kernel.sink, &kernel.name, format)
        .context(|| format!("cannot compile {} for {shown}", kernel.path.display()))
}
