//! Guard-page host memory, for tests and fuzzing: every buffer ends exactly where a
//! `PROT_NONE` page begins, so a kernel (or host code) that reads or writes even one byte
//! past the end of its buffer dies of `SIGSEGV` at that access instead of silently
//! corrupting a neighbour.
//!
//! Layout of one allocation of `bytes` bytes (`page` = the system page size):
//!
//! ```text
//! | guard page | slack (< page) | bytes ........................ | guard page |
//!                               ^ the RawPtr                      ^ page-aligned
//! ```
//!
//! The leading guard page also catches underflows that go past the slack. Freed memory is
//! unmapped at once (no caching), so a use after free faults too.
//!
//! **Alignment.** A buffer starts `bytes` before a page boundary, so its start is aligned to
//! the largest power of two dividing `bytes` (at most the page size), not to the 64 bytes
//! [`crate::CpuAllocator`] guarantees. Buffer sizes are whole elements of a power-of-two size,
//! so the start is always aligned to the element size, which is all the CPU renderer needs
//! (its vector loads and stores go through `memcpy`). Every allocation costs at least three
//! pages of address space and two pages of memory: use it in tests, not in production. Use it
//! without [`kiln_device::LruAllocator`], whose size classes would put slack between the end
//! of a buffer and its guard page (see [`crate::open_with_allocator`]).

use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Allocator, AllocatorStats, Error, RawPtr, RawView, Result};

use crate::allocator::{host_copy, host_copyin, host_copyout};

/// Host memory whose every buffer is followed directly by an inaccessible page. For tests and
/// fuzzing only; see the module docs.
#[derive(Debug)]
pub struct GuardPageAllocator {
    device: DeviceSpec,
    page: usize,
    in_use: AtomicUsize,
    high_water: AtomicUsize,
}

/// The shape of one allocation's mapping.
struct Span {
    /// Bytes mapped: the guard pages and the whole pages between them.
    len: usize,
    /// Offset of the buffer's first byte from the start of the mapping.
    data: usize,
}

impl GuardPageAllocator {
    /// A guard-page allocator for the CPU device. Fails when the page size is unknown.
    pub fn new() -> Result<GuardPageAllocator> {
        // SAFETY: sysconf only reads a system constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = usize::try_from(page)
            .ok()
            .filter(|p| p.is_power_of_two())
            .ok_or_else(|| Error::Unavailable(format!("the system page size is unknown (sysconf gave {page})")))?;
        Ok(GuardPageAllocator {
            device: crate::CPU.clone(),
            page,
            in_use: AtomicUsize::new(0),
            high_water: AtomicUsize::new(0),
        })
    }

    /// The mapping that serves (or served) a buffer of `bytes` bytes.
    fn span(&self, bytes: usize) -> Result<Span> {
        let too_large =
            || Error::Buffer(format!("an allocation of {bytes} bytes with guard pages exceeds the address space"));
        if bytes == 0 {
            return Err(Error::Buffer("cannot allocate 0 bytes: allocations must be at least 1 byte".into()));
        }
        let body = bytes.checked_next_multiple_of(self.page).ok_or_else(too_large)?;
        let len = body.checked_add(2 * self.page).filter(|&l| l <= isize::MAX as usize).ok_or_else(too_large)?;
        Ok(Span { len, data: self.page + body - bytes })
    }
}

impl Allocator for GuardPageAllocator {
    fn device(&self) -> &DeviceSpec {
        &self.device
    }

    /// Maps zeroed memory with a `PROT_NONE` page on both sides; the buffer ends at the
    /// trailing one. A refused mapping is [`Error::OutOfMemory`].
    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        let m = self.span(bytes)?;
        let oom = || Error::OutOfMemory {
            device: format!("{} (guard pages)", self.device),
            requested: bytes,
            in_use: self.in_use.load(Ordering::Relaxed),
            cached: 0,
            budget: None,
        };
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches
        // no existing memory.
        let start: *mut u8 = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                m.len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        }
        .cast();
        if start == libc::MAP_FAILED.cast() {
            return Err(oom());
        }
        // Everything between the two guard pages becomes accessible; both guards stay PROT_NONE.
        // SAFETY: the range lies inside the mapping just created (`len` = body + 2 pages).
        let opened = unsafe {
            libc::mprotect(start.add(self.page).cast(), m.len - 2 * self.page, libc::PROT_READ | libc::PROT_WRITE)
        };
        if opened != 0 {
            // SAFETY: unmaps exactly the mapping created above, which nothing else uses.
            unsafe { libc::munmap(start.cast(), m.len) };
            return Err(oom());
        }
        let now = self.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.high_water.fetch_max(now, Ordering::Relaxed);
        // SAFETY: `data` < `len`, inside the mapping.
        Ok(RawPtr(unsafe { start.add(m.data) }.cast()))
    }

    unsafe fn free(&self, ptr: RawPtr, bytes: usize) {
        let Ok(m) = self.span(bytes) else { return };
        // SAFETY: `ptr` came from `alloc(bytes)` (caller's contract), which placed it `data`
        // bytes into a mapping of `len` bytes; that mapping is unmapped exactly once, here.
        unsafe { libc::munmap(ptr.0.cast::<u8>().sub(m.data).cast(), m.len) };
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
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;
    use std::sync::Arc;

    use kiln_device::kiln_ir::{KernelBuilder, Scalar, Val};
    use kiln_device::{Buffer, Device};

    use super::*;

    /// Set in a child process: the overrun case it runs (and dies of).
    const CHILD: &str = "KILN_GUARD_CHILD";

    fn guarded() -> Arc<GuardPageAllocator> {
        Arc::new(GuardPageAllocator::new().unwrap())
    }

    fn device() -> Arc<Device> {
        crate::open_with_allocator(guarded()).unwrap()
    }

    #[test]
    fn buffers_end_at_a_page_and_every_byte_is_usable() {
        let a = guarded();
        for (bytes, elem) in [(1, 1), (28, 4), (4096, 8), (4097, 1), (3 * 4096 + 6, 2), (1 << 20, 4)] {
            let p = a.alloc(bytes).unwrap();
            let addr = p.0 as usize;
            assert_eq!((addr + bytes) % a.page, 0, "{bytes} B ends at a page boundary");
            assert_eq!(addr % elem, 0, "{bytes} B is aligned to its element size {elem}");
            let whole = RawView { base: p, offset: 0, bytes };
            let data: Vec<u8> = (0..bytes).map(|i| (i * 7 + 1) as u8).collect();
            let mut out = vec![1u8; bytes];
            // SAFETY: `whole` is the live allocation of `bytes` bytes; halves lie inside it.
            unsafe {
                a.copyout(&mut out, whole).unwrap();
                assert!(out.iter().all(|&b| b == 0), "fresh memory is zeroed");
                a.copyin(whole, &data).unwrap();
                a.copyout(&mut out, whole).unwrap();
                assert_eq!(out, data);
                if bytes >= 2 {
                    let half = bytes / 2;
                    let (lo, hi) =
                        (RawView { bytes: half, ..whole }, RawView { offset: bytes - half, bytes: half, ..whole });
                    a.copy(hi, lo).unwrap();
                    a.copyout(&mut out, whole).unwrap();
                    assert_eq!(out[bytes - half..], data[..half]);
                }
                assert!(a.copyin(whole, &data[1..]).is_err(), "sizes are checked");
                // The last byte itself is writable.
                *p.0.cast::<u8>().add(bytes - 1) = 0xAB;
                assert_eq!(*p.0.cast::<u8>().add(bytes - 1), 0xAB);
            }
            assert_eq!(a.stats().in_use, bytes);
            // SAFETY: allocated above with `bytes`, not used afterwards.
            unsafe { a.free(p, bytes) };
            assert_eq!(a.stats().in_use, 0);
        }
        assert!(matches!(a.alloc(0), Err(Error::Buffer(_))));
        assert!(matches!(a.alloc(usize::MAX), Err(Error::Buffer(_))));
        assert!(matches!(a.alloc(1 << 62), Err(Error::OutOfMemory { .. })));
    }

    /// `c[i] = a[i] + 1` for `i < n` over buffers declared with `n` elements.
    fn add_one(dev: &Device) -> kiln_device::Kernel {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 20);
        let (a, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
        let i = k.global(0, &n);
        k.store(&c.at(&i), &(a.at(&i).load() + Val::f32(1.0)));
        dev.compile(&k.finish().unwrap(), Some("add_one")).unwrap()
    }

    #[test]
    fn kernels_run_on_guarded_buffers() {
        let dev = device();
        let kernel = add_one(&dev);
        for n in [1usize, 7, 1000, 4099] {
            let xs: Vec<f32> = (0..n).map(|x| x as f32).collect();
            let a = Buffer::from_slice(dev.allocator().clone(), &xs).unwrap();
            let c = dev.buffer(Scalar::F32, n).unwrap();
            kernel.launch(&[&a, &c], &[n as i64]).unwrap();
            let want: Vec<f32> = xs.iter().map(|x| x + 1.0).collect();
            assert_eq!(c.to_vec::<f32>().unwrap(), want);
        }
    }

    #[test]
    fn open_with_allocator_wants_a_host_allocator_of_the_cpu() {
        /// A non-host allocator: every operation is refused.
        #[derive(Debug)]
        struct Remote;
        impl Allocator for Remote {
            fn device(&self) -> &DeviceSpec {
                &crate::CPU
            }
            fn alloc(&self, _: usize) -> Result<RawPtr> {
                Err(Error::Invalid("remote".into()))
            }
            unsafe fn free(&self, _: RawPtr, _: usize) {}
            unsafe fn copyin(&self, _: RawView, _: &[u8]) -> Result<()> {
                Err(Error::Invalid("remote".into()))
            }
            unsafe fn copyout(&self, _: &mut [u8], _: RawView) -> Result<()> {
                Err(Error::Invalid("remote".into()))
            }
        }
        assert!(matches!(crate::open_with_allocator(Arc::new(Remote)), Err(Error::Invalid(_))));
    }

    /// Runs `case` in a child process (this test binary, re-executed) and asserts that it
    /// died of SIGSEGV.
    fn dies_of_sigsegv(case: &str) {
        let exe = std::env::current_exe().unwrap();
        let out = Command::new(exe)
            .args(["--exact", "guard::tests::overrun_child", "--nocapture", "--test-threads=1"])
            .env(CHILD, case)
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGSEGV),
            "{case}: the child should die of SIGSEGV, got {:?}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn one_byte_past_the_end_faults() {
        for case in ["host-read", "host-write", "kernel-store"] {
            dies_of_sigsegv(case);
        }
    }

    /// The child side of [`one_byte_past_the_end_faults`]; does nothing in a normal run.
    #[test]
    fn overrun_child() {
        let Ok(case) = std::env::var(CHILD) else { return };
        let a = guarded();
        let bytes = 4 * 7;
        let p = a.alloc(bytes).unwrap();
        let past = p.0.cast::<u8>().wrapping_add(bytes);
        match case.as_str() {
            // SAFETY: none: this child exists to die of this access.
            "host-read" => println!("read {}", unsafe { std::ptr::read_volatile(past) }),
            // SAFETY: as above.
            "host-write" => unsafe { std::ptr::write_volatile(past, 1) },
            "kernel-store" => {
                let dev = device();
                let kernel = add_one(&dev);
                let (x, y) = (dev.buffer(Scalar::F32, 8).unwrap(), dev.buffer(Scalar::F32, 7).unwrap());
                let launch = kernel.spec.launch_dims(&[8]).unwrap();
                // SAFETY: none: `y` has 7 elements and the kernel stores 8; this child exists
                // to die of the eighth store.
                let r = unsafe { kernel.execute(&[x.raw().unwrap(), y.raw().unwrap()], &[8], &launch) };
                println!("the overrun returned {r:?}");
            }
            other => panic!("unknown case {other}"),
        }
        println!("survived {case}");
    }
}
