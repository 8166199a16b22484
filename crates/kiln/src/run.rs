//! `kiln run`: compile a kernel file, bind its variables, fill its buffers from `.npy`
//! files, run it once and save or summarize what it wrote.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_device::{Buffer, Device, Kernel, ParamInfo};
use kiln_ir::DeviceSpec;
use kiln_runtime::Profile;

use crate::error::{CliError, Context};
use crate::npy::{self, NpyArray};
use crate::session::{self, KernelFile};
use crate::show;

/// `kiln run FILE [--device D] [--var NAME=VALUE]... [--in SLOT=FILE.npy]... [--out SLOT=FILE.npy]... [--trace OUT.json]`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Buffers without --in start zeroed. Output slots without --out are summarized on stdout. \
Every --out and --trace destination is opened before the kernel runs, so an unwritable one costs no run. \
Two destinations may not name one file (also through a link): one output would overwrite the other.")]
pub struct RunArgs {
    /// The kernel text file
    pub file: PathBuf,
    /// The device to run on
    #[arg(short, long, value_name = "D", default_value = "CPU", value_parser = session::parse_device)]
    pub device: DeviceSpec,
    /// The device's compiler pair to use instead of its default (`kiln devices` lists them:
    /// the CPU's `cc`, `llvm`, `cc-avx2`, `cc-sse2`)
    #[arg(long, value_name = "NAME")]
    pub compiler: Option<String>,
    /// Bind a kernel variable (every variable needs exactly one)
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = session::parse_var)]
    pub vars: Vec<(String, i64)>,
    /// Fill buffer SLOT from a NumPy file; its dtype and element count must match the kernel's
    /// PARAM exactly (any shape with that many elements)
    #[arg(long = "in", value_name = "SLOT=FILE.npy", value_parser = parse_slot_file)]
    pub ins: Vec<(usize, PathBuf)>,
    /// Save buffer SLOT after the run (as a 1-D array)
    #[arg(long = "out", value_name = "SLOT=FILE.npy", value_parser = parse_slot_file)]
    pub outs: Vec<(usize, PathBuf)>,
    /// Run through the runtime's execution plan and write a Chrome trace
    #[arg(long, value_name = "OUT.json")]
    pub trace: Option<PathBuf>,
    /// After the run, launch the kernel N more times on the same buffers and print its
    /// median and minimum time (the outputs are those of the first run)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub repeat: Option<u32>,
}

impl RunArgs {
    /// What clap cannot check one value at a time: a slot or a variable given twice, and two
    /// destinations that are one file.
    fn check(&self) -> Result<(), CliError> {
        for (flag, list) in [("--in", &self.ins), ("--out", &self.outs)] {
            if let Some(slot) = first_repeat(list.iter().map(|(s, _)| s)) {
                return Err(CliError::Usage(format!("{flag} names slot {slot} twice; give each slot once")));
            }
        }
        if let Some(name) = first_repeat(self.vars.iter().map(|(n, _)| n)) {
            let values: Vec<String> =
                self.vars.iter().filter(|(n, _)| n == name).map(|(n, v)| format!("{n}={v}")).collect();
            return Err(CliError::Usage(format!(
                "--var {name} is given {} times ({}); give each variable once",
                values.len(),
                values.join(", ")
            )));
        }
        self.check_destinations()
    }

    /// Refuses two `--out`s, or an `--out` and the `--trace`, that write one file: each
    /// destination is committed in turn, so the last would silently replace what the others
    /// wrote and the run would still succeed. Paths are compared as files ([`FileId`]), so
    /// `f.npy`, `./sub/../f.npy`, a symbolic or hard link to it are all the same destination.
    fn check_destinations(&self) -> Result<(), CliError> {
        let outs = self.outs.iter().map(|(slot, path)| (format!("--out {slot}={}", path.display()), path.as_path()));
        let trace = self.trace.iter().map(|path| (format!("--trace {}", path.display()), path.as_path()));
        check_destinations(outs.chain(trace))
    }
}

/// Refuses two destinations (each with the flag that named it) that are one file (see
/// [`FileId`]): the last would silently replace what the others wrote.
pub(crate) fn check_destinations<'a>(dests: impl Iterator<Item = (String, &'a Path)>) -> Result<(), CliError> {
    let mut seen: Vec<(FileId, String)> = Vec::new();
    for (flag, path) in dests {
        let Some(id) = FileId::of(path) else { continue };
        if let Some((_, first)) = seen.iter().find(|(seen, _)| *seen == id) {
            return Err(CliError::Usage(format!(
                "{first} and {flag} name the same file: one output would overwrite the other; \
                 give each its own file"
            )));
        }
        seen.push((id, flag));
    }
    Ok(())
}

/// The file a destination path names, compared to find two destinations that are one file.
#[derive(Debug, PartialEq, Eq)]
enum FileId {
    /// A regular file that exists: its device and inode, whatever path, link or hard link
    /// leads to it.
    Existing { dev: u64, ino: u64 },
    /// A file the run will create: the canonical path of its folder joined with its name.
    New(PathBuf),
}

/// How many symbolic links [`FileId::of`] follows to the file a dangling link would create
/// (Linux's own limit for a path).
const MAX_LINKS: usize = 40;

impl FileId {
    /// The file `path` names. `None` when it is no regular file and none will be created:
    /// something written to rather than replaced (a device such as `/dev/null` or
    /// `/dev/stdout`, a pipe), so two destinations there lose nothing, or a path that cannot
    /// be opened at all (opening it reports that).
    fn of(path: &Path) -> Option<FileId> {
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => return Some(FileId::Existing { dev: m.dev(), ino: m.ino() }),
            Ok(_) => return None,
            Err(_) => {}
        }
        // Not there yet. A dangling symbolic link creates its target: follow it there.
        let mut path = path.to_path_buf();
        for _ in 0..MAX_LINKS {
            let Ok(target) = std::fs::read_link(&path) else { break };
            path = path.parent().map_or_else(|| target.clone(), |dir| dir.join(&target));
        }
        let name = path.file_name()?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Some(FileId::New(std::fs::canonicalize(dir).ok()?.join(name)))
    }
}

/// The first item that appeared before.
pub(crate) fn first_repeat<T: Eq + std::hash::Hash + Copy>(items: impl IntoIterator<Item = T>) -> Option<T> {
    let mut seen = HashSet::new();
    items.into_iter().find(|&x| !seen.insert(x))
}

/// Parses `SLOT=FILE.npy` (a clap value parser).
fn parse_slot_file(text: &str) -> Result<(usize, PathBuf), String> {
    let (slot, file) = session::split_pair(text, "SLOT=FILE.npy (e.g. 0=a.npy)")?;
    let slot = slot.parse::<usize>().map_err(|_| format!("slot `{slot}` is not a non-negative integer"))?;
    Ok((slot, PathBuf::from(file)))
}

/// A file `kiln run` writes after the kernel ran, opened before it runs: an unwritable
/// destination is reported before any work, and not after the run (which would lose the
/// other outputs). Opening does not truncate; [`Destination::commit`] does. A file that the
/// open created is removed again when the run fails before it is committed.
pub(crate) struct Destination {
    what: &'static str,
    pub(crate) path: PathBuf,
    file: File,
    created: bool,
    committed: bool,
}

impl Destination {
    pub(crate) fn open(what: &'static str, path: &Path) -> Result<Destination, CliError> {
        let created = std::fs::symlink_metadata(path).is_err();
        let file = File::options()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| CliError::io(what, path, e))?;
        Ok(Destination { what, path: path.to_path_buf(), file, created, committed: false })
    }

    /// Replaces the file's contents with `bytes` (a device such as `/dev/stdout` is written
    /// to, not truncated). The bytes are written over the old contents from the start and a
    /// regular file is then cut to their length: rewriting an output of the same size (the
    /// common case, a kernel run again) frees and reallocates no blocks, whereas truncating to
    /// zero first costs from 0.3 ms to several ms on a filesystem mounted with `discard`.
    pub(crate) fn commit(mut self, bytes: &[u8]) -> Result<(), CliError> {
        self.committed = true;
        let regular = self.file.metadata().is_ok_and(|m| m.is_file());
        self.file
            .write_all(bytes)
            .and_then(|()| if regular { self.file.set_len(bytes.len() as u64) } else { Ok(()) })
            .map_err(|e| CliError::io(self.what, &self.path, e))
    }
}

impl Drop for Destination {
    fn drop(&mut self) {
        if self.created && !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Runs `kiln run`; returns the text for stdout.
pub fn run(args: &RunArgs) -> Result<String, CliError> {
    args.check()?;
    let mut outs = Vec::with_capacity(args.outs.len());
    for (slot, path) in &args.outs {
        outs.push((*slot, Destination::open("cannot write output file", path)?));
    }
    let trace = args.trace.as_deref().map(|p| Destination::open("cannot write the trace file", p)).transpose()?;
    let kernel_file = KernelFile::load(&args.file)?;
    let device = session::open_device(&args.device, args.compiler.as_deref())?;
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
    let profile = launch(&device, &kernel, &buffers, &vals, trace.as_ref().map(|t| t.path.as_path()))
        .map_err(|e| kernel_file.locate(e))?;
    let mut stdout = String::new();
    for (p, buf) in spec.params.iter().zip(&buffers) {
        let out_file = outs.iter().position(|(s, _)| *s == p.slot).map(|i| outs.swap_remove(i).1);
        if out_file.is_none() && !spec.outs.contains(&p.slot) {
            continue;
        }
        let mut data = host_bytes(buf.nbytes())?;
        buf.copyout(&mut data).context(|| format!("cannot read back buffer {} of `{}`", p.slot, spec.name))?;
        match out_file {
            Some(dest) => write_npy(dest, p, data)?,
            None => {
                stdout.push_str(&show::buffer_summary(p.slot, p.scalar, &data, 8));
                stdout.push('\n');
            }
        }
    }
    // Last, so that a trace that cannot be written after all loses none of the outputs.
    if let (Some(dest), Some(profile)) = (trace, profile) {
        dest.commit(profile.to_chrome_trace().as_bytes())?;
    }
    if let Some(n) = args.repeat {
        let refs: Vec<&Buffer> = buffers.iter().collect();
        let mut times = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let start = Instant::now();
            kernel.launch(&refs, &vals).context(|| format!("kernel `{}` failed when repeated", spec.name))?;
            times.push(start.elapsed());
        }
        stdout.push_str(&show::timings(&spec.name, &args.device, &mut times));
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
pub(crate) fn host_bytes(n: usize) -> Result<Vec<u8>, CliError> {
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

fn write_npy(dest: Destination, p: &ParamInfo, data: Vec<u8>) -> Result<(), CliError> {
    let npy_error = |source| CliError::Npy { path: dest.path.clone(), source };
    let array = NpyArray::from_bytes(p.scalar, data).map_err(npy_error)?;
    let bytes = npy::write(&array).map_err(npy_error)?;
    dest.commit(&bytes)
}

/// Runs the kernel once; with a trace path, through the runtime's profiled execution plan,
/// returning its profile (`None` when the device cannot be profiled).
fn launch(
    device: &Device,
    kernel: &Kernel,
    buffers: &[Buffer],
    vals: &[i64],
    trace: Option<&Path>,
) -> Result<Option<Profile>, CliError> {
    let refs: Vec<&Buffer> = buffers.iter().collect();
    if kernel.has_fallback()
        && let Err(kiln_device::Error::OutOfBounds { access, .. }) = kernel.check(&refs, vals)
    {
        eprintln!(
            "note: no proof keeps %{} {} inside its buffer for these values (it may touch elements {}..={} of {}): \
             running the kernel's guarded form",
            access.node, access.op, access.first, access.last, access.len
        );
    }
    match trace {
        None => kernel.launch(&refs, vals).context(|| format!("kernel `{}` failed", kernel.spec.name)).map(|_| None),
        Some(path) => crate::trace::run_traced(device, kernel, &refs, vals, path),
    }
}
