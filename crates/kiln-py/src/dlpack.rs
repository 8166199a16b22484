//! DLPack (<https://dmlc.github.io/dlpack/latest/>): the C structs, exporting a kiln buffer
//! as a capsule that shares its memory, and importing another library's tensor.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use kiln_device::{Allocator, Buffer, Error as KilnError, RawPtr, RawView, Result as KilnResult};
use kiln_ir::{DeviceSpec, Scalar};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::dtype;
use crate::errors::invalid_arg;

/// `kDLCPU`: host memory.
pub const DL_CPU: i32 = 1;
/// `kDLCUDA`: CUDA device memory.
pub const DL_CUDA: i32 = 2;
/// `kDLCUDAHost`: pinned host memory, readable by the host.
const DL_CUDA_HOST: i32 = 3;
/// `kDLExtDev`: memory of a device DLPack has no type for.
const DL_EXT_DEV: i32 = 12;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;

const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";
const USED_LEGACY: &CStr = c"used_dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: [u32; 2],
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// The two managed-tensor structs (DLPack 0.x and 1.x), for code written once for both.
trait ManagedTensor: Sized + 'static {
    /// The capsule name of a tensor not consumed yet.
    const NAME: &'static CStr;
    /// The struct around `tensor`, deleted by `deleter`.
    fn wrap(tensor: DLTensor, deleter: unsafe extern "C" fn(*mut Self)) -> Self;
    fn tensor(&mut self) -> &mut DLTensor;
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;
    fn flags(&self) -> u64;
}

impl ManagedTensor for DLManagedTensor {
    const NAME: &'static CStr = LEGACY;
    fn wrap(dl_tensor: DLTensor, deleter: unsafe extern "C" fn(*mut Self)) -> Self {
        DLManagedTensor { dl_tensor, manager_ctx: std::ptr::null_mut(), deleter: Some(deleter) }
    }
    fn tensor(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
    fn flags(&self) -> u64 {
        0
    }
}

impl ManagedTensor for DLManagedTensorVersioned {
    const NAME: &'static CStr = VERSIONED;
    fn wrap(dl_tensor: DLTensor, deleter: unsafe extern "C" fn(*mut Self)) -> Self {
        DLManagedTensorVersioned {
            version: [1, 0],
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
            flags: 0,
            dl_tensor,
        }
    }
    fn tensor(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
    fn flags(&self) -> u64 {
        self.flags
    }
}

/// Calls a managed tensor's deleter (DLPack's way to release it).
///
/// # Safety
/// `m` is a live managed tensor owned by the caller, released exactly once.
unsafe fn release<M: ManagedTensor>(m: *mut M) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if let Some(d) = (*m).deleter() {
            d(m)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Export

/// What an exported capsule owns: the managed tensor (first, so a pointer to it is a
/// pointer to the whole), its shape and strides, and a handle of the buffer that keeps the
/// memory alive until the consumer calls the deleter.
#[repr(C)]
struct Exported<M> {
    managed: M,
    shape: [i64; 1],
    strides: [i64; 1],
    _buffer: Buffer,
}

unsafe extern "C" fn delete_exported<M>(managed: *mut M) {
    // SAFETY: `managed` is the first field of an `Exported<M>` boxed by `boxed`; DLPack calls
    // the deleter once.
    drop(unsafe { Box::from_raw(managed as *mut Exported<M>) });
}

/// A managed tensor describing `tensor` of `len` elements, owning a handle of `buf`.
fn boxed<M: ManagedTensor>(tensor: DLTensor, len: i64, buf: &Buffer) -> *mut M {
    let managed = M::wrap(tensor, delete_exported::<M>);
    let b = Box::into_raw(Box::new(Exported { managed, shape: [len], strides: [1], _buffer: buf.clone() }));
    // SAFETY: `b` was just boxed and is not shared yet; the shape and strides live as long
    // as the tensor that points at them.
    unsafe {
        let e = &mut *b;
        let t = e.managed.tensor();
        t.shape = e.shape.as_mut_ptr();
        t.strides = e.strides.as_mut_ptr();
    }
    b as *mut M
}

/// The capsule destructor: a capsule nobody consumed (still under its own name) deletes its
/// tensor; a consumed one was renamed `used_...` and its consumer owns the tensor.
unsafe extern "C" fn drop_capsule(capsule: *mut ffi::PyObject) {
    /// # Safety
    /// As for `drop_capsule`.
    unsafe fn release_if<M: ManagedTensor>(capsule: *mut ffi::PyObject) {
        // SAFETY: IsValid accepts any capsule; a valid one under M's name holds an M that
        // nobody consumed, so it is ours to release.
        unsafe {
            if ffi::PyCapsule_IsValid(capsule, M::NAME.as_ptr()) == 1 {
                release(ffi::PyCapsule_GetPointer(capsule, M::NAME.as_ptr()) as *mut M);
            }
        }
    }
    // SAFETY: Python calls the destructor with the capsule, holding the GIL.
    unsafe {
        release_if::<DLManagedTensor>(capsule);
        release_if::<DLManagedTensorVersioned>(capsule);
    }
}

/// A capsule owning `managed` under its type's name.
fn capsule<M: ManagedTensor>(py: Python<'_>, managed: *mut M) -> PyResult<Py<PyAny>> {
    // SAFETY: `managed` is a live managed tensor the capsule now owns; the name is static.
    let capsule = unsafe { ffi::PyCapsule_New(managed as *mut c_void, M::NAME.as_ptr(), Some(drop_capsule)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so the tensor is still ours to release.
        unsafe { release(managed) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
}

/// The DLPack device of a buffer, as `__dlpack_device__` reports it: host memory is `kDLCPU`,
/// other memory the type its backend's allocator names (`kDLCUDA`, `kDLOpenCL`, ...; only
/// CUDA memory is exported, the others have no pointer a consumer could use), else
/// `kDLExtDev`.
pub fn device_of(buf: &Buffer) -> (i32, i32) {
    let ordinal = i32::try_from(buf.device().ordinal()).unwrap_or(i32::MAX);
    if buf.allocator().is_host() {
        return (DL_CPU, 0);
    }
    (buf.allocator().dlpack_device_type().unwrap_or(DL_EXT_DEV), ordinal)
}

/// The DLPack device of a buffer whose memory can be exported (host or CUDA memory).
///
/// # Errors
/// `BufferError` (as DLPack asks of `__dlpack__`) for memory without a usable pointer.
pub fn exportable_device(buf: &Buffer) -> PyResult<(i32, i32)> {
    let device = device_of(buf);
    if matches!(device.0, DL_CPU | DL_CUDA) {
        return Ok(device);
    }
    Err(PyBufferError::new_err(format!(
        "memory of {} cannot be shared through DLPack (it is not addressable by a pointer); copy it out with numpy()",
        buf.device()
    )))
}

/// A capsule sharing `buf`'s memory: the versioned form when the consumer accepts DLPack 1.
pub fn export(py: Python<'_>, buf: &Buffer, versioned: bool) -> PyResult<Py<PyAny>> {
    let (device_type, device_id) = exportable_device(buf)?;
    let view = buf.raw().map_err(|e| crate::errors::raise(py, e))?;
    let (data, byte_offset) =
        if device_type == DL_CPU { (view.host_ptr() as *mut c_void, 0) } else { (view.base.0, view.offset as u64) };
    let (code, bits) = dtype::to_dlpack(buf.dtype());
    let tensor = DLTensor {
        data,
        device: DLDevice { device_type, device_id },
        ndim: 1,
        dtype: DLDataType { code, bits, lanes: 1 },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset,
    };
    let len = i64::try_from(buf.len()).map_err(|_| PyBufferError::new_err("buffer too long for DLPack"))?;
    if versioned {
        capsule(py, boxed::<DLManagedTensorVersioned>(tensor, len, buf))
    } else {
        capsule(py, boxed::<DLManagedTensor>(tensor, len, buf))
    }
}

// ---------------------------------------------------------------------------------------
// Import

/// Another library's tensor, taken from its DLPack capsule: kiln owns it (the capsule was
/// renamed `used_...`) and calls its deleter when dropped.
pub struct Imported {
    managed: Managed,
    /// The first element (data + byte offset).
    ptr: *mut u8,
    /// Elements, and their dtype.
    pub len: usize,
    pub scalar: Scalar,
    /// The extents, row-major (empty for a scalar).
    pub shape: Vec<usize>,
    pub readonly: bool,
    /// DLPack device type and id.
    pub device: (i32, i32),
}

enum Managed {
    Legacy(*mut DLManagedTensor),
    Versioned(*mut DLManagedTensorVersioned),
}

// SAFETY: the tensor's memory is plain bytes and its deleter may be called from any thread
// (DLPack's contract; numpy's takes the GIL itself).
unsafe impl Send for Imported {}
// SAFETY: as above; shared access only reads the pointer values.
unsafe impl Sync for Imported {}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: kiln owns the managed tensor (the capsule was consumed) and releases it once.
        unsafe {
            match self.managed {
                Managed::Legacy(m) => release(m),
                Managed::Versioned(m) => release(m),
            }
        }
    }
}

impl Imported {
    /// An import of `managed` that describes nothing yet (its drop releases the tensor).
    fn empty(managed: Managed) -> Imported {
        Imported {
            managed,
            ptr: std::ptr::null_mut(),
            len: 0,
            scalar: Scalar::U8,
            shape: Vec::new(),
            readonly: true,
            device: (0, 0),
        }
    }

    /// Takes `obj`'s tensor through its `__dlpack__` (asking for DLPack 1, else the legacy form).
    ///
    /// # Errors
    /// `kiln.InvalidArgumentError` when `obj` has no `__dlpack__`, when its export fails, and
    /// for a tensor kiln cannot use as one contiguous run of elements (strided, multi-lane,
    /// a dtype kiln lacks such as complex).
    pub fn take(obj: &Bound<'_, PyAny>) -> PyResult<Imported> {
        let py = obj.py();
        let method = obj.getattr("__dlpack__").map_err(|_| {
            invalid_arg(
                py,
                format!(
                    "a {} does not support DLPack (no __dlpack__); pass a numpy array or another DLPack tensor",
                    obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                ),
            )
        })?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1, 0))?;
        let exported = match method.call((), Some(&kwargs)) {
            Err(e) if e.is_instance_of::<PyTypeError>(py) => method.call0(),
            other => other,
        };
        // The producer's own refusal (numpy's for an object or structured dtype, say).
        let capsule = exported.map_err(|e| {
            let dtype = obj.getattr("dtype").map(|d| format!(" of dtype {d}")).unwrap_or_default();
            invalid_arg(py, format!("kiln cannot take this array{dtype}: its DLPack export failed: {e}"))
        })?;
        let cap = capsule.as_ptr();
        /// The tensor of a capsule under M's name, taken over (the capsule renamed `used`).
        ///
        /// # Safety
        /// `cap` is a live object and the GIL is held.
        unsafe fn take<M: ManagedTensor>(cap: *mut ffi::PyObject, used: &CStr) -> Option<(*mut M, DLTensor, u64)> {
            // SAFETY: IsValid/GetPointer/SetName accept any object; after the rename the
            // capsule's destructor leaves the tensor to us.
            unsafe {
                if ffi::PyCapsule_IsValid(cap, M::NAME.as_ptr()) != 1 {
                    return None;
                }
                let m = ffi::PyCapsule_GetPointer(cap, M::NAME.as_ptr()) as *mut M;
                ffi::PyCapsule_SetName(cap, used.as_ptr());
                Some((m, *(*m).tensor(), (*m).flags()))
            }
        }
        // SAFETY: `cap` is held by `capsule`, with the GIL.
        let (managed, tensor, flags) = unsafe {
            if let Some((m, t, f)) = take::<DLManagedTensorVersioned>(cap, USED_VERSIONED) {
                let major = (*m).version[0];
                let managed = Managed::Versioned(m);
                if major != 1 {
                    drop(Imported::empty(managed));
                    return Err(invalid_arg(py, format!("DLPack {major} tensors are not supported")));
                }
                (managed, t, f)
            } else if let Some((m, t, f)) = take::<DLManagedTensor>(cap, USED_LEGACY) {
                (Managed::Legacy(m), t, f)
            } else {
                return Err(invalid_arg(py, "__dlpack__ returned no DLPack capsule (or one already used)"));
            }
        };
        // From here on the tensor is deleted on every path (Imported's drop).
        let mut imported = Imported::empty(managed);
        imported.ptr = (tensor.data as *mut u8).wrapping_add(tensor.byte_offset as usize);
        imported.readonly = flags & FLAG_READ_ONLY != 0;
        imported.device = (tensor.device.device_type, tensor.device.device_id);
        let dt = tensor.dtype;
        imported.scalar = dtype::from_dlpack(dt.code, dt.bits).filter(|_| dt.lanes == 1).ok_or_else(|| {
            let named = obj.getattr("dtype").map(|d| format!("{d}: ")).unwrap_or_default();
            invalid_arg(
                py,
                format!(
                    "{named}DLPack dtype (code {}, {} bits, {} lanes) has no kiln dtype (kiln's dtypes: {})",
                    dt.code,
                    dt.bits,
                    dt.lanes,
                    Scalar::ALL.map(Scalar::name).join(", ")
                ),
            )
        })?;
        let ndim = usize::try_from(tensor.ndim).map_err(|_| invalid_arg(py, "negative ndim"))?;
        // SAFETY: DLPack gives `ndim` shape entries, and `ndim` strides when not null.
        let (shape, strides) = unsafe {
            let shape = if ndim == 0 { &[][..] } else { std::slice::from_raw_parts(tensor.shape, ndim) };
            let strides =
                (!tensor.strides.is_null() && ndim > 0).then(|| std::slice::from_raw_parts(tensor.strides, ndim));
            (shape, strides)
        };
        let mut len: usize = 1;
        let mut expect: i64 = 1;
        let mut extents = vec![0usize; ndim];
        // An empty tensor has no layout to check (numpy gives it strides of 0).
        let empty = shape.contains(&0);
        for d in (0..ndim).rev() {
            let extent = usize::try_from(shape[d]).map_err(|_| invalid_arg(py, "negative extent"))?;
            if let Some(s) = strides
                && !empty
                && extent > 1
                && s[d] != expect
            {
                return Err(invalid_arg(
                    py,
                    format!(
                        "kiln takes contiguous (C-order) memory, and this tensor is strided (shape {shape:?}, \
                         strides {s:?} elements): pass numpy.ascontiguousarray(x), or use Device.from_numpy, which copies"
                    ),
                ));
            }
            expect = expect.saturating_mul(shape[d]);
            len = len.checked_mul(extent).ok_or_else(|| invalid_arg(py, "tensor size overflows"))?;
            extents[d] = extent;
        }
        imported.len = len;
        imported.shape = extents;
        Ok(imported)
    }

    /// Whether the host can read the memory.
    pub fn on_host(&self) -> bool {
        matches!(self.device.0, DL_CPU | DL_CUDA_HOST)
    }

    /// The elements' bytes, when the host can read them.
    pub fn bytes(&self) -> Option<&[u8]> {
        let n = self.len * self.scalar.size();
        if !self.on_host() {
            return None;
        }
        if n == 0 {
            return Some(&[]);
        }
        // SAFETY: the producer guarantees `len` contiguous elements at `ptr`, alive until
        // its deleter runs (when `self` drops).
        Some(unsafe { std::slice::from_raw_parts(self.ptr, n) })
    }

    /// The elements' bytes for writing, when the host can write them (not read-only).
    ///
    /// # Safety
    /// No other reference to the tensor's memory may be used while the slice is alive.
    pub unsafe fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        let n = self.len * self.scalar.size();
        if !self.on_host() || self.readonly {
            return None;
        }
        if n == 0 {
            return Some(&mut []);
        }
        // SAFETY: as in `bytes`; exclusivity is the caller's promise.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr, n) })
    }

    /// Whether a kiln kernel can use the memory in place: host memory, writable, non-empty
    /// and aligned to its element size.
    pub fn shareable(&self) -> bool {
        self.on_host() && !self.readonly && self.len > 0 && (self.ptr as usize).is_multiple_of(self.scalar.size())
    }
}

/// Host memory another library owns, as a kiln allocator of one block: a buffer over it
/// shares the memory with that library and keeps it alive (the tensor's deleter runs when
/// the last view of the buffer is gone).
pub struct ForeignMemory {
    tensor: Imported,
    device: DeviceSpec,
}

impl ForeignMemory {
    /// A buffer sharing `tensor`'s memory, usable by `device` (a host device).
    ///
    /// # Errors
    /// [`KilnError::Invalid`] when the tensor cannot be shared ([`Imported::shareable`]).
    pub fn buffer(tensor: Imported, device: DeviceSpec) -> KilnResult<Buffer> {
        if !tensor.shareable() {
            return Err(KilnError::Invalid("this tensor cannot be shared in place".into()));
        }
        let (scalar, len) = (tensor.scalar, tensor.len);
        Buffer::new(std::sync::Arc::new(ForeignMemory { tensor, device }), scalar, len)
    }
}

impl Allocator for ForeignMemory {
    fn device(&self) -> &DeviceSpec {
        &self.device
    }

    fn alloc(&self, bytes: usize) -> KilnResult<RawPtr> {
        let have = self.tensor.len * self.tensor.scalar.size();
        if bytes > have {
            return Err(KilnError::Buffer(format!("{bytes} bytes asked of an imported tensor of {have}")));
        }
        NonNull::new(self.tensor.ptr as *mut c_void)
            .map(|p| RawPtr(p.as_ptr()))
            .ok_or_else(|| KilnError::Buffer("the imported tensor has no memory".into()))
    }

    unsafe fn free(&self, _ptr: RawPtr, _bytes: usize) {
        // The memory is the producer's: its deleter runs when this allocator drops.
    }

    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> KilnResult<()> {
        // SAFETY: the caller guarantees `dst` lies in the block and has `src.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.host_ptr(), src.len()) };
        Ok(())
    }

    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> KilnResult<()> {
        // SAFETY: as in `copyin`.
        unsafe { std::ptr::copy_nonoverlapping(src.host_ptr(), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn is_host(&self) -> bool {
        true
    }
}
