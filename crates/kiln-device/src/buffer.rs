//! Device memory: the [`Allocator`] contract and the [`Buffer`] handle with zero-copy views.
//!
//! A `Buffer` is a typed window (dtype, element offset, element count) onto a lazily
//! allocated base allocation. Views share the base; the memory goes back to the allocator
//! when the last view is dropped. Every host transfer checks sizes exactly.

use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, OnceLock};

use kiln_ir::{DeviceSpec, Scalar};

use crate::error::{Error, Result};

/// An opaque device address (a host pointer on the CPU, a `cl_mem` on OpenCL, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawPtr(pub *mut c_void);

// SAFETY: a RawPtr is an address value; all access through it goes through an Allocator or a
// Program, whose contracts require the memory to be live and the accesses race-free.
unsafe impl Send for RawPtr {}
// SAFETY: as above; sharing the address value itself is harmless.
unsafe impl Sync for RawPtr {}

/// A byte window of one allocation, as handed to programs and allocators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawView {
    /// The allocation's address, as its allocator returned it (never offset).
    pub base: RawPtr,
    /// The window's start, in bytes from `base`.
    pub offset: usize,
    /// The window's length in bytes.
    pub bytes: usize,
}

impl RawView {
    /// The host address of the window's start (only meaningful on host-addressable devices).
    pub fn host_ptr(&self) -> *mut u8 {
        (self.base.0 as *mut u8).wrapping_add(self.offset)
    }
}

/// Counters an allocator keeps; every field is in bytes except the hit/miss counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes handed out and not yet freed.
    pub in_use: usize,
    /// Bytes held in the reuse cache.
    pub cached: usize,
    /// The largest `in_use + cached` seen.
    pub high_water: usize,
    /// Allocations served from the reuse cache.
    pub hits: u64,
    /// Allocations that went to the device (the cache had no block of the size class).
    pub misses: u64,
    /// The memory budget in bytes, if one is set: allocations beyond it fail with
    /// [`Error::OutOfMemory`] after the cache is trimmed.
    pub budget: Option<usize>,
}

/// Device memory. Implementations are `Send + Sync`; callers serialize nothing.
pub trait Allocator: Send + Sync {
    /// The device whose memory this is; buffers report it and launches check it.
    fn device(&self) -> &DeviceSpec;

    /// Allocates `bytes` (> 0) bytes, aligned to at least 64 bytes on host devices.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the device (or the budget) cannot hold `bytes` even after
    /// the allocator's cache is freed; [`Error::DeviceLost`] / [`Error::DeviceFailed`] when
    /// the allocator's device generation ended; [`Error::Driver`] for other driver failures.
    fn alloc(&self, bytes: usize) -> Result<RawPtr>;

    /// Returns memory to the allocator.
    ///
    /// # Safety
    /// `ptr` came from `alloc(bytes)` of this allocator and is not used afterwards.
    unsafe fn free(&self, ptr: RawPtr, bytes: usize);

    /// Copies host bytes into device memory; the copy is complete when this returns.
    ///
    /// # Errors
    /// [`Error::Driver`] when the transfer fails.
    ///
    /// # Safety
    /// `dst` lies within a live allocation of this allocator and `src.len() == dst.bytes`.
    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()>;

    /// Copies device memory out to the host; `dst` holds the bytes when this returns.
    ///
    /// # Errors
    /// [`Error::Driver`] when the transfer fails.
    ///
    /// # Safety
    /// `src` lies within a live allocation of this allocator and `dst.len() == src.bytes`.
    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()>;

    /// Copies between two windows of this allocator's memory (same size, may not overlap).
    /// The default stages through host memory; backends override it with a device copy.
    ///
    /// # Errors
    /// [`Error::Driver`] when a transfer fails.
    ///
    /// # Safety
    /// Both windows lie within live allocations of this allocator and `dst.bytes == src.bytes`.
    unsafe fn copy(&self, dst: RawView, src: RawView) -> Result<()> {
        let mut tmp = vec![0u8; src.bytes];
        // SAFETY: forwarded from this function's contract.
        unsafe {
            self.copyout(&mut tmp, src)?;
            self.copyin(dst, &tmp)
        }
    }

    /// Whether `RawView::host_ptr` is a valid host address for this allocator's memory.
    fn is_host(&self) -> bool {
        false
    }

    /// The device type DLPack gives this memory when it is not host memory (`kDLCUDA` = 2,
    /// `kDLOpenCL` = 4, ...), as its `__dlpack_device__` reports it; `None` where DLPack has none.
    fn dlpack_device_type(&self) -> Option<i32> {
        None
    }

    /// A snapshot of the counters; all zero for allocators that keep none.
    fn stats(&self) -> AllocatorStats {
        AllocatorStats::default()
    }

    /// Drops cached free blocks (if any); returns the bytes released.
    fn trim(&self) -> usize {
        0
    }

    /// Whether memory of this allocator may still be used: an allocator of a device
    /// generation that ended (a reset) or a lost device returns the typed error
    /// ([`Error::DeviceLost`], [`Error::DeviceFailed`]). Checked by [`Buffer::raw`].
    ///
    /// # Errors
    /// [`Error::DeviceLost`] or [`Error::DeviceFailed`], as above.
    fn check(&self) -> Result<()> {
        Ok(())
    }
}

/// Rust types that are plain element values of a [`Scalar`] (every bit pattern valid).
pub trait Element: Copy + Default + Send + Sync + 'static {
    /// The dtype whose elements have exactly this type's size and layout.
    const SCALAR: Scalar;
}
macro_rules! element {
    ($($t:ty => $s:ident),*) => {$( impl Element for $t { const SCALAR: Scalar = Scalar::$s; } )*};
}
element!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64, f32 => F32, f64 => F64);

struct BufferBase {
    allocator: Arc<dyn Allocator>,
    bytes: usize,
    ptr: OnceLock<RawPtr>,
}

impl Drop for BufferBase {
    fn drop(&mut self) {
        if let Some(ptr) = self.ptr.get() {
            // SAFETY: `ptr` came from `allocator.alloc(bytes)` in `BufferBase::ptr` and this is
            // the last owner: every view holds an Arc to this base.
            unsafe { self.allocator.free(*ptr, self.bytes) }
        }
    }
}

impl BufferBase {
    fn ptr(&self) -> Result<RawPtr> {
        if let Some(p) = self.ptr.get() {
            return Ok(*p);
        }
        let p = self.allocator.alloc(self.bytes.max(1))?;
        match self.ptr.set(p) {
            Ok(()) => Ok(p),
            Err(p) => {
                // Another thread allocated first: give ours back.
                // SAFETY: `p` was just allocated with this size and never shared.
                unsafe { self.allocator.free(p, self.bytes.max(1)) };
                Ok(*self.ptr.get().unwrap_or(&p))
            }
        }
    }
}

/// A typed window onto device memory. Cloning is cheap and shares the memory.
#[derive(Clone)]
pub struct Buffer {
    base: Arc<BufferBase>,
    dtype: Scalar,
    /// Window start in bytes from the base.
    offset: usize,
    /// Window length in elements.
    len: usize,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer({} x {} at +{} B on {})", self.len, self.dtype, self.offset, self.device())
    }
}

/// The largest buffer, in bytes: `isize::MAX`, the most one allocation can span (so every
/// length and byte offset also fits a signed size, as Python's `len` needs).
pub const MAX_BUFFER_BYTES: usize = isize::MAX as usize;

impl Buffer {
    /// A buffer of `len` elements of `dtype`; memory is allocated on first use, so an
    /// out-of-memory error surfaces at the first transfer or launch, not here.
    ///
    /// # Errors
    /// [`Error::Buffer`] when `len` elements of `dtype` need more than [`MAX_BUFFER_BYTES`].
    pub fn new(allocator: Arc<dyn Allocator>, dtype: Scalar, len: usize) -> Result<Buffer> {
        let bytes = len.checked_mul(dtype.size()).filter(|&b| b <= MAX_BUFFER_BYTES).ok_or_else(|| {
            Error::Buffer(format!(
                "{len} elements of {dtype} need more than {MAX_BUFFER_BYTES} bytes, the largest buffer any \
                 address space holds"
            ))
        })?;
        Ok(Buffer { base: Arc::new(BufferBase { allocator, bytes, ptr: OnceLock::new() }), dtype, offset: 0, len })
    }

    /// The element type of this window (a [`Buffer::reinterpret`] view may differ from the
    /// buffer it was made from).
    pub fn dtype(&self) -> Scalar {
        self.dtype
    }

    /// Length in elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Length in bytes: the exact size every host transfer must have.
    pub fn nbytes(&self) -> usize {
        self.len * self.dtype.size()
    }

    /// The device the memory lives on.
    pub fn device(&self) -> &DeviceSpec {
        self.base.allocator.device()
    }

    /// The allocator that owns the memory; shared by every view of the base.
    pub fn allocator(&self) -> &Arc<dyn Allocator> {
        &self.base.allocator
    }

    /// Whether the base allocation exists yet (it is made on first use, by any view).
    pub fn is_allocated(&self) -> bool {
        self.base.ptr.get().is_some()
    }

    /// A zero-copy view of elements `offset..offset + len` of this buffer. The view keeps the
    /// whole base allocation alive.
    ///
    /// # Errors
    /// [`Error::Buffer`] when the range does not lie inside this buffer; the errors of
    /// [`Buffer::check_current`] for a buffer of an ended generation.
    pub fn view(&self, offset: usize, len: usize) -> Result<Buffer> {
        self.check_current()?;
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::Buffer(format!(
                "view {offset}..{} is outside a buffer of {} elements",
                offset.saturating_add(len),
                self.len
            )));
        }
        Ok(Buffer { base: self.base.clone(), dtype: self.dtype, offset: self.offset + offset * self.dtype.size(), len })
    }

    /// The same bytes seen as another element type (length must divide evenly).
    ///
    /// # Errors
    /// [`Error::Buffer`] when the window's byte length or byte offset is not a multiple of
    /// `dtype`'s size; the errors of [`Buffer::check_current`].
    pub fn reinterpret(&self, dtype: Scalar) -> Result<Buffer> {
        self.check_current()?;
        if !self.nbytes().is_multiple_of(dtype.size()) || !self.offset.is_multiple_of(dtype.size()) {
            return Err(Error::Buffer(format!(
                "{} bytes at +{} cannot be viewed as {dtype}",
                self.nbytes(),
                self.offset
            )));
        }
        Ok(Buffer { base: self.base.clone(), dtype, offset: self.offset, len: self.nbytes() / dtype.size() })
    }

    /// Whether the buffer still belongs to its device's current generation (and the device
    /// has not failed): new windows of a stale buffer and plans over it are refused as early
    /// as its use would be.
    ///
    /// # Errors
    /// [`Error::DeviceLost`] / [`Error::DeviceFailed`] as [`Buffer::raw`].
    pub fn check_current(&self) -> Result<()> {
        self.base.allocator.check()
    }

    /// The window as raw device memory, allocating on first use. The view is valid as long
    /// as this buffer (or another view of its base) is alive.
    ///
    /// # Errors
    /// [`Error::DeviceLost`] / [`Error::DeviceFailed`] when the buffer belongs to an older
    /// generation of its device or the device failed; the allocator's errors
    /// ([`Error::OutOfMemory`], [`Error::Driver`]) when the first use allocates.
    pub fn raw(&self) -> Result<RawView> {
        self.base.allocator.check()?;
        Ok(RawView { base: self.base.ptr()?, offset: self.offset, bytes: self.nbytes() })
    }

    /// Identity of the underlying allocation and the byte range of this window in it: two
    /// buffers conflict exactly when their allocation ids match and their ranges overlap.
    pub fn byte_range(&self) -> (usize, std::ops::Range<usize>) {
        (Arc::as_ptr(&self.base) as *const () as usize, self.offset..self.offset + self.nbytes())
    }

    /// Whether the two windows share any byte.
    pub fn overlaps(&self, other: &Buffer) -> bool {
        let (a, ra) = self.byte_range();
        let (b, rb) = other.byte_range();
        a == b && ra.start < rb.end && rb.start < ra.end
    }

    /// Copies `src` (exactly `nbytes()` bytes) into the buffer; synchronous.
    ///
    /// # Errors
    /// [`Error::Buffer`] when `src.len() != nbytes()`; the errors of [`Buffer::raw`] and of
    /// the transfer ([`Error::Driver`]).
    pub fn copyin(&self, src: &[u8]) -> Result<()> {
        if src.len() != self.nbytes() {
            return Err(Error::Buffer(format!(
                "copyin of {} bytes into a buffer of {} bytes",
                src.len(),
                self.nbytes()
            )));
        }
        let view = self.raw()?;
        // SAFETY: `view` is this buffer's window of a live allocation (we hold the base) and
        // the sizes were checked equal above.
        unsafe { self.base.allocator.copyin(view, src) }
    }

    /// Copies the buffer out into `dst` (exactly `nbytes()` bytes); synchronous.
    ///
    /// # Errors
    /// [`Error::Buffer`] when `dst.len() != nbytes()`; the errors of [`Buffer::raw`] and of
    /// the transfer ([`Error::Driver`]).
    pub fn copyout(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() != self.nbytes() {
            return Err(Error::Buffer(format!("copyout of a {}-byte buffer into {} bytes", self.nbytes(), dst.len())));
        }
        let view = self.raw()?;
        // SAFETY: as in `copyin`.
        unsafe { self.base.allocator.copyout(dst, view) }
    }

    /// A buffer holding a copy of `data`, with `T`'s dtype.
    ///
    /// # Errors
    /// The errors of [`Buffer::new`] and [`Buffer::copyin`].
    pub fn from_slice<T: Element>(allocator: Arc<dyn Allocator>, data: &[T]) -> Result<Buffer> {
        let b = Buffer::new(allocator, T::SCALAR, data.len())?;
        b.copy_from_slice(data)?;
        Ok(b)
    }

    /// Typed copyin; `T` must match the dtype and the length must match exactly.
    ///
    /// # Errors
    /// [`Error::Buffer`] when `T` is not the buffer's dtype or the lengths differ; the errors
    /// of [`Buffer::copyin`].
    pub fn copy_from_slice<T: Element>(&self, data: &[T]) -> Result<()> {
        self.check_type::<T>()?;
        // SAFETY: T is a plain element type (no padding, any bit pattern valid), so its
        // memory is a valid byte slice of the same total size.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) };
        self.copyin(bytes)
    }

    /// Typed copyout into a new vector; `T` must match the dtype.
    ///
    /// # Errors
    /// [`Error::Buffer`] when `T` is not the buffer's dtype; the errors of
    /// [`Buffer::copyout`].
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_type::<T>()?;
        let mut out = vec![T::default(); self.len];
        // SAFETY: as in `copy_from_slice`; every bit pattern written is a valid T.
        let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, self.nbytes()) };
        self.copyout(bytes)?;
        Ok(out)
    }

    fn check_type<T: Element>(&self) -> Result<()> {
        if T::SCALAR != self.dtype {
            return Err(Error::Buffer(format!("host access as {} to a buffer of {}", T::SCALAR, self.dtype)));
        }
        Ok(())
    }

    /// Copies `src` into this buffer: same byte size, any devices (staged through host
    /// memory when the allocators differ). Overlapping windows are refused.
    ///
    /// # Errors
    /// [`Error::Buffer`] when the byte sizes differ or the windows overlap; the errors of
    /// [`Buffer::raw`] and of the transfers on either side.
    pub fn copy_from(&self, src: &Buffer) -> Result<()> {
        if src.nbytes() != self.nbytes() {
            return Err(Error::Buffer(format!(
                "copy of {} bytes into a buffer of {} bytes",
                src.nbytes(),
                self.nbytes()
            )));
        }
        if self.overlaps(src) {
            return Err(Error::Buffer("copy between overlapping windows of one buffer".into()));
        }
        if Arc::ptr_eq(&self.base.allocator, &src.base.allocator) {
            let (d, s) = (self.raw()?, src.raw()?);
            // SAFETY: both windows belong to live allocations of this allocator, sizes are
            // equal and they do not overlap (checked above).
            return unsafe { self.base.allocator.copy(d, s) };
        }
        if self.base.allocator.is_host() && src.base.allocator.is_host() {
            // Two host devices (`CPU` and `CPU:1`): one memory, no staging.
            let (d, s) = (self.raw()?, src.raw()?);
            // SAFETY: host allocators hand out live host memory (`is_host`), both windows lie in
            // live allocations of `nbytes` bytes, and they do not overlap (checked above).
            unsafe { std::ptr::copy_nonoverlapping(s.host_ptr() as *const u8, d.host_ptr(), self.nbytes()) };
            return Ok(());
        }
        let mut staging = vec![0u8; src.nbytes()];
        src.copyout(&mut staging)?;
        self.copyin(&staging)
    }
}
