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

/// `kDLCPU`: host memory.
pub const DL_CPU: i32 = 1;
/// `kDLCUDA`: CUDA device memory.
pub const DL_CUDA: i32 = 2;
/// `kDLCUDAHost`: pinned host memory, readable by the host.
const DL_CUDA_HOST: i32 = 3;
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

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    // SAFETY: `managed` is the first field of an `Exported` boxed by `export`; DLPack calls
    // the deleter once.
    drop(unsafe { Box::from_raw(managed as *mut Exported<DLManagedTensor>) });
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: as in `delete_legacy`.
    drop(unsafe { Box::from_raw(managed as *mut Exported<DLManagedTensorVersioned>) });
}

/// The capsule destructor: a capsule nobody consumed (still under its own name) deletes its
/// tensor; a consumed one was renamed `used_...` and its consumer owns the tensor.
unsafe extern "C" fn drop_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls the destructor with the capsule, holding the GIL; IsValid and
    // GetPointer accept any capsule and the names are the ones `export` gave.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()) as *mut DLManagedTensor;
            if let Some(d) = (*m).deleter {
                d(m);
            }
        } else if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr()) as *mut DLManagedTensorVersioned;
            if let Some(d) = (*m).deleter {
                d(m);
            }
        }
    }
}

/// The DLPack device of a buffer: host memory is `kDLCPU`, CUDA memory `kDLCUDA`.
pub fn device_of(buf: &Buffer) -> PyResult<(i32, i32)> {
    if buf.allocator().is_host() {
        Ok((DL_CPU, 0))
    } else if buf.device().base_type() == "CUDA" {
        Ok((DL_CUDA, buf.device().ordinal() as i32))
    } else {
        Err(PyBufferError::new_err(format!(
            "memory of {} cannot be shared through DLPack (it is not addressable by a pointer); copy it out with numpy()",
            buf.device()
        )))
    }
}

/// A capsule sharing `buf`'s memory: the versioned form when the consumer accepts DLPack 1.
pub fn export(py: Python<'_>, buf: &Buffer, versioned: bool) -> PyResult<Py<PyAny>> {
    let (device_type, device_id) = device_of(buf)?;
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
    // The shape and strides pointers are set once the box has its final address.
    let (ptr, name) = if versioned {
        let managed = DLManagedTensorVersioned {
            version: [1, 0],
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor: tensor,
        };
        let b = Box::into_raw(Box::new(Exported { managed, shape: [len], strides: [1], _buffer: buf.clone() }));
        // SAFETY: `b` was just boxed and is not shared yet.
        unsafe {
            (*b).managed.dl_tensor.shape = (*b).shape.as_mut_ptr();
            (*b).managed.dl_tensor.strides = (*b).strides.as_mut_ptr();
            (*b).managed.manager_ctx = b as *mut c_void;
        }
        (b as *mut c_void, VERSIONED)
    } else {
        let managed =
            DLManagedTensor { dl_tensor: tensor, manager_ctx: std::ptr::null_mut(), deleter: Some(delete_legacy) };
        let b = Box::into_raw(Box::new(Exported { managed, shape: [len], strides: [1], _buffer: buf.clone() }));
        // SAFETY: as above.
        unsafe {
            (*b).managed.dl_tensor.shape = (*b).shape.as_mut_ptr();
            (*b).managed.dl_tensor.strides = (*b).strides.as_mut_ptr();
            (*b).managed.manager_ctx = b as *mut c_void;
        }
        (b as *mut c_void, LEGACY)
    };
    // SAFETY: `ptr` is a live managed tensor the capsule now owns; the name is static.
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(drop_capsule)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so the tensor is still ours to delete.
        unsafe {
            if versioned {
                delete_versioned(ptr as *mut DLManagedTensorVersioned)
            } else {
                delete_legacy(ptr as *mut DLManagedTensor)
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
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
        // SAFETY: kiln owns the managed tensor (the capsule was consumed) and deletes it once.
        unsafe {
            match self.managed {
                Managed::Legacy(m) => {
                    if let Some(d) = (*m).deleter {
                        d(m)
                    }
                }
                Managed::Versioned(m) => {
                    if let Some(d) = (*m).deleter {
                        d(m)
                    }
                }
            }
        }
    }
}

impl Imported {
    /// Takes `obj`'s tensor through its `__dlpack__` (asking for DLPack 1, else the legacy form).
    ///
    /// # Errors
    /// `TypeError` when `obj` has no `__dlpack__`; `BufferError` for a tensor kiln cannot
    /// use as one contiguous run of elements (strided, multi-lane, an unknown dtype).
    pub fn take(obj: &Bound<'_, PyAny>) -> PyResult<Imported> {
        let py = obj.py();
        let method = obj.getattr("__dlpack__").map_err(|_| {
            PyTypeError::new_err(format!(
                "a {} does not support DLPack (no __dlpack__); pass a numpy array or another DLPack tensor",
                obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1, 0))?;
        let capsule = match method.call((), Some(&kwargs)) {
            Ok(c) => c,
            Err(e) if e.is_instance_of::<PyTypeError>(py) => method.call0()?,
            Err(e) => return Err(e),
        };
        let cap = capsule.as_ptr();
        // SAFETY: `cap` is a live object (held by `capsule`); the IsValid/GetPointer/SetName
        // calls accept any object and are made with the GIL held. After the rename the
        // capsule's destructor leaves the tensor to us.
        let (managed, tensor, flags) = unsafe {
            if ffi::PyCapsule_IsValid(cap, VERSIONED.as_ptr()) == 1 {
                let m = ffi::PyCapsule_GetPointer(cap, VERSIONED.as_ptr()) as *mut DLManagedTensorVersioned;
                if (*m).version[0] != 1 {
                    return Err(PyBufferError::new_err(format!(
                        "DLPack {} tensors are not supported",
                        (*m).version[0]
                    )));
                }
                ffi::PyCapsule_SetName(cap, USED_VERSIONED.as_ptr());
                (Managed::Versioned(m), (*m).dl_tensor, (*m).flags)
            } else if ffi::PyCapsule_IsValid(cap, LEGACY.as_ptr()) == 1 {
                let m = ffi::PyCapsule_GetPointer(cap, LEGACY.as_ptr()) as *mut DLManagedTensor;
                ffi::PyCapsule_SetName(cap, USED_LEGACY.as_ptr());
                (Managed::Legacy(m), (*m).dl_tensor, 0)
            } else {
                return Err(PyBufferError::new_err("__dlpack__ returned no DLPack capsule (or one already used)"));
            }
        };
        // From here on the tensor is deleted on every path (Imported's drop).
        let mut imported = Imported {
            managed,
            ptr: (tensor.data as *mut u8).wrapping_add(tensor.byte_offset as usize),
            len: 0,
            scalar: Scalar::U8,
            readonly: flags & FLAG_READ_ONLY != 0,
            device: (tensor.device.device_type, tensor.device.device_id),
        };
        let dt = tensor.dtype;
        imported.scalar = dtype::from_dlpack(dt.code, dt.bits).filter(|_| dt.lanes == 1).ok_or_else(|| {
            PyBufferError::new_err(format!(
                "DLPack dtype (code {}, {} bits, {} lanes) has no kiln dtype",
                dt.code, dt.bits, dt.lanes
            ))
        })?;
        let ndim = usize::try_from(tensor.ndim).map_err(|_| PyBufferError::new_err("negative ndim"))?;
        // SAFETY: DLPack gives `ndim` shape entries, and `ndim` strides when not null.
        let (shape, strides) = unsafe {
            let shape = if ndim == 0 { &[][..] } else { std::slice::from_raw_parts(tensor.shape, ndim) };
            let strides =
                (!tensor.strides.is_null() && ndim > 0).then(|| std::slice::from_raw_parts(tensor.strides, ndim));
            (shape, strides)
        };
        let mut len: usize = 1;
        let mut expect: i64 = 1;
        for d in (0..ndim).rev() {
            let extent = usize::try_from(shape[d]).map_err(|_| PyBufferError::new_err("negative extent"))?;
            if let Some(s) = strides
                && extent > 1
                && s[d] != expect
            {
                return Err(PyBufferError::new_err(
                    "kiln takes contiguous (C-order) memory; pass numpy.ascontiguousarray(x)",
                ));
            }
            expect = expect.saturating_mul(shape[d]);
            len = len.checked_mul(extent).ok_or_else(|| PyBufferError::new_err("tensor size overflows"))?;
        }
        imported.len = len;
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
