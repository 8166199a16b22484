//! Device memory: one `cl_mem` buffer per allocation.
//!
//! A [`RawPtr`] of this allocator is the `cl_mem` handle itself (not an address), so views
//! reach kernels as (handle, byte offset) pairs; see [`crate::program`]. Host transfers and
//! copies run on the device's synchronous queue and block until done, so a returned
//! `copyin` never races a later launch and a returned `copyout` holds the data.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Allocator, AllocatorStats, Error, RawPtr, RawView, Result};
use opencl3::command_queue::{enqueue_copy_buffer, enqueue_read_buffer, enqueue_write_buffer};
use opencl3::error_codes::{
    CL_INVALID_BUFFER_SIZE, CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_HOST_MEMORY, CL_OUT_OF_RESOURCES,
};
use opencl3::event::Event;
use opencl3::memory::{CL_MEM_ALLOC_HOST_PTR, CL_MEM_READ_WRITE, create_buffer, release_mem_object};
use opencl3::types::{CL_BLOCKING, cl_mem};

use crate::{ClDevice, driver};

/// `cl_mem` allocations of one OpenCL device. Not host-addressable.
pub struct OpenClAllocator {
    cl: Arc<ClDevice>,
    in_use: AtomicUsize,
    high_water: AtomicUsize,
    allocations: AtomicU64,
}

impl OpenClAllocator {
    pub fn new(cl: Arc<ClDevice>) -> OpenClAllocator {
        OpenClAllocator {
            cl,
            in_use: AtomicUsize::new(0),
            high_water: AtomicUsize::new(0),
            allocations: AtomicU64::new(0),
        }
    }

    fn oom(&self, requested: usize) -> Error {
        Error::OutOfMemory {
            device: self.cl.spec.to_string(),
            requested,
            in_use: self.in_use.load(Ordering::Relaxed),
            cached: 0,
            budget: None,
        }
    }

    fn wait(&self, what: &str, event: opencl3::types::cl_event) -> Result<()> {
        let event = Event::new(event);
        event.wait().map_err(|e| driver(what, e))
    }
}

/// The `cl_mem` a raw pointer of this allocator carries.
pub(crate) fn mem(ptr: RawPtr) -> cl_mem {
    ptr.0 as cl_mem
}

impl Allocator for OpenClAllocator {
    /// DLPack's `kDLOpenCL`.
    fn dlpack_device_type(&self) -> Option<i32> {
        Some(4)
    }

    fn device(&self) -> &DeviceSpec {
        &self.cl.spec
    }

    /// Creates a read-write buffer. A request over `CL_DEVICE_MAX_MEM_ALLOC_SIZE`, one that
    /// with the bytes in use would exceed `CL_DEVICE_GLOBAL_MEM_SIZE`, or one the driver
    /// refuses for lack of memory is [`Error::OutOfMemory`], before any command touches it.
    ///
    /// Drivers may allocate a buffer's memory only when a command first uses it, and PoCL
    /// then aborts the process when that allocation fails (e.g. under `ulimit -v`). On a
    /// device whose memory is host memory the buffer is therefore created with
    /// `CL_MEM_ALLOC_HOST_PTR`, which makes the driver allocate it here, where a failure is
    /// an error code.
    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        if bytes == 0 {
            return Err(Error::Buffer("cannot allocate 0 bytes".into()));
        }
        let info = &self.cl.info;
        let in_use = self.in_use.load(Ordering::Relaxed) as u64;
        if bytes as u64 > info.max_mem_alloc_size || in_use.saturating_add(bytes as u64) > info.global_mem_size {
            return Err(self.oom(bytes));
        }
        let flags =
            if info.host_unified_memory { CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR } else { CL_MEM_READ_WRITE };
        // SAFETY: no host pointer is passed, so the driver owns the memory; the context is live.
        let m = unsafe { create_buffer(self.cl.context().get(), flags, bytes, std::ptr::null_mut()) };
        match m {
            Ok(m) => {
                let now = self.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
                self.high_water.fetch_max(now, Ordering::Relaxed);
                self.allocations.fetch_add(1, Ordering::Relaxed);
                Ok(RawPtr(m))
            }
            Err(
                CL_MEM_OBJECT_ALLOCATION_FAILURE | CL_OUT_OF_RESOURCES | CL_OUT_OF_HOST_MEMORY | CL_INVALID_BUFFER_SIZE,
            ) => Err(self.oom(bytes)),
            Err(e) => Err(driver("clCreateBuffer", e)),
        }
    }

    /// Releases the buffer. OpenCL keeps it alive until every enqueued command using it has
    /// finished, so freeing while a queue still runs a kernel on it is safe for the driver.
    unsafe fn free(&self, ptr: RawPtr, bytes: usize) {
        // SAFETY: `ptr` is a cl_mem from `alloc` (caller's contract), released exactly once.
        // A failure here means the handle was invalid; there is nothing left to undo.
        let _ = unsafe { release_mem_object(mem(ptr)) };
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }

    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let q = self.cl.sync_queue().get();
        // SAFETY: `dst` lies in a live cl_mem (caller's contract), `src` has exactly `dst.bytes`
        // bytes and the write is blocking, so `src` outlives the transfer.
        let ev = unsafe {
            enqueue_write_buffer(
                q,
                mem(dst.base),
                CL_BLOCKING,
                dst.offset,
                src.len(),
                src.as_ptr() as *const c_void,
                0,
                std::ptr::null(),
            )
        }
        .map_err(|e| driver("clEnqueueWriteBuffer", e))?;
        self.wait("clEnqueueWriteBuffer", ev)
    }

    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let q = self.cl.sync_queue().get();
        // SAFETY: `src` lies in a live cl_mem, `dst` has exactly `src.bytes` bytes and the
        // read is blocking, so `dst` is written before this returns and not after.
        let ev = unsafe {
            enqueue_read_buffer(
                q,
                mem(src.base),
                CL_BLOCKING,
                src.offset,
                dst.len(),
                dst.as_mut_ptr() as *mut c_void,
                0,
                std::ptr::null(),
            )
        }
        .map_err(|e| driver("clEnqueueReadBuffer", e))?;
        self.wait("clEnqueueReadBuffer", ev)
    }

    /// A device-side copy (`clEnqueueCopyBuffer`), waited for.
    unsafe fn copy(&self, dst: RawView, src: RawView) -> Result<()> {
        if src.bytes == 0 {
            return Ok(());
        }
        let q = self.cl.sync_queue().get();
        // SAFETY: both windows lie in live cl_mem objects of this context with equal sizes
        // (caller's contract).
        let ev = unsafe {
            enqueue_copy_buffer(q, mem(src.base), mem(dst.base), src.offset, dst.offset, src.bytes, 0, std::ptr::null())
        }
        .map_err(|e| driver("clEnqueueCopyBuffer", e))?;
        self.wait("clEnqueueCopyBuffer", ev)
    }

    fn is_host(&self) -> bool {
        false
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
    use kiln_device::{Allocator, Buffer, Error};

    use crate::test_device;

    #[test]
    fn copyin_copyout_and_views_round_trip() {
        let Some(dev) = test_device() else { return };
        let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        let b = Buffer::from_slice(dev.allocator(), &data).unwrap();
        assert_eq!(b.to_vec::<f32>().unwrap(), data);
        // A view at an odd element offset: no sub-buffer alignment applies.
        let v = b.view(3, 7).unwrap();
        assert_eq!(v.to_vec::<f32>().unwrap(), data[3..10]);
        v.copy_from_slice(&[9.0f32; 7]).unwrap();
        let back = b.to_vec::<f32>().unwrap();
        assert_eq!(back[2], data[2]);
        assert_eq!(&back[3..10], &[9.0; 7]);
        assert_eq!(back[10], data[10]);
        assert!(!dev.allocator().is_host());
    }

    #[test]
    fn device_copies_and_cross_device_copies() {
        let Some(dev) = test_device() else { return };
        let src = Buffer::from_slice(dev.allocator(), &[1i32, 2, 3, 4, 5, 6]).unwrap();
        let dst = dev.buffer(kiln_device::kiln_ir::Scalar::I32, 6).unwrap();
        dst.view(0, 3).unwrap().copy_from(&src.view(3, 3).unwrap()).unwrap();
        dst.view(3, 3).unwrap().copy_from(&src.view(0, 3).unwrap()).unwrap();
        assert_eq!(dst.to_vec::<i32>().unwrap(), vec![4, 5, 6, 1, 2, 3]);
        // Overlapping windows of one buffer are refused before reaching the driver.
        assert!(matches!(src.view(0, 4).unwrap().copy_from(&src.view(2, 4).unwrap()), Err(Error::Buffer(_))));
        // Size mismatches are caught.
        assert!(dst.copyin(&[0u8; 3]).is_err());
    }

    /// Buffers that together exceed `CL_DEVICE_GLOBAL_MEM_SIZE` are refused up front (the
    /// driver would hand out more than the device has, or fail at first use).
    #[test]
    fn allocations_past_the_global_memory_size_are_out_of_memory() {
        let Some(dev) = test_device() else { return };
        let cl = crate::cl_device(dev.spec()).unwrap();
        let raw = crate::OpenClAllocator::new(cl.clone());
        let (total, max) = (cl.info.global_mem_size, cl.info.max_mem_alloc_size as usize);
        // Untouched buffers: the driver maps them but writes no page.
        let mut live = Vec::new();
        while raw.stats().in_use as u64 + max as u64 <= total {
            match raw.alloc(max) {
                Ok(p) => live.push(p),
                Err(Error::OutOfMemory { .. }) => break, // the host ran out first (strict overcommit)
                Err(e) => panic!("{e}"),
            }
        }
        let in_use = raw.stats().in_use as u64;
        if in_use + max as u64 > total {
            let rest = (total - in_use + 1) as usize;
            assert!(matches!(raw.alloc(rest), Err(Error::OutOfMemory { .. })), "{in_use} + {rest} B > {total} B");
        }
        for p in live {
            // SAFETY: allocated above with `max` bytes, not used afterwards.
            unsafe { raw.free(p, max) };
        }
        assert_eq!(raw.stats().in_use, 0);
    }

    #[test]
    fn oversized_allocation_is_out_of_memory() {
        let Some(dev) = test_device() else { return };
        let r = dev.allocator().alloc(usize::MAX / 2);
        assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
        let before = dev.allocator().stats().in_use;
        let b = Buffer::from_slice(dev.allocator(), &[0u8; 4096]).unwrap();
        assert!(dev.allocator().stats().in_use >= before + 4096);
        drop(b);
    }
}
