//! `kiln.Device` and `kiln.devices()`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kiln_device::{BoundsPolicy, Device, Error as KilnError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::buffer::{PyBuffer, host_array};
use crate::dtype;
use crate::errors::{Failure, detached, invalid_arg, raise};
use crate::kernel::PyKernel;
use kiln_runtime::LaunchStream;

/// One row of `kiln.devices()`: a device (or a backend without one) and whether it can be used.
#[pyclass(frozen, name = "DeviceInfo", module = "kiln", get_all)]
pub struct DeviceInfo {
    /// `"CPU"`, `"OPENCL:0"`, or the backend's name when it has no usable device.
    name: String,
    /// Whether `kiln.Device(name)` can open it.
    available: bool,
    /// The device's description when available, else why it is not.
    description: String,
}

#[pymethods]
impl DeviceInfo {
    fn __repr__(&self) -> String {
        let state = if self.available { "available" } else { "unavailable" };
        format!("<kiln.DeviceInfo {} {state}: {}>", self.name, self.description)
    }
}

/// Every device of every backend this build has, available or not and why not (as
/// `kiln devices`).
pub fn devices(py: Python<'_>) -> PyResult<Vec<DeviceInfo>> {
    let rows = detached(py, None, || Ok(kiln_backends::probe(false)))?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let available = r.status.is_ok();
            DeviceInfo { name: r.name, available, description: r.status.unwrap_or_else(|why| why) }
        })
        .collect())
}

/// A compute device. Open one by name: `kiln.Device("CPU")`, `kiln.Device("OPENCL:0")`.
#[pyclass(frozen, name = "Device", module = "kiln")]
pub struct PyDevice {
    device: Arc<Device>,
    /// The device's queue of launches from Python when they are asynchronous.
    stream: Option<Arc<LaunchStream>>,
    closed: AtomicBool,
}

impl PyDevice {
    /// The device, unless this handle was closed.
    pub fn get(&self) -> PyResult<&Arc<Device>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Python::attach(|py| {
                invalid_arg(py, format!("this handle of {} was closed; open the device again", self.device.spec()))
            }));
        }
        Ok(&self.device)
    }
}

/// A kernel source: text, or a path to a `.kiln` file; and the kernel's default name.
fn read_source(source: &Bound<'_, PyAny>) -> PyResult<(String, Option<String>)> {
    let py = source.py();
    let path: Option<PathBuf> = if let Ok(s) = source.cast::<PyString>() {
        let s = s.to_cow()?;
        // One line that names an existing file is a path; anything else is kernel text,
        // except one word that looks like a path (a `.kiln` name, or with a separator).
        let one_line = !s.contains('\n');
        if one_line && std::path::Path::new(s.as_ref()).is_file() {
            Some(PathBuf::from(s.as_ref()))
        } else if one_line && looks_like_a_path(&s) {
            return Err(raise(
                py,
                KilnError::Io(format!(
                    "no kernel file at {s}: the string names no file, and it is not kernel text (which has a line per node)"
                )),
            ));
        } else {
            None
        }
    } else {
        Some(source.extract::<PathBuf>().map_err(|_| {
            invalid_arg(py, "a kernel source is kernel text (str) or a path to a .kiln file (str or os.PathLike)")
        })?)
    };
    match path {
        Some(p) => {
            let text = kiln_ir::read_kernel_file(&p)
                .map_err(|e| raise(py, KilnError::Io(format!("cannot read kernel file {}: {e}", p.display()))))?;
            Ok((text, Some(kiln_ir::entry_name(&p))))
        }
        None => Ok((source.extract()?, None)),
    }
}

/// Why this package has no backend `base`: a backend of kiln it was built without (the
/// feature to build it with), or a name kiln does not know.
fn unknown_backend(base: &str) -> String {
    let have = kiln_device::device_names();
    match kiln_backends::left_out().into_iter().find(|l| l.name == base) {
        Some(kiln_backends::LeftOut { feature, .. }) => format!(
            "this kiln package was built without the {base} backend (its devices: {have}); rebuild it with the \
             `{feature}` feature"
        ),
        None => format!("kiln has no backend called {base}; its devices are {have}, as `NAME` or `NAME:n`"),
    }
}

/// Opens device `name`, with compiler pair `compiler` as its default where given (a device
/// of its own, as `kiln.Device(name, compiler)`).
pub fn open(py: Python<'_>, name: &str, compiler: Option<&str>) -> PyResult<Arc<Device>> {
    if let Ok(spec) = name.parse::<kiln_ir::DeviceSpec>()
        && kiln_device::find_backend(spec.base_type()).is_none()
    {
        return Err(raise(py, KilnError::Unavailable(unknown_backend(spec.base_type()))));
    }
    detached(py, None, || {
        let device = kiln_device::open_device(name)?;
        Ok(match compiler {
            Some(pair) => Arc::new(device.with_default_compiler(pair)?),
            None => device,
        })
    })
}

/// Whether one line of would-be kernel text is rather a path: a single word (kernel lines have
/// spaces) ending in `.kiln` or holding a path separator.
fn looks_like_a_path(s: &str) -> bool {
    let s = s.trim();
    !s.is_empty() && !s.contains(char::is_whitespace) && (s.ends_with(".kiln") || s.contains('/') || s.contains('\\'))
}

/// One entry of `compile_many`: a source, or `(source, name)`.
fn source_and_name(item: &Bound<'_, PyAny>) -> PyResult<(String, Option<String>)> {
    if let Ok(t) = item.cast::<PyTuple>() {
        let (source, name): (Bound<'_, PyAny>, Option<String>) = t.extract().map_err(|_| {
            invalid_arg(item.py(), format!("a compile_many entry is a source or a (source, name) pair, got {item}"))
        })?;
        let (text, default) = read_source(&source)?;
        return Ok((text, name.or(default)));
    }
    read_source(item)
}

#[pymethods]
impl PyDevice {
    /// Opens the device `name` (`"CPU"`, `"OPENCL"`, `"OPENCL:1"`, `"CUDA:0"`); a device is
    /// opened once per process and shared by every handle. With `compiler` (one of its
    /// `compilers`, e.g. the CPU's `"cc-avx2"`), a device of its own whose default compiler
    /// pair is that one, with that pair's `properties`.
    #[new]
    #[pyo3(signature = (name, compiler=None))]
    fn new(py: Python<'_>, name: &str, compiler: Option<String>) -> PyResult<PyDevice> {
        let device = open(py, name, compiler.as_deref())?;
        let stream = LaunchStream::of(&device);
        Ok(PyDevice { device, stream, closed: AtomicBool::new(false) })
    }

    /// The device's name (`"CPU"`, `"OPENCL:0"`).
    #[getter]
    fn name(&self) -> String {
        self.device.spec().to_string()
    }

    /// The names of the device's compiler pairs, the default first (the CPU's: `llvm` in
    /// process and `cc` for the host's instruction set, `cc-avx2` and `cc-sse2` for older ones).
    #[getter]
    fn compilers(&self) -> PyResult<Vec<String>> {
        Ok(self.get()?.compiler_names())
    }

    /// The pairs the device cannot offer on this machine, by name, each with why (the CPU's
    /// `llvm` where libLLVM 16 is not installed).
    #[getter]
    fn missing_compilers(&self) -> PyResult<std::collections::HashMap<String, String>> {
        Ok(self.get()?.missing_compilers().into_iter().collect())
    }

    /// A human-readable description (model, driver, compiler).
    #[getter]
    fn description(&self) -> PyResult<&str> {
        Ok(self.get()?.description())
    }

    /// What kernel generators may rely on: `isa`, `vector_bytes`, `l1d_bytes`, `l2_bytes`,
    /// `l3_bytes`, `max_work_group_size`, `max_work_group_dims`, `local_memory_bytes` (each
    /// `None` when unknown or, for the work-group ones, on a device without work groups), and
    /// `wmma`: the matrix-multiply-accumulate forms the device renders, each
    /// `(m, n, k, input dtype, accumulator dtype, threads)`; `threads`: the threads a host
    /// device (the CPU) spreads a kernel over, `None` on other devices.
    #[getter]
    fn properties<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let p = self.get()?.properties();
        let d = PyDict::new(py);
        d.set_item("isa", p.isa.clone())?;
        d.set_item("vector_bytes", p.vector_bytes)?;
        d.set_item("l1d_bytes", p.l1d_bytes)?;
        d.set_item("l2_bytes", p.l2_bytes)?;
        d.set_item("l3_bytes", p.l3_bytes)?;
        d.set_item("max_work_group_size", p.max_work_group_size)?;
        d.set_item("max_work_group_dims", p.max_work_group_dims)?;
        d.set_item("local_memory_bytes", p.local_memory_bytes)?;
        let wmma: Vec<(u16, u16, u16, String, String, u16)> =
            p.wmma.iter().map(|w| (w.m, w.n, w.k, w.input.to_string(), w.acc.to_string(), w.threads)).collect();
        d.set_item("wmma", wmma)?;
        d.set_item("threads", p.threads)?;
        Ok(d)
    }

    /// The generation: 0 when opened, +1 per `reset()`. Objects of an older generation raise
    /// `DeviceLostError`.
    #[getter]
    fn generation(&self) -> PyResult<u64> {
        Ok(self.get()?.generation())
    }

    /// Whether a fatal error lost the device (`reset()` recovers it).
    #[getter]
    fn is_lost(&self) -> PyResult<bool> {
        Ok(self.get()?.is_lost())
    }

    /// What a launch does with an access no proof keeps in bounds: `"guard"` runs the
    /// kernel's guarded form, `"refuse"` raises `OutOfBoundsError`. Applies to kernels
    /// compiled afterwards.
    #[getter]
    fn get_bounds_policy(&self) -> PyResult<&'static str> {
        Ok(match self.get()?.bounds_policy() {
            BoundsPolicy::Guard => "guard",
            BoundsPolicy::Refuse => "refuse",
        })
    }

    #[setter]
    fn set_bounds_policy(&self, py: Python<'_>, policy: &str) -> PyResult<()> {
        let policy = match policy {
            "guard" => BoundsPolicy::Guard,
            "refuse" => BoundsPolicy::Refuse,
            other => return Err(invalid_arg(py, format!("bounds policy `{other}`: use \"guard\" or \"refuse\""))),
        };
        self.get()?.set_bounds_policy(policy);
        Ok(())
    }

    /// Tears down the device's state and starts a new generation: every buffer, kernel and
    /// plan made before raises `DeviceLostError` from now on.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        let device = self.get()?;
        detached(py, None, || device.reset().map_err(Failure::from))
    }

    /// Waits for every launch made from Python on this device and raises the first error
    /// among them, or the error that lost the device. (Launches on host devices such as the
    /// CPU have completed when they return; there this only checks the device's health.)
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let device = self.get()?;
        if let Some(stream) = &self.stream {
            detached(py, None, || Ok(stream.wait()?))?;
        }
        device.context().stamp().check("the device").map_err(|e| raise(py, e))
    }

    /// The allocator's counters: `in_use`, `cached`, `high_water` (bytes), `hits`, `misses`,
    /// and `budget` (bytes, or `None`).
    fn memory_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.get()?.allocator().stats();
        let d = PyDict::new(py);
        d.set_item("in_use", s.in_use)?;
        d.set_item("cached", s.cached)?;
        d.set_item("high_water", s.high_water)?;
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("budget", s.budget)?;
        Ok(d)
    }

    /// Frees the allocator's cached blocks; returns the bytes released.
    fn trim(&self, py: Python<'_>) -> PyResult<usize> {
        let device = self.get()?;
        detached(py, None, || Ok(device.allocator().trim()))
    }

    /// Compiles kernel text (or a `.kiln` file) for this device, through the kernel cache,
    /// with the compiler pair `compiler` (one of `compilers`; the default when `None`).
    /// Parse errors raise `ParseError` with `line` and `col`; an unknown pair raises
    /// `UnavailableError` naming the device's pairs.
    #[pyo3(signature = (source, name=None, compiler=None))]
    fn compile(
        &self,
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        name: Option<String>,
        compiler: Option<String>,
    ) -> PyResult<PyKernel> {
        let device = self.get()?;
        let (text, default) = read_source(source)?;
        let name = name.or(default);
        let kernel = detached(py, Some(&text), || {
            let sink = kiln_ir::parse_kernel(&text)?;
            Ok(match compiler.as_deref() {
                Some(pair) => device.compile_with(pair, &sink, name.as_deref())?,
                None => device.compile(&sink, name.as_deref())?,
            })
        })?;
        PyKernel::new(py, kernel, device, Some(text.into()))
    }

    /// Compiles several kernels at once on all cores: each entry is a source or a
    /// `(source, name)` pair. Returns the kernels in order; raises the first entry's error.
    fn compile_many(&self, py: Python<'_>, sources: &Bound<'_, PyAny>) -> PyResult<Vec<PyKernel>> {
        let device = self.get()?;
        let entries: Vec<(String, Option<String>)> =
            sources.try_iter()?.map(|item| source_and_name(&item?)).collect::<PyResult<_>>()?;
        let mut sinks = Vec::with_capacity(entries.len());
        for (i, (text, _)) in entries.iter().enumerate() {
            let sink = kiln_ir::parse_kernel(text).map_err(|e| {
                let err = Failure::from(e).into_py(py, Some(text));
                prefix(py, err, i)
            })?;
            sinks.push(sink);
        }
        let batch: Vec<_> = sinks.iter().zip(&entries).map(|(s, (_, n))| (s.clone(), n.as_deref())).collect();
        let results = detached(py, None, || {
            Ok(device.compile_many(&batch).into_iter().map(|k| k.map_err(Failure::from)).collect::<Vec<_>>())
        })?;
        let mut kernels = Vec::with_capacity(results.len());
        for (i, (result, (text, _))) in results.into_iter().zip(&entries).enumerate() {
            match result {
                Ok(k) => kernels.push(PyKernel::new(py, k, device, Some(text.as_str().into()))?),
                Err(e) => return Err(prefix(py, e.into_py(py, Some(text)), i)),
            }
        }
        Ok(kernels)
    }

    /// An uninitialized buffer of `n` elements of `dtype` (a kiln name such as `"f32"`, a
    /// numpy name or a numpy dtype), allocated now.
    fn empty(&self, py: Python<'_>, dtype: &Bound<'_, PyAny>, n: &Bound<'_, PyAny>) -> PyResult<PyBuffer> {
        let scalar = dtype::parse(dtype)?;
        let n = crate::buffer::size_arg(py, "the element count", n)?;
        let device = self.get()?;
        let buf = device.buffer(scalar, n).map_err(|e| raise(py, e))?;
        // Allocated now, so that an impossible size fails here rather than at a later launch.
        if n > 0 {
            detached(py, None, || Ok(buf.raw().map(drop)?))?;
        }
        Ok(PyBuffer::on(buf, device))
    }

    /// A buffer holding a copy of `array` (any shape, flattened in C order; its dtype).
    #[allow(clippy::wrong_self_convention)] // numpy's and torch's name, which users guess
    fn from_numpy(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<PyBuffer> {
        let device = self.get()?;
        let host = host_array(array)?;
        let buf = device.buffer(host.scalar, host.len).map_err(|e| raise(py, e))?;
        PyBuffer::copy_in(py, &buf, &host)?;
        Ok(PyBuffer::on(buf, device))
    }

    /// Closes this handle: every later call through it (but `name` and `repr`) raises
    /// `InvalidArgumentError`. The device itself is opened once per process and stays open for
    /// other handles and for the buffers, kernels and plans made from it, which keep working
    /// (they hold the device); its memory is freed when the last of them is gone.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        slf.get().get()?;
        Ok(slf)
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) {
        self.close();
    }

    fn __repr__(&self) -> String {
        let closed = if self.closed.load(Ordering::Acquire) { ", closed" } else { "" };
        format!("<kiln.Device {} generation {}{closed}>", self.device.spec(), self.device.generation())
    }
}

/// `err` with "kernel i of the batch: " before its message (same class and attributes).
fn prefix(py: Python<'_>, err: PyErr, i: usize) -> PyErr {
    let value = err.value(py);
    let message = value.str().map(|s| s.to_string()).unwrap_or_default();
    // The message is the exception's first argument; replace it, keep the attributes.
    if let Ok(args) = PyTuple::new(py, [format!("kernel {i} of the batch: {message}")]) {
        let _ = value.setattr("args", args);
    }
    err
}
