//! Device memory: one `cuMemAlloc` per allocation, host copies through pinned staging.
//!
//! A [`RawPtr`] of this allocator is the `CUdeviceptr` (a device address, not a host one).
//! Host transfers go through a page-locked staging buffer in chunks, which is what lets the
//! DMA engine copy at full speed (a pageable copy is staged by the driver anyway, at a
//! lower rate). Every transfer runs on the calling thread's default stream and blocks until
//! done, so a returned `copyin` never races a later launch and a returned `copyout` holds
//! the data.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Allocator, AllocatorStats, Error, RawPtr, RawView, Result};

use crate::{CudaDevice, PER_THREAD_STREAM, driver};

/// The size of the pinned staging buffer (and of one transfer chunk).
pub const STAGING_BYTES: usize = 8 << 20;

/// A page-locked host buffer (`cuMemHostAlloc`).
struct Pinned {
    ptr: *mut u8,
    bytes: usize,
    /// Pinned memory belongs to a context: after a primary-context reset the driver has
    /// freed it, and a free then could release a newer context's staging at the same address.
    cu: Arc<CudaDevice>,
}

// SAFETY: the buffer is plain host memory owned by this value; access is serialized by the
// allocator's mutex.
unsafe impl Send for Pinned {}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.cu.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemHostAlloc in this (live) context and is freed once.
            let _ = unsafe { cu::free_host(self.ptr as *mut c_void) };
        }
    }
}

/// Device memory of one CUDA device. Not host-addressable.
pub struct CudaAllocator {
    cu: Arc<CudaDevice>,
    /// Allocated on the first host transfer. A transfer that finds it busy (another thread
    /// is copying) copies from pageable memory instead of waiting.
    staging: Mutex<Option<Pinned>>,
    in_use: AtomicUsize,
    high_water: AtomicUsize,
    allocations: AtomicU64,
}

/// The device address of a view.
pub(crate) fn address(view: &RawView) -> sys::CUdeviceptr {
    view.base.0 as sys::CUdeviceptr + view.offset as sys::CUdeviceptr
}

impl CudaAllocator {
    pub fn new(cu: Arc<CudaDevice>) -> CudaAllocator {
        CudaAllocator {
            cu,
            staging: Mutex::new(None),
            in_use: AtomicUsize::new(0),
            high_water: AtomicUsize::new(0),
            allocations: AtomicU64::new(0),
        }
    }

    fn oom(&self, requested: usize) -> Error {
        Error::OutOfMemory {
            device: self.cu.spec.to_string(),
            requested,
            in_use: self.in_use.load(Ordering::Relaxed),
            cached: 0,
            budget: None,
        }
    }

    fn sync(&self, what: &str) -> Result<()> {
        // SAFETY: the per-thread stream of the calling thread, whose context is current.
        unsafe { cu::stream::synchronize(PER_THREAD_STREAM) }.map_err(|e| driver(what, e))
    }

    /// Runs `copy` once per staging chunk with the pinned buffer, or once over everything
    /// with `None` when the staging buffer is busy or cannot be allocated.
    fn staged(&self, bytes: usize, mut copy: impl FnMut(Option<&mut [u8]>, usize, usize) -> Result<()>) -> Result<()> {
        let Ok(mut slot) = self.staging.try_lock() else { return copy(None, 0, bytes) };
        if slot.is_none() {
            // SAFETY: allocates page-locked host memory; freed by `Pinned::drop`.
            if let Ok(ptr) = unsafe { cu::malloc_host(STAGING_BYTES, 0) } {
                *slot = Some(Pinned { ptr: ptr as *mut u8, bytes: STAGING_BYTES, cu: self.cu.clone() });
            }
        }
        let Some(pinned) = slot.as_mut() else { return copy(None, 0, bytes) };
        // SAFETY: the pinned buffer holds `pinned.bytes` bytes and the mutex is held.
        let buf = unsafe { std::slice::from_raw_parts_mut(pinned.ptr, pinned.bytes) };
        let mut done = 0;
        while done < bytes {
            let n = (bytes - done).min(buf.len());
            copy(Some(&mut buf[..n]), done, n)?;
            done += n;
        }
        Ok(())
    }
}

impl Allocator for CudaAllocator {
    /// DLPack's `kDLCUDA`.
    fn dlpack_device_type(&self) -> Option<i32> {
        Some(2)
    }

    fn device(&self) -> &DeviceSpec {
        &self.cu.spec
    }

    /// `cuMemAlloc`; a refusal for lack of memory is [`Error::OutOfMemory`].
    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        if bytes == 0 {
            return Err(Error::Buffer("cannot allocate 0 bytes".into()));
        }
        self.cu.bind()?;
        // SAFETY: the device's context is current; the memory is freed in `free`.
        match unsafe { cu::malloc_sync(bytes) } {
            Ok(ptr) => {
                let now = self.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
                self.high_water.fetch_max(now, Ordering::Relaxed);
                self.allocations.fetch_add(1, Ordering::Relaxed);
                Ok(RawPtr(ptr as *mut c_void))
            }
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(self.oom(bytes)),
            Err(e) => Err(driver("cuMemAlloc", e)),
        }
    }

    /// `cuMemFree`, which waits for the work still using the memory.
    unsafe fn free(&self, ptr: RawPtr, bytes: usize) {
        if self.cu.bind().is_ok() {
            // SAFETY: `ptr` came from `alloc` (caller's contract) and is freed once. A failure
            // leaves nothing to undo.
            let _ = unsafe { cu::free_sync(ptr.0 as sys::CUdeviceptr) };
        }
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }

    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.cu.bind()?;
        let at = address(&dst);
        self.staged(src.len(), |pinned, off, n| {
            let from = &src[off..off + n];
            match pinned {
                Some(buf) => {
                    buf.copy_from_slice(from);
                    // SAFETY: `dst` covers `src.len()` bytes of a live allocation (caller's
                    // contract); the pinned chunk stays untouched until the sync below.
                    unsafe { cu::memcpy_htod_async(at + off as u64, &*buf, PER_THREAD_STREAM) }
                        .map_err(|e| driver("cuMemcpyHtoDAsync", e))?;
                    self.sync("cuStreamSynchronize after a host-to-device copy")
                }
                // SAFETY: as above; the pageable copy is synchronous.
                None => unsafe { cu::memcpy_htod_sync(at + off as u64, from) }.map_err(|e| driver("cuMemcpyHtoD", e)),
            }
        })
    }

    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.cu.bind()?;
        let at = address(&src);
        self.staged(dst.len(), |pinned, off, n| match pinned {
            Some(buf) => {
                // SAFETY: `src` covers `dst.len()` bytes of a live allocation (caller's contract).
                unsafe { cu::memcpy_dtoh_async(&mut *buf, at + off as u64, PER_THREAD_STREAM) }
                    .map_err(|e| driver("cuMemcpyDtoHAsync", e))?;
                self.sync("cuStreamSynchronize after a device-to-host copy")?;
                dst[off..off + n].copy_from_slice(buf);
                Ok(())
            }
            // SAFETY: as above; the pageable copy is synchronous.
            None => unsafe { cu::memcpy_dtoh_sync(&mut dst[off..off + n], at + off as u64) }
                .map_err(|e| driver("cuMemcpyDtoH", e)),
        })
    }

    unsafe fn copy(&self, dst: RawView, src: RawView) -> Result<()> {
        if src.bytes == 0 {
            return Ok(());
        }
        self.cu.bind()?;
        // SAFETY: both windows lie in live allocations and have the same size (caller's contract).
        unsafe { cu::memcpy_dtod_async(address(&dst), address(&src), src.bytes, PER_THREAD_STREAM) }
            .map_err(|e| driver("cuMemcpyDtoDAsync", e))?;
        self.sync("cuStreamSynchronize after a device copy")
    }

    fn stats(&self) -> AllocatorStats {
        AllocatorStats {
            in_use: self.in_use.load(Ordering::Relaxed),
            cached: 0,
            high_water: self.high_water.load(Ordering::Relaxed),
            hits: 0,
            misses: self.allocations.load(Ordering::Relaxed),
            budget: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use kiln_device::Buffer;
    use kiln_device::kiln_ir::Scalar;

    use crate::test_device;

    /// Transfers larger than the staging buffer, at odd offsets, round-trip exactly.
    #[test]
    fn staged_transfers_round_trip() {
        let Some(dev) = test_device() else { return };
        let n = super::STAGING_BYTES / 4 * 2 + 37;
        let data: Vec<u32> = (0..n as u32).map(|x| x.wrapping_mul(2654435761)).collect();
        let a = Buffer::from_slice(dev.allocator(), &data).unwrap();
        assert_eq!(a.to_vec::<u32>().unwrap(), data);
        let b = dev.buffer(Scalar::U32, n).unwrap();
        b.view(3, n - 3).unwrap().copy_from(&a.view(0, n - 3).unwrap()).unwrap();
        assert_eq!(&b.to_vec::<u32>().unwrap()[3..], &data[..n - 3]);
    }
}
