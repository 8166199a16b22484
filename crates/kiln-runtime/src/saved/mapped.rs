//! The constants block of a plan file, mapped into memory and used as one host buffer in place.
//!
//! On a device whose memory is host memory (the CPU), a plan's constants need not be copied:
//! the block is mapped copy-on-write ([`memmap2::MmapOptions::map_copy`]), so the pages are the
//! file's until a kernel writes one (state a plan updates), which then gets a private copy and
//! never changes the file. [`MappedBlock`] is an [`Allocator`] of exactly one allocation, the
//! mapping: a [`Buffer`](kiln_device::Buffer) over it is a buffer like any other (launch checks,
//! views, hazards), and the mapping lives as long as the last buffer over it.
//!
//! What mapping cannot protect against: another process truncating the file while it is mapped
//! makes the pages past the new end unreadable, and a read of them stops the process with
//! `SIGBUS`. That is the contract of every memory-mapped weights loader (safetensors' own
//! included); a caller who cannot rule it out loads with
//! [`LoadOptions::map_constants`](super::LoadOptions::map_constants) off, which copies.

use std::fs::File;
use std::sync::Arc;

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Allocator, Error, RawPtr, RawView, Result};

/// One mapped, copy-on-write range of a file, as an allocator of one allocation.
pub struct MappedBlock {
    /// Keeps the mapping alive; never borrowed mutably after `base` was taken from it.
    _map: memmap2::MmapMut,
    base: RawPtr,
    len: usize,
    device: DeviceSpec,
    /// The device's own allocator: its generation decides whether this memory may be used, as
    /// for every buffer of the device.
    owner: Arc<dyn Allocator>,
}

impl MappedBlock {
    /// Maps `len` (> 0) bytes of `file` from `offset` (a multiple of the page size) for the
    /// device whose allocator is `owner`, after `verify` accepted the mapped bytes (it runs
    /// before any buffer can exist over them; its answer comes back with the block).
    ///
    /// # Errors
    /// `Err(Err(_))`: the system's error when the range cannot be mapped; `Err(Ok(e))`:
    /// `verify`'s error.
    pub fn map<T, E>(
        file: &File,
        offset: u64,
        len: usize,
        owner: Arc<dyn Allocator>,
        verify: impl FnOnce(&[u8]) -> std::result::Result<T, E>,
    ) -> std::result::Result<(MappedBlock, T), std::result::Result<E, std::io::Error>> {
        // SAFETY: a private (copy-on-write) mapping of a file kiln only reads: writes through it
        // go to private pages. The bytes are checked (`verify`: checksum, safetensors header)
        // before any buffer uses them, and nothing relies on them for memory safety (kernels'
        // accesses are bounded by buffer sizes from the manifest, never by constant values). A
        // concurrent truncation of the file by another process is outside this contract (see
        // the module docs).
        let mut map = unsafe { memmap2::MmapOptions::new().offset(offset).len(len).map_copy(file) }.map_err(Err)?;
        let verified = verify(&map[..]).map_err(Ok)?;
        let base = RawPtr(map.as_mut_ptr().cast());
        let device = owner.device().clone();
        Ok((MappedBlock { _map: map, base, len, device, owner }, verified))
    }
}

impl Allocator for MappedBlock {
    fn device(&self) -> &DeviceSpec {
        &self.device
    }

    /// The mapping itself, for the one buffer made over it (of at most its size).
    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        if bytes > self.len {
            return Err(Error::Buffer(format!(
                "a buffer of {bytes} bytes over a mapped constants block of {} bytes",
                self.len
            )));
        }
        Ok(self.base)
    }

    /// Nothing to do: the mapping goes when the allocator (kept by every buffer over it) goes.
    unsafe fn free(&self, _ptr: RawPtr, _bytes: usize) {}

    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()> {
        // SAFETY: the caller guarantees `dst` lies in the mapping (this allocator's only
        // allocation) and `src.len() == dst.bytes`; host memory on both sides.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.host_ptr(), src.len()) };
        Ok(())
    }

    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()> {
        // SAFETY: as in `copyin`, with the roles swapped.
        unsafe { std::ptr::copy_nonoverlapping(src.host_ptr() as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy(&self, dst: RawView, src: RawView) -> Result<()> {
        // SAFETY: the caller guarantees both windows lie in the mapping with equal sizes and
        // do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.host_ptr() as *const u8, dst.host_ptr(), src.bytes) };
        Ok(())
    }

    fn is_host(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        self.owner.check()
    }
}

/// Maps `len` bytes of `file` from `offset` read-only, to copy them into device memory without
/// reading them into the heap first.
///
/// # Errors
/// The system's error when the range cannot be mapped.
pub fn map_read_only(file: &File, offset: u64, len: usize) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: a read-only mapping of a file kiln does not write; its bytes are checked before
    // use and only copied out of it. A concurrent truncation of the file by another process is
    // outside this contract (see the module docs).
    unsafe { memmap2::MmapOptions::new().offset(offset).len(len).map(file) }
}
