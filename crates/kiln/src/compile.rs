//! `kiln compile`: render a kernel file for a device and print the source, the metadata
//! derived from it, or a listing of the linear order the renderer walked (for reading: it is
//! not kernel text and does not parse back); or, for a CUDA target
//! (`--target cuda:sm_90`), compile it to PTX or a cubin without opening any device; or,
//! for the WebGPU target (`--target webgpu`), print it as WGSL, SPIR-V or MSL through naga.

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
    /// A listing of the kernel in the linear order the renderer walks, for reading: not
    /// kernel text (it does not parse back; the kernel text is the input file)
    Linear,
    /// PTX for the `--target` architecture (CUDA)
    Ptx,
    /// A cubin for the `--target` architecture (CUDA; binary, so it needs `-o FILE`)
    Cubin,
    /// WGSL, validated by naga (--target webgpu)
    Wgsl,
    /// A SPIR-V module from naga (--target webgpu; binary, so it needs `-o FILE`)
    Spirv,
    /// Metal Shading Language from naga (--target webgpu; not compiled here: no Metal)
    Msl,
}

/// `kiln compile FILE [--device D | --target cuda:sm_XY] [--emit source|spec|linear|ptx|cubin] [--check] [-o FILE]`.
#[derive(Debug, clap::Args)]
#[command(after_help = "A --target compiles offline, for a device that need not be present: \
`kiln compile k.kiln --target cuda:sm_90 --emit cubin -o k.cubin` needs only NVRTC (and ptxas, if found).")]
pub struct CompileArgs {
    /// The kernel text file
    pub file: PathBuf,
    /// The device to render for
    #[arg(short, long, value_name = "D", default_value = "CPU", value_parser = session::parse_device)]
    pub device: DeviceSpec,
    /// What to print
    #[arg(long, value_enum, default_value_t)]
    pub emit: Emit,
    /// Also compile and load it (reports compiler errors; uses the kernel cache); with
    /// --target, compile it to the target's binary
    #[arg(long)]
    pub check: bool,
    /// Compile for a target instead of a device, without opening one: cuda:sm_XY
    #[arg(long, value_name = "T", conflicts_with = "device", value_parser = parse_target)]
    pub target: Option<Target>,
    /// Write the output to FILE instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// An offline compile target.
#[derive(Debug, Clone)]
pub enum Target {
    /// `cuda:sm_XY`: CUDA C++ through NVRTC for that architecture.
    #[cfg(feature = "cuda")]
    Cuda(kiln_cuda::Arch),
    /// `webgpu`: WGSL for an adapter with f16 and i64, translated by naga.
    #[cfg(feature = "webgpu")]
    WebGpu,
}

/// Parses `--target` text (a clap value parser).
pub fn parse_target(text: &str) -> Result<Target, String> {
    let (backend, arch) = text.split_once(':').unwrap_or((text, ""));
    match backend.to_ascii_lowercase().as_str() {
        #[cfg(feature = "cuda")]
        "cuda" => arch.parse().map(Target::Cuda).map_err(|e: kiln_device::Error| e.to_string()),
        #[cfg(not(feature = "cuda"))]
        "cuda" => {
            let _ = arch;
            Err("this kiln was built without the `cuda` feature (cargo build --features cuda)".into())
        }
        #[cfg(feature = "webgpu")]
        "webgpu" if arch.is_empty() => Ok(Target::WebGpu),
        _ => Err(format!("unknown target `{text}` (expected cuda:sm_XY, e.g. cuda:sm_90, or webgpu)")),
    }
}

/// Runs `kiln compile`; returns the text for stdout (nothing when `-o` took the output).
pub fn run(args: &CompileArgs) -> Result<String, CliError> {
    let file = &args.file;
    let kernel_file = KernelFile::load(file)?;
    let (spec, binary) = match &args.target {
        Some(target) => compile_for_target(&kernel_file, target, args)?,
        None if matches!(args.emit, Emit::Ptx | Emit::Cubin) => {
            return Err(CliError::Usage(format!(
                "--emit {} needs a CUDA target: add --target cuda:sm_XY (e.g. cuda:sm_90)",
                if args.emit == Emit::Ptx { "ptx" } else { "cubin" }
            )));
        }
        None if matches!(args.emit, Emit::Wgsl | Emit::Spirv | Emit::Msl) => {
            return Err(CliError::Usage("--emit wgsl, spirv and msl need --target webgpu".into()));
        }
        None => {
            let device = session::open_device(&args.device)?;
            let spec =
                if args.check { (*kernel_file.compile(&device)?.spec).clone() } else { kernel_file.render(&device)? };
            (spec, None)
        }
    };
    let out: Vec<u8> = match (args.emit, binary) {
        (Emit::Source, _) => {
            let mut src = spec.src.clone();
            if !src.ends_with('\n') {
                src.push('\n');
            }
            src.into_bytes()
        }
        (Emit::Spec, _) => show::spec(&spec, &kernel_file.text).into_bytes(),
        (Emit::Linear, _) => {
            show::linear(&spec.linear().context(|| format!("cannot linearize {}", file.display()))?).into_bytes()
        }
        (Emit::Ptx | Emit::Msl, Some(mut text)) => {
            text.push(b'\n');
            text
        }
        (_, binary) => binary.unwrap_or_default(),
    };
    match &args.output {
        Some(path) => {
            std::fs::write(path, &out).map_err(|e| CliError::io("cannot write the output", path, e))?;
            Ok(String::new())
        }
        None if matches!(args.emit, Emit::Cubin | Emit::Spirv) => {
            Err(CliError::Usage("a cubin or a SPIR-V module is binary: write it to a file with -o FILE".into()))
        }
        None => Ok(String::from_utf8_lossy(&out).into_owned()),
    }
}

/// Renders `kernel` for `target` and, when `--emit` asks for a binary or `--check` is
/// given, compiles it; returns the spec and the binary (PTX text or cubin).
#[cfg_attr(not(any(feature = "cuda", feature = "webgpu")), allow(unused_variables))]
fn compile_for_target(
    kernel: &KernelFile,
    target: &Target,
    args: &CompileArgs,
) -> Result<(kiln_device::ProgramSpec, Option<Vec<u8>>), CliError> {
    match *target {
        #[cfg(feature = "cuda")]
        Target::Cuda(arch) => {
            use kiln_device::{Compiler, Renderer};
            let doing = |verb: &str| format!("cannot {verb} {} for cuda:{arch}", kernel.path.display());
            let renderer = kiln_cuda::cuda_renderer(DeviceSpec::new(kiln_cuda::BACKEND, 0));
            let spec = renderer.render(&kernel.sink, Some(&kernel.name)).context(|| doing("render"))?;
            let output = match args.emit {
                Emit::Ptx => kiln_cuda::Output::Ptx,
                Emit::Cubin => kiln_cuda::Output::Cubin,
                _ if args.check => kiln_cuda::Output::Cubin,
                _ => return Ok((spec, None)),
            };
            let compiler = kiln_cuda::CudaCompiler::new(arch, output).context(|| doing("compile"))?;
            let binary = compiler.compile(&spec).context(|| doing("compile"))?.bytes;
            Ok((spec, Some(binary)))
        }
        #[cfg(feature = "webgpu")]
        Target::WebGpu => {
            use kiln_device::Renderer;
            let doing = |verb: &str| format!("cannot {verb} {} for webgpu", kernel.path.display());
            let caps = kiln_webgpu::Caps { f16: true, int64: true };
            let renderer = kiln_webgpu::WgslRenderer::new(DeviceSpec::new(kiln_webgpu::BACKEND, 0), caps);
            let spec = renderer.render(&kernel.sink, Some(&kernel.name)).context(|| doing("render"))?;
            let emit = match args.emit {
                Emit::Spirv => kiln_webgpu::Emit::Spirv,
                Emit::Msl => kiln_webgpu::Emit::Msl,
                Emit::Wgsl => kiln_webgpu::Emit::Wgsl,
                _ if args.check => kiln_webgpu::Emit::Wgsl,
                _ => return Ok((spec, None)),
            };
            let out = kiln_webgpu::translate(&spec.src, caps, emit, &spec.name).context(|| doing("translate"))?;
            Ok((spec, Some(out)))
        }
    }
}
