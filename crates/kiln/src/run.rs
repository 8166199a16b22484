//! `kiln run`: compile a kernel file, bind its variables, fill its buffers from `.npy`
//! files, run it once and save or summarize what it wrote.

use std::path::{Path, PathBuf};

use kiln_device::{Buffer, Device, Kernel, ParamInfo};
use kiln_ir::DeviceSpec;

use crate::args::{ArgParser, Token, split_pair, unknown};
use crate::error::{CliError, Context};
use crate::npy::{self, NpyArray};
use crate::session::{self, KernelFile};
use crate::show;

pub const USAGE: &str = "\
kiln run FILE [--device D] [--var NAME=VALUE]... [--in SLOT=FILE.npy]... [--out SLOT=FILE.npy]... [--trace OUT.json]

Compiles FILE for device D (default CPU) and runs it once.
  --var NAME=VALUE     binds a kernel variable (every variable needs one)
  --in SLOT=FILE.npy   fills buffer SLOT from a NumPy file; its dtype and element count must
                       match the kernel's PARAM exactly (any shape with that many elements)
  --out SLOT=FILE.npy  saves buffer SLOT after the run (as a 1-D array)
  --trace OUT.json     runs through the runtime's execution plan and writes a Chrome trace
Buffers without --in start zeroed. Output slots without --out are summarized on stdout.";

/// Everything `kiln run` was asked to do.
#[derive(Debug, Default)]
pub struct RunArgs {
    pub file: Option<PathBuf>,
    pub device: Option<DeviceSpec>,
    pub vars: Vec<(String, i64)>,
    pub ins: Vec<(usize, PathBuf)>,
    pub outs: Vec<(usize, PathBuf)>,
    pub trace: Option<PathBuf>,
}

impl RunArgs {
    pub fn parse(p: &mut ArgParser) -> Result<RunArgs, CliError> {
        let mut a = RunArgs::default();
        while let Some(tok) = p.next_token()? {
            match tok {
                Token::Positional(f) if a.file.is_none() => a.file = Some(PathBuf::from(f)),
                Token::Flag(f, _) => match f.as_str() {
                    "--device" | "-d" => a.device = Some(session::parse_device(&p.value()?)?),
                    "--var" => a.vars.push(session::parse_var(&p.value()?)?),
                    "--in" => a.ins.push(parse_slot_file("--in", &p.value()?)?),
                    "--out" => a.outs.push(parse_slot_file("--out", &p.value()?)?),
                    "--trace" => a.trace = Some(PathBuf::from(p.value()?)),
                    _ => return Err(unknown("run", Token::Flag(f, None))),
                },
                tok => return Err(unknown("run", tok)),
            }
        }
        if a.file.is_none() {
            return Err(CliError::Usage("`kiln run` needs a kernel FILE".into()));
        }
        for (flag, list) in [("--in", &a.ins), ("--out", &a.outs)] {
            if let Some((slot, _)) =
                list.iter().enumerate().find_map(|(i, (s, _))| list[..i].iter().find(|x| x.0 == *s))
            {
                return Err(CliError::Usage(format!("{flag} names slot {slot} twice")));
            }
        }
        Ok(a)
    }
}

fn parse_slot_file(flag: &str, text: &str) -> Result<(usize, PathBuf), CliError> {
    let (slot, file) = split_pair(flag, text, "SLOT=FILE.npy (e.g. 0=a.npy)")?;
    let slot = slot
        .parse::<usize>()
        .map_err(|_| CliError::Usage(format!("{flag} {text}: slot `{slot}` is not a non-negative integer")))?;
    Ok((slot, PathBuf::from(file)))
}

/// Runs `kiln run`; returns the text for stdout.
pub fn run(args: &RunArgs) -> Result<String, CliError> {
    let file = args.file.as_deref().ok_or_else(|| CliError::Usage("`kiln run` needs a kernel FILE".into()))?;
    let kernel_file = KernelFile::load(file)?;
    let device = session::open_device(args.device.as_ref().unwrap_or(&DeviceSpec::Cpu))?;
    let kernel = kernel_file.compile(&device)?;
    let spec = &kernel.spec;
    let vals = session::bind_vars(spec, &args.vars)?;
    let doing = || format!("cannot launch kernel `{}` with these variables", spec.name);
    // Launch sizes first: a bad size is reported before any file is read or memory allocated.
    spec.launch_dims(&vals).context(doing)?;
    let lens = spec.param_lens(&vals).context(doing)?;
    for (slot, _) in args.ins.iter().chain(&args.outs) {
        if !spec.globals.contains(slot) {
            return Err(CliError::Mismatch(format!(
                "slot {slot}: the kernel has no buffer {slot}; its slots are {}",
                spec.globals.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    let mut buffers = Vec::with_capacity(spec.params.len());
    for (p, &len) in spec.params.iter().zip(&lens) {
        buffers.push(fill_buffer(&device, p, len, args)?);
    }
    launch(&device, &kernel, &buffers, &vals, args.trace.as_deref())?;
    let mut stdout = String::new();
    for (p, buf) in spec.params.iter().zip(&buffers) {
        let out_file = args.outs.iter().find(|(s, _)| *s == p.slot).map(|(_, f)| f);
        if out_file.is_none() && !spec.outs.contains(&p.slot) {
            continue;
        }
        let mut data = host_bytes(buf.nbytes())?;
        buf.copyout(&mut data).context(|| format!("cannot read back buffer {} of `{}`", p.slot, spec.name))?;
        match out_file {
            Some(path) => write_npy(path, p, data)?,
            None => {
                stdout.push_str(&show::buffer_summary(p.slot, p.scalar, &data, 8));
                stdout.push('\n');
            }
        }
    }
    Ok(stdout)
}

/// Allocates the buffer of one PARAM: from its `--in` file, else zeroed.
fn fill_buffer(device: &Device, p: &ParamInfo, len: usize, args: &RunArgs) -> Result<Buffer, CliError> {
    let buf =
        device.buffer(p.scalar, len).context(|| format!("cannot allocate buffer {} ({len} x {})", p.slot, p.scalar))?;
    let data = match args.ins.iter().find(|(s, _)| *s == p.slot) {
        Some((_, path)) => read_input(path, p, len)?,
        None => {
            if !args.outs.iter().any(|(s, _)| *s == p.slot) {
                eprintln!("note: slot {} has neither --in nor --out: using {len} zeroed {} elements", p.slot, p.scalar);
            }
            // Allocate on the device first: an impossible size is its typed out-of-memory error.
            buf.raw().context(|| format!("cannot allocate buffer {} ({len} x {})", p.slot, p.scalar))?;
            host_bytes(buf.nbytes())?
        }
    };
    buf.copyin(&data).context(|| format!("cannot fill buffer {}", p.slot))?;
    Ok(buf)
}

/// `n` zero bytes of host memory, or an error (not an abort) when there is not enough.
fn host_bytes(n: usize) -> Result<Vec<u8>, CliError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| CliError::HostMemory(n))?;
    v.resize(n, 0);
    Ok(v)
}

/// Reads an input file and checks it against the PARAM: same dtype, same element count.
fn read_input(path: &Path, p: &ParamInfo, len: usize) -> Result<Vec<u8>, CliError> {
    let bytes = std::fs::read(path).map_err(|e| CliError::io("cannot read input file", path, e))?;
    let array = npy::read(&bytes).map_err(|source| CliError::Npy { path: path.to_path_buf(), source })?;
    let Some(descr) = npy::descr(p.scalar) else {
        return Err(CliError::Mismatch(format!(
            "slot {}: the kernel's buffer holds {}, which has no NumPy dtype; it can only start zeroed (drop --in {})",
            p.slot, p.scalar, p.slot
        )));
    };
    if array.scalar != p.scalar || array.len() != len {
        return Err(CliError::Mismatch(format!(
            "slot {}: the kernel's buffer is {len} x {} ('{descr}'), but {} holds {} x {} (shape {}); \
             pass an array of exactly {len} {} elements (any shape)",
            p.slot,
            p.scalar,
            path.display(),
            array.len(),
            array.scalar,
            array.shape_text(),
            p.scalar
        )));
    }
    Ok(array.data)
}

fn write_npy(path: &Path, p: &ParamInfo, data: Vec<u8>) -> Result<(), CliError> {
    let array =
        NpyArray::from_bytes(p.scalar, data).map_err(|source| CliError::Npy { path: path.to_path_buf(), source })?;
    let bytes = npy::write(&array).map_err(|source| CliError::Npy { path: path.to_path_buf(), source })?;
    std::fs::write(path, bytes).map_err(|e| CliError::io("cannot write output file", path, e))
}

/// Runs the kernel once; with a trace path, through the runtime's profiled execution plan.
fn launch(
    device: &Device,
    kernel: &Kernel,
    buffers: &[Buffer],
    vals: &[i64],
    trace: Option<&Path>,
) -> Result<(), CliError> {
    let refs: Vec<&Buffer> = buffers.iter().collect();
    let doing = || format!("kernel `{}` failed", kernel.spec.name);
    match trace {
        None => kernel.launch(&refs, vals).context(doing),
        Some(path) => crate::trace::run_traced(device, kernel, &refs, vals, path),
    }
}
