//! Saving: an [`ExecutionPlan`] and its named inputs and outputs become a [`SavedPlan`], the
//! file's parts in memory, which [`SavedPlan::write`] puts in a file.
//!
//! The plan's buffers are windows of allocations; the file keeps one buffer per allocation the
//! plan touches, cut to the bytes its windows span. Which buffers carry bytes is derived from the
//! recorded order, never declared: a buffer whose bytes some node reads before any node (or the
//! caller, for an input) wrote them is a constant, and its bytes are saved; every other buffer
//! starts without them.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use kiln_device::Buffer;
use kiln_device::kiln_ir::{self, Scalar, UOp};

use super::PlanFileError;
use super::format::{
    self, BufferEntry, CONSTANTS_ALIGN, Dim, HEADER_BYTES, KernelEntry, Manifest, NodeEntry, Role, Section,
    TensorEntry, VariableEntry, ViewEntry,
};
use crate::plan::{ExecutionPlan, Recorded};

type Result<T> = std::result::Result<T, PlanFileError>;

/// A named input or output of a plan being saved: the window it lives in and its shape.
#[derive(Clone, Debug)]
pub struct PlanTensor {
    /// Its name (unique among the inputs, and among the outputs).
    pub name: String,
    /// The window of one of the plan's buffers that holds it; its dtype is the tensor's.
    pub buffer: Buffer,
    /// Its shape, row-major; a [`Dim::Var`] is a plan variable. The tensor is the window's
    /// first elements (all of them for a shape of the window's length).
    pub shape: Vec<Dim>,
}

impl PlanTensor {
    /// The tensor `name` over all of `buffer`, one-dimensional.
    pub fn new(name: impl Into<String>, buffer: &Buffer) -> PlanTensor {
        PlanTensor { name: name.into(), buffer: buffer.clone(), shape: vec![Dim::Fixed(buffer.len() as u64)] }
    }

    /// The same tensor with shape `shape`.
    pub fn with_shape(mut self, shape: impl IntoIterator<Item = Dim>) -> PlanTensor {
        self.shape = shape.into_iter().collect();
        self
    }
}

/// What a caller gives and gets from a saved plan: its named inputs and outputs.
#[derive(Clone, Debug, Default)]
pub struct PlanInterface {
    /// Filled by the caller before each run.
    pub inputs: Vec<PlanTensor>,
    /// Read by the caller after each run.
    pub outputs: Vec<PlanTensor>,
}

/// A plan file's parts in memory: made from a recorded plan by [`SavedPlan::from_plan`],
/// written by [`SavedPlan::write`] or [`SavedPlan::to_bytes`]. Loading is
/// [`LoadedPlan`](super::LoadedPlan)'s.
#[derive(Clone, Debug)]
pub struct SavedPlan {
    manifest: Manifest,
    /// The kernels' text, back to back, as the manifest locates it.
    kernels: Vec<u8>,
    /// The constants as a safetensors file (empty when no buffer has bytes).
    constants: Vec<u8>,
}

/// An allocation of the plan, as saving collects it.
struct Allocation {
    /// One window of it that the plan uses (any: every window shares its base).
    windows: Vec<Buffer>,
    /// Bytes of dtype use, to name the buffer's dtype.
    dtype_bytes: HashMap<Scalar, usize>,
    /// Byte offset in the allocation where the saved buffer starts (a multiple of 64, so every
    /// window keeps its alignment) and where it ends.
    span: Range<usize>,
    /// Whether some node reads bytes of it that nothing wrote first.
    read_first: bool,
    /// Bytes written so far in recorded order (sorted, disjoint).
    written: Vec<Range<usize>>,
}

impl Allocation {
    fn mark_written(&mut self, r: Range<usize>) {
        self.written.push(r);
        self.written.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(self.written.len());
        for r in self.written.drain(..) {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        self.written = merged;
    }

    fn covered(&self, r: &Range<usize>) -> bool {
        r.is_empty() || self.written.iter().any(|w| w.start <= r.start && r.end <= w.end)
    }
}

/// The plan's allocations in order of first use, and the index of each allocation id.
#[derive(Default)]
struct Allocations {
    list: Vec<Allocation>,
    index: HashMap<usize, usize>,
}

impl Allocations {
    fn add(&mut self, b: &Buffer) -> usize {
        let (id, range) = b.byte_range();
        let i = *self.index.entry(id).or_insert_with(|| {
            self.list.push(Allocation {
                windows: Vec::new(),
                dtype_bytes: HashMap::new(),
                span: range.clone(),
                read_first: false,
                written: Vec::new(),
            });
            self.list.len() - 1
        });
        let a = &mut self.list[i];
        a.span = a.span.start.min(range.start)..a.span.end.max(range.end);
        *a.dtype_bytes.entry(b.dtype()).or_default() += b.nbytes();
        if !a.windows.iter().any(|w| w.byte_range() == b.byte_range() && w.dtype() == b.dtype()) {
            a.windows.push(b.clone());
        }
        i
    }

    fn read(&mut self, b: &Buffer) {
        let (id, range) = b.byte_range();
        if let Some(a) = self.index.get(&id).map(|&i| &mut self.list[i])
            && !a.covered(&range)
        {
            a.read_first = true;
        }
    }

    fn write(&mut self, b: &Buffer) {
        let (id, range) = b.byte_range();
        if let Some(&i) = self.index.get(&id) {
            self.list[i].mark_written(range);
        }
    }

    /// The saved form of window `b` (an allocation already added).
    fn view(&self, b: &Buffer) -> ViewEntry {
        let (id, range) = b.byte_range();
        let buffer = self.index.get(&id).copied().unwrap_or(0);
        let start = self.list.get(buffer).map_or(0, |a| a.span.start);
        ViewEntry {
            buffer,
            offset: (range.start - start) as u64,
            len: b.len() as u64,
            dtype: b.dtype().name().to_string(),
        }
    }
}

/// A constant's bytes as safetensors sees a tensor.
struct TensorBytes<'a> {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

impl safetensors::View for TensorBytes<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        self.data.into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

impl SavedPlan {
    /// Saves `plan` with the inputs and outputs of `io`: the nodes in recorded order, every
    /// kernel as kiln IR text, every buffer's size and role, and the bytes of the constants,
    /// read from the device now. The plan must not be running (a run borrows it mutably, so a
    /// caller holding `&plan` cannot be in one).
    ///
    /// # Errors
    /// [`PlanFileError::Unsaveable`] for a collective node (a channel joins live processes and
    /// cannot be saved), a buffer on another device than the plan's, inputs or outputs with
    /// duplicate or empty names, a shape that names no plan variable or needs more elements
    /// than its window holds; [`PlanFileError::Device`] when reading a constant back fails.
    pub fn from_plan(plan: &ExecutionPlan, io: &PlanInterface) -> Result<SavedPlan> {
        let device = plan.device_spec().clone();
        let vars: Vec<(String, i64)> =
            plan.var_names().iter().cloned().zip(plan.var_defaults().iter().copied()).collect();
        let mut allocs = Allocations::default();
        let on_device = |b: &Buffer, what: &dyn Fn() -> String| {
            if b.device() != &device {
                return Err(PlanFileError::Unsaveable(format!(
                    "{} is on {}, the plan runs on {device}; a saved plan holds buffers of its own device only",
                    what(),
                    b.device()
                )));
            }
            Ok(())
        };

        // Inputs and outputs first: the caller writes the inputs before the first node.
        let tensors = |list: &[PlanTensor], kind: &str, allocs: &mut Allocations| -> Result<Vec<TensorEntry>> {
            let mut out: Vec<TensorEntry> = Vec::with_capacity(list.len());
            for t in list {
                if t.name.is_empty() || out.iter().any(|e| e.name == t.name) {
                    return Err(PlanFileError::Unsaveable(format!(
                        "{kind} names must be unique and not empty; `{}` is not",
                        t.name
                    )));
                }
                on_device(&t.buffer, &|| format!("{kind} `{}`", t.name))?;
                check_shape(&t.shape, &vars, t.buffer.len(), &|| format!("{kind} `{}`", t.name))?;
                allocs.add(&t.buffer);
                out.push(TensorEntry { name: t.name.clone(), view: ViewEntry::default(), shape: t.shape.clone() });
            }
            Ok(out)
        };
        let mut inputs = tensors(&io.inputs, "input", &mut allocs)?;
        let mut outputs = tensors(&io.outputs, "output", &mut allocs)?;
        for t in &io.inputs {
            allocs.write(&t.buffer);
        }

        // The nodes, in order: each kernel once, and which bytes are read before written.
        let mut kernels: Vec<(String, String)> = Vec::new();
        let mut kernel_index: HashMap<(*const UOp, String), usize> = HashMap::new();
        let mut nodes: Vec<Pending<'_>> = Vec::new();
        for (n, node) in plan.recorded().enumerate() {
            match node {
                Recorded::Exec { kernel, bufs } => {
                    let spec = &kernel.spec;
                    for (slot, b) in bufs.iter().enumerate() {
                        on_device(b, &|| format!("slot {slot} of node {n} (`{}`)", spec.name))?;
                        allocs.add(b);
                    }
                    let slots = |list: &[usize]| list.iter().filter_map(|&s| bufs.get(s)).cloned().collect::<Vec<_>>();
                    for b in slots(&spec.ins) {
                        allocs.read(&b);
                    }
                    for b in slots(&spec.outs) {
                        allocs.write(&b);
                    }
                    let key = (std::sync::Arc::as_ptr(&spec.ast), spec.name.clone());
                    let k = *kernel_index.entry(key).or_insert_with(|| {
                        kernels.push((spec.name.clone(), kiln_ir::print(&spec.ast)));
                        kernels.len() - 1
                    });
                    nodes.push(Pending::Exec { kernel: k, bufs });
                }
                Recorded::Copy { dst, src } => {
                    on_device(dst, &|| format!("the destination of copy node {n}"))?;
                    on_device(src, &|| format!("the source of copy node {n}"))?;
                    allocs.add(dst);
                    allocs.add(src);
                    allocs.read(src);
                    allocs.write(dst);
                    nodes.push(Pending::Copy { dst, src });
                }
                Recorded::Collective { name } => {
                    return Err(PlanFileError::Unsaveable(format!(
                        "node {n} is a collective ({name}); a channel joins processes that are running and \
                         cannot be saved: save each rank's plan without its collectives"
                    )));
                }
            }
        }

        // Each allocation's saved span starts at a multiple of 64 below its first window, so
        // windows keep their alignment (allocations are 64-byte aligned).
        for a in &mut allocs.list {
            a.span.start -= a.span.start % 64;
        }
        for (entry, t) in inputs.iter_mut().zip(&io.inputs).chain(outputs.iter_mut().zip(&io.outputs)) {
            entry.view = allocs.view(&t.buffer);
        }
        let views = |bufs: &[Buffer]| bufs.iter().map(|b| allocs.view(b)).collect::<Vec<_>>();
        let node_entries: Vec<NodeEntry> = nodes
            .iter()
            .map(|node| match node {
                Pending::Exec { kernel, bufs } => NodeEntry::Exec { kernel: *kernel, args: views(bufs) },
                Pending::Copy { dst, src } => NodeEntry::Copy { dst: allocs.view(dst), src: allocs.view(src) },
            })
            .collect();

        // Buffers and the constants' bytes.
        let holds = |list: &[TensorEntry], i: usize| list.iter().any(|t| t.view.buffer == i);
        let mut buffers = Vec::with_capacity(allocs.list.len());
        let mut constant_bytes: Vec<(String, Scalar, Vec<u8>)> = Vec::new();
        for (i, a) in allocs.list.iter().enumerate() {
            let bytes = a.span.len();
            let dtype =
                a.dtype_bytes.iter().max_by_key(|(s, n)| (**n, s.size(), s.name())).map_or(Scalar::U8, |(s, _)| *s);
            let role = if holds(&inputs, i) {
                Role::Input
            } else if holds(&outputs, i) {
                Role::Output
            } else if a.read_first {
                Role::Constant
            } else {
                Role::Scratch
            };
            let tensor = (a.read_first && bytes > 0).then(|| format!("buffer{i}"));
            if let Some(name) = &tensor {
                let mut data = vec![0u8; bytes];
                for w in &a.windows {
                    let r = w.byte_range().1;
                    let at = r.start - a.span.start..r.end - a.span.start;
                    w.copyout(&mut data[at])?;
                }
                let dtype = if bytes.is_multiple_of(dtype.size()) { dtype } else { Scalar::U8 };
                constant_bytes.push((name.clone(), dtype, data));
            }
            buffers.push(BufferEntry { bytes: bytes as u64, dtype: dtype.name().to_string(), role, tensor });
        }
        let constants = if constant_bytes.is_empty() {
            Vec::new()
        } else {
            let views = constant_bytes.iter().map(|(name, dtype, data)| {
                let shape = vec![data.len() / dtype.size()];
                (name.clone(), TensorBytes { dtype: format::tensor_dtype(*dtype), shape, data })
            });
            let metadata = HashMap::from([("format".to_string(), "kiln-plan-constants".to_string())]);
            safetensors::serialize(views, Some(metadata))
                .map_err(|e| PlanFileError::Unsaveable(format!("the constants do not make a safetensors block: {e}")))?
        };

        // The kernel section.
        let mut kernel_text = Vec::new();
        let mut kernel_entries = Vec::with_capacity(kernels.len());
        for (name, text) in &kernels {
            kernel_entries.push(KernelEntry {
                name: name.clone(),
                offset: kernel_text.len() as u64,
                bytes: text.len() as u64,
                checksum: format::checksum(text.as_bytes()),
            });
            kernel_text.extend_from_slice(text.as_bytes());
        }

        let manifest = Manifest {
            writer: format!("kiln-runtime {}", env!("CARGO_PKG_VERSION")),
            saved_on: device.to_string(),
            variables: vars.into_iter().map(|(name, value)| VariableEntry { name, value }).collect(),
            inputs,
            outputs,
            buffers,
            kernels: kernel_entries,
            nodes: node_entries,
            kernel_section: Section::default(),
            constants: Section { offset: 0, bytes: constants.len() as u64, checksum: format::checksum(&constants) },
        };
        let mut saved = SavedPlan { manifest, kernels: kernel_text, constants };
        saved.place()?;
        Ok(saved)
    }

    /// Saves `plan` ([`SavedPlan::from_plan`]) to `path` ([`SavedPlan::write`]); returns the
    /// file's size in bytes.
    ///
    /// # Errors
    /// Those of [`SavedPlan::from_plan`] and [`SavedPlan::write`].
    pub fn save(plan: &ExecutionPlan, io: &PlanInterface, path: &Path) -> Result<u64> {
        let saved = SavedPlan::from_plan(plan, io)?;
        saved.write(path)?;
        Ok(saved.file_len())
    }

    /// Sets the sections' offsets in the manifest, which depend on the manifest's own length:
    /// repeated until the length stops changing (twice or three times).
    fn place(&mut self) -> Result<()> {
        for _ in 0..8 {
            let manifest_len = self.manifest_json()?.len() as u64;
            let kernels_at = HEADER_BYTES as u64 + manifest_len;
            let kernels = Section { offset: kernels_at, bytes: self.kernels.len() as u64, checksum: String::new() };
            let end = kernels_at + kernels.bytes;
            let constants_at = if self.constants.is_empty() { end } else { end.next_multiple_of(CONSTANTS_ALIGN) };
            if self.manifest.kernel_section == kernels && self.manifest.constants.offset == constants_at {
                return Ok(());
            }
            self.manifest.kernel_section = kernels;
            self.manifest.constants.offset = constants_at;
        }
        Err(PlanFileError::Unsaveable("the manifest's offsets do not settle".into()))
    }

    fn manifest_json(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(&self.manifest)
            .map_err(|e| PlanFileError::Unsaveable(format!("the manifest does not serialize: {e}")))
    }

    /// The file's size in bytes.
    pub fn file_len(&self) -> u64 {
        let c = &self.manifest.constants;
        if c.bytes > 0 { c.offset + c.bytes } else { self.manifest.kernel_section.offset + self.kernels.len() as u64 }
    }

    /// The file's bytes.
    ///
    /// # Errors
    /// [`PlanFileError::Unsaveable`] when the manifest does not serialize (it always does).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.file_len() as usize);
        self.write_to(&mut out).map_err(|e| PlanFileError::Unsaveable(e.to_string()))?;
        Ok(out)
    }

    /// Writes the file to `path`: to a temporary file beside it first, then renamed over
    /// `path`, so a reader never sees half a plan and a failed save leaves an old file whole.
    ///
    /// # Errors
    /// [`PlanFileError::Io`] when the file cannot be written or renamed.
    pub fn write(&self, path: &Path) -> Result<()> {
        let io = |action, e| PlanFileError::Io { action, path: path.to_path_buf(), source: e };
        let mut tmp_name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let result = std::fs::File::create(&tmp).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            self.write_to(&mut w)?;
            w.into_inner().map_err(|e| e.into_error())?.sync_all()
        });
        if let Err(e) = result.and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("write", e));
        }
        Ok(())
    }

    fn write_to(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        let manifest = self.manifest_json().map_err(std::io::Error::other)?;
        w.write_all(&format::header(&manifest))?;
        w.write_all(&manifest)?;
        w.write_all(&self.kernels)?;
        if !self.constants.is_empty() {
            let end = self.manifest.kernel_section.offset + self.kernels.len() as u64;
            let pad = (self.manifest.constants.offset - end) as usize;
            w.write_all(&vec![0u8; pad])?;
            w.write_all(&self.constants)?;
        }
        w.flush()
    }

    /// How many kernels the file holds (each once, however many nodes launch it).
    pub fn kernel_count(&self) -> usize {
        self.manifest.kernels.len()
    }

    /// How many bytes of constants the file holds.
    pub fn constant_bytes(&self) -> u64 {
        self.manifest.constants.bytes
    }

    /// The manifest as JSON text (for tools, tests and `docs/saved-plans.md`'s example).
    ///
    /// # Errors
    /// As [`SavedPlan::to_bytes`].
    pub fn manifest_text(&self) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.manifest_json()?).into_owned())
    }
}

/// A node being saved: a launch of the kernel at an index of the kernel section, or a copy.
enum Pending<'a> {
    Exec { kernel: usize, bufs: &'a [Buffer] },
    Copy { dst: &'a Buffer, src: &'a Buffer },
}

/// Checks a shape against the plan variables and its window: every [`Dim::Var`] is a plan
/// variable, and the tensor fits its window at the recorded values.
fn check_shape(shape: &[Dim], vars: &[(String, i64)], len: usize, what: &dyn Fn() -> String) -> Result<()> {
    let mut numel: u128 = 1;
    for d in shape {
        let n = match d {
            Dim::Fixed(n) => u128::from(*n),
            Dim::Var(name) => match vars.iter().find(|(v, _)| v == name) {
                Some((_, value)) => u128::try_from(*value).unwrap_or(0),
                None => {
                    let known: Vec<&str> = vars.iter().map(|(v, _)| v.as_str()).collect();
                    return Err(PlanFileError::Unsaveable(format!(
                        "dimension `{name}` of {} is not a plan variable (the plan's variables: {})",
                        what(),
                        if known.is_empty() { "none".to_string() } else { known.join(", ") }
                    )));
                }
            },
        };
        numel = numel.saturating_mul(n);
    }
    if numel > len as u128 {
        return Err(PlanFileError::Unsaveable(format!(
            "{} has shape [{}], {numel} elements at the recorded variable values, but its buffer holds {len}",
            what(),
            shape.iter().map(Dim::to_string).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(())
}
