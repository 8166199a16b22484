//! `kiln.Buffer`: device memory with numpy copies, zero-copy views and DLPack export.

use std::sync::Arc;

use kiln_device::{Buffer, Device, Error as KilnError};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::dlpack::{self, Imported};
use crate::dtype;
use crate::errors::{Failure, detached, invalid, invalid_arg, raise};
use kiln_runtime::LaunchStream;

/// A typed window onto device memory. Views share the memory, which stays alive as long as
/// any view, numpy array or DLPack tensor made from it.
#[pyclass(frozen, weakref, name = "Buffer", module = "kiln")]
pub struct PyBuffer {
    pub buf: Buffer,
    /// The queue of the buffer's device when its launches are asynchronous: host access
    /// waits for it first.
    pub stream: Option<Arc<LaunchStream>>,
}

/// numpy, imported on first need (it is only needed for numpy interop).
pub fn numpy(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    py.import("numpy").map_err(|_| invalid_arg(py, "this call needs numpy: pip install numpy"))
}

/// A size or offset argument: a Python int from 0 to the largest buffer size, checked before
/// any conversion so that a negative or huge value is `kiln.InvalidArgumentError`.
pub fn size_arg(py: Python<'_>, what: &str, v: &Bound<'_, PyAny>) -> PyResult<usize> {
    if !v.is_instance_of::<pyo3::types::PyInt>() {
        let ty = v.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        return Err(invalid_arg(py, format!("{what} must be an int, got {ty}")));
    }
    match v.extract::<i128>() {
        Ok(n) if n < 0 => Err(invalid_arg(py, format!("{what} must be 0 or more, got {n}"))),
        Ok(n) if n <= kiln_device::MAX_BUFFER_BYTES as i128 => Ok(n as usize),
        _ => Err(invalid_arg(py, format!("{what} = {v} is larger than any buffer can be (at most 2**63 - 1 bytes)"))),
    }
}

/// `obj` as a contiguous host array through DLPack (a copy only when it is not contiguous or
/// not an array yet, as `numpy.ascontiguousarray` decides).
pub fn host_array(obj: &Bound<'_, PyAny>) -> PyResult<Imported> {
    let py = obj.py();
    let array = numpy(py)?.getattr("ascontiguousarray")?.call1((obj,)).map_err(|e| {
        // numpy's refusal of the object (a ragged list) or of the copy's size, as kiln's.
        let failure = if e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py) {
            let requested = obj.getattr("nbytes").and_then(|n| n.extract()).unwrap_or(0);
            KilnError::OutOfMemory { device: "the host".into(), requested, in_use: 0, cached: 0, budget: None }
        } else {
            KilnError::Invalid(format!("numpy cannot make an array of this: {e}"))
        };
        raise(py, failure)
    })?;
    Imported::take(&array)
}

impl PyBuffer {
    /// A buffer of `device` (asynchronous launches there are waited for before host access).
    pub fn on(buf: Buffer, device: &Arc<kiln_device::Device>) -> PyBuffer {
        PyBuffer { buf, stream: LaunchStream::of(device) }
    }

    /// Another window of the same memory.
    fn derived(&self, buf: Buffer) -> PyBuffer {
        PyBuffer { buf, stream: self.stream.clone() }
    }

    /// Waits for the launches that may use this buffer's memory.
    pub fn settle(&self) -> Result<(), Failure> {
        self.stream.as_ref().map_or(Ok(()), |s| Ok(s.wait()?))
    }

    /// Copies a host array into `buf`: same dtype and element count.
    pub fn copy_in(py: Python<'_>, buf: &Buffer, array: &Imported) -> PyResult<()> {
        if array.scalar != buf.dtype() || array.len != buf.len() {
            return Err(invalid_arg(
                py,
                format!(
                    "cannot copy {} x {} into a buffer of {} x {}",
                    array.len,
                    array.scalar,
                    buf.len(),
                    buf.dtype()
                ),
            ));
        }
        let bytes = array.bytes().ok_or_else(|| invalid_arg(py, "the array's memory is not host memory"))?;
        detached(py, None, || Ok(buf.copyin(bytes)?))
    }
}

#[pymethods]
impl PyBuffer {
    /// The element type, as a kiln name (`"f32"`).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.buf.dtype().name()
    }

    /// The number of elements.
    fn __len__(&self) -> usize {
        self.buf.len()
    }

    /// The size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.nbytes()
    }

    /// The device the memory lives on (`"CPU"`, `"OPENCL:0"`).
    #[getter]
    fn device(&self) -> String {
        self.buf.device().to_string()
    }

    /// Whether the host can address the memory (zero-copy numpy and DLPack access).
    #[getter]
    fn is_host(&self) -> bool {
        self.buf.allocator().is_host()
    }

    fn __repr__(&self) -> String {
        format!("<kiln.Buffer {} x {} on {}>", self.buf.len(), self.buf.dtype(), self.buf.device())
    }

    /// A copy of the contents as a new 1-D numpy array.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let name = dtype::numpy_name(self.buf.dtype())
            .ok_or_else(|| invalid_arg(py, format!("numpy has no {} dtype; view() it as u16", self.buf.dtype())))?;
        let out = numpy(py)?.getattr("empty")?.call1((self.buf.len(), name))?;
        let mut array = Imported::take(&out)?;
        // SAFETY: `out` was just made and is referenced nowhere else while it is filled.
        let bytes = unsafe { array.bytes_mut() }.ok_or_else(|| invalid_arg(py, "numpy.empty is not writable"))?;
        detached(py, None, || {
            self.settle()?;
            Ok(self.buf.copyout(bytes)?)
        })?;
        Ok(out)
    }

    /// Copies `source` into this buffer: another kiln buffer of the same byte size (any
    /// device), or an array of the same dtype and element count.
    fn copy_from(&self, py: Python<'_>, source: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(src) = source.cast::<PyBuffer>() {
            let src = src.get();
            return detached(py, None, || {
                self.settle()?;
                src.settle()?;
                Ok(self.buf.copy_from(&src.buf)?)
            });
        }
        let array = host_array(source)?;
        detached(py, None, || self.settle())?;
        PyBuffer::copy_in(py, &self.buf, &array)
    }

    /// A zero-copy view of elements `offset .. offset + length`.
    #[pyo3(signature = (offset, length=None))]
    fn view(&self, py: Python<'_>, offset: &Bound<'_, PyAny>, length: Option<&Bound<'_, PyAny>>) -> PyResult<PyBuffer> {
        let offset = size_arg(py, "the view's offset", offset)?;
        let length = match length {
            Some(l) => size_arg(py, "the view's length", l)?,
            None => self.buf.len().checked_sub(offset).ok_or_else(|| {
                raise(py, KilnError::Buffer(format!("offset {offset} is past a buffer of {}", self.buf.len())))
            })?,
        };
        Ok(self.derived(self.buf.view(offset, length).map_err(|e| raise(py, e))?))
    }

    /// The same bytes as another dtype (the byte length must divide evenly).
    fn reinterpret(&self, py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<PyBuffer> {
        let scalar = dtype::parse(dtype)?;
        Ok(self.derived(self.buf.reinterpret(scalar).map_err(|e| raise(py, e))?))
    }

    /// DLPack export: a capsule sharing this buffer's memory (host and CUDA memory).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(Bound<'_, PyAny>, Bound<'_, PyAny>)>,
        dl_device: Option<(Bound<'_, PyAny>, Bound<'_, PyAny>)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        // Launches on the buffer's device are waited for below: there is no stream to order on.
        let _ = stream;
        if copy == Some(true) {
            return Err(PyBufferError::new_err("kiln exports its memory without copying; call numpy() for a copy"));
        }
        let here = dlpack::exportable_device(&self.buf)?;
        if let Some((kind, id)) = dl_device {
            let want = (kind.extract::<i64>().ok(), id.extract::<i64>().ok());
            if want != (Some(i64::from(here.0)), Some(i64::from(here.1))) {
                return Err(PyBufferError::new_err(format!(
                    "the buffer is on {} (DLPack device {here:?}), not on DLPack device ({kind}, {id})",
                    self.buf.device()
                )));
            }
        }
        // Any int is a version: a consumer of DLPack 1 or later gets the versioned form.
        let versioned = max_version.is_some_and(|(major, _)| major.extract::<i64>().map_or(true, |m| m >= 1));
        // The consumer reads the memory at once: the launches writing it must be done.
        detached(py, None, || self.settle())?;
        dlpack::export(py, &self.buf, versioned)
    }

    /// DLPack device: `(1, 0)` for host memory, `(2, n)` for CUDA device n, `(4, n)` for
    /// OpenCL, and for another backend the type its allocator names (memory `__dlpack__` does
    /// not export: only host and CUDA memory have pointers a consumer can use).
    fn __dlpack_device__(&self) -> (i32, i32) {
        dlpack::device_of(&self.buf)
    }

    /// numpy's array interface for host memory: `numpy.asarray(buf)` shares the memory and
    /// keeps the buffer alive.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !self.buf.allocator().is_host() {
            return Err(PyBufferError::new_err(format!("memory of {} is not host memory", self.buf.device())));
        }
        let typestr = dtype::typestr(self.buf.dtype())
            .ok_or_else(|| PyBufferError::new_err(format!("numpy has no {} dtype", self.buf.dtype())))?;
        let view = self.buf.raw().map_err(|e| raise(py, e))?;
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.buf.len(),))?;
        d.set_item("typestr", typestr)?;
        d.set_item("data", (view.host_ptr() as usize, false))?;
        Ok(d)
    }
}

/// `kiln.from_dlpack(x, device=None)`: a buffer sharing `x`'s host memory when `device` (by
/// default the CPU) can use it in place, else a copy on `device`.
pub fn from_dlpack(py: Python<'_>, x: &Bound<'_, PyAny>, device: Option<Arc<Device>>) -> PyResult<PyBuffer> {
    let dev = match device {
        Some(d) => d,
        None => detached(py, None, || kiln_device::open_device("CPU").map_err(Failure::from))?,
    };
    let tensor = Imported::take(x)?;
    if tensor.shareable() && dev.allocator().is_host() {
        let spec = dev.spec().clone();
        let buf = dlpack::ForeignMemory::buffer(tensor, spec).map_err(|e| raise(py, e))?;
        return Ok(PyBuffer::on(buf, &dev));
    }
    if !tensor.on_host() {
        return Err(raise(py, invalid("kiln imports host tensors only; copy device tensors to the host first")));
    }
    let buf = dev.buffer(tensor.scalar, tensor.len).map_err(|e| raise(py, e))?;
    PyBuffer::copy_in(py, &buf, &tensor)?;
    Ok(PyBuffer::on(buf, &dev))
}
