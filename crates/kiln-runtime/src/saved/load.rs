//! Loading: a plan file is read, checked part by part, its kernels compiled for the device it
//! is loaded on, and its nodes recorded into a new [`ExecutionPlan`].
//!
//! Every check happens before anything runs, cheapest first: the header (magic, version), the
//! manifest's checksum and structure (every index, size and window checked with overflow-free
//! arithmetic), each kernel's checksum, parse and validation, the constants' checksum and
//! safetensors header; then the kernels are compiled (from the kernel cache where it holds them)
//! and every node is recorded as [`ExecutionPlan::exec`] records one, which checks its buffers
//! against the kernel and proves its accesses in bounds (or guards them).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_device::kiln_ir::{self, MAX_KERNEL_FILE_BYTES, Op, Scalar, UOp};
use kiln_device::{Buffer, Device, Error, Kernel, MAX_BUFFER_BYTES, MAX_KERNEL_NAME};
use safetensors::SafeTensors;

use super::PlanFileError;
use super::format::{
    self, CONSTANTS_ALIGN, FORMAT_VERSION, HEADER_BYTES, Header, MAGIC, MAX_MANIFEST_BYTES, Manifest, NodeEntry,
    ViewEntry,
};
use super::loaded::{Bound, LoadStats, LoadedPlan, PlanVariable, TensorSpec};
use super::mapped::MappedBlock;
use crate::plan::{ExecutionPlan, PlanOptions};

type Result<T> = std::result::Result<T, PlanFileError>;

/// How a plan is loaded.
#[derive(Clone, Copy)]
pub struct LoadOptions<'a> {
    /// The options of the execution plan the nodes are recorded into.
    pub plan: PlanOptions,
    /// Refuse at load a launch whose accesses the bounds proof cannot keep inside their buffers
    /// for the saved variable values ([`PlanFileError::Node`] with
    /// [`Error::OutOfBounds`]), instead of running the kernel's guarded form (the device's
    /// policy; a guarded access that tries to leave its buffer fails the run).
    pub strict_bounds: bool,
    /// Use the constants in place from the mapped file on a device whose memory is host memory
    /// (the CPU), and map them read-only to copy them elsewhere; `false` reads them into memory
    /// (mapping assumes that no other process truncates the file while it is loaded: reading the
    /// lost pages would stop the process, as with any memory-mapped weights; see
    /// `docs/saved-plans.md`).
    pub map_constants: bool,
    /// Called once before kernels compile (`compiled` 0) and after each (from the compiling
    /// threads, so reports may arrive out of order).
    pub progress: Option<&'a (dyn Fn(LoadProgress) + Sync)>,
}

impl Default for LoadOptions<'_> {
    fn default() -> Self {
        LoadOptions { plan: PlanOptions::default(), strict_bounds: false, map_constants: true, progress: None }
    }
}

impl std::fmt::Debug for LoadOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("plan", &self.plan)
            .field("strict_bounds", &self.strict_bounds)
            .field("map_constants", &self.map_constants)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// How far compiling a plan's kernels is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadProgress {
    /// Kernels compiled (or found in the cache) so far.
    pub compiled: usize,
    /// Kernels in the plan.
    pub total: usize,
}

/// Where a plan's bytes come from.
enum Source<'a> {
    Bytes(&'a [u8]),
    File { file: File, path: &'a Path, len: u64 },
}

impl<'a> Source<'a> {
    fn len(&self) -> u64 {
        match self {
            Source::Bytes(b) => b.len() as u64,
            Source::File { len, .. } => *len,
        }
    }

    /// `n` bytes from `at`, or [`PlanFileError::Truncated`] naming `part`.
    fn read(&self, at: u64, n: u64, part: &str) -> Result<Cow<'a, [u8]>> {
        let end = at.checked_add(n).filter(|&end| end <= self.len()).ok_or_else(|| PlanFileError::Truncated {
            part: part.to_string(),
            needed: at.saturating_add(n),
            len: self.len(),
        })?;
        match self {
            Source::Bytes(b) => Ok(Cow::Borrowed(&b[at as usize..end as usize])),
            Source::File { file, path, .. } => {
                let mut buf = Vec::new();
                buf.try_reserve_exact(n as usize)
                    .map_err(|_| PlanFileError::Malformed(format!("its {part} of {n} bytes does not fit in memory")))?;
                buf.resize(n as usize, 0);
                file.read_exact_at(&mut buf, at).map_err(|e| PlanFileError::Io {
                    action: "read",
                    path: path.to_path_buf(),
                    source: e,
                })?;
                Ok(Cow::Owned(buf))
            }
        }
    }
}

/// The constants block as the loader holds it.
enum Constants<'a> {
    None,
    /// Bytes in memory (a byte slice, a copy, or a read-only mapping).
    Bytes(Cow<'a, [u8]>),
    ReadOnly(memmap2::Mmap),
    /// Mapped copy-on-write, used in place: the buffer over the whole block.
    Mapped(Buffer),
}

impl LoadedPlan {
    /// Loads the plan file at `path` on `device` with [`LoadOptions::default`].
    ///
    /// # Errors
    /// As [`LoadedPlan::load_with`].
    pub fn load(path: &Path, device: &Device) -> Result<LoadedPlan> {
        Self::load_with(path, device, &LoadOptions::default())
    }

    /// Loads the plan file at `path` on `device`: checks every part, compiles its kernels for
    /// `device` (all cores; the kernel cache first) and records its nodes. Nothing runs.
    ///
    /// # Errors
    /// [`PlanFileError::Io`] when the file cannot be read; for damage, each its own variant:
    /// [`PlanFileError::NotAPlan`], [`PlanFileError::UnknownVersion`],
    /// [`PlanFileError::Truncated`], [`PlanFileError::Checksum`], [`PlanFileError::Malformed`];
    /// [`PlanFileError::Kernel`] for a kernel that does not parse, validate or compile,
    /// [`PlanFileError::Unsupported`] for one `device` cannot render, [`PlanFileError::Node`]
    /// for a node that does not fit its kernel or buffers; [`PlanFileError::Device`] when the
    /// device fails (allocation, transfers).
    pub fn load_with(path: &Path, device: &Device, options: &LoadOptions<'_>) -> Result<LoadedPlan> {
        let io = |action, e| PlanFileError::Io { action, path: path.to_path_buf(), source: e };
        let file = File::open(path).map_err(|e| io("open", e))?;
        let len = file.metadata().map_err(|e| io("read", e))?.len();
        load(Source::File { file, path, len }, device, options)
    }

    /// Loads a plan from the bytes of a plan file (constants are copied into device buffers).
    ///
    /// # Errors
    /// As [`LoadedPlan::load_with`], without [`PlanFileError::Io`].
    pub fn from_bytes(bytes: &[u8], device: &Device, options: &LoadOptions<'_>) -> Result<LoadedPlan> {
        load(Source::Bytes(bytes), device, options)
    }
}

fn malformed<T>(message: impl Into<String>) -> Result<T> {
    Err(PlanFileError::Malformed(message.into()))
}

fn load(source: Source<'_>, device: &Device, options: &LoadOptions<'_>) -> Result<LoadedPlan> {
    let manifest = read_manifest(&source)?;
    let checked = check_manifest(&manifest, source.len())?;
    let section = source.read(manifest.kernel_section.offset, manifest.kernel_section.bytes, "kernel section")?;
    let texts = kernel_texts(&section, &manifest)?;
    let (constants, tensors) = read_constants(&source, &manifest, device, options)?;

    // Compile first: a device that lacks a feature is reported before any memory is taken.
    let kernels = compile_all(device, &manifest, &texts, options)?;
    let variables = plan_variables(&manifest, &kernels)?;

    // The buffers: constants in place where mapped and aligned, the rest on the device.
    let mut stats = LoadStats {
        file_bytes: source.len(),
        kernels: kernels.len(),
        nodes: manifest.nodes.len(),
        constant_bytes: manifest.constants.bytes,
        mapped_bytes: 0,
    };
    let mut buffers = Vec::with_capacity(manifest.buffers.len());
    for (i, b) in manifest.buffers.iter().enumerate() {
        let range = b.tensor.as_ref().and_then(|name| tensors.get(name.as_str())).cloned();
        let buffer = match (&constants, range) {
            (Constants::Mapped(block), Some(r)) if checked.aligned(i, r.start) => {
                stats.mapped_bytes += r.len() as u64;
                block.view(r.start, r.len())?
            }
            (Constants::Mapped(block), Some(r)) => {
                let buffer = device.buffer(Scalar::U8, b.bytes as usize)?;
                buffer.copy_from(&block.view(r.start, r.len())?)?;
                buffer
            }
            (Constants::Bytes(bytes), Some(r)) => {
                let buffer = device.buffer(Scalar::U8, b.bytes as usize)?;
                buffer.copyin(bytes.get(r).unwrap_or_default())?;
                buffer
            }
            (Constants::ReadOnly(map), Some(r)) => {
                let buffer = device.buffer(Scalar::U8, b.bytes as usize)?;
                buffer.copyin(map.get(r).unwrap_or_default())?;
                buffer
            }
            _ => device.buffer(Scalar::U8, b.bytes as usize)?,
        };
        buffers.push(buffer);
    }
    let view = |v: &ViewEntry| -> Result<Buffer> {
        let dtype: Scalar = v.dtype.parse().map_err(|e| PlanFileError::Malformed(format!("{e}")))?;
        let Some(b) = buffers.get(v.buffer) else { return malformed(format!("no buffer {}", v.buffer)) };
        Ok(b.view(v.offset as usize, v.len as usize * dtype.size())?.reinterpret(dtype)?)
    };

    // The nodes, recorded as they were.
    let mut plan = ExecutionPlan::with_options(device, options.plan)?;
    let values: HashMap<&str, i64> = manifest.variables.iter().map(|v| (v.name.as_str(), v.value)).collect();
    for (n, node) in manifest.nodes.iter().enumerate() {
        match node {
            NodeEntry::Exec { kernel, args } => {
                let Some(kernel) = kernels.get(*kernel) else { return malformed(format!("no kernel {kernel}")) };
                let kernel = if options.strict_bounds { kernel.refusing() } else { kernel.clone() };
                let bufs = args.iter().map(view).collect::<Result<Vec<_>>>()?;
                let refs: Vec<&Buffer> = bufs.iter().collect();
                let vars = kernel
                    .spec
                    .var_names
                    .iter()
                    .map(|v| match values.get(v.as_str()) {
                        Some(&value) => Ok((v.as_str(), value)),
                        None => malformed(format!(
                            "kernel `{}` has variable `{v}`, which is no plan variable",
                            kernel.spec.name
                        )),
                    })
                    .collect::<Result<Vec<_>>>()?;
                plan.exec(&kernel, &refs, &vars).map_err(|source| PlanFileError::Node {
                    node: n,
                    what: kernel.spec.name.clone(),
                    source,
                })?;
            }
            NodeEntry::Copy { dst, src } => {
                plan.copy(&view(dst)?, &view(src)?).map_err(|source| PlanFileError::Node {
                    node: n,
                    what: "copy".into(),
                    source,
                })?;
            }
        }
    }
    let bind = |list: &[format::TensorEntry]| -> Result<Vec<Bound>> {
        list.iter()
            .map(|t| {
                let buffer = view(&t.view)?;
                let spec = TensorSpec { name: t.name.clone(), dtype: buffer.dtype(), shape: t.shape.clone() };
                Ok(Bound { spec, buffer })
            })
            .collect()
    };
    let (inputs, outputs) = (bind(&manifest.inputs)?, bind(&manifest.outputs)?);
    Ok(LoadedPlan { plan, device: device.spec().clone(), inputs, outputs, variables, stats })
}

/// The header and the manifest, checked.
fn read_manifest(source: &Source<'_>) -> Result<Manifest> {
    let head = source.read(0, source.len().min(HEADER_BYTES as u64), "header")?;
    if head.len() < MAGIC.len() || head[..MAGIC.len()] != MAGIC {
        if head.len() < MAGIC.len() && MAGIC.starts_with(&head) {
            return Err(PlanFileError::Truncated {
                part: "header".into(),
                needed: HEADER_BYTES as u64,
                len: source.len(),
            });
        }
        let found: String = head.iter().take(8).flat_map(|b| std::ascii::escape_default(*b)).map(char::from).collect();
        return Err(PlanFileError::NotAPlan { found: format!("`{found}`") });
    }
    if head.len() >= 12 {
        let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        if version != FORMAT_VERSION {
            return Err(PlanFileError::UnknownVersion { found: version, known: FORMAT_VERSION });
        }
    }
    let Ok(head) = <&[u8; HEADER_BYTES]>::try_from(&head[..]) else {
        return Err(PlanFileError::Truncated { part: "header".into(), needed: HEADER_BYTES as u64, len: source.len() });
    };
    let header = Header::read(head);
    if !header.reserved_zero {
        return malformed("reserved header bytes are not zero");
    }
    if header.manifest_len > MAX_MANIFEST_BYTES {
        return malformed(format!(
            "a manifest of {} bytes, more than the {} a plan file may have",
            header.manifest_len, MAX_MANIFEST_BYTES
        ));
    }
    let bytes = source.read(HEADER_BYTES as u64, header.manifest_len, "manifest")?;
    let computed = format::checksum(&bytes);
    if computed != header.manifest_checksum {
        return Err(PlanFileError::Checksum { part: "manifest".into(), recorded: header.manifest_checksum, computed });
    }
    serde_json::from_slice(&bytes).map_err(|e| PlanFileError::Malformed(format!("the manifest: {e}")))
}

/// What checking the manifest leaves for loading: each buffer's views' (offset, alignment).
struct Checked {
    alignments: Vec<Vec<(u64, usize)>>,
}

impl Checked {
    /// Whether buffer `i` may start at byte `at` of a page-aligned block: every window keeps
    /// its element alignment there.
    fn aligned(&self, i: usize, at: usize) -> bool {
        self.alignments.get(i).is_some_and(|views| {
            views.iter().all(|&(offset, align)| (at as u64).wrapping_add(offset).is_multiple_of(align as u64))
        })
    }
}

/// Checks everything the manifest says that does not need the other parts: names, indices,
/// sizes and windows, the layout of the file's sections.
fn check_manifest(m: &Manifest, file_len: u64) -> Result<Checked> {
    let mut names = HashSet::new();
    for v in &m.variables {
        if v.name.is_empty() || !names.insert(v.name.as_str()) {
            return malformed(format!("variable `{}` is empty or listed twice", v.name));
        }
    }
    let mut alignments = vec![Vec::new(); m.buffers.len()];
    for (i, b) in m.buffers.iter().enumerate() {
        if b.bytes > MAX_BUFFER_BYTES as u64 {
            return malformed(format!("buffer {i} of {} bytes is larger than any buffer can be", b.bytes));
        }
        b.dtype.parse::<Scalar>().map_err(|e| PlanFileError::Malformed(format!("buffer {i}: {e}")))?;
    }
    let mut check_view = |v: &ViewEntry, what: &dyn Fn() -> String| -> Result<()> {
        let dtype: Scalar = v.dtype.parse().map_err(|e| PlanFileError::Malformed(format!("{}: {e}", what())))?;
        let Some(b) = m.buffers.get(v.buffer) else {
            return malformed(format!("{} names buffer {}, the plan has {}", what(), v.buffer, m.buffers.len()));
        };
        let end = v.len.checked_mul(dtype.size() as u64).and_then(|n| n.checked_add(v.offset));
        if end.is_none_or(|end| end > b.bytes) {
            return malformed(format!(
                "{} is {} x {dtype} at byte {}, outside buffer {} of {} bytes",
                what(),
                v.len,
                v.offset,
                v.buffer,
                b.bytes
            ));
        }
        if !v.offset.is_multiple_of(dtype.size() as u64) {
            return malformed(format!("{} starts at byte {}, not a multiple of {dtype}'s size", what(), v.offset));
        }
        alignments[v.buffer].push((v.offset, dtype.size()));
        Ok(())
    };
    for (kind, list) in [("input", &m.inputs), ("output", &m.outputs)] {
        let mut seen = HashSet::new();
        for t in list {
            if t.name.is_empty() || !seen.insert(t.name.as_str()) {
                return malformed(format!("{kind} `{}` is empty or listed twice", t.name));
            }
            check_view(&t.view, &|| format!("{kind} `{}`", t.name))?;
            for d in &t.shape {
                if let format::Dim::Var(var) = d
                    && !names.contains(var.as_str())
                {
                    return malformed(format!("{kind} `{}` has dimension `{var}`, which is no plan variable", t.name));
                }
            }
        }
    }
    for (n, node) in m.nodes.iter().enumerate() {
        match node {
            NodeEntry::Exec { kernel, args } => {
                if *kernel >= m.kernels.len() {
                    return malformed(format!("node {n} launches kernel {kernel}, the plan has {}", m.kernels.len()));
                }
                for (slot, a) in args.iter().enumerate() {
                    check_view(a, &|| format!("slot {slot} of node {n}"))?;
                }
            }
            NodeEntry::Copy { dst, src } => {
                check_view(dst, &|| format!("the destination of node {n}"))?;
                check_view(src, &|| format!("the source of node {n}"))?;
            }
        }
    }

    // The sections: kernels right after the manifest, constants (if any) page-aligned after
    // them, up to the file's end.
    let ks = &m.kernel_section;
    let kernels_end = ks.offset.checked_add(ks.bytes).ok_or_else(|| overflow("kernel section"))?;
    if ks.offset < HEADER_BYTES as u64 || !ks.checksum.is_empty() {
        return malformed("the kernel section does not follow the manifest");
    }
    for k in &m.kernels {
        if k.name.is_empty() || k.name.chars().count() > MAX_KERNEL_NAME {
            return malformed(format!(
                "a kernel name of {} characters (1 to {MAX_KERNEL_NAME})",
                k.name.chars().count()
            ));
        }
        if k.bytes > MAX_KERNEL_FILE_BYTES {
            return malformed(format!(
                "kernel `{}` has {} bytes of text, more than a kernel may have",
                k.name, k.bytes
            ));
        }
        if k.offset.checked_add(k.bytes).is_none_or(|end| end > ks.bytes) {
            return malformed(format!("kernel `{}` lies outside the kernel section", k.name));
        }
    }
    let c = &m.constants;
    let end = if c.bytes == 0 {
        if m.buffers.iter().any(|b| b.tensor.is_some()) {
            return malformed("buffers name constants, but the file has no constants block");
        }
        kernels_end
    } else {
        if c.offset < kernels_end || !c.offset.is_multiple_of(CONSTANTS_ALIGN) {
            return malformed(format!("the constants block at byte {} is not where the format puts it", c.offset));
        }
        c.offset.checked_add(c.bytes).ok_or_else(|| overflow("constants block"))?
    };
    if end > file_len {
        let part = if c.bytes == 0 { "kernel section" } else { "constants block" };
        return Err(PlanFileError::Truncated { part: part.into(), needed: end, len: file_len });
    }
    if end < file_len {
        return malformed(format!("the file has {} bytes after its last part", file_len - end));
    }
    Ok(Checked { alignments })
}

fn overflow(part: &str) -> PlanFileError {
    PlanFileError::Malformed(format!("the {part}'s end overflows"))
}

/// Each kernel's text in the kernel section, checked against its checksum (parsed later, by
/// the threads that compile them).
fn kernel_texts<'a>(section: &'a [u8], m: &Manifest) -> Result<Vec<&'a str>> {
    m.kernels
        .iter()
        .map(|k| {
            let at = k.offset as usize..(k.offset + k.bytes) as usize;
            let Some(bytes) = section.get(at) else {
                return malformed(format!("kernel `{}` lies outside the kernel section", k.name));
            };
            let computed = format::checksum(bytes);
            if computed != k.checksum {
                return Err(PlanFileError::Checksum {
                    part: format!("kernel `{}`", k.name),
                    recorded: k.checksum.clone(),
                    computed,
                });
            }
            std::str::from_utf8(bytes).map_err(|e| PlanFileError::Kernel {
                kernel: k.name.clone(),
                source: Error::Invalid(format!("its text is not UTF-8: {e}")),
            })
        })
        .collect()
}

/// The constants block, checked against its checksum, and each constant's byte range in it:
/// mapped in place, mapped read-only, or read.
fn read_constants<'a>(
    source: &Source<'a>,
    m: &Manifest,
    device: &Device,
    options: &LoadOptions<'_>,
) -> Result<(Constants<'a>, HashMap<String, Range<usize>>)> {
    let c = &m.constants;
    if c.bytes == 0 {
        return Ok((Constants::None, HashMap::new()));
    }
    let check = |bytes: &[u8]| -> Result<HashMap<String, Range<usize>>> {
        let computed = format::checksum(bytes);
        if computed != c.checksum {
            return Err(PlanFileError::Checksum { part: "constants".into(), recorded: c.checksum.clone(), computed });
        }
        tensor_ranges(bytes, m)
    };
    let len = usize::try_from(c.bytes).map_err(|_| overflow("constants block"))?;
    match source {
        Source::File { file, path, .. } if options.map_constants => {
            let io = |e| PlanFileError::Io { action: "map", path: path.to_path_buf(), source: e };
            if device.allocator().is_host() {
                let (block, ranges) = MappedBlock::map(file, c.offset, len, device.allocator(), check)
                    .map_err(|e| e.unwrap_or_else(io))?;
                Ok((Constants::Mapped(Buffer::new(Arc::new(block), Scalar::U8, len)?), ranges))
            } else {
                let map = super::mapped::map_read_only(file, c.offset, len).map_err(io)?;
                let ranges = check(&map)?;
                Ok((Constants::ReadOnly(map), ranges))
            }
        }
        _ => {
            let bytes = source.read(c.offset, c.bytes, "constants block")?;
            let ranges = check(&bytes)?;
            Ok((Constants::Bytes(bytes), ranges))
        }
    }
}

/// Each constant tensor's byte range in the block `block`, checked against its buffer.
fn tensor_ranges(block: &[u8], m: &Manifest) -> Result<HashMap<String, Range<usize>>> {
    let (header, metadata) = SafeTensors::read_metadata(block)
        .map_err(|e| PlanFileError::Malformed(format!("the constants block is not a safetensors file: {e}")))?;
    let data_at = 8 + header;
    let mut ranges = HashMap::new();
    for (i, b) in m.buffers.iter().enumerate() {
        let Some(name) = &b.tensor else { continue };
        let Some(info) = metadata.info(name) else {
            return malformed(format!("buffer {i}'s constant `{name}` is not in the constants block"));
        };
        let (start, end) = info.data_offsets;
        if (end - start) as u64 != b.bytes {
            return malformed(format!("constant `{name}` has {} bytes, buffer {i} has {}", end - start, b.bytes));
        }
        let dtype: Scalar = b.dtype.parse().map_err(|e| PlanFileError::Malformed(format!("{e}")))?;
        if info.dtype != format::tensor_dtype(dtype) && info.dtype != safetensors::Dtype::U8 {
            return malformed(format!("constant `{name}` holds {:?}, buffer {i} holds {dtype}", info.dtype));
        }
        if ranges.insert(name.clone(), data_at + start..data_at + end).is_some() {
            return malformed(format!("constant `{name}` is named by two buffers"));
        }
    }
    Ok(ranges)
}

/// Compiles every kernel for `device` on all cores (the kernel cache first), reporting progress.
fn compile_all(device: &Device, m: &Manifest, texts: &[&str], options: &LoadOptions<'_>) -> Result<Vec<Kernel>> {
    let total = texts.len();
    // Longest first (a kernel's text length stands for its compile time), so that with an
    // empty cache no core is left compiling a big kernel alone at the end.
    let mut order: Vec<usize> = (0..total).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(texts[i].len()));
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let work = || {
        let mut mine = Vec::new();
        while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
            let name = &m.kernels[i].name;
            let kernel = parse(texts[i], name)
                .and_then(|sink| device.compile(&sink, Some(name)).map_err(|e| compile_error(device, name, e)));
            mine.push((i, kernel));
            let compiled = done.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(report) = options.progress {
                report(LoadProgress { compiled, total });
            }
        }
        mine
    };
    if let Some(report) = options.progress {
        report(LoadProgress { compiled: 0, total });
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(total).max(1);
    let results = std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut all = work();
        for h in helpers {
            // A compile does not panic; a kernel a panicking thread left is reported below.
            all.extend(h.join().unwrap_or_default());
        }
        all
    });
    let mut kernels: Vec<Option<Result<Kernel>>> = (0..total).map(|_| None).collect();
    for (i, r) in results {
        kernels[i] = Some(r);
    }
    kernels
        .into_iter()
        .zip(&m.kernels)
        .map(|(r, k)| {
            r.unwrap_or_else(|| {
                Err(PlanFileError::Kernel {
                    kernel: k.name.clone(),
                    source: Error::Invalid("its compile did not finish (a compiling thread panicked)".into()),
                })
            })
        })
        .collect()
}

/// A kernel's text as a graph rooted at a SINK. Only the syntax is checked here: compiling it
/// validates it (a cache hit derives its metadata with
/// [`kiln_device::ProgramSpec::from_sink`], which does;
/// a miss renders it, which lays its loops out too), so a kernel is checked once, not twice.
fn parse(text: &str, name: &str) -> Result<Arc<UOp>> {
    let kernel_error = |e: Error| PlanFileError::Kernel { kernel: name.to_owned(), source: e };
    let root = kiln_ir::parse(text).map_err(|e| kernel_error(e.into()))?;
    if root.op() != Op::Sink {
        return Err(kernel_error(Error::Invalid(format!("its last line is a {}, not its SINK", root.op().name()))));
    }
    Ok(root)
}

/// A kernel's compile error as the file's fault: a feature the device lacks, or a kernel kiln
/// cannot compile.
fn compile_error(device: &Device, kernel: &str, e: Error) -> PlanFileError {
    match e {
        Error::Render(feature) => {
            PlanFileError::Unsupported { kernel: kernel.to_owned(), device: device.spec().to_string(), feature }
        }
        e => PlanFileError::Kernel { kernel: kernel.to_owned(), source: e },
    }
}

/// The plan variables with the range every kernel using them accepts; each kernel variable is a
/// plan variable and each plan variable is some kernel's.
fn plan_variables(m: &Manifest, kernels: &[Kernel]) -> Result<Vec<PlanVariable>> {
    let mut vars: Vec<PlanVariable> = m
        .variables
        .iter()
        .map(|v| PlanVariable { name: v.name.clone(), value: v.value, min: i64::MIN, max: i64::MAX })
        .collect();
    let mut used = vec![false; vars.len()];
    for k in kernels {
        for kv in &k.spec.vars {
            let Some(i) = vars.iter().position(|v| v.name == kv.name) else {
                return malformed(format!(
                    "kernel `{}` has variable `{}`, which is no plan variable",
                    k.spec.name, kv.name
                ));
            };
            used[i] = true;
            vars[i].min = vars[i].min.max(kv.min);
            vars[i].max = vars[i].max.min(kv.max);
        }
    }
    if let Some(i) = used.iter().position(|u| !u) {
        return malformed(format!("variable `{}` is used by no kernel", vars[i].name));
    }
    Ok(vars)
}
