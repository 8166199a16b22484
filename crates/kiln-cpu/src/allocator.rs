//! Host memory for the CPU device: zeroed, 64-byte aligned blocks from the global allocator,
//! or mapped from the kernel where they are large ([`MAPPED_FROM`]).
//!
//! No caching here: the device wraps this allocator in [`kiln_device::LruAllocator`].

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Allocator, AllocatorStats, Error, RawPtr, RawView, Result};

/// Alignment of every block: a cache line, and enough for any vector load.
pub const ALIGN: usize = 64;

/// Blocks of at least this many bytes are anonymous mappings of their own: their pages are
/// zeroed by the kernel when first touched (by the threads of the first launch that writes
/// them), not by `alloc_zeroed` at allocation, which clears memory the heap reuses on the one
/// allocating thread; and they may be backed by transparent huge pages (`MADV_HUGEPAGE`), so a
/// model's activations fault in 2 MiB at a time where the system allows it.
pub const MAPPED_FROM: usize = 1 << 20;

/// A zeroed anonymous mapping of `bytes` bytes (page-aligned), or null when the kernel refuses.
fn map_zeroed(bytes: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping without an address hint touches no existing memory;
    // the result is checked against MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    // SAFETY: `p..p + bytes` is the mapping made above; the advice only changes how its pages
    // are backed (ignored where huge pages are off).
    unsafe { libc::madvise(p, bytes, libc::MADV_HUGEPAGE) };
    p.cast()
}

/// The raw host allocator. Counts bytes in use and the high-water mark.
#[derive(Debug)]
pub struct CpuAllocator {
    device: DeviceSpec,
    in_use: AtomicUsize,
    high_water: AtomicUsize,
}

impl Default for CpuAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuAllocator {
    /// Host memory of the device `CPU`.
    pub fn new() -> Self {
        Self::for_device(crate::CPU.clone())
    }

    /// Host memory of the CPU device `device` (`CPU:1`, ...): the same memory as every CPU
    /// device's, named after its device so that buffers say where they belong.
    pub fn for_device(device: DeviceSpec) -> Self {
        CpuAllocator { device, in_use: AtomicUsize::new(0), high_water: AtomicUsize::new(0) }
    }

    fn layout(bytes: usize) -> Result<Layout> {
        if bytes == 0 {
            return Err(Error::Buffer("cannot allocate 0 bytes: allocations must be at least 1 byte".into()));
        }
        Layout::from_size_align(bytes, ALIGN).map_err(|_| {
            Error::Buffer(format!("an allocation of {bytes} bytes exceeds the address space (max {} B)", isize::MAX))
        })
    }
}

/// [`Allocator::copyin`] for host memory.
///
/// # Safety
/// `dst` lies within a live allocation of a host allocator (`is_host`).
pub(crate) unsafe fn host_copyin(dst: RawView, src: &[u8]) -> Result<()> {
    check_len("copyin", src.len(), &dst)?;
    // SAFETY: the caller guarantees `dst` lies in a live host allocation; `src` is a distinct
    // Rust slice, so the ranges do not overlap; lengths are equal.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.host_ptr(), src.len()) };
    Ok(())
}

/// [`Allocator::copyout`] for host memory.
///
/// # Safety
/// As [`host_copyin`]; host allocators hand out zeroed memory, so every byte read is
/// initialised.
pub(crate) unsafe fn host_copyout(dst: &mut [u8], src: RawView) -> Result<()> {
    check_len("copyout", dst.len(), &src)?;
    // SAFETY: as in `host_copyin`, with the roles swapped.
    unsafe { std::ptr::copy_nonoverlapping(src.host_ptr(), dst.as_mut_ptr(), dst.len()) };
    Ok(())
}

/// [`Allocator::copy`] for host memory; the windows may overlap.
///
/// # Safety
/// Both windows lie in live host allocations of a host allocator.
pub(crate) unsafe fn host_copy(dst: RawView, src: RawView) -> Result<()> {
    if dst.bytes != src.bytes {
        return Err(Error::Buffer(format!("copy of {} bytes into a window of {} bytes", src.bytes, dst.bytes)));
    }
    // SAFETY: both windows lie in live allocations (caller contract); `copy` tolerates overlap.
    unsafe { std::ptr::copy(src.host_ptr(), dst.host_ptr(), src.bytes) };
    Ok(())
}

fn check_len(what: &str, host: usize, view: &RawView) -> Result<()> {
    if host != view.bytes {
        return Err(Error::Buffer(format!(
            "{what}: host slice of {host} bytes for a device window of {} bytes",
            view.bytes
        )));
    }
    Ok(())
}

/// The machine's physical memory in bytes (`None` if the system does not say).
fn physical_memory() -> Option<usize> {
    static BYTES: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        // SAFETY: sysconf has no preconditions; it only reads system configuration.
        let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        usize::try_from(pages).ok()?.checked_mul(usize::try_from(size).ok()?)
    })
}

impl Allocator for CpuAllocator {
    fn device(&self) -> &DeviceSpec {
        &self.device
    }

    /// Blocks larger than the machine's physical memory are refused as out of memory up
    /// front: where the kernel overcommits, such a block would be granted and zeroing it
    /// (or a later write) would get the process killed instead of an error.
    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        let layout = Self::layout(bytes)?;
        let too_big = physical_memory().is_some_and(|ram| bytes > ram);
        let ptr = if too_big {
            std::ptr::null_mut()
        } else if bytes >= MAPPED_FROM {
            map_zeroed(bytes)
        } else {
            // SAFETY: `layout` has a non-zero size (checked in `layout`).
            unsafe { alloc_zeroed(layout) }
        };
        if ptr.is_null() {
            return Err(Error::OutOfMemory {
                device: self.device.to_string(),
                requested: bytes,
                in_use: self.in_use.load(Ordering::Relaxed),
                cached: 0,
                budget: None,
            });
        }
        let now = self.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.high_water.fetch_max(now, Ordering::Relaxed);
        Ok(RawPtr(ptr.cast()))
    }

    unsafe fn free(&self, ptr: RawPtr, bytes: usize) {
        let Ok(layout) = Self::layout(bytes) else { return };
        if bytes >= MAPPED_FROM {
            // SAFETY: the caller guarantees `ptr` came from `alloc(bytes)` here, which mapped
            // exactly `bytes` bytes at it for a size this large, and is not used afterwards.
            unsafe { libc::munmap(ptr.0.cast(), bytes) };
        } else {
            // SAFETY: the caller guarantees `ptr` came from `alloc(bytes)` here, which used
            // this same layout, and is not used afterwards.
            unsafe { dealloc(ptr.0.cast(), layout) };
        }
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }

    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { host_copyin(dst, src) }
    }

    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { host_copyout(dst, src) }
    }

    unsafe fn copy(&self, dst: RawView, src: RawView) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { host_copy(dst, src) }
    }

    fn is_host(&self) -> bool {
        true
    }

    fn stats(&self) -> AllocatorStats {
        let in_use = self.in_use.load(Ordering::Relaxed);
        AllocatorStats { in_use, high_water: self.high_water.load(Ordering::Relaxed), ..AllocatorStats::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More than the machine's memory is an out-of-memory error, whatever the kernel's
    /// overcommit policy would grant.
    #[test]
    fn a_block_larger_than_the_machine_is_refused() {
        let a = CpuAllocator::new();
        let ram = physical_memory().expect("Linux reports its physical memory");
        assert!(matches!(a.alloc(ram + 1), Err(Error::OutOfMemory { .. })));
        assert_eq!(a.stats().in_use, 0);
    }

    #[test]
    fn alloc_is_aligned_zeroed_and_counted() {
        let a = CpuAllocator::new();
        let p = a.alloc(100).unwrap();
        assert_eq!(p.0 as usize % ALIGN, 0);
        let view = RawView { base: p, offset: 0, bytes: 100 };
        let mut out = vec![1u8; 100];
        // SAFETY: `view` is the whole live allocation.
        unsafe { a.copyout(&mut out, view).unwrap() };
        assert!(out.iter().all(|b| *b == 0));
        assert_eq!(a.stats().in_use, 100);
        // SAFETY: allocated above with 100 bytes.
        unsafe { a.free(p, 100) };
        assert_eq!(a.stats().in_use, 0);
        assert_eq!(a.stats().high_water, 100);
    }

    /// A block from [`MAPPED_FROM`] up is mapped: aligned, zeroed, writable to its last byte,
    /// counted, and unmapped when freed.
    #[test]
    fn a_large_block_is_mapped_zeroed_and_counted() {
        let a = CpuAllocator::new();
        let bytes = MAPPED_FROM * 3 + 5;
        let p = a.alloc(bytes).unwrap();
        assert_eq!(p.0 as usize % ALIGN, 0);
        let view = RawView { base: p, offset: 0, bytes };
        let mut out = vec![1u8; bytes];
        // SAFETY: `view` is the whole live allocation.
        unsafe { a.copyout(&mut out, view).unwrap() };
        assert!(out.iter().all(|b| *b == 0));
        let ones = vec![7u8; bytes];
        // SAFETY: as above.
        unsafe { a.copyin(view, &ones).unwrap() };
        // SAFETY: as above.
        unsafe { a.copyout(&mut out, view).unwrap() };
        assert_eq!(out, ones);
        assert_eq!(a.stats().in_use, bytes);
        // SAFETY: allocated above with `bytes` bytes.
        unsafe { a.free(p, bytes) };
        assert_eq!(a.stats().in_use, 0);
    }

    #[test]
    fn bad_sizes_are_errors() {
        let a = CpuAllocator::new();
        assert!(matches!(a.alloc(0), Err(Error::Buffer(_))));
        assert!(matches!(a.alloc(usize::MAX), Err(Error::Buffer(_))));
        assert!(matches!(a.alloc(isize::MAX as usize - 10), Err(Error::Buffer(_) | Error::OutOfMemory { .. })));
    }

    #[test]
    fn copies_check_sizes_and_move_bytes() {
        let a = CpuAllocator::new();
        let p = a.alloc(16).unwrap();
        let whole = RawView { base: p, offset: 0, bytes: 16 };
        let data: Vec<u8> = (0..16).collect();
        // SAFETY: windows below lie inside the live 16-byte allocation.
        unsafe {
            a.copyin(whole, &data).unwrap();
            assert!(matches!(a.copyin(whole, &data[..8]), Err(Error::Buffer(_))));
            let lo = RawView { base: p, offset: 0, bytes: 8 };
            let hi = RawView { base: p, offset: 8, bytes: 8 };
            a.copy(hi, lo).unwrap();
            let mut out = vec![0u8; 16];
            a.copyout(&mut out, whole).unwrap();
            assert_eq!(&out[8..], &data[..8]);
            assert!(matches!(a.copy(whole, lo), Err(Error::Buffer(_))));
            a.free(p, 16);
        }
    }
}
